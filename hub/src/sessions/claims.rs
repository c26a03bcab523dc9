//! The persistent editor of a notebook (seed 000 §4.8.2): the one edit session whose changes
//! are saved. Under `exclusive` only its user edits; anyone else is refused with 409
//! `editor_claimed` until they take over. Under `shared`, editors of the project attach to the
//! holder's sandbox. A takeover goes `requested → draining → ready`: the holder's changes are
//! saved and its sandbox stopped before the requester may start.

use axum::http::StatusCode;

use crate::Hub;
use crate::auth::User;
use crate::catalog::Role;
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId};
use crate::sessions::lifecycle::End;
use crate::sessions::view::EditorClaimView;
use crate::store::sessions::{
    ClaimRow, SessionRow, SessionStatus, Sharing, Takeover, TakeoverPhase,
};
use crate::store::{HubStore, WriteTx};

/// How long a finished takeover keeps the editor for its requester.
const READY_HOLD_MS: i64 = 10 * 60_000;
/// How long a drain may run before another attempt may take it over.
const DRAIN_LEASE_MS: i64 = 10 * 60_000;

/// What an edit-session create does about the claim.
pub enum ClaimDecision {
    /// Become the holder.
    Take,
    /// Join the holder's session (shared editors, or the holder's own other request).
    Attach(Box<SessionRow>),
}

fn claimed(c: &ClaimRow, holder: &SessionRow) -> HubError {
    HubError::new(
        StatusCode::CONFLICT,
        "editor_claimed",
        format!(
            "{} is editing this notebook (since {}); take over the editor to edit it",
            c.user_id,
            ids::rfc3339(c.claimed_at_ms)
        ),
    )
    .with("holder", c.user_id.as_str())
    .with("session_id", holder.session_id.as_str())
    .with("claimed_at", ids::rfc3339(c.claimed_at_ms))
}

/// Decides, in the create's transaction, whether `user` becomes the editor of `notebook`.
pub async fn decide(
    tx: &mut WriteTx,
    notebook: &NotebookId,
    user: &str,
    now_ms: i64,
) -> HubResult<ClaimDecision> {
    let Some(c) = HubStore::editor_claim(tx, notebook).await? else {
        return Ok(ClaimDecision::Take);
    };
    let holder = HubStore::session_tx(tx, &c.session_id).await?;
    let live = holder
        .as_ref()
        .filter(|h| SessionStatus::LIVE.contains(&h.status));
    let reserved_for = c
        .takeover
        .as_ref()
        .filter(|t| t.phase == TakeoverPhase::Ready && now_ms - t.requested_at_ms < READY_HOLD_MS);
    match (live, reserved_for) {
        (Some(h), _) if h.user_id == user || c.sharing == Sharing::Shared => {
            Ok(ClaimDecision::Attach(Box::new(h.clone())))
        }
        (Some(h), _) => Err(claimed(&c, h)),
        (None, Some(t)) if t.requested_by != user => Err(HubError::new(
            StatusCode::CONFLICT,
            "editor_claimed",
            format!("the editor was handed over to {}", t.requested_by),
        )
        .with("holder", t.requested_by.as_str())),
        (None, _) => Ok(ClaimDecision::Take),
    }
}

impl Hub {
    /// Who holds the editor of a notebook.
    pub async fn editor_claim(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
    ) -> HubResult<EditorClaimView> {
        self.notebook_for(user, pid, nid, Role::Viewer).await?;
        let claim = self.live_claim(nid).await?;
        Ok(EditorClaimView::of(
            nid,
            claim.as_ref(),
            self.config.sessions.editor_mode,
        ))
    }

    /// The claim, if its holder is live or a takeover is in progress.
    async fn live_claim(&self, nid: &NotebookId) -> HubResult<Option<ClaimRow>> {
        let Some(c) = self.store.read_editor_claim(nid).await? else {
            return Ok(None);
        };
        if c.takeover.is_some() {
            return Ok(Some(c));
        }
        let holder = self.store.session(&c.session_id).await?;
        Ok(holder
            .filter(|h| SessionStatus::LIVE.contains(&h.status))
            .map(|_| c))
    }

    /// The holder's session, when a takeover of `nid` must end it (`None`: nothing to drain).
    pub async fn takeover_target(&self, nid: &NotebookId) -> HubResult<Option<SessionRow>> {
        let Some(c) = self.store.read_editor_claim(nid).await? else {
            return Ok(None);
        };
        Ok(self
            .store
            .session(&c.session_id)
            .await?
            .filter(|h| SessionStatus::LIVE.contains(&h.status)))
    }

    /// Takes over the editor of a notebook: saves the holder's changes, stops its sandbox and
    /// reserves the editor for the caller (`ready`). Call it on the hub process that owns the
    /// holder's sandbox (see [`Hub::owner_of`]); calling it again after a failure resumes.
    pub async fn take_over_editor(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
    ) -> HubResult<EditorClaimView> {
        self.notebook_for(user, pid, nid, Role::Editor).await?;
        let mode = self.config.sessions.editor_mode;
        let Some(claim) = self.store.read_editor_claim(nid).await? else {
            return Ok(EditorClaimView::of(nid, None, mode));
        };
        let holder = self.store.session(&claim.session_id).await?;
        let holder_live = holder
            .as_ref()
            .is_some_and(|h| SessionStatus::LIVE.contains(&h.status));
        if claim.user_id == user.id && claim.takeover.is_none() {
            return Ok(EditorClaimView::of(nid, Some(&claim), mode));
        }
        if let Some(t) = &claim.takeover
            && t.requested_by != user.id
            && t.drain_expires_at_ms.is_some_and(|e| e > ids::now_ms())
        {
            return Err(HubError::new(
                StatusCode::CONFLICT,
                "takeover_in_progress",
                format!("{} is taking over this editor", t.requested_by),
            )
            .with("requested_by", t.requested_by.as_str()));
        }
        let now = ids::now_ms();
        let phase = |p: TakeoverPhase| Takeover {
            phase: p,
            requested_by: user.id.clone(),
            requested_at_ms: now,
            drain_expires_at_ms: (p != TakeoverPhase::Ready).then_some(now + DRAIN_LEASE_MS),
        };
        self.set_phase(nid, &claim, &phase(TakeoverPhase::Requested))
            .await?;
        if holder_live {
            self.set_phase(nid, &claim, &phase(TakeoverPhase::Draining))
                .await?;
            let live = self.sessions.get(&claim.session_id).ok_or_else(|| {
                HubError::unavailable("the editor's sandbox runs on another hub process")
            })?;
            self.end_session(&live, End::TakenOver).await?;
        }
        let ready = phase(TakeoverPhase::Ready);
        self.set_phase(nid, &claim, &ready).await?;
        let claim = ClaimRow {
            takeover: Some(ready),
            ..claim
        };
        Ok(EditorClaimView::of(nid, Some(&claim), mode))
    }

    async fn set_phase(&self, nid: &NotebookId, claim: &ClaimRow, t: &Takeover) -> HubResult<()> {
        let mut tx = self.store.write().await?;
        let moved = HubStore::set_takeover(&mut tx, nid, &claim.session_id, t).await?;
        tx.commit().await?;
        if !moved {
            return Err(HubError::conflict(
                "the editor changed hands meanwhile; look again",
            ));
        }
        Ok(())
    }
}
