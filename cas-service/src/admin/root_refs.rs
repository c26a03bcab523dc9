//! The admin plane's root-ref pages: balances at one revision and the event stream, across
//! an App's Spaces and domains, filtered and paged by cursor.

use axum::Json;
use axum::extract::{Path, State};
use cas_format::{AppId, Hash, RefDomain, SpaceId};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Admin;
use crate::Service;
use crate::api::extract::Q;
use crate::error::{ApiError, ApiResult};
use crate::meta::{BalanceCursor, RefFilter};
use crate::root_refs::{decode_cursor, encode_cursor};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    space_id: Option<SpaceId>,
    ref_domain: Option<RefDomain>,
    hash: Option<Hash>,
    limit: Option<u32>,
    cursor: Option<String>,
}

impl ListQuery {
    fn limit(&self) -> ApiResult<i64> {
        match self.limit.unwrap_or(100) {
            n @ 1..=200 => Ok(n as i64),
            _ => Err(ApiError::invalid("limit must be 1..=200")),
        }
    }

    fn filter(&self) -> RefFilter<'_> {
        RefFilter {
            space: self.space_id.as_ref(),
            domain: self.ref_domain.as_ref(),
            hash: self.hash.as_ref(),
        }
    }
}

pub(super) async fn balances(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
    Q(q): Q<ListQuery>,
) -> ApiResult<Json<Value>> {
    admin.app(&svc, &app).await?;
    let limit = q.limit()?;
    let current = svc.meta.app_revision(&app).await?.unwrap_or(0);
    let (revision, after): (i64, Option<BalanceCursor>) = match &q.cursor {
        Some(c) => {
            let (rev, after) = decode_cursor(c, None)?;
            if rev > current {
                return Err(ApiError::invalid("invalid cursor"));
            }
            (rev, Some(after))
        }
        None => (current, None),
    };
    let rows = svc
        .meta
        .balances_at(&app, q.filter(), revision, after.as_ref(), limit + 1)
        .await?;
    let more = rows.len() as i64 > limit;
    let rows: Vec<_> = rows.into_iter().take(limit as usize).collect();
    let next = match (more, rows.last()) {
        (true, Some(last)) => Some(encode_cursor(revision, &last.cursor(), true)),
        _ => None,
    };
    let items: Vec<Value> = rows
        .into_iter()
        .map(|b| json!({"spaceId": b.space, "refDomain": b.domain, "hash": b.hash, "refCount": b.ref_count}))
        .collect();
    Ok(Json(
        json!({"revision": revision, "items": items, "nextCursor": next}),
    ))
}

pub(super) async fn events(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
    Q(q): Q<ListQuery>,
) -> ApiResult<Json<Value>> {
    admin.app(&svc, &app).await?;
    let limit = q.limit()?;
    let current = svc.meta.app_revision(&app).await?.unwrap_or(0);
    let bad = || ApiError::invalid("invalid cursor");
    let (upto, after) = match &q.cursor {
        Some(c) => {
            let (upto, after) = c.split_once('.').ok_or_else(bad)?;
            let (upto, after): (i64, i64) = (
                upto.parse().map_err(|_| bad())?,
                after.parse().map_err(|_| bad())?,
            );
            if upto > current || after > upto || after < 0 {
                return Err(bad());
            }
            (upto, after)
        }
        None => (current, 0),
    };
    let events = svc
        .meta
        .events(&app, q.filter(), after, upto, limit + 1)
        .await?;
    let more = events.len() as i64 > limit;
    let events: Vec<super::reconcile::EventView> = events
        .into_iter()
        .take(limit as usize)
        .map(Into::into)
        .collect();
    let next = match (more, events.last()) {
        (true, Some(e)) => Some(format!("{upto}.{}", e.revision)),
        _ => None,
    };
    Ok(Json(
        json!({"revision": upto, "items": events, "nextCursor": next}),
    ))
}
