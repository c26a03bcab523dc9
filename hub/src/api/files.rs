//! Answers that carry content: one file of a revision (streamed, never sniffed, sandboxed,
//! active types as attachments, the head revalidated by ETag) and a workspace listing
//! (streamed as the tree is walked).

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio_util::io::ReaderStream;

use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids::ProjectId;
use crate::versions::VersionView;
use crate::workspace::ListedEntry;

pub fn content_type_of(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("py") => "text/x-python; charset=utf-8",
        Some("md") => "text/markdown; charset=utf-8",
        Some("txt") | Some("toml") | Some("cfg") | Some("ini") | Some("lock") => {
            "text/plain; charset=utf-8"
        }
        Some("json") | Some("ipynb") => "application/json",
        Some("html") | Some("htm") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("csv") => "text/csv; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg") | Some("jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("yaml") | Some("yml") => "application/yaml",
        _ => "application/octet-stream",
    }
}

const IMMUTABLE: &str = "private, max-age=31536000, immutable";

/// The headers of an answer that carries users' data: its type, never sniffed, under `csp`.
fn users_data(
    h: &mut HeaderMap,
    content_type: &'static str,
    cache: &'static str,
    csp: &'static str,
) {
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
}

/// A stored file: by its tree entry, or by its node alone (its layout is read first).
pub enum Stored {
    Ref(cas_client::files::FileRef),
    Node(cas_format::Hash),
}

/// A body that streams a stored file of `size` bytes.
fn streamed(hub: &Hub, pid: &ProjectId, file: Stored, size: u64) -> HubResult<Response> {
    let space = pid.space();
    let (mut writer, reader) = tokio::io::duplex(256 << 10);
    let cas = hub.cas()?.clone();
    tokio::spawn(async move {
        let done = match file {
            Stored::Ref(f) => cas.read_file_ref(&space, &f, &mut writer).await,
            Stored::Node(n) => cas.read_file(&space, &n, &mut writer).await,
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "streaming a file failed");
        }
    });
    let mut r = Body::from_stream(ReaderStream::with_capacity(reader, 256 << 10)).into_response();
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    Ok(r)
}

/// Streams a version's HTML snapshot: rendered notebook output is the users' data, so it runs
/// in a sandbox with an opaque origin (scripts may run, to render it; nothing of the hub's
/// origin is reachable from it), immutable like the version.
pub fn stream_snapshot(
    hub: &Hub,
    pid: &ProjectId,
    node: cas_format::Hash,
    size: u64,
) -> HubResult<Response> {
    let mut resp = streamed(hub, pid, Stored::Node(node), size)?;
    let h = resp.headers_mut();
    users_data(
        h,
        "text/html; charset=utf-8",
        IMMUTABLE,
        "sandbox allow-scripts allow-popups",
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Ok(resp)
}

/// Streams the file at `path` of version `v`. A URL that names a revision or version is
/// immutable; the head (`immutable` false) is revalidated with its ETag. Files are the users'
/// data: never sniffed, always sandboxed, and active types (HTML, SVG, scripts, XML) are
/// served as attachments, so nothing stored can run with the API's origin.
pub async fn stream_file(
    hub: &Hub,
    pid: &ProjectId,
    v: &VersionView,
    path: &str,
    immutable: bool,
    headers: &HeaderMap,
) -> HubResult<Response> {
    let file = hub.file_at(pid, v, path).await?;
    let etag = format!("\"{}\"", file.node);
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut resp = if matches {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        streamed(hub, pid, Stored::Ref(file), file.size)?
    };
    let content_type = content_type_of(path);
    let h = resp.headers_mut();
    users_data(
        h,
        content_type,
        if immutable {
            IMMUTABLE
        } else {
            "private, no-cache"
        },
        "sandbox; default-src 'none'",
    );
    if server_kit::web_guard::is_active_type(content_type) {
        let name: String = path
            .rsplit('/')
            .next()
            .unwrap_or("file")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    Ok(resp)
}

/// Answers a version and its workspace listing as the envelope, streaming the entries as the
/// tree is walked: the answer's memory does not grow with the tree.
pub async fn stream_workspace(
    hub: &Hub,
    pid: &ProjectId,
    version: VersionView,
) -> HubResult<Response> {
    let space = pid.space();
    let tree = version.tree;
    let head = serde_json::to_vec(&version)
        .map_err(|e| HubError::internal("cannot encode a version", e))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(8);
    let (started_tx, started) = tokio::sync::oneshot::channel::<HubResult<()>>();
    let cas = hub.cas()?.clone();
    tokio::spawn(async move {
        let mut walk = match cas
            .walk(&space, &tree, cas_client::TreeLimits::default())
            .await
        {
            Ok(w) => {
                let _ = started_tx.send(Ok(()));
                w
            }
            Err(e) => {
                let _ = started_tx.send(Err(crate::workspace::edit_error(e)));
                return;
            }
        };
        let mut buf = b"{\"success\":true,\"data\":{\"version\":".to_vec();
        buf.extend_from_slice(&head);
        buf.extend_from_slice(b",\"entries\":[");
        let mut first = true;
        loop {
            match walk.next().await {
                Ok(Some(w)) => {
                    if !first {
                        buf.push(b',');
                    }
                    first = false;
                    if serde_json::to_writer(&mut buf, &ListedEntry::from(w)).is_err() {
                        return;
                    }
                    if buf.len() >= 64 << 10
                        && tx.send(Ok(std::mem::take(&mut buf).into())).await.is_err()
                    {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "a workspace listing stopped half way");
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            }
        }
        buf.extend_from_slice(b"]}}");
        let _ = tx.send(Ok(buf.into())).await;
    });
    started
        .await
        .map_err(|e| HubError::internal("the listing task failed", e))??;
    let mut resp = Body::from_stream(tokio_stream_of(rx)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// A stream of what a channel receives.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
