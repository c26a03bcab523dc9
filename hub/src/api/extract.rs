//! What handlers take from a request: the caller, path ids (parsed once: an invalid id is a
//! 404, as for a resource that does not exist), JSON bodies and queries (a bad one is a 422
//! envelope), and streamed bodies.

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use futures_util::TryStreamExt;
use tokio_util::io::StreamReader;

use crate::Hub;
use crate::auth::User;
use crate::error::{HubError, HubResult};
use crate::idempotency::RequestKey;

/// The authenticated caller.
pub struct Caller(pub User);

impl FromRequestParts<Hub> for Caller {
    type Rejection = HubError;
    async fn from_request_parts(parts: &mut Parts, hub: &Hub) -> Result<Self, HubError> {
        hub.authenticate(&parts.method, &parts.headers)
            .await
            .map(Caller)
    }
}

/// Path parameters as typed ids; one that does not parse names nothing: 404.
pub struct P<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send> FromRequestParts<Hub> for P<T> {
    type Rejection = HubError;
    async fn from_request_parts(parts: &mut Parts, hub: &Hub) -> Result<Self, HubError> {
        match axum::extract::Path::<T>::from_request_parts(parts, hub).await {
            Ok(axum::extract::Path(v)) => Ok(P(v)),
            Err(e) => Err(HubError::not_found(
                e.body_text()
                    .trim_start_matches("Invalid URL: ")
                    .to_string(),
            )),
        }
    }
}

/// A JSON body; a bad one is a 422 envelope.
pub struct JsonBody<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequest<Hub> for JsonBody<T> {
    type Rejection = HubError;
    async fn from_request(req: Request, hub: &Hub) -> Result<Self, HubError> {
        match Json::<T>::from_request(req, hub).await {
            Ok(Json(v)) => Ok(JsonBody(v)),
            Err(JsonRejection::BytesRejection(e))
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(HubError::too_large(
                    "the JSON body is too large; stage large files with an upload",
                ))
            }
            Err(e) => Err(HubError::invalid(e.body_text())),
        }
    }
}

/// The JSON body of a create, with its `Idempotency-Key` (if any) bound to the body's digest.
pub struct CreateBody<T> {
    pub body: T,
    pub key: Option<RequestKey>,
}

impl<T: serde::de::DeserializeOwned> FromRequest<Hub> for CreateBody<T> {
    type Rejection = HubError;
    async fn from_request(req: Request, hub: &Hub) -> Result<Self, HubError> {
        let json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                let mime = v.split(';').next().unwrap_or("").trim();
                mime == "application/json" || mime.ends_with("+json")
            });
        if !json {
            return Err(HubError::invalid(
                "Expected request with `Content-Type: application/json`",
            ));
        }
        let headers = req.headers().clone();
        let bytes = match axum::body::Bytes::from_request(req, hub).await {
            Ok(b) => b,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(HubError::too_large(
                    "the JSON body is too large; stage large files with an upload",
                ));
            }
            Err(e) => return Err(HubError::invalid(e.body_text())),
        };
        let key = RequestKey::of_request(&headers, &bytes)?;
        let body = serde_json::from_slice(&bytes).map_err(|e| {
            HubError::invalid(format!(
                "Failed to deserialize the JSON body into the target type: {e}"
            ))
        })?;
        Ok(CreateBody { body, key })
    }
}

/// Query parameters; bad ones are a 422 envelope.
pub struct Q<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send> FromRequestParts<Hub> for Q<T> {
    type Rejection = HubError;
    async fn from_request_parts(parts: &mut Parts, hub: &Hub) -> Result<Self, HubError> {
        axum::extract::Query::<T>::from_request_parts(parts, hub)
            .await
            .map(|axum::extract::Query(v)| Q(v))
            .map_err(|e| HubError::invalid(e.body_text()))
    }
}

/// A request body as a reader.
pub fn body_reader(body: Body) -> impl tokio::io::AsyncRead + Unpin + Send + 'static {
    StreamReader::new(body.into_data_stream().map_err(std::io::Error::other))
}

/// Runs a write to its end even if the client goes away, so it never stops half way.
pub async fn spawn<T: Send + 'static>(
    f: impl std::future::Future<Output = HubResult<T>> + Send + 'static,
) -> HubResult<T> {
    tokio::spawn(f)
        .await
        .map_err(|e| HubError::internal("a write task failed", e))?
}
