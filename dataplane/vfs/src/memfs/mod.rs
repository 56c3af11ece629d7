//! `MemFs`: the embedded memory backend, bounded by a configured capacity.
//!
//! # Concurrency (why it is safe, and why it scales)
//!
//! * The inode table is split into `SHARD_COUNT` shards, each a `RwLock`ed
//!   map from inode number to `Arc<Inode>`. A data-path call (read, write,
//!   getattr, setattr, commit) takes one shard lock shared just long enough
//!   to clone the `Arc`, then the object's own lock: calls on different
//!   files touch different locks, and reads of one file share its lock.
//! * Space is accounted with lock-free atomics (`space::Space`), reserved
//!   before any state changes, so a failed reservation leaves no trace.
//! * Namespace changes (create, remove, rename, link, rmdir, set_quota,
//!   remove_tree) are serialised by one `ns` mutex. They are rare next to
//!   I/O and this makes multi-object updates atomic with respect to each
//!   other without a lock order between inodes.
//! * Deadlock freedom: only namespace changes (holding `ns`) ever hold more
//!   than one inode lock at a time; every other call holds at most one inode
//!   lock and never waits for a second while holding it (`readdir` and
//!   `lookup` copy what they need out of the directory before locking the
//!   children). Shard locks are leaves: nothing is locked while holding one.
//! * A removed object is marked `dead` under its own lock while its charges
//!   are released, so a writer that raced the removal (holding an `Arc`)
//!   sees `dead` and fails `Stale` instead of charging space to a ghost.
//! * Open references (`pin`): an object that loses its last link while
//!   pinned stays in the table with `nlink` 0, its charges kept; the unpin
//!   that leaves it neither pinned nor linked destroys it under `ns`, like
//!   a removal. Only namespace changes add links, and `link` refuses an
//!   object with none, so `nlink` 0 is final.
//!
//! # Handles
//!
//! Inode numbers are reused (smallest memory footprint for long-running
//! servers); generations never are (one counter for the whole backend), so a
//! handle to a removed object is `Stale` even after its number is reused.
//! The root is always inode 1, generation 1: its handle survives a restart.
//! Every other generation starts from the time the backend was made (in
//! nanoseconds), so a handle from before a restart is `Stale` too, never
//! a new object that happens to get its inode number (a client that kept
//! it, or a pNFS MDS naming data files by handle, would reach the wrong
//! file).

mod node;
mod space;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use node::{dirent_charge, xattr_charge, Body, Dir, FileData, Inode, State};
use space::{Space, Volume};

use crate::{
    check_name, Attr, Content, CreateMode, XattrSet, XATTRS_PER_OBJECT_MAX, XATTR_NAME_MAX, XATTR_VALUE_BYTES_MAX, Cred, DirEntry, ExportId, FileHandle, FileType, FsStat, Ino, NodeKind, QuotaUsage,
    SetAttr, SetTime, Stability, Time, Vfs, VfsError, VfsResult,
};

/// Size of a data chunk (a page): the unit of allocation and of space
/// charged for data.
pub const CHUNK_BYTES: usize = 4096;
/// Size of a file extent: the pages of one, once all are present, are held
/// in one buffer (a large READ lends it whole).
pub const EXTENT_BYTES: usize = 64 << 10;
/// What one data chunk charges: the data plus its share of map and allocator overhead.
pub const CHUNK_CHARGE_BYTES: u64 = CHUNK_BYTES as u64 + 64;
/// What one object (inode) charges, whatever its type: the `Arc<Inode>`
/// allocation (about 290 bytes with allocator overhead) and its slot in the
/// inode table, with some slack for table growth.
pub const INODE_CHARGE_BYTES: u64 = 384;
/// What one directory entry charges, plus the length of its name: the
/// shared name allocation, the name-index slot and the cookie-index slot.
pub const DIRENT_CHARGE_BYTES: u64 = 192;
/// What one extended attribute charges besides its name and value.
pub const XATTR_CHARGE_BYTES: u64 = 128;
/// Largest file size (and write end offset) accepted.
pub const FILE_SIZE_MAX_BYTES: u64 = 1 << 44;
/// Longest symlink target accepted.
pub const SYMLINK_TARGET_MAX_BYTES: usize = 4096;
/// Most links an object may have (a directory: 2 + subdirectories).
pub const LINK_MAX: u32 = 65_000;
/// Smallest capacity a backend may be configured with (the root must fit).
pub const CAPACITY_MIN_BYTES: u64 = INODE_CHARGE_BYTES;

/// Inode number and generation of every export's root.
pub const ROOT_INO: Ino = 1;
pub const ROOT_GENERATION: u64 = 1;

const SHARD_COUNT: usize = 64;
/// Entries copied out of a directory per lock hold during `readdir`.
const READDIR_BATCH_MAX: usize = 64;

#[derive(Debug, Clone, Copy)]
pub struct MemFsConfig {
    pub export_id: ExportId,
    pub capacity_bytes: u64,
}

/// A `MemFsConfig` that cannot be served, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

/// State that only namespace changes touch, under the `ns` mutex.
#[derive(Debug)]
struct Namespace {
    ino_free: Vec<Ino>,
    ino_next: Ino,
}

type Shard = RwLock<crate::idhash::IdHashMap<Ino, Arc<Inode>>>;

pub struct MemFs {
    export_id: ExportId,
    shards: Box<[Shard]>,
    ns: Mutex<Namespace>,
    /// Next generation to hand out; every generation from
    /// `generation_base` below it was issued.
    generation_next: AtomicU64,
    /// The first generation of this life of the backend (other than the
    /// root's): below it, a handle is from before a restart.
    generation_base: u64,
    /// Highest inode number ever issued (to tell forged handles from stale ones).
    ino_high: AtomicU64,
    space: Space,
    inode_count: AtomicU64,
    write_verifier: [u8; 8],
}

impl std::fmt::Debug for MemFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemFs")
            .field("export_id", &self.export_id)
            .field("capacity_bytes", &self.space.capacity_bytes())
            .field("used_bytes", &self.space.used_bytes())
            .finish()
    }
}

impl MemFs {
    /// A new, empty file system whose root directory (mode 0755, owned by
    /// root) is already charged against `capacity_bytes`. Panics on a
    /// configuration `try_new` refuses (use that for configuration input).
    pub fn new(config: MemFsConfig) -> MemFs {
        MemFs::try_new(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As `new`, with an error naming what is wrong with `config`.
    pub fn try_new(config: MemFsConfig) -> Result<MemFs, ConfigError> {
        if config.capacity_bytes < CAPACITY_MIN_BYTES {
            return Err(ConfigError(format!(
                "memfs capacity_bytes {} is below the minimum of {CAPACITY_MIN_BYTES} bytes (the root directory alone needs that)",
                config.capacity_bytes
            )));
        }
        Ok(MemFs::create_empty(config))
    }

    fn create_empty(config: MemFsConfig) -> MemFs {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let generation_base = now.max(ROOT_GENERATION + 1);
        let fs = MemFs {
            export_id: config.export_id,
            shards: (0..SHARD_COUNT).map(|_| RwLock::new(HashMap::default())).collect(),
            ns: Mutex::new(Namespace { ino_free: Vec::new(), ino_next: ROOT_INO + 1 }),
            generation_next: AtomicU64::new(generation_base),
            generation_base,
            ino_high: AtomicU64::new(ROOT_INO),
            space: Space::new(config.capacity_bytes, INODE_CHARGE_BYTES),
            inode_count: AtomicU64::new(1),
            write_verifier: crate::random_verifier(),
        };
        let now = Time::now();
        let root = State {
            ftype: FileType::Directory,
            mode: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 0,
            rdev: (0, 0),
            atime: now,
            mtime: now,
            ctime: now,
            change: 1,
            dead: false,
            pins: 0,
            volume: None,
            charged_bytes: INODE_CHARGE_BYTES,
            body: Body::Dir(Dir::new(ROOT_INO, ROOT_GENERATION)),
            xattrs: Default::default(),
        };
        fs.table_insert(Arc::new(Inode::new(ROOT_INO, ROOT_GENERATION, root)));
        fs
    }

    pub fn export_id(&self) -> ExportId {
        self.export_id
    }

    /// Bytes charged against the whole backend (data, objects, entries).
    pub fn used_bytes(&self) -> u64 {
        self.space.used_bytes()
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.space.capacity_bytes()
    }

    /// Live objects, the root included.
    pub fn inode_count(&self) -> u64 {
        self.inode_count.load(Ordering::Acquire)
    }

    fn shard(&self, ino: Ino) -> &Shard {
        &self.shards[(ino % SHARD_COUNT as u64) as usize]
    }

    fn table_insert(&self, inode: Arc<Inode>) {
        let previous = self.shard(inode.ino).write().expect("memfs shard poisoned").insert(inode.ino, inode);
        assert!(previous.is_none(), "inode number issued twice");
    }

    fn table_get(&self, ino: Ino) -> Option<Arc<Inode>> {
        self.shard(ino).read().expect("memfs shard poisoned").get(&ino).cloned()
    }

    fn table_remove(&self, ino: Ino) {
        let removed = self.shard(ino).write().expect("memfs shard poisoned").remove(&ino);
        assert!(removed.is_some(), "removing an inode that is not in the table");
    }

    /// The live object a handle names. A handle we could never have issued
    /// is `BadHandle`; one for an object that is gone is `Stale`.
    fn get(&self, fh: &FileHandle) -> VfsResult<Arc<Inode>> {
        if fh.export_id != self.export_id {
            return Err(VfsError::Stale);
        }
        if fh.ino == 0 || fh.generation == 0 || fh.generation >= self.generation_next.load(Ordering::Acquire) {
            return Err(VfsError::BadHandle);
        }
        if fh.generation < self.generation_base && fh.generation != ROOT_GENERATION {
            // Issued before a restart: that object is gone.
            return Err(VfsError::Stale);
        }
        if fh.ino > self.ino_high.load(Ordering::Acquire) {
            return Err(VfsError::BadHandle);
        }
        match self.table_get(fh.ino) {
            Some(inode) if inode.generation == fh.generation => Ok(inode),
            _ => Err(VfsError::Stale),
        }
    }

    /// The object a directory entry names (present while the entry exists,
    /// which the caller guarantees by holding `ns` or re-checking).
    fn get_entry(&self, ino: Ino, generation: u64) -> Option<Arc<Inode>> {
        self.table_get(ino).filter(|i| i.generation == generation)
    }

    fn handle(&self, inode: &Inode) -> FileHandle {
        FileHandle { export_id: self.export_id, ino: inode.ino, generation: inode.generation }
    }

    fn attr(&self, inode: &Inode, st: &State) -> Attr {
        Attr {
            ftype: st.ftype,
            mode: st.mode,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            size: st.size,
            used: st.charged_bytes,
            rdev: st.rdev,
            fsid: self.export_id as u64,
            fileid: inode.ino,
            atime: st.atime,
            mtime: st.mtime,
            ctime: st.ctime,
            change: st.change,
        }
    }

    fn lock_ns(&self) -> MutexGuard<'_, Namespace> {
        self.ns.lock().expect("memfs namespace lock poisoned")
    }

    /// Reserve `bytes` in the volume (if any) and the backend, or neither.
    fn charge(&self, volume: Option<&Arc<Volume>>, bytes: u64) -> VfsResult<()> {
        if let Some(v) = volume {
            if !v.space.try_charge(bytes) {
                return Err(VfsError::QuotaExceeded);
            }
        }
        if !self.space.try_charge(bytes) {
            if let Some(v) = volume {
                v.space.release(bytes);
            }
            return Err(VfsError::NoSpace);
        }
        Ok(())
    }

    fn release(&self, volume: Option<&Arc<Volume>>, bytes: u64) {
        if let Some(v) = volume {
            v.space.release(bytes);
        }
        self.space.release(bytes);
    }

    /// The last link to `inode` is gone: mark it dead, free its charges and
    /// its inode number. Caller holds `ns` and the inode's write lock.
    fn destroy(&self, ns: &mut Namespace, inode: &Inode, st: &mut State) {
        assert!(!st.dead, "object destroyed twice");
        assert!(inode.ino != ROOT_INO, "the root is never destroyed");
        st.dead = true;
        st.nlink = 0;
        self.release(st.volume.as_ref(), st.charged_bytes);
        st.charged_bytes = 0;
        st.body = Body::Special;
        st.volume = None;
        self.table_remove(inode.ino);
        ns.ino_free.push(inode.ino);
        self.inode_count.fetch_sub(1, Ordering::AcqRel);
    }

    fn alloc_ino(&self, ns: &mut Namespace) -> Ino {
        if let Some(ino) = ns.ino_free.pop() {
            return ino;
        }
        let ino = ns.ino_next;
        ns.ino_next += 1;
        self.ino_high.store(ino, Ordering::Release);
        ino
    }

    /// Is `ancestor` on the parent chain of the directory `start` (itself
    /// included)? Caller holds `ns` so parents cannot change meanwhile;
    /// `locked` are directories the caller holds write-locked, with the
    /// parent each records.
    fn is_ancestor(&self, ancestor: Ino, start: Ino, locked: &[(Ino, Ino)]) -> bool {
        let mut cur = start;
        // Bounded: every step goes up one level and the tree has fewer
        // levels than objects.
        for _ in 0..=self.inode_count() {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT_INO {
                return false;
            }
            cur = match locked.iter().find(|(ino, _)| *ino == cur) {
                Some(&(_, parent)) => parent,
                None => {
                    let inode = self.table_get(cur).expect("directory parent chain broken");
                    let st = inode.read();
                    match &st.body {
                        Body::Dir(d) => d.parent_ino,
                        _ => panic!("directory parent is not a directory"),
                    }
                }
            };
        }
        panic!("directory parent chain has a cycle");
    }
}

fn dir_of(st: &State) -> VfsResult<&Dir> {
    match &st.body {
        Body::Dir(d) => Ok(d),
        _ => Err(VfsError::NotDir),
    }
}

fn dir_of_mut(st: &mut State) -> VfsResult<&mut Dir> {
    match &mut st.body {
        Body::Dir(d) => Ok(d),
        _ => Err(VfsError::NotDir),
    }
}

fn live(st: &State) -> VfsResult<()> {
    if st.dead {
        Err(VfsError::Stale)
    } else {
        Ok(())
    }
}

/// The volume an object counts against as an entry of its parent: a volume
/// root belongs to its own volume inside, but to its parent's outside.
fn outer_volume(st: &State, ino: Ino) -> Option<&Arc<Volume>> {
    match &st.body {
        Body::Dir(d) if d.volume_root.is_some() => {
            // Volumes do not nest, so a volume root's parent is in no volume.
            debug_assert_eq!(st.volume.as_ref().map(|v| v.root_ino), Some(ino));
            None
        }
        _ => st.volume.as_ref(),
    }
}

fn same_volume(a: Option<&Arc<Volume>>, b: Option<&Arc<Volume>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

fn apply_time(t: SetTime, now: Time) -> Option<Time> {
    match t {
        SetTime::DontChange => None,
        SetTime::ServerNow => Some(now),
        SetTime::Client(t) => Some(t),
    }
}

mod ops;
