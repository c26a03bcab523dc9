//! Reading catalog snapshots (cached by node hash: immutable, so never stale) and committing
//! a change as a new snapshot under the catalog lock.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use cas_format::{Hash, Value};
use futures_util::{StreamExt, TryStreamExt};

use super::{Catalog, CatalogV1, ProjectEntry, SCHEMA_VERSION, catalog_space, from_value};
use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids;
use crate::lock::LockKey;
use crate::outbox::{Effect, Payload, Pending};
use crate::store::SnapshotRow;

/// Parsed catalog nodes by hash (immutable, so never stale), bounded in bytes: project entries
/// by the size of their node, and the last few snapshots (which share their projects).
pub struct SnapshotCache {
    inner: std::sync::Mutex<CacheInner>,
    max_bytes: usize,
}

#[derive(Default)]
struct CacheInner {
    snapshots: VecDeque<(Hash, Arc<Catalog>)>,
    projects: HashMap<Hash, (Arc<ProjectEntry>, usize)>,
    order: VecDeque<Hash>,
    bytes: usize,
}

/// Snapshots kept parsed (each shares its projects with the others).
const SNAPSHOTS_KEPT: usize = 4;

impl SnapshotCache {
    pub fn new(max_bytes: usize) -> Self {
        SnapshotCache {
            inner: std::sync::Mutex::new(CacheInner::default()),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn snapshot(&self, h: &Hash) -> Option<Arc<Catalog>> {
        self.lock()
            .snapshots
            .iter()
            .find(|(k, _)| k == h)
            .map(|(_, c)| c.clone())
    }

    fn put_snapshot(&self, h: Hash, c: Arc<Catalog>) {
        let mut inner = self.lock();
        inner.snapshots.retain(|(k, _)| *k != h);
        inner.snapshots.push_back((h, c));
        while inner.snapshots.len() > SNAPSHOTS_KEPT {
            inner.snapshots.pop_front();
        }
    }

    fn project(&self, h: &Hash) -> Option<Arc<ProjectEntry>> {
        self.lock().projects.get(h).map(|(p, _)| p.clone())
    }

    fn put_project(&self, h: Hash, p: Arc<ProjectEntry>, size: usize) {
        let mut inner = self.lock();
        if size > self.max_bytes / 4 || inner.projects.contains_key(&h) {
            return;
        }
        inner.projects.insert(h, (p, size));
        inner.order.push_back(h);
        inner.bytes += size;
        while inner.bytes > self.max_bytes {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, n)) = inner.projects.remove(&old) {
                inner.bytes -= n;
            }
        }
    }
}

fn kind_of(v: &Value) -> Option<&str> {
    v.get("kind").and_then(Value::as_str)
}

impl Hub {
    async fn read_catalog_node(&self, hash: &Hash) -> HubResult<(Value, usize)> {
        let content = self.cas()?.read_svalue_node(&catalog_space(), hash).await?;
        let (value, _) = cas_format::svalue::decode(&content)
            .map_err(|e| HubError::internal("a catalog node cannot be decoded", e))?;
        Ok((value, content.len()))
    }

    async fn load_project(&self, hash: Hash) -> HubResult<Arc<ProjectEntry>> {
        if let Some(p) = self.snapshots.project(&hash) {
            return Ok(p);
        }
        let (value, size) = self.read_catalog_node(&hash).await?;
        if kind_of(&value) != Some("hub-project") {
            return Err(HubError::internal(
                "a catalog part lists a node that is no project",
                hash,
            ));
        }
        let entry: ProjectEntry = value
            .get("project")
            .ok_or_else(|| "no project".to_string())
            .and_then(from_value)
            .map_err(|e| HubError::internal("a project node cannot be read", e))?;
        let entry = Arc::new(entry);
        self.snapshots.put_project(hash, entry.clone(), size);
        Ok(entry)
    }

    pub(crate) async fn load_snapshot(&self, hash: &Hash) -> HubResult<Arc<Catalog>> {
        if let Some(c) = self.snapshots.snapshot(hash) {
            return Ok(c);
        }
        let (root, _) = self.read_catalog_node(hash).await?;
        let text = |k: &str| root.get(k).and_then(Value::as_str).map(str::to_string);
        let schema = root
            .get("schema_version")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if schema > i64::from(SCHEMA_VERSION) {
            return Err(HubError::internal(
                "a catalog snapshot is newer than this hub understands; upgrade the hub",
                schema,
            ));
        }
        let catalog = if kind_of(&root) == Some("hub-catalog") {
            let parts: Vec<Hash> = root
                .get("parts")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_blob).collect())
                .unwrap_or_default();
            let mut project_nodes = Vec::new();
            for part in parts {
                let (value, _) = self.read_catalog_node(&part).await?;
                if kind_of(&value) != Some("hub-catalog-part") {
                    return Err(HubError::internal(
                        "a catalog root lists a node that is no part",
                        part,
                    ));
                }
                project_nodes.extend(
                    value
                        .get("projects")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_blob).collect::<Vec<_>>())
                        .unwrap_or_default(),
                );
            }
            let projects: Vec<Arc<ProjectEntry>> =
                futures_util::stream::iter(project_nodes.iter().copied())
                    .map(|h| self.load_project(h))
                    .buffered(16)
                    .try_collect()
                    .await?;
            Catalog {
                snapshot_id: text("snapshot_id").unwrap_or_default(),
                created_at: text("created_at").unwrap_or_default(),
                operation: text("operation").unwrap_or_default(),
                actor: text("actor").unwrap_or_default(),
                previous_snapshot_id: text("previous_snapshot_id"),
                nodes: project_nodes.into_iter().map(Some).collect(),
                projects,
            }
        } else {
            // Schema version 1: one node; its projects are encoded on the next change.
            let v1: CatalogV1 = from_value(&root)
                .map_err(|e| HubError::internal("a catalog snapshot cannot be read", e))?;
            let _ = v1.schema_version;
            Catalog {
                snapshot_id: v1.snapshot_id,
                created_at: v1.created_at,
                operation: v1.operation,
                actor: v1.actor,
                previous_snapshot_id: v1.previous_snapshot_id,
                nodes: vec![None; v1.projects.len()],
                projects: v1.projects.into_iter().map(Arc::new).collect(),
            }
        };
        let c = Arc::new(catalog);
        self.snapshots.put_snapshot(*hash, c.clone());
        Ok(c)
    }

    /// The current catalog (one head read; nodes from cache or read once).
    pub async fn catalog(&self) -> HubResult<Arc<Catalog>> {
        match self.store.catalog_head().await? {
            Some(h) => self.load_snapshot(&h.hash).await,
            None => Err(HubError::unavailable("the catalog is not initialized yet")),
        }
    }

    /// Creates the first (empty) snapshot if there is none.
    pub async fn init_catalog(&self) -> HubResult<()> {
        if self.store.catalog_head().await?.is_some() {
            return Ok(());
        }
        self.mutate_catalog("system", "catalog.init", |_| Ok(((), Vec::new())))
            .await
    }

    /// Applies `f` to a copy of the current catalog and commits it as the new snapshot. `f`
    /// returns its result and the local effects that commit with the snapshot.
    pub async fn mutate_catalog<T>(
        &self,
        actor: &str,
        operation: &str,
        f: impl FnOnce(&mut Catalog) -> HubResult<(T, Vec<Effect>)>,
    ) -> HubResult<T> {
        self.with_lock(&LockKey::catalog(), async || {
            self.mutate_catalog_locked(actor, operation, f).await
        })
        .await
    }

    /// As [`Self::mutate_catalog`], for a caller that already holds the catalog lock.
    pub(crate) async fn mutate_catalog_locked<T>(
        &self,
        actor: &str,
        operation: &str,
        f: impl FnOnce(&mut Catalog) -> HubResult<(T, Vec<Effect>)>,
    ) -> HubResult<T> {
        let head = self.store.catalog_head().await?;
        let (mut next, expected_seq) = match &head {
            Some(h) => ((*self.load_snapshot(&h.hash).await?).clone(), h.seq),
            None => (Catalog::default(), 0),
        };
        let (out, effects) = f(&mut next)?;
        let previous = (!next.snapshot_id.is_empty()).then(|| next.snapshot_id.clone());
        self.commit_catalog(next, expected_seq, previous, actor, operation, effects)
            .await?;
        Ok(out)
    }

    /// Writes `next` as a new snapshot after `previous` and moves the head to it from
    /// `expected_seq`, with `effects`; the caller holds the catalog lock. The new snapshot's
    /// root ref is taken; the old ones stay held until the retention pass releases them.
    pub(crate) async fn commit_catalog(
        &self,
        mut next: Catalog,
        expected_seq: i64,
        previous: Option<String>,
        actor: &str,
        operation: &str,
        effects: Vec<Effect>,
    ) -> HubResult<()> {
        let now = ids::now_ms();
        next.snapshot_id = ids::snapshot_id();
        next.created_at = ids::rfc3339(now);
        next.operation = operation.to_string();
        next.actor = actor.to_string();
        next.previous_snapshot_id = previous;
        let encoded = next.encode(self.config.project_max_bytes)?;
        let hash = encoded.root;
        let space = catalog_space();
        self.cas()?
            .store_dag(&space, &encoded.nodes, &[hash], self.config.lease_ms, 8)
            .await
            .map_err(|e| match e.status() {
                Some(413) => HubError::quota(
                    "project_bytes",
                    self.config.project_max_bytes,
                    "the content store refused a project's metadata as too large",
                ),
                _ => e.into(),
            })?;
        let history = SnapshotRow {
            snapshot_id: next.snapshot_id.clone(),
            hash,
            created_at_ms: now,
            operation: operation.to_string(),
            actor: actor.to_string(),
            previous_snapshot_id: next.previous_snapshot_id.clone(),
            released_at_ms: None,
        };
        let pending = Pending {
            request_id: format!("hub:catalog:{}", next.snapshot_id),
            lock_key: LockKey::catalog(),
            space,
            changes: std::collections::BTreeMap::from([(hash, 1i64)]),
            payload: Payload::Catalog {
                expected_seq,
                snapshot_id: next.snapshot_id.clone(),
                snapshot_hash: hash,
                effects,
                history: Some(history),
            },
            root_node: Some(encoded.root_node),
        };
        self.record_and_complete(&pending).await?;
        self.snapshots.put_snapshot(hash, Arc::new(next));
        Ok(())
    }
}
