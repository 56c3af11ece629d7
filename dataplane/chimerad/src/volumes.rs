//! Volumes of the admin API: directories under the configured volumes
//! directory, each a quota root in the VFS.
//!
//! The VFS is the only state: a volume exists iff its directory exists and is
//! a quota root, its capacity is the quota and its usage is what the quota
//! charges. Nothing is duplicated here, so there is nothing to go out of sync
//! with the file system, and a restarted server (with a durable backend)
//! lists the volumes it has. The volume id is its name (validated to be a
//! safe path component), which makes create idempotent by name for free.
//!
//! Mutations are serialised by one mutex: this is the control path (a few
//! requests per second from the CSI controller), and it makes
//! create-then-set-quota atomic with respect to other admin calls.

use std::sync::{Arc, Mutex};
use vfs::{CreateMode, Cred, FileHandle, NodeKind, Vfs, VfsError};

/// Longest volume name (CSI names are `pvc-<uuid>`, 40 bytes).
pub const VOLUME_NAME_BYTES_MAX: usize = 128;
/// Most volumes served; creating more answers 507.
pub const VOLUMES_MAX: usize = 65536;
/// Largest capacity: fits Go's int64 and the CSI spec's int64 sizes.
pub const VOLUME_CAPACITY_BYTES_MAX: u64 = i64::MAX as u64;
/// Permission bits of a new volume root: pods of any uid write into it; CSI
/// `fsGroupPolicy: File` lets kubelet narrow ownership afterwards.
pub const VOLUME_ROOT_MODE: u32 = 0o777;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub id: String,
    pub export_path: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// What went wrong, already in the terms the HTTP layer maps to a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolError {
    /// 400: the request is invalid; the message names the field.
    Invalid(String),
    /// 404.
    NotFound(String),
    /// 409: same name, different capacity.
    Conflict(String),
    /// 507: too many volumes or the backend is out of space.
    Full(String),
    /// 500: the backend failed in a way the request cannot fix.
    Internal(String),
}

pub type VolResult<T> = Result<T, VolError>;

pub struct Volumes {
    vfs: Arc<dyn Vfs>,
    parent: FileHandle,
    parent_path: String,
    lock: Mutex<()>,
}

/// The id rules: 1..=128 bytes of `[A-Za-z0-9._-]`, starting with a letter or
/// digit — a safe path component and a safe URL segment.
pub fn check_name(field: &str, name: &str) -> VolResult<()> {
    if name.is_empty() || name.len() > VOLUME_NAME_BYTES_MAX {
        return Err(VolError::Invalid(format!("{field}: must be 1..={VOLUME_NAME_BYTES_MAX} bytes, got {}", name.len())));
    }
    let first_ok = name.as_bytes()[0].is_ascii_alphanumeric();
    let rest_ok = name.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c));
    if !first_ok || !rest_ok {
        return Err(VolError::Invalid(format!(
            "{field}: {name:?} must start with a letter or digit and contain only letters, digits, '.', '_' and '-'"
        )));
    }
    Ok(())
}

pub fn check_capacity(field: &str, cap: u64) -> VolResult<()> {
    if cap == 0 || cap > VOLUME_CAPACITY_BYTES_MAX {
        return Err(VolError::Invalid(format!("{field}: must be in 1..={VOLUME_CAPACITY_BYTES_MAX}, got {cap}")));
    }
    Ok(())
}

fn internal(what: &str, e: VfsError) -> VolError {
    match e {
        VfsError::NoSpace | VfsError::QuotaExceeded => VolError::Full(format!("{what}: backend is out of space")),
        e => VolError::Internal(format!("{what}: {e}")),
    }
}

/// Create each missing directory of `components` below `start` (mkdir -p).
pub fn ensure_dirs(vfs: &dyn Vfs, start: FileHandle, components: &[&str]) -> Result<FileHandle, VfsError> {
    let mut cur = start;
    for c in components {
        cur = match vfs.lookup(&cur, c.as_bytes()) {
            Ok((fh, attr)) if attr.ftype == vfs::FileType::Directory => fh,
            Ok(_) => return Err(VfsError::NotDir),
            Err(VfsError::NoEnt) => {
                match vfs.create(&cur, c.as_bytes(), NodeKind::Directory, 0o755, &Cred::ROOT, CreateMode::Guarded) {
                    Ok((fh, _)) => fh,
                    // Lost a race with another creator: use theirs.
                    Err(VfsError::Exist) => vfs.lookup(&cur, c.as_bytes())?.0,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
    }
    Ok(cur)
}

impl Volumes {
    /// `parent` is the (existing) volumes directory; `parent_path` its
    /// namespace path, the prefix of every export path.
    pub fn new(vfs: Arc<dyn Vfs>, parent: FileHandle, parent_path: &str) -> Volumes {
        assert!(parent_path.starts_with('/') && !parent_path.ends_with('/'));
        Volumes { vfs, parent, parent_path: parent_path.to_string(), lock: Mutex::new(()) }
    }

    pub fn parent_path(&self) -> &str {
        &self.parent_path
    }

    fn export_path(&self, id: &str) -> String {
        format!("{}/{}", self.parent_path, id)
    }

    /// The volume directory and its quota, or None when there is no such
    /// volume (no directory, not a directory, or not a quota root).
    fn find(&self, id: &str) -> VolResult<Option<(FileHandle, vfs::QuotaUsage)>> {
        let fh = match self.vfs.lookup(&self.parent, id.as_bytes()) {
            Ok((fh, attr)) if attr.ftype == vfs::FileType::Directory => fh,
            Ok(_) | Err(VfsError::NoEnt) => return Ok(None),
            Err(e) => return Err(internal("lookup", e)),
        };
        match self.vfs.quota(&fh) {
            Ok(Some(q)) => Ok(Some((fh, q))),
            Ok(None) => Ok(None),
            Err(VfsError::Stale | VfsError::NoEnt) => Ok(None),
            Err(e) => Err(internal("quota", e)),
        }
    }

    fn volume(&self, id: &str, q: vfs::QuotaUsage) -> Volume {
        Volume { id: id.to_string(), export_path: self.export_path(id), capacity_bytes: q.capacity_bytes, used_bytes: q.used_bytes }
    }

    /// Volumes may overcommit the backend together (thin provisioning), but
    /// one volume larger than the whole backend could never be filled: such
    /// a request is refused with 507, naming both sizes.
    fn check_fits(&self, capacity_bytes: u64) -> VolResult<()> {
        let st = self.vfs.fsstat(&self.parent).map_err(|e| internal("fsstat", e))?;
        if capacity_bytes > st.total_bytes {
            return Err(VolError::Full(format!(
                "capacityBytes: {capacity_bytes} exceeds the cluster's storage capacity of {} bytes",
                st.total_bytes
            )));
        }
        Ok(())
    }

    /// Create a volume, or return the existing one of that name when its
    /// capacity matches (second value: whether it was created now).
    pub fn create(&self, name: &str, capacity_bytes: u64) -> VolResult<(Volume, bool)> {
        check_name("name", name)?;
        check_capacity("capacityBytes", capacity_bytes)?;
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_fits(capacity_bytes)?;
        if let Some((_, q)) = self.find(name)? {
            if q.capacity_bytes != capacity_bytes {
                return Err(VolError::Conflict(format!(
                    "volume {name:?} exists with capacityBytes {}, requested {capacity_bytes}",
                    q.capacity_bytes
                )));
            }
            return Ok((self.volume(name, q), false));
        }
        if self.count()? >= VOLUMES_MAX {
            return Err(VolError::Full(format!("too many volumes (limit {VOLUMES_MAX})")));
        }
        let fh = match self.vfs.create(
            &self.parent,
            name.as_bytes(),
            NodeKind::Directory,
            VOLUME_ROOT_MODE,
            &Cred::ROOT,
            CreateMode::Guarded,
        ) {
            Ok((fh, _)) => fh,
            // A directory without a quota (an interrupted earlier create):
            // finish it.
            Err(VfsError::Exist) => match self.vfs.lookup(&self.parent, name.as_bytes()) {
                Ok((fh, a)) if a.ftype == vfs::FileType::Directory => fh,
                Ok(_) => return Err(VolError::Conflict(format!("{name:?} exists in the volumes directory and is not a directory"))),
                Err(e) => return Err(internal("lookup", e)),
            },
            Err(e) => return Err(internal("create volume directory", e)),
        };
        if let Err(e) = self.vfs.set_quota(&fh, capacity_bytes) {
            // Leave nothing half-made behind.
            let _ = self.vfs.remove_tree(&self.parent, name.as_bytes());
            return Err(match e {
                VfsError::Inval => VolError::Invalid(format!(
                    "capacityBytes: {capacity_bytes} is too small to hold even an empty volume"
                )),
                VfsError::NotEmpty => VolError::Conflict(format!(
                    "{name:?} exists in the volumes directory with content but is not a volume"
                )),
                e => internal("set quota", e),
            });
        }
        let q = self.vfs.quota(&fh).map_err(|e| internal("quota", e))?.ok_or_else(|| {
            VolError::Internal(format!("volume {name:?}: quota not visible after set_quota"))
        })?;
        Ok((self.volume(name, q), true))
    }

    pub fn get(&self, id: &str) -> VolResult<Volume> {
        check_name("id", id).map_err(|_| VolError::NotFound(format!("volume {id:?} not found")))?;
        match self.find(id)? {
            Some((_, q)) => Ok(self.volume(id, q)),
            None => Err(VolError::NotFound(format!("volume {id:?} not found"))),
        }
    }

    /// Names of the entries of the volumes directory (bounded by VOLUMES_MAX).
    fn names(&self) -> VolResult<Vec<String>> {
        let mut names = Vec::new();
        let mut cookie = 0;
        loop {
            let mut last = cookie;
            let end = self
                .vfs
                .readdir(&self.parent, cookie, &mut |e| {
                    last = e.cookie;
                    if let Ok(s) = std::str::from_utf8(e.name) {
                        names.push(s.to_string());
                    }
                    names.len() <= VOLUMES_MAX
                })
                .map_err(|e| internal("readdir", e))?;
            if end || last == cookie || names.len() > VOLUMES_MAX {
                break;
            }
            cookie = last;
        }
        names.truncate(VOLUMES_MAX);
        Ok(names)
    }

    fn count(&self) -> VolResult<usize> {
        Ok(self.names()?.len())
    }

    /// Every volume, sorted by id.
    pub fn list(&self) -> VolResult<Vec<Volume>> {
        let mut names = self.names()?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if check_name("id", &n).is_err() {
                continue;
            }
            if let Some((_, q)) = self.find(&n)? {
                out.push(self.volume(&n, q));
            }
        }
        Ok(out)
    }

    /// Remove a volume and everything in it. Removing a missing volume
    /// succeeds (idempotent; returns false).
    pub fn delete(&self, id: &str) -> VolResult<bool> {
        if check_name("id", id).is_err() {
            return Ok(false);
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        match self.vfs.remove_tree(&self.parent, id.as_bytes()) {
            Ok(()) => Ok(true),
            Err(VfsError::NoEnt) => Ok(false),
            Err(e) => Err(internal("remove volume", e)),
        }
    }

    /// Change a volume's capacity. Going below what it uses is refused.
    pub fn resize(&self, id: &str, capacity_bytes: u64) -> VolResult<Volume> {
        check_capacity("capacityBytes", capacity_bytes)?;
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_fits(capacity_bytes)?;
        let (fh, q) = match self.find(id)? {
            Some(x) => x,
            None => return Err(VolError::NotFound(format!("volume {id:?} not found"))),
        };
        if capacity_bytes < q.used_bytes {
            return Err(VolError::Invalid(format!(
                "capacityBytes: {capacity_bytes} is below the {} bytes volume {id:?} uses",
                q.used_bytes
            )));
        }
        match self.vfs.set_quota(&fh, capacity_bytes) {
            Ok(()) => {}
            // Usage grew between our check and the change.
            Err(VfsError::Inval) => {
                return Err(VolError::Invalid(format!("capacityBytes: {capacity_bytes} is below what volume {id:?} uses")))
            }
            Err(e) => return Err(internal("set quota", e)),
        }
        let q = self.vfs.quota(&fh).map_err(|e| internal("quota", e))?.unwrap_or(q);
        Ok(self.volume(id, q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_turning_invalid() {
        for ok in ["a", "pvc-0f3c", "A.b_c-9", &"x".repeat(VOLUME_NAME_BYTES_MAX)] {
            assert!(check_name("name", ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "-a", ".hidden", "a/b", "a b", "é", &"x".repeat(VOLUME_NAME_BYTES_MAX + 1)] {
            match check_name("name", bad) {
                Err(VolError::Invalid(m)) => assert!(m.starts_with("name: "), "{m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn capacities_turning_invalid() {
        assert!(check_capacity("capacityBytes", 1).is_ok());
        assert!(check_capacity("capacityBytes", VOLUME_CAPACITY_BYTES_MAX).is_ok());
        assert!(check_capacity("capacityBytes", 0).is_err());
        assert!(check_capacity("capacityBytes", VOLUME_CAPACITY_BYTES_MAX + 1).is_err());
    }
}
