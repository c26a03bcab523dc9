//! Class 11: memory that grew with the file. `unicas tree put` and `tree get` of a tree holding
//! one file of several hundred MB, and a push sync of it, keep the client's and the hub's peak
//! resident memory under the bound `docs/security.md` states (parallelism × twice the largest
//! chunk, plus a fixed base), whatever the size of the file.

use std::io::{Read, Write};
use std::process::Command;

use sha2::{Digest, Sha256};
use tests::hub::{HubEnv, data, tar_header};
use tests::{Backend, TestEnv, binary, run_measuring_memory};

use crate::support::push_notebook;

/// Bytes of the large file.
const SIZE: usize = 400 << 20;
/// The stated bound for the `unicas` tool at its default parallelism of 8.
const CLIENT_BOUND_MIB: f64 = 160.0;
/// The stated growth bound for the hub (parallelism 16, plus its caches).
const HUB_BOUND_MIB: f64 = 256.0;

fn run(f: impl std::future::Future<Output = anyhow::Result<()>>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
        .expect("scenario");
}

#[test]
fn the_client_stays_bounded() {
    run(client_stays_bounded(Backend::SQLITE_FS))
}

#[test]
fn the_hub_stays_bounded() {
    run(hub_stays_bounded(Backend::SQLITE_FS))
}

/// Writes `SIZE` bytes that neither compress nor repeat into `out`.
fn write_noise(out: &mut impl Write) -> anyhow::Result<()> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..SIZE / buf.len() {
        for word in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        out.write_all(&buf)?;
    }
    Ok(())
}

fn digest(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finalize().to_vec());
        }
        h.update(&buf[..n]);
    }
}

async fn client_stays_bounded(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("a")?;
    let server = env.start()?;
    let src = env.dir.path().join("src");
    std::fs::create_dir_all(&src)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(src.join("big.bin"))?);
    write_noise(&mut f)?;
    f.into_inner()?.sync_all()?;
    let unicas = |args: &[&std::ffi::OsStr]| {
        let mut c = Command::new(binary("e2e-unicas"));
        c.args(args)
            .env("UNICAS_SERVER", &server.url)
            .env("UNICAS_APP", "a")
            .env("UNICAS_SPACE", "s")
            .env("UNICAS_SIGNING_KEY", &app.key.private_path)
            .env("UNICAS_KID", &app.kid)
            .env("UNICAS_ISSUER", &app.issuer);
        c
    };
    let (out, put_peak) =
        run_measuring_memory(unicas(&["tree".as_ref(), "put".as_ref(), src.as_os_str()]))?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8(out.stdout)?.trim().to_string();
    let dest = env.dir.path().join("dest");
    let (out, get_peak) = run_measuring_memory(unicas(&[
        "tree".as_ref(),
        "get".as_ref(),
        hash.as_ref(),
        dest.as_os_str(),
    ]))?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        digest(&src.join("big.bin"))?,
        digest(&dest.join("big.bin"))?
    );
    eprintln!(
        "unicas tree put peak {put_peak:.1} MiB, tree get peak {get_peak:.1} MiB for {} MiB",
        SIZE >> 20
    );
    assert!(
        put_peak < CLIENT_BOUND_MIB,
        "tree put peaked at {put_peak:.1} MiB"
    );
    assert!(
        get_peak < CLIENT_BOUND_MIB,
        "tree get peaked at {get_peak:.1} MiB"
    );
    Ok(())
}

async fn hub_stays_bounded(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let (_, sync) = push_notebook(&a, &pid, "big").await?;
    // The tar, on disk: one header, the file, padding, the end marker.
    let tar = env.env.dir.path().join("push.tar");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tar)?);
    f.write_all(&tar_header("big.bin", b'0', SIZE, ""))?;
    write_noise(&mut f)?;
    f.write_all(&[0u8; 1024])?;
    f.into_inner()?.sync_all()?;

    let before = server.peak_rss_mib()?;
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(
        tokio::fs::File::open(&tar).await?,
    ));
    let got = data(
        &server
            .client(Some(&sync))
            .post_bytes("/api/sync/git/v1", "application/x-tar", body, &[])
            .await?,
        200,
    );
    assert_eq!(got["size_bytes"], SIZE);
    let after = server.peak_rss_mib()?;
    eprintln!(
        "hub peak {before:.1} MiB before and {after:.1} MiB after a {} MiB push",
        SIZE >> 20
    );
    assert!(
        after - before < HUB_BOUND_MIB,
        "the hub's peak memory grew by {:.1} MiB for a {} MiB push",
        after - before,
        SIZE >> 20
    );
    Ok(())
}
