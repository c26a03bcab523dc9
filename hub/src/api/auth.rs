//! The caller and their personal access tokens.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::envelope::{Empty, EmptyEnvelope, ErrorEnvelope, envelope};
use super::extract::{Caller, JsonBody};
use crate::Hub;
use crate::auth::{TokenView, User};
use crate::error::{HubError, HubResult, ok, ok_status};
use crate::store::TokenScope;

#[derive(Serialize, ToSchema)]
pub struct NewToken {
    /// Shown this once.
    pub token: String,
    #[serde(flatten)]
    pub info: TokenView,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTokenRequest {
    pub name: String,
    /// Lifetime in days (default: no expiry).
    #[serde(default)]
    pub expires_in_days: Option<u32>,
    /// Limits the token (credential version 2) to some projects and a highest role; it never
    /// does more than its user may. Absent: the user's whole authority.
    #[serde(default)]
    pub scope: Option<TokenScope>,
}

/// Token management needs the user's whole authority, not a scoped token's.
fn unscoped(user: &User) -> HubResult<()> {
    match user.scope {
        None => Ok(()),
        Some(_) => Err(HubError::forbidden(
            "a scoped token cannot list, create or revoke tokens",
        )),
    }
}

envelope!(MeEnvelope, User);
envelope!(TokensEnvelope, Vec<TokenView>);
envelope!(NewTokenEnvelope, NewToken);

/// The caller.
#[utoipa::path(get, path = "/api/v1/auth/me", tag = "auth",
    responses((status = 200, body = MeEnvelope), (status = 401, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn me(Caller(user): Caller) -> HubResult<Response> {
    Ok(ok(user))
}

/// The caller's live personal access tokens.
#[utoipa::path(get, path = "/api/v1/auth/tokens", tag = "auth",
    responses((status = 200, body = TokensEnvelope), (status = 401, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn list_tokens(State(hub): State<Hub>, Caller(user): Caller) -> HubResult<Response> {
    unscoped(&user)?;
    Ok(ok(hub.list_tokens(&user.id).await?))
}

/// Creates a personal access token for the caller; the token is in this answer only.
#[utoipa::path(post, path = "/api/v1/auth/tokens", tag = "auth", request_body = NewTokenRequest,
    responses((status = 201, body = NewTokenEnvelope), (status = 401, body = ErrorEnvelope), (status = 403, body = ErrorEnvelope),
        (status = 409, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn create_token(
    State(hub): State<Hub>,
    Caller(user): Caller,
    JsonBody(req): JsonBody<NewTokenRequest>,
) -> HubResult<Response> {
    unscoped(&user)?;
    let ttl = req.expires_in_days.map(|d| i64::from(d) * 86_400_000);
    let (token, info) = hub
        .create_token(&user.id, &req.name, ttl, req.scope)
        .await?;
    Ok(ok_status(StatusCode::CREATED, NewToken { token, info }))
}

/// Revokes one of the caller's tokens.
#[utoipa::path(delete, path = "/api/v1/auth/tokens/{token_id}", tag = "auth",
    params(("token_id" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn revoke_token(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(token_id): Path<String>,
) -> HubResult<Response> {
    unscoped(&user)?;
    hub.revoke_token(&user.id, &token_id).await?;
    Ok(ok(Empty {}))
}
