//! Who is calling, and what they may do on a project.
//!
//! Users are rows of the hub database. In the single-user mode (`UNICAS_HUB_AUTH=none`) every
//! request acts as the local user. Otherwise a request carries a personal access token,
//! `uhub_pat_<id>_<secret>`, of which only a SHA-256 is stored. Roles follow seed 000 §12:
//! super admins and the project owner are `admin`, members have their role, everyone else the
//! deployment default; a browser signed in to the web UI is its session's user (see
//! [`crate::web::session`]); reads of what a caller may not see answer 404, writes a caller may see but
//! not make answer 403.

use axum::http::{HeaderMap, Method};
use serde::Serialize;
use utoipa::ToSchema;

use crate::Hub;
use crate::catalog::{ProjectDefaultRole, ProjectEntry, Role};
use crate::config::{AuthMode, DefaultRole};
use crate::error::{HubError, HubResult};
use crate::ids;
pub use crate::store::User;
use crate::store::{GrantedRole, ScopeProjects, TokenRow, TokenScope};

pub const PAT_PREFIX: &str = "uhub_pat_";
pub const SYNC_PREFIX: &str = "uhub_sync_";

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub created_at: String,
    pub expires_at: Option<String>,
    /// When it was last used (refreshed at most once a UTC day); absent if never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<String>,
    /// `1`: the user's whole authority; `2`: limited to `scope`.
    pub credential_version: i64,
    /// What a version 2 token is limited to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<TokenScope>,
}

/// Most live (neither revoked nor expired) tokens of one user.
pub const MAX_LIVE_TOKENS: i64 = 20;
/// Most projects one scoped token names.
pub const MAX_SCOPE_PROJECTS: usize = 100;

/// The stored hash of a token's secret. Version 2 (scoped) hashes under its own prefix, so a
/// verifier of version 1 can never accept a scoped token as a full one.
fn pat_hash(version: i64, id: &str, secret: &str) -> String {
    match version {
        2 => ids::sha256_hex(&format!("uhub_pat:v2:{id}:{secret}")),
        _ => ids::sha256_hex(&format!("uhub_pat:{id}:{secret}")),
    }
}

/// The scope a token row carries, checked: version 1 has none, version 2 exactly one; anything
/// else refuses the token.
fn stored_scope(version: i64, grant: Option<&str>) -> Result<Option<TokenScope>, ()> {
    match (version, grant) {
        (1, None) => Ok(None),
        (2, Some(g)) => serde_json::from_str(g).map(Some).map_err(|_| ()),
        _ => Err(()),
    }
}

pub fn sync_hash(notebook_id: &crate::ids::NotebookId, secret: &str) -> String {
    ids::sha256_hex(&format!("uhub_sync:{notebook_id}:{secret}"))
}

/// The project role a granted role is.
pub fn granted(r: GrantedRole) -> Role {
    match r {
        GrantedRole::Viewer => Role::Viewer,
        GrantedRole::Editor => Role::Editor,
        GrantedRole::Manager => Role::Manager,
    }
}

pub use server_kit::web_auth::same;

/// Checks a scope as a client sent it: `*` or 1 to 100 distinct project ids.
fn check_scope(s: &TokenScope) -> HubResult<()> {
    match &s.projects {
        ScopeProjects::All(star) if star == "*" => Ok(()),
        ScopeProjects::All(other) => Err(HubError::invalid(format!(
            "a scope's projects are \"*\" or a list of project ids, not {other:?}"
        ))),
        ScopeProjects::Some(list) => {
            let distinct: std::collections::HashSet<_> = list.iter().collect();
            if list.is_empty() || list.len() > MAX_SCOPE_PROJECTS || distinct.len() != list.len() {
                return Err(HubError::invalid(format!(
                    "a scope names 1..={MAX_SCOPE_PROJECTS} distinct projects"
                )));
            }
            Ok(())
        }
    }
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
            scope: stored_scope(t.credential_version, t.grant_json.as_deref())
                .ok()
                .flatten(),
            id: t.id,
            name: t.name,
            created_at: ids::rfc3339(t.created_at_ms),
            expires_at: t.expires_at_ms.map(ids::rfc3339),
            last_used_at: t.last_used_at_ms.map(ids::rfc3339),
            credential_version: t.credential_version,
        }
    }
}

/// Whether two instants fall on different UTC days.
fn other_day(a_ms: i64, b_ms: i64) -> bool {
    a_ms.div_euclid(86_400_000) != b_ms.div_euclid(86_400_000)
}

impl Hub {
    /// The calling user, or 401.
    pub async fn authenticate(&self, method: &Method, headers: &HeaderMap) -> HubResult<User> {
        self.authenticate_as(method, headers, true).await
    }

    /// [`Self::authenticate`]; a browser's web UI session counts only with `browser`.
    pub async fn authenticate_as(
        &self,
        method: &Method,
        headers: &HeaderMap,
        browser: bool,
    ) -> HubResult<User> {
        if self.config.auth == AuthMode::None {
            return self
                .user(&self.config.local_user)
                .await?
                .ok_or_else(|| HubError::unauthorized("the local user is missing"));
        }
        let Some(token) = bearer(headers) else {
            // A signed-in browser (the web UI) instead of a token.
            if browser && let Some((user, _)) = self.web_caller(method, headers).await? {
                return Ok(user);
            }
            return Err(HubError::unauthorized(
                "a personal access token is required (Authorization: Bearer uhub_pat_…), or a signed-in browser",
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
        if !same(
            &check.secret_hash,
            &pat_hash(check.credential_version, id, secret),
        ) {
            return Err(bad());
        }
        let Ok(scope) = stored_scope(check.credential_version, check.grant_json.as_deref()) else {
            tracing::warn!(
                token = id,
                "a token row has an unknown credential version or grant; refused"
            );
            return Err(bad());
        };
        let now = ids::now_ms();
        if check.revoked_at_ms.is_some() || check.expires_at_ms.is_some_and(|e| e <= now) {
            return Err(bad());
        }
        if check.user_suspended {
            return Err(HubError::unauthorized("this user is suspended"));
        }
        if check.last_used_at_ms.is_none_or(|t| other_day(t, now)) {
            // At most one write per token and UTC day; a failure never fails the request.
            if let Err(e) = self.store.touch_token(id, now).await {
                tracing::warn!(token = id, error = %e, "cannot record a token's use");
            }
        }
        let mut user = self.user(&check.user_id).await?.ok_or_else(bad)?;
        if check.invited
            && let Err(e) = self.claim_invitations(&user).await
        {
            // Claimed on a later request; the request itself goes on.
            tracing::warn!(user = %user.id, error = %e, "cannot claim invitations yet");
        }
        user.scope = scope;
        Ok(user)
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
        let email = email.map(str::trim).filter(|e| !e.is_empty());
        if let Some(e) = email {
            crate::invitations::check_email(e)?;
        }
        let user = User {
            id: id.to_string(),
            name: name.to_string(),
            email: email.map(str::to_string),
            super_admin,
            scope: None,
        };
        if !self.store.insert_user(&user, ids::now_ms()).await? {
            return Ok(false);
        }
        // Invitations waiting for the new user's email become memberships now if this process
        // reaches the content store (else, an operator command: on their first sign-in).
        if self.cas().is_ok() {
            self.claim_invitations(&user).await?;
        }
        Ok(true)
    }

    pub async fn set_suspended(&self, id: &str, suspended: bool) -> HubResult<bool> {
        let found = self
            .store
            .set_suspended(id, suspended.then(ids::now_ms))
            .await?;
        if found && suspended {
            self.store.delete_web_sessions_of(id).await?;
        }
        Ok(found)
    }

    /// Whether the hub has any user yet.
    pub async fn has_users(&self) -> HubResult<bool> {
        Ok(self.store.count_users().await? > 0)
    }

    /// Creates a personal access token, limited to `scope` if given; returns it (the only time
    /// it is shown) and its description. A user has at most [`MAX_LIVE_TOKENS`] live tokens.
    pub async fn create_token(
        &self,
        user_id: &str,
        name: &str,
        ttl_ms: Option<i64>,
        scope: Option<TokenScope>,
    ) -> HubResult<(String, TokenView)> {
        if self.user(user_id).await?.is_none() {
            return Err(HubError::not_found(format!("no user {user_id}")));
        }
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(HubError::invalid(
                "a token name is 1..=128 printable characters",
            ));
        }
        if let Some(s) = &scope {
            check_scope(s)?;
        }
        let secret = ids::secret();
        let now = ids::now_ms();
        let version = if scope.is_some() { 2 } else { 1 };
        let row = TokenRow {
            id: ulid::Ulid::generate().to_string(),
            name: name.to_string(),
            created_at_ms: now,
            expires_at_ms: ttl_ms.map(|t| now.saturating_add(t)),
            last_used_at_ms: None,
            credential_version: version,
            grant_json: scope
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| HubError::internal("cannot encode a grant", e))?,
        };
        if !self
            .store
            .insert_token(
                user_id,
                &row,
                &pat_hash(version, &row.id, &secret),
                MAX_LIVE_TOKENS,
            )
            .await?
        {
            return Err(HubError::conflict(format!(
                "a user has at most {MAX_LIVE_TOKENS} live tokens; revoke one first"
            )));
        }
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

    /// The effective role of `user` on `project`, if any: the owner's and super admins'
    /// `admin`, a member's role, else the project's default access (or the deployment's);
    /// never more than the credential's scope allows.
    pub fn role(&self, user: &User, project: &ProjectEntry) -> Option<Role> {
        let role = if user.super_admin || project.owner == user.id {
            Some(Role::Admin)
        } else if let Some(m) = project.members.iter().find(|m| m.user_id == user.id) {
            Some(m.role)
        } else {
            let default = match project.default_role {
                Some(ProjectDefaultRole::None) => DefaultRole::None,
                Some(ProjectDefaultRole::Viewer) => DefaultRole::Viewer,
                Some(ProjectDefaultRole::Editor) => DefaultRole::Editor,
                Some(ProjectDefaultRole::Inherit) | None => self.config.default_role,
            };
            match default {
                DefaultRole::None => None,
                DefaultRole::Viewer => Some(Role::Viewer),
                DefaultRole::Editor => Some(Role::Editor),
            }
        }?;
        match &user.scope {
            None => Some(role),
            Some(s) if s.reaches(&project.id) => Some(role.min(granted(s.role))),
            Some(_) => None,
        }
    }

    /// A super admin acting with their whole authority (not through a scoped token).
    pub fn is_super_admin(&self, user: &User) -> bool {
        user.super_admin && user.scope.is_none()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_tokens_hash_apart_and_a_row_must_agree_with_its_version() {
        let (id, secret) = ("01HXY0S6GWMBASVAG3PZ7Y2K5T", "s3cret");
        // A verifier of version 1 never accepts a version 2 token (and back).
        assert_ne!(pat_hash(1, id, secret), pat_hash(2, id, secret));
        assert_eq!(pat_hash(1, id, secret), pat_hash(1, id, secret));
        let grant = r#"{"projects":"*","role":"viewer"}"#;
        assert_eq!(stored_scope(1, None), Ok(None));
        assert!(matches!(stored_scope(2, Some(grant)), Ok(Some(s)) if s.all_projects()));
        for (v, g) in [
            (1, Some(grant)),
            (2, None),
            (3, None),
            (3, Some(grant)),
            (2, Some("{}")),
        ] {
            assert_eq!(stored_scope(v, g), Err(()), "version {v} with {g:?}");
        }
    }

    #[test]
    fn scopes_name_every_project_or_a_few() {
        let scope = |projects: serde_json::Value| {
            serde_json::from_value::<TokenScope>(
                serde_json::json!({"projects": projects, "role": "editor"}),
            )
        };
        assert!(check_scope(&scope(serde_json::json!("*")).unwrap()).is_ok());
        assert!(check_scope(&scope(serde_json::json!("all")).unwrap()).is_err());
        let one = crate::ids::ProjectId::generate();
        assert!(check_scope(&scope(serde_json::json!([one])).unwrap()).is_ok());
        assert!(check_scope(&scope(serde_json::json!([one, one])).unwrap()).is_err());
        assert!(check_scope(&scope(serde_json::json!([])).unwrap()).is_err());
        assert!(scope(serde_json::json!(["not a project id"])).is_err());
    }

    #[test]
    fn last_use_is_one_write_per_utc_day() {
        let day = 86_400_000;
        assert!(!other_day(10 * day, 10 * day + day - 1));
        assert!(other_day(10 * day + day - 1, 11 * day));
    }
}
