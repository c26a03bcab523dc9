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
}

pub type HubResult<T> = Result<T, HubError>;

impl HubError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        HubError {
            status,
            code,
            message: message.into(),
            details: Map::new(),
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
        let retry = (self.status == StatusCode::SERVICE_UNAVAILABLE).then_some("1");
        let mut resp = (
            self.status,
            axum::Json(json!({"success": false, "error": Value::Object(error)})),
        )
            .into_response();
        if let Some(r) = retry
            && let Ok(v) = r.parse()
        {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, v);
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
