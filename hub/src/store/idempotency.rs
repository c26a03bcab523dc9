//! Idempotent creates (`hub_idempotency`): what a `POST` with an `Idempotency-Key` answered,
//! keyed by the digest of user, route and key.

use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::{HubStore, WriteTx};

/// One recorded create.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdempotencyRow {
    /// SHA-256 of `user \n route \n key`.
    pub digest: String,
    pub user_id: String,
    /// The method and path it was sent to.
    pub route: String,
    /// SHA-256 of the request body.
    pub request_digest: String,
    /// What the create made (a project or notebook id).
    pub resource_id: String,
    pub status: u16,
    /// The JSON of the answer's `data`; `None` while only the first step of a two-step create
    /// is committed.
    pub answer: Option<String>,
    pub created_at_ms: i64,
}

impl IdempotencyRow {
    /// Writes it; `false` if the digest is recorded already.
    pub async fn insert(&self, tx: &mut WriteTx) -> Result<bool, sqlx::Error> {
        let n = sqlx::query(
            "INSERT INTO hub_idempotency (digest, user_id, route, request_digest, resource_id, \
             status, answer, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (digest) DO NOTHING",
        )
        .bind(&self.digest)
        .bind(&self.user_id)
        .bind(&self.route)
        .bind(&self.request_digest)
        .bind(&self.resource_id)
        .bind(i64::from(self.status))
        .bind(&self.answer)
        .bind(self.created_at_ms)
        .execute(tx.conn())
        .await?
        .rows_affected();
        Ok(n == 1)
    }
}

impl HubStore {
    /// The record of `digest`, however old.
    pub async fn idempotency(&self, digest: &str) -> Result<Option<IdempotencyRow>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT digest, user_id, route, request_digest, resource_id, status, answer, \
             created_at_ms FROM hub_idempotency WHERE digest = $1",
        )
        .bind(digest)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            let status: i64 = r.try_get("status")?;
            Ok(IdempotencyRow {
                digest: r.try_get("digest")?,
                user_id: r.try_get("user_id")?,
                route: r.try_get("route")?,
                request_digest: r.try_get("request_digest")?,
                resource_id: r.try_get("resource_id")?,
                status: u16::try_from(status).map_err(|_| super::decode_err("status", status))?,
                answer: r.try_get("answer")?,
                created_at_ms: r.try_get("created_at_ms")?,
            })
        })
        .transpose()
    }

    /// Records the answer of a create whose first step was recorded without one.
    pub async fn set_idempotent_answer(
        &self,
        digest: &str,
        answer: &str,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query("UPDATE hub_idempotency SET answer = $1 WHERE digest = $2 AND answer IS NULL")
            .bind(answer)
            .bind(digest)
            .execute(tx.conn())
            .await?;
        tx.commit().await
    }

    /// Forgets the record of `digest` (an expired one, before the key is used again).
    pub async fn forget_idempotency(&self, digest: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query("DELETE FROM hub_idempotency WHERE digest = $1")
            .bind(digest)
            .execute(tx.conn())
            .await?;
        tx.commit().await
    }

    /// Forgets records made before `before_ms`, at most `limit` of them; how many.
    pub async fn expire_idempotency(&self, before_ms: i64, limit: i64) -> Result<u64, sqlx::Error> {
        let mut tx = self.write().await?;
        let n = sqlx::query(
            "DELETE FROM hub_idempotency WHERE digest IN \
             (SELECT digest FROM hub_idempotency WHERE created_at_ms < $1 LIMIT $2)",
        )
        .bind(before_ms)
        .bind(limit)
        .execute(tx.conn())
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n)
    }
}
