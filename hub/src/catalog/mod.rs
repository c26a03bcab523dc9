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

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use cas_format::{Hash, SpaceId, Value};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{HubError, HubResult};
use crate::ids::{NotebookId, ProjectId};

mod history;
mod snapshots;

pub use history::{Recovered, SnapshotInfo};
pub use snapshots::SnapshotCache;

/// The Space holding catalog snapshots (project Spaces are their project ids).
pub const CATALOG_SPACE: &str = "hub.catalog";
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

impl Source {
    /// The notebook file the workspace opens with, if the source names one.
    pub fn entry_notebook(&self) -> Option<&str> {
        match self {
            Source::Local { entry_notebook } | Source::Git { entry_notebook, .. } => {
                entry_notebook.as_deref()
            }
        }
    }
}

/// A notebook's status in the catalog: `draft`, `active`, `archived`, or `deleted` (in the
/// trash, where it keeps the status it had, to get it back on restore).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NotebookStatus {
    Draft,
    Active,
    Archived,
    Deleted,
}

impl NotebookStatus {
    /// A status a client may set (deletion is `DELETE`).
    pub fn settable(s: &str) -> Option<NotebookStatus> {
        match s {
            "draft" => Some(NotebookStatus::Draft),
            "active" => Some(NotebookStatus::Active),
            "archived" => Some(NotebookStatus::Archived),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NotebookEntry {
    pub id: NotebookId,
    pub title: String,
    pub description: String,
    pub status: NotebookStatus,
    pub author: String,
    pub created_at: String,
    pub updated_at: String,
    pub tags: Vec<String>,
    pub source: Source,
    /// The status before deletion, restored with the notebook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub status_before_delete: Option<NotebookStatus>,
}

impl NotebookEntry {
    /// Whether it is live (not in the trash).
    pub fn is_live(&self) -> bool {
        self.status != NotebookStatus::Deleted
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProjectEntry {
    pub id: ProjectId,
    pub name: String,
    pub description: String,
    pub owner: String,
    pub members: Vec<Member>,
    pub created_at: String,
    pub updated_at: String,
    pub tags: Vec<String>,
    pub notebooks: Vec<NotebookEntry>,
    /// The role of a signed-in user who is no member; absent: the deployment's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_role: Option<ProjectDefaultRole>,
    /// When the project went to the trash (RFC 3339), and by whom; absent while live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_by: Option<String>,
}

/// A project's default access for signed-in users who are not members (seed 000 §12): `none`
/// grants nothing; `inherit` (stored as nothing) takes the deployment's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProjectDefaultRole {
    Inherit,
    None,
    Viewer,
    Editor,
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
    /// Live projects (not in the trash).
    pub fn projects(&self) -> impl Iterator<Item = &ProjectEntry> {
        self.all_projects().filter(|p| p.is_live())
    }

    /// Every project, live or in the trash.
    pub fn all_projects(&self) -> impl Iterator<Item = &ProjectEntry> {
        self.projects.iter().map(|p| p.as_ref())
    }

    /// Projects, live or in the trash (each holds its notebooks and counts toward limits).
    pub fn project_count(&self) -> usize {
        self.projects.len()
    }

    /// A live project.
    pub fn project(&self, id: &ProjectId) -> Option<&ProjectEntry> {
        self.any_project(id).filter(|p| p.is_live())
    }

    /// A project, live or in the trash.
    pub fn any_project(&self, id: &ProjectId) -> Option<&ProjectEntry> {
        self.projects
            .iter()
            .find(|p| p.id == *id)
            .map(|p| p.as_ref())
    }

    /// A live project to change; it will be encoded again.
    pub fn project_mut(&mut self, id: &ProjectId) -> Option<&mut ProjectEntry> {
        self.any_project(id)?.is_live().then_some(())?;
        self.any_project_mut(id)
    }

    /// A project to change, live or in the trash.
    pub fn any_project_mut(&mut self, id: &ProjectId) -> Option<&mut ProjectEntry> {
        let i = self.projects.iter().position(|p| p.id == *id)?;
        self.nodes[i] = None;
        Some(Arc::make_mut(&mut self.projects[i]))
    }

    pub fn add_project(&mut self, p: ProjectEntry) {
        self.projects.push(Arc::new(p));
        self.nodes.push(None);
    }

    pub fn remove_project(&mut self, id: &ProjectId) {
        if let Some(i) = self.projects.iter().position(|p| p.id == *id) {
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
    /// Whether it is live (not in the trash).
    pub fn is_live(&self) -> bool {
        self.deleted_at.is_none()
    }

    pub fn notebook(&self, id: &NotebookId) -> Option<&NotebookEntry> {
        self.notebooks.iter().find(|n| n.id == *id)
    }

    pub fn notebook_mut(&mut self, id: &NotebookId) -> Option<&mut NotebookEntry> {
        self.notebooks.iter_mut().find(|n| n.id == *id)
    }

    /// A live notebook of the project.
    pub fn live_notebook(&self, id: &NotebookId) -> Option<&NotebookEntry> {
        self.notebook(id).filter(|n| n.is_live())
    }

    /// Live notebooks, in order of creation.
    pub fn live_notebooks(&self) -> impl Iterator<Item = &NotebookEntry> {
        self.notebooks.iter().filter(|n| n.is_live())
    }

    /// Whether a live notebook other than `except` has this title.
    pub fn title_taken(&self, title: &str, except: Option<&NotebookId>) -> bool {
        self.live_notebooks()
            .any(|n| n.title == title && Some(&n.id) != except)
    }
}

pub fn catalog_space() -> SpaceId {
    CATALOG_SPACE
        .parse()
        .unwrap_or_else(|_| unreachable!("constant Space id"))
}
