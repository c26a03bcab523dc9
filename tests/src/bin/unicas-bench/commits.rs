//! The server's commit and partition counters, read from `/metrics` before and after a phase.

use std::time::Instant;

/// The server's commit counters (from `/metrics`) at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Commits {
    at: Instant,
    batches: f64,
    operations: f64,
    seconds: f64,
    gate_waits: f64,
    gate_wait_seconds: f64,
    holds: f64,
    hold_seconds: f64,
}

impl Commits {
    pub async fn read(http: &reqwest::Client, server: &str) -> anyhow::Result<Self> {
        let text = http
            .get(format!("{server}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let value = |name: &str| -> f64 {
            let v = tests::metric(&text, name);
            if v.is_nan() { 0.0 } else { v }
        };
        Ok(Commits {
            at: Instant::now(),
            batches: value("unicas_commit_batch_operations_count"),
            operations: value("unicas_commit_batch_operations_sum"),
            seconds: value("unicas_commit_duration_seconds_sum"),
            gate_waits: value("unicas_gate_wait_seconds_count"),
            gate_wait_seconds: value("unicas_gate_wait_seconds_sum"),
            holds: value("unicas_gate_hold_seconds_count"),
            hold_seconds: value("unicas_gate_hold_seconds_sum"),
        })
    }

    /// What happened between `before` and `self`, as two lines: the commits, then how long
    /// an operation held its partition and how much of the time operations and commits took.
    /// For one busy partition on Postgres, whose commit holds it to the end, the two add up to
    /// how busy it was, the rest being time it waited for requests; on SQLite a commit's
    /// fsync runs beside the next batch's operations.
    pub fn since(&self, before: &Commits) -> String {
        let batches = (self.batches - before.batches).max(1.0);
        let waits = (self.gate_waits - before.gate_waits).max(1.0);
        let holds = (self.holds - before.holds).max(1.0);
        let secs = (self.at - before.at).as_secs_f64();
        let committing = self.seconds - before.seconds;
        let holding = self.hold_seconds - before.hold_seconds;
        format!(
            "{:.1} operations a commit, {:.2} ms a commit, {:.2} ms mean wait for the gate\n    \
             an operation held its partition {:.2} ms; operations held it {:.0}% of the time, \
             commits took {:.0}%",
            (self.operations - before.operations) / batches,
            committing * 1e3 / batches,
            (self.gate_wait_seconds - before.gate_wait_seconds) * 1e3 / waits,
            holding * 1e3 / holds,
            holding * 100.0 / secs,
            committing * 100.0 / secs,
        )
    }
}
