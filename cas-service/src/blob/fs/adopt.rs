//! Uploads adopted as objects. An upload the service's own URL received is a file already:
//! it is held open by handle, read there for its validation, and then hard-linked into place
//! as the node's object, so that its bytes are written once. The link is made by name in the
//! upload's directory and then checked to be the very file that was read: nothing but the
//! validated bytes can become the object.

use std::fs::File;
use std::io::ErrorKind;

use super::{FsStore, SafeDir, io, split};
use crate::blob::{BlobError, blocking};

/// An upload held open by handle: the file its validation reads, and where it is named.
#[derive(Debug)]
pub struct HeldUpload {
    file: File,
    dir: SafeDir,
    name: String,
    len: u64,
}

impl HeldUpload {
    /// Its length when it was opened (uploads are never written again once in place).
    pub fn size(&self) -> u64 {
        self.len
    }

    /// The open file, for positional reads.
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl FsStore {
    /// The upload at `key`, held open by handle; `None` when nothing is there.
    pub async fn hold_upload(&self, key: &str) -> Result<Option<HeldUpload>, BlobError> {
        let root = self.root.clone();
        let (dirs, name) = split(key);
        let held = blocking(move || {
            let dir = root.descend(dirs.iter().map(String::as_str), false)?;
            let file = dir.open_file(&name)?;
            let len = file.metadata()?.len();
            Ok(HeldUpload {
                file,
                dir,
                name,
                len,
            })
        })
        .await;
        match held {
            Ok(h) => Ok(Some(h)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("open", key)(e)),
        }
    }

    /// Makes the held upload the object at `key`, durably, in one blocking task: its bytes
    /// fsynced, a hard link named `key` made and checked to be the file that was read (if it
    /// is not, it is removed again and the adoption refused), its directory fsynced. Fails
    /// with `AlreadyExists` if `key` exists, and with `NotFound` if the upload is gone.
    pub async fn adopt(&self, held: &HeldUpload, key: &str) -> Result<(), BlobError> {
        let root = self.root.clone();
        let owned = key.to_string();
        let from = held.dir.clone();
        let from_name = held.name.clone();
        let file = held.file.try_clone().map_err(io("adopt", key))?;
        blocking(move || {
            let (dirs, name) = split(&owned);
            file.sync_all()?;
            let dir = root.descend(dirs.iter().map(String::as_str), true)?;
            from.link(&from_name, &dir, &name)?;
            match dir.holds_file(&name, &file) {
                Ok(true) => dir.sync(),
                Ok(false) => {
                    let _ = dir.unlink(&name);
                    Err(std::io::Error::other(
                        "the upload was replaced while it was validated",
                    ))
                }
                Err(e) => {
                    let _ = dir.unlink(&name);
                    Err(e)
                }
            }
        })
        .await
        .map_err(io("adopt", key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn store() -> (tempfile::TempDir, FsStore) {
        let root = tempfile::tempdir().expect("dir");
        let store = FsStore::open(root.path(), 0).expect("store");
        (root, store)
    }

    /// `bytes` uploaded at `key`, then held.
    async fn upload_and_hold(store: &FsStore, key: &str, bytes: &'static [u8]) -> HeldUpload {
        let body: crate::blob::BodyStream =
            Box::pin(futures_util::stream::iter([Ok(Bytes::from_static(bytes))]));
        store.put_once(key, body, 100).await.expect("upload");
        store.hold_upload(key).await.expect("hold").expect("held")
    }

    #[tokio::test]
    async fn a_held_upload_becomes_the_object_while_it_is_the_file_read() {
        let (root, store) = store();
        assert!(store.hold_upload("up/g1").await.expect("hold").is_none());
        let held = upload_and_hold(&store, "up/g1", b"uploaded").await;
        assert_eq!(held.size(), 8);
        store.adopt(&held, "nodes/aa/obj.g1").await.expect("adopt");
        let object = root.path().join("nodes/aa/obj.g1");
        assert_eq!(std::fs::read(&object).expect("read"), b"uploaded");
        // The upload's name goes as it always did; the object keeps the bytes.
        store.delete("up/g1").await.expect("delete");
        assert_eq!(std::fs::read(&object).expect("read"), b"uploaded");

        // Never over an existing object.
        let second = upload_and_hold(&store, "up/g2", b"second").await;
        let e = store
            .adopt(&second, "nodes/aa/obj.g1")
            .await
            .expect_err("exists");
        assert!(
            matches!(&e, BlobError::Io { source, .. } if source.kind() == ErrorKind::AlreadyExists),
            "{e}"
        );
        assert_eq!(std::fs::read(&object).expect("read"), b"uploaded");

        // Another file put at the upload's name after it was read is not adopted, and no
        // object is left of it.
        std::fs::remove_file(root.path().join("up/g2")).expect("remove");
        std::fs::write(root.path().join("up/g2"), b"swapped").expect("write");
        let e = store
            .adopt(&second, "nodes/bb/obj.g2")
            .await
            .expect_err("swapped");
        assert!(e.to_string().contains("replaced"), "{e}");
        assert!(!root.path().join("nodes/bb/obj.g2").exists());

        // An upload gone since it was read is not adopted either.
        std::fs::remove_file(root.path().join("up/g2")).expect("remove");
        let e = store
            .adopt(&second, "nodes/bb/obj.g2")
            .await
            .expect_err("gone");
        assert!(
            matches!(&e, BlobError::Io { source, .. } if source.kind() == ErrorKind::NotFound),
            "{e}"
        );
        assert!(!root.path().join("nodes/bb/obj.g2").exists());
    }

    #[tokio::test]
    async fn an_upload_through_a_link_is_not_held() {
        let (root, store) = store();
        let outside = tempfile::tempdir().expect("dir");
        std::fs::write(outside.path().join("secret"), b"not an upload").expect("write");
        std::fs::create_dir_all(root.path().join("up")).expect("mkdir");
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("up/g1"))
            .expect("link");
        let e = store.hold_upload("up/g1").await.expect_err("a link");
        assert!(matches!(e, BlobError::Io { op: "open", .. }), "{e}");
    }
}
