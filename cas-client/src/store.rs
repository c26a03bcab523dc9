//! Storing nodes: the lease, upload, lease loop for one node.

use bytes::Bytes;
use cas_format::wire::LeaseResponse;
use cas_format::{Hash, SpaceId};
use tokio::sync::Semaphore;

use crate::client::AppCasClient;
use crate::error::ClientError;

/// Where a node stands after [`AppCasClient::ensure_node`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    /// Ready and leased until this time (ms since the epoch).
    Ready { lease_expires_at: i64 },
    /// Uploaded and valid, but these children are not ready yet.
    AwaitingChildren(Vec<Hash>),
}

/// What one `ensure_node` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsureReport {
    pub state: Ensured,
    /// Bytes this call uploaded (0 when the node was already there).
    pub uploaded_bytes: u64,
}

/// Rounds of lease and upload before giving up on a node.
const MAX_ROUNDS: usize = 8;

impl AppCasClient {
    /// Leases `hash` and, when the service asks for it, uploads `portable` (its portable full
    /// node), until the node is ready or waits for children. Bytes the service refuses after
    /// this call uploaded them are an error carrying the rejection code.
    pub async fn ensure_node(
        &self,
        space: &SpaceId,
        hash: &Hash,
        portable: &Bytes,
        lease_ms: u64,
    ) -> Result<EnsureReport, ClientError> {
        self.lease_and_upload(
            space,
            hash,
            portable.len() as u64,
            lease_ms,
            None,
            None,
            None,
            || async { Ok(portable.clone()) },
        )
        .await
    }

    /// The one lease-and-upload loop: starting from `first` (a lease answer already in hand)
    /// or a lease, uploads what `bytes` gives whenever the service asks for it, until the node
    /// is ready or waits for children. With `calls`, every request holds one of its permits,
    /// and the bytes are read only once a permit is held, so at most as many nodes as permits
    /// are in memory.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn lease_and_upload<F, Fut>(
        &self,
        space: &SpaceId,
        hash: &Hash,
        portable_len: u64,
        lease_ms: u64,
        calls: Option<&Semaphore>,
        mut first: Option<LeaseResponse>,
        delta_base: Option<Hash>,
        bytes: F,
    ) -> Result<EnsureReport, ClientError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Bytes, ClientError>>,
    {
        let permit = || async {
            match calls {
                Some(s) => s
                    .acquire()
                    .await
                    .map(Some)
                    .map_err(|_| ClientError::Cancelled),
                None => Ok(None),
            }
        };
        let mut uploaded = 0u64;
        let mut uploaded_once = false;
        for _ in 0..MAX_ROUNDS {
            let response = match first.take() {
                Some(r) => r,
                None => {
                    let _p = permit().await?;
                    self.lease_node_based(space, hash, lease_ms, Some(portable_len), delta_base)
                        .await?
                }
            };
            let upload = match response {
                LeaseResponse::Ready {
                    lease_expires_at, ..
                } => {
                    return Ok(EnsureReport {
                        state: Ensured::Ready { lease_expires_at },
                        uploaded_bytes: uploaded,
                    });
                }
                LeaseResponse::ValidatedAwaitingChildren { child_hashes, .. } => {
                    return Ok(EnsureReport {
                        state: Ensured::AwaitingChildren(child_hashes),
                        uploaded_bytes: uploaded,
                    });
                }
                LeaseResponse::AwaitingReplacementUpload {
                    upload, rejection, ..
                } => {
                    if uploaded_once {
                        return Err(ClientError::Api {
                            status: 422,
                            code: rejection.code,
                            message: format!("node {hash}: {}", rejection.message),
                            retry_after: None,
                        });
                    }
                    upload
                }
                LeaseResponse::AwaitingUpload { upload, .. } => upload,
            };
            let _p = permit().await?;
            let body = bytes().await?;
            let len = body.len() as u64;
            self.upload(&upload, body).await?;
            uploaded += len;
            uploaded_once = true;
        }
        Err(ClientError::Protocol(format!(
            "node {hash} did not become ready after {MAX_ROUNDS} rounds of lease and upload"
        )))
    }
}
