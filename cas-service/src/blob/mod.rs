//! `BlobStore`: the object-store port. A local folder (embedded default) or an S3-compatible
//! bucket, selected by the blob store URL; the rest of the service sees only this type.
//!
//! Key layout (relative to the store's root or prefix):
//!
//! ```text
//! app.<appId>/space.<spaceId>/nodes/<hh>/<hash>.<generation>   a ready node's own content
//!                                                              (or portable bytes, adopted)
//! app.<appId>/space.<spaceId>/packs/<packId>                    small nodes packed together
//! uploads/app.<appId>/space.<spaceId>/<generation>             portable node of an upload
//! ```
//!
//! A node's object key carries the upload generation that published it, so a re-publication
//! after GC marked the node never reuses a key that a late delete could still hit. The `app.`
//! and `space.` prefixes keep identifiers such as `..` from ever being a path component.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cas_format::{AppId, Hash, SpaceId};
use futures_util::Stream;
use tokio::io::AsyncRead;

mod dir;
mod fs;
mod s3;
mod spool;
mod staged;

pub use dir::{SafeDir, SpoolFile};
pub use fs::{FsStore, HeldUpload};
pub use s3::S3Store;
pub use spool::Spool;
pub use staged::StagedObject;

use crate::config::Config;

/// PUTs of one [`BlobStore::put_many_bytes`] in flight at once on S3.
const PUTS_AT_ONCE: usize = 8;

/// A readable object body.
pub type ObjectReader = Pin<Box<dyn AsyncRead + Send>>;

/// How a node's own content is stored in its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// As is.
    Identity,
    /// One zstd frame.
    Zstd,
    /// The node's portable bytes, the own content as is after the header: an upload adopted
    /// as its object (`crate::adopt`). The content starts at `stored_bytes - size`
    /// (`NodeRow::content_offset`); readers start there.
    Portable,
    /// One zstd frame compressed with another node's own content (the row's delta base) as
    /// its dictionary; see `crate::delta`.
    ZstdDelta,
    /// The content with its runs of base64 decoded (`crate::base64_runs`): a pack entry, read
    /// in memory.
    Base64Runs,
}

impl Encoding {
    /// The encodings an object can be read in without another object.
    pub const STANDALONE: [Encoding; 3] = [Encoding::Identity, Encoding::Zstd, Encoding::Portable];

    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Zstd => "zstd",
            Encoding::Portable => "portable",
            Encoding::ZstdDelta => "zstd-delta",
            Encoding::Base64Runs => "base64-runs",
        }
    }

    pub fn parse(s: &str) -> Option<Encoding> {
        match s {
            "identity" => Some(Encoding::Identity),
            "zstd" => Some(Encoding::Zstd),
            "portable" => Some(Encoding::Portable),
            "zstd-delta" => Some(Encoding::ZstdDelta),
            "base64-runs" => Some(Encoding::Base64Runs),
            _ => None,
        }
    }

    /// Whether an object stored this way can be decoded as a stream.
    pub fn streams(self) -> bool {
        Encoding::STANDALONE.contains(&self)
    }

    /// The own content, read from an object stored this way (a portable object read from
    /// its content's offset on). Only encodings that [stream](Encoding::streams) can: the
    /// reader of any other fails (read it through `Service::delta_content`).
    pub fn decode(self, object: ObjectReader) -> ObjectReader {
        match self {
            Encoding::Identity | Encoding::Portable => object,
            Encoding::Zstd => Box::pin(async_compression::tokio::bufread::ZstdDecoder::new(
                tokio::io::BufReader::new(object),
            )),
            Encoding::ZstdDelta | Encoding::Base64Runs => {
                drop(object);
                Box::pin(InMemoryOnly)
            }
        }
    }
}

/// The own content of an object stored as `encoding`, read from its start: the `offset` bytes
/// before the content (a portable object's header) are read past first.
pub async fn content_reader(
    encoding: Encoding,
    mut object: ObjectReader,
    offset: u64,
) -> std::io::Result<ObjectReader> {
    use tokio::io::AsyncReadExt;
    let skipped = tokio::io::copy(&mut (&mut object).take(offset), &mut tokio::io::sink()).await?;
    if skipped < offset {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(encoding.decode(object))
}

/// The reader of an object that is only read in memory (a delta needs its base): every read
/// fails.
struct InMemoryOnly;

impl AsyncRead for InMemoryOnly {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Err(std::io::Error::other(
            "this object is read in memory (a delta with its base)",
        )))
    }
}
/// A request body being stored.
pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// The key of a node's content object.
pub fn node_key(app: &AppId, space: &SpaceId, hash: &Hash, generation: &str) -> String {
    let hex = hash.to_hex();
    let space = space.key_component();
    format!(
        "app.{app}/space.{space}/nodes/{}/{hex}.{generation}",
        &hex[..2]
    )
}

/// The key component of a Space (`space.<id>`; a path Space with `/` written as `~`).
pub fn space_component(space: &SpaceId) -> String {
    format!("space.{}", space.key_component())
}

fn parse_space(component: &str) -> Option<SpaceId> {
    SpaceId::from_key_component(component.strip_prefix("space.")?).ok()
}

/// The prefix of every node object of a partition.
pub fn node_prefix(app: &AppId, space: Option<&SpaceId>) -> String {
    match space {
        Some(space) => format!("app.{app}/{}/nodes/", space_component(space)),
        None => format!("app.{app}/"),
    }
}

/// The key of a pack object.
pub fn pack_key(app: &AppId, space: &SpaceId, pack_id: &str) -> String {
    format!("app.{app}/{}/packs/{pack_id}", space_component(space))
}

/// Parses a pack key back into (app, space, pack id).
pub fn parse_pack_key(key: &str) -> Option<(AppId, SpaceId, String)> {
    let mut parts = key.split('/');
    let app = parts.next()?.strip_prefix("app.")?.parse().ok()?;
    let space = parse_space(parts.next()?)?;
    if parts.next()? != "packs" {
        return None;
    }
    let id = parts.next()?;
    if parts.next().is_some() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some((app, space, id.to_string()))
}

/// The key of an upload generation's temporary object.
pub fn upload_key(app: &AppId, space: &SpaceId, generation: &str) -> String {
    format!("uploads/app.{app}/{}/{generation}", space_component(space))
}

/// Parses a node key back into (app, space, hash, generation).
pub fn parse_node_key(key: &str) -> Option<(AppId, SpaceId, Hash, String)> {
    let mut parts = key.split('/');
    let app = parts.next()?.strip_prefix("app.")?.parse().ok()?;
    let space = parse_space(parts.next()?)?;
    if parts.next()? != "nodes" {
        return None;
    }
    let shard = parts.next()?;
    let (hash, generation) = parts.next()?.split_once('.')?;
    let hash: Hash = hash.parse().ok()?;
    if parts.next().is_some() || shard != &hash.to_hex()[..2] || generation.is_empty() {
        return None;
    }
    Some((app, space, hash, generation.to_string()))
}

/// An object found by a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    pub key: String,
    pub size: u64,
    /// Last modification, ms since the epoch.
    pub modified_ms: i64,
}

/// Why a write-once temporary upload was not stored.
#[derive(Debug, thiserror::Error)]
pub enum PutOnceError {
    #[error("an upload was already stored at this target")]
    Exists,
    #[error("the upload is larger than {0} bytes")]
    TooLarge(u64),
    #[error("the upload body could not be read: {0}")]
    Body(std::io::Error),
    #[error(transparent)]
    Store(#[from] BlobError),
}

/// A failure of the object store (never shown to clients).
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("{op} {key}: {source}")]
    Io {
        op: &'static str,
        key: String,
        source: std::io::Error,
    },
    #[error("{op} {key}: {message}")]
    S3 {
        op: &'static str,
        key: String,
        message: String,
    },
    /// The local disk is below its free-space floor: nothing more is written to it.
    #[error("only {free} bytes are free, below the floor of {floor}")]
    Full { free: u64, floor: u64 },
}

/// Runs blocking filesystem work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)?
}

/// A presigned request a client can make directly to the object store.
#[derive(Debug, Clone)]
pub struct Presigned {
    pub url: String,
    pub headers: Vec<(String, String)>,
}

/// Told of every object-store request: its operation, whether it succeeded, how long it took.
pub type StoreObserver = Arc<dyn Fn(&'static str, bool, Duration) + Send + Sync>;

#[derive(Debug, Clone)]
enum Backend {
    Fs(FsStore),
    S3(S3Store),
}

/// The object store.
#[derive(Clone)]
pub struct BlobStore {
    backend: Backend,
    observer: Option<StoreObserver>,
}

impl std::fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStore")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl BlobStore {
    /// Opens the store named by the configuration.
    pub async fn open(config: &Config) -> anyhow::Result<Self> {
        let url = config.blob_store()?;
        let backend = match url.strip_prefix("file://") {
            Some(path) => Backend::Fs(FsStore::open(Path::new(path), config.min_free_bytes)?),
            None => Backend::S3(S3Store::open(config, &url).await?),
        };
        Ok(BlobStore {
            backend,
            observer: None,
        })
    }

    /// The store, telling `observer` of every request.
    pub fn observed(self, observer: StoreObserver) -> Self {
        BlobStore {
            observer: Some(observer),
            ..self
        }
    }

    /// Runs one request of `operation`, timed for the observer.
    async fn timed<T, E>(
        &self,
        operation: &'static str,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let result = request.await;
        if let Some(o) = &self.observer {
            o(operation, result.is_ok(), started.elapsed());
        }
        result
    }

    /// Where spool files live: on the same filesystem as the objects when they are files, so
    /// that publishing is a rename.
    pub fn spool(&self) -> &Spool {
        match &self.backend {
            Backend::Fs(fs) => fs.spool(),
            Backend::S3(s3) => s3.spool(),
        }
    }

    /// Whether temporary uploads should go to a presigned URL of the store itself.
    pub fn presigns(&self) -> bool {
        matches!(self.backend, Backend::S3(_))
    }

    /// A presigned write-once PUT of `key`, valid for `expires_in_ms`; with `length`, the
    /// signature also binds the body's length.
    pub async fn presign_put_once(
        &self,
        key: &str,
        expires_in_ms: u64,
        length: Option<u64>,
    ) -> Result<Option<Presigned>, BlobError> {
        match &self.backend {
            Backend::Fs(_) => Ok(None),
            Backend::S3(s3) => s3
                .presign_put_once(key, expires_in_ms, length)
                .await
                .map(Some),
        }
    }

    /// Stores `body` at `key` unless something is already there; at most `max` bytes.
    pub async fn put_once(
        &self,
        key: &str,
        body: BodyStream,
        max: u64,
    ) -> Result<u64, PutOnceError> {
        self.timed("put_once", async {
            match &self.backend {
                Backend::Fs(fs) => fs.put_once(key, body, max).await,
                Backend::S3(s3) => s3.put_once(key, body, max).await,
            }
        })
        .await
    }

    /// The upload at `key` held open, to be read where it lies and then adopted as an object
    /// ([`BlobStore::adopt`]); `None` when nothing is there, and always on a store whose
    /// objects are not files (S3), where an upload is read and its object written anew or
    /// copied within the store ([`BlobStore::copy_staged`]).
    pub async fn hold_upload(&self, key: &str) -> Result<Option<HeldUpload>, BlobError> {
        match &self.backend {
            Backend::Fs(fs) => self.timed("get", fs.hold_upload(key)).await,
            Backend::S3(_) => Ok(None),
        }
    }

    /// Makes a held upload the object at `key`, durably (on the filesystem, a checked hard
    /// link: its bytes are not written again).
    pub async fn adopt(&self, held: &HeldUpload, key: &str) -> Result<(), BlobError> {
        self.timed("adopt", async {
            match &self.backend {
                Backend::Fs(fs) => fs.adopt(held, key).await,
                Backend::S3(_) => Err(BlobError::S3 {
                    op: "adopt",
                    key: key.to_string(),
                    message: "uploads are adopted only on the filesystem".to_string(),
                }),
            }
        })
        .await
    }

    /// Stores a finished spool file at `key`, consuming it (a rename on the filesystem).
    pub async fn put_file(&self, key: &str, file: SpoolFile, len: u64) -> Result<(), BlobError> {
        self.timed("put", async {
            match &self.backend {
                Backend::Fs(fs) => fs.put_file(key, file).await,
                Backend::S3(s3) => s3.put_file(key, file, len).await,
            }
        })
        .await
    }

    /// Stores `bytes` held in memory at `key`: on the filesystem one blocking task writes,
    /// fsyncs and renames them into place; on S3 they are the body of one PUT, not spooled.
    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BlobError> {
        self.timed("put", async {
            match &self.backend {
                Backend::Fs(fs) => fs.put_bytes(key, bytes).await,
                Backend::S3(s3) => s3.put_bytes(key, bytes).await,
            }
        })
        .await
    }

    /// Stores each `(key, bytes)`; one result per item, in order, each item failing alone. On
    /// the filesystem a few blocking tasks write, fsync and rename them, then each directory
    /// that took one is fsynced once (one `put_many` request of the metrics); on S3 each is
    /// the body of its own PUT, [`PUTS_AT_ONCE`] at a time.
    pub async fn put_many_bytes(&self, items: Vec<(String, Bytes)>) -> Vec<Result<(), BlobError>> {
        use futures_util::StreamExt;
        match &self.backend {
            Backend::Fs(fs) => {
                let started = Instant::now();
                let results = fs.put_many_bytes(items).await;
                self.observe_many("put_many", &results, started);
                results
            }
            Backend::S3(_) => {
                futures_util::stream::iter(items)
                    .map(|(key, bytes)| async move { self.put_bytes(&key, bytes).await })
                    .buffered(PUTS_AT_ONCE)
                    .collect()
                    .await
            }
        }
    }

    /// The object at `key`, or `None` if there is none. With `range`, bytes `start..end`.
    pub async fn get(
        &self,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Option<(ObjectReader, u64)>, BlobError> {
        self.timed("get", async {
            match &self.backend {
                Backend::Fs(fs) => fs.get(key, range).await,
                Backend::S3(s3) => s3.get(key, range).await,
            }
        })
        .await
    }

    /// Deletes `key`; a missing object is fine.
    pub async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.timed("delete", async {
            match &self.backend {
                Backend::Fs(fs) => fs.delete(key).await,
                Backend::S3(s3) => s3.delete(key).await,
            }
        })
        .await
    }

    /// Deletes `keys` (a missing object is fine); one result per key, in order. On S3 one
    /// `DeleteObjects` request per 1,000 keys; on the filesystem one blocking task for all.
    pub async fn delete_many(&self, keys: &[String]) -> Vec<Result<(), BlobError>> {
        let started = Instant::now();
        let results = match &self.backend {
            Backend::Fs(fs) => fs.delete_many(keys).await,
            Backend::S3(s3) => s3.delete_many(keys).await,
        };
        self.observe_many("delete_many", &results, started);
        results
    }

    /// Reports one request over many objects (none when there were none): `ok` when every
    /// object's was.
    fn observe_many(
        &self,
        operation: &'static str,
        results: &[Result<(), BlobError>],
        started: Instant,
    ) {
        if let Some(o) = &self.observer
            && !results.is_empty()
        {
            o(
                operation,
                results.iter().all(Result::is_ok),
                started.elapsed(),
            );
        }
    }

    /// Every object under `prefix`.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ListedObject>, BlobError> {
        self.timed("list", async {
            match &self.backend {
                Backend::Fs(fs) => fs.list(prefix).await,
                Backend::S3(s3) => s3.list(prefix).await,
            }
        })
        .await
    }

    /// Whether the store answers.
    pub async fn ping(&self) -> bool {
        match &self.backend {
            Backend::Fs(fs) => fs.ping().await,
            Backend::S3(s3) => s3.ping().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_keys_parse_back() {
        let app: AppId = "..".parse().unwrap();
        let space: SpaceId = "s-1".parse().unwrap();
        let h = Hash::digest(b"x");
        let key = node_key(&app, &space, &h, "01J0");
        assert!(!key.split('/').any(|c| c == ".." || c == "."));
        assert_eq!(
            parse_node_key(&key),
            Some((app.clone(), space.clone(), h, "01J0".into()))
        );
        assert_eq!(parse_node_key("app.a/space.b/nodes/zz/x.y"), None);
        let pack = pack_key(&app, &space, "01J0");
        assert_eq!(
            parse_pack_key(&pack),
            Some((app.clone(), space, "01J0".into()))
        );
        assert_eq!(parse_node_key(&pack), None);
        assert_eq!(parse_pack_key("app.a/space.b/packs/../x"), None);
        // A path Space is one component of its keys.
        let path: SpaceId = "/team/notes".parse().unwrap();
        let key = node_key(&app, &path, &h, "01J0");
        assert!(key.starts_with("app.../space.~team~notes/nodes/"), "{key}");
        assert_eq!(
            parse_node_key(&key),
            Some((app.clone(), path.clone(), h, "01J0".into()))
        );
        let pack = pack_key(&app, &path, "01J0");
        assert_eq!(
            parse_pack_key(&pack),
            Some((app.clone(), path.clone(), "01J0".into()))
        );
        assert_eq!(
            upload_key(&app, &path, "01J0"),
            "uploads/app.../space.~team~notes/01J0"
        );
        assert!(node_prefix(&app, Some(&path)).ends_with("space.~team~notes/nodes/"));
    }
}
