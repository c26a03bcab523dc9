//! Figures as the report prints them.

use std::time::Duration;

/// Nearest-rank percentile of `v` (sorted here).
pub(crate) fn pct<T: Copy + Ord>(v: &[T], p: f64) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort();
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

pub(crate) fn mean(v: &[u64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `1234567` → `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn mb(n: u64) -> String {
    format!("{:.3} MB", n as f64 / 1e6)
}

pub(crate) const LABEL: usize = 58;
pub(crate) const COL: usize = 26;

pub(crate) fn row(label: &str, cols: &[String]) {
    let mut line = format!("  {label:<LABEL$}");
    for c in cols {
        line.push_str(&format!("{c:>COL$}"));
    }
    println!("{}", line.trim_end());
}

/// A figure that could not be measured, and why (the last line of the error).
pub(crate) fn na(label: &str, e: &anyhow::Error) {
    let e = format!("{e:#}");
    let why = e.strip_prefix("n/a: ").unwrap_or(&e);
    println!(
        "  {label:<LABEL$}  n/a: {}",
        why.lines().last().unwrap_or_default().trim()
    );
}

pub(crate) fn stats_u64(v: &[u64]) -> String {
    format!(
        "{:.0} / {} / {}",
        mean(v),
        pct(v, 0.5).unwrap_or(0),
        pct(v, 0.99).unwrap_or(0)
    )
}
