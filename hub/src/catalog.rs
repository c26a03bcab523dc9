//! The catalog: every project and notebook with its metadata, as one immutable snapshot node
//! (an SValue in the hub's catalog Space). The only mutable part is the head row naming the
//! current snapshot. A mutation writes a new snapshot, retains it and releases the old one in
//! one root-ref update (new +1, old −1), and swaps the head with an optimistic check on its
//! sequence number, all while holding the catalog lock. Listing everything is one read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cas_format::{Hash, SpaceId, Value};
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
pub const SCHEMA_VERSION: u32 = 1;

/// A project role, lowest first.
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

/// One catalog snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Catalog {
    pub snapshot_id: String,
    pub schema_version: u32,
    pub created_at: String,
    pub operation: String,
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_snapshot_id: Option<String>,
    pub projects: Vec<ProjectEntry>,
}

impl Catalog {
    pub fn project(&self, id: &str) -> Option<&ProjectEntry> {
        self.projects.iter().find(|p| p.id == id)
    }

    pub fn project_mut(&mut self, id: &str) -> Option<&mut ProjectEntry> {
        self.projects.iter_mut().find(|p| p.id == id)
    }

    fn to_value(&self) -> Result<Value, String> {
        let json = serde_json::to_value(self).map_err(|e| e.to_string())?;
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    fn from_value(v: Value) -> Result<Catalog, String> {
        let json = serde_json::to_value(&v).map_err(|e| e.to_string())?;
        let c: Catalog = serde_json::from_value(json).map_err(|e| e.to_string())?;
        if c.schema_version > SCHEMA_VERSION {
            return Err(format!(
                "catalog snapshot {} has schema version {}, newer than this hub understands ({SCHEMA_VERSION}); upgrade the hub",
                c.snapshot_id, c.schema_version
            ));
        }
        Ok(c)
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

/// Parsed snapshots by hash (immutable, so never stale).
#[derive(Default)]
pub struct SnapshotCache {
    map: std::sync::Mutex<HashMap<Hash, Arc<Catalog>>>,
}

impl SnapshotCache {
    fn get(&self, h: &Hash) -> Option<Arc<Catalog>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(h)
            .cloned()
    }
    fn put(&self, h: Hash, c: Arc<Catalog>) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= 16 {
            m.clear();
        }
        m.insert(h, c);
    }
}

pub fn catalog_space() -> SpaceId {
    CATALOG_SPACE
        .parse()
        .unwrap_or_else(|_| unreachable!("constant Space id"))
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

    async fn load_snapshot(&self, hash: &Hash) -> HubResult<Arc<Catalog>> {
        if let Some(c) = self.snapshots.get(hash) {
            return Ok(c);
        }
        let content = self.cas.read_svalue_node(&catalog_space(), hash).await?;
        let (value, _) = cas_format::svalue::decode(&content)
            .map_err(|e| HubError::internal("a catalog snapshot cannot be decoded", e))?;
        let c = Arc::new(
            Catalog::from_value(value)
                .map_err(|e| HubError::internal("a catalog snapshot cannot be read", e))?,
        );
        self.snapshots.put(*hash, c.clone());
        Ok(c)
    }

    /// The current catalog (one head read, the snapshot from cache or one node read).
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
            None => (
                Catalog {
                    snapshot_id: String::new(),
                    schema_version: SCHEMA_VERSION,
                    created_at: String::new(),
                    operation: String::new(),
                    actor: String::new(),
                    previous_snapshot_id: None,
                    projects: Vec::new(),
                },
                0,
                None,
            ),
        };
        let (out, effects) = f(&mut next)?;
        let previous = (!next.snapshot_id.is_empty()).then(|| next.snapshot_id.clone());
        next.snapshot_id = ids::snapshot_id();
        next.schema_version = SCHEMA_VERSION;
        next.created_at = ids::rfc3339(ids::now_ms());
        next.operation = operation.to_string();
        next.actor = actor.to_string();
        next.previous_snapshot_id = previous;
        let value = next
            .to_value()
            .map_err(|e| HubError::internal("cannot encode the catalog", e))?;
        let portable = cas_client::files::svalue_node(&value)
            .map_err(|e| HubError::internal("cannot encode the catalog", e))?;
        let hash = Hash::digest(&portable);
        let space = catalog_space();
        let nodes = HashMap::from([(hash, portable.clone())]);
        self.cas
            .store_dag(&space, &nodes, &[hash], self.config.lease_ms, 1)
            .await?;
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
            root_node: Some(portable),
        };
        let mut tx = self.db.write().await?;
        pending.insert(&mut tx).await?;
        tx.commit().await?;
        self.complete(&pending, false).await?;
        self.snapshots.put(hash, Arc::new(next));
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
