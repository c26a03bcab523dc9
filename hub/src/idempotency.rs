//! Idempotent creates (seed 000 §13). A `POST /projects` or `POST …/notebooks` with an
//! `Idempotency-Key` header records what it answered, keyed by the digest of user, route and
//! key, in the same local transaction as the change it made (a catalog commit, replayed with it
//! by recovery). A retry with the same key and body gets the recorded answer; the same key with
//! another body is 422 `idempotency_key_reused`. The lookup is made under the catalog lock,
//! after whatever a writer that is gone left there was settled, so two retries never both
//! create and a create whose client never saw its answer is found by the retry.

use axum::http::{HeaderMap, StatusCode};

use crate::Hub;
use crate::auth::User;
use crate::catalog::Role;
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId};
use crate::notebooks::CreatedNotebook;
use crate::projects::{ProjectView, project_gone};
use crate::store::IdempotencyRow;
use crate::workspace::Committed;

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// The answer header that says an answer is a replay.
pub const REPLAYED_HEADER: &str = "idempotency-replayed";
/// Longest key.
pub const MAX_KEY: usize = 255;

/// A create's idempotency key, bound to its caller, route and body.
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    pub user_id: String,
    pub route: String,
    pub digest: String,
    pub request_digest: String,
}

/// The `Idempotency-Key` of a request and the digest of its body, before the caller is known.
#[derive(Debug, Clone)]
pub struct RequestKey {
    pub key: String,
    pub body_digest: String,
}

impl RequestKey {
    /// The key of a request, if it carries one (422 for one that is not 1..=255 printable
    /// ASCII characters).
    pub fn of_request(headers: &HeaderMap, body: &[u8]) -> HubResult<Option<RequestKey>> {
        let Some(v) = headers.get(HEADER) else {
            return Ok(None);
        };
        let key = v
            .to_str()
            .ok()
            .filter(|k| {
                !k.is_empty() && k.len() <= MAX_KEY && k.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .ok_or_else(|| {
                HubError::invalid(format!(
                    "Idempotency-Key must be 1..={MAX_KEY} printable ASCII characters"
                ))
            })?;
        Ok(Some(RequestKey {
            key: key.to_string(),
            body_digest: ids::sha256_bytes_hex(body),
        }))
    }

    /// Bound to its caller and route.
    pub fn bind(self, user_id: &str, route: String) -> IdempotencyKey {
        IdempotencyKey {
            digest: ids::sha256_hex(&format!("{user_id}\n{route}\n{}", self.key)),
            request_digest: self.body_digest,
            user_id: user_id.to_string(),
            route,
        }
    }
}

impl IdempotencyKey {
    /// The record of this create, answering `answer` (`None`: recorded before the answer is
    /// known, completed by [`Hub::complete_create`]).
    pub fn record(&self, resource_id: &str, answer: Option<String>) -> IdempotencyRow {
        IdempotencyRow {
            digest: self.digest.clone(),
            user_id: self.user_id.clone(),
            route: self.route.clone(),
            request_digest: self.request_digest.clone(),
            resource_id: resource_id.to_string(),
            status: StatusCode::CREATED.as_u16(),
            answer,
            created_at_ms: ids::now_ms(),
        }
    }
}

/// What a create answers: made now, or the recorded answer (the JSON of its `data`) of the
/// create this key made before.
pub enum Created<T> {
    New(T),
    Replayed(String),
}

impl<T: serde::Serialize> Created<T> {
    /// The answer: 201 with the new resource, or the recorded answer again (201, marked with
    /// `Idempotency-Replayed: true`).
    pub fn into_response(self) -> HubResult<axum::response::Response> {
        use axum::response::IntoResponse;
        match self {
            Created::New(v) => Ok(crate::error::ok_status(StatusCode::CREATED, v)),
            Created::Replayed(answer) => {
                let data: serde_json::Value = serde_json::from_str(&answer)
                    .map_err(|e| HubError::internal("a recorded answer cannot be read", e))?;
                let mut r = crate::error::ok_status(StatusCode::CREATED, data);
                r.headers_mut().insert(
                    REPLAYED_HEADER,
                    axum::http::HeaderValue::from_static("true"),
                );
                Ok(r.into_response())
            }
        }
    }
}

/// What a create with a key finds.
pub enum Prior {
    /// Nothing: create.
    Fresh,
    /// A create made earlier with this key and body.
    Made(IdempotencyRow),
}

/// The JSON of an answer, for its record.
pub fn answer_json<T: serde::Serialize>(answer: &T) -> HubResult<String> {
    serde_json::to_string(answer).map_err(|e| HubError::internal("cannot record an answer", e))
}

impl Hub {
    /// What this key made before, if anything (an expired record is forgotten first); 422
    /// `idempotency_key_reused` for the same key with another body. Call it under the catalog
    /// lock.
    pub(crate) async fn prior_create(&self, key: &IdempotencyKey) -> HubResult<Prior> {
        let Some(row) = self.store.idempotency(&key.digest).await? else {
            return Ok(Prior::Fresh);
        };
        let keep = i64::try_from(self.config.retention.idempotency_ms).unwrap_or(i64::MAX);
        if keep > 0 && row.created_at_ms < ids::now_ms().saturating_sub(keep) {
            self.store.forget_idempotency(&key.digest).await?;
            return Ok(Prior::Fresh);
        }
        if row.request_digest != key.request_digest {
            return Err(HubError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was used with another request body; use a new key for a new request",
            ));
        }
        Ok(Prior::Made(row))
    }

    /// The recorded answer of a project create, or (for a record without one) the project as
    /// it is now.
    pub(crate) async fn replay_project(
        &self,
        user: &User,
        row: IdempotencyRow,
    ) -> HubResult<Created<ProjectView>> {
        if let Some(answer) = row.answer {
            return Ok(Created::Replayed(answer));
        }
        let pid: ProjectId = row
            .resource_id
            .parse()
            .map_err(|e| HubError::internal("a recorded create names no project", e))?;
        let cat = self.catalog().await?;
        let view = cat
            .project(&pid)
            .and_then(|p| self.project_view(user, p))
            .ok_or_else(|| project_gone(&pid))?;
        Ok(Created::Replayed(answer_json(&view)?))
    }

    /// The recorded answer of a notebook create. Its record is written with the notebook and
    /// its answer once the first revision is in, all while the create holds the new notebook's
    /// lock: a record without an answer belongs to a create that is still finishing (waiting
    /// for the lock waits for it, on any process) or whose process stopped (the lock is then
    /// free, and what it left is settled on taking it). Then the answer is the notebook as it
    /// is, with its head revision.
    pub(crate) async fn replay_notebook(
        &self,
        user: &User,
        pid: &ProjectId,
        row: IdempotencyRow,
    ) -> HubResult<Created<CreatedNotebook>> {
        if let Some(answer) = row.answer {
            return Ok(Created::Replayed(answer));
        }
        let nid: NotebookId = row
            .resource_id
            .parse()
            .map_err(|e| HubError::internal("a recorded create names no notebook", e))?;
        self.with_notebook_lock(&nid, async || Ok(())).await?;
        if let Some(answer) = self
            .store
            .idempotency(&row.digest)
            .await?
            .and_then(|r| r.answer)
        {
            return Ok(Created::Replayed(answer));
        }
        let (entry, nb) = self.notebook_for(user, pid, &nid, Role::Viewer).await?;
        let revision = match nb.head_revision {
            Some(rev) => self.version(&nb, rev).await?.map(|v| Committed {
                notebook_id: nid.clone(),
                project_id: pid.clone(),
                version_id: v.version_id,
                revision: v.revision,
                saved_at: v.saved_at,
                file_count: v.file_count,
                size_bytes: v.size_bytes,
                tree: v.tree.to_string(),
                uploaded_nodes: 0,
                uploaded_bytes: 0,
            }),
            None => None,
        };
        let answer = answer_json(&CreatedNotebook {
            notebook: self.notebook_view(pid, &entry, Some(&nb)),
            sync_token: None,
            revision,
        })?;
        self.store
            .set_idempotent_answer(&row.digest, &answer)
            .await?;
        Ok(Created::Replayed(answer))
    }

    /// Records the answer of a create recorded before its answer was known.
    pub(crate) async fn complete_create(
        &self,
        key: &IdempotencyKey,
        answer: &str,
    ) -> HubResult<()> {
        Ok(self
            .store
            .set_idempotent_answer(&key.digest, answer)
            .await?)
    }
}
