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
use sqlx::Row;
use utoipa::ToSchema;

use crate::Hub;
use crate::catalog::{ProjectEntry, Role};
use crate::config::{AuthMode, DefaultRole};
use crate::error::{HubError, HubResult};
use crate::ids;

pub const PAT_PREFIX: &str = "uhub_pat_";
pub const SYNC_PREFIX: &str = "uhub_sync_";

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct User {
    pub id: String,
    pub name: String,
    pub email: Option<String>,
    pub super_admin: bool,
}

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

pub fn sync_hash(notebook_id: &str, secret: &str) -> String {
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
        let row = sqlx::query(
            "SELECT t.user_id, t.secret_hash, t.expires_at_ms, t.revoked_at_ms, u.suspended_at_ms \
             FROM hub_tokens t JOIN hub_users u ON u.id = t.user_id WHERE t.id = $1",
        )
        .bind(id)
        .fetch_optional(&self.db.pool)
        .await?;
        let Some(row) = row else { return Err(bad()) };
        let hash: String = row.try_get("secret_hash")?;
        if !same(&hash, &pat_hash(id, secret)) {
            return Err(bad());
        }
        let now = ids::now_ms();
        let expires: Option<i64> = row.try_get("expires_at_ms")?;
        let revoked: Option<i64> = row.try_get("revoked_at_ms")?;
        let suspended: Option<i64> = row.try_get("suspended_at_ms")?;
        if revoked.is_some() || expires.is_some_and(|e| e <= now) {
            return Err(bad());
        }
        if suspended.is_some() {
            return Err(HubError::unauthorized("this user is suspended"));
        }
        let user_id: String = row.try_get("user_id")?;
        self.user(&user_id).await?.ok_or_else(bad)
    }

    /// The user `id` if it exists and is not suspended.
    pub async fn user_standing(&self, id: &str) -> HubResult<Option<User>> {
        let suspended: Option<Option<i64>> =
            sqlx::query_scalar("SELECT suspended_at_ms FROM hub_users WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.db.pool)
                .await?;
        match suspended {
            Some(None) => self.user(id).await,
            _ => Ok(None),
        }
    }

    pub async fn user(&self, id: &str) -> HubResult<Option<User>> {
        let row = sqlx::query("SELECT id, name, email, super_admin FROM hub_users WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await?;
        row.map(|r| {
            Ok(User {
                id: r.try_get("id")?,
                name: r.try_get("name")?,
                email: r.try_get("email")?,
                super_admin: r.try_get::<i64, _>("super_admin")? != 0,
            })
        })
        .transpose()
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
        let mut tx = self.db.write().await?;
        let n = sqlx::query(
            "INSERT INTO hub_users (id, name, email, super_admin, created_at_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(id)
        .bind(name)
        .bind(email)
        .bind(i64::from(super_admin))
        .bind(ids::now_ms())
        .execute(tx.conn())
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n == 1)
    }

    pub async fn set_suspended(&self, id: &str, suspended: bool) -> HubResult<bool> {
        let mut tx = self.db.write().await?;
        let n = sqlx::query("UPDATE hub_users SET suspended_at_ms = $1 WHERE id = $2")
            .bind(suspended.then(ids::now_ms))
            .bind(id)
            .execute(tx.conn())
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n == 1)
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
        let live: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM hub_tokens WHERE user_id = $1 AND revoked_at_ms IS NULL \
             AND (expires_at_ms IS NULL OR expires_at_ms > $2)",
        )
        .bind(user_id)
        .bind(ids::now_ms())
        .fetch_one(&self.db.pool)
        .await?;
        if live >= 20 {
            return Err(HubError::conflict(
                "a user has at most 20 live tokens; revoke one first",
            ));
        }
        let id = ulid::Ulid::generate().to_string();
        let secret = ids::secret();
        let now = ids::now_ms();
        let expires = ttl_ms.map(|t| now + t);
        let mut tx = self.db.write().await?;
        sqlx::query(
            "INSERT INTO hub_tokens (id, user_id, name, secret_hash, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(user_id)
        .bind(name)
        .bind(pat_hash(&id, &secret))
        .bind(now)
        .bind(expires)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok((
            format!("{PAT_PREFIX}{id}_{secret}"),
            TokenView {
                id,
                name: name.to_string(),
                created_at: ids::rfc3339(now),
                expires_at: expires.map(ids::rfc3339),
            },
        ))
    }

    pub async fn list_tokens(&self, user_id: &str) -> HubResult<Vec<TokenView>> {
        let rows = sqlx::query(
            "SELECT id, name, created_at_ms, expires_at_ms FROM hub_tokens \
             WHERE user_id = $1 AND revoked_at_ms IS NULL ORDER BY id",
        )
        .bind(user_id)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(TokenView {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    created_at: ids::rfc3339(r.try_get("created_at_ms")?),
                    expires_at: r
                        .try_get::<Option<i64>, _>("expires_at_ms")?
                        .map(ids::rfc3339),
                })
            })
            .collect()
    }

    pub async fn revoke_token(&self, user_id: &str, token_id: &str) -> HubResult<()> {
        let mut tx = self.db.write().await?;
        let n = sqlx::query(
            "UPDATE hub_tokens SET revoked_at_ms = $1 WHERE id = $2 AND user_id = $3 AND revoked_at_ms IS NULL",
        )
        .bind(ids::now_ms())
        .bind(token_id)
        .bind(user_id)
        .execute(tx.conn())
        .await?
        .rows_affected();
        tx.commit().await?;
        if n == 0 {
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
