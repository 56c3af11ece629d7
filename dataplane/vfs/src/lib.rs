//! The backend interface every protocol front end (NFSv3, NFSv4.1, later the
//! pNFS data server) talks to, and the embedded memory backend.
//!
//! Knows nothing of NFS: errors, attributes and handles are backend terms that
//! the protocol crates map to their wire forms. Handles are stable and
//! restart-safe by construction (export id + inode number + generation): an
//! inode number is never reused with the same generation, so a handle to a
//! removed object is detected as stale rather than aliasing a new one.

pub mod clients;
pub mod durable;
mod idhash;
pub mod iopool;
pub mod memfs;
pub mod router;

use core::fmt;

/// Export (file system) identifier carried in every handle.
pub type ExportId = u32;
/// Inode number, unique within an export.
pub type Ino = u64;

/// Wire form of a handle: version byte, reserved, export, inode, generation.
pub const HANDLE_LEN: usize = 24;
const HANDLE_VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileHandle {
    pub export_id: ExportId,
    pub ino: Ino,
    pub generation: u64,
}

impl FileHandle {
    pub fn to_bytes(&self) -> [u8; HANDLE_LEN] {
        let mut b = [0u8; HANDLE_LEN];
        b[0] = HANDLE_VERSION;
        b[4..8].copy_from_slice(&self.export_id.to_be_bytes());
        b[8..16].copy_from_slice(&self.ino.to_be_bytes());
        b[16..24].copy_from_slice(&self.generation.to_be_bytes());
        b
    }

    /// Parse a handle received from a client. Anything that is not exactly a
    /// handle we issued in shape is `BadHandle`; whether it names a live object
    /// is for the backend to say (`Stale`).
    pub fn from_bytes(b: &[u8]) -> Result<Self, VfsError> {
        if b.len() != HANDLE_LEN || b[0] != HANDLE_VERSION || b[1..4] != [0, 0, 0] {
            return Err(VfsError::BadHandle);
        }
        let export_id = u32::from_be_bytes(b[4..8].try_into().unwrap());
        let ino = u64::from_be_bytes(b[8..16].try_into().unwrap());
        let generation = u64::from_be_bytes(b[16..24].try_into().unwrap());
        Ok(FileHandle { export_id, ino, generation })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VfsError {
    NoEnt,
    Exist,
    NotDir,
    IsDir,
    NotEmpty,
    /// The backend as a whole is full.
    NoSpace,
    /// The volume (quota root) the object lives in is full.
    QuotaExceeded,
    /// The handle names an object that no longer exists.
    Stale,
    /// The handle is not one we could have issued.
    BadHandle,
    Inval,
    NameTooLong,
    /// Not the owner (EPERM).
    Perm,
    /// Permission bits deny it (EACCES).
    Access,
    FileTooBig,
    ReadOnly,
    TooManyLinks,
    /// Cross-volume rename or link.
    CrossDevice,
    NotSupported,
    /// Guarded SETATTR whose ctime guard did not match.
    NotSync,
    /// Exclusive create whose verifier differs from the stored one.
    ExistVerifierMismatch,
    Io,
}

impl fmt::Display for VfsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
impl std::error::Error for VfsError {}

pub type VfsResult<T> = Result<T, VfsError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    BlockDevice,
    CharDevice,
    Socket,
    Fifo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

impl Time {
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ftype: FileType,
    /// Permission bits (07777).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Bytes of storage charged to this object.
    pub used: u64,
    pub rdev: (u32, u32),
    pub fsid: u64,
    pub fileid: Ino,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// Increases on every change to data or attributes (NFSv4 change attribute).
    pub change: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetTime {
    #[default]
    DontChange,
    ServerNow,
    Client(Time),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: SetTime,
    pub mtime: SetTime,
}

/// How durable a write must be before it is acknowledged (NFSv3 stable_how,
/// NFSv4 stable_how4). The backend answers with what it actually achieved,
/// which may be stronger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stability {
    Unstable,
    DataSync,
    FileSync,
}

/// Caller identity (AUTH_SYS, or the anonymous identity for AUTH_NONE).
#[derive(Debug, Clone, Copy)]
pub struct Cred<'a> {
    pub uid: u32,
    pub gid: u32,
    pub gids: &'a [u32],
}

impl Cred<'static> {
    pub const ROOT: Cred<'static> = Cred { uid: 0, gid: 0, gids: &[] };
    pub const NOBODY: Cred<'static> = Cred { uid: 65534, gid: 65534, gids: &[] };
}

/// Access bits, shared by NFSv3 ACCESS3_* and NFSv4 ACCESS4_* (same values).
pub mod access {
    pub const READ: u32 = 0x01;
    pub const LOOKUP: u32 = 0x02;
    pub const MODIFY: u32 = 0x04;
    pub const EXTEND: u32 = 0x08;
    pub const DELETE: u32 = 0x10;
    pub const EXECUTE: u32 = 0x20;
    pub const ALL: u32 = 0x3f;
}

/// What `access` grants `cred` on an object with attributes `a` (POSIX mode
/// bits; root is granted everything except execute on non-executables).
pub fn check_access(a: &Attr, cred: &Cred<'_>, requested: u32) -> u32 {
    let perm = if cred.uid == 0 {
        let any_x = a.mode & 0o111 != 0 || a.ftype == FileType::Directory;
        7 & if any_x { 7 } else { 6 }
    } else if cred.uid == a.uid {
        (a.mode >> 6) & 7
    } else if cred.gid == a.gid || cred.gids.contains(&a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    let mut granted = 0;
    if perm & 4 != 0 {
        granted |= access::READ;
    }
    if perm & 2 != 0 {
        granted |= access::MODIFY | access::EXTEND;
        if a.ftype == FileType::Directory {
            granted |= access::DELETE;
        }
    }
    if perm & 1 != 0 {
        granted |= if a.ftype == FileType::Directory { access::LOOKUP } else { access::EXECUTE };
    }
    granted & requested
}

/// How CREATE treats an existing name (NFSv3 createmode3 / NFSv4 createmode4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    /// Succeed and return the existing file (its size may then be set).
    Unchecked,
    /// Fail with `Exist`.
    Guarded,
    /// Exactly-once create: a retry with the same verifier returns the file
    /// created by the first attempt; a different verifier gets
    /// `ExistVerifierMismatch`.
    Exclusive([u8; 8]),
}

#[derive(Debug, Clone, Copy)]
pub enum NodeKind<'n> {
    File,
    Directory,
    Symlink { target: &'n [u8] },
    Device { ftype: FileType, rdev: (u32, u32) },
}

/// One directory entry handed to a `readdir` visitor.
#[derive(Debug, Clone, Copy)]
pub struct DirEntry<'n> {
    /// Cookie that resumes the listing after this entry.
    pub cookie: u64,
    pub name: &'n [u8],
    pub fh: FileHandle,
    pub attr: Attr,
}

/// File system (or volume) space figures for FSSTAT / NFSv4 space attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub avail_bytes: u64,
    pub total_files: u64,
    pub free_files: u64,
    pub avail_files: u64,
}

/// A quota root (a volume) and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaUsage {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// The backend trait. All methods may be called concurrently from every core.
///
/// Name arguments are raw bytes as received; the backend rejects "", ".",
/// "..", names containing '/' or NUL (`Inval`) and names longer than
/// `NAME_MAX` (`NameTooLong`).
/// Immutable bytes shared between a backend and the replies in flight that
/// lend them (zero-copy READ).
pub type Shared = std::sync::Arc<[u8]>;

/// Receives the pieces of a lent read ([`Vfs::read_lent`]) in file order.
pub trait LendSink {
    /// `len` bytes of `chunk` starting at `at`.
    fn lend(&mut self, chunk: &Shared, at: usize, len: usize);
}

/// The result of a data operation that completed after its call returned
/// (see [`Vfs::read_start`]).
#[derive(Debug)]
pub enum IoDone {
    /// The bytes read (at most the count asked) and whether the read
    /// reached end of file.
    Read { data: Vec<u8>, eof: bool },
    /// Bytes written, the stability achieved, the attributes after.
    Write { count: usize, committed: Stability, attr: Attr },
    Commit,
}

/// Hands the result of a parked operation back to the caller's core. Called
/// exactly once, from any thread.
pub type Done = Box<dyn FnOnce(VfsResult<IoDone>) + Send>;

/// The caller's side of an operation that may complete later: a backend
/// that must wait (a device, a remote server) asks to park the call and,
/// if it may, returns `Ok(None)` and completes the [`Done`] later. A caller
/// that cannot wait answers `None` and the backend completes inline.
pub trait Later {
    fn park(&mut self) -> Option<Done>;
}

/// A `Done` that hands its result on as a type-erased payload — how the
/// protocol crates carry it through an `rpc::park::Ticket` (`send` is the
/// ticket's `complete`), without `vfs` knowing of RPC.
pub fn done_as_payload(send: impl FnOnce(Box<dyn std::any::Any + Send>) + Send + 'static) -> Done {
    Box::new(move |r: VfsResult<IoDone>| send(Box::new(r)))
}

/// The result a `done_as_payload` sent, from the payload handed back; a
/// missing payload (the ticket was cancelled) or one of another type is an
/// I/O error.
pub fn io_done(payload: Option<&(dyn std::any::Any + Send)>) -> VfsResult<&IoDone> {
    match payload.and_then(|p| p.downcast_ref::<VfsResult<IoDone>>()) {
        Some(Ok(d)) => Ok(d),
        Some(Err(e)) => Err(*e),
        None => Err(VfsError::Io),
    }
}

/// Delegations an NFSv4 server holds on files (RFC 8881 §10.4): a protocol
/// without state (NFSv3) asks here before it reads, writes or renames a
/// file, so another client's cached copy is recalled first.
pub trait DelegationBreaker: Send + Sync {
    /// Whether any delegation is held at all (one atomic load): when not,
    /// a caller skips the lookups a check would need.
    fn active(&self) -> bool;
    /// An access to `fh` (`write`: changes its data, attributes or names;
    /// otherwise a read, which only a write delegation stands in the way
    /// of). `true`: a delegation conflicts and is being recalled — answer
    /// "try again later" (NFS3ERR_JUKEBOX). Cheap when no delegation is
    /// held (one atomic load); never blocks.
    fn must_wait(&self, fh: &FileHandle, write: bool) -> bool;
}

pub trait Vfs: Send + Sync {
    /// Root handle of an export; `Stale` if the export is unknown.
    fn root(&self, export_id: ExportId) -> VfsResult<FileHandle>;

    fn getattr(&self, fh: &FileHandle) -> VfsResult<Attr>;

    /// Apply `set`; with `guard_ctime`, fail with `NotSync` unless the
    /// object's ctime equals it. Truncation/extension honour quotas.
    fn setattr(&self, fh: &FileHandle, set: &SetAttr, guard_ctime: Option<Time>) -> VfsResult<Attr>;

    fn lookup(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<(FileHandle, Attr)>;

    /// The parent of a directory (the root is its own parent).
    fn lookup_parent(&self, dir: &FileHandle) -> VfsResult<(FileHandle, Attr)>;

    /// Read into `buf` from `offset`; returns bytes read and whether the read
    /// reached end of file.
    fn read(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)>;

    /// Zero-copy read of up to `count` bytes from `offset`: the data are
    /// lent to `sink` as pieces of shared, immutable chunks (holes as a
    /// shared zero chunk), in file order, instead of copied; the reply holds
    /// them until it is sent. Returns bytes lent and whether the read
    /// reached end of file, or `None` when this backend cannot lend (the
    /// caller then uses `read`; nothing was lent).
    fn read_lent(&self, fh: &FileHandle, offset: u64, count: usize, sink: &mut dyn LendSink) -> VfsResult<Option<(usize, bool)>> {
        let _ = (fh, offset, count, sink);
        Ok(None)
    }

    /// Write `data` at `offset`. Returns bytes written, the stability achieved
    /// and the attributes after the write. Fails with `QuotaExceeded` or
    /// `NoSpace` without writing anything when space is short.
    fn write(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stability,
    ) -> VfsResult<(usize, Stability, Attr)>;

    /// Make earlier unstable writes in the range durable.
    fn commit(&self, fh: &FileHandle, offset: u64, count: u64) -> VfsResult<()>;

    /// `read`, where the backend may park the call (`later.park()`) and
    /// answer `Ok(None)`: the result then arrives through the [`Done`] as
    /// [`IoDone::Read`]. Backends that never wait keep this default.
    fn read_start(&self, fh: &FileHandle, offset: u64, buf: &mut [u8], later: &mut dyn Later) -> VfsResult<Option<(usize, bool)>> {
        let _ = later;
        self.read(fh, offset, buf).map(Some)
    }

    /// `write`, parkable as `read_start` ([`IoDone::Write`]). `data` is only
    /// borrowed for the call: a backend that parks copies what it needs.
    fn write_start(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stability,
        later: &mut dyn Later,
    ) -> VfsResult<Option<(usize, Stability, Attr)>> {
        let _ = later;
        self.write(fh, offset, data, stable).map(Some)
    }

    /// `commit`, parkable as `read_start` ([`IoDone::Commit`]).
    fn commit_start(&self, fh: &FileHandle, offset: u64, count: u64, later: &mut dyn Later) -> VfsResult<Option<()>> {
        let _ = later;
        self.commit(fh, offset, count).map(Some)
    }

    /// Where calls on `fh` that may wait on something outside this process
    /// (a remote server answering metadata calls) run instead of the core
    /// that decoded them: the protocol parks the call, runs it whole on this
    /// pool and sends its reply from the core afterwards. `None` (the
    /// default): calls on it never wait long, or park by themselves
    /// (`read_start` & co.).
    fn offload_pool(&self, fh: &FileHandle) -> Option<&iopool::IoPool> {
        let _ = fh;
        None
    }

    /// `offload_pool` for a LOOKUP of `name` in `dir`, which may reach
    /// another backend than `dir`'s (a router's pseudo-root looks up the
    /// root of the mount named, and asks that backend its attributes).
    fn offload_pool_at(&self, dir: &FileHandle, name: &[u8]) -> Option<&iopool::IoPool> {
        let _ = name;
        self.offload_pool(dir)
    }

    /// `fsstat` for reports that must answer at once (`/metrics`, the admin
    /// API's space figures), on threads that are not a core's. The default
    /// asks `fsstat`; a backend whose `fsstat` may wait (a remote server)
    /// answers its last known figures and refreshes them off the caller's
    /// thread (`None` until it knows any).
    fn fsstat_now(&self, fh: &FileHandle) -> Option<FsStat> {
        self.fsstat(fh).ok()
    }

    /// Write verifier: changes whenever unstable data may have been lost
    /// (every restart), so clients know to resend uncommitted writes.
    fn write_verifier(&self) -> [u8; 8];

    fn create(
        &self,
        dir: &FileHandle,
        name: &[u8],
        kind: NodeKind<'_>,
        mode: u32,
        cred: &Cred<'_>,
        how: CreateMode,
    ) -> VfsResult<(FileHandle, Attr)>;

    /// Remove a non-directory. Removing the last name of a pinned object
    /// (see [`Vfs::pin`]) keeps the object until its last unpin.
    fn remove(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()>;

    /// Remove an empty directory.
    fn rmdir(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()>;

    /// Rename; a non-directory replaced at `to_name` loses that link as
    /// with `remove` (a pinned one lives on until its last unpin).
    fn rename(
        &self,
        from_dir: &FileHandle,
        from_name: &[u8],
        to_dir: &FileHandle,
        to_name: &[u8],
    ) -> VfsResult<()>;

    fn link(&self, fh: &FileHandle, dir: &FileHandle, name: &[u8]) -> VfsResult<Attr>;

    fn readlink(&self, fh: &FileHandle) -> VfsResult<Vec<u8>>;

    /// Visit entries after `cookie` (0 = from the start; "." and ".." are not
    /// listed). The visitor returns false to stop (reply buffer full).
    /// Returns true when the listing reached the end.
    fn readdir(
        &self,
        dir: &FileHandle,
        cookie: u64,
        visit: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> VfsResult<bool>;

    /// Cookie verifier of a directory: changes when cookies handed out
    /// earlier may no longer resume correctly.
    fn cookie_verifier(&self, dir: &FileHandle) -> VfsResult<[u8; 8]>;

    /// Space figures as seen from `fh`: the volume's quota when `fh` lives in
    /// one, otherwise the whole backend.
    fn fsstat(&self, fh: &FileHandle) -> VfsResult<FsStat>;

    /// Make directory `dir` a quota root (a volume) of `capacity_bytes`, or
    /// change its capacity. Shrinking below what is used is `Inval`.
    fn set_quota(&self, dir: &FileHandle, capacity_bytes: u64) -> VfsResult<()>;

    /// The quota of the volume `fh` belongs to, if any.
    fn quota(&self, fh: &FileHandle) -> VfsResult<Option<QuotaUsage>>;

    /// The volume (quota root) `fh` lives in, named by its root directory's
    /// inode (a volume's root is inside its own volume), or `None` outside
    /// every volume. Asked on every call into an export that has
    /// per-volume access rules (`clients::AccessTable`), so it must not
    /// allocate. A handle naming no live object is `Stale`.
    fn volume_of(&self, fh: &FileHandle) -> VfsResult<Option<Ino>>;

    /// Remove a directory and everything below it (volume deletion).
    /// Pinned files below it lose their names and live on until unpinned.
    fn remove_tree(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()>;

    /// Take an open reference on a non-directory (an NFSv4 OPEN holds one
    /// while any client has the file open): while pinned, removing or
    /// renaming over its last name does not destroy it. It then has no
    /// name (nlink 0, no directory lists it, `link` to it is `NoEnt`), but
    /// its handle keeps working — read, write, getattr, setattr — and its
    /// data and space stay charged. At the last `unpin` of an object
    /// without names it is destroyed and its space released (quota and
    /// fsstat go back down); its handle is `Stale` from then on.
    ///
    /// Pins are counted: every successful `pin` is matched by exactly one
    /// `unpin`. A handle naming no live object is `Stale`; a directory is
    /// `IsDir`. A backend without open references answers `NotSupported`
    /// (the default): removing the last name then destroys the object at
    /// once, and callers must not promise otherwise to clients (NFSv4
    /// OPEN4_RESULT_PRESERVE_UNLINKED).
    ///
    /// Pins are not durable, because opens are not: nothing is open after
    /// a restart. A durable backend must therefore record an object that
    /// lost its last name while pinned (an orphan list, as a journaling
    /// file system does) and free every such object when it recovers at
    /// start, before serving; otherwise its space leaks across restarts.
    fn pin(&self, fh: &FileHandle) -> VfsResult<()> {
        let _ = fh;
        Err(VfsError::NotSupported)
    }

    /// Drop an open reference taken by `pin` (see there). Called once per
    /// successful `pin`; never fails (the object may be destroyed now).
    fn unpin(&self, fh: &FileHandle) {
        let _ = fh;
    }

    /// NFSv4 client records on stable storage (RFC 8881 §8.4.3): the
    /// owners (`co_ownerid`) of the clients that held state when the
    /// server last stopped, which alone may reclaim in the grace period.
    /// `None` (the default): this backend keeps no such records (nothing
    /// it holds survives a restart), and reclaims are not checked.
    fn client_records(&self) -> Option<Vec<Vec<u8>>> {
        None
    }

    /// Record (`present`) or forget a client owner, durably before it
    /// returns. A backend without records ignores it.
    fn record_client(&self, owner: &[u8], present: bool) {
        let _ = (owner, present);
    }

    /// Where the next `what` at or after `offset` starts in a regular file
    /// (lseek SEEK_DATA / SEEK_HOLE; NFSv4.2 SEEK, READ_PLUS). `None` when
    /// `offset` is at or past the end of file. Otherwise `(eof, position)`:
    /// for `Data`, the first data byte (`eof` false), or `(true, size)`
    /// when only holes follow; for `Hole`, the first byte of the next hole,
    /// where every file has a virtual hole at its end (`(true, size)` when
    /// the data runs to the end). Allocated but unwritten ranges are data.
    /// Must not block: it answers from metadata. Backends without sparse
    /// files may leave this default (`NotSupported`); callers then treat
    /// the whole file as data.
    fn seek(&self, fh: &FileHandle, offset: u64, what: Content) -> VfsResult<Option<(bool, u64)>> {
        let _ = (fh, offset, what);
        Err(VfsError::NotSupported)
    }

    /// Reserve space for `[offset, offset + len)` of a regular file
    /// (fallocate mode 0; NFSv4.2 ALLOCATE): holes in the range become
    /// zeroed, charged data, and the size grows to `offset + len` if that
    /// is larger. All or nothing: `QuotaExceeded` / `NoSpace` (or
    /// `FileTooBig`) leave the file and the space figures unchanged.
    /// `len` 0 is `Inval`. Returns the attributes after.
    fn allocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        let _ = (fh, offset, len);
        Err(VfsError::NotSupported)
    }

    /// Punch a hole in `[offset, offset + len)` of a regular file
    /// (fallocate PUNCH_HOLE | KEEP_SIZE; NFSv4.2 DEALLOCATE): the range
    /// reads as zeros, the space of whole blocks inside it is given back
    /// (quota and fsstat go down), the size does not change. A range past
    /// the end of file does nothing. `len` 0 is `Inval`. Returns the
    /// attributes after.
    fn deallocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        let _ = (fh, offset, len);
        Err(VfsError::NotSupported)
    }

    /// Copy up to `len` bytes of regular file `src` from `src_offset` to
    /// regular file `dst` at `dst_offset`, inside this backend (NFSv4.2
    /// COPY: no data crosses the network). Returns the bytes copied:
    /// fewer than `len` when the source ends first, or when space ran out
    /// after some were copied (the error comes when none were). Written
    /// data is as stable as a FILE_SYNC write. The caller bounds `len` (a
    /// copy is done inline) and checks overlaps within one file. Backends
    /// without it keep this default (`NotSupported`: the client copies
    /// through itself).
    fn copy_range(&self, src: &FileHandle, src_offset: u64, dst: &FileHandle, dst_offset: u64, len: u64) -> VfsResult<u64> {
        let _ = (src, src_offset, dst, dst_offset, len);
        Err(VfsError::NotSupported)
    }

    /// Make `[dst_offset, dst_offset + len)` of regular file `dst` a clone
    /// of `src` from `src_offset` (reflink; NFSv4.2 CLONE): afterwards the
    /// range reads as the source did, and later writes to either file do
    /// not show in the other. All or nothing (`QuotaExceeded` / `NoSpace`
    /// leave `dst` unchanged); `dst` grows to the range's end if shorter.
    /// Offsets must be multiples of `clone_block_bytes`, and so must `len`
    /// unless the range ends both files (`Inval`); the caller checks the
    /// range lies within the source and, in one file, does not overlap.
    /// Backends without it keep this default (`NotSupported`).
    fn clone_range(&self, src: &FileHandle, src_offset: u64, dst: &FileHandle, dst_offset: u64, len: u64) -> VfsResult<Attr> {
        let _ = (src, src_offset, dst, dst_offset, len);
        Err(VfsError::NotSupported)
    }

    /// The alignment `clone_range` needs (0: no cloning).
    fn clone_block_bytes(&self, fh: &FileHandle) -> u32 {
        let _ = fh;
        0
    }

    /// Extended attributes (the user namespace without its `user.`
    /// prefix; NFSv4.2 GETXATTR & co., RFC 8276) of a file, directory or
    /// symlink. Names are 1 to `XATTR_NAME_MAX` bytes without NUL
    /// (`Inval`, `NameTooLong`); values at most `XATTR_VALUE_BYTES_MAX`
    /// (`FileTooBig`); a missing attribute is `NoEnt`. Backends without
    /// them keep these defaults (`NotSupported`) and `xattrs_supported`
    /// false, so NFSv4.2 does not advertise them.
    fn xattrs_supported(&self, fh: &FileHandle) -> bool {
        let _ = fh;
        false
    }

    /// The value of attribute `name`.
    fn getxattr(&self, fh: &FileHandle, name: &[u8]) -> VfsResult<Vec<u8>> {
        let _ = (fh, name);
        Err(VfsError::NotSupported)
    }

    /// Set attribute `name` as `how` says (`Exist` for `Create` of one that
    /// exists, `NoEnt` for `Replace` of one that does not). Charged to the
    /// object's volume like data: all or nothing at `QuotaExceeded` /
    /// `NoSpace`. Returns the attributes after (the change attribute moved).
    fn setxattr(&self, fh: &FileHandle, name: &[u8], value: &[u8], how: XattrSet) -> VfsResult<Attr> {
        let _ = (fh, name, value, how);
        Err(VfsError::NotSupported)
    }

    /// Visit the names after the first `cookie` (0: from the start) in a
    /// stable order; the visitor returns false to stop. Returns true when
    /// the listing reached the end.
    fn listxattrs(&self, fh: &FileHandle, cookie: u64, visit: &mut dyn FnMut(&[u8]) -> bool) -> VfsResult<bool> {
        let _ = (fh, cookie, visit);
        Err(VfsError::NotSupported)
    }

    /// Remove attribute `name` (`NoEnt` when it does not exist).
    fn removexattr(&self, fh: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        let _ = (fh, name);
        Err(VfsError::NotSupported)
    }

    /// The server-private blob of an object: up to `PRIVATE_BYTES_MAX`
    /// bytes a layer above the backend keeps with the object (the pNFS
    /// MDS keeps where a file's data lives). Never visible to NFS clients;
    /// it goes with the object when the object is destroyed. `Ok(None)`:
    /// the object has none. A handle naming no live object is `Stale`.
    /// `NotSupported` (the default): this backend keeps no blobs (nothing
    /// it holds survives a restart, so callers lose nothing by it).
    fn private_get(&self, fh: &FileHandle) -> VfsResult<Option<Vec<u8>>> {
        let _ = fh;
        Err(VfsError::NotSupported)
    }

    /// Replace (`Some`) or remove (`None`, or an empty slice) the private
    /// blob of an object, durably before it returns. More than
    /// `PRIVATE_BYTES_MAX` bytes is `Inval`; otherwise as `private_get`.
    fn private_set(&self, fh: &FileHandle, data: Option<&[u8]>) -> VfsResult<()> {
        let _ = (fh, data);
        Err(VfsError::NotSupported)
    }
}

/// How [`Vfs::setxattr`] treats an existing attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrSet {
    /// Create or replace.
    Either,
    /// Only create (`Exist` when it exists).
    Create,
    /// Only replace (`NoEnt` when it does not exist).
    Replace,
}

/// Longest extended attribute name (without the `user.` prefix).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value (Linux's XATTR_SIZE_MAX).
pub const XATTR_VALUE_BYTES_MAX: usize = 64 << 10;
/// Most extended attributes one object may have.
pub const XATTRS_PER_OBJECT_MAX: usize = 1024;

/// What [`Vfs::seek`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    Data,
    Hole,
}

/// Largest server-private blob of one object (`Vfs::private_set`).
pub const PRIVATE_BYTES_MAX: usize = 4096;

/// Eight random bytes for a write verifier (a new one every start, so
/// clients know to resend uncommitted writes).
/// `Vfs::copy_range` done with the backend's own `read` and `write`,
/// `chunk` bytes at a time through one bounded buffer (FILE_SYNC writes):
/// for backends that copy rather than share. Returns the bytes copied
/// (short at the source's end, or when a write fails after some were
/// copied; that error is returned only when none were).
pub fn copy_by_chunks(
    fs: &dyn Vfs,
    src: &FileHandle,
    src_offset: u64,
    dst: &FileHandle,
    dst_offset: u64,
    len: u64,
    chunk: usize,
) -> VfsResult<u64> {
    let mut buf = vec![0u8; chunk.min(len as usize)];
    let mut copied = 0u64;
    while copied < len {
        let want = ((len - copied) as usize).min(chunk);
        let (n, eof) = fs.read(src, src_offset + copied, &mut buf[..want])?;
        if n == 0 {
            break;
        }
        match fs.write(dst, dst_offset + copied, &buf[..n], Stability::FileSync) {
            Ok(_) => copied += n as u64,
            Err(e) if copied == 0 => return Err(e),
            Err(_) => break,
        }
        if eof {
            break;
        }
    }
    Ok(copied)
}

pub fn random_verifier() -> [u8; 8] {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into the buffer we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // No entropy source: time and pid still differ across restarts.
        let t =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        b = (t ^ ((std::process::id() as u64) << 40)).to_be_bytes();
    }
    b
}

/// Longest name component accepted.
pub const NAME_MAX: usize = 255;

/// Validate a name component (shared by backends).
pub fn check_name(name: &[u8]) -> VfsResult<()> {
    if name.is_empty() || name == b"." || name == b".." || name.iter().any(|&c| c == b'/' || c == 0)
    {
        return Err(VfsError::Inval);
    }
    if name.len() > NAME_MAX {
        return Err(VfsError::NameTooLong);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_roundtrip_and_forgery() {
        let fh = FileHandle { export_id: 7, ino: 42, generation: 9 };
        assert_eq!(FileHandle::from_bytes(&fh.to_bytes()).unwrap(), fh);
        let mut forged = fh.to_bytes();
        forged[0] = 2;
        assert_eq!(FileHandle::from_bytes(&forged), Err(VfsError::BadHandle));
        assert_eq!(FileHandle::from_bytes(&forged[..10]), Err(VfsError::BadHandle));
    }

    #[test]
    fn names() {
        assert_eq!(check_name(b"a"), Ok(()));
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert_eq!(check_name(bad), Err(VfsError::Inval));
        }
        assert_eq!(check_name(&[b'x'; 256]), Err(VfsError::NameTooLong));
    }
}
