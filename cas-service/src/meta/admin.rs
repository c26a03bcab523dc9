//! Accounts, external identities, App members, admin sessions, login links, pending OIDC logins
//! and the admin audit log.

use cas_format::{AppId, SpaceId};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{MetaStore, id_col};

/// An administrator account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub id: String,
    pub display_name: String,
    pub email: Option<String>,
    pub platform_admin: bool,
    pub blocked: bool,
    pub created_at: i64,
}

/// The id of the account the bootstrap login link signs in.
pub const LOCAL_OPERATOR: &str = "local-operator";

const ACCOUNT_COLUMNS: &str =
    "a.account_id, a.display_name, a.email, a.platform_admin, a.blocked_at, a.created_at";

fn account_from_row(r: &AnyRow) -> Result<Account, sqlx::Error> {
    let admin: i64 = r.try_get("platform_admin")?;
    let blocked: Option<i64> = r.try_get("blocked_at")?;
    Ok(Account {
        id: r.try_get("account_id")?,
        display_name: r.try_get("display_name")?,
        email: r.try_get("email")?,
        platform_admin: admin != 0,
        blocked: blocked.is_some(),
        created_at: r.try_get("created_at")?,
    })
}

/// A live admin session.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    pub account: Account,
    pub csrf_token: String,
    pub last_seen_at: i64,
    pub created_at: i64,
    pub expires_at: i64,
}

/// A pending OIDC login.
pub use server_kit::oidc::PendingLogin as OidcLogin;

/// One entry of the admin audit log.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    pub id: String,
    pub at: i64,
    pub account_id: String,
    pub action: String,
    pub app_id: Option<String>,
    pub detail: serde_json::Value,
}

impl MetaStore {
    async fn account_where(
        &self,
        clause: &str,
        value: &str,
    ) -> Result<Option<Account>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ACCOUNT_COLUMNS} FROM accounts a WHERE {clause}"
        )))
        .bind(value)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(account_from_row)
        .transpose()
    }

    pub async fn account(&self, id: &str) -> Result<Option<Account>, sqlx::Error> {
        self.account_where("a.account_id = $1", id).await
    }

    pub async fn account_by_email(&self, email: &str) -> Result<Option<Account>, sqlx::Error> {
        self.account_where("LOWER(a.email) = LOWER($1)", email)
            .await
    }

    pub async fn account_by_identity(
        &self,
        provider: &str,
        subject: &str,
    ) -> Result<Option<Account>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ACCOUNT_COLUMNS} FROM accounts a JOIN external_identities i ON i.account_id = a.account_id \
             WHERE i.provider = $1 AND i.subject = $2"
        )))
        .bind(provider)
        .bind(subject)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(account_from_row)
        .transpose()
    }

    pub async fn count_accounts(&self) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT COUNT(*) AS n FROM accounts")
            .fetch_one(&self.pool)
            .await?
            .try_get("n")
    }

    /// Creates an account (or returns the one with this id).
    pub async fn create_account(
        &self,
        id: &str,
        display_name: &str,
        email: Option<&str>,
        platform_admin: bool,
        now: i64,
    ) -> Result<Account, sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query(
            "INSERT INTO accounts (account_id, display_name, email, platform_admin, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (account_id) DO NOTHING",
        )
        .bind(id)
        .bind(display_name)
        .bind(email)
        .bind(platform_admin as i64)
        .bind(now)
        .execute(&mut **w)
        .await?;
        w.commit().await?;
        self.account(id)
            .await?
            .ok_or_else(|| sqlx::Error::RowNotFound)
    }

    pub async fn link_identity(
        &self,
        provider: &str,
        subject: &str,
        account: &str,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query(
            "INSERT INTO external_identities (provider, subject, account_id, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (provider, subject) DO NOTHING",
        )
        .bind(provider)
        .bind(subject)
        .bind(account)
        .bind(now)
        .execute(&mut **w)
        .await?;
        w.commit().await
    }

    pub async fn set_account_blocked(
        &self,
        account: &str,
        blocked: bool,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let mut w = self.write().await?;
        let done = sqlx::query("UPDATE accounts SET blocked_at = $2 WHERE account_id = $1")
            .bind(account)
            .bind(if blocked { Some(now) } else { None })
            .execute(&mut **w)
            .await?;
        w.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    pub async fn members(&self, app: &AppId) -> Result<Vec<Account>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ACCOUNT_COLUMNS} FROM accounts a JOIN app_members m ON m.account_id = a.account_id \
             WHERE m.app_id = $1 ORDER BY a.display_name, a.account_id"
        )))
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(account_from_row)
        .collect()
    }

    /// The Apps an account is a member of.
    pub async fn apps_of(&self, account: &str) -> Result<Vec<AppId>, sqlx::Error> {
        sqlx::query("SELECT app_id FROM app_members WHERE account_id = $1 ORDER BY app_id")
            .bind(account)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| id_col(r, "app_id"))
            .collect()
    }

    pub async fn add_member(
        &self,
        app: &AppId,
        account: &str,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query(
            "INSERT INTO app_members (app_id, account_id, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (app_id, account_id) DO NOTHING",
        )
        .bind(app.as_str())
        .bind(account)
        .bind(now)
        .execute(&mut **w)
        .await?;
        w.commit().await
    }

    pub async fn remove_member(&self, app: &AppId, account: &str) -> Result<bool, sqlx::Error> {
        let mut w = self.write().await?;
        let done = sqlx::query("DELETE FROM app_members WHERE app_id = $1 AND account_id = $2")
            .bind(app.as_str())
            .bind(account)
            .execute(&mut **w)
            .await?;
        w.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    pub async fn create_session(
        &self,
        hash: &[u8],
        account: &str,
        csrf: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query(
            "INSERT INTO admin_sessions (session_hash, account_id, csrf_token, created_at, last_seen_at, expires_at) \
             VALUES ($1, $2, $3, $4, $4, $5)",
        )
        .bind(hash.to_vec())
        .bind(account)
        .bind(csrf)
        .bind(now)
        .bind(expires_at)
        .execute(&mut **w)
        .await?;
        w.commit().await
    }

    pub async fn session(&self, hash: &[u8]) -> Result<Option<SessionRecord>, sqlx::Error> {
        let Some(r) = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ACCOUNT_COLUMNS}, s.csrf_token, s.last_seen_at, s.created_at AS session_created_at, s.expires_at \
             FROM admin_sessions s JOIN accounts a ON a.account_id = s.account_id WHERE s.session_hash = $1"
        )))
        .bind(hash.to_vec())
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        Ok(Some(SessionRecord {
            account: account_from_row(&r)?,
            csrf_token: r.try_get("csrf_token")?,
            last_seen_at: r.try_get("last_seen_at")?,
            created_at: r.try_get("session_created_at")?,
            expires_at: r.try_get("expires_at")?,
        }))
    }

    pub async fn touch_session(&self, hash: &[u8], now: i64) -> Result<(), sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query("UPDATE admin_sessions SET last_seen_at = $2 WHERE session_hash = $1")
            .bind(hash.to_vec())
            .bind(now)
            .execute(&mut **w)
            .await?;
        w.commit().await
    }

    /// Deletes a session, and every session past `expired_before`.
    pub async fn delete_session(
        &self,
        hash: &[u8],
        expired_before: i64,
    ) -> Result<(), sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query("DELETE FROM admin_sessions WHERE session_hash = $1 OR expires_at < $2")
            .bind(hash.to_vec())
            .bind(expired_before)
            .execute(&mut **w)
            .await?;
        w.commit().await
    }

    pub async fn create_login_link(
        &self,
        hash: &[u8],
        account: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query("INSERT INTO login_links (link_hash, account_id, created_at, expires_at) VALUES ($1, $2, $3, $4)")
            .bind(hash.to_vec())
            .bind(account)
            .bind(now)
            .bind(expires_at)
            .execute(&mut **w)
            .await?;
        w.commit().await
    }

    /// Uses a login link once; returns its account if it was unused and unexpired.
    pub async fn consume_login_link(
        &self,
        hash: &[u8],
        now: i64,
    ) -> Result<Option<String>, sqlx::Error> {
        let mut w = self.write().await?;
        let row = sqlx::query(
            "UPDATE login_links SET used_at = $2 WHERE link_hash = $1 AND used_at IS NULL AND expires_at > $2 \
             RETURNING account_id",
        )
        .bind(hash.to_vec())
        .bind(now)
        .fetch_optional(&mut **w)
        .await?;
        w.commit().await?;
        row.map(|r| r.try_get("account_id")).transpose()
    }

    pub async fn create_oidc_login(
        &self,
        state: &str,
        login: &OidcLogin,
        now: i64,
        expires_at: i64,
    ) -> Result<(), sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query(
            "INSERT INTO oidc_logins (state, provider, nonce, pkce_verifier, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(state)
        .bind(&login.provider)
        .bind(&login.nonce)
        .bind(&login.pkce_verifier)
        .bind(now)
        .bind(expires_at)
        .execute(&mut **w)
        .await?;
        sqlx::query("DELETE FROM oidc_logins WHERE expires_at < $1")
            .bind(now)
            .execute(&mut **w)
            .await?;
        w.commit().await
    }

    /// Takes a pending OIDC login (once), if it has not expired.
    pub async fn take_oidc_login(
        &self,
        state: &str,
        now: i64,
    ) -> Result<Option<OidcLogin>, sqlx::Error> {
        let mut w = self.write().await?;
        let row = sqlx::query("DELETE FROM oidc_logins WHERE state = $1 RETURNING provider, nonce, pkce_verifier, expires_at")
            .bind(state)
            .fetch_optional(&mut **w)
            .await?;
        w.commit().await?;
        let Some(r) = row else { return Ok(None) };
        let expires_at: i64 = r.try_get("expires_at")?;
        if expires_at <= now {
            return Ok(None);
        }
        Ok(Some(OidcLogin {
            provider: r.try_get("provider")?,
            nonce: r.try_get("nonce")?,
            pkce_verifier: r.try_get("pkce_verifier")?,
        }))
    }

    pub async fn audit(
        &self,
        account: &str,
        action: &str,
        app: Option<&AppId>,
        detail: &serde_json::Value,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let mut w = self.write().await?;
        sqlx::query("INSERT INTO admin_audit (audit_id, at, account_id, action, app_id, detail) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(ulid::Ulid::generate().to_string())
            .bind(now)
            .bind(account)
            .bind(action)
            .bind(app.map(|a| a.as_str().to_string()))
            .bind(detail.to_string())
            .execute(&mut **w)
            .await?;
        w.commit().await
    }

    /// Audit entries of an App, newest first, before `before` (an entry id).
    pub async fn audit_page(
        &self,
        app: &AppId,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditEntry>, sqlx::Error> {
        sqlx::query(
            "SELECT audit_id, at, account_id, action, app_id, detail FROM admin_audit \
             WHERE app_id = $1 AND audit_id < $2 ORDER BY audit_id DESC LIMIT $3",
        )
        .bind(app.as_str())
        .bind(before.unwrap_or("~"))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            let detail: String = r.try_get("detail")?;
            Ok(AuditEntry {
                id: r.try_get("audit_id")?,
                at: r.try_get("at")?,
                account_id: r.try_get("account_id")?,
                action: r.try_get("action")?,
                app_id: r.try_get("app_id")?,
                detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
            })
        })
        .collect()
    }

    /// Spaces of an App that hold root-ref balances now.
    pub async fn spaces_in_balances(&self, app: &AppId) -> Result<Vec<SpaceId>, sqlx::Error> {
        sqlx::query(
            "SELECT DISTINCT space_id FROM root_ref_balances WHERE app_id = $1 ORDER BY space_id",
        )
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| id_col(r, "space_id"))
        .collect()
    }
}
