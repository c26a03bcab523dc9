//! The S3 object store (any S3-compatible server) through `aws-sdk-s3`. Credentials and region
//! come from the standard AWS chain (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, profiles, instance roles); endpoint and path-style addressing from the
//! configuration.

use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::error::{DisplayErrorContext, SdkError};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use cas_format::NODE_MEDIA_TYPE;

use super::{
    BlobError, BodyStream, ListedObject, ObjectReader, Presigned, PutOnceError, SafeDir, Spool,
    SpoolFile,
};
use crate::config::Config;

/// What a copy source's key escapes: all but the unreserved characters and `/`.
const COPY_SOURCE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// An entity tag without the quotes it is sent in.
fn unquoted(tag: &str) -> &str {
    tag.trim_matches('"')
}

/// Keys one `DeleteObjects` request names at most (the S3 limit).
const DELETE_BATCH: usize = 1000;

#[derive(Debug, Clone)]
pub struct S3Store {
    client: Client,
    bucket: String,
    prefix: String,
    spool: Spool,
}

/// A body that reads a spool file through its open handle, from the start, on every attempt
/// (`/proc/self/fd` names the open file itself, so no link can redirect it).
async fn spool_body(spool: &SpoolFile, key: &str, len: u64) -> Result<ByteStream, BlobError> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", spool.file().as_raw_fd());
    ByteStream::read_from()
        .path(path)
        .length(aws_sdk_s3::primitives::Length::Exact(len))
        .build()
        .await
        .map_err(|e| BlobError::S3 {
            op: "read spool for",
            key: key.to_string(),
            message: e.to_string(),
        })
}

fn s3_err<E, R>(op: &'static str, key: &str, e: SdkError<E, R>) -> BlobError
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    BlobError::S3 {
        op,
        key: key.to_string(),
        message: DisplayErrorContext(&e).to_string(),
    }
}

impl S3Store {
    pub async fn open(config: &Config, url: &str) -> anyhow::Result<Self> {
        let rest = url.strip_prefix("s3://").unwrap_or(url);
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            anyhow::bail!("blob store URL {url:?} names no bucket");
        }
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &config.s3_region {
            loader = loader.region(Region::new(region.clone()));
        }
        let sdk = loader.load().await;
        let mut builder = aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(config.s3_path_style)
            // Checksums only where S3 requires them, so presigned URLs carry no checksum of
            // bytes the service has not seen.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(60))
                    .build(),
            );
        if sdk.region().is_none() {
            builder = builder.region(Region::new("us-east-1"));
        }
        if let Some(endpoint) = &config.s3_endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        let dir = config.data_dir.join("spool");
        let spool = SafeDir::open_root(&dir, true)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", dir.display()))?;
        Ok(S3Store {
            client: Client::from_conf(builder.build()),
            bucket: bucket.to_string(),
            prefix,
            spool: Spool::new(spool, config.min_free_bytes),
        })
    }

    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub async fn presign_put_once(
        &self,
        key: &str,
        expires_in_ms: u64,
        length: Option<u64>,
    ) -> Result<Presigned, BlobError> {
        let config =
            PresigningConfig::expires_in(Duration::from_millis(expires_in_ms)).map_err(|e| {
                BlobError::S3 {
                    op: "presign",
                    key: key.to_string(),
                    message: e.to_string(),
                }
            })?;
        let req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.key(key))
            .if_none_match("*")
            .content_type(NODE_MEDIA_TYPE)
            .set_content_length(length.map(|n| n as i64))
            .presigned(config)
            .await
            .map_err(|e| s3_err("presign", key, e))?;
        let headers = req
            .headers()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
            .collect();
        Ok(Presigned {
            url: req.uri().to_string(),
            headers,
        })
    }

    pub async fn put_once(
        &self,
        key: &str,
        body: BodyStream,
        max: u64,
    ) -> Result<u64, PutOnceError> {
        let (spool, written) = self.spool.write(key, body, max).await?;
        let body = spool_body(&spool, key, written).await?;
        let result = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.key(key))
            .if_none_match("*")
            .content_type(NODE_MEDIA_TYPE)
            .content_length(written as i64)
            .body(body)
            .send()
            .await;
        match result {
            Ok(_) => Ok(written),
            Err(SdkError::ServiceError(e)) if e.raw().status().as_u16() == 412 => {
                Err(PutOnceError::Exists)
            }
            Err(e) => Err(s3_err("put", key, e).into()),
        }
    }

    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BlobError> {
        let len = bytes.len() as u64;
        self.put_object(key, len, ByteStream::from(bytes)).await
    }

    pub async fn put_file(&self, key: &str, spool: SpoolFile, len: u64) -> Result<(), BlobError> {
        let body = spool_body(&spool, key, len).await?;
        self.put_object(key, len, body).await?;
        drop(spool);
        Ok(())
    }

    /// One PUT of `len` bytes of `body` at `key`.
    async fn put_object(&self, key: &str, len: u64, body: ByteStream) -> Result<(), BlobError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(self.key(key))
            .content_length(len as i64)
            .body(body)
            .send()
            .await
            .map_err(|e| s3_err("put", key, e))?;
        Ok(())
    }

    pub async fn get(
        &self,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Option<(ObjectReader, u64)>, BlobError> {
        if let Some((start, end)) = range
            && end <= start
        {
            // An empty range cannot be asked of S3; the object's existence still matters.
            return Ok(self
                .head(key)
                .await?
                .map(|len| (Box::pin(tokio::io::empty()) as ObjectReader, len)));
        }
        Ok(self
            .get_tagged(key, range)
            .await?
            .map(|(r, len, _)| (r, len)))
    }

    /// As [`S3Store::get`] (`range` not empty), with the entity tag of the version read.
    pub async fn get_tagged(
        &self,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Option<(ObjectReader, u64, Option<String>)>, BlobError> {
        let mut req = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.key(key));
        if let Some((start, end)) = range {
            req = req.range(format!("bytes={start}-{}", end - 1));
        }
        match req.send().await {
            Ok(out) => {
                let total = match (range, out.content_range()) {
                    (Some(_), Some(cr)) => cr
                        .rsplit('/')
                        .next()
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0),
                    _ => out.content_length().unwrap_or(0).max(0) as u64,
                };
                let tag = out.e_tag().map(str::to_string);
                Ok(Some((Box::pin(out.body.into_async_read()), total, tag)))
            }
            Err(SdkError::ServiceError(e)) if e.err().is_no_such_key() => Ok(None),
            Err(SdkError::ServiceError(e)) if e.raw().status().as_u16() == 404 => Ok(None),
            Err(e) => Err(s3_err("get", key, e)),
        }
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, BlobError> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.key(key))
            .send()
            .await
        {
            Ok(out) => Ok(Some(out.content_length().unwrap_or(0).max(0) as u64)),
            Err(SdkError::ServiceError(e)) if e.raw().status().as_u16() == 404 => Ok(None),
            Err(e) => Err(s3_err("head", key, e)),
        }
    }

    /// Copies the object at `from`, the version whose entity tag is `etag`, to `to` within
    /// the bucket: asked only of that version (`x-amz-copy-source-if-match`), and checked
    /// after to have made a copy of it (the copy's tag is the source's: a store that ignored
    /// the condition is caught there). `Ok(false)` when the source is not that version any
    /// more (whatever was copied is removed again). Where entity tags are not digests of the
    /// bytes (SSE-KMS), a copy's tag may differ from its source's: the check then refuses the
    /// copy and the caller sends the content as it did before copies.
    pub async fn copy_checked(&self, from: &str, etag: &str, to: &str) -> Result<bool, BlobError> {
        let source = format!(
            "{}/{}",
            self.bucket,
            percent_encoding::utf8_percent_encode(&self.key(from), COPY_SOURCE)
        );
        let result = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(self.key(to))
            .copy_source(source)
            .copy_source_if_match(etag)
            .send()
            .await;
        let copied = match result {
            Ok(out) => out
                .copy_object_result()
                .and_then(|r| r.e_tag())
                .map(|tag| unquoted(tag).to_string()),
            Err(SdkError::ServiceError(e)) if e.raw().status().as_u16() == 412 => return Ok(false),
            Err(e) => return Err(s3_err("copy", to, e)),
        };
        if copied.as_deref() == Some(unquoted(etag)) {
            return Ok(true);
        }
        self.delete(to).await?;
        Ok(false)
    }

    pub async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.key(key))
            .send()
            .await
            .map_err(|e| s3_err("delete", key, e))?;
        Ok(())
    }

    /// Deletes `keys` with `DeleteObjects`, up to 1,000 a request; answers one result per key,
    /// in order (a missing object is fine).
    pub async fn delete_many(&self, keys: &[String]) -> Vec<Result<(), BlobError>> {
        use aws_sdk_s3::types::{Delete, ObjectIdentifier};
        let failed = |key: &String, message: &str| {
            Err(BlobError::S3 {
                op: "delete",
                key: key.clone(),
                message: message.to_string(),
            })
        };
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(DELETE_BATCH) {
            let ids: Result<Vec<ObjectIdentifier>, _> = chunk
                .iter()
                .map(|k| ObjectIdentifier::builder().key(self.key(k)).build())
                .collect();
            let request =
                ids.and_then(|ids| Delete::builder().set_objects(Some(ids)).quiet(true).build());
            let delete = match request {
                Ok(d) => d,
                Err(e) => {
                    let message = e.to_string();
                    out.extend(chunk.iter().map(|k| failed(k, &message)));
                    continue;
                }
            };
            match self
                .client
                .delete_objects()
                .bucket(&self.bucket)
                .delete(delete)
                .send()
                .await
            {
                Ok(answer) => {
                    // Quiet mode: only the keys that failed are listed.
                    let refused: std::collections::HashMap<&str, String> = answer
                        .errors()
                        .iter()
                        .filter_map(|e| {
                            let key = e.key()?.strip_prefix(&self.prefix)?;
                            let message = format!(
                                "{}: {}",
                                e.code().unwrap_or("error"),
                                e.message().unwrap_or("")
                            );
                            Some((key, message))
                        })
                        .collect();
                    out.extend(chunk.iter().map(|k| match refused.get(k.as_str()) {
                        Some(message) => failed(k, message),
                        None => Ok(()),
                    }));
                }
                Err(e) => {
                    let message = DisplayErrorContext(&e).to_string();
                    out.extend(chunk.iter().map(|k| failed(k, &message)));
                }
            }
        }
        out
    }

    pub async fn list(&self, prefix: &str) -> Result<Vec<ListedObject>, BlobError> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(self.key(prefix))
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| s3_err("list", prefix, e))?;
            for o in page.contents() {
                let Some(key) = o.key().and_then(|k| k.strip_prefix(&self.prefix)) else {
                    continue;
                };
                out.push(ListedObject {
                    key: key.to_string(),
                    size: o.size().unwrap_or(0).max(0) as u64,
                    modified_ms: o
                        .last_modified()
                        .and_then(|t| t.to_millis().ok())
                        .unwrap_or(0),
                });
            }
        }
        Ok(out)
    }

    pub async fn ping(&self) -> bool {
        self.client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .is_ok()
    }
}
