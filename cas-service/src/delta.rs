//! Encoding at rest: compression, and deltas against a similar node.
//!
//! A lease may name a `deltaBase`: a node of the same partition that the new one probably
//! resembles (the previous version of the same file or cell). When the base is ready, no
//! larger than `delta_max_bytes`, and its chain leaves room under `delta_max_depth`, the new
//! node's own content is compressed with the base's content as a zstd dictionary, and stored so
//! (`Encoding::ZstdDelta`, the row naming the base) when that is clearly smaller than
//! compressing it alone. Otherwise the content is compressed alone, or kept as it is (the
//! choice is `crate::encode`'s).
//!
//! A read of a delta reads its chain of bases down to one that stands alone (or to one whose
//! content is cached), decodes upward, and verifies every content it rebuilds against its node
//! hash before using or caching it: a damaged object, base or row gives an error, never other
//! bytes. Zstd frames carry their content checksum too.
//!
//! A base stays readable while a dependent needs it: publishing a delta requires its base to be
//! ready in the same transaction, and GC, once it has marked a base, stores its ready
//! dependents alone before it deletes the base's object (`crate::gc`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bytes::Bytes;
use cas_format::{AppId, ContentType, Hash, NodeDescriptor, SpaceId};

use crate::Service;
use crate::blob::Encoding;
use crate::error::{ApiError, ApiResult};
use crate::meta::{DeltaBase, NodeRow};

/// Content up to this size is encoded in memory (larger content is compressed as a stream).
pub(crate) const IN_MEMORY_MAX: u64 = 4 << 20;

/// Most rows a delta chain holds (the node and its bases): `delta_max_depth` is at most 64.
const MAX_CHAIN: usize = 65;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    app: AppId,
    space: SpaceId,
    item: Item,
}

/// What a cache entry holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Item {
    /// A node's verified content.
    Node(Hash),
    /// The decoded content of a pack's block (pack id, block offset): checked by its frame's
    /// checksum; the nodes read from it are verified each.
    Block(String, i64),
}

impl Key {
    fn new(app: &AppId, space: &SpaceId, item: Item) -> Key {
        Key {
            app: app.clone(),
            space: space.clone(),
            item,
        }
    }
}

/// Verified node contents by (App, Space, hash), and decoded pack blocks, least recently used
/// first out, bounded in bytes. A node's content and a pack's block never change (a pack id is
/// never reused), so an entry is never stale.
#[derive(Debug)]
pub struct BaseCache {
    max_bytes: usize,
    inner: Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    entries: HashMap<Key, (Bytes, u64)>,
    /// Keys in order of use; an element whose tick differs from its entry's is stale.
    order: VecDeque<(Key, u64)>,
    bytes: usize,
    tick: u64,
}

impl BaseCache {
    pub fn new(max_bytes: u64) -> Self {
        BaseCache {
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, app: &AppId, space: &SpaceId, hash: &Hash) -> Option<Bytes> {
        self.get_item(Key::new(app, space, Item::Node(*hash)))
    }

    pub fn put(&self, app: &AppId, space: &SpaceId, hash: &Hash, content: Bytes) {
        self.put_item(Key::new(app, space, Item::Node(*hash)), content)
    }

    /// A pack block's decoded content.
    pub fn block(&self, app: &AppId, space: &SpaceId, pack: &str, offset: i64) -> Option<Bytes> {
        self.get_item(Key::new(app, space, Item::Block(pack.to_string(), offset)))
    }

    pub fn put_block(&self, app: &AppId, space: &SpaceId, pack: &str, offset: i64, block: Bytes) {
        self.put_item(
            Key::new(app, space, Item::Block(pack.to_string(), offset)),
            block,
        )
    }

    fn get_item(&self, key: Key) -> Option<Bytes> {
        let mut inner = self.lock();
        let tick = inner.next_tick();
        let content = {
            let entry = inner.entries.get_mut(&key)?;
            entry.1 = tick;
            entry.0.clone()
        };
        inner.order.push_back((key, tick));
        inner.compact();
        Some(content)
    }

    fn put_item(&self, key: Key, content: Bytes) {
        if content.len() > self.max_bytes / 4 {
            return;
        }
        let mut inner = self.lock();
        let tick = inner.next_tick();
        let len = content.len();
        if let Some(old) = inner.entries.insert(key.clone(), (content, tick)) {
            inner.bytes -= old.0.len();
        }
        inner.bytes += len;
        inner.order.push_back((key, tick));
        while inner.bytes > self.max_bytes {
            let Some((key, tick)) = inner.order.pop_front() else {
                break;
            };
            if inner.entries.get(&key).is_some_and(|e| e.1 == tick)
                && let Some((gone, _)) = inner.entries.remove(&key)
            {
                inner.bytes -= gone.len();
            }
        }
        inner.compact();
    }

    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl CacheInner {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Drops stale order elements once they outnumber the entries.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order
                .retain(|(k, t)| entries.get(k).is_some_and(|e| e.1 == *t));
        }
    }
}

/// Why a node's content could not be rebuilt.
pub(crate) enum ContentError {
    /// An object of the chain is gone: GC re-encoded or collected something meanwhile, and the
    /// rows should be read again.
    Moved,
    Failed(ApiError),
}

impl From<ApiError> for ContentError {
    fn from(e: ApiError) -> Self {
        ContentError::Failed(e)
    }
}

impl From<sqlx::Error> for ContentError {
    fn from(e: sqlx::Error) -> Self {
        ContentError::Failed(e.into())
    }
}

pub(crate) fn integrity(detail: String) -> ApiError {
    ApiError::internal("reading a node", detail)
}

/// Decodes a delta frame of a node of `size` bytes against its base's content.
fn decode_delta(frame: &[u8], base: &[u8], size: usize) -> std::io::Result<Vec<u8>> {
    let mut d = zstd::bulk::Decompressor::with_dictionary(base)?;
    let out = d.decompress(frame, size)?;
    if out.len() != size {
        return Err(std::io::Error::other(format!(
            "the delta decodes to {} bytes, not {size}",
            out.len()
        )));
    }
    Ok(out)
}

impl Service {
    /// The base a new node `hash` of `size` bytes may be stored against, with its content:
    /// `None` when deltas are off, the hint is unusable (not ready here, too large, its chain
    /// too deep) or the node already has a row (a node made ready again keeps out of chains
    /// that may run through it).
    pub(crate) async fn delta_base(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        size: u64,
        hint: Option<Hash>,
    ) -> ApiResult<Option<(Bytes, DeltaBase)>> {
        let max_depth = self.config.delta_max_depth as i64;
        let max_bytes = self.config.delta_max_bytes.min(IN_MEMORY_MAX);
        let Some(hint) = hint else { return Ok(None) };
        if max_depth == 0 || hint == *hash || size > max_bytes {
            return Ok(None);
        }
        let Some(base) = self.meta.node(app, space, &hint).await? else {
            return Ok(None);
        };
        let depth = base.delta.map_or(0, |d| d.depth) + 1;
        if !base.is_ready() || base.size as u64 > max_bytes || depth > max_depth {
            return Ok(None);
        }
        if self.meta.node(app, space, hash).await?.is_some() {
            return Ok(None);
        }
        match self.stored_content(app, space, &base).await {
            Ok(content) => Ok(Some((content, DeltaBase { hash: hint, depth }))),
            Err(ContentError::Moved) => Ok(None),
            Err(ContentError::Failed(e)) => {
                tracing::warn!(base = %hint, error = %e.message, "a delta base could not be read; storing alone");
                Ok(None)
            }
        }
    }

    /// The whole own content of a node (ready or being collected), rebuilt through its delta
    /// chain and verified. Content up to [`IN_MEMORY_MAX`] only.
    pub(crate) async fn stored_content(
        &self,
        app: &AppId,
        space: &SpaceId,
        row: &NodeRow,
    ) -> Result<Bytes, ContentError> {
        self.rebuild(app, space, row, true).await
    }

    /// As [`Service::stored_content`]; without `cached`, every object of the chain is read
    /// and checked (what `fsck` does).
    pub(crate) async fn rebuild(
        &self,
        app: &AppId,
        space: &SpaceId,
        row: &NodeRow,
        cached: bool,
    ) -> Result<Bytes, ContentError> {
        let cache = |hash: &Hash| cached.then(|| self.bases.get(app, space, hash)).flatten();
        if let Some(c) = cache(&row.hash) {
            return Ok(c);
        }
        // The chain, top first, down to a node that stands alone or whose content is cached.
        // Its length is checked against the deepest chain any setting writes, not the current
        // one: chains written under a larger `delta_max_depth` stay readable.
        let mut chain: Vec<NodeRow> = vec![row.clone()];
        let mut below: Option<Bytes> = None;
        while let Some(d) = chain.last().and_then(|r| r.delta) {
            if chain.len() > MAX_CHAIN {
                return Err(integrity(format!(
                    "the delta chain of {} is longer than any this service writes (a cycle?)",
                    row.hash
                ))
                .into());
            }
            if let Some(c) = cache(&d.hash) {
                below = Some(c);
                break;
            }
            let Some(base) = self.meta.node(app, space, &d.hash).await? else {
                return Err(ContentError::Moved);
            };
            chain.push(base);
        }
        let mut content = match below {
            Some(c) => c,
            None => {
                let bottom = chain.pop().ok_or_else(|| {
                    ContentError::Failed(integrity("an empty delta chain".into()))
                })?;
                let object = self.object_bytes(app, space, &bottom, cached).await?;
                let decoded = match bottom.encoding {
                    Encoding::Identity => object,
                    Encoding::Portable => {
                        let offset = bottom.content_offset() as usize;
                        if object.len() < offset {
                            return Err(integrity(format!(
                                "the object of {} is shorter than its header",
                                bottom.hash
                            ))
                            .into());
                        }
                        object.slice(offset..)
                    }
                    Encoding::Zstd => {
                        let size = bottom.size as usize;
                        let frame = object;
                        tokio::task::spawn_blocking(move || zstd::bulk::decompress(&frame, size))
                            .await
                            .map_err(|e| ApiError::internal("decompressing an object", e))?
                            .map(Bytes::from)
                            .map_err(|e| integrity(format!("{}: {e}", bottom.hash)))?
                    }
                    Encoding::Base64Runs => {
                        let size = bottom.size as usize;
                        crate::base64_runs::expand(&object, size)
                            .map(Bytes::from)
                            .map_err(|e| integrity(format!("{}: {e}", bottom.hash)))?
                    }
                    Encoding::ZstdDelta => {
                        return Err(integrity(format!(
                            "{} is stored as a delta without a base",
                            bottom.hash
                        ))
                        .into());
                    }
                };
                self.verified(app, space, &bottom, decoded).await?
            }
        };
        while let Some(r) = chain.pop() {
            let frame = self.object_bytes(app, space, &r, cached).await?;
            let size = r.size as usize;
            let base = content;
            let decoded = tokio::task::spawn_blocking(move || decode_delta(&frame, &base, size))
                .await
                .map_err(|e| ApiError::internal("decoding a delta", e))?
                .map_err(|e| integrity(format!("the delta of {}: {e}", r.hash)))?;
            content = self.verified(app, space, &r, Bytes::from(decoded)).await?;
        }
        Ok(content)
    }

    /// `content` if it is the node's (its hash over the row's type and refs), cached.
    async fn verified(
        &self,
        app: &AppId,
        space: &SpaceId,
        row: &NodeRow,
        content: Bytes,
    ) -> Result<Bytes, ContentError> {
        let refs = if row.ref_count > 0 {
            self.meta.node_refs(app, space, &row.hash).await?
        } else {
            Vec::new()
        };
        let ct = ContentType::new(row.content_type.clone())
            .map_err(|e| integrity(format!("{}: {e}", row.hash)))?;
        let got = NodeDescriptor::new(ct, refs, content.len() as u64)
            .hash_of(&content)
            .map_err(|e| integrity(format!("{}: {e}", row.hash)))?;
        if got != row.hash {
            return Err(integrity(format!(
                "the content rebuilt for {} hashes to {got}",
                row.hash
            ))
            .into());
        }
        if (content.len() as u64) <= self.config.delta_max_bytes {
            self.bases.put(app, space, &row.hash, content.clone());
        }
        Ok(content)
    }

    /// One of the permits that bound content held in memory (a node, its base and its
    /// encoding: at most three times [`IN_MEMORY_MAX`] each).
    pub(crate) async fn in_memory_permit(&self) -> ApiResult<tokio::sync::SemaphorePermit<'_>> {
        self.in_memory
            .acquire()
            .await
            .map_err(|_| ApiError::unavailable("shutting down"))
    }

    /// The content of a ready node read through its delta chain: the rows are read again and
    /// the chain retried when GC moved an object meanwhile.
    pub(crate) async fn delta_content(
        &self,
        app: &AppId,
        space: &SpaceId,
        mut row: NodeRow,
    ) -> ApiResult<(NodeRow, Bytes)> {
        let _permit = self.in_memory_permit().await?;
        for _ in 0..4 {
            match self.stored_content(app, space, &row).await {
                Ok(content) => return Ok((row, content)),
                Err(ContentError::Failed(e)) => return Err(e),
                Err(ContentError::Moved) => match self.meta.node(app, space, &row.hash).await? {
                    Some(again) if again.is_ready() => {
                        if again == row {
                            // Nothing moved: a base or object is missing for good.
                            return Err(integrity(format!(
                                "an object of the delta chain of {} is missing",
                                row.hash
                            )));
                        }
                        row = again;
                    }
                    _ => {
                        return Err(ApiError::not_found(
                            "NODE_NOT_FOUND",
                            "no ready node with this hash",
                        ));
                    }
                },
            }
        }
        Err(ApiError::unavailable(
            "the node's storage kept changing while it was read; retry",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::encode_both;

    fn text(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                b"abcdefghij klmnop\n"[(x >> 59) as usize % 18]
            })
            .collect()
    }

    #[test]
    fn a_delta_decodes_only_with_its_base() {
        let base = text(1, 20_000);
        let mut next = base.clone();
        next[10_000..10_010].copy_from_slice(b"0123456789");
        let (alone, delta) = encode_both(&next, Some(&base), 3, false);
        let (alone, delta) = (alone.unwrap(), delta.unwrap());
        assert!(
            delta.len() * 20 < alone.len(),
            "{} vs {}",
            delta.len(),
            alone.len()
        );
        assert_eq!(decode_delta(&delta, &base, next.len()).unwrap(), next);
        // Another base: the checksum (or the frame) refuses it.
        let other = text(2, 20_000);
        assert!(decode_delta(&delta, &other, next.len()).is_err());
        // A damaged frame is refused too.
        let mut damaged = delta.clone();
        let mid = damaged.len() / 2;
        damaged[mid] ^= 0x55;
        assert!(decode_delta(&damaged, &base, next.len()).is_err());
        // A size the frame does not decode to is refused.
        assert!(decode_delta(&delta, &base, next.len() - 1).is_err());
    }

    #[test]
    fn the_cache_is_bounded_and_keeps_what_is_used() {
        let cache = BaseCache::new(4096);
        let app: AppId = "app".parse().unwrap();
        let space: SpaceId = "s".parse().unwrap();
        let h = |i: u8| Hash::digest(&[i]);
        for i in 0..8u8 {
            cache.put(&app, &space, &h(i), Bytes::from(vec![i; 1000]));
            // The first stays in use.
            assert!(cache.get(&app, &space, &h(0)).is_some(), "{i}");
            assert!(cache.bytes() <= 4096);
        }
        assert!(cache.get(&app, &space, &h(1)).is_none());
        assert!(cache.get(&app, &space, &h(7)).is_some());
        // Another partition does not see it.
        let other: SpaceId = "t".parse().unwrap();
        assert!(cache.get(&app, &other, &h(7)).is_none());
        // Too large for the cache: not kept.
        cache.put(&app, &space, &h(9), Bytes::from(vec![0; 2000]));
        assert!(cache.get(&app, &space, &h(9)).is_none());
    }
}
