//! The hub's Prometheus metrics, served at `/metrics` (see `UNICAS_HUB_METRICS_LISTEN`; names
//! prefixed `unicas_hub_`): requests by route and status with their latency, the outbox's
//! backlog (root-ref deltas written down but not yet confirmed by the CAS), session records by
//! status and the sandboxes this process runs. The counts are taken when scraped.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use server_kit::http_metrics::RequestMetrics;

use crate::Hub;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

pub struct HubMetrics {
    registry: Registry,
    pub requests: RequestMetrics,
    outbox_pending: Gauge,
    outbox_oldest: Gauge,
    sessions: Family<StatusLabel, Gauge>,
    sandboxes: Gauge,
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
        };
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
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &m.registry);
        out
    }
}
