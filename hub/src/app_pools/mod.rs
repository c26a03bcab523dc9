//! App pools (seed 003): a notebook served read-only (`marimo run`) to many browser tabs. Each
//! notebook has a pool of app sandboxes (app sessions); each tab, or API client visit id, holds
//! one visit slot on one of them, leased and renewed by heartbeats. Admission fills sandboxes
//! of the notebook's current revision before it reserves a new one; a starting reservation
//! counts toward `UNICAS_HUB_APP_MAX_SESSIONS_PER_VERSION` until it is ready or its start times
//! out; sandboxes of older revisions drain (their visits stay) and do not count. A full pool
//! answers 429 with `Retry-After`. A departure keeps the slot for a reconnect grace; a missed
//! one ends with the lease. A sandbox with no slot in use retires after the app idle timeout.
//!
//! The pool's state lives in the hub database: one pool row per notebook whose version every
//! change moves (compare-and-swap, retried on conflict), its members and its visits. The
//! decisions are pure functions of that state ([`plan_admission`]), applied in the transaction
//! that swaps the version.

use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{HubError, HubResult};
use crate::ids::{NotebookId, SessionId};
use crate::store::app_pools::{MemberRow, PoolState, VisitRow};
use crate::store::sessions::{SessionRow, SessionStatus};

mod ops;

/// The visit of API callers that name none (one per account).
pub const API_VISIT: &str = "api";

/// How one admission was routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Routed {
    /// The visit's own slot (a retry, or a reconnect within grace).
    Reused,
    /// A free slot on a sandbox of the current revision.
    Assigned,
    /// A new sandbox was reserved for it.
    Started,
}

/// A visit's slot, as the admission answers it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppAssignment {
    /// The sandbox (its app session) serving the visit.
    pub sandbox_id: SessionId,
    pub visit_id: String,
    /// The revision the sandbox serves.
    pub revision: Option<i64>,
    /// When the slot is released unless a heartbeat renews it.
    pub lease_expires_at: String,
    /// `POST` here every 30 seconds while the page is open.
    pub heartbeat: String,
    /// `POST` here when the page closes: the slot is kept for a short reconnect grace.
    pub departure: String,
    pub routed: Routed,
}

/// A sandbox of a pool, as `GET …/app-pool` lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MemberView {
    pub sandbox_id: SessionId,
    pub revision: Option<i64>,
    /// `starting`, `ready`, `draining` (an older revision), `replaced` (a restart reserved
    /// another) or `gone` (its sandbox stopped; cleared on the next change).
    pub state: MemberState,
    /// Visit slots in use.
    pub visits: usize,
    pub status: Option<SessionStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<SessionId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    Starting,
    Ready,
    Draining,
    Replaced,
    Gone,
}

/// A notebook's pool.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolView {
    pub notebook_id: NotebookId,
    /// The notebook's current revision: what new visits get.
    pub revision: Option<i64>,
    pub max_visits_per_session: Option<u64>,
    pub max_sessions_per_version: Option<u64>,
    pub members: Vec<MemberView>,
}

/// What an admission gives: the sandbox's record, the slot and the pool's occupancy.
pub struct Admitted {
    pub session: SessionRow,
    pub assignment: AppAssignment,
    /// Slots in use on the assigned sandbox.
    pub users: usize,
}

/// The limits a plan works with.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_visits: Option<u64>,
    pub max_sessions: Option<u64>,
    pub lease_ms: i64,
}

/// What an admission does to a pool.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Reuse(VisitRow),
    Assign(VisitRow),
    /// Reserve a new member for the visit (the member's sandbox id is the visit's).
    Start(VisitRow),
    /// Full: retry after this many seconds.
    Full(u32),
}

/// Whether a member serves visits at `now`: its sandbox runs, or is starting within its
/// reservation, and no restart replaced it.
pub fn usable(m: &MemberRow, now: i64) -> bool {
    m.replaced_by.is_none()
        && match m.status {
            Some(SessionStatus::Running) => true,
            Some(SessionStatus::Starting) => m.reserved_until_ms > now,
            _ => false,
        }
}

/// Slots in use on `sandbox` at `now`.
pub fn occupancy(state: &PoolState, sandbox: &SessionId, now: i64) -> usize {
    state
        .visits
        .iter()
        .filter(|v| &v.sandbox_id == sandbox && v.until_ms() > now)
        .count()
}

/// A visit asking for a slot.
#[derive(Debug, Clone, Copy)]
pub struct VisitRequest<'a> {
    pub notebook: &'a NotebookId,
    pub user: &'a str,
    pub visit_id: &'a str,
    /// The notebook's current revision.
    pub head: Option<i64>,
    /// The sandbox id a new member would have.
    pub new_sandbox: &'a SessionId,
}

/// Routes a visit of `user` (`visit_id`) to a slot: its own if it still holds one on a usable
/// sandbox; else the fullest sandbox of the current revision with room (filling before
/// starting); else a new sandbox (`new_sandbox`) if the current revision has fewer than the
/// limit; else full.
pub fn plan_admission(state: &PoolState, visit: &VisitRequest, now: i64, limits: Limits) -> Plan {
    let VisitRequest {
        notebook: nid,
        user,
        visit_id,
        head,
        new_sandbox,
    } = *visit;
    let lease_until = now + limits.lease_ms;
    let member = |id: &SessionId| state.members.iter().find(|m| &m.sandbox_id == id);
    if let Some(v) = state.visits.iter().find(|v| {
        v.user_id == user
            && v.visit_id == visit_id
            && v.until_ms() > now
            && member(&v.sandbox_id).is_some_and(|m| usable(m, now))
    }) {
        let mut v = v.clone();
        v.grace_until_ms = None;
        v.lease_until_ms = v.lease_until_ms.max(lease_until);
        return Plan::Reuse(v);
    }
    let visit = |sandbox: &SessionId| VisitRow {
        notebook_id: nid.clone(),
        user_id: user.to_string(),
        visit_id: visit_id.to_string(),
        sandbox_id: sandbox.clone(),
        lease_until_ms: lease_until,
        grace_until_ms: None,
        admitted_at_ms: now,
    };
    let current: Vec<&MemberRow> = state
        .members
        .iter()
        .filter(|m| m.revision == head && !m.drain_only && usable(m, now))
        .collect();
    let room = current
        .iter()
        .map(|m| (occupancy(state, &m.sandbox_id, now), *m))
        .filter(|(n, _)| limits.max_visits.is_none_or(|max| (*n as u64) < max))
        .max_by(|(a, ma), (b, mb)| a.cmp(b).then(mb.created_at_ms.cmp(&ma.created_at_ms)));
    if let Some((_, m)) = room {
        return Plan::Assign(visit(&m.sandbox_id));
    }
    if limits
        .max_sessions
        .is_none_or(|max| (current.len() as u64) < max)
    {
        return Plan::Start(visit(new_sandbox));
    }
    // The soonest a slot or a reservation frees up.
    let soonest = state
        .visits
        .iter()
        .filter(|v| v.until_ms() > now)
        .map(VisitRow::until_ms)
        .chain(
            current
                .iter()
                .filter(|m| m.status == Some(SessionStatus::Starting))
                .map(|m| m.reserved_until_ms),
        )
        .min()
        .unwrap_or(now + 5000);
    Plan::Full(u32::try_from(((soonest - now) / 1000).clamp(1, 60)).unwrap_or(5))
}

/// One write of a pool change, applied in the transaction that swaps the pool's version.
#[derive(Debug, Clone)]
pub enum Write {
    PutVisit(VisitRow),
    DeleteVisit(VisitRow),
    InsertMember(MemberRow),
    UpdateMember(MemberRow),
    /// Removes a member with every visit on it.
    DeleteMember(SessionId),
    /// Records a new app session (within the session limits) for a member.
    RecordSession(Box<SessionRow>),
}

/// Clears what no longer holds anything: members whose sandbox is gone (with their visits) and
/// visits past their lease or grace (the member's idle clock starts at that deadline). Answers
/// the writes and leaves `state` as they make it.
pub fn tidy(state: &mut PoolState, now: i64) -> Vec<Write> {
    let mut writes = Vec::new();
    // A restarted member stays recorded (answering repeated restarts) until its replacement
    // has started or failed to.
    let replacing = |m: &MemberRow| {
        m.replaced_by.as_ref().is_some_and(|r| {
            state.members.iter().any(|n| {
                &n.sandbox_id == r
                    && n.status == Some(SessionStatus::Starting)
                    && n.reserved_until_ms > now
            })
        })
    };
    let gone: Vec<SessionId> = state
        .members
        .iter()
        .filter(|m| {
            let ended = match m.status {
                None => m.reserved_until_ms <= now,
                Some(s) => s.is_terminal(),
            };
            ended && !replacing(m)
        })
        .map(|m| m.sandbox_id.clone())
        .collect();
    writes.extend(gone.iter().cloned().map(Write::DeleteMember));
    state.members.retain(|m| !gone.contains(&m.sandbox_id));
    state.visits.retain(|v| !gone.contains(&v.sandbox_id));
    for v in state.visits.iter().filter(|v| v.until_ms() <= now) {
        writes.push(Write::DeleteVisit(v.clone()));
        if let Some(m) = state
            .members
            .iter_mut()
            .find(|m| m.sandbox_id == v.sandbox_id)
            && m.idle_since_ms < v.until_ms()
        {
            m.idle_since_ms = v.until_ms();
            writes.push(Write::UpdateMember(m.clone()));
        }
    }
    state.visits.retain(|v| v.until_ms() > now);
    writes
}

pub(crate) fn check_visit_id(id: &str) -> HubResult<()> {
    if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(HubError::invalid(
            "app_visit_id is 1..=128 printable ASCII characters without spaces",
        ));
    }
    Ok(())
}

pub(crate) fn visit_gone(visit: &str) -> HubError {
    HubError::not_found(format!(
        "visit {visit} holds no slot (it left or its lease ran out); admit it again"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &SessionId, revision: i64, status: SessionStatus, created: i64) -> MemberRow {
        MemberRow {
            sandbox_id: id.clone(),
            notebook_id: NotebookId::generate(),
            revision: Some(revision),
            reserved_until_ms: 1_000,
            idle_since_ms: 0,
            replaced_by: None,
            drain_only: false,
            created_at_ms: created,
            status: Some(status),
        }
    }

    fn visit(user: &str, id: &str, sandbox: &SessionId, until: i64) -> VisitRow {
        VisitRow {
            notebook_id: NotebookId::generate(),
            user_id: user.into(),
            visit_id: id.into(),
            sandbox_id: sandbox.clone(),
            lease_until_ms: until,
            grace_until_ms: None,
            admitted_at_ms: 0,
        }
    }

    fn req<'a>(
        notebook: &'a NotebookId,
        user: &'a str,
        visit_id: &'a str,
        head: Option<i64>,
        new_sandbox: &'a SessionId,
    ) -> VisitRequest<'a> {
        VisitRequest {
            notebook,
            user,
            visit_id,
            head,
            new_sandbox,
        }
    }

    const LIMITS: Limits = Limits {
        max_visits: Some(2),
        max_sessions: Some(2),
        lease_ms: 120_000,
    };

    #[test]
    fn admission_fills_before_it_starts_and_refuses_when_full() {
        let (a, b, new) = (
            SessionId::generate(),
            SessionId::generate(),
            SessionId::generate(),
        );
        let now = 500;
        let nbid: NotebookId = NotebookId::generate();
        let mut state = PoolState::default();
        // Empty: start one.
        assert!(
            matches!(plan_admission(&state, &req(&nbid, "u", "t1", Some(1), &new), now, LIMITS), Plan::Start(v) if v.sandbox_id == new)
        );
        state.members.push(member(&a, 1, SessionStatus::Running, 1));
        state
            .members
            .push(member(&b, 1, SessionStatus::Starting, 2));
        state.visits.push(visit("u", "t1", &a, 10_000));
        // The fuller sandbox with room first, then the other.
        assert!(
            matches!(plan_admission(&state, &req(&nbid, "v", "t", Some(1), &new), now, LIMITS), Plan::Assign(v) if v.sandbox_id == a)
        );
        state.visits.push(visit("v", "t", &a, 10_000));
        assert!(
            matches!(plan_admission(&state, &req(&nbid, "w", "t", Some(1), &new), now, LIMITS), Plan::Assign(v) if v.sandbox_id == b)
        );
        state.visits.push(visit("w", "t", &b, 10_000));
        state.visits.push(visit("x", "t", &b, 10_000));
        // Two sandboxes of two slots: full; retry when the starting reservation runs out.
        assert!(matches!(
            plan_admission(&state, &req(&nbid, "y", "t", Some(1), &new), now, LIMITS),
            Plan::Full(1)
        ));
        // The same visit gets its own slot back.
        assert!(
            matches!(plan_admission(&state, &req(&nbid, "u", "t1", Some(1), &new), now, LIMITS), Plan::Reuse(v) if v.sandbox_id == a)
        );
        // A new revision: old sandboxes drain and do not count.
        assert!(matches!(
            plan_admission(&state, &req(&nbid, "y", "t", Some(2), &new), now, LIMITS),
            Plan::Start(_)
        ));
        // A drain-only sandbox keeps its visit, takes no other and does not count.
        state.members[0].drain_only = true;
        assert!(matches!(
            plan_admission(&state, &req(&nbid, "u", "t1", Some(1), &new), now, LIMITS),
            Plan::Reuse(v) if v.sandbox_id == a
        ));
        assert!(matches!(
            plan_admission(&state, &req(&nbid, "v", "t2", Some(1), &new), now, LIMITS),
            Plan::Start(_)
        ));
        state.members[0].drain_only = false;
        // An expired starting reservation stops counting.
        assert!(matches!(
            plan_admission(&state, &req(&nbid, "y", "t", Some(1), &new), 2_000, LIMITS),
            Plan::Start(_)
        ));
    }

    #[test]
    fn tidying_releases_lapsed_slots_and_gone_sandboxes() {
        let (a, b, c, r) = (
            SessionId::generate(),
            SessionId::generate(),
            SessionId::generate(),
            SessionId::generate(),
        );
        let mut state = PoolState::default();
        state.members.push(member(&a, 1, SessionStatus::Running, 1));
        state.members.push(member(&b, 1, SessionStatus::Failed, 2));
        let mut replaced = member(&c, 1, SessionStatus::Terminated, 3);
        replaced.replaced_by = Some(r.clone());
        state.members.push(replaced);
        state
            .members
            .push(member(&r, 1, SessionStatus::Starting, 4));
        state.visits.push(visit("u", "lapsed", &a, 400));
        state.visits.push(visit("u", "held", &a, 900));
        state.visits.push(visit("v", "on-b", &b, 900));
        let mut departed = visit("w", "left", &a, 900);
        departed.grace_until_ms = Some(450);
        state.visits.push(departed);
        let writes = tidy(&mut state, 500);
        // b is gone with its visit; c stays while its replacement starts.
        let ids: Vec<&SessionId> = state.members.iter().map(|m| &m.sandbox_id).collect();
        assert_eq!(ids, [&a, &c, &r]);
        let kept: Vec<&str> = state.visits.iter().map(|v| v.visit_id.as_str()).collect();
        assert_eq!(kept, ["held"]);
        // The idle clock starts at the last released deadline.
        assert_eq!(state.members[0].idle_since_ms, 450);
        assert!(matches!(&writes[0], Write::DeleteMember(id) if id == &b));
        // Once the replacement runs, the replaced member goes too.
        state.members[2].status = Some(SessionStatus::Running);
        tidy(&mut state, 500);
        assert_eq!(state.members.len(), 2);
    }

    #[test]
    fn unlimited_pools_fill_one_sandbox() {
        let (a, new) = (SessionId::generate(), SessionId::generate());
        let nbid: NotebookId = NotebookId::generate();
        let mut state = PoolState::default();
        state.members.push(member(&a, 1, SessionStatus::Running, 1));
        for i in 0..50 {
            state.visits.push(visit("u", &format!("t{i}"), &a, 10_000));
        }
        let open = Limits {
            max_visits: None,
            max_sessions: None,
            lease_ms: 1,
        };
        assert!(
            matches!(plan_admission(&state, &req(&nbid, "u", "new", Some(1), &new), 0, open), Plan::Assign(v) if v.sandbox_id == a)
        );
    }
}
