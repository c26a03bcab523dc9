//! The seed-000 envelope in the OpenAPI document (`{"success": true, "data": …}` or
//! `{"success": false, "error": {"code", "message", …}}`), and pages of lists.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// The error envelope.
#[derive(Serialize, ToSchema)]
pub struct ErrorEnvelope {
    pub success: bool,
    pub error: ErrorInfo,
}

/// `code` is stable: `UNAUTHORIZED`, `FORBIDDEN`, `NOT_FOUND`, `CONFLICT`, `VALIDATION_ERROR`,
/// `PAYLOAD_TOO_LARGE`, `INTERNAL_ERROR`, `UNAVAILABLE`, `busy` (with `Retry-After`),
/// `insufficient_storage`, `quota_exceeded` (with `quota`, `limit`), `host_not_allowed`,
/// `origin_not_allowed`, `workspace_conflict` (with `actual_revision`, `expected_revision`,
/// `reason`), `workspace_busy` (with `name`, `timeout_seconds`, `reason`), `revision_pruned`
/// (with `revision`), `name_taken` (with `title`), `idempotency_key_reused` (an
/// `Idempotency-Key` sent again with another body).
#[derive(Serialize, ToSchema)]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
}

/// Declares the success envelope of a route's `data`, for the OpenAPI document.
macro_rules! envelope {
    ($name:ident, $t:ty) => {
        #[derive(serde::Serialize, utoipa::ToSchema)]
        #[allow(dead_code)]
        pub struct $name {
            pub success: bool,
            pub data: $t,
        }
    };
}
pub(crate) use envelope;

#[derive(Serialize, ToSchema)]
pub struct Empty {}

envelope!(EmptyEnvelope, Empty);

/// A page of a list, newest or first by the route's order.
#[derive(Serialize, ToSchema)]
pub struct Page<T: ToSchema> {
    pub items: Vec<T>,
    /// Pass as `cursor` for the next page; `null` at the end.
    pub next_cursor: Option<String>,
}

#[derive(Deserialize, IntoParams, Default)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// At most 1000; default 100.
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

impl PageQuery {
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(100).clamp(1, 1000) as usize
    }
}

/// Pages a list in its order by the id of the last item seen.
pub fn page<T: ToSchema>(items: Vec<T>, q: &PageQuery, id: impl Fn(&T) -> String) -> Page<T> {
    let start = match &q.cursor {
        Some(c) => items
            .iter()
            .position(|i| id(i) == *c)
            .map_or(items.len(), |p| p + 1),
        None => 0,
    };
    let limit = q.limit();
    let mut rest: Vec<T> = items.into_iter().skip(start).collect();
    let more = rest.len() > limit;
    rest.truncate(limit);
    let next_cursor = if more { rest.last().map(&id) } else { None };
    Page {
        items: rest,
        next_cursor,
    }
}

/// A page from `limit + 1` items fetched in order: the cursor is the last one's `id` when there
/// are more.
pub fn page_of_fetched<T: ToSchema>(
    mut items: Vec<T>,
    limit: usize,
    id: impl Fn(&T) -> String,
) -> Page<T> {
    let more = items.len() > limit;
    items.truncate(limit);
    let next_cursor = if more { items.last().map(id) } else { None };
    Page { items, next_cursor }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_by_cursor() {
        let q = |limit, cursor: Option<&str>| PageQuery {
            limit: Some(limit),
            cursor: cursor.map(str::to_string),
        };
        let items = || (1..=5).map(|i| i.to_string()).collect::<Vec<_>>();
        let p = page(items(), &q(2, None), |s| s.clone());
        assert_eq!(
            (p.items, p.next_cursor),
            (vec!["1".into(), "2".into()], Some("2".into()))
        );
        let p = page(items(), &q(2, Some("4")), |s| s.clone());
        assert_eq!((p.items, p.next_cursor), (vec!["5".to_string()], None));
        let p = page(items(), &q(2, Some("nope")), |s| s.clone());
        assert!(p.items.is_empty());
        assert_eq!(PageQuery::default().limit(), 100);
        assert_eq!(q(5000, None).limit(), 1000);
        let p = page_of_fetched(items(), 4, |s| s.clone());
        assert_eq!(p.next_cursor.as_deref(), Some("4"));
    }
}
