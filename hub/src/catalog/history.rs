//! Catalog history (seed 000 §11): every snapshot the head named stays stored (its root ref
//! held) until the retention pass releases it; the current and the previous snapshot are always
//! kept. An operator lists them and points the head back at one as a new change.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Catalog, NotebookStatus, catalog_space};
use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids;
use crate::lock::LockKey;
use crate::outbox::{Effect, Payload, Pending};
use crate::store::{EventRow, NotebookState, SnapshotRow};

/// Snapshots one retention pass releases at most (one root-ref delta).
const RELEASE_BATCH: i64 = 1000;

/// A snapshot as `unicas-hub catalog list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    #[serde(flatten)]
    pub row: SnapshotRow,
    /// Whether the head names it.
    pub current: bool,
}

/// What a recovery did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Recovered {
    /// The new snapshot (a copy of the recovered one's content).
    pub snapshot_id: String,
    /// Notebooks of the recovered snapshot whose content was purged since: left out.
    pub dropped: Vec<String>,
    /// Notebooks created since the recovered snapshot: still stored, no longer listed (they
    /// come back with a recovery of a snapshot that lists them).
    pub unlisted: Vec<String>,
    /// Projects created since the recovered snapshot, likewise.
    pub unlisted_projects: Vec<String>,
    /// Notebooks whose place (live or in the trash) follows where their content is now.
    pub reconciled: Vec<String>,
}

impl Hub {
    /// Kept snapshots newest first (with released ones if `released`), before `before_ms`.
    pub async fn catalog_snapshots(
        &self,
        before_ms: Option<i64>,
        released: bool,
        limit: i64,
    ) -> HubResult<Vec<SnapshotInfo>> {
        let head = self.store.catalog_head().await?;
        Ok(self
            .store
            .catalog_snapshots(before_ms, released, limit)
            .await?
            .into_iter()
            .map(|row| SnapshotInfo {
                current: head.as_ref().is_some_and(|h| h.hash == row.hash),
                row,
            })
            .collect())
    }

    /// Points the head back at the kept snapshot `id`, as a new change by `actor` (with an
    /// event). Notebook content is not part of the catalog: entries whose notebooks were purged
    /// since are left out, and each notebook stays live or in the trash as its content is now.
    pub async fn recover_catalog(&self, actor: &str, id: &str) -> HubResult<Recovered> {
        self.with_lock(&LockKey::catalog(), async || {
            let row = self
                .store
                .catalog_snapshot(id)
                .await?
                .ok_or_else(|| HubError::not_found(format!("no catalog snapshot {id}")))?;
            if row.released_at_ms.is_some() {
                return Err(HubError::conflict(format!(
                    "catalog snapshot {id} was released by the retention pass; it can no longer be recovered"
                )));
            }
            let head = self
                .store
                .catalog_head()
                .await?
                .ok_or_else(|| HubError::unavailable("the catalog is not initialized yet"))?;
            if head.hash == row.hash {
                return Err(HubError::conflict(format!(
                    "catalog snapshot {id} is the current one"
                )));
            }
            let current = self.load_snapshot(&head.hash).await?;
            let mut next = (*self.load_snapshot(&row.hash).await?).clone();
            let mut report = self.reconcile_notebooks(&mut next, &current).await?;
            let event = EventRow::new(
                "catalog.recover",
                actor,
                None,
                None,
                serde_json::json!({
                    "snapshot_id": id,
                    "replaced_snapshot_id": current.snapshot_id,
                    "dropped": report.dropped,
                    "unlisted": report.unlisted,
                    "unlisted_projects": report.unlisted_projects,
                }),
            );
            self.commit_catalog(
                next,
                head.seq,
                Some(current.snapshot_id.clone()),
                actor,
                "catalog.recover",
                vec![Effect::Event(event)],
            )
            .await?;
            report.snapshot_id = self.catalog().await?.snapshot_id.clone();
            Ok(report)
        })
        .await
    }

    /// Makes `next`'s notebook entries agree with where their content is now.
    async fn reconcile_notebooks(
        &self,
        next: &mut Catalog,
        current: &Catalog,
    ) -> HubResult<Recovered> {
        let mut report = Recovered::default();
        let listed: std::collections::HashSet<String> = next
            .all_projects()
            .flat_map(|p| p.notebooks.iter().map(|n| n.id.to_string()))
            .collect();
        for p in current.all_projects() {
            if next.any_project(&p.id).is_none() {
                report.unlisted_projects.push(p.id.to_string());
            }
            for n in &p.notebooks {
                if !listed.contains(n.id.as_str()) {
                    report.unlisted.push(n.id.to_string());
                }
            }
        }
        let pids: Vec<_> = next.all_projects().map(|p| p.id.clone()).collect();
        for pid in pids {
            let ids: Vec<_> = next
                .any_project(&pid)
                .map(|p| p.notebooks.iter().map(|n| n.id.clone()).collect())
                .unwrap_or_default();
            let mut states = BTreeMap::new();
            for nid in &ids {
                states.insert(
                    nid.clone(),
                    self.store.notebook(nid).await?.map(|r| r.state),
                );
            }
            let Some(p) = next.any_project_mut(&pid) else {
                continue;
            };
            p.notebooks
                .retain(|n| match states.get(&n.id).copied().flatten() {
                    Some(NotebookState::Live | NotebookState::Trashed) => true,
                    _ => {
                        report.dropped.push(n.id.to_string());
                        false
                    }
                });
            for n in &mut p.notebooks {
                let trashed = states.get(&n.id).copied().flatten() == Some(NotebookState::Trashed);
                if trashed && n.is_live() {
                    n.status_before_delete = Some(n.status);
                    n.status = NotebookStatus::Deleted;
                    report.reconciled.push(n.id.to_string());
                } else if !trashed && !n.is_live() {
                    n.status = n
                        .status_before_delete
                        .take()
                        .unwrap_or(NotebookStatus::Active);
                    report.reconciled.push(n.id.to_string());
                }
            }
        }
        Ok(report)
    }

    /// Releases kept snapshots older than the retention (but never the current one or its
    /// previous), at most a thousand, in one negative root-ref delta; how many.
    pub async fn release_old_snapshots(&self) -> HubResult<usize> {
        let keep_ms = self.config.retention.catalog_ms;
        if keep_ms == 0 {
            return Ok(0);
        }
        self.with_lock(&LockKey::catalog(), async || {
            let Some(head) = self.store.catalog_head().await? else {
                return Ok(0);
            };
            let current = self.load_snapshot(&head.hash).await?;
            let before = ids::now_ms().saturating_sub(i64::try_from(keep_ms).unwrap_or(i64::MAX));
            let old: Vec<SnapshotRow> = self
                .store
                .catalog_snapshots(Some(before), false, RELEASE_BATCH + 2)
                .await?
                .into_iter()
                .filter(|s| {
                    s.hash != head.hash
                        && s.snapshot_id != current.snapshot_id
                        && Some(&s.snapshot_id) != current.previous_snapshot_id.as_ref()
                })
                .take(RELEASE_BATCH as usize)
                .collect();
            if old.is_empty() {
                return Ok(0);
            }
            let snapshot_ids: Vec<String> = old.iter().map(|s| s.snapshot_id.clone()).collect();
            let digest = ids::sha256_hex(&snapshot_ids.join("\n"));
            let pending = Pending {
                request_id: format!("hub:catalog-release:{}", &digest[..32]),
                lock_key: LockKey::catalog(),
                space: catalog_space(),
                changes: old.iter().map(|s| (s.hash, -1i64)).collect(),
                payload: Payload::CatalogRelease { snapshot_ids },
                root_node: None,
            };
            self.record_and_complete(&pending).await?;
            Ok(old.len())
        })
        .await
    }
}
