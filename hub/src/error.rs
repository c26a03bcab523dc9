//! Errors and the JSON envelope: `{"success": true, "data": …}` or
//! `{"success": false, "error": {"code", "message", …details}}`. Causes are logged, never
//! returned.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use cas_client::ClientError;

#[derive(Debug)]
pub struct HubError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Map<String, Value>,
    /// Seconds for `Retry-After` (503 answers default to 1).
    pub retry_after: Option<u32>,
}

pub type HubResult<T> = Result<T, HubError>;

impl HubError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        HubError {
            status,
            code,
            message: message.into(),
            details: Map::new(),
            retry_after: None,
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_string(), value.into());
        self
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "FORBIDDEN", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "CONFLICT", message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "VALIDATION_ERROR",
            message,
        )
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE", message)
    }
    pub fn name_taken(title: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "name_taken",
            format!("a live notebook of this project is already named {title:?}; nothing was overwritten"),
        )
        .with("title", title)
    }
    /// A stated limit (`quota`, at most `limit`) would be exceeded; nothing was changed.
    pub fn quota(quota: &str, limit: u64, message: &str) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "quota_exceeded",
            format!("{message} (limit: {limit}); nothing was changed"),
        )
        .with("quota", quota)
        .with("limit", limit)
    }
    pub fn internal(context: &str, cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, "{context}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL_ERROR",
            format!("{context}; see the hub's log"),
        )
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message)
    }
    /// Too many requests of this kind are under way; retry after `seconds`.
    pub fn busy(message: impl Into<String>, seconds: u32) -> Self {
        HubError {
            retry_after: Some(seconds),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
        }
    }
    /// No Python runtime for sessions can be had.
    pub fn runtime_unavailable(message: impl Into<String>) -> Self {
        HubError {
            retry_after: Some(60),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "runtime_unavailable",
                message,
            )
        }
    }
    /// A stated limit of live sessions is reached.
    pub fn too_many_sessions(message: impl Into<String>, limit: u64) -> Self {
        HubError {
            retry_after: Some(30),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "session_limit", message)
        }
        .with("limit", limit)
    }
    /// An app pool has no free visit slot and may start no sandbox (seed 003).
    pub fn app_pool_full(retry_after: u32) -> Self {
        HubError {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "app_pool_full",
                "every sandbox of this app is full and no more may start; retry shortly",
            )
        }
    }
    /// The disk is below its free-space floor; nothing was written.
    pub fn insufficient_storage() -> Self {
        HubError {
            retry_after: Some(60),
            ..Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                "the hub's disk is nearly full; nothing was stored",
            )
        }
    }
}

impl From<sqlx::Error> for HubError {
    fn from(e: sqlx::Error) -> Self {
        HubError::internal("the hub database failed", e)
    }
}

impl From<ClientError> for HubError {
    fn from(e: ClientError) -> Self {
        match &e {
            ClientError::Transport(_) | ClientError::Cancelled => {
                tracing::warn!(error = %e, "CAS unreachable");
                HubError::unavailable(
                    "the content store is unreachable; nothing was changed, retry later",
                )
            }
            ClientError::Api { status, .. } if *status == 429 || *status >= 500 => {
                tracing::warn!(error = %e, "CAS unavailable");
                HubError::unavailable("the content store is unavailable; retry later")
            }
            _ => HubError::internal("the content store refused a request", e),
        }
    }
}

impl std::fmt::Display for HubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for HubError {
    fn into_response(self) -> Response {
        let mut error = Map::new();
        error.insert("code".into(), Value::from(self.code));
        error.insert("message".into(), Value::from(self.message));
        for (k, v) in self.details {
            error.insert(k, v);
        }
        let retry = self
            .retry_after
            .or((self.status == StatusCode::SERVICE_UNAVAILABLE).then_some(1));
        let mut resp = (
            self.status,
            axum::Json(json!({"success": false, "error": Value::Object(error)})),
        )
            .into_response();
        if let Some(r) = retry {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, r.into());
        }
        resp
    }
}

/// A success envelope.
pub fn ok<T: serde::Serialize>(data: T) -> Response {
    axum::Json(json!({"success": true, "data": data})).into_response()
}

/// A success envelope with a status (e.g. 201).
pub fn ok_status<T: serde::Serialize>(status: StatusCode, data: T) -> Response {
    (status, axum::Json(json!({"success": true, "data": data}))).into_response()
}
