//! A TCP proxy between the service and PostgreSQL that loses the answers of commits: it
//! forwards every `COMMIT` (so the database applies it) and, for every n-th one, closes the
//! connection as soon as the database answers, without passing the answer on. The service
//! cannot tell whether such a commit happened.
//!
//! It reads the client's side of the protocol message by message (the untyped startup
//! message, then a type byte and a length each); the server's side is copied as it comes.
//! Connect to it without TLS (`sslmode=disable`): it must read what the service sends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The largest client message the proxy passes on (the service's statements are far smaller).
const MAX_MESSAGE: usize = 64 << 20;

#[derive(Default)]
struct Shared {
    /// Every n-th commit loses its answer; 0: none.
    lose_every: AtomicU64,
    commits: AtomicU64,
    lost: AtomicU64,
}

/// A running proxy; stops when dropped.
pub struct PgProxy {
    /// `host:port` to connect to instead of the database's.
    pub addr: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PgProxy {
    /// Listens on a free local port and forwards to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> anyhow::Result<PgProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let shared = Arc::new(Shared::default());
        let (upstream, state) = (upstream.to_string(), shared.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, state) = (upstream.clone(), state.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let _ = relay(client, server, &state).await;
                    }
                });
            }
        });
        Ok(PgProxy { addr, shared, task })
    }

    /// `url` (a `postgres://` URL) through this proxy, without TLS.
    pub fn url_for(&self, url: &str) -> anyhow::Result<String> {
        let mut u = reqwest::Url::parse(url).context("a database URL")?;
        let (host, port) = self.addr.rsplit_once(':').context("host:port")?;
        u.set_host(Some(host))?;
        u.set_port(Some(port.parse()?))
            .map_err(|()| anyhow::anyhow!("no port for {url}"))?;
        u.query_pairs_mut().append_pair("sslmode", "disable");
        Ok(u.to_string())
    }

    /// From now on every `n`-th commit loses its answer (0: none).
    pub fn lose_every(&self, n: u64) {
        self.shared.commits.store(0, Ordering::SeqCst);
        self.shared.lose_every.store(n, Ordering::SeqCst);
    }

    /// How many commits lost their answers.
    pub fn lost(&self) -> u64 {
        self.shared.lost.load(Ordering::SeqCst)
    }
}

/// One connection: the client's messages passed on one by one, the server's copied back
/// until a lost commit's answer arrives.
async fn relay(client: TcpStream, server: TcpStream, shared: &Shared) -> anyhow::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let losing = Arc::new(AtomicBool::new(false));
    let back = {
        let losing = losing.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = from_server.read(&mut buf).await?;
                // The answer to a lost commit (the database has applied it): drop it and the
                // connection with it.
                if n == 0 || losing.load(Ordering::SeqCst) {
                    return anyhow::Ok(());
                }
                to_client.write_all(&buf[..n]).await?;
            }
        })
    };
    let forward = pass_on(&mut from_client, &mut to_server, shared, &losing);
    tokio::select! {
        _ = back => {}
        _ = forward => {}
    }
    Ok(())
}

/// The client's messages, passed on one by one; marks the connection `losing` as it passes on
/// a commit whose answer is to be lost.
async fn pass_on(
    from_client: &mut (impl AsyncRead + Unpin),
    to_server: &mut (impl AsyncWrite + Unpin),
    shared: &Shared,
    losing: &AtomicBool,
) -> anyhow::Result<()> {
    // The startup message, after any requests for encryption the server declined.
    loop {
        let body = read_message(from_client, None).await?;
        to_server.write_all(&body).await?;
        let code = body
            .get(4..8)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        if !matches!(code, Some(80877103 | 80877104)) {
            break;
        }
    }
    loop {
        let mut kind = [0u8; 1];
        from_client.read_exact(&mut kind).await?;
        let message = read_message(from_client, Some(kind[0])).await?;
        if kind[0] == b'Q' && is_commit(&message[5..]) {
            let n = shared.lose_every.load(Ordering::SeqCst);
            let count = shared.commits.fetch_add(1, Ordering::SeqCst) + 1;
            if n > 0 && count.is_multiple_of(n) {
                losing.store(true, Ordering::SeqCst);
                shared.lost.fetch_add(1, Ordering::SeqCst);
            }
        }
        to_server.write_all(&message).await?;
    }
}

/// One message whose length field follows `kind` (or starts it, for the untyped startup
/// messages), returned whole as it was sent.
async fn read_message(
    from: &mut (impl AsyncRead + Unpin),
    kind: Option<u8>,
) -> anyhow::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    anyhow::ensure!((4..=MAX_MESSAGE).contains(&len), "a message of {len} bytes");
    let mut message = Vec::with_capacity(len + 1);
    message.extend(kind);
    message.extend_from_slice(&(len as u32).to_be_bytes());
    message.resize(message.len() + len - 4, 0);
    let start = message.len() - (len - 4);
    from.read_exact(&mut message[start..]).await?;
    Ok(message)
}

/// Whether a simple query's text is a commit.
fn is_commit(text: &[u8]) -> bool {
    let text = String::from_utf8_lossy(text);
    let text = text
        .trim_start()
        .trim_end_matches('\0')
        .trim_end_matches(';');
    text.trim().eq_ignore_ascii_case("COMMIT")
}
