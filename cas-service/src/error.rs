//! `ApiError`: the one error every route answers with. It owns the status, the stable code and
//! a safe message; internal causes (SQL, object store, paths) are logged, never returned.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cas_format::wire::ErrorBody;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for `Retry-After` (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message)
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }

    pub fn too_many(code: &'static str, message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after.max(1)),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, code, message)
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "SERVICE_UNAVAILABLE",
                message,
            )
        }
    }

    /// An internal failure: logs the cause with context and answers a generic 500.
    pub fn internal(context: &str, cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "{context}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "internal error; the operation may be retried",
        )
    }

    /// An object-store failure: 507 when the local disk is below its free-space floor (nothing
    /// was written), else as [`ApiError::storage_unavailable`].
    pub fn blob(context: &str, cause: crate::blob::BlobError) -> Self {
        match cause {
            crate::blob::BlobError::Full { free, floor } => {
                tracing::warn!(
                    free,
                    floor,
                    "{context}: the disk is below its free-space floor"
                );
                ApiError {
                    retry_after: Some(60),
                    ..Self::new(
                        StatusCode::INSUFFICIENT_STORAGE,
                        "INSUFFICIENT_STORAGE",
                        "the server's disk is nearly full; nothing was written",
                    )
                }
            }
            other => Self::storage_unavailable(context, other),
        }
    }

    /// A storage dependency failed in a way a retry may fix.
    pub fn storage_unavailable(context: &str, cause: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %cause, "{context}");
        ApiError {
            code: "STORAGE_ERROR",
            ..Self::unavailable("storage is temporarily unavailable; retry")
        }
    }
}

impl std::fmt::Display for ApiError {
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_string(),
            message: self.message,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        if database_unavailable(&e) {
            ApiError::storage_unavailable("database unavailable", e)
        } else {
            ApiError::internal("database error", e)
        }
    }
}

/// Whether a database error says the database could not serve this request now rather than
/// that the request went wrong: the pool or the connection failed, the server ended the
/// session (its connection terminated, the server shutting down or not yet accepting, too many
/// connections), or it cancelled the transaction to resolve a conflict (serialization failure,
/// deadlock). Sent again, the same request may well succeed.
fn database_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| unavailable_sqlstate(&c)),
        _ => false,
    }
}

/// The PostgreSQL SQLSTATEs of [`database_unavailable`]: connection exceptions (class 08),
/// admin or crash shutdown and "cannot connect now" (57P01–57P03), too many connections
/// (53300), serialization failure (40001) and deadlock (40P01). SQLite's codes are numbers
/// below 10,000 and match none of them.
fn unavailable_sqlstate(code: &str) -> bool {
    code.len() == 5
        && (code.starts_with("08")
            || matches!(
                code,
                "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01"
            ))
}

impl From<crate::meta::BalanceReadError> for ApiError {
    fn from(e: crate::meta::BalanceReadError) -> Self {
        match e {
            crate::meta::BalanceReadError::Database(e) => e.into(),
            too_old @ crate::meta::BalanceReadError::TooFarBehind { .. } => {
                ApiError::invalid(too_old.to_string())
            }
        }
    }
}

/// Result alias of the service.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::BalanceReadError;

    /// A lost connection, a shutdown, too many connections and a conflict the database
    /// resolved by cancelling are retryable; a constraint, a syntax error, a raised exception
    /// and every SQLite code (numbers) are not.
    #[test]
    fn which_database_errors_are_retryable() {
        for code in [
            "08006", "08003", "57P01", "57P02", "57P03", "53300", "40001", "40P01",
        ] {
            assert!(unavailable_sqlstate(code), "{code}");
        }
        for code in [
            "23505", "42601", "P0001", "57014", "5", "517", "08", "080060",
        ] {
            assert!(!unavailable_sqlstate(code), "{code}");
        }
    }

    /// A page whose cursor is too far behind is the client's to restart: 400 with what to do;
    /// a database failure stays a server error.
    #[test]
    fn balance_reads_answer_by_cause() {
        let e = ApiError::from(BalanceReadError::TooFarBehind {
            revision: 3,
            current: 200_000,
        });
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, "INVALID_REQUEST")
        );
        assert!(
            e.message.contains("read again from the first page"),
            "{}",
            e.message
        );
        let e = ApiError::from(BalanceReadError::Database(sqlx::Error::PoolTimedOut));
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
