//! Prometheus metrics: requests by route and status, lease outcomes, GC work, upload
//! rejections. Exposed at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    leases: Family<StateLabel, Counter>,
    gc_deleted: Counter,
    gc_reclaimed: Counter,
    rejections: Family<CodeLabel, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("unicas");
        let requests = Family::<RequestLabels, Counter>::default();
        let leases = Family::<StateLabel, Counter>::default();
        let gc_deleted = Counter::default();
        let gc_reclaimed = Counter::default();
        let rejections = Family::<CodeLabel, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        registry.register("lease_outcomes", "Lease answers by state", leases.clone());
        registry.register(
            "gc_deleted_nodes",
            "Nodes deleted by GC",
            gc_deleted.clone(),
        );
        registry.register(
            "gc_reclaimed_content_bytes",
            "Content bytes reclaimed by GC",
            gc_reclaimed.clone(),
        );
        registry.register(
            "upload_rejections",
            "Uploads refused on validation, by code",
            rejections.clone(),
        );
        Metrics {
            registry,
            requests,
            leases,
            gc_deleted,
            gc_reclaimed,
            rejections,
        }
    }
}

impl Metrics {
    pub fn request(&self, method: &str, route: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                method: method.to_string(),
                route: route.to_string(),
                status,
            })
            .inc();
    }

    pub fn lease_outcome(&self, state: &str) {
        self.leases
            .get_or_create(&StateLabel {
                state: state.to_string(),
            })
            .inc();
    }

    pub fn gc_done(&self, deleted: u64, reclaimed: u64) {
        self.gc_deleted.inc_by(deleted);
        self.gc_reclaimed.inc_by(reclaimed);
    }

    pub fn upload_rejected(&self, code: &str) {
        self.rejections
            .get_or_create(&CodeLabel {
                code: code.to_string(),
            })
            .inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
