//! `ClientError`: what a call can fail with. Service answers keep their stable code.

/// A failed client call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The service answered with an error body.
    #[error("{status} {code}: {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
        /// Seconds from `Retry-After`, if any.
        retry_after: Option<u64>,
    },
    /// The request could not be completed (connection refused, reset, timeout…).
    #[error("transport error: {0}")]
    Transport(String),
    /// The service answered something that breaks the contract.
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// Local input is invalid (a file, an archive, an argument).
    #[error("{0}")]
    Invalid(String),
    /// Reading or writing a local file failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The operation was cancelled.
    #[error("cancelled")]
    Cancelled,
}

impl ClientError {
    /// The stable code of a service error.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status of a service error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether retrying the same call may succeed: transport failures, 429, 502–504, 500
    /// (which the service answers only for internal failures a retry may not meet), and an
    /// issuer registry the service could not reach.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport(_) => true,
            ClientError::Api { status, code, .. } => {
                matches!(status, 429 | 500 | 502 | 503 | 504)
                    // The service could not reach its issuer registry (it fails closed, 401).
                    || code == "registry_unavailable"
            }
            _ => false,
        }
    }

    pub(crate) fn io(context: impl std::fmt::Display, source: std::io::Error) -> Self {
        ClientError::Io {
            context: context.to_string(),
            source,
        }
    }
}

impl From<reqwest::Error> for ClientError {
    fn from(e: reqwest::Error) -> Self {
        // Without the URL: it may carry a signed query string.
        ClientError::Transport(e.without_url().to_string())
    }
}
