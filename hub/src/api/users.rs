//! People: the ids that authors, members and session starters are stored as, resolved to the
//! display identities they stand for, in one read.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use utoipa::IntoParams;

use super::envelope::{ErrorEnvelope, envelope};
use super::extract::{Caller, Q};
use crate::Hub;
use crate::error::{HubError, HubResult, ok};
use crate::store::Identity;

/// Most ids one read resolves.
pub const MAX_IDS: usize = 100;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsersQuery {
    /// Comma-separated user ids (at most 100); ids that are no user are left out.
    pub ids: String,
}

envelope!(IdentitiesEnvelope, Vec<Identity>);

/// The display identities of the given user ids, ordered by id.
#[utoipa::path(get, path = "/api/v1/users", tag = "users", params(UsersQuery),
    responses((status = 200, body = IdentitiesEnvelope), (status = 401, body = ErrorEnvelope),
        (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn list_users(
    State(hub): State<Hub>,
    Caller(_caller): Caller,
    Q(q): Q<UsersQuery>,
) -> HubResult<Response> {
    let ids: BTreeSet<&str> = q
        .ids
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if ids.len() > MAX_IDS {
        return Err(HubError::invalid(format!(
            "at most {MAX_IDS} ids per read, got {}",
            ids.len()
        )));
    }
    let ids: Vec<&str> = ids.into_iter().collect();
    Ok(ok(hub.store.identities(&ids).await?))
}
