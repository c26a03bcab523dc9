//! Upload generations: one upload attempt of one node, from its upload target through
//! validation to publication or retirement, with the reservation it holds in the usage row.

use std::collections::HashMap;

use cas_format::{Hash, SpaceId};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::usage::UsageDelta;
use super::{MetaStore, Partition, ROWS_PER_STATEMENT, hash_col, hb};

/// Where an upload generation's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// A temporary object in the blob store, written through the service's signed URL.
    Service,
    /// A row of `upload_bodies`, written through the service's signed URL (small nodes on
    /// object stores where one write per node matters).
    Inline,
    /// A temporary object written straight to the object store with a presigned URL.
    Presigned,
}

impl TargetKind {
    fn as_str(self) -> &'static str {
        match self {
            TargetKind::Service => "service",
            TargetKind::Inline => "inline",
            TargetKind::Presigned => "presigned",
        }
    }

    fn parse(s: &str) -> Result<Self, sqlx::Error> {
        Ok(match s {
            "service" => TargetKind::Service,
            "inline" => TargetKind::Inline,
            "presigned" => TargetKind::Presigned,
            other => return Err(decode_err("target", other)),
        })
    }
}

/// Lifecycle of an upload generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenState {
    /// Waiting for bytes at the upload target.
    AwaitingUpload,
    /// Bytes proven valid (evidence recorded); waiting for children or publication.
    Validated,
    /// The node row was committed from this generation.
    Published,
    /// Rejected or expired; its objects are deleted by GC.
    Retired,
}

impl GenState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            GenState::AwaitingUpload => "awaiting_upload",
            GenState::Validated => "validated",
            GenState::Published => "published",
            GenState::Retired => "retired",
        }
    }

    fn parse(s: &str) -> Result<Self, sqlx::Error> {
        Ok(match s {
            "awaiting_upload" => GenState::AwaitingUpload,
            "validated" => GenState::Validated,
            "published" => GenState::Published,
            "retired" => GenState::Retired,
            other => return Err(decode_err("state", other)),
        })
    }

    pub fn is_active(self) -> bool {
        matches!(self, GenState::AwaitingUpload | GenState::Validated)
    }
}

pub(super) fn decode_err(col: &str, value: &str) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: col.to_string(),
        source: format!("unexpected value {value:?}").into(),
    }
}

/// What validation proved about uploaded bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub content_type: String,
    pub content_size: i64,
    pub refs: Vec<Hash>,
}

impl Evidence {
    /// The distinct refs in order of first occurrence.
    pub fn distinct_refs(&self) -> Vec<Hash> {
        let mut seen = std::collections::HashSet::new();
        self.refs
            .iter()
            .copied()
            .filter(|h| seen.insert(*h))
            .collect()
    }
}

/// One upload attempt of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    pub gen_id: String,
    pub hash: Hash,
    pub state: GenState,
    pub target: TargetKind,
    pub created_at: i64,
    pub url_expires_at: i64,
    pub expires_at: i64,
    pub reserved_bytes: i64,
    pub evidence: Option<Evidence>,
    /// Publication attempts taken so far; a handle returned by
    /// [`Partition::next_attempt`] writes attempt `attempt`'s object ([`Generation::object_name`]).
    pub attempt: i64,
}

pub(crate) const GEN_COLUMNS: &str = "gen_id, app_id, space_id, hash, state, target, created_at, \
     url_expires_at, expires_at, reserved_bytes, content_type, content_size, refs, attempts";

fn refs_from_blob(bytes: &[u8]) -> Result<Vec<Hash>, sqlx::Error> {
    if !bytes.len().is_multiple_of(32) {
        return Err(decode_err("refs", "length not a multiple of 32"));
    }
    Ok(bytes
        .chunks_exact(32)
        .filter_map(Hash::from_slice)
        .collect())
}

fn refs_to_blob(refs: &[Hash]) -> Vec<u8> {
    refs.iter()
        .flat_map(|h| h.as_bytes().iter().copied())
        .collect()
}

type GenQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// Binds what a generation records of its progress, in this order: expiry, reservation,
/// attempts taken, and its evidence (content type, size, refs; null without).
fn bind_progress<'q>(q: GenQuery<'q>, g: &Generation) -> GenQuery<'q> {
    let evidence = g.evidence.as_ref();
    q.bind(g.expires_at)
        .bind(g.reserved_bytes)
        .bind(g.attempt)
        .bind(evidence.map(|e| e.content_type.clone()))
        .bind(evidence.map(|e| e.content_size))
        .bind(evidence.map(|e| refs_to_blob(&e.refs)))
}

pub(crate) fn generation_from_row(row: &AnyRow) -> Result<Generation, sqlx::Error> {
    let content_type: Option<String> = row.try_get("content_type")?;
    let content_size: Option<i64> = row.try_get("content_size")?;
    let refs: Option<Vec<u8>> = row.try_get("refs")?;
    let evidence = match (content_type, content_size, refs) {
        (Some(content_type), Some(content_size), Some(refs)) => Some(Evidence {
            content_type,
            content_size,
            refs: refs_from_blob(&refs)?,
        }),
        _ => None,
    };
    let state: String = row.try_get("state")?;
    let target: String = row.try_get("target")?;
    Ok(Generation {
        gen_id: row.try_get("gen_id")?,
        hash: hash_col(row, "hash")?,
        state: GenState::parse(&state)?,
        target: TargetKind::parse(&target)?,
        created_at: row.try_get("created_at")?,
        url_expires_at: row.try_get("url_expires_at")?,
        expires_at: row.try_get("expires_at")?,
        reserved_bytes: row.try_get("reserved_bytes")?,
        evidence,
        attempt: row.try_get("attempts")?,
    })
}

impl MetaStore {
    /// A generation by id, with its partition (for the upload endpoint).
    pub async fn generation(
        &self,
        gen_id: &str,
    ) -> Result<Option<(cas_format::AppId, SpaceId, Generation)>, sqlx::Error> {
        let Some(row) = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {GEN_COLUMNS} FROM upload_generations WHERE gen_id = $1"
        )))
        .bind(gen_id)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        Ok(Some((
            super::id_col(&row, "app_id")?,
            super::id_col(&row, "space_id")?,
            generation_from_row(&row)?,
        )))
    }

    /// Stores the body of an inline upload once; `false` if one was already stored.
    pub async fn put_upload_body(&self, gen_id: &str, body: &[u8]) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO upload_bodies (gen_id, body) VALUES ($1, $2) ON CONFLICT (gen_id) DO NOTHING",
        )
        .bind(gen_id)
        .bind(body.to_vec())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub async fn upload_body(&self, gen_id: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        sqlx::query("SELECT body FROM upload_bodies WHERE gen_id = $1")
            .bind(gen_id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get("body"))
            .transpose()
    }

    pub async fn delete_upload_body(&self, gen_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM upload_bodies WHERE gen_id = $1")
            .bind(gen_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// The active (awaiting upload or validated) generation of a node, if any.
async fn active_generation_in(
    conn: &mut sqlx::AnyConnection,
    app: &cas_format::AppId,
    space: &SpaceId,
    hash: &Hash,
) -> Result<Option<Generation>, sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {GEN_COLUMNS} FROM upload_generations WHERE app_id = $1 AND space_id = $2 \
         AND hash = $3 AND state IN ('awaiting_upload', 'validated')"
    )))
    .bind(app.as_str())
    .bind(space.as_str())
    .bind(hb(hash))
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(generation_from_row)
    .transpose()
}

impl MetaStore {
    /// The active generation of a node, read outside the gate (it may change right after).
    pub async fn active_generation(
        &self,
        app: &cas_format::AppId,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<Option<Generation>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        active_generation_in(&mut conn, app, space, hash).await
    }
}

impl Partition {
    /// The active (awaiting upload or validated) generation of a node, if any.
    pub async fn active_generation(
        &mut self,
        hash: &Hash,
    ) -> Result<Option<Generation>, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        active_generation_in(self.tx(), &app, &space, hash).await
    }

    /// A generation by id, whatever its state.
    pub async fn generation(&mut self, gen_id: &str) -> Result<Option<Generation>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {GEN_COLUMNS} FROM upload_generations WHERE gen_id = $1"
        )))
        .bind(gen_id)
        .fetch_optional(&mut **self.tx())
        .await?
        .as_ref()
        .map(generation_from_row)
        .transpose()
    }

    /// The active generations of the distinct nodes among `hashes` that have one.
    pub async fn active_generations(
        &mut self,
        hashes: &[Hash],
    ) -> Result<HashMap<Hash, Generation>, sqlx::Error> {
        self.rows_by_hashes(hashes, |a, s, list| {
            format!(
                "SELECT {GEN_COLUMNS} FROM upload_generations WHERE app_id = {a} \
                 AND space_id = {s} AND hash IN ({list}) \
                 AND state IN ('awaiting_upload', 'validated')"
            )
        })
        .await?
        .iter()
        .map(|r| generation_from_row(r).map(|g| (g.hash, g)))
        .collect()
    }

    /// Generations by id, whatever their state.
    pub async fn generations(
        &mut self,
        ids: &[&str],
    ) -> Result<HashMap<String, Generation>, sqlx::Error> {
        let mut found = HashMap::new();
        for part in ids.chunks(ROWS_PER_STATEMENT) {
            let list = self.binds().list(part.len());
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {GEN_COLUMNS} FROM upload_generations WHERE gen_id IN ({list})"
            )));
            for id in part {
                q = q.bind(*id);
            }
            for r in q.fetch_all(&mut **self.tx()).await? {
                let g = generation_from_row(&r)?;
                found.insert(g.gen_id.clone(), g);
            }
        }
        Ok(found)
    }

    /// Unexpired active generations of the partition.
    pub async fn count_active_generations(&mut self, now: i64) -> Result<i64, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query(
            "SELECT COUNT(*) AS n FROM upload_generations WHERE app_id = $1 AND space_id = $2 \
             AND state IN ('awaiting_upload', 'validated') AND expires_at > $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(now)
        .fetch_one(&mut **self.tx())
        .await?
        .try_get("n")
    }

    /// Records a new generation and its reservation.
    pub async fn create_generation(&mut self, g: &Generation) -> Result<(), sqlx::Error> {
        self.create_generations(std::slice::from_ref(g)).await
    }

    /// Records new generations of distinct nodes, with their evidence if validated, and their
    /// reservations.
    pub async fn create_generations(&mut self, gens: &[Generation]) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        for part in gens.chunks(ROWS_PER_STATEMENT) {
            let values = self.binds().rows(part.len(), 14);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO upload_generations (gen_id, app_id, space_id, hash, state, target, \
                 created_at, url_expires_at, expires_at, reserved_bytes, attempts, content_type, \
                 content_size, refs) VALUES {values}"
            )));
            for g in part {
                q = q
                    .bind(g.gen_id.as_str())
                    .bind(app.as_str())
                    .bind(space.as_str())
                    .bind(hb(&g.hash))
                    .bind(g.state.as_str())
                    .bind(g.target.as_str())
                    .bind(g.created_at)
                    .bind(g.url_expires_at);
                q = bind_progress(q, g);
            }
            q.execute(&mut **self.tx()).await?;
        }
        self.add_usage(UsageDelta {
            reserved_bytes: gens.iter().map(|g| g.reserved_bytes).sum(),
            ..Default::default()
        })
        .await
    }

    /// Records validated bytes for generations that awaited their upload, whose bytes came
    /// another way (inline in a batch lease): each of `validated` as it now is (state,
    /// reservation, expiry, evidence, attempts taken), its reservations having been
    /// `reserved_before` in all.
    pub async fn validate_awaiting(
        &mut self,
        validated: &[Generation],
        reserved_before: i64,
    ) -> Result<(), sqlx::Error> {
        for part in validated.chunks(ROWS_PER_STATEMENT) {
            let values = self.binds().rows(part.len(), 8);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE upload_generations SET state = v.column2, expires_at = v.column3, \
                 reserved_bytes = v.column4, attempts = v.column5, content_type = v.column6, \
                 content_size = v.column7, refs = v.column8 \
                 FROM (VALUES {values}) AS v WHERE upload_generations.gen_id = v.column1"
            )));
            for g in part {
                q = bind_progress(q.bind(g.gen_id.as_str()).bind(g.state.as_str()), g);
            }
            q.execute(&mut **self.tx()).await?;
        }
        self.add_usage(UsageDelta {
            reserved_bytes: validated.iter().map(|g| g.reserved_bytes).sum::<i64>()
                - reserved_before,
            ..Default::default()
        })
        .await
    }

    /// Takes the next publication attempt of an active generation: the handle it returns
    /// writes an object no other attempt writes ([`Generation::object_name`]).
    pub async fn next_attempt(&mut self, g: &Generation) -> Result<Generation, sqlx::Error> {
        let attempt: i64 = sqlx::query(
            "UPDATE upload_generations SET attempts = attempts + 1 WHERE gen_id = $1 \
             RETURNING attempts",
        )
        .bind(g.gen_id.as_str())
        .fetch_one(&mut **self.tx())
        .await?
        .try_get("attempts")?;
        Ok(Generation {
            attempt,
            ..g.clone()
        })
    }

    /// Retires a generation (rejected bytes or expiry) and releases its reservation. Its
    /// objects are deleted by GC.
    pub async fn retire_generation(&mut self, g: &Generation) -> Result<(), sqlx::Error> {
        self.set_generation_state(g, GenState::Retired, 0, None)
            .await
    }

    /// Records validation evidence: the bytes are valid; the reservation becomes their size.
    pub async fn record_evidence(
        &mut self,
        g: &Generation,
        evidence: &Evidence,
        canonical_bytes: i64,
        expires_at: i64,
    ) -> Result<(), sqlx::Error> {
        let gen_id = g.gen_id.clone();
        sqlx::query(
            "UPDATE upload_generations SET content_type = $2, content_size = $3, refs = $4 \
             WHERE gen_id = $1",
        )
        .bind(gen_id.as_str())
        .bind(evidence.content_type.as_str())
        .bind(evidence.content_size)
        .bind(refs_to_blob(&evidence.refs))
        .execute(&mut **self.tx())
        .await?;
        self.set_generation_state(g, GenState::Validated, canonical_bytes, Some(expires_at))
            .await
    }

    /// Gives a generation still awaiting its upload a new URL expiry (and a slot that lasts at
    /// least as long); `false` if it is no longer awaiting an upload.
    pub async fn refresh_upload_url(
        &mut self,
        gen_id: &str,
        url_expires_at: i64,
        expires_at: i64,
    ) -> Result<bool, sqlx::Error> {
        let n = sqlx::query(
            "UPDATE upload_generations SET url_expires_at = $2, \
             expires_at = CASE WHEN expires_at < $3 THEN $3 ELSE expires_at END \
             WHERE gen_id = $1 AND state = 'awaiting_upload'",
        )
        .bind(gen_id)
        .bind(url_expires_at)
        .bind(expires_at)
        .execute(&mut **self.tx())
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Keeps a validated generation alive while its children are being uploaded.
    pub async fn touch_generation(
        &mut self,
        gen_id: &str,
        expires_at: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE upload_generations SET expires_at = $2 WHERE gen_id = $1 AND expires_at < $2",
        )
        .bind(gen_id)
        .bind(expires_at)
        .execute(&mut **self.tx())
        .await?;
        Ok(())
    }

    pub(super) async fn set_generation_state(
        &mut self,
        g: &Generation,
        state: GenState,
        reserved: i64,
        expires_at: Option<i64>,
    ) -> Result<(), sqlx::Error> {
        // Re-read the reservation under the gate: it is what the usage row holds.
        let Some(current) = self.generation(&g.gen_id).await? else {
            return Ok(());
        };
        sqlx::query(
            "UPDATE upload_generations SET state = $2, reserved_bytes = $3, \
             expires_at = COALESCE($4, expires_at) WHERE gen_id = $1",
        )
        .bind(g.gen_id.as_str())
        .bind(state.as_str())
        .bind(reserved)
        .bind(expires_at)
        .execute(&mut **self.tx())
        .await?;
        self.add_usage(UsageDelta {
            reserved_bytes: reserved - current.reserved_bytes,
            ..Default::default()
        })
        .await
    }
}
