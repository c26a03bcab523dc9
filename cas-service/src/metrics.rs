//! Prometheus metrics: requests by route and status, lease outcomes, GC work, upload
//! rejections, and the batch commits of the metadata store (operations per commit, commit
//! latency, failed commits). Exposed at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use server_kit::group_commit::{CommitObserver, CommitStats};

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
    commit_operations: Histogram,
    commit_seconds: Histogram,
    commit_failures: Counter,
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
        let commit_operations = Histogram::new(exponential_buckets(1.0, 2.0, 9));
        let commit_seconds = Histogram::new(exponential_buckets(0.000_25, 2.0, 14));
        let commit_failures = Counter::default();
        registry.register(
            "commit_batch_operations",
            "Partition operations committed together in one durable commit",
            commit_operations.clone(),
        );
        registry.register(
            "commit_duration_seconds",
            "Time a batch's durable commit took",
            commit_seconds.clone(),
        );
        registry.register(
            "commit_failures",
            "Batch commits that failed (every operation in them answered an error)",
            commit_failures.clone(),
        );
        Metrics {
            registry,
            requests,
            leases,
            gc_deleted,
            gc_reclaimed,
            rejections,
            commit_operations,
            commit_seconds,
            commit_failures,
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

    /// What the metadata store tells of each batch commit.
    pub fn commit_observer(&self) -> CommitObserver {
        let (operations, seconds, failures) = (
            self.commit_operations.clone(),
            self.commit_seconds.clone(),
            self.commit_failures.clone(),
        );
        std::sync::Arc::new(move |s: CommitStats| {
            operations.observe(s.operations as f64);
            seconds.observe(s.duration.as_secs_f64());
            if !s.ok {
                failures.inc();
            }
        })
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
