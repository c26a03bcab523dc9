//! Prometheus metrics, exposed at `/metrics` (names prefixed `unicas_`):
//!
//! - requests: `http_requests_total` and `http_request_duration_seconds` by method, route and
//!   status;
//! - writes: `commit_batch_operations` and `commit_duration_seconds` (the metadata store's
//!   batch commits), `commit_failures_total`, `gate_wait_seconds` (an operation waiting for
//!   its partition), `gate_hold_seconds` (an operation holding it, its commit not included),
//!   `database_begin_wait_seconds` (a batch waiting for its transaction);
//! - the object store: `object_store_requests_total` by operation and outcome,
//!   `object_store_duration_seconds` by operation;
//! - what is outstanding (counted at most every [`BACKLOG_EVERY`]): `leases_outstanding`,
//!   `upload_slots_outstanding`, `gc_backlog_nodes`, `gc_lag_seconds`;
//! - `lease_outcomes_total`, `gc_deleted_nodes_total`, `gc_reclaimed_content_bytes_total`,
//!   `upload_rejections_total`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use server_kit::group_commit::{CommitEvent, CommitObserver};
use server_kit::http_metrics::{RequestMetrics, latency};

use crate::meta::{Backlog, RootRefCheck};

/// How often the outstanding counts are recounted at most (they scan the store).
pub const BACKLOG_EVERY: Duration = Duration::from_secs(15);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabel {
    check: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub requests: RequestMetrics,
    leases: Family<StateLabel, Counter>,
    gc_deleted: Counter,
    gc_reclaimed: Counter,
    rejections: Family<CodeLabel, Counter>,
    commit_operations: Histogram,
    commit_seconds: Histogram,
    commit_failures: Counter,
    root_ref_checks: Family<CheckLabel, Counter>,
    gate_wait: Histogram,
    gate_hold: Histogram,
    begin_wait: Histogram,
    store_requests: Family<StoreLabels, Counter>,
    store_seconds: Family<OperationLabel, Histogram>,
    leases_outstanding: Gauge,
    upload_slots: Gauge,
    gc_backlog: Gauge,
    gc_lag: Gauge,
    /// When the outstanding counts were last taken.
    counted: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("unicas");
        let m = Metrics {
            requests: RequestMetrics::registered(&mut registry),
            leases: Family::default(),
            gc_deleted: Counter::default(),
            gc_reclaimed: Counter::default(),
            rejections: Family::default(),
            commit_operations: Histogram::new(exponential_buckets(1.0, 2.0, 9)),
            commit_seconds: latency(),
            commit_failures: Counter::default(),
            root_ref_checks: Family::default(),
            gate_wait: latency(),
            gate_hold: latency(),
            begin_wait: latency(),
            store_requests: Family::default(),
            store_seconds: Family::new_with_constructor(latency),
            leases_outstanding: Gauge::default(),
            upload_slots: Gauge::default(),
            gc_backlog: Gauge::default(),
            gc_lag: Gauge::default(),
            counted: Mutex::new(None),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register("lease_outcomes", "Lease answers by state", m.leases.clone());
        r.register(
            "gc_deleted_nodes",
            "Nodes deleted by GC",
            m.gc_deleted.clone(),
        );
        r.register(
            "gc_reclaimed_content_bytes",
            "Content bytes reclaimed by GC",
            m.gc_reclaimed.clone(),
        );
        r.register(
            "upload_rejections",
            "Uploads refused on validation, by code",
            m.rejections.clone(),
        );
        r.register(
            "commit_batch_operations",
            "Partition operations committed together in one durable commit",
            m.commit_operations.clone(),
        );
        r.register(
            "commit_duration_seconds",
            "Time a batch's durable commit took",
            m.commit_seconds.clone(),
        );
        r.register(
            "commit_failures",
            "Batch commits that failed (every operation in them answered an error)",
            m.commit_failures.clone(),
        );
        r.register(
            "root_ref_batches",
            "Root-ref batches on Postgres by how they were checked: against the partition's \
             state held in memory (held), by reading it (read), or held state found stale by the \
             write and read again (stale)",
            m.root_ref_checks.clone(),
        );
        r.register(
            "gate_wait_seconds",
            "Time an operation waited for its partition",
            m.gate_wait.clone(),
        );
        r.register(
            "gate_hold_seconds",
            "Time an operation held its partition, from its turn until it was queued for its \
             batch's commit (the commit not included)",
            m.gate_hold.clone(),
        );
        r.register(
            "database_begin_wait_seconds",
            "Time a new batch waited for its transaction (a connection, and its lock)",
            m.begin_wait.clone(),
        );
        r.register(
            "object_store_requests",
            "Object-store requests by operation and outcome",
            m.store_requests.clone(),
        );
        r.register(
            "object_store_duration_seconds",
            "Object-store request latency by operation",
            m.store_seconds.clone(),
        );
        r.register(
            "leases_outstanding",
            "Nodes whose lease has not run out",
            m.leases_outstanding.clone(),
        );
        r.register(
            "upload_slots_outstanding",
            "Upload generations awaiting an upload or their children",
            m.upload_slots.clone(),
        );
        r.register(
            "gc_backlog_nodes",
            "Unreferenced nodes whose lease has run out: what GC has yet to take",
            m.gc_backlog.clone(),
        );
        r.register(
            "gc_lag_seconds",
            "How long the longest-waiting node of the GC backlog has been eligible",
            m.gc_lag.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
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

    /// One object-store request of `operation` that took `took`.
    pub fn object_store(&self, operation: &'static str, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.store_requests
            .get_or_create(&StoreLabels { operation, outcome })
            .inc();
        self.store_seconds
            .get_or_create(&OperationLabel { operation })
            .observe(took.as_secs_f64());
    }

    /// A root-ref batch was checked so.
    pub fn root_refs_checked(&self, check: RootRefCheck) {
        let check = match check {
            RootRefCheck::Held => "held",
            RootRefCheck::Read => "read",
            RootRefCheck::Stale => "stale",
        };
        self.root_ref_checks
            .get_or_create(&CheckLabel { check })
            .inc();
    }

    /// What the metadata store's group commits tell.
    pub fn commit_observer(&self) -> CommitObserver {
        let (operations, seconds, failures, gate, hold, begin) = (
            self.commit_operations.clone(),
            self.commit_seconds.clone(),
            self.commit_failures.clone(),
            self.gate_wait.clone(),
            self.gate_hold.clone(),
            self.begin_wait.clone(),
        );
        std::sync::Arc::new(move |e: CommitEvent| match e {
            CommitEvent::Held { waited } => gate.observe(waited.as_secs_f64()),
            CommitEvent::Released { held } => hold.observe(held.as_secs_f64()),
            CommitEvent::Began { waited } => begin.observe(waited.as_secs_f64()),
            CommitEvent::Committed(s) => {
                operations.observe(s.operations as f64);
                seconds.observe(s.duration.as_secs_f64());
                if !s.ok {
                    failures.inc();
                }
            }
        })
    }

    /// Whether the outstanding counts are due (and, if so, claims the recount).
    pub fn backlog_due(&self) -> bool {
        let mut last = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        match *last {
            Some(t) if t.elapsed() < BACKLOG_EVERY => false,
            _ => {
                *last = Some(Instant::now());
                true
            }
        }
    }

    /// Sets the outstanding counts, taken at `now` (ms).
    pub fn set_backlog(&self, b: &Backlog, now: i64) {
        self.leases_outstanding.set(b.leased_nodes);
        self.upload_slots.set(b.upload_slots);
        self.gc_backlog.set(b.gc_eligible);
        self.gc_lag.set(
            b.gc_oldest_since
                .map_or(0, |since| (now - since).max(0) / 1000),
        );
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
