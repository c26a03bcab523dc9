//! Directories held by handle. Below a store's root, every directory is opened with
//! `O_NOFOLLOW` relative to its parent's handle and every file relative to its directory's
//! handle, so a symlink planted anywhere under the root (by a bug elsewhere, or by someone with
//! write access to the data directory) is refused instead of followed: nothing is ever read,
//! created, linked or renamed outside the root.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode, OFlags};

/// A directory opened by handle.
#[derive(Debug, Clone)]
pub struct SafeDir {
    fd: Arc<OwnedFd>,
    /// Where it is, for messages only; never opened again by this path.
    path: PathBuf,
}

fn refused_link(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is a symlink or not a directory; the store never follows links",
            path.display()
        ),
    )
}

/// Checks that `name` is one plain path component.
fn component(name: &str) -> io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a path component"),
        ));
    }
    Ok(name)
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl SafeDir {
    /// Opens (creating it when asked) the root directory at `path`, which the operator
    /// configured and which may itself be reached through links.
    pub fn open_root(path: &Path, create: bool) -> io::Result<SafeDir> {
        if create {
            std::fs::create_dir_all(path)?;
        }
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(SafeDir {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
        })
    }

    /// Where it is, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory `name` below this one, never through a symlink; created when asked (and
    /// then this directory is fsynced, so that the new entry is durable before anything is
    /// placed below it).
    pub fn child(&self, name: &str, create: bool) -> io::Result<SafeDir> {
        let (dir, created) = self.child_unsynced(name, create)?;
        if created {
            self.sync()?;
        }
        Ok(dir)
    }

    /// As [`SafeDir::child`], without the fsync: answers whether the directory was created,
    /// in which case this one must be fsynced before anything placed below it is durable.
    pub fn child_unsynced(&self, name: &str, create: bool) -> io::Result<(SafeDir, bool)> {
        let name = component(name)?;
        let path = self.path.join(name);
        let open = || rustix::fs::openat(&*self.fd, name, DIR_FLAGS, Mode::empty());
        let mut created = false;
        let fd = match open() {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&*self.fd, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) => created = true,
                    Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                open().map_err(|e| match e {
                    rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => refused_link(&path),
                    e => e.into(),
                })?
            }
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                return Err(refused_link(&path));
            }
            Err(e) => return Err(e.into()),
        };
        let dir = SafeDir {
            fd: Arc::new(fd),
            path,
        };
        Ok((dir, created))
    }

    /// The directory at `components` below this one (see [`SafeDir::child`]).
    pub fn descend<'a>(
        &self,
        components: impl IntoIterator<Item = &'a str>,
        create: bool,
    ) -> io::Result<SafeDir> {
        let mut dir = self.clone();
        for c in components {
            dir = dir.child(c, create)?;
        }
        Ok(dir)
    }

    /// Creates the file `name`, which must not exist (no link is followed, none replaced).
    pub fn create_file(&self, name: &str) -> io::Result<File> {
        let name = component(name)?;
        let fd = rustix::fs::openat(
            &*self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        Ok(File::from(fd))
    }

    /// Opens the regular file `name` for reading; a symlink is refused.
    pub fn open_file(&self, name: &str) -> io::Result<File> {
        let name = component(name)?;
        match rustix::fs::openat(
            &*self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => Ok(File::from(fd)),
            Err(rustix::io::Errno::LOOP) => Err(refused_link(&self.path.join(name))),
            Err(e) => Err(e.into()),
        }
    }

    /// Hard-links `name` as `to_name` in `to`; fails with `AlreadyExists` if that exists.
    pub fn link(&self, name: &str, to: &SafeDir, to_name: &str) -> io::Result<()> {
        rustix::fs::linkat(
            &*self.fd,
            component(name)?,
            &*to.fd,
            component(to_name)?,
            AtFlags::empty(),
        )?;
        Ok(())
    }

    /// Whether `name` (not followed if a link) is the file open as `file`: the same inode of
    /// the same filesystem.
    pub fn holds_file(&self, name: &str, file: &File) -> io::Result<bool> {
        let named = rustix::fs::statat(&*self.fd, component(name)?, AtFlags::SYMLINK_NOFOLLOW)?;
        let open = rustix::fs::fstat(file)?;
        Ok((named.st_dev, named.st_ino) == (open.st_dev, open.st_ino))
    }

    /// Renames `name` to `to_name` in `to` (replacing it).
    pub fn rename(&self, name: &str, to: &SafeDir, to_name: &str) -> io::Result<()> {
        rustix::fs::renameat(&*self.fd, component(name)?, &*to.fd, component(to_name)?)?;
        Ok(())
    }

    /// Removes the file `name` (not a directory; a symlink itself, never its target).
    pub fn unlink(&self, name: &str) -> io::Result<()> {
        rustix::fs::unlinkat(&*self.fd, component(name)?, AtFlags::empty())?;
        Ok(())
    }

    /// fsyncs the directory, so that a rename or link in it survives a power loss.
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fsync(&*self.fd)?;
        Ok(())
    }

    /// Bytes available to unprivileged writers on this directory's filesystem.
    pub fn free_bytes(&self) -> io::Result<u64> {
        let s = rustix::fs::fstatvfs(&*self.fd)?;
        Ok(s.f_bavail.saturating_mul(s.f_frsize))
    }

    /// The entries of this directory: (name, is a directory, size, modified ms). Symlinks
    /// are listed as what they are (not directories), never followed.
    pub fn entries(&self) -> io::Result<Vec<(String, bool, u64, i64)>> {
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(&*self.fd)? {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            let Some(name) = name.to_str() else { continue };
            if name == "." || name == ".." {
                continue;
            }
            let st = match rustix::fs::statat(&*self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
            let modified_ms =
                st.st_mtime.saturating_mul(1000) + i64::from(st.st_mtime_nsec as u32 / 1_000_000);
            out.push((
                name.to_string(),
                kind == rustix::fs::FileType::Directory,
                st.st_size.max(0) as u64,
                modified_ms,
            ));
        }
        Ok(out)
    }
}

/// A spool file: created in a spool directory by handle, used through its open handle, and
/// removed when dropped unless it was moved into place.
#[derive(Debug)]
pub struct SpoolFile {
    file: File,
    dir: SafeDir,
    name: String,
    kept: bool,
}

impl SpoolFile {
    /// A new, empty spool file in `dir`, named `<prefix><random>`.
    pub fn create(dir: &SafeDir, prefix: &str) -> io::Result<SpoolFile> {
        for _ in 0..8 {
            let name = format!("{prefix}{:016x}", rand::random::<u64>());
            match dir.create_file(&name) {
                Ok(file) => {
                    return Ok(SpoolFile {
                        file,
                        dir: dir.clone(),
                        name,
                        kept: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("cannot pick a free spool file name"))
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A second handle on the same open file (sharing its position).
    pub fn handle(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// Hard-links it as `to_name` in `to`; `AlreadyExists` if that exists. It stays a spool
    /// file (removed on drop).
    pub fn link_into(&self, to: &SafeDir, to_name: &str) -> io::Result<()> {
        self.dir.link(&self.name, to, to_name)
    }

    /// Renames it to `to_name` in `to`; it is no longer a spool file.
    pub fn rename_into(mut self, to: &SafeDir, to_name: &str) -> io::Result<()> {
        self.dir.rename(&self.name, to, to_name)?;
        self.kept = true;
        Ok(())
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = self.dir.unlink(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinked_components_are_refused() {
        let root = tempfile::tempdir().expect("dir");
        let outside = tempfile::tempdir().expect("dir");
        std::os::unix::fs::symlink(outside.path(), root.path().join("esc")).expect("link");
        std::fs::write(outside.path().join("secret"), b"x").expect("write");
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("f"))
            .expect("link");
        let dir = SafeDir::open_root(root.path(), false).expect("root");
        assert!(dir.child("esc", true).is_err());
        assert!(dir.descend(["esc", "new"], true).is_err());
        assert!(dir.open_file("f").is_err());
        assert!(dir.create_file("f").is_err());
        assert!(dir.child("..", false).is_err());
        // Nothing was created outside.
        let names: Vec<_> = std::fs::read_dir(outside.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["secret"]);
        // Normal use works, and a spool file is gone once dropped.
        let sub = dir.descend(["a", "b"], true).expect("mkdir");
        let spool = SpoolFile::create(&sub, "t-").expect("spool");
        spool.link_into(&dir, "linked").expect("link");
        drop(spool);
        assert!(dir.open_file("linked").is_ok());
        assert_eq!(sub.entries().expect("list").len(), 0);
    }
}
