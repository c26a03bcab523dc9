//! Members by email (seed 000 §4.3): a manager invites an email with a role; if a user has that
//! email they become a member at once, else the invitation waits and is claimed (the user becomes
//! a member of every project that invited them, in one catalog change) when a user with that
//! email is created or first authenticates.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Hub;
use crate::auth::{User, granted};
use crate::catalog::{Member, Role};
use crate::error::{HubError, HubResult};
use crate::ids::{self, ProjectId};
use crate::outbox::Effect;
use crate::projects::{MAX_MEMBERS, ProjectView, PutMember};
use crate::store::{EventRow, GrantedRole, InvitationRow};

/// Longest email.
pub const MAX_EMAIL: usize = 254;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Invite {
    pub email: String,
    /// `viewer`, `editor` or `manager`.
    pub role: GrantedRole,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InvitationView {
    /// In lower case.
    pub email: String,
    pub role: GrantedRole,
    pub invited_by: String,
    pub invited_at: String,
}

/// What an invitation did: `member` (a user has the email and is now a member: `project`) or
/// `invited` (it waits for the email's first sign-in: `invitation`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Invited {
    pub status: InviteStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<ProjectView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invitation: Option<InvitationView>,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum InviteStatus {
    Member,
    Invited,
}

impl From<InvitationRow> for InvitationView {
    fn from(r: InvitationRow) -> Self {
        InvitationView {
            email: r.email,
            role: r.role,
            invited_by: r.invited_by,
            invited_at: ids::rfc3339(r.created_at_ms),
        }
    }
}

/// Checks an email's shape (one `@` with text on both sides, no spaces or controls) and answers
/// it in lower case.
pub fn check_email(email: &str) -> HubResult<String> {
    let e = email.trim();
    let ok = e.len() <= MAX_EMAIL
        && !e.chars().any(|c| c.is_whitespace() || c.is_control())
        && matches!(e.split_once('@'), Some((local, domain))
            if !local.is_empty() && !domain.is_empty() && !domain.contains('@'));
    if !ok {
        return Err(HubError::invalid(format!(
            "{email:?} is not an email address"
        )));
    }
    Ok(e.to_lowercase())
}

impl Hub {
    /// Invites `req.email` to a project (manager).
    pub async fn invite(&self, user: &User, pid: &ProjectId, req: Invite) -> HubResult<Invited> {
        self.project_for(user, pid, Role::Manager).await?;
        let email = check_email(&req.email)?;
        if let Some(existing) = self.store.user_by_email(&email).await? {
            let put = PutMember {
                user_id: existing.id,
                role: granted(req.role),
            };
            return Ok(Invited {
                status: InviteStatus::Member,
                project: Some(self.put_member(user, pid, put).await?),
                invitation: None,
            });
        }
        let open = self.store.project_invitations(pid).await?;
        if open.len() >= MAX_MEMBERS && !open.iter().any(|i| i.email == email) {
            return Err(HubError::quota(
                "invitations",
                MAX_MEMBERS as u64,
                "the project has as many open invitations as it may",
            ));
        }
        let row = InvitationRow {
            project_id: pid.clone(),
            email: email.clone(),
            role: req.role,
            invited_by: user.id.clone(),
            created_at_ms: ids::now_ms(),
        };
        let event = EventRow::new(
            "project.invite",
            &user.id,
            Some(pid),
            None,
            serde_json::json!({"email": email, "role": req.role}),
        );
        self.store.upsert_invitation(&row, &event).await?;
        Ok(Invited {
            status: InviteStatus::Invited,
            project: None,
            invitation: Some(row.into()),
        })
    }

    /// A project's open invitations (manager).
    pub async fn invitations(
        &self,
        user: &User,
        pid: &ProjectId,
    ) -> HubResult<Vec<InvitationView>> {
        self.project_for(user, pid, Role::Manager).await?;
        Ok(self
            .store
            .project_invitations(pid)
            .await?
            .into_iter()
            .map(InvitationView::from)
            .collect())
    }

    /// Withdraws an open invitation (manager).
    pub async fn withdraw_invitation(
        &self,
        user: &User,
        pid: &ProjectId,
        email: &str,
    ) -> HubResult<()> {
        self.project_for(user, pid, Role::Manager).await?;
        let email = check_email(email)?;
        if !self.store.delete_invitation(pid, &email).await? {
            return Err(HubError::not_found(format!(
                "no open invitation for {email}"
            )));
        }
        Ok(())
    }

    /// Makes `user` a member of every live project that invited their email, in one catalog
    /// change that also drops the invitations. Projects in the trash keep theirs.
    pub async fn claim_invitations(&self, user: &User) -> HubResult<()> {
        let Some(email) = user.email.as_deref().map(str::to_lowercase) else {
            return Ok(());
        };
        let invitations = self.store.invitations_for(&email).await?;
        // Invitations to projects in the trash wait with them: nothing to change for those.
        let cat = self.catalog().await?;
        if invitations
            .iter()
            .all(|i| cat.any_project(&i.project_id).is_some_and(|p| !p.is_live()))
        {
            return Ok(());
        }
        self.mutate_catalog(&user.id, "project.members", |cat| {
            let mut claimed = Vec::new();
            let mut effects = Vec::new();
            for inv in &invitations {
                if cat
                    .any_project(&inv.project_id)
                    .is_some_and(|p| !p.is_live())
                {
                    continue; // restorable: the invitation waits with it
                }
                claimed.push(inv.project_id.clone());
                let Some(p) = cat.project_mut(&inv.project_id) else {
                    continue; // purged: nothing to join
                };
                if p.owner == user.id || p.members.iter().any(|m| m.user_id == user.id) {
                    continue;
                }
                if p.members.len() >= MAX_MEMBERS {
                    continue;
                }
                p.members.push(Member {
                    user_id: user.id.clone(),
                    role: granted(inv.role),
                });
                p.updated_at = ids::rfc3339(ids::now_ms());
                effects.push(Effect::Event(EventRow::new(
                    "project.members",
                    &inv.invited_by,
                    Some(&inv.project_id),
                    None,
                    serde_json::json!({"user_id": user.id, "role": inv.role, "invitation": email}),
                )));
            }
            effects.push(Effect::DropInvitations {
                email: Some(email.clone()),
                project_ids: claimed,
            });
            Ok(((), effects))
        })
        .await
    }
}
