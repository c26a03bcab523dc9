//! Where the CPU went during a phase: the server, the database server's processes (none on
//! SQLite, which runs inside the server), the load generator, and how busy the machine was.
//! On a machine of few cores the three share them, so an operation's figure against the
//! baseline's is bounded by the CPU all three spend on it, not only by the server's path.

use std::time::Instant;

/// CPU times at one moment, in clock ticks.
pub struct CpuMark {
    at: Instant,
    server: u64,
    database: u64,
    bench: u64,
    busy: u64,
    total: u64,
    cores: usize,
}

impl CpuMark {
    pub fn take(server_pid: u32) -> anyhow::Result<Self> {
        let (busy, total, cores) = tests::machine_cpu_ticks()?;
        Ok(CpuMark {
            at: Instant::now(),
            server: tests::proc_cpu_ticks(server_pid)?,
            database: tests::named_cpu_ticks("postgres")?,
            bench: tests::proc_cpu_ticks(std::process::id())?,
            busy,
            total,
            cores,
        })
    }

    /// What was spent between `before` and `self` on each of `rate` operations a second, as
    /// one line naming the operation and the role of this process (the load generator, the
    /// client).
    pub fn since(&self, before: &CpuMark, rate: f64, operation: &str, bench: &str) -> String {
        let seconds = self.at.duration_since(before.at).as_secs_f64();
        let total = self.total.saturating_sub(before.total) as f64;
        // `/proc/stat` counts every core's ticks: its total over the wall time is the rate.
        let ticks_per_second = total / (self.cores as f64 * seconds);
        let operations = (rate * seconds).max(1.0);
        let ms = |after: u64, before: u64| {
            after.saturating_sub(before) as f64 / ticks_per_second / operations * 1e3
        };
        format!(
            "CPU of {operation}: server {:.3} ms, database server {:.3} ms, {bench} {:.3} ms; \
             the machine {:.0}% busy ({} cores)",
            ms(self.server, before.server),
            ms(self.database, before.database),
            ms(self.bench, before.bench),
            self.busy.saturating_sub(before.busy) as f64 / total.max(1.0) * 100.0,
            self.cores
        )
    }
}
