//! Reading a tar stream (a pushed workspace) into a [`TreeBuilder`], never through the
//! filesystem: entries are data, paths are parsed with [`parse_path`], links stay link entries.
//!
//! The archive is read raw, and the extension records this reader honours (PAX `path` and
//! `linkpath`, GNU long names and long link names) are read with a bound of their own, so no
//! record of the archive is ever held in memory beyond [`MAX_RECORD`] bytes. Hard links,
//! devices, FIFOs and sparse files are refused; so are absolute paths, `..`, and any path that
//! passes through a symlink of the same archive. The whole body counts toward the size limit,
//! including what follows the end marker.

use std::io::Read;

use crate::error::ClientError;
use crate::spool_tree::TreeBuilder;
use crate::tree::parse_path;

/// Largest extension record (PAX header, GNU long name) read.
pub const MAX_RECORD: u64 = 64 << 10;

/// Bounds of one archive.
#[derive(Debug, Clone, Copy)]
pub struct TarLimits {
    /// Bytes of the whole body.
    pub max_bytes: u64,
}

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// The body is larger than the limit.
    #[error("the body exceeds the size limit of {0} bytes")]
    TooLarge(u64),
    /// The archive, or one of its entries, is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// Reading the body failed; the error of the underlying reader.
    #[error("the body could not be read: {0}")]
    Body(std::io::Error),
    /// Writing the spool failed.
    #[error("{0}")]
    Spool(ClientError),
}

/// What an accepted archive held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TarSummary {
    /// Bytes of the body.
    pub received: u64,
    /// Entries read (extension records not counted).
    pub entries: u64,
}

/// Counts what is read, stops past the limit, and remembers why the body failed.
struct Counted<R> {
    inner: R,
    read: u64,
    limit: u64,
    too_large: bool,
    failed: Option<std::io::Error>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.too_large {
            return Err(std::io::Error::other("over the size limit"));
        }
        match self.inner.read(buf) {
            Ok(n) => {
                self.read += n as u64;
                if self.read > self.limit {
                    self.too_large = true;
                    return Err(std::io::Error::other("over the size limit"));
                }
                Ok(n)
            }
            Err(e) => {
                let copy = std::io::Error::new(e.kind(), e.to_string());
                self.failed.get_or_insert(e);
                Err(copy)
            }
        }
    }
}

/// Reads an extension record whole, refusing more than [`MAX_RECORD`] bytes.
fn record(entry: &mut dyn Read, size: u64, what: &str) -> Result<Vec<u8>, TarError> {
    if size > MAX_RECORD {
        return Err(TarError::Invalid(format!(
            "a {what} of {size} bytes is over the limit of {MAX_RECORD}"
        )));
    }
    let mut out = Vec::with_capacity(size as usize);
    entry
        .take(MAX_RECORD + 1)
        .read_to_end(&mut out)
        .map_err(|e| TarError::Invalid(format!("the archive is truncated: {e}")))?;
    Ok(out)
}

/// A NUL-terminated GNU long name.
fn gnu_name(mut bytes: Vec<u8>) -> Vec<u8> {
    if let Some(i) = bytes.iter().position(|b| *b == 0) {
        bytes.truncate(i);
    }
    bytes
}

fn utf8(bytes: &[u8], what: &str) -> Result<String, TarError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| TarError::Invalid(format!("{what} {bytes:?} is not UTF-8")))
}

/// Extension records that apply to the next entry.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

fn invalid_tar(e: std::io::Error) -> TarError {
    TarError::Invalid(format!("the body is not a valid tar archive: {e}"))
}

/// Reads the tar stream `reader` into `builder`.
pub fn read_tar<R: Read>(
    reader: R,
    limits: &TarLimits,
    builder: &mut TreeBuilder,
) -> Result<TarSummary, TarError> {
    let mut counted = Counted {
        inner: reader,
        read: 0,
        limit: limits.max_bytes,
        too_large: false,
        failed: None,
    };
    let result = read_entries(&mut counted, builder);
    // Why it failed, in order: the limit, then the body itself, then the archive.
    if counted.too_large {
        return Err(TarError::TooLarge(limits.max_bytes));
    }
    if let Some(e) = counted.failed.take() {
        return Err(TarError::Body(e));
    }
    let entries = result?;
    Ok(TarSummary {
        received: counted.read,
        entries,
    })
}

fn read_entries<R: Read>(
    counted: &mut Counted<R>,
    builder: &mut TreeBuilder,
) -> Result<u64, TarError> {
    let mut entries = 0u64;
    {
        let mut archive = tar::Archive::new(&mut *counted);
        let mut pending = Pending::default();
        for entry in archive.entries().map_err(invalid_tar)?.raw(true) {
            let mut entry = entry.map_err(invalid_tar)?;
            let kind = entry.header().entry_type();
            let size = entry.header().entry_size().map_err(invalid_tar)?;
            match kind {
                tar::EntryType::XHeader => {
                    let data = record(&mut entry, size, "PAX header")?;
                    for ext in tar::PaxExtensions::new(&data) {
                        let ext = ext.map_err(invalid_tar)?;
                        match ext.key() {
                            Ok("path") => pending.path = Some(ext.value_bytes().to_vec()),
                            Ok("linkpath") => pending.link = Some(ext.value_bytes().to_vec()),
                            Ok("size") => {
                                let v = std::str::from_utf8(ext.value_bytes())
                                    .ok()
                                    .and_then(|v| v.parse().ok())
                                    .ok_or_else(|| {
                                        TarError::Invalid("a PAX size is not a number".into())
                                    })?;
                                pending.size = Some(v);
                            }
                            _ => {}
                        }
                    }
                    continue;
                }
                tar::EntryType::XGlobalHeader => {
                    record(&mut entry, size, "PAX global header")?;
                    continue;
                }
                tar::EntryType::GNULongName => {
                    pending.path = Some(gnu_name(record(&mut entry, size, "long name")?));
                    continue;
                }
                tar::EntryType::GNULongLink => {
                    pending.link = Some(gnu_name(record(&mut entry, size, "long link name")?));
                    continue;
                }
                _ => {}
            }
            let taken = std::mem::take(&mut pending);
            if let Some(s) = taken.size
                && s != size
            {
                return Err(TarError::Invalid(
                    "a PAX size that differs from the entry's header is not supported".into(),
                ));
            }
            entries += 1;
            let raw_path = match taken.path {
                Some(p) => p,
                None => entry.header().path_bytes().into_owned(),
            };
            let raw = utf8(&raw_path, "the path")?;
            if raw.starts_with('/') {
                return Err(TarError::Invalid(format!(
                    "{raw:?}: absolute paths are refused"
                )));
            }
            let trimmed = raw.trim_start_matches("./").trim_end_matches('/');
            if trimmed.is_empty() || trimmed == "." {
                continue; // the archive's root directory
            }
            let path =
                parse_path(trimmed).map_err(|e| TarError::Invalid(format!("{raw:?}: {e}")))?;
            let spool = |e: ClientError| match e {
                ClientError::Invalid(m) => TarError::Invalid(m),
                other => TarError::Spool(other),
            };
            match kind {
                tar::EntryType::Directory => builder.add_dir(&path).map_err(spool)?,
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
                    builder
                        .add_file(&path, &mut entry, executable)
                        .map_err(|e| match e {
                            ClientError::Io { source, .. } => invalid_tar(source),
                            other => spool(other),
                        })?;
                }
                tar::EntryType::Symlink => {
                    let target = match taken.link {
                        Some(l) => l,
                        None => entry
                            .header()
                            .link_name_bytes()
                            .map(|c| c.into_owned())
                            .unwrap_or_default(),
                    };
                    let target = utf8(&target, "the symlink target")?;
                    builder.add_symlink(&path, &target).map_err(spool)?;
                }
                tar::EntryType::Link => {
                    return Err(TarError::Invalid(format!(
                        "{raw:?}: hard links are not supported; archive the file itself"
                    )));
                }
                other => {
                    return Err(TarError::Invalid(format!(
                        "{raw:?}: entries of type {other:?} are not supported"
                    )));
                }
            }
        }
        if pending.path.is_some() || pending.link.is_some() {
            return Err(TarError::Invalid(
                "the archive ends with an extension record that describes no entry".into(),
            ));
        }
    }
    // Drain what follows the end marker, so the size limit covers the whole body.
    std::io::copy(counted, &mut std::io::sink()).map_err(invalid_tar)?;
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, kind: tar::EntryType, size: u64, link: Option<&str>) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        if let Some(l) = link {
            h.set_link_name(l).expect("link name");
        }
        if name.len() < 100 {
            // Written as is, `..` included: the archive under test is hostile.
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        }
        h.set_cksum();
        h
    }

    fn tar(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data, link) in entries {
            let mut h = header(name, *kind, data.len() as u64, *link);
            if name.len() < 100 {
                b.append(&h, *data).expect("append");
            } else {
                b.append_data(&mut h, name, *data).expect("append");
            }
        }
        b.into_inner().expect("finish")
    }

    fn read(body: &[u8], max: u64) -> Result<(TarSummary, TreeBuilder), TarError> {
        let mut b = TreeBuilder::new(tempfile::tempfile().expect("spool"), 1000);
        let s = read_tar(body, &TarLimits { max_bytes: max }, &mut b)?;
        Ok((s, b))
    }

    #[test]
    fn files_dirs_links_and_long_names_are_read() {
        let long = format!("dir/{}/f.py", "x".repeat(150));
        let body = tar(&[
            ("dir", tar::EntryType::Directory, b"", None),
            ("dir/a.py", tar::EntryType::Regular, b"print(1)\n", None),
            (&long, tar::EntryType::Regular, b"long\n", None),
            ("l", tar::EntryType::Symlink, b"", Some("dir/a.py")),
        ]);
        let (s, b) = read(&body, 1 << 20).expect("read");
        assert_eq!(s.entries, 4);
        assert_eq!(s.received, body.len() as u64);
        assert!(b.is_file(&parse_path("dir/a.py").expect("p")));
        assert!(b.is_file(&parse_path(&long).expect("p")));
        assert!(!b.is_file(&parse_path("l").expect("p")));
        assert_eq!(b.stats().files, 2);
    }

    #[test]
    fn hostile_archives_are_refused() {
        let cases: Vec<Vec<u8>> = vec![
            tar(&[
                ("esc", tar::EntryType::Symlink, b"", Some("/tmp")),
                ("esc/x", tar::EntryType::Regular, b"x", None),
            ]),
            tar(&[
                ("esc", tar::EntryType::Symlink, b"", Some("/tmp")),
                ("esc/newdir", tar::EntryType::Directory, b"", None),
            ]),
            tar(&[
                ("esc", tar::EntryType::Symlink, b"", Some("/tmp")),
                ("esc/y", tar::EntryType::Symlink, b"", Some("/etc")),
            ]),
            tar(&[("a/../../x", tar::EntryType::Regular, b"x", None)]),
            tar(&[("h", tar::EntryType::Link, b"", Some("a"))]),
            tar(&[("fifo", tar::EntryType::Fifo, b"", None)]),
            tar(&[
                ("a", tar::EntryType::Regular, b"1", None),
                ("a", tar::EntryType::Regular, b"2", None),
            ]),
        ];
        for (i, body) in cases.iter().enumerate() {
            match read(body, 1 << 20) {
                Err(TarError::Invalid(_)) => {}
                Err(other) => panic!("case {i}: {other}"),
                Ok(_) => panic!("case {i} was accepted"),
            }
        }
    }

    #[test]
    fn an_oversized_extension_record_is_refused_before_it_is_read() {
        let mut body = Vec::new();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(100 << 20);
        h.set_cksum();
        body.extend_from_slice(h.as_bytes());
        body.extend(std::iter::repeat_n(b'a', 1 << 20));
        assert!(matches!(read(&body, 1 << 30), Err(TarError::Invalid(m)) if m.contains("limit")));
    }

    #[test]
    fn the_size_limit_covers_the_whole_body() {
        let mut body = tar(&[("a", tar::EntryType::Regular, b"hello", None)]);
        body.extend(std::iter::repeat_n(0u8, 8192));
        assert!(matches!(read(&body, 4096), Err(TarError::TooLarge(4096))));
        assert!(read(&body, 1 << 20).is_ok());
    }
}
