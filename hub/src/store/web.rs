//! Browser sign-in: web sessions (`hub_web_sessions`), one-time login links
//! (`hub_login_links`), pending OpenID Connect sign-ins (`hub_oidc_logins`) and the identities
//! linked to users (`hub_user_identities`). Secrets are kept as their SHA-256 in hex.

use server_kit::oidc::PendingLogin;
use sqlx::Row;

use super::HubStore;

/// A signed-in browser.
#[derive(Debug, Clone)]
pub struct WebSessionRow {
    pub user_id: String,
    pub csrf_token: String,
    pub last_seen_at_ms: i64,
    pub expires_at_ms: i64,
}

impl HubStore {
    pub async fn create_web_session(
        &self,
        secret_hash: &str,
        user_id: &str,
        csrf_token: &str,
        now: i64,
        expires_at_ms: i64,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query("DELETE FROM hub_web_sessions WHERE expires_at_ms <= $1")
            .bind(now)
            .execute(tx.conn())
            .await?;
        sqlx::query(
            "INSERT INTO hub_web_sessions (secret_hash, user_id, csrf_token, created_at_ms, \
             last_seen_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4, $4, $5)",
        )
        .bind(secret_hash)
        .bind(user_id)
        .bind(csrf_token)
        .bind(now)
        .bind(expires_at_ms)
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }

    pub async fn web_session(
        &self,
        secret_hash: &str,
    ) -> Result<Option<WebSessionRow>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT user_id, csrf_token, last_seen_at_ms, expires_at_ms FROM hub_web_sessions \
             WHERE secret_hash = $1",
        )
        .bind(secret_hash)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(WebSessionRow {
                user_id: r.try_get("user_id")?,
                csrf_token: r.try_get("csrf_token")?,
                last_seen_at_ms: r.try_get("last_seen_at_ms")?,
                expires_at_ms: r.try_get("expires_at_ms")?,
            })
        })
        .transpose()
    }

    pub async fn touch_web_session(&self, secret_hash: &str, now: i64) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query("UPDATE hub_web_sessions SET last_seen_at_ms = $1 WHERE secret_hash = $2")
            .bind(now)
            .bind(secret_hash)
            .execute(tx.conn())
            .await?;
        tx.commit().await
    }

    pub async fn delete_web_session(&self, secret_hash: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query("DELETE FROM hub_web_sessions WHERE secret_hash = $1")
            .bind(secret_hash)
            .execute(tx.conn())
            .await?;
        tx.commit().await
    }

    /// Ends every browser session of a user (suspension).
    pub async fn delete_web_sessions_of(&self, user_id: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query("DELETE FROM hub_web_sessions WHERE user_id = $1")
            .bind(user_id)
            .execute(tx.conn())
            .await?;
        tx.commit().await
    }

    pub async fn create_login_link(
        &self,
        secret_hash: &str,
        user_id: &str,
        now: i64,
        expires_at_ms: i64,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query("DELETE FROM hub_login_links WHERE expires_at_ms <= $1")
            .bind(now)
            .execute(tx.conn())
            .await?;
        sqlx::query(
            "INSERT INTO hub_login_links (secret_hash, user_id, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(secret_hash)
        .bind(user_id)
        .bind(now)
        .bind(expires_at_ms)
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }

    /// Uses a login link once: the user it signs in, if it exists and has not expired.
    pub async fn consume_login_link(
        &self,
        secret_hash: &str,
        now: i64,
    ) -> Result<Option<String>, sqlx::Error> {
        let mut tx = self.write().await?;
        let row = sqlx::query(
            "DELETE FROM hub_login_links WHERE secret_hash = $1 RETURNING user_id, expires_at_ms",
        )
        .bind(secret_hash)
        .fetch_optional(tx.conn())
        .await?;
        tx.commit().await?;
        row.map(|r| {
            let expires: i64 = r.try_get("expires_at_ms")?;
            (expires > now).then(|| r.try_get("user_id")).transpose()
        })
        .transpose()
        .map(Option::flatten)
    }

    pub async fn create_oidc_login(
        &self,
        key: &str,
        login: &PendingLogin,
        now: i64,
        expires_at_ms: i64,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query("DELETE FROM hub_oidc_logins WHERE expires_at_ms <= $1")
            .bind(now)
            .execute(tx.conn())
            .await?;
        sqlx::query(
            "INSERT INTO hub_oidc_logins (login_key, provider, nonce, pkce_verifier, \
             expires_at_ms) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(key)
        .bind(&login.provider)
        .bind(&login.nonce)
        .bind(&login.pkce_verifier)
        .bind(expires_at_ms)
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }

    /// Takes a pending sign-in (once), if it has not expired.
    pub async fn take_oidc_login(
        &self,
        key: &str,
        now: i64,
    ) -> Result<Option<PendingLogin>, sqlx::Error> {
        let mut tx = self.write().await?;
        let row = sqlx::query(
            "DELETE FROM hub_oidc_logins WHERE login_key = $1 \
             RETURNING provider, nonce, pkce_verifier, expires_at_ms",
        )
        .bind(key)
        .fetch_optional(tx.conn())
        .await?;
        tx.commit().await?;
        let Some(r) = row else { return Ok(None) };
        if r.try_get::<i64, _>("expires_at_ms")? <= now {
            return Ok(None);
        }
        Ok(Some(PendingLogin {
            provider: r.try_get("provider")?,
            nonce: r.try_get("nonce")?,
            pkce_verifier: r.try_get("pkce_verifier")?,
        }))
    }

    /// The user an identity of `provider` is linked to.
    pub async fn user_of_identity(
        &self,
        provider: &str,
        subject: &str,
    ) -> Result<Option<String>, sqlx::Error> {
        sqlx::query("SELECT user_id FROM hub_user_identities WHERE provider = $1 AND subject = $2")
            .bind(provider)
            .bind(subject)
            .fetch_optional(self.pool())
            .await?
            .map(|r| r.try_get("user_id"))
            .transpose()
    }

    pub async fn link_identity(
        &self,
        provider: &str,
        subject: &str,
        user_id: &str,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query(
            "INSERT INTO hub_user_identities (provider, subject, user_id, created_at_ms) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (provider, subject) DO NOTHING",
        )
        .bind(provider)
        .bind(subject)
        .bind(user_id)
        .bind(now)
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }
}
