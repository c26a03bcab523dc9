//! Node contents for storage tests: text that compresses like source code, bytes that do not
//! compress, edits of them, and storing a node through the uploader with a delta base named.

use cas_client::Plan;
use cas_format::{Hash, SpaceId};

/// Lease of nodes these helpers store, in ms.
pub const LEASE: u64 = 1_000;

/// Text of `n` bytes that compresses like source code does (words from a small vocabulary),
/// different for each seed.
pub fn text(seed: u64, n: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "def ",
        "return ",
        "import ",
        "marimo",
        "(x)",
        " = ",
        "\n    ",
        "cell",
        "mo.md",
        "\n",
        "data",
        "plot",
        ", ",
        "for i in range",
        ":",
        "df",
    ];
    let mut out = Vec::with_capacity(n + 16);
    for x in xorshift(seed) {
        if out.len() >= n {
            break;
        }
        out.extend_from_slice(WORDS[(x % 16) as usize].as_bytes());
        if x.is_multiple_of(5) {
            out.extend_from_slice(format!("v{}", x % 997).as_bytes());
        }
    }
    out.truncate(n);
    out
}

/// `n` bytes that do not compress (an xorshift stream), different for each seed.
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut out: Vec<u8> = xorshift(seed)
        .take(n.div_ceil(8))
        .flat_map(u64::to_le_bytes)
        .collect();
    out.truncate(n);
    out
}

/// An endless xorshift stream, different for each seed.
fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

/// `base` with a few lines changed in the middle.
pub fn edited(base: &[u8], what: &str) -> Vec<u8> {
    let mut v = base.to_vec();
    let at = v.len() / 2;
    v.splice(at..at, format!("\n# edited: {what}\n").bytes());
    v
}

/// The row of node `h`, which must have one.
pub async fn row_of(
    meta: &cas_service::meta::MetaStore,
    app: &cas_format::AppId,
    sp: &SpaceId,
    h: Hash,
) -> anyhow::Result<cas_service::meta::NodeRow> {
    meta.node(app, sp, &h)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no row for {h}"))
}

/// Stores `portable` (node `hash`) through the uploader, naming `base` as its delta base.
pub async fn store(
    client: &cas_client::AppCasClient,
    sp: &SpaceId,
    portable: bytes::Bytes,
    base: Option<Hash>,
) -> anyhow::Result<Hash> {
    let mut plan = Plan::default();
    let hash = plan.add_portable(portable)?;
    if let Some(b) = base {
        plan.suggest_base(hash, b);
    }
    cas_client::Uploader::new(client, sp, &plan, LEASE, 4)
        .run(&[hash])
        .await?;
    Ok(hash)
}

/// Reads every node back whole and checks its content.
pub async fn read_all(
    client: &cas_client::AppCasClient,
    sp: &SpaceId,
    nodes: &[(Hash, Vec<u8>)],
) -> anyhow::Result<()> {
    for (h, c) in nodes {
        anyhow::ensure!(
            client.read_node(sp, h).await?[..] == c[..],
            "{h} read back other bytes"
        );
    }
    Ok(())
}
