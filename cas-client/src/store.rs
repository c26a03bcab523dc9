//! Storing nodes: the lease, upload, lease loop for one node.

use bytes::Bytes;
use cas_format::wire::LeaseResponse;
use cas_format::{Hash, SpaceId};

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
        let mut uploaded = 0u64;
        let mut uploaded_once = false;
        let size = Some(portable.len() as u64);
        for _ in 0..MAX_ROUNDS {
            match self.lease_node(space, hash, lease_ms, size).await? {
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
                            message: rejection.message,
                            retry_after: None,
                        });
                    }
                    self.upload(&upload, portable.clone()).await?;
                    uploaded += portable.len() as u64;
                    uploaded_once = true;
                }
                LeaseResponse::AwaitingUpload { upload, .. } => {
                    self.upload(&upload, portable.clone()).await?;
                    uploaded += portable.len() as u64;
                    uploaded_once = true;
                }
            }
        }
        Err(ClientError::Protocol(format!(
            "node {hash} did not become ready after {MAX_ROUNDS} rounds of lease and upload"
        )))
    }
}
