//! The App registry: Apps with their issuer and status, and their issuer keys by `kid`.

use cas_format::AppId;
use sqlx::Row;

use super::{MetaStore, id_col};

/// An App as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppRecord {
    pub app_id: AppId,
    pub issuer: String,
    pub suspended: bool,
    pub revision: i64,
    pub created_at: i64,
}

/// An issuer key of an App.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub app_id: AppId,
    pub kid: String,
    pub alg: String,
    pub public_key_pem: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// Why a registry change was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("App {0} already exists")]
    AppExists(AppId),
    #[error("issuer {0:?} already belongs to another App")]
    IssuerTaken(String),
    #[error("App {0} does not exist")]
    NoSuchApp(AppId),
    #[error("key {kid:?} already exists for App {app}")]
    KeyExists { app: AppId, kid: String },
    #[error("App {app} has no active key {kid:?}")]
    NoSuchKey { app: AppId, kid: String },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

fn app_from_row(row: &sqlx::any::AnyRow) -> Result<AppRecord, sqlx::Error> {
    let suspended: Option<i64> = row.try_get("suspended_at")?;
    Ok(AppRecord {
        app_id: id_col(row, "app_id")?,
        issuer: row.try_get("issuer")?,
        suspended: suspended.is_some(),
        revision: row.try_get("revision")?,
        created_at: row.try_get("created_at")?,
    })
}

fn key_from_row(row: &sqlx::any::AnyRow) -> Result<KeyRecord, sqlx::Error> {
    Ok(KeyRecord {
        app_id: id_col(row, "app_id")?,
        kid: row.try_get("kid")?,
        alg: row.try_get("alg")?,
        public_key_pem: row.try_get("public_key_pem")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

impl MetaStore {
    pub async fn list_apps(&self) -> Result<Vec<AppRecord>, sqlx::Error> {
        sqlx::query(
            "SELECT app_id, issuer, suspended_at, revision, created_at FROM apps ORDER BY app_id",
        )
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(app_from_row)
        .collect()
    }

    pub async fn get_app(&self, app: &AppId) -> Result<Option<AppRecord>, sqlx::Error> {
        sqlx::query(
            "SELECT app_id, issuer, suspended_at, revision, created_at FROM apps WHERE app_id = $1",
        )
        .bind(app.as_str())
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(app_from_row)
        .transpose()
    }

    /// Keys of every App, active and revoked.
    pub async fn list_keys(&self, app: Option<&AppId>) -> Result<Vec<KeyRecord>, sqlx::Error> {
        let rows =
            match app {
                Some(app) => sqlx::query(
                    "SELECT app_id, kid, alg, public_key_pem, created_at, revoked_at FROM app_keys \
                     WHERE app_id = $1 ORDER BY created_at, kid",
                )
                .bind(app.as_str())
                .fetch_all(&self.pool)
                .await?,
                None => sqlx::query(
                    "SELECT app_id, kid, alg, public_key_pem, created_at, revoked_at FROM app_keys \
                     ORDER BY app_id, created_at, kid",
                )
                .fetch_all(&self.pool)
                .await?,
            };
        rows.iter().map(key_from_row).collect()
    }

    pub async fn create_app(
        &self,
        app: &AppId,
        issuer: &str,
        now: i64,
    ) -> Result<AppRecord, RegistryError> {
        let mut w = self.write().await?;
        if sqlx::query("SELECT 1 AS x FROM apps WHERE app_id = $1")
            .bind(app.as_str())
            .fetch_optional(&mut **w)
            .await?
            .is_some()
        {
            return Err(RegistryError::AppExists(app.clone()));
        }
        if sqlx::query("SELECT 1 AS x FROM apps WHERE issuer = $1")
            .bind(issuer)
            .fetch_optional(&mut **w)
            .await?
            .is_some()
        {
            return Err(RegistryError::IssuerTaken(issuer.to_string()));
        }
        sqlx::query(
            "INSERT INTO apps (app_id, issuer, revision, created_at) VALUES ($1, $2, 0, $3)",
        )
        .bind(app.as_str())
        .bind(issuer)
        .bind(now)
        .execute(&mut **w)
        .await?;
        w.commit().await?;
        Ok(AppRecord {
            app_id: app.clone(),
            issuer: issuer.to_string(),
            suspended: false,
            revision: 0,
            created_at: now,
        })
    }

    /// Registers a key; the PEM and algorithm must have been checked by the caller.
    pub async fn add_key(
        &self,
        app: &AppId,
        kid: &str,
        alg: &str,
        pem: &str,
        now: i64,
    ) -> Result<(), RegistryError> {
        let mut w = self.write().await?;
        if sqlx::query("SELECT 1 AS x FROM apps WHERE app_id = $1")
            .bind(app.as_str())
            .fetch_optional(&mut **w)
            .await?
            .is_none()
        {
            return Err(RegistryError::NoSuchApp(app.clone()));
        }
        if sqlx::query("SELECT 1 AS x FROM app_keys WHERE app_id = $1 AND kid = $2")
            .bind(app.as_str())
            .bind(kid)
            .fetch_optional(&mut **w)
            .await?
            .is_some()
        {
            return Err(RegistryError::KeyExists {
                app: app.clone(),
                kid: kid.to_string(),
            });
        }
        sqlx::query(
            "INSERT INTO app_keys (app_id, kid, alg, public_key_pem, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(app.as_str())
        .bind(kid)
        .bind(alg)
        .bind(pem)
        .bind(now)
        .execute(&mut **w)
        .await?;
        w.commit().await?;
        Ok(())
    }

    pub async fn revoke_key(&self, app: &AppId, kid: &str, now: i64) -> Result<(), RegistryError> {
        let mut w = self.write().await?;
        let done = sqlx::query(
            "UPDATE app_keys SET revoked_at = $3 WHERE app_id = $1 AND kid = $2 AND revoked_at IS NULL",
        )
        .bind(app.as_str())
        .bind(kid)
        .bind(now)
        .execute(&mut **w)
        .await?;
        if done.rows_affected() == 0 {
            return Err(RegistryError::NoSuchKey {
                app: app.clone(),
                kid: kid.to_string(),
            });
        }
        w.commit().await?;
        Ok(())
    }

    /// Suspends (`true`) or resumes (`false`) an App; returns whether anything changed.
    pub async fn set_suspended(
        &self,
        app: &AppId,
        suspended: bool,
        now: i64,
    ) -> Result<bool, RegistryError> {
        let mut w = self.write().await?;
        let Some(row) = sqlx::query("SELECT suspended_at FROM apps WHERE app_id = $1")
            .bind(app.as_str())
            .fetch_optional(&mut **w)
            .await?
        else {
            return Err(RegistryError::NoSuchApp(app.clone()));
        };
        let was: Option<i64> = row.try_get("suspended_at")?;
        if was.is_some() == suspended {
            return Ok(false);
        }
        sqlx::query("UPDATE apps SET suspended_at = $2 WHERE app_id = $1")
            .bind(app.as_str())
            .bind(if suspended { Some(now) } else { None })
            .execute(&mut **w)
            .await?;
        w.commit().await?;
        Ok(true)
    }

    /// Every partition that has a usage row (the background collector's work list).
    pub async fn partitions(&self) -> Result<Vec<(AppId, cas_format::SpaceId)>, sqlx::Error> {
        sqlx::query("SELECT app_id, space_id FROM space_usage ORDER BY app_id, space_id")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((id_col(r, "app_id")?, id_col(r, "space_id")?)))
            .collect()
    }
}
