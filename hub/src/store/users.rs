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
}

/// What authenticating a token needs to know.
#[derive(Debug, Clone)]
pub struct TokenCheck {
    pub user_id: String,
    pub secret_hash: String,
    pub expires_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
    pub user_suspended: bool,
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
            })
        })
        .transpose()
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
            "SELECT t.user_id, t.secret_hash, t.expires_at_ms, t.revoked_at_ms, u.suspended_at_ms \
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
                user_suspended: r.try_get::<Option<i64>, _>("suspended_at_ms")?.is_some(),
            })
        })
        .transpose()
    }

    /// Tokens of a user neither revoked nor expired at `now`.
    pub async fn live_tokens(&self, user_id: &str, now: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM hub_tokens WHERE user_id = $1 AND revoked_at_ms IS NULL \
             AND (expires_at_ms IS NULL OR expires_at_ms > $2)",
        )
        .bind(user_id)
        .bind(now)
        .fetch_one(self.pool())
        .await
    }

    pub async fn insert_token(
        &self,
        user_id: &str,
        token: &TokenRow,
        secret_hash: &str,
    ) -> Result<(), sqlx::Error> {
        let mut tx: WriteTx = self.write().await?;
        sqlx::query(
            "INSERT INTO hub_tokens (id, user_id, name, secret_hash, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&token.id)
        .bind(user_id)
        .bind(&token.name)
        .bind(secret_hash)
        .bind(token.created_at_ms)
        .bind(token.expires_at_ms)
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }

    /// A user's tokens that are not revoked.
    pub async fn tokens(&self, user_id: &str) -> Result<Vec<TokenRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, name, created_at_ms, expires_at_ms FROM hub_tokens \
             WHERE user_id = $1 AND revoked_at_ms IS NULL ORDER BY id",
        )
        .bind(user_id)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(TokenRow {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                    expires_at_ms: r.try_get("expires_at_ms")?,
                })
            })
            .collect()
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
