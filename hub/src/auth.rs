//! Who is calling, and what they may do on a project.
//!
//! Users are rows of the hub database. In the single-user mode (`UNICAS_HUB_AUTH=none`) every
//! request acts as the local user. Otherwise a request carries a personal access token,
//! `uhub_pat_<id>_<secret>`, of which only a SHA-256 is stored. Roles follow seed 000 §12:
//! super admins and the project owner are `admin`, members have their role, everyone else the
//! deployment default; reads of what a caller may not see answer 404, writes a caller may see but
//! not make answer 403.

use axum::http::HeaderMap;
use serde::Serialize;
use utoipa::ToSchema;

use crate::Hub;
use crate::catalog::{ProjectEntry, Role};
use crate::config::{AuthMode, DefaultRole};
use crate::error::{HubError, HubResult};
use crate::ids;
use crate::store::TokenRow;
pub use crate::store::User;

pub const PAT_PREFIX: &str = "uhub_pat_";
pub const SYNC_PREFIX: &str = "uhub_sync_";

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub created_at: String,
    pub expires_at: Option<String>,
}

fn pat_hash(id: &str, secret: &str) -> String {
    ids::sha256_hex(&format!("uhub_pat:{id}:{secret}"))
}

pub fn sync_hash(notebook_id: &crate::ids::NotebookId, secret: &str) -> String {
    ids::sha256_hex(&format!("uhub_sync:{notebook_id}:{secret}"))
}

/// Equal strings, in time independent of where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The bearer token of a request, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

impl From<TokenRow> for TokenView {
    fn from(t: TokenRow) -> Self {
        TokenView {
            id: t.id,
            name: t.name,
            created_at: ids::rfc3339(t.created_at_ms),
            expires_at: t.expires_at_ms.map(ids::rfc3339),
        }
    }
}

impl Hub {
    /// The calling user, or 401.
    pub async fn authenticate(&self, headers: &HeaderMap) -> HubResult<User> {
        if self.config.auth == AuthMode::None {
            return self
                .user(&self.config.local_user)
                .await?
                .ok_or_else(|| HubError::unauthorized("the local user is missing"));
        }
        let Some(token) = bearer(headers) else {
            return Err(HubError::unauthorized(
                "a personal access token is required (Authorization: Bearer uhub_pat_…)",
            ));
        };
        let bad = || HubError::unauthorized("the access token is invalid, expired or revoked");
        let Some(rest) = token.strip_prefix(PAT_PREFIX) else {
            return Err(bad());
        };
        let Some((id, secret)) = rest.split_once('_') else {
            return Err(bad());
        };
        if id.len() != 26 || secret.is_empty() || secret.len() > 128 {
            return Err(bad());
        }
        let Some(check) = self.store.token_check(id).await? else {
            return Err(bad());
        };
        if !same(&check.secret_hash, &pat_hash(id, secret)) {
            return Err(bad());
        }
        let now = ids::now_ms();
        if check.revoked_at_ms.is_some() || check.expires_at_ms.is_some_and(|e| e <= now) {
            return Err(bad());
        }
        if check.user_suspended {
            return Err(HubError::unauthorized("this user is suspended"));
        }
        self.user(&check.user_id).await?.ok_or_else(bad)
    }

    /// The user `id` if it exists and is not suspended.
    pub async fn user_standing(&self, id: &str) -> HubResult<Option<User>> {
        match self.store.user_suspended(id).await? {
            Some(false) => self.user(id).await,
            _ => Ok(None),
        }
    }

    pub async fn user(&self, id: &str) -> HubResult<Option<User>> {
        Ok(self.store.user(id).await?)
    }

    /// Creates a user (operator command and the single-user bootstrap).
    pub async fn create_user(
        &self,
        id: &str,
        name: &str,
        email: Option<&str>,
        super_admin: bool,
    ) -> HubResult<bool> {
        if id.is_empty() || id.len() > 128 || id.chars().any(char::is_control) {
            return Err(HubError::invalid(
                "a user id is 1..=128 printable characters",
            ));
        }
        let user = User {
            id: id.to_string(),
            name: name.to_string(),
            email: email.map(str::to_string),
            super_admin,
        };
        Ok(self.store.insert_user(&user, ids::now_ms()).await?)
    }

    pub async fn set_suspended(&self, id: &str, suspended: bool) -> HubResult<bool> {
        Ok(self
            .store
            .set_suspended(id, suspended.then(ids::now_ms))
            .await?)
    }

    /// Whether the hub has any user yet.
    pub async fn has_users(&self) -> HubResult<bool> {
        Ok(self.store.count_users().await? > 0)
    }

    /// Creates a personal access token; returns it (the only time it is shown) and its id.
    pub async fn create_token(
        &self,
        user_id: &str,
        name: &str,
        ttl_ms: Option<i64>,
    ) -> HubResult<(String, TokenView)> {
        if self.user(user_id).await?.is_none() {
            return Err(HubError::not_found(format!("no user {user_id}")));
        }
        if name.is_empty() || name.len() > 128 {
            return Err(HubError::invalid("a token name is 1..=128 characters"));
        }
        if self.store.live_tokens(user_id, ids::now_ms()).await? >= 20 {
            return Err(HubError::conflict(
                "a user has at most 20 live tokens; revoke one first",
            ));
        }
        let secret = ids::secret();
        let now = ids::now_ms();
        let row = TokenRow {
            id: ulid::Ulid::generate().to_string(),
            name: name.to_string(),
            created_at_ms: now,
            expires_at_ms: ttl_ms.map(|t| now + t),
        };
        self.store
            .insert_token(user_id, &row, &pat_hash(&row.id, &secret))
            .await?;
        Ok((format!("{PAT_PREFIX}{}_{secret}", row.id), row.into()))
    }

    pub async fn list_tokens(&self, user_id: &str) -> HubResult<Vec<TokenView>> {
        Ok(self
            .store
            .tokens(user_id)
            .await?
            .into_iter()
            .map(TokenView::from)
            .collect())
    }

    pub async fn revoke_token(&self, user_id: &str, token_id: &str) -> HubResult<()> {
        if !self
            .store
            .revoke_token(user_id, token_id, ids::now_ms())
            .await?
        {
            return Err(HubError::not_found(format!("no token {token_id}")));
        }
        Ok(())
    }

    /// The effective role of `user` on `project`, if any.
    pub fn role(&self, user: &User, project: &ProjectEntry) -> Option<Role> {
        if user.super_admin || project.owner == user.id {
            return Some(Role::Admin);
        }
        if let Some(m) = project.members.iter().find(|m| m.user_id == user.id) {
            return Some(m.role);
        }
        match self.config.default_role {
            DefaultRole::None => None,
            DefaultRole::Viewer => Some(Role::Viewer),
            DefaultRole::Editor => Some(Role::Editor),
        }
    }

    /// Checks that `user` has at least `need` on `project`: 404 if they cannot see it at all,
    /// 403 if they can see it but not do this.
    pub fn require(&self, user: &User, project: &ProjectEntry, need: Role) -> HubResult<Role> {
        match self.role(user, project) {
            None => Err(HubError::not_found(format!(
                "project {} not found",
                project.id
            ))),
            Some(r) if r >= need => Ok(r),
            Some(r) => Err(HubError::forbidden(format!(
                "this needs the {need:?} role on the project; you are {r:?}"
            ))),
        }
    }
}
