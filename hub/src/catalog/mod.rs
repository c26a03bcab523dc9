//! The catalog: every project and notebook with its metadata, as immutable nodes in the hub's
//! catalog Space: one node per project (its metadata and its notebooks' entries), part nodes
//! that list up to [`FANOUT`] project nodes each, and a root node (the snapshot) that lists the
//! parts. The only mutable part is the head row naming the current root. A mutation encodes
//! again only the projects it changed (plus the small part and root nodes), writes the new
//! root, retains it and releases the old one in one root-ref update (new +1, old −1), and
//! swaps the head with an optimistic check on its sequence number, all while holding the
//! catalog lock. A change costs what the touched project costs, and no project's size can make
//! another's changes fail: each project has stated limits ([`crate::config::HubConfig`]).
//! Listing everything is one head read plus the nodes not already cached.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cas_format::{Hash, SpaceId, Value};
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::ToSchema;

use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids;
use crate::outbox::{Effect, Payload, Pending};

/// The Space holding catalog snapshots (project Spaces are their project ids).
pub const CATALOG_SPACE: &str = "hub.catalog";
pub const CATALOG_LOCK: &str = "catalog";
/// Version 1 was one node holding everything; version 2 is root, parts and project nodes.
pub const SCHEMA_VERSION: u32 = 2;
/// Project nodes per part node, and part nodes per root.
pub const FANOUT: usize = 128;
/// Most projects a catalog can list.
pub const MAX_CATALOG_PROJECTS: usize = FANOUT * FANOUT;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Editor,
    Manager,
    /// The project owner (and super admins).
    Admin,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Member {
    pub user_id: String,
    pub role: Role,
}

/// Where a notebook's code comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Source {
    /// Saved through the API.
    Local {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entry_notebook: Option<String>,
    },
    /// Pushed by an external workflow (`/api/sync/git/v1`).
    Git {
        provider: String,
        sync_mode: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entry_notebook: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repository: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        branch: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NotebookEntry {
    pub id: String,
    pub title: String,
    pub description: String,
    /// `draft`, `active`, `archived`, or `deleted` (in the trash).
    pub status: String,
    pub author: String,
    pub created_at: String,
    pub updated_at: String,
    pub tags: Vec<String>,
    pub source: Source,
    /// The status before deletion, restored with the notebook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub status_before_delete: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProjectEntry {
    pub id: String,
    pub name: String,
    pub description: String,
    pub owner: String,
    pub members: Vec<Member>,
    pub created_at: String,
    pub updated_at: String,
    pub tags: Vec<String>,
    pub notebooks: Vec<NotebookEntry>,
}

/// One catalog snapshot. Its projects are shared with other snapshots (`Arc`), and each
/// remembers the node it was read from until it is changed.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub snapshot_id: String,
    pub created_at: String,
    pub operation: String,
    pub actor: String,
    pub previous_snapshot_id: Option<String>,
    projects: Vec<Arc<ProjectEntry>>,
    /// The node each project was read from or last written as; `None` once it changed.
    nodes: Vec<Option<Hash>>,
}

/// The nodes a catalog change writes, and its root.
pub struct Encoded {
    pub nodes: HashMap<Hash, Bytes>,
    pub root: Hash,
    pub root_node: Bytes,
}

fn to_value<T: Serialize>(v: &T) -> Result<Value, String> {
    let json = serde_json::to_value(v).map_err(|e| e.to_string())?;
    serde_json::from_value(json).map_err(|e| e.to_string())
}

fn from_value<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, String> {
    let json = serde_json::to_value(v).map_err(|e| e.to_string())?;
    serde_json::from_value(json).map_err(|e| e.to_string())
}

fn node_of(value: &Value) -> HubResult<(Hash, Bytes)> {
    let portable = cas_client::files::svalue_node(value)
        .map_err(|e| HubError::internal("cannot encode a catalog node", e))?;
    Ok((Hash::digest(&portable), portable))
}

/// A catalog snapshot of schema version 1: everything in one node.
#[derive(Deserialize)]
struct CatalogV1 {
    snapshot_id: String,
    schema_version: u32,
    created_at: String,
    operation: String,
    actor: String,
    #[serde(default)]
    previous_snapshot_id: Option<String>,
    projects: Vec<ProjectEntry>,
}

impl Catalog {
    pub fn projects(&self) -> impl Iterator<Item = &ProjectEntry> {
        self.projects.iter().map(|p| p.as_ref())
    }

    pub fn project_count(&self) -> usize {
        self.projects.len()
    }

    pub fn project(&self, id: &str) -> Option<&ProjectEntry> {
        self.projects
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.as_ref())
    }

    /// A project to change; it will be encoded again.
    pub fn project_mut(&mut self, id: &str) -> Option<&mut ProjectEntry> {
        let i = self.projects.iter().position(|p| p.id == id)?;
        self.nodes[i] = None;
        Some(Arc::make_mut(&mut self.projects[i]))
    }

    pub fn add_project(&mut self, p: ProjectEntry) {
        self.projects.push(Arc::new(p));
        self.nodes.push(None);
    }

    pub fn remove_project(&mut self, id: &str) {
        if let Some(i) = self.projects.iter().position(|p| p.id == id) {
            self.projects.remove(i);
            self.nodes.remove(i);
        }
    }

    /// Encodes the projects that changed (refusing one over `project_max_bytes` with 422
    /// `quota_exceeded`), the parts and the root.
    pub fn encode(&mut self, project_max_bytes: u64) -> HubResult<Encoded> {
        if self.projects.len() > MAX_CATALOG_PROJECTS {
            return Err(HubError::quota(
                "projects",
                MAX_CATALOG_PROJECTS as u64,
                "the deployment holds as many projects as a catalog can list",
            ));
        }
        let mut nodes = HashMap::new();
        for (p, node) in self.projects.iter().zip(self.nodes.iter_mut()) {
            if node.is_some() {
                continue;
            }
            let value = Value::map([
                ("kind", Value::from("hub-project")),
                ("schema_version", Value::from(SCHEMA_VERSION)),
                (
                    "project",
                    to_value(p.as_ref())
                        .map_err(|e| HubError::internal("cannot encode a project", e))?,
                ),
            ]);
            let (hash, portable) = node_of(&value)?;
            if portable.len() as u64 > project_max_bytes {
                return Err(HubError::quota(
                    "project_bytes",
                    project_max_bytes,
                    &format!(
                        "project {} would take {} bytes of metadata (its notebooks' titles, descriptions, tags); shorten some or move notebooks to another project",
                        p.id,
                        portable.len()
                    ),
                ));
            }
            nodes.insert(hash, portable);
            *node = Some(hash);
        }
        let hashes: Vec<Hash> = self.nodes.iter().flatten().copied().collect();
        let mut parts = Vec::new();
        for group in hashes.chunks(FANOUT) {
            let value = Value::map([
                ("kind", Value::from("hub-catalog-part")),
                (
                    "projects",
                    Value::Array(group.iter().map(|h| Value::Blob(*h)).collect()),
                ),
            ]);
            let (hash, portable) = node_of(&value)?;
            nodes.insert(hash, portable);
            parts.push(Value::Blob(hash));
        }
        let mut fields = vec![
            ("kind", Value::from("hub-catalog")),
            ("schema_version", Value::from(SCHEMA_VERSION)),
            ("snapshot_id", Value::from(self.snapshot_id.as_str())),
            ("created_at", Value::from(self.created_at.as_str())),
            ("operation", Value::from(self.operation.as_str())),
            ("actor", Value::from(self.actor.as_str())),
            ("parts", Value::Array(parts)),
        ];
        if let Some(prev) = &self.previous_snapshot_id {
            fields.push(("previous_snapshot_id", Value::from(prev.as_str())));
        }
        let (root, root_node) = node_of(&Value::map(fields))?;
        nodes.insert(root, root_node.clone());
        Ok(Encoded {
            nodes,
            root,
            root_node,
        })
    }
}

impl ProjectEntry {
    pub fn notebook(&self, id: &str) -> Option<&NotebookEntry> {
        self.notebooks.iter().find(|n| n.id == id)
    }

    pub fn notebook_mut(&mut self, id: &str) -> Option<&mut NotebookEntry> {
        self.notebooks.iter_mut().find(|n| n.id == id)
    }

    /// Whether a live (not deleted) notebook other than `except` has this title.
    pub fn title_taken(&self, title: &str, except: Option<&str>) -> bool {
        self.notebooks
            .iter()
            .any(|n| n.status != "deleted" && n.title == title && Some(n.id.as_str()) != except)
    }
}

/// The current head.
#[derive(Debug, Clone)]
pub struct Head {
    pub seq: i64,
    pub hash: Hash,
}

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

pub fn catalog_space() -> SpaceId {
    CATALOG_SPACE
        .parse()
        .unwrap_or_else(|_| unreachable!("constant Space id"))
}

fn kind_of(v: &Value) -> Option<&str> {
    v.get("kind").and_then(Value::as_str)
}

impl Hub {
    async fn head(&self) -> HubResult<Option<Head>> {
        let row = sqlx::query("SELECT seq, snapshot_hash FROM hub_catalog WHERE id = 1")
            .fetch_optional(&self.db.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let hash: String = row.try_get("snapshot_hash")?;
        Ok(Some(Head {
            seq: row.try_get("seq")?,
            hash: hash
                .parse()
                .map_err(|e| HubError::internal("bad catalog head", e))?,
        }))
    }

    async fn read_catalog_node(&self, hash: &Hash) -> HubResult<(Value, usize)> {
        let content = self.cas.read_svalue_node(&catalog_space(), hash).await?;
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

    async fn load_snapshot(&self, hash: &Hash) -> HubResult<Arc<Catalog>> {
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
        match self.head().await? {
            Some(h) => self.load_snapshot(&h.hash).await,
            None => Err(HubError::unavailable("the catalog is not initialized yet")),
        }
    }

    /// Creates the first (empty) snapshot if there is none.
    pub async fn init_catalog(&self) -> HubResult<()> {
        if self.head().await?.is_some() {
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
        let guard = self.lock(CATALOG_LOCK).await?;
        let result = self.mutate_catalog_locked(actor, operation, f).await;
        guard.release().await;
        result
    }

    /// As [`Self::mutate_catalog`], for a caller that already holds the catalog lock.
    pub(crate) async fn mutate_catalog_locked<T>(
        &self,
        actor: &str,
        operation: &str,
        f: impl FnOnce(&mut Catalog) -> HubResult<(T, Vec<Effect>)>,
    ) -> HubResult<T> {
        self.settle(CATALOG_LOCK).await?;
        let head = self.head().await?;
        let (mut next, expected_seq, old) = match &head {
            Some(h) => (
                (*self.load_snapshot(&h.hash).await?).clone(),
                h.seq,
                Some(h.hash),
            ),
            None => (Catalog::default(), 0, None),
        };
        let (out, effects) = f(&mut next)?;
        let previous = (!next.snapshot_id.is_empty()).then(|| next.snapshot_id.clone());
        next.snapshot_id = ids::snapshot_id();
        next.created_at = ids::rfc3339(ids::now_ms());
        next.operation = operation.to_string();
        next.actor = actor.to_string();
        next.previous_snapshot_id = previous;
        let encoded = next.encode(self.config.project_max_bytes)?;
        let hash = encoded.root;
        let space = catalog_space();
        self.cas
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
        let mut changes = std::collections::BTreeMap::from([(hash, 1i64)]);
        if let Some(old) = old
            && old != hash
        {
            changes.insert(old, -1);
        }
        let pending = Pending {
            request_id: format!("hub:catalog:{}", next.snapshot_id),
            lock_key: CATALOG_LOCK.to_string(),
            space,
            changes,
            payload: Payload::Catalog {
                expected_seq,
                snapshot_id: next.snapshot_id.clone(),
                snapshot_hash: hash,
                effects,
            },
            root_node: Some(encoded.root_node),
        };
        let mut tx = self.db.write().await?;
        pending.insert(&mut tx).await?;
        tx.commit().await?;
        self.complete(&pending, false).await?;
        self.snapshots.put_snapshot(hash, Arc::new(next));
        Ok(out)
    }

    /// Takes a lock key within the configured wait, or answers 503 `workspace_busy`.
    pub(crate) async fn lock(&self, key: &str) -> HubResult<crate::lock::Guard> {
        let wait = Duration::from_millis(self.config.workspace_wait_ms);
        match self
            .locks
            .acquire(key, wait)
            .await
            .map_err(|e| HubError::internal("cannot take the workspace lock", e))?
        {
            Ok(g) => Ok(g),
            Err(busy) => Err(HubError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "workspace_busy",
                format!(
                    "another writer held {} for longer than {:.1} seconds; nothing was written, so the same request can be retried",
                    key.split_once(':').map_or(key, |(_, k)| k),
                    busy.waited.as_secs_f64()
                ),
            )
            .with("name", key.split_once(':').map_or(key, |(_, k)| k))
            .with("timeout_seconds", wait.as_secs_f64())),
        }
    }
}
