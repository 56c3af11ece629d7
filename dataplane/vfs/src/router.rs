//! `Router`: the server's namespace. A synthetic, read-only pseudo-root
//! directory (export id 0) whose entries are the configured mounts, each a
//! backend with its own export id. Every call is dispatched on the handle's
//! export id; the router holds no locks (its tables are fixed at
//! construction), so it adds no contention to the backends' data paths.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::{
    check_name, Attr, CreateMode, Cred, DirEntry, ExportId, FileHandle, FileType, FsStat, Ino, NodeKind, QuotaUsage,
    SetAttr, Stability, Time, Vfs, VfsError, VfsResult,
};

/// Export id of the pseudo-root.
pub const PSEUDO_ROOT_EXPORT: ExportId = 0;
/// The pseudo-root's only valid handle.
pub const PSEUDO_ROOT: FileHandle = FileHandle { export_id: PSEUDO_ROOT_EXPORT, ino: 1, generation: 1 };
/// Most mounts one router serves (each is a pseudo-root entry).
pub const MOUNTS_MAX: usize = 4096;
/// Longest path `resolve_path` accepts.
pub const PATH_MAX_BYTES: usize = 4096;
/// Cookie of the first pseudo-root entry (0 starts, 1 and 2 are "." and "..").
const COOKIE_FIRST: u64 = 3;

/// One mount: a name under the pseudo-root, served by `backend` as `export_id`.
#[derive(Clone)]
pub struct Mount {
    pub name: Vec<u8>,
    pub export_id: ExportId,
    pub backend: Arc<dyn Vfs>,
}

impl fmt::Debug for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mount")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("export_id", &self.export_id)
            .finish()
    }
}

/// A mount table that cannot be served, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountError(pub String);

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for MountError {}

pub struct Router {
    mounts: Vec<Mount>,
    by_export: crate::idhash::IdHashMap<ExportId, usize>,
    by_name: HashMap<Vec<u8>, usize>,
    created: Time,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router").field("mounts", &self.mounts).finish()
    }
}

/// Which side of the router a handle is on.
enum Target<'r> {
    Pseudo,
    Backend(&'r dyn Vfs),
}

impl Router {
    /// Build the namespace. Each mount's name must be one valid path
    /// component, names and export ids unique, export ids non-zero, and
    /// each backend must serve its export id.
    pub fn new(mounts: Vec<Mount>) -> Result<Router, MountError> {
        if mounts.len() > MOUNTS_MAX {
            return Err(MountError(format!("{} mounts configured, at most {MOUNTS_MAX} are supported", mounts.len())));
        }
        let mut by_export = crate::idhash::IdHashMap::default();
        let mut by_name = HashMap::new();
        for (i, m) in mounts.iter().enumerate() {
            let shown = String::from_utf8_lossy(&m.name);
            if let Err(e) = check_name(&m.name) {
                return Err(MountError(format!(
                    "mount name {shown:?} is not a single path component ({e}): names must be non-empty, without '/' or NUL, not '.' or '..', at most {} bytes",
                    crate::NAME_MAX
                )));
            }
            if m.export_id == PSEUDO_ROOT_EXPORT {
                return Err(MountError(format!("mount {shown:?}: export id 0 is reserved for the pseudo-root")));
            }
            if by_export.insert(m.export_id, i).is_some() {
                return Err(MountError(format!("mount {shown:?}: export id {} is used by another mount", m.export_id)));
            }
            if by_name.insert(m.name.clone(), i).is_some() {
                return Err(MountError(format!("mount name {shown:?} is used twice")));
            }
            if let Err(e) = m.backend.root(m.export_id) {
                return Err(MountError(format!(
                    "mount {shown:?}: the backend does not serve export id {} ({e})",
                    m.export_id
                )));
            }
        }
        Ok(Router { mounts, by_export, by_name, created: Time::now() })
    }

    pub fn pseudo_root(&self) -> FileHandle {
        PSEUDO_ROOT
    }

    pub fn mounts(&self) -> &[Mount] {
        &self.mounts
    }

    /// The backend serving `export_id`; `Stale` when there is none.
    pub fn backend(&self, export_id: ExportId) -> VfsResult<&Arc<dyn Vfs>> {
        self.by_export.get(&export_id).map(|&i| &self.mounts[i].backend).ok_or(VfsError::Stale)
    }

    /// Walk an absolute path ("/mount/dir/sub") from the pseudo-root. Empty
    /// components and "." are skipped, ".." goes up (the pseudo-root is its
    /// own parent); symlinks are not followed.
    pub fn resolve_path(&self, path: &[u8]) -> VfsResult<FileHandle> {
        if path.len() > PATH_MAX_BYTES {
            return Err(VfsError::NameTooLong);
        }
        if path.contains(&0) {
            return Err(VfsError::Inval);
        }
        let mut cur = PSEUDO_ROOT;
        for comp in path.split(|&c| c == b'/') {
            cur = match comp {
                b"" | b"." => continue,
                b".." => self.lookup_parent(&cur)?.0,
                name => self.lookup(&cur, name)?.0,
            };
        }
        Ok(cur)
    }

    fn target(&self, fh: &FileHandle) -> VfsResult<Target<'_>> {
        if fh.export_id == PSEUDO_ROOT_EXPORT {
            return if *fh == PSEUDO_ROOT { Ok(Target::Pseudo) } else { Err(VfsError::BadHandle) };
        }
        Ok(Target::Backend(self.backend(fh.export_id)?.as_ref()))
    }

    /// The backend both handles live on, for two-handle calls.
    fn target_pair(&self, a: &FileHandle, b: &FileHandle) -> VfsResult<&dyn Vfs> {
        let (ta, tb) = (self.target(a)?, self.target(b)?);
        if a.export_id != b.export_id {
            return Err(VfsError::CrossDevice);
        }
        match (ta, tb) {
            (Target::Backend(v), Target::Backend(_)) => Ok(v),
            _ => Err(VfsError::ReadOnly),
        }
    }

    fn pseudo_attr(&self) -> Attr {
        Attr {
            ftype: FileType::Directory,
            mode: 0o555,
            nlink: 2 + self.mounts.len() as u32,
            uid: 0,
            gid: 0,
            size: 0,
            used: 0,
            rdev: (0, 0),
            fsid: PSEUDO_ROOT_EXPORT as u64,
            fileid: PSEUDO_ROOT.ino,
            atime: self.created,
            mtime: self.created,
            ctime: self.created,
            change: 1,
        }
    }

    /// The mount named `name` under the pseudo-root.
    fn lookup_mount(&self, name: &[u8]) -> VfsResult<(FileHandle, Attr)> {
        check_name(name)?;
        let m = &self.mounts[*self.by_name.get(name).ok_or(VfsError::NoEnt)?];
        let fh = m.backend.root(m.export_id)?;
        Ok((fh, m.backend.getattr(&fh)?))
    }

    fn readdir_pseudo(&self, cookie: u64, visit: &mut dyn FnMut(DirEntry<'_>) -> bool) -> VfsResult<bool> {
        let end_cookie = COOKIE_FIRST + self.mounts.len() as u64;
        // Cookies 1 and 2 (a protocol layer's "." and "..") resume at the start.
        if cookie >= end_cookie {
            return Err(VfsError::Inval);
        }
        let start = if cookie < COOKIE_FIRST { 0 } else { (cookie - COOKIE_FIRST + 1) as usize };
        for (i, m) in self.mounts.iter().enumerate().skip(start) {
            let fh = m.backend.root(m.export_id)?;
            let attr = m.backend.getattr(&fh)?;
            if !visit(DirEntry { cookie: COOKIE_FIRST + i as u64, name: &m.name, fh, attr }) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn fsstat_pseudo(&self) -> VfsResult<FsStat> {
        let mut sum =
            FsStat { total_bytes: 0, free_bytes: 0, avail_bytes: 0, total_files: 0, free_files: 0, avail_files: 0 };
        for m in &self.mounts {
            let s = m.backend.fsstat(&m.backend.root(m.export_id)?)?;
            sum.total_bytes = sum.total_bytes.saturating_add(s.total_bytes);
            sum.free_bytes = sum.free_bytes.saturating_add(s.free_bytes);
            sum.avail_bytes = sum.avail_bytes.saturating_add(s.avail_bytes);
            sum.total_files = sum.total_files.saturating_add(s.total_files);
            sum.free_files = sum.free_files.saturating_add(s.free_files);
            sum.avail_files = sum.avail_files.saturating_add(s.avail_files);
        }
        Ok(sum)
    }
}

impl Vfs for Router {
    fn root(&self, export_id: ExportId) -> VfsResult<FileHandle> {
        if export_id == PSEUDO_ROOT_EXPORT {
            return Ok(PSEUDO_ROOT);
        }
        self.backend(export_id)?.root(export_id)
    }

    fn getattr(&self, fh: &FileHandle) -> VfsResult<Attr> {
        match self.target(fh)? {
            Target::Pseudo => Ok(self.pseudo_attr()),
            Target::Backend(v) => v.getattr(fh),
        }
    }

    fn setattr(&self, fh: &FileHandle, set: &SetAttr, guard_ctime: Option<Time>) -> VfsResult<Attr> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::ReadOnly),
            Target::Backend(v) => v.setattr(fh, set, guard_ctime),
        }
    }

    fn lookup(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<(FileHandle, Attr)> {
        match self.target(dir)? {
            Target::Pseudo => self.lookup_mount(name),
            Target::Backend(v) => v.lookup(dir, name),
        }
    }

    fn lookup_parent(&self, dir: &FileHandle) -> VfsResult<(FileHandle, Attr)> {
        match self.target(dir)? {
            Target::Pseudo => Ok((PSEUDO_ROOT, self.pseudo_attr())),
            Target::Backend(v) if v.root(dir.export_id)? == *dir => Ok((PSEUDO_ROOT, self.pseudo_attr())),
            Target::Backend(v) => v.lookup_parent(dir),
        }
    }

    fn read(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.read(fh, offset, buf),
        }
    }

    fn read_lent(&self, fh: &FileHandle, offset: u64, count: usize, sink: &mut dyn crate::LendSink) -> VfsResult<Option<(usize, bool)>> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.read_lent(fh, offset, count, sink),
        }
    }

    fn write(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stability,
    ) -> VfsResult<(usize, Stability, Attr)> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.write(fh, offset, data, stable),
        }
    }

    fn commit(&self, fh: &FileHandle, offset: u64, count: u64) -> VfsResult<()> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.commit(fh, offset, count),
        }
    }

    fn read_start(&self, fh: &FileHandle, offset: u64, buf: &mut [u8], later: &mut dyn crate::Later) -> VfsResult<Option<(usize, bool)>> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.read_start(fh, offset, buf, later),
        }
    }

    fn write_start(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stability,
        later: &mut dyn crate::Later,
    ) -> VfsResult<Option<(usize, Stability, Attr)>> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.write_start(fh, offset, data, stable, later),
        }
    }

    fn commit_start(&self, fh: &FileHandle, offset: u64, count: u64, later: &mut dyn crate::Later) -> VfsResult<Option<()>> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.commit_start(fh, offset, count, later),
        }
    }

    /// One verifier for the whole server: the XOR of the backends', so it
    /// changes whenever any backend's does.
    fn write_verifier(&self) -> [u8; 8] {
        let mut v = [0u8; 8];
        for m in &self.mounts {
            for (a, b) in v.iter_mut().zip(m.backend.write_verifier()) {
                *a ^= b;
            }
        }
        v
    }

    fn create(
        &self,
        dir: &FileHandle,
        name: &[u8],
        kind: NodeKind<'_>,
        mode: u32,
        cred: &Cred<'_>,
        how: CreateMode,
    ) -> VfsResult<(FileHandle, Attr)> {
        match self.target(dir)? {
            Target::Pseudo => Err(VfsError::ReadOnly),
            Target::Backend(v) => v.create(dir, name, kind, mode, cred, how),
        }
    }

    fn remove(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        match self.target(dir)? {
            Target::Pseudo => Err(VfsError::ReadOnly),
            Target::Backend(v) => v.remove(dir, name),
        }
    }

    fn rmdir(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        match self.target(dir)? {
            Target::Pseudo => Err(VfsError::ReadOnly),
            Target::Backend(v) => v.rmdir(dir, name),
        }
    }

    fn rename(&self, from_dir: &FileHandle, from_name: &[u8], to_dir: &FileHandle, to_name: &[u8]) -> VfsResult<()> {
        self.target_pair(from_dir, to_dir)?.rename(from_dir, from_name, to_dir, to_name)
    }

    fn link(&self, fh: &FileHandle, dir: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        self.target_pair(fh, dir)?.link(fh, dir, name)
    }

    fn readlink(&self, fh: &FileHandle) -> VfsResult<Vec<u8>> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::Inval),
            Target::Backend(v) => v.readlink(fh),
        }
    }

    fn readdir(&self, dir: &FileHandle, cookie: u64, visit: &mut dyn FnMut(DirEntry<'_>) -> bool) -> VfsResult<bool> {
        match self.target(dir)? {
            Target::Pseudo => self.readdir_pseudo(cookie, visit),
            Target::Backend(v) => v.readdir(dir, cookie, visit),
        }
    }

    fn cookie_verifier(&self, dir: &FileHandle) -> VfsResult<[u8; 8]> {
        match self.target(dir)? {
            // The mount table never changes, so neither do its cookies.
            Target::Pseudo => Ok(1u64.to_be_bytes()),
            Target::Backend(v) => v.cookie_verifier(dir),
        }
    }

    fn fsstat(&self, fh: &FileHandle) -> VfsResult<FsStat> {
        match self.target(fh)? {
            Target::Pseudo => self.fsstat_pseudo(),
            Target::Backend(v) => v.fsstat(fh),
        }
    }

    fn set_quota(&self, dir: &FileHandle, capacity_bytes: u64) -> VfsResult<()> {
        match self.target(dir)? {
            Target::Pseudo => Err(VfsError::ReadOnly),
            Target::Backend(v) => v.set_quota(dir, capacity_bytes),
        }
    }

    fn quota(&self, fh: &FileHandle) -> VfsResult<Option<QuotaUsage>> {
        match self.target(fh)? {
            Target::Pseudo => Ok(None),
            Target::Backend(v) => v.quota(fh),
        }
    }

    /// The pseudo-root's listing asks every mount for its root's
    /// attributes: it waits where any mount does.
    fn offload_pool(&self, fh: &FileHandle) -> Option<&crate::iopool::IoPool> {
        match self.target(fh) {
            Ok(Target::Backend(v)) => v.offload_pool(fh),
            Ok(Target::Pseudo) => self.mounts.iter().find_map(|m| m.backend.offload_pool(&m.backend.root(m.export_id).ok()?)),
            Err(_) => None,
        }
    }

    fn offload_pool_at(&self, dir: &FileHandle, name: &[u8]) -> Option<&crate::iopool::IoPool> {
        match self.target(dir) {
            Ok(Target::Backend(v)) => v.offload_pool_at(dir, name),
            Ok(Target::Pseudo) => {
                let m = &self.mounts[*self.by_name.get(name)?];
                m.backend.offload_pool(&m.backend.root(m.export_id).ok()?)
            }
            Err(_) => None,
        }
    }

    fn fsstat_now(&self, fh: &FileHandle) -> Option<crate::FsStat> {
        match self.target(fh) {
            Ok(Target::Backend(v)) => v.fsstat_now(fh),
            _ => self.fsstat(fh).ok(),
        }
    }

    fn volume_of(&self, fh: &FileHandle) -> VfsResult<Option<Ino>> {
        match self.target(fh)? {
            Target::Pseudo => Ok(None),
            Target::Backend(v) => v.volume_of(fh),
        }
    }

    fn remove_tree(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        match self.target(dir)? {
            Target::Pseudo => Err(VfsError::ReadOnly),
            Target::Backend(v) => v.remove_tree(dir, name),
        }
    }

    fn pin(&self, fh: &FileHandle) -> VfsResult<()> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.pin(fh),
        }
    }

    fn unpin(&self, fh: &FileHandle) {
        // Only a pinned handle comes back here, and the mount table never
        // changes: its backend is still there.
        if let Ok(Target::Backend(v)) = self.target(fh) {
            v.unpin(fh)
        }
    }

    /// The first mount whose backend keeps client records keeps them for
    /// the whole server (mounts of one diskfs share one set).
    fn client_records(&self) -> Option<Vec<Vec<u8>>> {
        self.mounts.iter().find_map(|m| m.backend.client_records())
    }

    /// Every backend is told; those without records ignore it, and views
    /// of one diskfs write the change once.
    fn record_client(&self, owner: &[u8], present: bool) {
        for m in &self.mounts {
            m.backend.record_client(owner, present)
        }
    }

    // The pseudo-root is a directory: no data to seek or allocate.
    fn seek(&self, fh: &FileHandle, offset: u64, what: crate::Content) -> VfsResult<Option<(bool, u64)>> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.seek(fh, offset, what),
        }
    }

    fn allocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.allocate(fh, offset, len),
        }
    }

    fn deallocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::IsDir),
            Target::Backend(v) => v.deallocate(fh, offset, len),
        }
    }

    /// Within one backend only (a copy between mounts is CrossDevice).
    fn copy_range(&self, src: &FileHandle, src_offset: u64, dst: &FileHandle, dst_offset: u64, len: u64) -> VfsResult<u64> {
        match (self.target(src)?, self.target(dst)?) {
            (Target::Backend(v), Target::Backend(_)) if src.export_id == dst.export_id => {
                v.copy_range(src, src_offset, dst, dst_offset, len)
            }
            (Target::Pseudo, _) | (_, Target::Pseudo) => Err(VfsError::IsDir),
            _ => Err(VfsError::CrossDevice),
        }
    }

    fn clone_range(&self, src: &FileHandle, src_offset: u64, dst: &FileHandle, dst_offset: u64, len: u64) -> VfsResult<Attr> {
        match (self.target(src)?, self.target(dst)?) {
            (Target::Backend(v), Target::Backend(_)) if src.export_id == dst.export_id => {
                v.clone_range(src, src_offset, dst, dst_offset, len)
            }
            (Target::Pseudo, _) | (_, Target::Pseudo) => Err(VfsError::IsDir),
            _ => Err(VfsError::CrossDevice),
        }
    }

    fn clone_block_bytes(&self, fh: &FileHandle) -> u32 {
        match self.target(fh) {
            Ok(Target::Backend(v)) => v.clone_block_bytes(fh),
            _ => 0,
        }
    }

    fn xattrs_supported(&self, fh: &FileHandle) -> bool {
        match self.target(fh) {
            Ok(Target::Backend(v)) => v.xattrs_supported(fh),
            _ => false,
        }
    }

    // The pseudo-root has no extended attributes and takes none.
    fn getxattr(&self, fh: &FileHandle, name: &[u8]) -> VfsResult<Vec<u8>> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::NoEnt),
            Target::Backend(v) => v.getxattr(fh, name),
        }
    }

    fn setxattr(&self, fh: &FileHandle, name: &[u8], value: &[u8], how: crate::XattrSet) -> VfsResult<Attr> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::ReadOnly),
            Target::Backend(v) => v.setxattr(fh, name, value, how),
        }
    }

    fn listxattrs(&self, fh: &FileHandle, cookie: u64, visit: &mut dyn FnMut(&[u8]) -> bool) -> VfsResult<bool> {
        match self.target(fh)? {
            Target::Pseudo => Ok(true),
            Target::Backend(v) => v.listxattrs(fh, cookie, visit),
        }
    }

    fn removexattr(&self, fh: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::ReadOnly),
            Target::Backend(v) => v.removexattr(fh, name),
        }
    }

    fn private_get(&self, fh: &FileHandle) -> VfsResult<Option<Vec<u8>>> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::NotSupported),
            Target::Backend(v) => v.private_get(fh),
        }
    }

    fn private_set(&self, fh: &FileHandle, data: Option<&[u8]>) -> VfsResult<()> {
        match self.target(fh)? {
            Target::Pseudo => Err(VfsError::NotSupported),
            Target::Backend(v) => v.private_set(fh, data),
        }
    }
}

#[cfg(test)]
mod tests;
