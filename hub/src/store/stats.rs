//! Counts for the hub's `/metrics`: what the outbox holds and sessions by status.

use sqlx::Row;

use super::HubStore;
use super::sessions::SessionStatus;

impl HubStore {
    /// How many rows the outbox holds, and when the oldest was written.
    pub async fn pending_backlog(&self) -> Result<(i64, Option<i64>), sqlx::Error> {
        let row =
            sqlx::query("SELECT COUNT(*) AS n, MIN(created_at_ms) AS oldest FROM hub_pending")
                .fetch_one(self.pool())
                .await?;
        Ok((row.try_get("n")?, row.try_get("oldest")?))
    }

    /// Session records by status (every status, zero included).
    pub async fn session_counts(&self) -> Result<Vec<(SessionStatus, i64)>, sqlx::Error> {
        let rows = sqlx::query("SELECT status, COUNT(*) AS n FROM hub_sessions GROUP BY status")
            .fetch_all(self.pool())
            .await?;
        let mut counts: Vec<(SessionStatus, i64)> =
            SessionStatus::ALL.iter().map(|s| (*s, 0)).collect();
        for r in rows {
            let status: String = r.try_get("status")?;
            let n: i64 = r.try_get("n")?;
            if let Some(slot) = counts.iter_mut().find(|(s, _)| s.as_str() == status) {
                slot.1 = n;
            }
        }
        Ok(counts)
    }
}
