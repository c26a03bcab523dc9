//! Elements of a batch lease without bytes, as a client sends them to find out what is
//! missing: the common answers in one partition operation for the whole batch. A ready node's
//! lease is extended and a node the partition has never heard of gets its upload generation,
//! by a few set-based statements; a node with an upload under way (bytes to validate, children
//! awaited, an expired generation to retire) goes one by one, as the single lease takes it.

use std::collections::HashSet;

use cas_format::wire::{BatchLeaseElement, LeaseResponse};
use cas_format::{AppId, Hash, SpaceId};

use super::Answers;
use crate::error::ApiResult;
use crate::lease::{lease_window, upload_limit};
use crate::meta::Generation;
use crate::{Service, now_ms};

impl Service {
    /// Answers what it can of `plain` (elements without bytes, by index) together; returns
    /// the answers and the elements left to the one-by-one path.
    pub(super) async fn lease_plain(
        &self,
        app: &AppId,
        space: &SpaceId,
        plain: Vec<(usize, BatchLeaseElement)>,
    ) -> ApiResult<(Answers, Vec<(usize, BatchLeaseElement)>)> {
        let now = now_ms();
        let mut answers = Answers::new();
        let mut one_by_one = Vec::new();
        // As the single lease: a lease this process knows to cover the claim needs no store.
        let mut rest = Vec::new();
        let mut seen = HashSet::new();
        for (index, e) in plain {
            let duration = self.config.clamp_lease(e.lease_duration_ms) as i64;
            let covered = self
                .leases
                .get(app, space, &e.hash, now)
                .filter(|&(s, x)| lease_window(s, x, now, duration) == (s, x));
            if let Some((started, expires)) = covered {
                answers.push((index, Ok(ready(e.hash, started, expires))));
            } else if e
                .upload_bytes
                .is_some_and(|n| n > self.config.node_max_bytes)
                || !seen.insert(e.hash)
            {
                // Refused, or asked twice: the single lease answers it.
                one_by_one.push((index, e));
            } else {
                rest.push((index, e, duration));
            }
        }
        if rest.is_empty() {
            return Ok((answers, one_by_one));
        }
        let mut p = self.meta.gate(app, space).await?;
        let hashes: Vec<Hash> = rest.iter().map(|(_, e, _)| e.hash).collect();
        let rows = p.nodes(&hashes).await?;
        let mut leases = Vec::new();
        let mut windows = Vec::new();
        let mut unknown = Vec::new();
        for (index, e, duration) in rest {
            match rows.get(&e.hash).filter(|r| r.is_ready()) {
                Some(row) => {
                    let window = (row.lease_started_at, row.lease_expires_at);
                    let (started, expires) = lease_window(window.0, window.1, now, duration);
                    if (started, expires) != window {
                        leases.push((e.hash, started, expires));
                    }
                    windows.push((e.hash, (started, expires)));
                    answers.push((index, Ok(ready(e.hash, started, expires))));
                }
                None => unknown.push((index, e)),
            }
        }
        p.set_leases(&leases).await?;
        let unknown_hashes: Vec<Hash> = unknown.iter().map(|(_, e)| e.hash).collect();
        let active = p.active_generations(&unknown_hashes).await?;
        let creates = unknown.iter().any(|(_, e)| !active.contains_key(&e.hash));
        let mut slots = self.batch_slots(&mut p, now, creates).await?;
        let mut created: Vec<(usize, Generation)> = Vec::new();
        for (index, e) in unknown {
            if active.contains_key(&e.hash) {
                one_by_one.push((index, e));
                continue;
            }
            if !slots.take() {
                answers.push((index, Err(upload_limit())));
                continue;
            }
            created.push((index, self.generation_for(&e.hash, now, e.upload_bytes, 0)));
        }
        let generations: Vec<Generation> = created.iter().map(|(_, g)| g.clone()).collect();
        p.create_generations(&generations).await?;
        p.commit().await?;
        for (hash, window) in &windows {
            self.leases.remember(app, space, hash, *window, now);
        }
        for (index, g) in created {
            let answer = self.presigned_target(app, space, &g).await.map(|upload| {
                LeaseResponse::AwaitingUpload {
                    hash: g.hash,
                    upload,
                }
            });
            answers.push((index, answer));
        }
        Ok((answers, one_by_one))
    }
}

fn ready(hash: Hash, lease_started_at: i64, lease_expires_at: i64) -> LeaseResponse {
    LeaseResponse::Ready {
        hash,
        lease_started_at,
        lease_expires_at,
    }
}
