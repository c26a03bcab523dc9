//! The hub's Prometheus metrics, served at `/metrics` (see `UNICAS_HUB_METRICS_LISTEN`; names
//! prefixed `unicas_hub_`): requests by route and status with their latency, the outbox's
//! backlog (root-ref deltas written down but not yet confirmed by the CAS), session records by
//! status, the sandboxes this process runs, and app pools (admissions by outcome, visit slots in
//! use, compare-and-swap conflicts and exhausted retries). The counts are taken when scraped.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use server_kit::http_metrics::RequestMetrics;

use crate::Hub;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

pub struct HubMetrics {
    registry: Registry,
    pub requests: RequestMetrics,
    outbox_pending: Gauge,
    outbox_oldest: Gauge,
    sessions: Family<StatusLabel, Gauge>,
    sandboxes: Gauge,
    pool_conflicts: Counter,
    pool_exhausted: Counter,
    pool_admissions: Family<OutcomeLabel, Counter>,
    pool_visits: Gauge,
}

impl std::fmt::Debug for HubMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HubMetrics")
    }
}

impl Default for HubMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("unicas_hub");
        let m = HubMetrics {
            registry: Registry::default(),
            requests: RequestMetrics::registered(&mut registry),
            outbox_pending: Gauge::default(),
            outbox_oldest: Gauge::default(),
            sessions: Family::default(),
            sandboxes: Gauge::default(),
            pool_conflicts: Counter::default(),
            pool_exhausted: Counter::default(),
            pool_admissions: Family::default(),
            pool_visits: Gauge::default(),
        };
        registry.register(
            "app_pool_cas_conflicts",
            "App pool changes that found the pool moved and were retried",
            m.pool_conflicts.clone(),
        );
        registry.register(
            "app_pool_cas_exhausted",
            "App pool changes that gave up after every retry",
            m.pool_exhausted.clone(),
        );
        registry.register(
            "app_pool_admission",
            "App visits admitted (reused, assigned, started) or refused (full)",
            m.pool_admissions.clone(),
        );
        registry.register(
            "app_pool_visits",
            "Visit slots in use over every app pool",
            m.pool_visits.clone(),
        );
        registry.register(
            "outbox_pending",
            "Root-ref deltas written down and not yet confirmed by the CAS",
            m.outbox_pending.clone(),
        );
        registry.register(
            "outbox_oldest_seconds",
            "Age of the oldest of them",
            m.outbox_oldest.clone(),
        );
        registry.register("sessions", "Session records by status", m.sessions.clone());
        registry.register(
            "sandboxes",
            "Sandboxes this process runs",
            m.sandboxes.clone(),
        );
        HubMetrics { registry, ..m }
    }
}

impl HubMetrics {
    pub fn pool_conflict(&self) {
        self.pool_conflicts.inc();
    }

    pub fn pool_exhausted(&self) {
        self.pool_exhausted.inc();
    }

    /// An admission's outcome: `reused`, `assigned`, `started` or `full`.
    pub fn pool_admission(&self, outcome: &'static str) {
        self.pool_admissions
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }
}

impl Hub {
    /// The text exposition of the hub's metrics, with the counts taken now.
    pub async fn render_metrics(&self) -> String {
        let m = &self.metrics;
        let now = crate::ids::now_ms();
        match self.store.pending_backlog().await {
            Ok((n, oldest)) => {
                m.outbox_pending.set(n);
                m.outbox_oldest
                    .set(oldest.map_or(0, |t| (now - t).max(0) / 1000));
            }
            Err(e) => tracing::warn!(error = %e, "counting the outbox for /metrics failed"),
        }
        match self.store.session_counts().await {
            Ok(counts) => {
                for (status, n) in counts {
                    m.sessions
                        .get_or_create(&StatusLabel {
                            status: status.as_str(),
                        })
                        .set(n);
                }
            }
            Err(e) => tracing::warn!(error = %e, "counting sessions for /metrics failed"),
        }
        m.sandboxes.set(self.sessions.all().len() as i64);
        match self.store.visits_held(now).await {
            Ok(n) => {
                m.pool_visits.set(n);
            }
            Err(e) => tracing::warn!(error = %e, "counting app visits for /metrics failed"),
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &m.registry);
        out
    }
}
