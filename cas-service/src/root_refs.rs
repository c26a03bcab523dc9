//! Root-ref updates and balance pages: validation of the change set, the idempotency payload
//! hash, and the revision-stable cursor.

use std::collections::BTreeMap;

use cas_format::wire::{RootRefItem, RootRefPage, RootRefUpdate, RootRefUpdateResponse};
use cas_format::{AppId, Hash, SpaceId};

use crate::error::{ApiError, ApiResult};
use crate::meta::{BalanceCursor, RefFilter, RootRefRejection};
use crate::{Service, now_ms};

pub use cas_format::wire::{MAX_CHANGES, MAX_DELTA};

/// Checks a change set and returns the hash that identifies its payload for idempotency.
pub fn check_changes(changes: &BTreeMap<Hash, i64>) -> ApiResult<Hash> {
    if changes.is_empty() {
        return Err(ApiError::invalid("changes must not be empty"));
    }
    if changes.len() > MAX_CHANGES {
        return Err(ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            "TOO_MANY_CHANGES",
            format!("an update may change at most {MAX_CHANGES} hashes; split it"),
        ));
    }
    for (hash, delta) in changes {
        if *delta == 0 {
            return Err(ApiError::invalid(format!("the delta of {hash} is zero")));
        }
        if delta.unsigned_abs() > MAX_DELTA as u64 {
            return Err(ApiError::invalid(format!(
                "the delta of {hash} exceeds ±{MAX_DELTA}"
            )));
        }
    }
    // Sorted keys and integers: one payload, one encoding.
    let canonical =
        serde_json::to_vec(changes).map_err(|e| ApiError::internal("encoding changes", e))?;
    Ok(Hash::digest(&canonical))
}

/// The answer to a refused update.
pub fn rejection(r: RootRefRejection) -> ApiError {
    match r {
        RootRefRejection::IdempotencyConflict => ApiError::conflict(
            "IDEMPOTENCY_CONFLICT",
            "this requestId was already used with other changes",
        ),
        RootRefRejection::UnknownNode(h) => ApiError::conflict(
            "ROOT_REF_UNKNOWN_NODE",
            format!("no node {h} in this Space"),
        ),
        RootRefRejection::NotReady(h) => ApiError::conflict(
            "ROOT_REF_NODE_NOT_READY",
            format!("node {h} is not ready; lease and upload it again"),
        ),
        RootRefRejection::Negative { hash, result } => ApiError::conflict(
            "ROOT_REF_NEGATIVE",
            format!("the root ref count of {hash} would become {result}"),
        ),
        RootRefRejection::Overflow(h) => ApiError::conflict(
            "ROOT_REF_OVERFLOW",
            format!("the root ref count of {h} would exceed 2^53 - 1"),
        ),
    }
}

/// A cursor: the revision the first page was read at, and the last hash returned.
pub fn encode_cursor(revision: i64, space: Option<&SpaceId>, hash: &Hash) -> String {
    match space {
        Some(space) => format!("{revision}.{space}.{hash}"),
        None => format!("{revision}.{hash}"),
    }
}

/// Parses a cursor; `with_space` says whether it names a Space (admin pages across Spaces).
pub fn decode_cursor(s: &str, with_space: bool) -> ApiResult<(i64, BalanceCursor)> {
    let bad = || ApiError::invalid("invalid cursor");
    let (revision, rest) = s.split_once('.').ok_or_else(bad)?;
    let revision: i64 = revision.parse().map_err(|_| bad())?;
    let (space, hash) = if with_space {
        let (space, hash) = rest.rsplit_once('.').ok_or_else(bad)?;
        (Some(space.parse::<SpaceId>().map_err(|_| bad())?), hash)
    } else {
        (None, rest)
    };
    let hash: Hash = hash.parse().map_err(|_| bad())?;
    if revision < 0 {
        return Err(bad());
    }
    Ok((revision, BalanceCursor { space, hash }))
}

impl Service {
    /// Applies (or replays) one root-ref update as `actor`.
    pub async fn update_root_refs(
        &self,
        app: &AppId,
        space: &SpaceId,
        update: &RootRefUpdate,
        actor: &str,
    ) -> ApiResult<RootRefUpdateResponse> {
        let payload = check_changes(&update.changes.0)?;
        let mut p = self.meta.gate(app, space).await?;
        let result = p
            .update_root_refs(
                &update.request_id,
                &update.changes.0,
                &payload,
                actor,
                now_ms(),
            )
            .await?;
        let (revision, idempotent) = result.map_err(rejection)?;
        p.commit().await?;
        Ok(RootRefUpdateResponse {
            success: true,
            idempotent,
            revision: revision as u64,
        })
    }

    /// One page of a Space's balances, stable at the revision of the first page.
    pub async fn root_ref_page(
        &self,
        app: &AppId,
        space: &SpaceId,
        limit: u32,
        cursor: Option<&str>,
    ) -> ApiResult<RootRefPage> {
        let current = self.meta.app_revision(app).await?.unwrap_or(0);
        let (revision, after) = match cursor {
            Some(c) => {
                let (rev, after) = decode_cursor(c, false)?;
                if rev > current {
                    return Err(ApiError::invalid("invalid cursor"));
                }
                (rev, Some(after))
            }
            None => (current, None),
        };
        let rows = self
            .meta
            .balances_at(
                app,
                RefFilter {
                    space: Some(space),
                    hash: None,
                },
                revision,
                after.as_ref(),
                limit as i64 + 1,
            )
            .await?;
        let more = rows.len() > limit as usize;
        let items: Vec<RootRefItem> = rows
            .into_iter()
            .take(limit as usize)
            .map(|(_, hash, ref_count)| RootRefItem { hash, ref_count })
            .collect();
        let next_cursor = match (more, items.last()) {
            (true, Some(last)) => Some(encode_cursor(revision, None, &last.hash)),
            _ => None,
        };
        Ok(RootRefPage {
            revision: revision as u64,
            items,
            next_cursor,
        })
    }
}
