-- Root refs are kept per domain, as the public UniCAS contract has them: a capability names
-- the domain its changes belong to (`refDomain`), one of this service's own shape without the
-- claim uses the domain `default`. Balances and idempotency are per (Space, domain); a node's
-- root_ref_count is the sum of its balances over domains, and only that sum must stay at or
-- above zero, so a domain's balance may be negative (zero balances are still not stored).
-- What is stored so far belongs to the default domain.

ALTER TABLE root_ref_events ADD COLUMN ref_domain TEXT NOT NULL DEFAULT 'default';

CREATE TABLE root_ref_balances_by_domain (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    ref_domain TEXT NOT NULL,
    hash BLOB NOT NULL,
    ref_count INTEGER NOT NULL CHECK (ref_count <> 0),
    revision_from INTEGER NOT NULL,
    revision_to INTEGER,
    PRIMARY KEY (app_id, space_id, ref_domain, hash, revision_from)
);
INSERT INTO root_ref_balances_by_domain
    (app_id, space_id, ref_domain, hash, ref_count, revision_from, revision_to)
SELECT app_id, space_id, 'default', hash, ref_count, revision_from, revision_to
FROM root_ref_balances;
DROP TABLE root_ref_balances;
ALTER TABLE root_ref_balances_by_domain RENAME TO root_ref_balances;
CREATE UNIQUE INDEX root_ref_balances_current
    ON root_ref_balances (app_id, space_id, ref_domain, hash) WHERE revision_to IS NULL;

CREATE TABLE root_ref_requests_by_domain (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    ref_domain TEXT NOT NULL,
    request_id TEXT NOT NULL,
    payload_hash BLOB NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (app_id, space_id, ref_domain, request_id)
);
INSERT INTO root_ref_requests_by_domain
    (app_id, space_id, ref_domain, request_id, payload_hash, revision)
SELECT app_id, space_id, 'default', request_id, payload_hash, revision
FROM root_ref_requests;
DROP TABLE root_ref_requests;
ALTER TABLE root_ref_requests_by_domain RENAME TO root_ref_requests;
