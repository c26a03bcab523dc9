//! The maintenance pass: what the hub keeps only for a while. Each pass releases catalog
//! snapshots past their retention (one negative delta), purges projects whose time in the trash
//! is over, and deletes events and idempotency records past theirs. Terminal session records
//! are reaped by the session sweep (`UNICAS_HUB_SESSION_RETENTION_MS`).

use std::time::Duration;

use anyhow::bail;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::Hub;
use crate::config::env;
use crate::error::HubResult;
use crate::ids;

/// Rows one pass deletes at most per kind (the next pass goes on).
const DELETE_BATCH: i64 = 10_000;

pub const HOUR_MS: u64 = 3_600_000;
pub const DAY_MS: u64 = 24 * HOUR_MS;

/// How long things are kept (`0`: for ever) and how often the pass runs (`0`: never).
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// `UNICAS_HUB_CATALOG_RETENTION`, default `90d`: catalog snapshots other than the current
    /// and the previous one.
    pub catalog_ms: u64,
    /// `UNICAS_HUB_EVENT_RETENTION`, default `365d`: audit events.
    pub events_ms: u64,
    /// `UNICAS_HUB_IDEMPOTENCY_RETENTION`, default `24h`: recorded answers of idempotent
    /// creates (a key older than this creates again).
    pub idempotency_ms: u64,
    /// `UNICAS_HUB_PROJECT_TRASH_RETENTION`, default `30d`: how long a deleted project stays
    /// restorable before it is purged.
    pub project_trash_ms: u64,
    /// `UNICAS_HUB_MAINTENANCE_INTERVAL`, default `1h`.
    pub interval_ms: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            catalog_ms: 90 * DAY_MS,
            events_ms: 365 * DAY_MS,
            idempotency_ms: 24 * HOUR_MS,
            project_trash_ms: 30 * DAY_MS,
            interval_ms: HOUR_MS,
        }
    }
}

/// A duration as `<n>` followed by `ms`, `s`, `m`, `h` or `d` (`0` alone is zero).
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(0);
    }
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?} has no unit (ms, s, m, h or d)"))?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} does not start with a number"))?;
    let per = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => HOUR_MS,
        "d" => DAY_MS,
        _ => return Err(format!("{s:?}: the unit is one of ms, s, m, h, d")),
    };
    n.checked_mul(per)
        .filter(|v| *v <= i64::MAX as u64)
        .ok_or_else(|| format!("{s:?} is too long"))
}

impl RetentionConfig {
    pub fn from_env() -> anyhow::Result<Self> {
        let mut c = RetentionConfig::default();
        for (name, slot) in [
            ("UNICAS_HUB_CATALOG_RETENTION", &mut c.catalog_ms),
            ("UNICAS_HUB_EVENT_RETENTION", &mut c.events_ms),
            ("UNICAS_HUB_IDEMPOTENCY_RETENTION", &mut c.idempotency_ms),
            (
                "UNICAS_HUB_PROJECT_TRASH_RETENTION",
                &mut c.project_trash_ms,
            ),
            ("UNICAS_HUB_MAINTENANCE_INTERVAL", &mut c.interval_ms),
        ] {
            if let Some(v) = env(name) {
                *slot = match parse_duration_ms(&v) {
                    Ok(ms) => ms,
                    Err(e) => bail!("{name}: {e}"),
                };
            }
        }
        Ok(c)
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PassReport {
    pub snapshots_released: usize,
    pub projects_purged: usize,
    pub events_deleted: u64,
    pub idempotency_deleted: u64,
}

fn cutoff(keep_ms: u64) -> Option<i64> {
    (keep_ms > 0).then(|| ids::now_ms().saturating_sub(i64::try_from(keep_ms).unwrap_or(i64::MAX)))
}

impl Hub {
    /// One maintenance pass. A step that fails is logged and the others still run; the first
    /// failure is returned.
    pub async fn maintenance_pass(&self) -> HubResult<PassReport> {
        let mut report = PassReport::default();
        let mut first_error = None;
        let mut note = |what: &str, e: crate::error::HubError| {
            tracing::warn!(error = %e, "maintenance: {what} failed; the next pass retries");
            first_error.get_or_insert(e);
        };
        match self.release_old_snapshots().await {
            Ok(n) => report.snapshots_released = n,
            Err(e) => note("releasing catalog snapshots", e),
        }
        match self.purge_expired_projects().await {
            Ok(n) => report.projects_purged = n,
            Err(e) => note("purging projects", e),
        }
        let r = &self.config.retention;
        if let Some(before) = cutoff(r.events_ms) {
            match self.store.expire_events(before, DELETE_BATCH).await {
                Ok(n) => report.events_deleted = n,
                Err(e) => note("deleting events", e.into()),
            }
        }
        if let Some(before) = cutoff(r.idempotency_ms) {
            match self.store.expire_idempotency(before, DELETE_BATCH).await {
                Ok(n) => report.idempotency_deleted = n,
                Err(e) => note("deleting idempotency records", e.into()),
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Runs the maintenance pass every `UNICAS_HUB_MAINTENANCE_INTERVAL` until `stop`.
    pub async fn background_maintenance(&self, stop: CancellationToken) {
        let every = self.config.retention.interval_ms;
        if every == 0 {
            return;
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(every.max(1000))) => {}
            }
            match self.maintenance_pass().await {
                Ok(r) => tracing::debug!(report = ?r, "maintenance pass"),
                Err(e) => tracing::warn!(error = %e, "maintenance pass incomplete"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration_ms;

    #[test]
    fn durations_need_a_unit_and_fit() {
        assert_eq!(parse_duration_ms("0"), Ok(0));
        assert_eq!(parse_duration_ms("90d"), Ok(90 * 86_400_000));
        assert_eq!(parse_duration_ms("24h"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("2s"), Ok(2000));
        assert_eq!(parse_duration_ms("15m"), Ok(900_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert!(parse_duration_ms("90").is_err());
        assert!(parse_duration_ms("d").is_err());
        assert!(parse_duration_ms("3w").is_err());
        assert!(parse_duration_ms("-1d").is_err());
        assert!(parse_duration_ms("999999999999999999d").is_err());
    }
}
