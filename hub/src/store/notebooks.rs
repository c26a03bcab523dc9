//! Notebook heads (`hub_notebooks`) and the trash (`hub_trash`).

use sqlx::Row;

use super::{HubStore, WriteTx, enum_col, parsed};
use crate::ids::{NotebookId, ProjectId};

column_enum! {
    /// Where a notebook's row stands. A notebook is created `Live`, goes to the trash
    /// (`Trashed`), and from there back to `Live` or on to `Purging` (its roots being released)
    /// and `Purged`; the notebooks of a purged project go to `Purging` from either.
    pub enum NotebookState {
        Live = "live",
        Trashed = "trashed",
        Purging = "purging",
        Purged = "purged",
    }
}

impl NotebookState {
    /// Whether a notebook in this state may move to `next`.
    pub fn may_become(self, next: NotebookState) -> bool {
        use NotebookState::*;
        matches!(
            (self, next),
            (Live, Trashed)
                | (Trashed, Live)
                | (Trashed, Purging)
                | (Live, Purging)
                | (Purging, Purged)
        )
    }
}

/// The mutable head of a notebook.
#[derive(Debug, Clone)]
pub struct NotebookRow {
    pub notebook_id: NotebookId,
    pub project_id: ProjectId,
    pub state: NotebookState,
    pub head_revision: Option<i64>,
    /// The highest revision ever allocated: numbers are never handed out twice.
    pub max_revision: i64,
    pub sync_token_hash: Option<String>,
    /// Whom the sync token acts for (`None`: the notebook's author).
    pub sync_token_owner: Option<String>,
    pub updated_at_ms: i64,
}

/// A notebook in the trash.
#[derive(Debug, Clone)]
pub struct TrashRow {
    pub token: String,
    pub notebook_id: NotebookId,
    pub title: String,
    pub trashed_at_ms: i64,
    pub actor: String,
}

impl HubStore {
    pub async fn notebook(&self, id: &NotebookId) -> Result<Option<NotebookRow>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT notebook_id, project_id, state, head_revision, max_revision, sync_token_hash, \
             sync_token_owner, updated_at_ms FROM hub_notebooks WHERE notebook_id = $1",
        )
        .bind(id.as_str())
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(NotebookRow {
                notebook_id: parsed(&r, "notebook_id")?,
                project_id: parsed(&r, "project_id")?,
                state: enum_col(&r, "state")?,
                head_revision: r.try_get("head_revision")?,
                max_revision: r.try_get("max_revision")?,
                sync_token_hash: r.try_get("sync_token_hash")?,
                sync_token_owner: r.try_get("sync_token_owner")?,
                updated_at_ms: r.try_get("updated_at_ms")?,
            })
        })
        .transpose()
    }

    /// Notebooks whose purge a crashed process left half done.
    pub async fn purging_notebooks(&self) -> Result<Vec<NotebookId>, sqlx::Error> {
        let rows = sqlx::query("SELECT notebook_id FROM hub_notebooks WHERE state = $1")
            .bind(NotebookState::Purging.as_str())
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(|r| parsed(r, "notebook_id")).collect()
    }

    /// A new notebook row (once: a replayed commit creates nothing twice).
    pub async fn insert_notebook(
        tx: &mut WriteTx,
        id: &NotebookId,
        project: &ProjectId,
        sync_token_hash: Option<&str>,
        sync_token_owner: Option<&str>,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO hub_notebooks (notebook_id, project_id, state, head_revision, max_revision, \
             sync_token_hash, sync_token_owner, created_at_ms, updated_at_ms) \
             VALUES ($1, $2, $3, NULL, 0, $4, $5, $6, $6) ON CONFLICT (notebook_id) DO NOTHING",
        )
        .bind(id.as_str())
        .bind(project.as_str())
        .bind(NotebookState::Live.as_str())
        .bind(sync_token_hash)
        .bind(sync_token_owner)
        .bind(now)
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// Moves a notebook to `state`.
    pub async fn set_notebook_state(
        tx: &mut WriteTx,
        id: &NotebookId,
        state: NotebookState,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        // A purged notebook keeps no head and no sync token.
        let sql = if state == NotebookState::Purged {
            "UPDATE hub_notebooks SET state = $1, updated_at_ms = $2, head_revision = NULL, \
             sync_token_hash = NULL WHERE notebook_id = $3"
        } else {
            "UPDATE hub_notebooks SET state = $1, updated_at_ms = $2 WHERE notebook_id = $3"
        };
        sqlx::query(sql)
            .bind(state.as_str())
            .bind(now)
            .bind(id.as_str())
            .execute(tx.conn())
            .await?;
        Ok(())
    }

    /// Allocates revisions up to `max` if nobody moved them since `expected`.
    pub async fn allocate_revisions(
        tx: &mut WriteTx,
        id: &NotebookId,
        expected: i64,
        max: i64,
    ) -> Result<bool, sqlx::Error> {
        let n = sqlx::query(
            "UPDATE hub_notebooks SET max_revision = $1 WHERE notebook_id = $2 AND max_revision = $3",
        )
        .bind(max)
        .bind(id.as_str())
        .bind(expected)
        .execute(tx.conn())
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Moves the head (or, with `None`, only records the change time).
    pub async fn touch_head(
        tx: &mut WriteTx,
        id: &NotebookId,
        head: Option<i64>,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE hub_notebooks SET head_revision = COALESCE($1, head_revision), updated_at_ms = $2 \
             WHERE notebook_id = $3",
        )
        .bind(head)
        .bind(now)
        .bind(id.as_str())
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// A new sync token of a live notebook and whom it acts for.
    pub async fn set_sync_token(
        tx: &mut WriteTx,
        id: &NotebookId,
        hash: &str,
        owner: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE hub_notebooks SET sync_token_hash = $1, sync_token_owner = $2 \
             WHERE notebook_id = $3 AND state = $4",
        )
        .bind(hash)
        .bind(owner)
        .bind(id.as_str())
        .bind(NotebookState::Live.as_str())
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// The trash of a project, newest first.
    pub async fn trash(&self, project: &ProjectId) -> Result<Vec<TrashRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT token, notebook_id, title, trashed_at_ms, actor FROM hub_trash WHERE project_id = $1 \
             ORDER BY trashed_at_ms DESC, token LIMIT 10000",
        )
        .bind(project.as_str())
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(TrashRow {
                    token: r.try_get("token")?,
                    notebook_id: parsed(r, "notebook_id")?,
                    title: r.try_get("title")?,
                    trashed_at_ms: r.try_get("trashed_at_ms")?,
                    actor: r.try_get("actor")?,
                })
            })
            .collect()
    }

    /// The notebook a trash token of `project` names.
    pub async fn trashed_notebook(
        &self,
        project: &ProjectId,
        token: &str,
    ) -> Result<Option<NotebookId>, sqlx::Error> {
        let row =
            sqlx::query("SELECT notebook_id FROM hub_trash WHERE token = $1 AND project_id = $2")
                .bind(token)
                .bind(project.as_str())
                .fetch_optional(self.pool())
                .await?;
        row.map(|r| parsed(&r, "notebook_id")).transpose()
    }

    /// Puts a notebook in the trash.
    pub async fn insert_trash(
        tx: &mut WriteTx,
        project: &ProjectId,
        entry: &TrashRow,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO hub_trash (token, project_id, notebook_id, title, trashed_at_ms, actor) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (token) DO NOTHING",
        )
        .bind(&entry.token)
        .bind(project.as_str())
        .bind(entry.notebook_id.as_str())
        .bind(&entry.title)
        .bind(entry.trashed_at_ms)
        .bind(&entry.actor)
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// Takes an entry out of the trash.
    pub async fn delete_trash(tx: &mut WriteTx, token: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM hub_trash WHERE token = $1")
            .bind(token)
            .execute(tx.conn())
            .await?;
        Ok(())
    }

    /// Takes a notebook out of the trash, whatever its token.
    pub async fn delete_trash_of(
        tx: &mut WriteTx,
        notebook: &NotebookId,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM hub_trash WHERE notebook_id = $1")
            .bind(notebook.as_str())
            .execute(tx.conn())
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::NotebookState::{self, *};

    #[test]
    fn states_round_trip_and_move_as_the_trash_allows() {
        for s in [Live, Trashed, Purging, Purged] {
            assert_eq!(NotebookState::parse(s.as_str()), Some(s));
        }
        assert_eq!(NotebookState::parse("deleted"), None);
        assert!(Live.may_become(Trashed));
        assert!(Trashed.may_become(Live));
        assert!(Trashed.may_become(Purging));
        assert!(Purging.may_become(Purged));
        assert!(Live.may_become(Purging));
        assert!(!Purged.may_become(Live));
        assert!(!Purging.may_become(Live));
    }
}
