//! Commands that need no server: `hash`, `svalue encode|decode|hash`, `archive verify`.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;

use anyhow::{Context, bail};
use cas_format::archive::{ArchiveLimits, ArchiveReader};
use cas_format::svalue::{self, SValueLimits};
use cas_format::{ContentType, Hash, NodeDescriptor, NodeLimits, NodeStreamValidator, Value};
use clap::{Args, Subcommand};

/// Largest JSON text `svalue encode` and `svalue hash` read.
const MAX_JSON_INPUT: u64 = 256 << 20;
/// Stdin is kept in memory up to this size, then spilled to a temporary file.
const SPOOL_IN_MEMORY: usize = 16 << 20;
const READ_CHUNK: usize = 1 << 20;

#[derive(Debug, Args)]
pub struct HashArgs {
    /// Content type of the node (1..=1024 bytes of printable ASCII).
    #[arg(long, required_unless_present = "portable")]
    content_type: Option<String>,
    /// An ordered child ref; repeat for several (order and duplicates matter).
    #[arg(long = "ref", value_name = "HASH")]
    refs: Vec<Hash>,
    /// Read a portable full node instead of own content, verify its structure, print its hash.
    #[arg(long, conflicts_with_all = ["content_type", "refs"])]
    portable: bool,
    /// Input file; stdin when absent or `-`.
    file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum SvalueCommand {
    /// Read the JSON form on stdin, write canonical CBOR to stdout.
    Encode,
    /// Read CBOR on stdin, print the JSON form.
    Decode,
    /// Print the node hash of the SValue whose JSON form is on stdin.
    Hash,
}

#[derive(Debug, Subcommand)]
pub enum ArchiveCommand {
    /// Check an archive offline; print its roots and node count.
    Verify {
        file: PathBuf,
        /// Accept refs to nodes that are not in the archive (they are listed).
        #[arg(long)]
        allow_external: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Write the portable full node of FILE (or stdin) as own content with the given ordered
    /// refs: the bytes an upload target takes.
    Encode {
        #[arg(long)]
        content_type: String,
        #[arg(long = "ref", value_name = "HASH")]
        refs: Vec<Hash>,
        /// Where to write it; stdout when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
        file: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// A permission to grant; repeat for several. Default: every data-plane permission.
    #[arg(long = "permission", value_name = "PERMISSION")]
    permissions: Vec<String>,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 900)]
    ttl: u64,
}

fn open_input(file: &Option<PathBuf>) -> anyhow::Result<Box<dyn Read>> {
    match file {
        Some(p) if p.as_os_str() != "-" => {
            let f = File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            Ok(Box::new(BufReader::with_capacity(READ_CHUNK, f)))
        }
        _ => Ok(Box::new(io::stdin().lock())),
    }
}

/// Reads all of `r`, refusing more than `limit` bytes.
pub(crate) fn read_bounded(r: &mut dyn Read, limit: u64, what: &str) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.take(limit + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("cannot read {what}"))?;
    if buf.len() as u64 > limit {
        bail!("{what} is larger than {limit} bytes");
    }
    Ok(buf)
}

fn line(json: bool, hash: &Hash) -> Vec<u8> {
    if json {
        format!("{}\n", serde_json::json!({ "hash": hash })).into_bytes()
    } else {
        format!("{hash}\n").into_bytes()
    }
}

pub fn hash(args: HashArgs, json: bool) -> anyhow::Result<Vec<u8>> {
    let mut input = open_input(&args.file)?;
    let hash = if args.portable {
        hash_portable(&mut input)?
    } else {
        let ct = args.content_type.unwrap_or_default();
        let ct = ContentType::new(ct).context("invalid --content-type")?;
        hash_content(ct, args.refs, input)?
    };
    Ok(line(json, &hash))
}

fn hash_content(ct: ContentType, refs: Vec<Hash>, input: Box<dyn Read>) -> anyhow::Result<Hash> {
    // The header holds the content size, so the size must be known before hashing starts:
    // spool the input (in memory while small) and hash it in a second pass.
    let mut spool = tempfile::SpooledTempFile::new(SPOOL_IN_MEMORY);
    let size = io::copy(&mut { input }, &mut spool).context("cannot read the input")?;
    spool.seek(SeekFrom::Start(0))?;
    if ct.is_svalue() {
        let content = read_bounded(
            &mut spool,
            SValueLimits::default().max_bytes,
            "SValue content",
        )?;
        let found = svalue::extract_refs(&content, &SValueLimits::default())
            .context("content is not a canonical SValue")?;
        if found != refs {
            bail!(
                "the --ref list differs from the SBlobs of the SValue content ({} found)",
                found.len()
            );
        }
        return Ok(NodeDescriptor::new(ct, refs, size).hash_of(&content)?);
    }
    let mut hasher = NodeDescriptor::new(ct, refs, size).hasher()?;
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = spool.read(&mut buf).context("cannot read the input")?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finish()?)
}

fn hash_portable(input: &mut dyn Read) -> anyhow::Result<Hash> {
    let mut v = NodeStreamValidator::new(NodeLimits::format_max());
    let svalue_limit = SValueLimits::default().max_bytes;
    let mut svalue_content: Option<Vec<u8>> = None;
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = input.read(&mut buf).context("cannot read the input")?;
        if n == 0 {
            break;
        }
        let content = v.update(&buf[..n]).context("invalid portable node")?;
        if let Some(d) = v.descriptor()
            && d.content_type.is_svalue()
        {
            let kept = svalue_content.get_or_insert_with(Vec::new);
            if kept.len() as u64 + content.len() as u64 > svalue_limit {
                bail!("SValue content is larger than {svalue_limit} bytes");
            }
            kept.extend_from_slice(content);
        }
    }
    let (descriptor, hash) = v.finish(None).context("invalid portable node")?;
    if descriptor.content_type.is_svalue() {
        let content = svalue_content.unwrap_or_default();
        let found = svalue::extract_refs(&content, &SValueLimits::default())
            .context("content is not a canonical SValue")?;
        if found != descriptor.refs {
            bail!("header refs differ from the SBlobs of the SValue content");
        }
    }
    Ok(hash)
}

fn read_json_value() -> anyhow::Result<Value> {
    let text = read_bounded(&mut io::stdin().lock(), MAX_JSON_INPUT, "stdin")?;
    Value::from_json_slice(&text).context("invalid SValue JSON")
}

pub fn svalue(cmd: SvalueCommand, json: bool) -> anyhow::Result<Vec<u8>> {
    match cmd {
        SvalueCommand::Encode => {
            let value = read_json_value()?;
            Ok(svalue::encode(&value).context("cannot encode")?.bytes)
        }
        SvalueCommand::Decode => {
            let limits = SValueLimits::default();
            let bytes = read_bounded(&mut io::stdin().lock(), limits.max_bytes, "stdin")?;
            let (value, _) =
                svalue::decode_with_limits(&bytes, &limits).context("invalid SValue CBOR")?;
            let mut out = value.to_json_string().into_bytes();
            out.push(b'\n');
            Ok(out)
        }
        SvalueCommand::Hash => {
            let value = read_json_value()?;
            let enc = svalue::encode(&value).context("cannot encode")?;
            let d = NodeDescriptor::new(ContentType::svalue(), enc.refs, enc.bytes.len() as u64);
            Ok(line(json, &d.hash_of(&enc.bytes)?))
        }
    }
}

pub fn node(cmd: NodeCommand) -> anyhow::Result<Vec<u8>> {
    match cmd {
        NodeCommand::Encode {
            content_type,
            refs,
            output,
            file,
        } => {
            let ct = ContentType::new(content_type).context("invalid --content-type")?;
            let content = read_bounded(
                &mut open_input(&file)?,
                NodeLimits::default().max_content_size,
                "the input",
            )?;
            if ct.is_svalue() {
                let found = svalue::extract_refs(&content, &SValueLimits::default())
                    .context("content is not a canonical SValue")?;
                if found != refs {
                    bail!("the --ref list differs from the SBlobs of the SValue content");
                }
            }
            let bytes =
                NodeDescriptor::new(ct, refs, content.len() as u64).encode_portable(&content)?;
            match output {
                Some(path) => {
                    std::fs::write(&path, &bytes)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    Ok(Vec::new())
                }
                None => Ok(bytes),
            }
        }
    }
}

/// Every data-plane permission, granted by `unicas token` unless told otherwise.
const ALL_PERMISSIONS: &[&str] = crate::capability::ALL_PERMISSIONS;

pub fn token(args: TokenArgs, connection: &super::Connection) -> anyhow::Result<Vec<u8>> {
    let space = connection.space()?;
    let key = connection
        .signing_key()?
        .with_ttl(std::time::Duration::from_secs(args.ttl));
    let permissions: Vec<&'static str> = if args.permissions.is_empty() {
        ALL_PERMISSIONS.to_vec()
    } else {
        args.permissions
            .iter()
            .map(|p| {
                ALL_PERMISSIONS
                    .iter()
                    .find(|known| *known == p)
                    .copied()
                    .with_context(|| {
                        format!(
                            "unknown permission {p:?}; one of {}",
                            ALL_PERMISSIONS.join(", ")
                        )
                    })
            })
            .collect::<anyhow::Result<_>>()?
    };
    let token = key.mint(&space, &permissions)?;
    Ok(format!("{token}\n").into_bytes())
}

pub fn archive(cmd: ArchiveCommand, json: bool) -> anyhow::Result<Vec<u8>> {
    match cmd {
        ArchiveCommand::Verify {
            file,
            allow_external,
        } => {
            let f = File::open(&file).with_context(|| format!("cannot open {}", file.display()))?;
            let reader = ArchiveReader::new(
                BufReader::with_capacity(READ_CHUNK, f),
                ArchiveLimits::default(),
            )
            .context("invalid archive")?;
            let summary = reader.verify_to_end().context("invalid archive")?;
            if !allow_external && !summary.external_refs.is_empty() {
                bail!(
                    "invalid archive: {} ref(s) point outside the archive, first {} (use --allow-external to accept)",
                    summary.external_refs.len(),
                    summary.external_refs[0]
                );
            }
            if json {
                let v = serde_json::json!({
                    "roots": summary.roots,
                    "nodeCount": summary.node_count,
                    "externalRefs": summary.external_refs,
                    "digest": summary.digest,
                    "bytes": summary.bytes,
                });
                return Ok(format!("{v}\n").into_bytes());
            }
            let mut out = String::new();
            for r in &summary.roots {
                out.push_str(&format!("root {r}\n"));
            }
            out.push_str(&format!("nodes {}\n", summary.node_count));
            for r in &summary.external_refs {
                out.push_str(&format!("external {r}\n"));
            }
            Ok(out.into_bytes())
        }
    }
}
