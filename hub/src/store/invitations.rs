//! Members invited by email (`hub_invitations`) before they have an account.

use sqlx::Row;

use super::{HubStore, WriteTx, enum_col, parsed};
use crate::ids::ProjectId;

column_enum! {
    /// A role that can be granted: to an invited member, or as a scoped token's highest (never
    /// `admin`, which is the owner's).
    pub enum GrantedRole {
        Viewer = "viewer",
        Editor = "editor",
        Manager = "manager",
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct InvitationRow {
    pub project_id: ProjectId,
    /// In lower case.
    pub email: String,
    pub role: GrantedRole,
    pub invited_by: String,
    pub created_at_ms: i64,
}

fn invitation(r: &sqlx::any::AnyRow) -> Result<InvitationRow, sqlx::Error> {
    Ok(InvitationRow {
        project_id: parsed(r, "project_id")?,
        email: r.try_get("email")?,
        role: enum_col(r, "role")?,
        invited_by: r.try_get("invited_by")?,
        created_at_ms: r.try_get("created_at_ms")?,
    })
}

const COLUMNS: &str = "project_id, email, role, invited_by, created_at_ms";

impl HubStore {
    /// Invites `email` (again: the role and inviter are replaced), with its event.
    pub async fn upsert_invitation(
        &self,
        inv: &InvitationRow,
        event: &super::EventRow,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO hub_invitations ({COLUMNS}) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (project_id, email) DO UPDATE SET role = $3, invited_by = $4, \
             created_at_ms = $5"
        )))
        .bind(inv.project_id.as_str())
        .bind(&inv.email)
        .bind(inv.role.as_str())
        .bind(&inv.invited_by)
        .bind(inv.created_at_ms)
        .execute(tx.conn())
        .await?;
        event.insert(&mut tx).await?;
        tx.commit().await
    }

    /// A project's open invitations, by email.
    pub async fn project_invitations(
        &self,
        pid: &ProjectId,
    ) -> Result<Vec<InvitationRow>, sqlx::Error> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM hub_invitations WHERE project_id = $1 ORDER BY email"
        )))
        .bind(pid.as_str())
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(invitation).collect()
    }

    /// The open invitations of an email (lower case), by project.
    pub async fn invitations_for(&self, email: &str) -> Result<Vec<InvitationRow>, sqlx::Error> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM hub_invitations WHERE email = $1 ORDER BY project_id"
        )))
        .bind(email)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(invitation).collect()
    }

    /// Withdraws an invitation; `false` if there was none.
    pub async fn delete_invitation(
        &self,
        pid: &ProjectId,
        email: &str,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.write().await?;
        let n = Self::delete_invitations(&mut tx, Some(pid), Some(email)).await?;
        tx.commit().await?;
        Ok(n > 0)
    }

    /// Deletes the invitations of a project, of an email, or the one of both, in `tx`.
    pub async fn delete_invitations(
        tx: &mut WriteTx,
        pid: Option<&ProjectId>,
        email: Option<&str>,
    ) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(
            "DELETE FROM hub_invitations WHERE ($1 IS NULL OR project_id = $1) \
             AND ($2 IS NULL OR email = $2)",
        )
        .bind(pid.map(ProjectId::as_str))
        .bind(email)
        .execute(tx.conn())
        .await?
        .rows_affected())
    }
}
