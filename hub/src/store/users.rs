//! Users (`hub_users`) and personal access tokens (`hub_tokens`; only a hash of each secret).

use serde::Serialize;
use sqlx::Row;
use utoipa::ToSchema;

use super::{HubStore, WriteTx};

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct User {
    pub id: String,
    pub name: String,
    pub email: Option<String>,
    pub super_admin: bool,
    /// What the credential of this request is limited to (a scoped token); `None`: the user's
    /// whole authority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<TokenScope>,
}

/// The grant of a scoped (credential version 2) token: the projects it reaches and the highest
/// role it acts with there. It only ever reduces what its user may do.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenScope {
    /// `*` for every project the user can reach, else 1 to 100 project ids.
    pub projects: ScopeProjects,
    /// The highest role the token acts with: `viewer`, `editor` or `manager`.
    pub role: super::invitations::GrantedRole,
}

impl TokenScope {
    /// Whether it reaches every project.
    pub fn all_projects(&self) -> bool {
        matches!(&self.projects, ScopeProjects::All(_))
    }

    /// Whether it reaches project `pid`.
    pub fn reaches(&self, pid: &crate::ids::ProjectId) -> bool {
        match &self.projects {
            ScopeProjects::All(_) => true,
            ScopeProjects::Some(list) => list.contains(pid),
        }
    }
}

/// The projects of a scope.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ScopeProjects {
    /// `"*"`.
    All(String),
    Some(Vec<crate::ids::ProjectId>),
}

/// A user as others see them: what an author, member or starter id resolves to.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Identity {
    pub id: String,
    pub name: String,
    pub email: Option<String>,
    /// When the user was suspended (RFC 3339); absent for an active user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspended_at: Option<String>,
}

/// A personal access token, without its secret.
#[derive(Debug, Clone)]
pub struct TokenRow {
    pub id: String,
    pub name: String,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub last_used_at_ms: Option<i64>,
    /// `1`: full access within the user's authority; `2`: limited by `grant_json`.
    pub credential_version: i64,
    pub grant_json: Option<String>,
}

/// What authenticating a token needs to know.
#[derive(Debug, Clone)]
pub struct TokenCheck {
    pub user_id: String,
    pub secret_hash: String,
    pub expires_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
    pub last_used_at_ms: Option<i64>,
    pub credential_version: i64,
    pub grant_json: Option<String>,
    pub user_suspended: bool,
    /// Whether invitations wait for the user's email.
    pub invited: bool,
}

const TOKEN_COLUMNS: &str =
    "id, name, created_at_ms, expires_at_ms, last_used_at_ms, credential_version, grant_json";

fn token_row(r: &sqlx::any::AnyRow) -> Result<TokenRow, sqlx::Error> {
    Ok(TokenRow {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        created_at_ms: r.try_get("created_at_ms")?,
        expires_at_ms: r.try_get("expires_at_ms")?,
        last_used_at_ms: r.try_get("last_used_at_ms")?,
        credential_version: r.try_get("credential_version")?,
        grant_json: r.try_get("grant_json")?,
    })
}

impl HubStore {
    pub async fn user(&self, id: &str) -> Result<Option<User>, sqlx::Error> {
        let row = sqlx::query("SELECT id, name, email, super_admin FROM hub_users WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.map(|r| {
            Ok(User {
                id: r.try_get("id")?,
                name: r.try_get("name")?,
                email: r.try_get("email")?,
                super_admin: r.try_get::<i64, _>("super_admin")? != 0,
                scope: None,
            })
        })
        .transpose()
    }

    /// The user whose email is `email` (compared in lower case), if exactly one has it.
    pub async fn user_by_email(&self, email: &str) -> Result<Option<User>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, name, email, super_admin FROM hub_users WHERE LOWER(email) = $1 LIMIT 2",
        )
        .bind(email)
        .fetch_all(self.pool())
        .await?;
        if rows.len() != 1 {
            return Ok(None);
        }
        let r = &rows[0];
        Ok(Some(User {
            id: r.try_get("id")?,
            name: r.try_get("name")?,
            email: r.try_get("email")?,
            super_admin: r.try_get::<i64, _>("super_admin")? != 0,
            scope: None,
        }))
    }

    /// The identities of those of `ids` that are users, ordered by id.
    pub async fn identities(&self, ids: &[&str]) -> Result<Vec<Identity>, sqlx::Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id, name, email, suspended_at_ms FROM hub_users WHERE id IN ({}) ORDER BY id",
            super::placeholders(1, ids.len())
        )));
        for id in ids {
            q = q.bind(*id);
        }
        q.fetch_all(self.pool())
            .await?
            .iter()
            .map(|r| {
                let suspended: Option<i64> = r.try_get("suspended_at_ms")?;
                Ok(Identity {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    email: r.try_get("email")?,
                    suspended_at: suspended.map(crate::ids::rfc3339),
                })
            })
            .collect()
    }

    /// Whether the user `id` is suspended (`None`: there is no such user).
    pub async fn user_suspended(&self, id: &str) -> Result<Option<bool>, sqlx::Error> {
        let row = sqlx::query("SELECT suspended_at_ms FROM hub_users WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.map(|r| Ok(r.try_get::<Option<i64>, _>("suspended_at_ms")?.is_some()))
            .transpose()
    }

    pub async fn count_users(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM hub_users")
            .fetch_one(self.pool())
            .await
    }

    /// Creates a user; `false` if the id is taken.
    pub async fn insert_user(&self, user: &User, now: i64) -> Result<bool, sqlx::Error> {
        let mut tx = self.write().await?;
        let n = sqlx::query(
            "INSERT INTO hub_users (id, name, email, super_admin, created_at_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&user.id)
        .bind(&user.name)
        .bind(&user.email)
        .bind(i64::from(user.super_admin))
        .bind(now)
        .execute(tx.conn())
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n == 1)
    }

    /// Suspends (`Some(now)`) or resumes (`None`) a user; `false` if there is no such user.
    pub async fn set_suspended(&self, id: &str, at: Option<i64>) -> Result<bool, sqlx::Error> {
        let mut tx = self.write().await?;
        let n = sqlx::query("UPDATE hub_users SET suspended_at_ms = $1 WHERE id = $2")
            .bind(at)
            .bind(id)
            .execute(tx.conn())
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n == 1)
    }

    pub async fn token_check(&self, token_id: &str) -> Result<Option<TokenCheck>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT t.user_id, t.secret_hash, t.expires_at_ms, t.revoked_at_ms, t.last_used_at_ms, \
             t.credential_version, t.grant_json, u.suspended_at_ms, \
             CAST(CASE WHEN EXISTS (SELECT 1 FROM hub_invitations i WHERE i.email = LOWER(u.email)) \
             THEN 1 ELSE 0 END AS BIGINT) AS invited \
             FROM hub_tokens t JOIN hub_users u ON u.id = t.user_id WHERE t.id = $1",
        )
        .bind(token_id)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(TokenCheck {
                user_id: r.try_get("user_id")?,
                secret_hash: r.try_get("secret_hash")?,
                expires_at_ms: r.try_get("expires_at_ms")?,
                revoked_at_ms: r.try_get("revoked_at_ms")?,
                last_used_at_ms: r.try_get("last_used_at_ms")?,
                credential_version: r.try_get("credential_version")?,
                grant_json: r.try_get("grant_json")?,
                user_suspended: r.try_get::<Option<i64>, _>("suspended_at_ms")?.is_some(),
                invited: r.try_get::<i64, _>("invited")? != 0,
            })
        })
        .transpose()
    }

    /// Creates a token unless the user has `cap` live ones (neither revoked nor expired) at
    /// `now`, counted in the same transaction; `false` if at the cap.
    pub async fn insert_token(
        &self,
        user_id: &str,
        token: &TokenRow,
        secret_hash: &str,
        cap: i64,
    ) -> Result<bool, sqlx::Error> {
        let mut tx: WriteTx = self.write().await?;
        if self.dialect() == super::Dialect::Postgres {
            // Creates of one user take turns (SQLite's writer is one already).
            sqlx::query("SELECT id FROM hub_users WHERE id = $1 FOR UPDATE")
                .bind(user_id)
                .fetch_optional(tx.conn())
                .await?;
        }
        let live: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM hub_tokens WHERE user_id = $1 AND revoked_at_ms IS NULL \
             AND (expires_at_ms IS NULL OR expires_at_ms > $2)",
        )
        .bind(user_id)
        .bind(token.created_at_ms)
        .fetch_one(tx.conn())
        .await?;
        if live >= cap {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO hub_tokens (id, user_id, name, secret_hash, created_at_ms, expires_at_ms, \
             credential_version, grant_json) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&token.id)
        .bind(user_id)
        .bind(&token.name)
        .bind(secret_hash)
        .bind(token.created_at_ms)
        .bind(token.expires_at_ms)
        .bind(token.credential_version)
        .bind(&token.grant_json)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records that a token was used at `now` (if it is still live).
    pub async fn touch_token(&self, token_id: &str, now: i64) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query(
            "UPDATE hub_tokens SET last_used_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL",
        )
        .bind(now)
        .bind(token_id)
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }

    /// A user's tokens that are not revoked.
    pub async fn tokens(&self, user_id: &str) -> Result<Vec<TokenRow>, sqlx::Error> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM hub_tokens \
             WHERE user_id = $1 AND revoked_at_ms IS NULL ORDER BY id"
        )))
        .bind(user_id)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(token_row).collect()
    }

    /// Revokes a token of a user; `false` if there is no such live token.
    pub async fn revoke_token(
        &self,
        user_id: &str,
        token_id: &str,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.write().await?;
        let n = sqlx::query(
            "UPDATE hub_tokens SET revoked_at_ms = $1 WHERE id = $2 AND user_id = $3 AND revoked_at_ms IS NULL",
        )
        .bind(now)
        .bind(token_id)
        .bind(user_id)
        .execute(tx.conn())
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n == 1)
    }
}
