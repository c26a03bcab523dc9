//! Reconciliation: an administrator supplies the balances a business system intends in one
//! root-ref domain (with its source watermark); the service reads its own balances of that
//! domain at one revision and returns every difference with the events that touched that hash
//! in it. A confirmed repair is applied as normal signed deltas in that domain (one per Space,
//! at most 1000 changes each) with deterministic request ids and the administrator as actor,
//! then read back at the new revision. The projection is never edited directly.

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use cas_format::{AppId, Hash, RefDomain, RequestId, SpaceId};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Admin;
use crate::api::extract::{Q, bounded_bytes, parse_json};
use crate::error::{ApiError, ApiResult};
use crate::meta::{BalanceCursor, MAX_ROOT_REF_COUNT, RefFilter, RootRefEvent};

use crate::root_refs::{MAX_CHANGES, MAX_DELTA};
use crate::{Service, now_ms};

/// Most intended balances one comparison takes.
pub const MAX_INTENDED: usize = 200_000;
/// Events listed per difference.
const EVENTS_PER_DIFFERENCE: i64 = 50;

/// One intended balance.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Intended {
    pub space_id: SpaceId,
    pub hash: Hash,
    pub count: i64,
}

/// An event as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub revision: i64,
    pub space_id: String,
    pub ref_domain: RefDomain,
    pub request_id: String,
    pub changes: serde_json::Value,
    pub actor: String,
    pub applied_at: i64,
}

impl From<RootRefEvent> for EventView {
    fn from(e: RootRefEvent) -> Self {
        EventView {
            revision: e.revision,
            space_id: e.space_id.into_string(),
            ref_domain: e.ref_domain,
            request_id: e.request_id,
            changes: serde_json::from_str(&e.changes).unwrap_or(serde_json::Value::Null),
            actor: e.actor,
            applied_at: e.applied_at,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Difference {
    pub space_id: String,
    pub hash: Hash,
    pub intended: i64,
    pub actual: i64,
    /// intended − actual: the repair that makes the CAS match.
    pub delta: i64,
    pub events: Vec<EventView>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    pub revision: i64,
    pub ref_domain: RefDomain,
    pub watermark: String,
    pub compared: usize,
    pub differences: Vec<Difference>,
}

/// Parses `spaceId,hash,count` lines (an optional header line, blank lines ignored).
pub fn parse_csv(text: &str) -> ApiResult<Vec<Intended>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (n == 0 && line.to_ascii_lowercase().starts_with("spaceid")) {
            continue;
        }
        let bad = |what: &str| ApiError::invalid(format!("line {}: {what}", n + 1));
        let mut parts = line.split(',').map(str::trim);
        let (Some(space), Some(hash), Some(count), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected spaceId,hash,count"));
        };
        out.push(Intended {
            space_id: space.parse().map_err(|e| bad(&format!("{e}")))?,
            hash: hash.parse().map_err(|e| bad(&format!("{e}")))?,
            count: count.parse().map_err(|_| bad("count is not an integer"))?,
        });
        if out.len() > MAX_INTENDED {
            return Err(ApiError::invalid(format!(
                "at most {MAX_INTENDED} intended balances per comparison"
            )));
        }
    }
    Ok(out)
}

impl Service {
    /// Every balance of one Space in one domain at `revision`.
    async fn space_balances(
        &self,
        app: &AppId,
        space: &SpaceId,
        domain: &RefDomain,
        revision: i64,
    ) -> ApiResult<BTreeMap<Hash, i64>> {
        let mut out = BTreeMap::new();
        let mut cursor: Option<BalanceCursor> = None;
        loop {
            let page = self
                .meta
                .balances_at(
                    app,
                    RefFilter {
                        space: Some(space),
                        domain: Some(domain),
                        hash: None,
                    },
                    revision,
                    cursor.as_ref(),
                    5000,
                )
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            cursor = Some(last.cursor());
            out.extend(page.into_iter().map(|b| (b.hash, b.ref_count)));
        }
        Ok(out)
    }

    /// Compares intended balances of one domain with the CAS's, for the Spaces they name.
    pub async fn reconcile(
        &self,
        app: &AppId,
        domain: &RefDomain,
        watermark: String,
        intended: Vec<Intended>,
    ) -> ApiResult<Comparison> {
        if intended.len() > MAX_INTENDED {
            return Err(ApiError::invalid(format!(
                "at most {MAX_INTENDED} intended balances per comparison"
            )));
        }
        let mut wanted: BTreeMap<(SpaceId, Hash), i64> = BTreeMap::new();
        for i in &intended {
            // A domain's balance may be below zero; it stays a JSON-safe integer.
            if i.count.abs() > MAX_ROOT_REF_COUNT {
                return Err(ApiError::invalid(format!(
                    "the intended count of {} is beyond ±(2^53 - 1)",
                    i.hash
                )));
            }
            if wanted
                .insert((i.space_id.clone(), i.hash), i.count)
                .is_some()
            {
                return Err(ApiError::invalid(format!(
                    "{}/{} is given twice",
                    i.space_id, i.hash
                )));
            }
        }
        let revision = self.meta.app_revision(app).await?.unwrap_or(0);
        let spaces: BTreeSet<SpaceId> = wanted.keys().map(|(s, _)| s.clone()).collect();
        let mut differences = Vec::new();
        for space in &spaces {
            let actual = self.space_balances(app, space, domain, revision).await?;
            let hashes: BTreeSet<Hash> = actual
                .keys()
                .copied()
                .chain(wanted.keys().filter(|(s, _)| s == space).map(|(_, h)| *h))
                .collect();
            for hash in hashes {
                let a = actual.get(&hash).copied().unwrap_or(0);
                let w = wanted.get(&(space.clone(), hash)).copied().unwrap_or(0);
                if a == w {
                    continue;
                }
                let events = self
                    .meta
                    .events(
                        app,
                        RefFilter {
                            space: Some(space),
                            domain: Some(domain),
                            hash: Some(&hash),
                        },
                        0,
                        revision,
                        EVENTS_PER_DIFFERENCE,
                    )
                    .await?
                    .into_iter()
                    .map(EventView::from)
                    .collect();
                differences.push(Difference {
                    space_id: space.as_str().to_string(),
                    hash,
                    intended: w,
                    actual: a,
                    delta: w - a,
                    events,
                });
            }
        }
        Ok(Comparison {
            revision,
            ref_domain: domain.clone(),
            watermark,
            compared: wanted.len(),
            differences,
        })
    }

    /// Applies repairs as signed deltas with deterministic request ids; returns the updates and
    /// the repaired balances read back at the new revision.
    pub async fn apply_repairs(
        &self,
        app: &AppId,
        domain: &RefDomain,
        watermark: &str,
        repairs: &[(SpaceId, Hash, i64)],
        actor: &str,
    ) -> ApiResult<(i64, Vec<serde_json::Value>, Vec<(SpaceId, Hash, i64)>)> {
        if repairs.is_empty() {
            return Err(ApiError::invalid("no repairs given"));
        }
        let mut by_space: BTreeMap<SpaceId, BTreeMap<Hash, i64>> = BTreeMap::new();
        for (space, hash, delta) in repairs {
            if *delta == 0 || delta.unsigned_abs() > MAX_DELTA as u64 {
                return Err(ApiError::invalid(format!(
                    "the repair of {hash} must be non-zero and within ±{MAX_DELTA}"
                )));
            }
            if by_space
                .entry(space.clone())
                .or_default()
                .insert(*hash, *delta)
                .is_some()
            {
                return Err(ApiError::invalid(format!(
                    "{space}/{hash} is repaired twice"
                )));
            }
        }
        let watermark_id: String = Sha256::digest(watermark.as_bytes())[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut updates = Vec::new();
        for (space, changes) in &by_space {
            let all: Vec<(Hash, i64)> = changes.iter().map(|(h, d)| (*h, *d)).collect();
            for (part, chunk) in all.chunks(MAX_CHANGES).enumerate() {
                let chunk: BTreeMap<Hash, i64> = chunk.iter().copied().collect();
                let digest: String = Sha256::digest(serde_json::to_vec(&chunk).unwrap_or_default())
                    [..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                let request_id: RequestId =
                    format!("admin-repair:{watermark_id}:{domain}:{space}:{part}:{digest}")
                        .parse()
                        .map_err(|e| ApiError::internal("building a request id", e))?;
                let payload = crate::root_refs::check_changes(&chunk)?;
                let mut p = self.meta.gate(app, space).await?;
                let result = p
                    .update_root_refs(domain, &request_id, &chunk, &payload, actor, now_ms())
                    .await?;
                let (revision, idempotent) = result.map_err(crate::root_refs::rejection)?;
                p.commit().await?;
                updates.push(serde_json::json!({
                    "spaceId": space, "requestId": request_id, "revision": revision, "idempotent": idempotent,
                }));
            }
        }
        let revision = self.meta.app_revision(app).await?.unwrap_or(0);
        let mut balances = Vec::new();
        for (space, changes) in &by_space {
            for hash in changes.keys() {
                let row = self
                    .meta
                    .balances_at(
                        app,
                        RefFilter {
                            space: Some(space),
                            domain: Some(domain),
                            hash: Some(hash),
                        },
                        revision,
                        None,
                        1,
                    )
                    .await?;
                balances.push((space.clone(), *hash, row.first().map_or(0, |b| b.ref_count)));
            }
        }
        Ok((revision, updates, balances))
    }
}

/// Most bytes a comparison or a repair request may carry.
const RECONCILE_BODY_LIMIT: usize = 32 << 20;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ReconcileBody {
    watermark: String,
    /// The domain compared (the default one when absent).
    #[serde(default)]
    ref_domain: RefDomain,
    balances: Vec<Intended>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WatermarkQuery {
    watermark: Option<String>,
    ref_domain: Option<RefDomain>,
}

pub(super) async fn compare(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
    Q(q): Q<WatermarkQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<Comparison>> {
    admin.app(&svc, &app).await?;
    let bytes = bounded_bytes(body, RECONCILE_BODY_LIMIT).await?;
    let csv = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/csv") || v.starts_with("text/plain"));
    let (watermark, domain, intended) = if csv {
        let text =
            std::str::from_utf8(&bytes).map_err(|_| ApiError::invalid("the CSV is not UTF-8"))?;
        let watermark = q
            .watermark
            .ok_or_else(|| ApiError::invalid("a CSV comparison needs ?watermark="))?;
        let domain = q.ref_domain.unwrap_or_default();
        (watermark, domain, parse_csv(text)?)
    } else {
        let b: ReconcileBody = parse_json(&bytes)?;
        (b.watermark, b.ref_domain, b.balances)
    };
    if watermark.trim().is_empty() || watermark.len() > 256 {
        return Err(ApiError::invalid(
            "the watermark must be 1..=256 characters",
        ));
    }
    let comparison = svc.reconcile(&app, &domain, watermark, intended).await?;
    admin
        .audit(
            &svc,
            "reconcile.compare",
            Some(&app),
            json!({
                "watermark": comparison.watermark, "refDomain": comparison.ref_domain,
                "revision": comparison.revision,
                "compared": comparison.compared, "differences": comparison.differences.len(),
            }),
        )
        .await?;
    Ok(Json(comparison))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Repair {
    space_id: SpaceId,
    hash: Hash,
    delta: i64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ApplyBody {
    watermark: String,
    /// The domain repaired (the default one when absent).
    #[serde(default)]
    ref_domain: RefDomain,
    repairs: Vec<Repair>,
}

pub(super) async fn apply(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
    body: Body,
) -> ApiResult<Json<Value>> {
    admin.app(&svc, &app).await?;
    let req: ApplyBody = parse_json(&bounded_bytes(body, RECONCILE_BODY_LIMIT).await?)?;
    if req.watermark.trim().is_empty() || req.watermark.len() > 256 {
        return Err(ApiError::invalid(
            "the watermark must be 1..=256 characters",
        ));
    }
    let repairs: Vec<(SpaceId, Hash, i64)> = req
        .repairs
        .into_iter()
        .map(|r| (r.space_id, r.hash, r.delta))
        .collect();
    let actor = format!("admin:{}", admin.account.id);
    let (revision, updates, balances) = svc
        .apply_repairs(&app, &req.ref_domain, &req.watermark, &repairs, &actor)
        .await?;
    admin
        .audit(
            &svc,
            "reconcile.apply",
            Some(&app),
            json!({
                "watermark": req.watermark, "refDomain": req.ref_domain, "updates": updates,
            }),
        )
        .await?;
    let balances: Vec<Value> = balances
        .into_iter()
        .map(|(s, h, c)| json!({"spaceId": s, "refDomain": req.ref_domain, "hash": h, "refCount": c}))
        .collect();
    Ok(Json(
        json!({"revision": revision, "refDomain": req.ref_domain, "updates": updates, "balances": balances}),
    ))
}
