//! Audit events (`hub_events`): ULID ids, so time-sortable.

use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::{HubStore, WriteTx, parsed_opt};
use crate::ids::{self, NotebookId, ProjectId};

/// An audit event.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventRow {
    pub id: String,
    pub project_id: Option<ProjectId>,
    pub notebook_id: Option<NotebookId>,
    pub ts_ms: i64,
    pub event: String,
    pub actor: String,
    pub detail: serde_json::Value,
}

impl EventRow {
    pub fn new(
        event: &str,
        actor: &str,
        project_id: Option<&ProjectId>,
        notebook_id: Option<&NotebookId>,
        detail: serde_json::Value,
    ) -> Self {
        EventRow {
            id: ids::event_id(),
            project_id: project_id.cloned(),
            notebook_id: notebook_id.cloned(),
            ts_ms: ids::now_ms(),
            event: event.to_string(),
            actor: actor.to_string(),
            detail,
        }
    }

    /// Writes it (once: a replayed commit writes nothing twice).
    pub async fn insert(&self, tx: &mut WriteTx) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO hub_events (id, project_id, notebook_id, ts_ms, event, actor, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&self.id)
        .bind(self.project_id.as_ref().map(ProjectId::as_str))
        .bind(self.notebook_id.as_ref().map(NotebookId::as_str))
        .bind(self.ts_ms)
        .bind(&self.event)
        .bind(&self.actor)
        .bind(self.detail.to_string())
        .execute(tx.conn())
        .await?;
        Ok(())
    }
}

/// Which events to read: one project's or every project's, within a time range.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventFilter<'a> {
    pub project: Option<&'a ProjectId>,
    /// From this millisecond on.
    pub from_ms: Option<i64>,
    /// Before this millisecond.
    pub until_ms: Option<i64>,
}

impl HubStore {
    /// Events, newest first, older than the event `before` (ids sort by time), filtered.
    pub async fn events(
        &self,
        filter: EventFilter<'_>,
        before: Option<&str>,
        limit: u32,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        let mut sql = String::from(
            "SELECT id, project_id, notebook_id, ts_ms, event, actor, detail FROM hub_events \
             WHERE id < $1",
        );
        let mut n = 2;
        if filter.project.is_some() {
            sql.push_str(&format!(" AND project_id = ${n}"));
            n += 1;
        }
        if filter.from_ms.is_some() {
            sql.push_str(&format!(" AND ts_ms >= ${n}"));
            n += 1;
        }
        if filter.until_ms.is_some() {
            sql.push_str(&format!(" AND ts_ms < ${n}"));
            n += 1;
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${n}"));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(before.unwrap_or("~"));
        if let Some(p) = filter.project {
            q = q.bind(p.as_str());
        }
        if let Some(from) = filter.from_ms {
            q = q.bind(from);
        }
        if let Some(until) = filter.until_ms {
            q = q.bind(until);
        }
        let rows = q.bind(i64::from(limit)).fetch_all(self.pool()).await?;
        rows.iter()
            .map(|r| {
                let detail: String = r.try_get("detail")?;
                Ok(EventRow {
                    id: r.try_get("id")?,
                    project_id: parsed_opt(r, "project_id")?,
                    notebook_id: parsed_opt(r, "notebook_id")?,
                    ts_ms: r.try_get("ts_ms")?,
                    event: r.try_get("event")?,
                    actor: r.try_get("actor")?,
                    detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
                })
            })
            .collect()
    }
}

impl HubStore {
    /// Records an event that rides with no other change.
    pub async fn record_event(&self, e: &EventRow) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        e.insert(&mut tx).await?;
        tx.commit().await
    }

    /// Deletes events older than `before_ms` (by their time-ordered ids), at most `limit` of
    /// them; how many.
    pub async fn expire_events(&self, before_ms: i64, limit: i64) -> Result<u64, sqlx::Error> {
        let mut tx = self.write().await?;
        let n = sqlx::query(
            "DELETE FROM hub_events WHERE id IN \
             (SELECT id FROM hub_events WHERE id < $1 ORDER BY id LIMIT $2)",
        )
        .bind(ids::first_event_id_at(before_ms))
        .bind(limit)
        .execute(tx.conn())
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n)
    }
}
