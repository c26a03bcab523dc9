-- Root refs are kept per domain, as the public UniCAS contract has them: a capability names
-- the domain its changes belong to (`refDomain`), one of this service's own shape without the
-- claim uses the domain `default`. Balances and idempotency are per (Space, domain); a node's
-- root_ref_count is the sum of its balances over domains, and only that sum must stay at or
-- above zero, so a domain's balance may be negative (zero balances are still not stored).
-- What is stored so far belongs to the default domain.

ALTER TABLE root_ref_events ADD COLUMN ref_domain TEXT NOT NULL DEFAULT 'default';

ALTER TABLE root_ref_balances ADD COLUMN ref_domain TEXT NOT NULL DEFAULT 'default';
ALTER TABLE root_ref_balances
    DROP CONSTRAINT root_ref_balances_pkey,
    ADD PRIMARY KEY (app_id, space_id, ref_domain, hash, revision_from),
    DROP CONSTRAINT root_ref_balances_ref_count_check,
    ADD CONSTRAINT root_ref_balances_ref_count_check CHECK (ref_count <> 0);
DROP INDEX root_ref_balances_current;
CREATE UNIQUE INDEX root_ref_balances_current
    ON root_ref_balances (app_id, space_id, ref_domain, hash) WHERE revision_to IS NULL;

ALTER TABLE root_ref_requests ADD COLUMN ref_domain TEXT NOT NULL DEFAULT 'default';
ALTER TABLE root_ref_requests
    DROP CONSTRAINT root_ref_requests_pkey,
    ADD PRIMARY KEY (app_id, space_id, ref_domain, request_id);
