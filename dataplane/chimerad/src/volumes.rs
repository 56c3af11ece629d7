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
//! A volume may carry client rules of its own (`access`, the export rules'
//! syntax), which narrow its export's for everything inside it
//! (`vfs::clients::AccessTable::check_fh`). They are kept in the volume
//! root's server-private blob (`Vfs::private_set`), so they live and die
//! with the directory as the volume does — across restarts on diskfs; on
//! memfs, which keeps no blobs and loses its volumes at a restart anyway,
//! only in the access table. At start `load_access` puts every stored list
//! into the table the data path enforces.
//!
//! Mutations are serialised by one mutex: this is the control path (a few
//! requests per second from the CSI controller), and it makes
//! create-then-set-quota atomic with respect to other admin calls.

use std::sync::{Arc, Mutex};
use vfs::clients::{AccessTable, Rule};
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
/// What a volume root's private blob starts with when it holds the
/// volume's access rules (their JSON follows).
const ACCESS_BLOB_MAGIC: &[u8] = b"chimera-volume-access 1\n";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub id: String,
    pub export_path: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// The volume's own client rules; `None`: its export's alone apply.
    pub access: Option<Arc<[Rule]>>,
}

/// A change to a volume's rules (`update`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessChange {
    Keep,
    /// `None`: remove them (the export's rules alone apply).
    Set(Option<Vec<Rule>>),
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
    /// The table the data path enforces; without one, volumes take no rules.
    access: Option<Arc<AccessTable>>,
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
        Volumes { vfs, parent, parent_path: parent_path.to_string(), lock: Mutex::new(()), access: None }
    }

    /// Keep volume rules in `table` (built `AccessTable::with_volumes`).
    pub fn with_access(mut self, table: Arc<AccessTable>) -> Volumes {
        self.access = Some(table);
        self
    }

    fn rules_of(&self, root: &FileHandle) -> Option<Arc<[Rule]>> {
        self.access.as_ref().and_then(|t| t.get_volume(root.export_id, root.ino))
    }

    /// Store `rules` with the volume root (durably where the backend keeps
    /// blobs) and then in the table. Nothing changes when storing fails.
    fn put_rules(&self, root: &FileHandle, rules: Option<Vec<Rule>>) -> VolResult<()> {
        let Some(t) = &self.access else {
            return match rules {
                None => Ok(()),
                Some(_) => Err(VolError::Invalid("access: this server keeps no volume rules".into())),
            };
        };
        let blob = rules.as_deref().map(encode_rules);
        if let Some(b) = &blob {
            check_stored_bytes(b.len())?;
        }
        match self.vfs.private_set(root, blob.as_deref()) {
            // memfs keeps no blobs (and no volumes across a restart).
            Ok(()) | Err(VfsError::NotSupported) => {}
            Err(e) => return Err(internal("store access rules", e)),
        }
        t.set_volume(root.export_id, root.ino, rules).map_err(|m| VolError::Full(format!("access: {m}")))
    }

    /// Put every volume's stored rules into the access table (at start,
    /// before serving). A stored list that does not decode admits nobody
    /// (`[]`) and is logged: failing closed beats opening a volume.
    /// Returns how many volumes have rules.
    pub fn load_access(&self) -> VolResult<usize> {
        let Some(t) = &self.access else { return Ok(0) };
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for name in self.names()? {
            let Some((fh, _)) = self.find(&name)? else { continue };
            let blob = match self.vfs.private_get(&fh) {
                Ok(Some(b)) => b,
                Ok(None) | Err(VfsError::NotSupported) => continue,
                Err(e) => return Err(internal("read access rules", e)),
            };
            let rules = decode_rules(&blob).unwrap_or_else(|m| {
                crate::log::error(
                    "volume access rules unreadable; the volume admits nobody until they are set again",
                    &[("volume", name.as_str().into()), ("error", m.as_str().into())],
                );
                Vec::new()
            });
            t.set_volume(fh.export_id, fh.ino, Some(rules)).map_err(|m| VolError::Full(format!("access: {m}")))?;
            n += 1;
        }
        Ok(n)
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

    fn volume(&self, id: &str, root: &FileHandle, q: vfs::QuotaUsage) -> Volume {
        Volume {
            id: id.to_string(),
            export_path: self.export_path(id),
            capacity_bytes: q.capacity_bytes,
            used_bytes: q.used_bytes,
            access: self.rules_of(root),
        }
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
    /// capacity and rules match (second value: whether it was created now).
    pub fn create(&self, name: &str, capacity_bytes: u64, access: Option<Vec<Rule>>) -> VolResult<(Volume, bool)> {
        check_name("name", name)?;
        check_capacity("capacityBytes", capacity_bytes)?;
        if let Some(r) = &access {
            if self.access.is_none() {
                return Err(VolError::Invalid("access: this server keeps no volume rules".into()));
            }
            check_stored_bytes(encode_rules(r).len())?;
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_fits(capacity_bytes)?;
        if let Some((fh, q)) = self.find(name)? {
            if q.capacity_bytes != capacity_bytes {
                return Err(VolError::Conflict(format!(
                    "volume {name:?} exists with capacityBytes {}, requested {capacity_bytes}",
                    q.capacity_bytes
                )));
            }
            if self.rules_of(&fh).as_deref() != access.as_deref() {
                return Err(VolError::Conflict(format!("volume {name:?} exists with other access rules")));
            }
            return Ok((self.volume(name, &fh, q), false));
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
        // The rules are in place before the directory becomes a volume
        // (only then does a handle inside it find them), so no call sees
        // the volume without them. Setting none also clears rules a
        // deleted volume left on a reused inode number.
        if let Err(e) = self.put_rules(&fh, access) {
            let _ = self.vfs.remove_tree(&self.parent, name.as_bytes());
            return Err(e);
        }
        if let Err(e) = self.vfs.set_quota(&fh, capacity_bytes) {
            // Leave nothing half-made behind.
            if let Some(t) = &self.access {
                let _ = t.set_volume(fh.export_id, fh.ino, None);
            }
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
        Ok((self.volume(name, &fh, q), true))
    }

    pub fn get(&self, id: &str) -> VolResult<Volume> {
        check_name("id", id).map_err(|_| VolError::NotFound(format!("volume {id:?} not found")))?;
        match self.find(id)? {
            Some((fh, q)) => Ok(self.volume(id, &fh, q)),
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
            if let Some((fh, q)) = self.find(&n)? {
                out.push(self.volume(&n, &fh, q));
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
        let root = self.find(id)?.map(|(fh, _)| fh);
        match self.vfs.remove_tree(&self.parent, id.as_bytes()) {
            Ok(()) => {
                if let (Some(t), Some(fh)) = (&self.access, root) {
                    let _ = t.set_volume(fh.export_id, fh.ino, None);
                }
                Ok(true)
            }
            Err(VfsError::NoEnt) => Ok(false),
            Err(e) => Err(internal("remove volume", e)),
        }
    }

    /// Change a volume's capacity (going below what it uses is refused)
    /// and/or its rules; the capacity first, so a refused capacity changes
    /// nothing.
    pub fn update(&self, id: &str, capacity_bytes: Option<u64>, access: AccessChange) -> VolResult<Volume> {
        if let Some(c) = capacity_bytes {
            check_capacity("capacityBytes", c)?;
        }
        // Rules that cannot be stored are refused before anything changes.
        if let AccessChange::Set(Some(r)) = &access {
            if self.access.is_none() {
                return Err(VolError::Invalid("access: this server keeps no volume rules".into()));
            }
            check_stored_bytes(encode_rules(r).len())?;
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = capacity_bytes {
            self.check_fits(c)?;
        }
        let (fh, q) = match self.find(id)? {
            Some(x) => x,
            None => return Err(VolError::NotFound(format!("volume {id:?} not found"))),
        };
        if let Some(capacity_bytes) = capacity_bytes {
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
                    return Err(VolError::Invalid(format!(
                        "capacityBytes: {capacity_bytes} is below what volume {id:?} uses"
                    )))
                }
                Err(e) => return Err(internal("set quota", e)),
            }
        }
        if let AccessChange::Set(rules) = access {
            self.put_rules(&fh, rules)?;
        }
        let q = self.vfs.quota(&fh).map_err(|e| internal("quota", e))?.unwrap_or(q);
        Ok(self.volume(id, &fh, q))
    }

    /// Change a volume's capacity. Going below what it uses is refused.
    pub fn resize(&self, id: &str, capacity_bytes: u64) -> VolResult<Volume> {
        self.update(id, Some(capacity_bytes), AccessChange::Keep)
    }
}

/// Rules must fit a volume root's private blob (the same bound on every
/// backend, so a class that works on memfs works on diskfs).
fn check_stored_bytes(n: usize) -> VolResult<()> {
    if n > vfs::PRIVATE_BYTES_MAX {
        return Err(VolError::Invalid(format!(
            "access: the rules take {n} bytes stored, more than {} per volume",
            vfs::PRIVATE_BYTES_MAX
        )));
    }
    Ok(())
}

/// The stored form of a volume's rules: the magic, then their JSON.
fn encode_rules(rules: &[Rule]) -> Vec<u8> {
    let mut b = ACCESS_BLOB_MAGIC.to_vec();
    b.extend_from_slice(crate::config::access_json(rules).to_string().as_bytes());
    b
}

fn decode_rules(blob: &[u8]) -> Result<Vec<Rule>, String> {
    let json = blob.strip_prefix(ACCESS_BLOB_MAGIC).ok_or("not a volume access blob")?;
    let v: serde_json::Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    crate::config::parse_access("access", &v).map_err(|e| format!("{}: {}", e.path, e.msg))
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

    #[test]
    fn stored_rules_round_trip_and_garbage_is_refused() {
        let v = serde_json::json!([
            { "clients": ["10.0.0.0/8", "fd00::/8"], "access_type": "ro", "squash": "all_squash", "anonymous_uid": 7, "anonymous_gid": 8 },
            { "clients": "*", "access_type": "none" }
        ]);
        let rules = crate::config::parse_access("access", &v).unwrap();
        assert_eq!(decode_rules(&encode_rules(&rules)).unwrap(), rules);
        assert_eq!(decode_rules(&encode_rules(&[])).unwrap(), vec![], "an empty list stays empty (nobody)");
        assert!(decode_rules(b"placement").is_err());
        let mut bad = ACCESS_BLOB_MAGIC.to_vec();
        bad.extend_from_slice(br#"[{"clients": "300.1.1.1"}]"#);
        assert!(decode_rules(&bad).unwrap_err().contains("access[0].clients"));
        // The stored bound, at its edge.
        assert!(check_stored_bytes(vfs::PRIVATE_BYTES_MAX).is_ok());
        match check_stored_bytes(vfs::PRIVATE_BYTES_MAX + 1) {
            Err(VolError::Invalid(m)) => assert!(m.starts_with("access: "), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
