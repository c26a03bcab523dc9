//! Garbage collection: bounded passes per (App, Space), on request and in the background.
//!
//! Each candidate goes through three steps: (1) under the gate, recheck eligibility and mark the
//! row as being collected (it is not ready from then on); (2) delete its object (the objects of
//! a pass together: `DeleteObjects` on S3); (3) under the gate, delete its edges, decrement its
//! children and delete the row. Between (1) and (2), a marked node's ready delta dependents
//! are stored alone (`crate::delta`), so no object ever needs a deleted base. A crash after any
//! step leaves a state the next pass finishes.
//! Passes also retire expired upload generations and delete objects superseded by
//! re-publication.

use std::collections::HashSet;
use std::time::Duration;

use cas_format::wire::GcResponse;
use cas_format::{AppId, Hash, SpaceId};
use tokio_util::sync::CancellationToken;

use crate::blob::node_key;
use crate::delta::ContentError;
use crate::error::{ApiError, ApiResult};
use crate::meta::{Marked, NodeRow};
use crate::{Service, failpoint, now_ms};

impl Service {
    /// One bounded pass over a partition: examines at most `max_nodes` nodes.
    pub async fn gc_pass(
        &self,
        app: &AppId,
        space: &SpaceId,
        max_nodes: u32,
    ) -> ApiResult<GcResponse> {
        let max = max_nodes as i64;
        self.retire_generations(app, space, max).await?;
        // Packing first: the objects it supersedes go with the others below.
        if let Err(e) = self.pack_pass(app, space).await {
            tracing::warn!(app = %app, space = %space, error = %e.message, "packing failed; the next pass retries");
        }
        self.delete_retired_objects(app, space, max).await?;

        let now = now_ms();
        let mut p = self.meta.gate(app, space).await?;
        let (examined, marked) = p
            .mark_for_collection(now, now - self.config.gc_stale_mark_ms as i64, max)
            .await?;
        p.commit().await?;
        tracing::debug!(app = %app, space = %space, examined, marked = marked.len(), "gc marked");
        if marked.is_empty() {
            return Ok(GcResponse {
                examined,
                ..Default::default()
            });
        }
        if failpoint::hit("gc.after_mark").await {
            return Err(ApiError::storage_unavailable(
                "collecting",
                "failpoint gc.after_mark",
            ));
        }

        // A marked node may still be the delta base of ready ones: they are stored alone
        // first, and a base whose dependents could not be is left for a later pass.
        let marked = self.free_dependents(app, space, marked).await?;
        // A packed node's entry stays in its pack (rewritten by the packer once enough of it
        // is dead), held bytes go with their row; other nodes' objects go now.
        let (loose, mut deleted_objects): (Vec<Marked>, Vec<Marked>) =
            marked.into_iter().partition(|m| m.own_object);
        deleted_objects.extend(
            self.delete_objects(loose, |m| node_key(app, space, &m.hash, &m.object_gen))
                .await,
        );
        if failpoint::hit("gc.after_delete").await {
            return Err(ApiError::storage_unavailable(
                "collecting",
                "failpoint gc.after_delete",
            ));
        }

        let mut p = self.meta.gate(app, space).await?;
        let (deleted, reclaimed) = p.sweep(&deleted_objects).await.map_err(|e| {
            ApiError::internal(
                "sweeping collected nodes (a child count would go negative?)",
                e,
            )
        })?;
        p.commit().await?;
        self.metrics.gc_done(deleted, reclaimed);
        if deleted > 0 {
            tracing::info!(app = %app, space = %space, deleted, reclaimed, "gc pass");
        }
        Ok(GcResponse {
            examined,
            deleted,
            reclaimed_content_bytes: reclaimed,
        })
    }

    /// [`Service::gc_pass`] in a task of its own, so that it runs to its end when the request
    /// that asked for it goes away: a pass stopped midway is safe, as a crashed one is, but
    /// leaves its work (and the Space's packer lock, until it runs out) to later passes.
    pub async fn gc_pass_to_completion(
        &self,
        app: &AppId,
        space: &SpaceId,
        max_nodes: u32,
    ) -> ApiResult<GcResponse> {
        let (svc, app, space) = (self.clone(), app.clone(), space.clone());
        tokio::spawn(async move { svc.gc_pass(&app, &space, max_nodes).await })
            .await
            .map_err(|e| ApiError::internal("running a gc pass", e))?
    }

    /// Stores every ready dependent of the marked nodes alone (so that no delta needs them any
    /// more); answers the marked nodes whose objects may now be deleted.
    async fn free_dependents(
        &self,
        app: &AppId,
        space: &SpaceId,
        mut marked: Vec<Marked>,
    ) -> ApiResult<Vec<Marked>> {
        let bases: Vec<Hash> = marked.iter().map(|m| m.hash).collect();
        let dependents = self.meta.delta_dependents(app, space, &bases).await?;
        if dependents.is_empty() {
            return Ok(marked);
        }
        let mut kept: HashSet<Hash> = HashSet::new();
        for d in dependents {
            let Some(base) = d.delta.map(|b| b.hash) else {
                continue;
            };
            if let Err(e) = self.store_alone(app, space, &d).await {
                tracing::warn!(node = %d.hash, %base, error = %e.message, "a delta could not be stored alone; its base waits for the next pass");
                kept.insert(base);
            }
        }
        if failpoint::hit("gc.after_rebase").await {
            return Err(ApiError::storage_unavailable(
                "collecting",
                "failpoint gc.after_rebase",
            ));
        }
        marked.retain(|m| !kept.contains(&m.hash));
        Ok(marked)
    }

    /// Rewrites a delta node's content as an object that stands alone, and points its row at
    /// it (unless the row changed meanwhile: then the new object goes).
    async fn store_alone(&self, app: &AppId, space: &SpaceId, row: &NodeRow) -> ApiResult<()> {
        let _permit = self.in_memory_permit().await?;
        let content = match self.stored_content(app, space, row).await {
            Ok(c) => c,
            Err(ContentError::Failed(e)) => return Err(e),
            Err(ContentError::Moved) => {
                return match self.meta.node(app, space, &row.hash).await? {
                    Some(again) if again.is_ready() && again.object_gen == row.object_gen => {
                        Err(ApiError::internal(
                            "rebuilding a delta",
                            "an object of its chain is missing",
                        ))
                    }
                    // Moved (packed) meanwhile and still a delta against the same base.
                    Some(again) if still_depends(&again, row) => Err(moved_meanwhile()),
                    // Collected or re-encoded by someone else meanwhile.
                    _ => Ok(()),
                };
            }
        };
        let (bytes, stored) = self.encode_content(content, None, false).await?;
        let object_gen = ulid::Ulid::generate().to_string();
        let key = node_key(app, space, &row.hash, &object_gen);
        self.put_bytes(&key, bytes).await?;
        if failpoint::hit("gc.rebase_after_object").await {
            return Err(ApiError::storage_unavailable(
                "rewriting a delta",
                "failpoint gc.rebase_after_object",
            ));
        }
        let mut p = self.meta.gate(app, space).await?;
        let done = p
            .store_alone(&row.hash, &row.object_gen, &object_gen, stored, now_ms())
            .await?;
        p.commit().await?;
        if !done {
            self.delete_logged(&key).await;
            if let Some(again) = self.meta.node(app, space, &row.hash).await?
                && still_depends(&again, row)
            {
                return Err(moved_meanwhile());
            }
        }
        Ok(())
    }

    async fn retire_generations(&self, app: &AppId, space: &SpaceId, max: i64) -> ApiResult<()> {
        let mut p = self.meta.gate(app, space).await?;
        let retiring = p.retiring_generations(now_ms(), max).await?;
        p.commit().await?;
        if retiring.is_empty() {
            return Ok(());
        }
        let mut gone = Vec::with_capacity(retiring.len());
        for r in retiring {
            let g = &r.generation;
            let mut ok = self.staging().delete(app, space, g).await;
            for object in &r.objects {
                ok &= self
                    .delete_logged(&node_key(app, space, &g.hash, object))
                    .await;
            }
            if ok {
                gone.push(g.gen_id.clone());
            }
        }
        let mut p = self.meta.gate(app, space).await?;
        p.forget_generations(&gone).await?;
        p.commit().await?;
        Ok(())
    }

    async fn delete_retired_objects(
        &self,
        app: &AppId,
        space: &SpaceId,
        max: i64,
    ) -> ApiResult<()> {
        let mut p = self.meta.gate(app, space).await?;
        let objects = p.retired_objects(max).await?;
        p.commit().await?;
        if objects.is_empty() {
            return Ok(());
        }
        let gone: Vec<(Hash, String)> = self
            .delete_objects(objects, |(hash, object_gen)| {
                node_key(app, space, hash, object_gen)
            })
            .await;
        let mut p = self.meta.gate(app, space).await?;
        p.forget_retired_objects(&gone).await?;
        p.commit().await?;
        Ok(())
    }

    /// Deletes the objects of `items` together; answers the items whose object is gone (the
    /// others are logged, and the next pass retries them).
    pub(crate) async fn delete_objects<T>(
        &self,
        items: Vec<T>,
        key: impl Fn(&T) -> String,
    ) -> Vec<T> {
        let keys: Vec<String> = items.iter().map(key).collect();
        let results = self.blobs.delete_many(&keys).await;
        items
            .into_iter()
            .zip(results)
            .filter_map(|(item, r)| match r {
                Ok(()) => Some(item),
                Err(e) => {
                    tracing::warn!(error = %e, "object delete failed; the next pass retries");
                    None
                }
            })
            .collect()
    }

    pub(crate) async fn delete_logged(&self, key: &str) -> bool {
        match self.blobs.delete(key).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "object delete failed; the next pass retries");
                false
            }
        }
    }

    /// Runs passes over every partition every `interval` until `stop` is cancelled.
    pub async fn background_gc(&self, interval: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let partitions = match self.meta.partitions().await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "background gc cannot list partitions");
                    continue;
                }
            };
            for (app, space) in partitions {
                if stop.is_cancelled() {
                    return;
                }
                if let Err(e) = self.gc_pass(&app, &space, self.config.gc_batch).await {
                    tracing::warn!(app = %app, space = %space, error = %e, "background gc pass failed");
                }
            }
        }
    }
}

/// Whether `now`, the current row of a node GC read as `before`, is still a ready delta
/// against the same base (the packer moved it meanwhile): its base must wait.
fn still_depends(now: &NodeRow, before: &NodeRow) -> bool {
    now.is_ready()
        && now.delta.is_some()
        && now.delta.map(|d| d.hash) == before.delta.map(|d| d.hash)
}

fn moved_meanwhile() -> ApiError {
    ApiError::unavailable("the delta moved while it was stored alone; its base waits")
}
