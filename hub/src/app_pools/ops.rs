//! The pool operations: every change reads the pool, plans its writes with a pure function of
//! that state and commits them with the swap of the pool's version, retrying on conflict.

use super::{
    Admitted, AppAssignment, Limits, MemberState, MemberView, Plan, PoolView, Routed, VisitRequest,
    Write, check_visit_id, occupancy, plan_admission, tidy, usable, visit_gone,
};
use crate::Hub;
use crate::auth::User;
use crate::catalog::{NotebookEntry, Role};
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId, SessionId};
use crate::sessions::lifecycle::{End, Owner};
use crate::store::HubStore;
use crate::store::app_pools::{MemberRow, PoolState, VisitRow};
use crate::store::sessions::{SessionMode, SessionRow, SessionStatus};

/// Attempts of one change before it gives up on a busy pool.
const CAS_ATTEMPTS: usize = 16;

impl Hub {
    fn pool_limits(&self) -> Limits {
        let s = &self.config.sessions;
        Limits {
            max_visits: s.app_max_visits,
            max_sessions: s.app_max_sessions,
            lease_ms: i64::try_from(s.app_visit_lease_ms).unwrap_or(120_000),
        }
    }

    fn start_ms(&self) -> i64 {
        i64::try_from(self.config.sessions.start_timeout_ms).unwrap_or(60_000)
    }

    fn assignment(
        &self,
        pid: &ProjectId,
        v: &VisitRow,
        revision: Option<i64>,
        routed: Routed,
    ) -> AppAssignment {
        let base = format!(
            "/api/v1/projects/{pid}/notebooks/{}/app-pool/visits/{}",
            v.notebook_id, v.visit_id
        );
        AppAssignment {
            sandbox_id: v.sandbox_id.clone(),
            visit_id: v.visit_id.clone(),
            revision,
            lease_expires_at: ids::rfc3339(v.lease_until_ms),
            heartbeat: format!("{base}/heartbeat"),
            departure: format!("{base}/departure"),
            routed,
        }
    }

    /// The pool of `nid` as it is now, tidied (without writing).
    async fn read_pool(&self, nid: &NotebookId, now: i64) -> HubResult<PoolState> {
        let mut tx = self.store.write().await?;
        let mut state = self.store.pool_state(&mut tx, nid).await?;
        drop(tx);
        tidy(&mut state, now);
        Ok(state)
    }

    /// Plans a change with `plan` on the pool's tidied state and commits its writes with the
    /// swap of the pool's version; retried on conflict.
    async fn change_pool<T>(
        &self,
        pid: &ProjectId,
        nid: &NotebookId,
        plan: impl Fn(&PoolState, i64) -> HubResult<(T, Vec<Write>)>,
    ) -> HubResult<T> {
        for _ in 0..CAS_ATTEMPTS {
            let now = ids::now_ms();
            let mut tx = self.store.write().await?;
            let mut state = self.store.pool_state(&mut tx, nid).await?;
            let version = state.version;
            let mut writes = tidy(&mut state, now);
            let (out, more) = plan(&state, now)?;
            writes.extend(more);
            for w in &writes {
                match w {
                    Write::PutVisit(v) => HubStore::put_visit(&mut tx, v).await?,
                    Write::DeleteVisit(v) => HubStore::delete_visit(&mut tx, v).await?,
                    Write::InsertMember(m) => HubStore::insert_member(&mut tx, m).await?,
                    Write::UpdateMember(m) => HubStore::update_member(&mut tx, m).await?,
                    Write::DeleteMember(id) => HubStore::delete_member(&mut tx, id).await?,
                    Write::RecordSession(row) => {
                        self.check_session_limits(&mut tx, &row.user_id).await?;
                        Self::record_session(&mut tx, row).await?;
                    }
                }
            }
            if !HubStore::swap_pool(&mut tx, nid, pid, version, now).await? {
                drop(tx);
                self.metrics.pool_conflict();
                // A short, random pause: racing changes do not collide again in step.
                let pause = 5 + rand::random::<u64>() % 20;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                continue;
            }
            tx.commit().await?;
            return Ok(out);
        }
        self.metrics.pool_exhausted();
        Err(HubError::busy(
            "the app pool changed under every attempt; retry",
            1,
        ))
    }

    /// Starts the app sandbox of a new member (copy-only: nothing is saved back).
    fn launch_app(&self, row: &SessionRow, entry: &NotebookEntry, revision: Option<i64>) {
        let file = entry.source.entry_notebook().unwrap_or("notebook.py");
        self.launch(row, false, file.to_string(), revision);
    }

    /// A new member on `revision` for the sandbox of `row`, reserved until its start times out.
    fn reservation(&self, row: &SessionRow, revision: Option<i64>, now: i64) -> MemberRow {
        MemberRow {
            sandbox_id: row.session_id.clone(),
            notebook_id: row.notebook_id.clone(),
            revision,
            reserved_until_ms: now + self.start_ms(),
            idle_since_ms: now,
            replaced_by: None,
            drain_only: false,
            created_at_ms: now,
            status: Some(SessionStatus::Starting),
        }
    }

    /// Admits one visit of `user` to the notebook's app (viewer): a slot on a sandbox of the
    /// current revision, a new sandbox, or 429 `app_pool_full` with `Retry-After`.
    pub async fn admit_visit(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        visit_id: Option<&str>,
    ) -> HubResult<Admitted> {
        let visit_id = visit_id.unwrap_or(super::API_VISIT);
        check_visit_id(visit_id)?;
        let (entry, nb) = self.notebook_for(user, pid, nid, Role::Viewer).await?;
        self.cas()?;
        if let Some(e) = self.sessions.runtimes.recent_failure() {
            return Err(HubError::runtime_unavailable(e.0));
        }
        let head = nb.head_revision;
        let limits = self.pool_limits();
        let fresh = self.new_session_row(&user.id, pid, nid, SessionMode::App, head, ids::now_ms());
        let outcome = self
            .change_pool(pid, nid, |state, now| {
                let request = VisitRequest {
                    notebook: nid,
                    user: &user.id,
                    visit_id,
                    head,
                    new_sandbox: &fresh.session_id,
                };
                let plan = plan_admission(state, &request, now, limits);
                let (visit, routed, mut writes) = match plan {
                    Plan::Full(secs) => return Ok((Err(secs), Vec::new())),
                    Plan::Reuse(v) => (v, Routed::Reused, Vec::new()),
                    Plan::Assign(v) => (v, Routed::Assigned, Vec::new()),
                    Plan::Start(v) => (
                        v,
                        Routed::Started,
                        vec![
                            Write::RecordSession(Box::new(fresh.clone())),
                            Write::InsertMember(self.reservation(&fresh, head, now)),
                        ],
                    ),
                };
                writes.push(Write::PutVisit(visit.clone()));
                let users = occupancy(state, &visit.sandbox_id, now)
                    + usize::from(routed != Routed::Reused);
                let revision = state
                    .members
                    .iter()
                    .find(|m| m.sandbox_id == visit.sandbox_id)
                    .map_or(head, |m| m.revision);
                Ok((Ok((visit, routed, users, revision)), writes))
            })
            .await?;
        let (visit, routed, users, revision) = match outcome {
            Ok(admitted) => admitted,
            Err(secs) => {
                self.metrics.pool_admission("full");
                return Err(HubError::app_pool_full(secs));
            }
        };
        self.metrics.pool_admission(match routed {
            Routed::Reused => "reused",
            Routed::Assigned => "assigned",
            Routed::Started => "started",
        });
        if routed == Routed::Started {
            self.launch_app(&fresh, &entry, head);
        }
        let session = self
            .store
            .session(&visit.sandbox_id)
            .await?
            .ok_or_else(|| HubError::internal("an app sandbox has no record", &visit.sandbox_id))?;
        // A visit keeps its sandbox alive.
        self.heartbeat(&session).await?;
        Ok(Admitted {
            assignment: self.assignment(pid, &visit, revision, routed),
            session,
            users,
        })
    }

    /// A heartbeat of the caller's visit: renews its lease once half of it has passed (and
    /// ends a departure's grace: the page is back). 404 once the slot is released.
    pub async fn visit_heartbeat(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        visit_id: &str,
    ) -> HubResult<AppAssignment> {
        self.notebook_for(user, pid, nid, Role::Viewer).await?;
        let lease = self.pool_limits().lease_ms;
        let find = |state: &PoolState| {
            state
                .visits
                .iter()
                .find(|v| v.user_id == user.id && v.visit_id == visit_id)
                .cloned()
                .ok_or_else(|| visit_gone(visit_id))
        };
        let now = ids::now_ms();
        let seen = find(&self.read_pool(nid, now).await?)?;
        // At most one durable renewal a half lease: the slot stays covered for at least that.
        let visit = if seen.grace_until_ms.is_none() && seen.lease_until_ms - now >= lease / 2 {
            seen
        } else {
            self.change_pool(pid, nid, |state, now| {
                let mut v = find(state)?;
                v.grace_until_ms = None;
                v.lease_until_ms = now + lease;
                Ok((v.clone(), vec![Write::PutVisit(v)]))
            })
            .await?
        };
        if let Some(row) = self.store.session(&visit.sandbox_id).await? {
            self.heartbeat(&row).await?;
        }
        Ok(self.assignment(pid, &visit, None, Routed::Reused))
    }

    /// A heartbeat of an app session itself (clients from before pools): renews the caller's
    /// visits on that sandbox as their own heartbeats would.
    pub async fn renew_visits_on(&self, user: &User, row: &SessionRow) -> HubResult<()> {
        let lease = self.pool_limits().lease_ms;
        let now = ids::now_ms();
        let mine = |state: &PoolState, now: i64| -> Vec<VisitRow> {
            state
                .visits
                .iter()
                .filter(|v| v.user_id == user.id && v.sandbox_id == row.session_id)
                .filter(|v| v.grace_until_ms.is_some() || v.lease_until_ms - now < lease / 2)
                .cloned()
                .collect()
        };
        if mine(&self.read_pool(&row.notebook_id, now).await?, now).is_empty() {
            return Ok(());
        }
        self.change_pool(&row.project_id, &row.notebook_id, |state, now| {
            let writes = mine(state, now)
                .into_iter()
                .map(|mut v| {
                    v.grace_until_ms = None;
                    v.lease_until_ms = now + lease;
                    Write::PutVisit(v)
                })
                .collect();
            Ok(((), writes))
        })
        .await
    }

    /// The caller's page left: its slot is kept for the reconnect grace, then released.
    pub async fn depart(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        visit_id: &str,
    ) -> HubResult<()> {
        self.notebook_for(user, pid, nid, Role::Viewer).await?;
        let grace = i64::try_from(self.config.sessions.app_grace_ms).unwrap_or(15_000);
        self.change_pool(pid, nid, |state, now| {
            let v = state
                .visits
                .iter()
                .find(|v| v.user_id == user.id && v.visit_id == visit_id)
                .ok_or_else(|| visit_gone(visit_id))?;
            if v.grace_until_ms.is_some() {
                return Ok(((), Vec::new()));
            }
            let mut v = v.clone();
            v.grace_until_ms = Some((now + grace).min(v.lease_until_ms));
            Ok(((), vec![Write::PutVisit(v)]))
        })
        .await
    }

    /// The pool of a notebook (viewer).
    pub async fn app_pool(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
    ) -> HubResult<PoolView> {
        let (_, nb) = self.notebook_for(user, pid, nid, Role::Viewer).await?;
        let now = ids::now_ms();
        let state = self.read_pool(nid, now).await?;
        let members = state
            .members
            .iter()
            .map(|m| MemberView {
                sandbox_id: m.sandbox_id.clone(),
                revision: m.revision,
                state: if m.replaced_by.is_some() {
                    MemberState::Replaced
                } else if !usable(m, now) {
                    MemberState::Gone
                } else if m.drain_only || m.revision != nb.head_revision {
                    MemberState::Draining
                } else if m.status == Some(SessionStatus::Starting) {
                    MemberState::Starting
                } else {
                    MemberState::Ready
                },
                visits: occupancy(&state, &m.sandbox_id, now),
                status: m.status,
                replaced_by: m.replaced_by.clone(),
            })
            .collect();
        Ok(PoolView {
            notebook_id: nid.clone(),
            revision: nb.head_revision,
            max_visits_per_session: self.config.sessions.app_max_visits,
            max_sessions_per_version: self.config.sessions.app_max_sessions,
            members,
        })
    }

    /// The member `sandbox` of the notebook's pool, or 404.
    async fn pool_member(&self, nid: &NotebookId, sandbox: &SessionId) -> HubResult<MemberRow> {
        self.read_pool(nid, ids::now_ms())
            .await?
            .members
            .into_iter()
            .find(|m| &m.sandbox_id == sandbox)
            .ok_or_else(|| HubError::not_found(format!("no sandbox {sandbox} in this app pool")))
    }

    /// Stops the sandbox of a session this process owns (or whose owner is gone).
    async fn stop_sandbox(&self, row: &SessionRow) -> HubResult<()> {
        match self.owner_of(row) {
            Owner::Here(live) => self.end_session(&live, End::Deleted).await,
            Owner::Gone => self.retire_unowned(row).await,
            Owner::There(_) => Err(HubError::unavailable(
                "the sandbox runs in another hub process; send the request there",
            )),
        }
    }

    /// Drops `sandbox` from the pool (with its visits).
    async fn drop_member(
        &self,
        pid: &ProjectId,
        nid: &NotebookId,
        sandbox: &SessionId,
    ) -> HubResult<()> {
        self.change_pool(pid, nid, |_, _| {
            Ok(((), vec![Write::DeleteMember(sandbox.clone())]))
        })
        .await
    }

    /// Stops one sandbox of the pool (editor): every visit on it must be admitted again.
    pub async fn stop_member(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        sandbox: &SessionId,
    ) -> HubResult<()> {
        self.notebook_for(user, pid, nid, Role::Editor).await?;
        self.pool_member(nid, sandbox).await?;
        // Out of the pool first: no visit is routed to a sandbox that is stopping.
        self.drop_member(pid, nid, sandbox).await?;
        if let Some(row) = self.store.session(sandbox).await? {
            self.stop_sandbox(&row).await?;
        }
        Ok(())
    }

    /// Restarts one sandbox of the pool (editor): reserves a replacement on the current
    /// revision, reclaims the old sandbox, then starts the replacement; a repeated restart of
    /// the same sandbox answers the replacement it reserved. Visits on it are admitted again.
    pub async fn restart_member(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        sandbox: &SessionId,
    ) -> HubResult<SessionId> {
        let (entry, nb) = self.notebook_for(user, pid, nid, Role::Editor).await?;
        if let Some(replacement) = self.pool_member(nid, sandbox).await?.replaced_by {
            return Ok(replacement);
        }
        let head = nb.head_revision;
        let fresh = self.new_session_row(&user.id, pid, nid, SessionMode::App, head, ids::now_ms());
        let reserved = self
            .change_pool(pid, nid, |state, now| {
                let m = state
                    .members
                    .iter()
                    .find(|m| &m.sandbox_id == sandbox)
                    .ok_or_else(|| {
                        HubError::not_found(format!("no sandbox {sandbox} in this app pool"))
                    })?;
                if let Some(r) = &m.replaced_by {
                    return Ok((r.clone(), Vec::new()));
                }
                let mut old = m.clone();
                old.replaced_by = Some(fresh.session_id.clone());
                let mut writes = vec![
                    Write::RecordSession(Box::new(fresh.clone())),
                    Write::InsertMember(self.reservation(&fresh, head, now)),
                    Write::UpdateMember(old),
                ];
                writes.extend(
                    state
                        .visits
                        .iter()
                        .filter(|v| &v.sandbox_id == sandbox)
                        .cloned()
                        .map(Write::DeleteVisit),
                );
                Ok((fresh.session_id.clone(), writes))
            })
            .await?;
        if reserved != fresh.session_id {
            return Ok(reserved);
        }
        // The old member stays recorded, replaced, until the replacement has started.
        if let Some(row) = self.store.session(sandbox).await? {
            self.stop_sandbox(&row).await?;
        }
        self.launch_app(&fresh, &entry, head);
        Ok(reserved)
    }

    /// The pools' part of the session sweep: keeps the app sandboxes this process runs alive
    /// while they hold visits, have a client connected through the proxy, or have been idle for
    /// less than the app idle timeout, and retires the others (out of their pool first, so no
    /// visit is routed to them). One whose retirement failed is out of its pool already and is
    /// retired again on the next sweep.
    pub async fn sweep_app_pools(&self) -> HubResult<()> {
        let idle_ms = i64::try_from(self.config.sessions.app_idle_timeout_s)
            .unwrap_or(1_800)
            .saturating_mul(1000);
        for live in self.sessions.all() {
            if live.mode != SessionMode::App || live.is_ending() {
                continue;
            }
            let Some(row) = self.store.session(&live.id).await? else {
                continue;
            };
            let idle = |state: &PoolState, now: i64| {
                state
                    .members
                    .iter()
                    .find(|m| m.sandbox_id == live.id)
                    .is_none_or(|m| {
                        occupancy(state, &m.sandbox_id, now) == 0 && now - m.idle_since_ms > idle_ms
                    })
            };
            let now = ids::now_ms();
            // An open kernel connection keeps it, slot or not (a page whose heartbeats stopped
            // while its tab stays connected).
            let retire = !live.has_open_sockets()
                && idle(&self.read_pool(&row.notebook_id, now).await?, now)
                && self
                    .change_pool(&row.project_id, &row.notebook_id, |state, now| {
                        // Checked again on the state the change commits on.
                        let idle = idle(state, now);
                        let writes = if idle {
                            vec![Write::DeleteMember(live.id.clone())]
                        } else {
                            Vec::new()
                        };
                        Ok((idle, writes))
                    })
                    .await?;
            if retire {
                tracing::info!(session = %live.id, "retiring an idle app sandbox");
                if let Err(e) = self.end_session(&live, End::Expired("idle")).await {
                    tracing::warn!(session = %live.id, error = %e, "retiring an app sandbox failed");
                }
            } else {
                live.touch(now);
            }
        }
        Ok(())
    }
}
