//! What a project costs in the CAS, its garbage collection, and files staged for saves.

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::envelope::{ErrorEnvelope, envelope};
use super::extract::{Caller, P, body_reader};
use crate::Hub;
use crate::catalog::Role;
use crate::error::{HubResult, ok, ok_status};
use crate::ids::ProjectId;
use crate::workspace::StagedFile;

/// CAS usage of the project's Space beside the logical bytes of what it retains.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageView {
    pub project_id: ProjectId,
    pub node_count: i64,
    pub ready_content_bytes: i64,
    pub ready_stored_bytes: i64,
    /// Sum of the file sizes of every kept version, as full copies would store them.
    pub logical_bytes: i64,
    pub kept_versions: i64,
    pub pruned_versions: i64,
    /// `logicalBytes / readyStoredBytes`.
    pub dedup_ratio: f64,
    /// How the logical bytes grew: after each kept version (oldest first; at most 200 points,
    /// evenly spaced over the versions; the last is `logicalBytes`).
    pub series: Vec<StoragePoint>,
}

/// The logical bytes of the kept versions saved up to a time.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoragePoint {
    pub saved_at: String,
    /// Versions counted so far.
    pub versions: i64,
    pub logical_bytes: i64,
}

/// Most points of a storage series.
pub const SERIES_POINTS: usize = 200;
/// Most recent kept versions a series is drawn over.
const SERIES_VERSIONS: i64 = 100_000;

/// The cumulative series of `sizes` (oldest first), ending at `total`, thinned to
/// [`SERIES_POINTS`].
fn series(sizes: &[(i64, i64)], total: i64) -> Vec<StoragePoint> {
    let n = sizes.len();
    let listed: i64 = sizes.iter().map(|(_, b)| *b).fold(0, i64::saturating_add);
    // Versions older than the listed ones are counted in the start.
    let mut sum = total.saturating_sub(listed).max(0);
    let step = n.div_ceil(SERIES_POINTS).max(1);
    let mut out = Vec::with_capacity(n.min(SERIES_POINTS) + 1);
    for (i, (at, bytes)) in sizes.iter().enumerate() {
        sum = sum.saturating_add(*bytes);
        if (i + 1) % step == 0 || i + 1 == n {
            out.push(StoragePoint {
                saved_at: crate::ids::rfc3339(*at),
                versions: i as i64 + 1,
                logical_bytes: sum,
            });
        }
    }
    out
}

#[derive(Serialize, ToSchema)]
pub struct GcView {
    pub examined: u64,
    pub deleted: u64,
    pub reclaimed_content_bytes: u64,
}

envelope!(StorageEnvelope, StorageView);
envelope!(GcEnvelope, GcView);
envelope!(StagedEnvelope, StagedFile);
/// CAS usage of the project's Space beside the logical bytes of every kept version (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/storage", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = StorageEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn storage(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    hub.project_for(&user, &pid, Role::Viewer).await?;
    let usage = hub.cas()?.usage(&pid.space()).await?;
    let sums = hub.store.version_sums(&pid).await?;
    let sizes = hub.store.kept_version_sizes(&pid, SERIES_VERSIONS).await?;
    Ok(ok(StorageView {
        project_id: pid,
        node_count: usage.node_count,
        ready_content_bytes: usage.ready_content_bytes,
        ready_stored_bytes: usage.ready_stored_bytes,
        logical_bytes: sums.logical_bytes,
        kept_versions: sums.kept,
        pruned_versions: sums.pruned,
        dedup_ratio: if usage.ready_stored_bytes > 0 {
            sums.logical_bytes as f64 / usage.ready_stored_bytes as f64
        } else {
            0.0
        },
        series: series(&sizes, sums.logical_bytes),
    }))
}

/// Runs bounded garbage-collection passes on the project's Space in the CAS (manager).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/gc", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = GcEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn gc(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    hub.project_for(&user, &pid, Role::Manager).await?;
    let space = pid.space();
    let cas = hub.cas()?;
    let mut view = GcView {
        examined: 0,
        deleted: 0,
        reclaimed_content_bytes: 0,
    };
    for _ in 0..1000 {
        let pass = cas.gc(&space, Some(1000)).await?;
        view.examined += pass.examined;
        view.deleted += pass.deleted;
        view.reclaimed_content_bytes += pass.reclaimed_content_bytes;
        if pass.deleted == 0 {
            break;
        }
    }
    let ev = crate::store::EventRow::new(
        "project.gc",
        &user.id,
        Some(&pid),
        None,
        serde_json::json!({"deleted": view.deleted, "reclaimed_content_bytes": view.reclaimed_content_bytes}),
    );
    hub.store.record_event(&ev).await?;
    Ok(ok(view))
}

/// Stores one file (streamed, chunked when large) for a following save (editor).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/uploads", tag = "projects", params(("pid" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = StagedEnvelope), (status = 403, body = ErrorEnvelope), (status = 413, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn upload(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    body: Body,
) -> HubResult<Response> {
    Ok(ok_status(
        StatusCode::CREATED,
        hub.stage_upload(&user, &pid, body_reader(body)).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::{SERIES_POINTS, series};

    #[test]
    fn series_accumulate_and_thin_out() {
        let sizes: Vec<(i64, i64)> = (0..1000).map(|i| (i * 1000, 10)).collect();
        let s = series(&sizes, 10_000 + 500);
        assert!(s.len() <= SERIES_POINTS);
        let last = s.last().unwrap();
        assert_eq!((last.versions, last.logical_bytes), (1000, 10_500));
        assert!(
            s.windows(2)
                .all(|w| w[0].logical_bytes <= w[1].logical_bytes)
        );
        assert_eq!(s[0].logical_bytes, 500 + 10 * s[0].versions);
        let few = series(&[(1, 7), (2, 3)], 10);
        assert_eq!(
            few.iter().map(|p| p.logical_bytes).collect::<Vec<_>>(),
            [7, 10]
        );
        assert!(series(&[], 0).is_empty());
    }
}
