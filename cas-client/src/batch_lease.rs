//! The batch lease route (`POST /v1/cas/leases`) as a client calls it: elements without bytes
//! or with base64 content in a JSON body, or inline nodes raw after the JSON in the binary
//! body ([`BATCH_LEASE_BINARY`]), which spares every inline byte its encoding.

use bytes::Bytes;
use cas_format::SpaceId;
use cas_format::wire::{
    BATCH_LEASE_BINARY, BatchLeaseElement, BatchLeaseRequest, BatchLeaseResponse, BatchLeaseResult,
    batch_body_head,
};
use reqwest::Method;

use crate::client::{AppCasClient, Call, perm};
use crate::error::ClientError;

impl AppCasClient {
    /// One batch lease call: up to [`cas_format::wire::MAX_BATCH_LEASES`] elements, answered in order, each with
    /// its lease answer or its own error. Leases are idempotent, so the call is retried as a
    /// whole on transient failures.
    pub async fn lease_batch(
        &self,
        space: &SpaceId,
        leases: Vec<BatchLeaseElement>,
    ) -> Result<Vec<BatchLeaseResult>, ClientError> {
        let n = leases.len();
        let body = serde_json::to_vec(&BatchLeaseRequest { leases })
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        self.lease_batch_parts(space, n, vec![Bytes::from(body)], "application/json")
            .await
    }

    /// Leases a batch whose inline nodes travel as raw bytes (the binary body): each element
    /// with a node carries it (and names its length); results in order.
    pub async fn lease_batch_raw(
        &self,
        space: &SpaceId,
        leases: Vec<(BatchLeaseElement, Option<Bytes>)>,
    ) -> Result<Vec<BatchLeaseResult>, ClientError> {
        let mut elements = Vec::with_capacity(leases.len());
        let mut nodes = Vec::new();
        for (mut e, node) in leases {
            if let Some(node) = node {
                e.content = None;
                e.content_bytes = Some(node.len() as u64);
                nodes.push(node);
            }
            elements.push(e);
        }
        let n = elements.len();
        let json = serde_json::to_vec(&BatchLeaseRequest { leases: elements })
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        let head = batch_body_head(&json).map_err(|e| ClientError::Invalid(e.to_string()))?;
        // The nodes follow the head as parts of their own: no byte of them is copied into
        // one buffer before it is sent.
        let mut parts = Vec::with_capacity(1 + nodes.len());
        parts.push(Bytes::from(head));
        parts.extend(nodes);
        self.lease_batch_parts(space, n, parts, BATCH_LEASE_BINARY)
            .await
    }

    /// Sends a batch lease body of `n` elements, in `parts` sent one after the other; its `n`
    /// results, in order.
    async fn lease_batch_parts(
        &self,
        space: &SpaceId,
        n: usize,
        parts: Vec<Bytes>,
        media_type: &'static str,
    ) -> Result<Vec<BatchLeaseResult>, ClientError> {
        let call = Call::new(Method::POST, "/v1/cas/leases", space, perm::LEASE)
            .body_parts(parts, media_type);
        let answer: BatchLeaseResponse = self.json(call).await?;
        if answer.results.len() != n {
            return Err(ClientError::Protocol(format!(
                "a batch of {n} leases was answered with {} results",
                answer.results.len()
            )));
        }
        Ok(answer.results)
    }
}
