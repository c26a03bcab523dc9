//! Processes under test: spawning a server and waiting for its announced URL, its output,
//! killing and terminating it, and measuring memory from `/proc`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::random_id;

/// A server process under test: what it printed on stdout, its stderr in a file of the test's
/// directory. Killed when dropped.
pub struct Process {
    /// The binary's name, for messages.
    name: &'static str,
    child: Child,
    /// The URL it announced on stdout.
    pub url: String,
    pub stderr_path: PathBuf,
    printed: Arc<std::sync::Mutex<Vec<String>>>,
}

/// A running `unicas-server`.
pub type Server = Process;

impl Process {
    /// One series of the server's `/metrics` (see [`crate::metric`]).
    pub async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let scrape = reqwest::get(format!("{}/metrics", self.url))
            .await?
            .text()
            .await?;
        Ok(crate::metric(&scrape, series))
    }

    /// Starts `cmd serve` with `extra` in its environment and waits up to `timeout` for the
    /// stdout line `<ready><url>`.
    pub fn spawn(
        mut cmd: Command,
        dir: &Path,
        name: &'static str,
        ready: &'static str,
        timeout: Duration,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<Process> {
        let stderr_path = dir.join(format!("{}.stderr", random_id(&format!("{name}-"))));
        let stderr = std::fs::File::create(&stderr_path)?;
        cmd.arg("serve")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .stdin(Stdio::null());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let printed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = printed.clone();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                if let Some(addr) = line.strip_prefix(ready) {
                    let _ = tx.send(addr.to_string());
                }
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        match rx.recv_timeout(timeout) {
            Ok(url) => Ok(Process {
                name,
                child,
                url,
                stderr_path,
                printed,
            }),
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                bail!("{name} did not start:\n{log}")
            }
        }
    }

    /// The lines the process printed on stdout so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.printed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its peak resident memory so far, in MiB.
    pub fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        Ok(proc_status_kib(self.pid(), "VmHWM:")? as f64 / 1024.0)
    }

    /// What the process wrote on stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if self.log().contains(needle) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "{} never logged {needle:?}; log:\n{}",
            self.name,
            self.log()
        )
    }

    /// SIGKILL, now.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait 10 s for a graceful exit; returns whether it exited successfully.
    pub fn terminate(self) -> anyhow::Result<bool> {
        self.terminate_within(Duration::from_secs(10))
    }

    /// SIGTERM, then wait up to `within` for a graceful exit; returns whether it exited
    /// successfully.
    pub fn terminate_within(mut self, within: Duration) -> anyhow::Result<bool> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.success());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        bail!("{} did not stop within {within:?} of SIGTERM", self.name)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {} log ({}) ---\n{}", self.name, self.url, self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes a process has passed to `write` and its kin so far (`wchar` of `/proc/<pid>/io`):
/// for the service, its database's write-ahead log and checkpoints and its objects.
pub fn proc_written_bytes(pid: u32) -> anyhow::Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no wchar in /proc/{pid}/io"))
}

/// CPU time (user and system) a process has used so far, in the kernel's clock ticks (the unit
/// of `/proc/stat`, so that shares of [`machine_cpu_ticks`] need no conversion).
pub fn proc_cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The name, in parentheses, may hold spaces: the fields that follow come after its last
    // `)`, from the third (the state) on; user and system time are the 14th and 15th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    match (tick(11), tick(12)) {
        (Some(user), Some(system)) => Ok(user + system),
        _ => bail!("no CPU times in /proc/{pid}/stat"),
    }
}

/// CPU time used so far by every running process named `name` (`postgres`: a database
/// server's backends and helpers), in clock ticks. One that exits between the listing and its
/// reading is left out.
pub fn named_cpu_ticks(name: &str) -> anyhow::Result<u64> {
    let mut ticks = 0;
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let named = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == name);
        if named && let Ok(t) = proc_cpu_ticks(pid) {
            ticks += t;
        }
    }
    Ok(ticks)
}

/// The machine's CPU time so far over all its cores, in clock ticks: `(busy, total, cores)`
/// (idle and waiting for I/O are not busy).
pub fn machine_cpu_ticks() -> anyhow::Result<(u64, u64, usize)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let all: Vec<u64> = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .map(|v| v.parse().context("a CPU time in /proc/stat"))
        .collect::<anyhow::Result<_>>()?;
    let total: u64 = all.iter().take(8).sum();
    let idle = all.get(3).copied().unwrap_or(0) + all.get(4).copied().unwrap_or(0);
    let cores = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count();
    Ok((total.saturating_sub(idle), total, cores.max(1)))
}

/// A field of `/proc/PID/status`, in KiB (`VmHWM:` the peak resident memory, `VmRSS:` the
/// current one).
pub fn proc_status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Runs `cmd` to completion while sampling its peak resident memory (it only grows, so the last
/// sample before the exit is the peak up to then); returns its output and the peak in MiB.
pub fn run_measuring_memory(mut cmd: Command) -> anyhow::Result<(std::process::Output, f64)> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let sampler = std::thread::spawn(move || {
        let mut peak = 0u64;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(kib) = proc_status_kib(pid, "VmHWM:") {
                peak = peak.max(kib);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        peak
    });
    let out = child.wait_with_output();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().unwrap_or(0);
    Ok((out?, peak as f64 / 1024.0))
}
