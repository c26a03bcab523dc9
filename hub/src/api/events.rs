//! Audit reads: a project's events (managers), by page or for one UTC day, and every project's
//! events for super admins over at most 30 UTC days.

use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::envelope::{ErrorEnvelope, Page, envelope, page_of_fetched};
use super::extract::{Caller, P, Q};
use crate::Hub;
use crate::catalog::Role;
use crate::error::{HubError, HubResult, ok};
use crate::ids::{self, NotebookId, ProjectId, UtcDay};
use crate::store::{EventFilter, EventRow};

/// Most days one read of every project's events spans.
pub const MAX_DAYS: i64 = 30;

#[derive(Serialize, ToSchema)]
pub struct EventView {
    pub id: String,
    pub ts: String,
    pub event: String,
    pub actor: String,
    pub project_id: Option<ProjectId>,
    pub notebook_id: Option<NotebookId>,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

impl From<EventRow> for EventView {
    fn from(e: EventRow) -> Self {
        EventView {
            ts: ids::rfc3339(e.ts_ms),
            id: e.id,
            event: e.event,
            actor: e.actor,
            project_id: e.project_id,
            notebook_id: e.notebook_id,
            detail: e.detail,
        }
    }
}

envelope!(EventPageEnvelope, Page<EventView>);

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProjectEventsQuery {
    /// Only this UTC day (`YYYY-MM-DD`).
    #[param(value_type = Option<String>, example = "2026-12-02")]
    pub date: Option<UtcDay>,
    /// At most 1000; default 100.
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// The first UTC day (`YYYY-MM-DD`; alone: that day).
    #[param(value_type = Option<String>, example = "2026-11-01")]
    pub from: Option<UtcDay>,
    /// The last UTC day, at most 30 days from `from` (alone: that day).
    #[param(value_type = Option<String>, example = "2026-11-30")]
    pub to: Option<UtcDay>,
    /// At most 1000; default 100.
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

fn limit(l: Option<u32>) -> usize {
    l.unwrap_or(100).clamp(1, 1000) as usize
}

async fn page_of(
    hub: &Hub,
    filter: EventFilter<'_>,
    cursor: Option<&str>,
    limit: usize,
) -> HubResult<Page<EventView>> {
    let items = hub
        .store
        .events(filter, cursor, limit as u32 + 1)
        .await?
        .into_iter()
        .map(EventView::from)
        .collect();
    Ok(page_of_fetched(items, limit, |e: &EventView| e.id.clone()))
}

/// The project's audit events, newest first (manager); `date` keeps one UTC day.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/events", tag = "projects",
    params(("pid" = String, Path), ProjectEventsQuery),
    responses((status = 200, body = EventPageEnvelope), (status = 403, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn list_events(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    Q(q): Q<ProjectEventsQuery>,
) -> HubResult<Response> {
    hub.project_for(&user, &pid, Role::Manager).await?;
    let filter = EventFilter {
        project: Some(&pid),
        from_ms: q.date.map(UtcDay::start_ms),
        until_ms: q.date.map(UtcDay::end_ms),
    };
    Ok(ok(page_of(
        &hub,
        filter,
        q.cursor.as_deref(),
        limit(q.limit),
    )
    .await?))
}

/// Every project's audit events, newest first (super admins), from `from` through `to`
/// (UTC days, at most 30); without either, the most recent events.
#[utoipa::path(get, path = "/api/v1/events", tag = "projects", params(EventsQuery),
    responses((status = 200, body = EventPageEnvelope), (status = 401, body = ErrorEnvelope),
        (status = 403, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn list_all_events(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Q(q): Q<EventsQuery>,
) -> HubResult<Response> {
    if !hub.is_super_admin(&user) {
        return Err(HubError::forbidden(
            "every project's events are for super admins; a project's manager reads its own",
        ));
    }
    let range = match (q.from, q.to) {
        (None, None) => None,
        (Some(from), None) => Some((from, from)),
        (None, Some(to)) => Some((to, to)),
        (Some(from), Some(to)) => Some((from, to)),
    };
    if let Some((from, to)) = range {
        let days = from.days_to(to) + 1;
        if days < 1 {
            return Err(HubError::invalid("to is before from"));
        }
        if days > MAX_DAYS {
            return Err(HubError::invalid(format!(
                "at most {MAX_DAYS} days per read, asked for {days}"
            )));
        }
    }
    let filter = EventFilter {
        project: None,
        from_ms: range.map(|(from, _)| from.start_ms()),
        until_ms: range.map(|(_, to)| to.end_ms()),
    };
    Ok(ok(page_of(
        &hub,
        filter,
        q.cursor.as_deref(),
        limit(q.limit),
    )
    .await?))
}
