//! Upload objects copied into place within the object store. An upload a client wrote to S3
//! through a presigned URL can be created there but never written again (the URL is signed
//! with `If-None-Match: *`), and the entity tag of the read that validated it names the
//! version validated: a copy asked of that version alone, and checked after to be a copy of
//! it, puts nothing in place but the bytes that were validated, without the service sending
//! them again.

use super::{Backend, BlobError, BlobStore, ObjectReader};

/// An object of the store as one read saw it: which version (its entity tag) and how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedObject {
    pub key: String,
    pub etag: String,
    pub len: u64,
}

impl BlobStore {
    /// The object at `key`, read whole, and the version read when the store copies objects
    /// within itself (S3); `None` when nothing is there.
    pub async fn get_staged(
        &self,
        key: &str,
    ) -> Result<Option<(ObjectReader, u64, Option<StagedObject>)>, BlobError> {
        self.timed("get", async {
            Ok(match &self.backend {
                Backend::Fs(fs) => fs.get(key, None).await?.map(|(r, len)| (r, len, None)),
                Backend::S3(s3) => s3.get_tagged(key, None).await?.map(|(r, len, tag)| {
                    let staged = tag.map(|etag| StagedObject {
                        key: key.to_string(),
                        etag,
                        len,
                    });
                    (r, len, staged)
                }),
            })
        })
        .await
    }

    /// Copies the version `from` names to `to` within the store, checked (see the module);
    /// `Ok(false)` when that version is no longer there, or on a store whose objects are
    /// files (they are adopted by a link instead, [`BlobStore::adopt`]).
    pub async fn copy_staged(&self, from: &StagedObject, to: &str) -> Result<bool, BlobError> {
        match &self.backend {
            Backend::Fs(_) => Ok(false),
            Backend::S3(s3) => {
                self.timed("copy", s3.copy_checked(&from.key, &from.etag, to))
                    .await
            }
        }
    }
}
