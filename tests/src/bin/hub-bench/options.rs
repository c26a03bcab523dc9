//! The command line of the hub benchmark.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// How the CAS of one replay stores objects.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) compress_min_bytes: u64,
    pub(crate) compress_level: i32,
    pub(crate) delta_max_depth: u32,
    /// Small nodes packed by GC passes (running every second in the replay).
    pub(crate) pack: bool,
    /// Small nodes held in the database until packed (else written as objects first).
    pub(crate) hold: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) repo: PathBuf,
    pub(crate) topo: bool,
    pub(crate) limit: Option<usize>,
    pub(crate) compress_min_bytes: u64,
    pub(crate) compress_level: i32,
    pub(crate) delta_max_depth: u32,
    pub(crate) plain: bool,
    pub(crate) zstd: bool,
    pub(crate) delta: bool,
    pub(crate) pack: bool,
    /// Also the defaults with small nodes written as objects until packed.
    pub(crate) unheld: bool,
    /// Overrides of the packs' zstd level and block size (the service's defaults otherwise).
    pub(crate) pack_level: Option<i32>,
    pub(crate) pack_block_bytes: Option<u64>,
    pub(crate) pack_max_node_bytes: Option<u64>,
    pub(crate) restic: bool,
    pub(crate) git: bool,
    pub(crate) fs: bool,
    pub(crate) csv: Option<PathBuf>,
}

pub(crate) fn usage() -> anyhow::Error {
    anyhow::anyhow!(
        "usage: hub-bench REPO [--topo] [--limit N] [--compress-min-bytes N] \
         [--compress-level N] [--delta-max-depth N] [--no-plain] [--no-zstd] [--no-delta] [--no-pack] [--unheld] [--pack-level N] [--pack-block-bytes N] [--pack-max-node-bytes N] [--no-restic] [--no-git] \
         [--fs] [--csv FILE]"
    )
}

pub(crate) fn parse_options() -> anyhow::Result<Options> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut repo = None;
    let mut o = Options {
        repo: PathBuf::new(),
        topo: false,
        limit: None,
        compress_min_bytes: 64,
        compress_level: 3,
        delta_max_depth: 8,
        plain: true,
        zstd: true,
        delta: true,
        pack: true,
        unheld: false,
        pack_level: None,
        pack_block_bytes: None,
        pack_max_node_bytes: None,
        restic: true,
        git: true,
        fs: false,
        csv: None,
    };
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--topo" => o.topo = true,
            "--limit" => o.limit = Some(value("--limit")?.parse()?),
            "--compress-min-bytes" => {
                o.compress_min_bytes = value("--compress-min-bytes")?.parse()?;
                anyhow::ensure!(o.compress_min_bytes > 0, "--compress-min-bytes must be > 0");
            }
            "--compress-level" => o.compress_level = value("--compress-level")?.parse()?,
            "--delta-max-depth" => o.delta_max_depth = value("--delta-max-depth")?.parse()?,
            "--no-plain" => o.plain = false,
            "--no-zstd" => o.zstd = false,
            "--no-delta" => o.delta = false,
            "--no-pack" => o.pack = false,
            "--unheld" => o.unheld = true,
            "--pack-level" => o.pack_level = Some(value("--pack-level")?.parse()?),
            "--pack-max-node-bytes" => {
                o.pack_max_node_bytes = Some(value("--pack-max-node-bytes")?.parse()?)
            }
            "--pack-block-bytes" => {
                o.pack_block_bytes = Some(value("--pack-block-bytes")?.parse()?)
            }
            "--no-restic" => o.restic = false,
            "--no-git" => o.git = false,
            "--fs" => o.fs = true,
            "--csv" => o.csv = Some(PathBuf::from(value("--csv")?)),
            "-h" | "--help" => return Err(usage()),
            s if s.starts_with('-') => bail!("unknown option {s}; {}", usage()),
            s if repo.is_none() => repo = Some(PathBuf::from(s)),
            s => bail!("unexpected argument {s}; {}", usage()),
        }
    }
    o.repo = repo.ok_or_else(usage)?;
    Ok(o)
}

/// The layouts to replay, labelled: the layout before compression, deltas and packs,
/// compression alone, compression and deltas, and the defaults (compression, deltas and packs),
/// as the options choose.
pub(crate) fn layouts(o: &Options) -> Vec<(String, Layout)> {
    let zstd = |delta_max_depth, pack| Layout {
        compress_min_bytes: o.compress_min_bytes,
        compress_level: o.compress_level,
        delta_max_depth,
        pack,
        hold: pack,
    };
    let mut variants: Vec<(String, Layout)> = Vec::new();
    if o.plain {
        let off = Layout {
            compress_min_bytes: 0,
            compress_level: o.compress_level,
            delta_max_depth: 0,
            pack: false,
            hold: false,
        };
        variants.push(("compression off".to_string(), off));
    }
    if o.zstd {
        let label = format!(
            "zstd >= {} B, level {}",
            o.compress_min_bytes, o.compress_level
        );
        variants.push((label, zstd(0, false)));
    }
    let defaults = o.delta_max_depth == 8 && o.compress_level == 3 && o.compress_min_bytes == 64;
    if o.delta {
        let label = format!("zstd + deltas, depth {}, no packs", o.delta_max_depth);
        variants.push((label, zstd(o.delta_max_depth, false)));
    }
    if o.pack {
        let defaults = defaults
            && o.pack_level.is_none()
            && o.pack_block_bytes.is_none()
            && o.pack_max_node_bytes.is_none();
        let label = if defaults {
            "zstd + deltas + packs (defaults)".to_string()
        } else {
            let d = cas_service::config::Config::default();
            format!(
                "zstd + deltas, depth {}, packs of nodes <= {} B at level {} in blocks of {} B",
                o.delta_max_depth,
                o.pack_max_node_bytes.unwrap_or(d.pack_max_node_bytes),
                o.pack_level.unwrap_or(d.pack_level),
                o.pack_block_bytes.unwrap_or(d.pack_block_bytes)
            )
        };
        variants.push((label, zstd(o.delta_max_depth, true)));
    }
    if o.unheld {
        let label = "packs, small nodes written as objects until packed".to_string();
        let layout = Layout {
            hold: false,
            ..zstd(o.delta_max_depth, true)
        };
        variants.push((label, layout));
    }
    variants
}
