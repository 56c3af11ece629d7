//! `diskfs`: the durable backend. Files and directories on block devices
//! (the `block` crate), metadata changes made durable through an intent
//! log, the whole metadata state checkpointed when the log fills. The
//! on-disk format is described in FORMAT.md; how it stays consistent
//! through a crash is argued there and proven by `tests/crash.rs`.
//!
//! # How a call runs
//!
//! * Metadata lives in memory (`meta::State`) under one mutex; a change is
//!   a transaction of records, applied to the state and appended to the
//!   pending log under that mutex, then made durable by a group commit
//!   (`Inner::sync`): the first waiter writes every pending record as one
//!   log unit and flushes; the others find theirs durable. NFS metadata
//!   operations reply only after that (RFC 1813 / RFC 8881 semantics).
//! * Data blocks are written in place, never cached. A block allocated for
//!   a write is mapped in memory only ("pending") until a flush has made
//!   its data durable; only then does a `Map` record log it (COMMIT, a
//!   stable write, or a checkpoint). So a crash never leaves a file
//!   mapping a block whose data it did not write.
//! * Freed blocks stay out of the allocator until the record that freed
//!   them is durable and every data I/O that started before has finished
//!   (`IoGate`), so a block is never reused while an old owner might still
//!   read or write it, or might still own it after a crash.
//! * READ, WRITE and COMMIT park the call (`vfs::Later`), never blocking a
//!   core. A READ or an UNSTABLE WRITE on a core loop goes through that
//!   core's own device queues and completes when the loop polls them
//!   (`coreio`); stable WRITEs, COMMIT and calls that do not fit there run
//!   on the backend's worker threads (`vfs::iopool`). Metadata operations run on the calling core
//!   and wait for their log write; making them parkable too needs the
//!   `Vfs` trait's metadata calls to become asynchronous (not yet).
//! * Freed blocks return to the allocator only after a grace period that
//!   nobody waits for (`Grace`, `reclaim`): a core waiting for the data I/O
//!   in flight could be the very core whose read holds them.

pub mod alloc;
mod coreio;
pub mod dev;
pub mod format;
pub mod fsck;
pub mod journal;
pub mod meta;
pub mod wlock;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use block::Device;
use vfs::{
    check_name, Attr, CreateMode, Cred, DirEntry, ExportId, FileHandle, FileType, Done, FsStat, Ino, IoDone, Later, NodeKind, QuotaUsage,
    SetAttr, SetTime, Stability, Time, Vfs, VfsError, VfsResult,
};

use alloc::Alloc;
use dev::Devs;
use format::Super;
use journal::LogPos;
use meta::{Ext, Inode, InodeRec, Phys, Rec, State, BLOCK};

/// Largest file size accepted.
pub const FILE_SIZE_MAX_BYTES: u64 = 1 << 44;
/// Bytes a server-side copy (`copy_range`) moves per read + write.
const COPY_CHUNK_BYTES: usize = 1 << 20;
/// Longest symlink target.
pub const SYMLINK_TARGET_MAX_BYTES: usize = 4096;
/// Most links an object may have.
pub const LINK_MAX: u32 = 65_000;
/// Worker threads for parked READ / WRITE / COMMIT.
pub const IO_THREADS: usize = 8;
/// Metadata operations that add objects are refused (NoSpace) once the
/// state would fill this share of a checkpoint area (in percent).
const CKPT_FILL_MAX_PCT: u64 = 75;

#[derive(Debug, Clone)]
pub struct Options {
    pub export_id: ExportId,
    /// Format devices that hold no diskfs format (never one that does).
    pub initialize: bool,
    /// I/O buffers of `dev::BUF_BLOCKS` blocks (memory for data in flight).
    pub io_buffers: usize,
}

impl Options {
    pub fn new(export_id: ExportId, initialize: bool) -> Options {
        Options { export_id, initialize, io_buffers: dev::BUFS_MAX }
    }
}

/// A file system's counters (see `DiskFs::counters`).
#[derive(Clone)]
pub struct Counters(Arc<Inner>);

impl Counters {
    /// READs served on a core loop's own device queues, and those of them
    /// done again on a worker.
    pub fn core_reads(&self) -> (u64, u64) {
        (self.0.core_reads.load(Ordering::Relaxed), self.0.core_read_retries.load(Ordering::Relaxed))
    }

    /// Device I/O errors.
    pub fn io_errors(&self) -> u64 {
        self.0.devs.io_errors.load(Ordering::Relaxed)
    }

    /// WRITEs written on a core loop's own device queues.
    pub fn core_writes(&self) -> u64 {
        self.0.core_writes.load(Ordering::Relaxed)
    }

    /// COMMITs (and stable WRITEs' commits) whose device flushes ran on a
    /// core loop's own queues.
    pub fn core_commits(&self) -> u64 {
        self.0.core_commits.load(Ordering::Relaxed)
    }

    /// Log units written and flushed (each a group commit of every change
    /// logged before it), and calls that waited for theirs parked on a
    /// worker rather than on their core.
    pub fn log_flushes(&self) -> (u64, u64) {
        (self.0.log_flushes.load(Ordering::Relaxed), self.0.log_waits_parked.load(Ordering::Relaxed))
    }
}

/// What `open` did, for the server's log.
#[derive(Debug, Clone)]
pub struct OpenReport {
    pub formatted: bool,
    pub cluster_uuid: String,
    pub log_units_replayed: u64,
    pub checkpoint_blocks: u64,
    pub orphans_freed: u64,
    pub inodes: u64,
    pub data_blocks_used: u64,
    pub data_blocks_total: u64,
    pub recovery_ms: u64,
}

struct Meta {
    st: State,
    alloc: Alloc,
    /// Encoded records applied but not yet written to the log.
    pending: Vec<u8>,
    /// Last transaction number handed out.
    lsn: u64,
    /// Blocks freed by transaction `lsn`, not yet reusable.
    quarantine: Vec<(u64, Phys)>,
}

/// Counts data I/O in flight in two alternating epochs, so freed blocks can
/// wait for every I/O that might still touch them (a grace period).
struct IoGate {
    epoch: AtomicU64,
    active: [AtomicU64; 2],
}

impl IoGate {
    fn enter(&self) -> u64 {
        loop {
            let e = self.epoch.load(Ordering::Acquire);
            self.active[(e & 1) as usize].fetch_add(1, Ordering::AcqRel);
            if self.epoch.load(Ordering::Acquire) == e {
                return e;
            }
            self.active[(e & 1) as usize].fetch_sub(1, Ordering::AcqRel);
        }
    }
    fn exit(&self, e: u64) {
        self.active[(e & 1) as usize].fetch_sub(1, Ordering::AcqRel);
    }
    /// Start a grace period: I/O entering from now on counts in the other
    /// epoch. Returns the epoch to wait for (`drained`). Callers are
    /// serialised (`Inner::reclaiming`) and start the next one only once
    /// this one drained.
    fn flip(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::AcqRel)
    }
    /// Every I/O that entered before flip `e` has exited.
    fn drained(&self, e: u64) -> bool {
        self.active[(e & 1) as usize].load(Ordering::Acquire) == 0
    }
}

/// Freed blocks in their grace period: released when every data I/O that
/// entered before `flip` has exited. Never waited for: a core that waits
/// here could be the one whose read holds the gate (`coreio`).
#[derive(Default)]
struct Grace {
    waiting: Vec<Phys>,
    flip: u64,
}

struct Inner {
    /// This file system itself, for the metadata flushes a protocol
    /// defers (`vfs::durable`).
    me: std::sync::Weak<Inner>,
    devs: Devs,
    sb: Super,
    meta: Mutex<Meta>,
    log: Mutex<(LogPos, bool)>,
    durable: AtomicU64,
    gate: IoGate,
    /// Blocks whose release is durable, waiting for the data I/O that
    /// might still touch them (see `reclaim`).
    reclaiming: Mutex<Grace>,
    /// `reclaiming` holds blocks waiting on the gate.
    grace_waiting: std::sync::atomic::AtomicBool,
    /// READs served on a core loop (`coreio`), and those done again on a
    /// worker because their file lost blocks meanwhile.
    core_reads: AtomicU64,
    core_read_retries: AtomicU64,
    /// UNSTABLE WRITEs written on a core loop (`coreio`).
    core_writes: AtomicU64,
    core_commits: AtomicU64,
    /// Log units written and flushed (group commits; checkpoints apart).
    log_flushes: AtomicU64,
    /// Calls that waited for their log flush on a worker, parked
    /// (`vfs::durable`), instead of on their core.
    log_waits_parked: AtomicU64,
    verifier: [u8; 8],
    /// Started at the first parked call (tools and recovery need none).
    pool: std::sync::OnceLock<vfs::iopool::IoPool>,
}

/// Flushes a protocol deferred (`Inner::durable`): on an I/O worker, so a
/// core never waits for the log device.
impl vfs::durable::Durability for Inner {
    fn sync_now(&self, token: u64) -> VfsResult<()> {
        self.sync(token)
    }

    fn is_durable(&self, token: u64) -> bool {
        self.durable.load(Ordering::Acquire) >= token
    }

    fn sync_later(&self, token: u64, done: Box<dyn FnOnce(VfsResult<()>) + Send>) {
        match self.me.upgrade() {
            Some(me) if !self.is_durable(token) => {
                self.log_waits_parked.fetch_add(1, Ordering::Relaxed);
                self.run(Box::new(move || done(me.sync(token))))
            }
            _ => done(self.sync(token)),
        }
    }
}

/// A mount of the file system: all of it (the root), or one top-level
/// directory. Handles carry the view's export id; a handle to an object
/// outside the view's tree is `Stale` (no escape between mounts).
#[derive(Debug, Clone, Copy)]
struct View {
    export_id: ExportId,
    root: (Ino, u64),
    /// 0: the whole file system; else the top-level directory's inode.
    tree: Ino,
}

pub struct DiskFs {
    inner: Arc<Inner>,
    report: OpenReport,
    view: View,
}

impl std::fmt::Debug for DiskFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskFs").field("view", &self.view).field("report", &self.report).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Format `devices` as one new, empty file system. Refuses devices that
/// hold a diskfs format unless `force`.
pub fn format(devices: Vec<Device>, export_id: ExportId, force: bool) -> Result<String, String> {
    let devs = Devs::new(devices, dev::TOOL_BUFS)?;
    let s = journal::format(&devs, export_id, force)?;
    Ok(journal::uuid_str(&s[0].cluster_uuid))
}

impl DiskFs {
    /// Mount the file system on `devices` (in their format order),
    /// recovering from the log; with `initialize`, format blank devices
    /// first. Every refusal names the device and what is wrong.
    pub fn open(devices: Vec<Device>, opts: &Options) -> Result<DiskFs, String> {
        let t0 = std::time::Instant::now();
        let devs = Devs::new(devices, opts.io_buffers)?;
        let mut formatted = false;
        let supers = match journal::read_supers(&devs).and_then(|s| journal::check_supers(&devs, &s)) {
            Ok(s) => s,
            Err(journal::LoadError::Blank) if opts.initialize => {
                formatted = true;
                journal::format(&devs, opts.export_id, false)?
            }
            Err(journal::LoadError::Blank) => {
                return Err(format!(
                    "diskfs: device {} holds no diskfs format; set \"initialize\": true to format blank devices at start, or run chimera-mkfs",
                    devs.name(0)
                ))
            }
            Err(journal::LoadError::Other(e)) => return Err(e),
            Err(e) => return Err(format!("diskfs: refusing to start: {e}")),
        };
        for d in 0..devs.devs.len() {
            if devs.devs[d].info().read_only {
                return Err(format!("diskfs: device {} is read-only; a file system is served read-write", devs.name(d)));
            }
        }
        let s0 = supers[0];
        let loaded = journal::load(&devs, &s0).map_err(|e| format!("diskfs: refusing to start: {e}"))?;
        let ranges: Vec<(u64, u64)> = supers.iter().map(|s| (s.data_start, s.device_blocks)).collect();
        let mut alloc = Alloc::new(&ranges);
        for i in loaded.st.inodes.values() {
            for e in i.map.values() {
                if !alloc.take(e.phys) {
                    return Err(format!(
                        "diskfs: refusing to start: inode {} maps device {} block {} twice or outside the data area (run chimera-fsck)",
                        i.rec.ino,
                        meta::phys_dev(e.phys),
                        meta::phys_lba(e.phys)
                    ));
                }
            }
        }
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            sb: s0,
            meta: Mutex::new(Meta { st: loaded.st, alloc, pending: Vec::new(), lsn: 0, quarantine: Vec::new() }),
            log: Mutex::new((loaded.log, false)),
            durable: AtomicU64::new(0),
            gate: IoGate { epoch: AtomicU64::new(0), active: [AtomicU64::new(0), AtomicU64::new(0)] },
            reclaiming: Mutex::new(Grace::default()),
            grace_waiting: std::sync::atomic::AtomicBool::new(false),
            core_reads: AtomicU64::new(0),
            core_read_retries: AtomicU64::new(0),
            core_writes: AtomicU64::new(0),
            core_commits: AtomicU64::new(0),
            log_flushes: AtomicU64::new(0),
            log_waits_parked: AtomicU64::new(0),
            verifier: vfs::random_verifier(),
            pool: std::sync::OnceLock::new(),
            devs,
        });
        // Objects that lost their last name while open when the server
        // stopped: nothing is open now, so they go.
        let orphans: Vec<Ino> = {
            let m = lock(&inner.meta);
            m.st.inodes.values().filter(|i| i.rec.nlink == 0 && i.rec.ftype != FileType::Directory).map(|i| i.rec.ino).collect()
        };
        if !orphans.is_empty() {
            let lsn = {
                let mut m = lock(&inner.meta);
                for ino in &orphans {
                    put(&mut m, Rec::InodeFree { ino: *ino });
                }
                finish(&mut m)
            };
            inner.sync(lsn).map_err(|_| "diskfs: cannot log the release of orphaned files (log device failing)".to_string())?;
        }
        let report = {
            let m = lock(&inner.meta);
            OpenReport {
                formatted,
                cluster_uuid: journal::uuid_str(&s0.cluster_uuid),
                log_units_replayed: loaded.units,
                checkpoint_blocks: loaded.ckpt_blocks,
                orphans_freed: orphans.len() as u64,
                inodes: m.st.inodes.len() as u64,
                data_blocks_used: m.alloc.total_blocks() - m.alloc.free_blocks(),
                data_blocks_total: m.alloc.total_blocks(),
                recovery_ms: t0.elapsed().as_millis() as u64,
            }
        };
        Ok(DiskFs { inner, report, view: View { export_id: opts.export_id, root: (meta::ROOT_INO, meta::ROOT_GEN), tree: 0 } })
    }

    /// A view of `path` for a mount with `export_id`: "/" is the whole
    /// file system; "/name" a top-level directory, created (mode 0755,
    /// owned by root) when missing.
    pub fn view(&self, path: &str, export_id: ExportId) -> Result<DiskFs, String> {
        let mk = |root: (Ino, u64), tree: Ino| DiskFs { inner: self.inner.clone(), report: self.report.clone(), view: View { export_id, root, tree } };
        if path == "/" {
            return Ok(mk((meta::ROOT_INO, meta::ROOT_GEN), 0));
        }
        let name = path.strip_prefix('/').filter(|n| !n.is_empty() && !n.contains('/')).ok_or_else(|| {
            format!("diskfs: mount path {path:?}: \"/\" or one top-level directory (\"/name\") only")
        })?;
        let whole = mk((meta::ROOT_INO, meta::ROOT_GEN), 0);
        let root = whole.root(export_id).map_err(|e| format!("diskfs: {e}"))?;
        let (fh, a) = match whole.lookup(&root, name.as_bytes()) {
            Ok(x) => x,
            Err(VfsError::NoEnt) => whole
                .create(&root, name.as_bytes(), NodeKind::Directory, 0o755, &Cred::ROOT, CreateMode::Guarded)
                .map_err(|e| format!("diskfs: cannot create the mount directory {path:?}: {e}"))?,
            Err(e) => return Err(format!("diskfs: mount path {path:?}: {e}")),
        };
        if a.ftype != FileType::Directory {
            return Err(format!("diskfs: mount path {path:?} is not a directory"));
        }
        self.inner.make_tree(fh.ino).map_err(|e| format!("diskfs: mount path {path:?}: {e}"))?;
        Ok(mk((fh.ino, fh.generation), fh.ino))
    }

    fn handle(&self, ino: Ino, gen: u64) -> FileHandle {
        FileHandle { export_id: self.view.export_id, ino, generation: gen }
    }

    fn attr(&self, i: &Inode) -> Attr {
        let mut a = self.inner.attr(i);
        a.fsid = self.view.export_id as u64;
        a
    }

    fn fix(&self, mut a: Attr) -> Attr {
        a.fsid = self.view.export_id as u64;
        a
    }

    /// The handle is this view's and names an object inside its tree.
    fn check(&self, fh: &FileHandle) -> VfsResult<()> {
        if fh.export_id != self.view.export_id {
            return Err(VfsError::Stale);
        }
        if self.view.tree != 0 {
            let m = self.inner.meta();
            if m.st.get(fh.ino, fh.generation)?.rec.tree != self.view.tree {
                return Err(VfsError::Stale);
            }
        }
        Ok(())
    }

    pub fn report(&self) -> &OpenReport {
        &self.report
    }

    /// Device I/O errors seen since start.
    pub fn io_errors(&self) -> u64 {
        self.inner.devs.io_errors.load(Ordering::Relaxed)
    }

    /// Counters that stay readable after the file system moved into the
    /// server's router (for `/metrics`).
    pub fn counters(&self) -> Counters {
        Counters(self.inner.clone())
    }

    /// Write a checkpoint now (tests, and a clean stop).
    pub fn checkpoint(&self) -> VfsResult<()> {
        let mut lw = lock(&self.inner.log);
        self.inner.checkpoint_locked(&mut lw)
    }
}

/// Blocks for the holes among file blocks `b0..=b1`: quota checked,
/// allocated all or nothing, mapped as pending (not yet written). Returns
/// (file block, address) of each, in file order.
fn reserve_holes(m: &mut Meta, fh: &FileHandle, b0: u64, b1: u64) -> VfsResult<Vec<(u64, Phys)>> {
    let i = m.st.get(fh.ino, fh.generation)?;
    let vol = i.rec.volume;
    let holes: Vec<u64> = (b0..=b1).filter(|f| !i.map.contains_key(f)).collect();
    if holes.is_empty() {
        return Ok(Vec::new());
    }
    if vol != 0 {
        let cap = m.st.inodes.get(&vol).map_or(0, |v| v.rec.quota);
        let used = m.st.vol_used.get(&vol).copied().unwrap_or(0);
        if used + holes.len() as u64 * BLOCK > cap {
            return Err(VfsError::QuotaExceeded);
        }
    }
    let got = m.alloc.alloc(holes.len() as u64).ok_or(VfsError::NoSpace)?;
    let phys = got.iter().flat_map(|&(p, n)| (0..n).map(move |k| p + k));
    let fresh: Vec<(u64, Phys)> = holes.into_iter().zip(phys).collect();
    for &(f, p) in &fresh {
        m.st.map_insert(fh.ino, f, Ext { phys: p, logged: false, tag: u64::MAX });
    }
    Ok(fresh)
}

/// A write's answer as a parked call's completion.
fn write_done((count, committed, attr): (usize, Stability, Attr)) -> IoDone {
    IoDone::Write { count, committed, attr }
}

/// Data operations need a regular file: a directory is `IsDir`, anything
/// else `Inval`.
fn regular(i: &Inode) -> VfsResult<()> {
    match i.rec.ftype {
        FileType::Regular => Ok(()),
        FileType::Directory => Err(VfsError::IsDir),
        _ => Err(VfsError::Inval),
    }
}

/// A write's blocks: (file block, physical block, holds data already,
/// newly allocated).
type WritePlan = Vec<(u64, Phys, bool, bool)>;

/// Apply a record to the state and append it to the pending log.
fn put(m: &mut Meta, r: Rec) {
    let mut freed = Vec::new();
    m.st.apply(&r, &mut freed).unwrap_or_else(|e| panic!("diskfs: a live record does not fit the state: {e}: {r:?}"));
    meta::encode(&r, &mut m.pending);
    let next = m.lsn + 1;
    m.quarantine.extend(freed.into_iter().map(|p| (next, p)));
}

/// Close the transaction built by `put`s: its number, to `sync` on.
fn finish(m: &mut Meta) -> u64 {
    m.lsn += 1;
    m.lsn
}

/// The tree an object named in directory `d` belongs to (see
/// `InodeRec::tree`): its directory's. Only `DiskFs::view` makes a tree.
fn tree_under(d: &InodeRec, _ftype: FileType, _ino: Ino) -> Ino {
    d.tree
}

fn now() -> Time {
    Time::now()
}

fn touch(rec: &mut InodeRec, t: Time) {
    rec.mtime = t;
    rec.ctime = t;
    rec.change += 1;
}

fn set_time(s: SetTime, t: Time) -> Option<Time> {
    match s {
        SetTime::DontChange => None,
        SetTime::ServerNow => Some(t),
        SetTime::Client(c) => Some(c),
    }
}

impl Inner {
    fn meta(&self) -> MutexGuard<'_, Meta> {
        lock(&self.meta)
    }

    /// Run a parked call on a worker (inline if no worker can start).
    fn run(&self, job: vfs::iopool::Job) {
        match self.pool.get() {
            Some(p) => p.run(job),
            None => match vfs::iopool::IoPool::start("diskfs-io", IO_THREADS) {
                Ok(p) => self.pool.get_or_init(|| p).run(job),
                Err(e) => {
                    eprintln!("{e}; running the call inline");
                    job()
                }
            },
        }
    }

    fn attr(&self, i: &Inode) -> Attr {
        let r = &i.rec;
        Attr {
            ftype: r.ftype,
            mode: r.mode,
            nlink: r.nlink,
            uid: r.uid,
            gid: r.gid,
            size: if r.ftype == FileType::Symlink { r.target.len() as u64 } else { r.size },
            used: i.map.len() as u64 * BLOCK,
            rdev: r.rdev,
            fsid: 0,
            fileid: r.ino,
            atime: r.atime,
            mtime: r.mtime,
            ctime: r.ctime,
            change: r.change,
        }
    }

    fn ckpt_room(&self, m: &Meta) -> VfsResult<()> {
        let cap = self.sb.ckpt_blocks * format::PAYLOAD_BYTES as u64;
        if (m.st.ckpt_bytes + m.pending.len() as u64) * 100 > cap * CKPT_FILL_MAX_PCT {
            return Err(VfsError::NoSpace);
        }
        Ok(())
    }

    /// Make transaction `lsn` durable (group commit).
    fn sync(&self, lsn: u64) -> VfsResult<()> {
        if self.durable.load(Ordering::Acquire) >= lsn {
            return Ok(());
        }
        {
            let mut lw = lock(&self.log);
            if self.durable.load(Ordering::Acquire) < lsn {
                if lw.1 {
                    return Err(VfsError::Io);
                }
                let (bytes, upto) = {
                    let mut m = self.meta();
                    (std::mem::take(&mut m.pending), m.lsn)
                };
                match journal::append(&self.devs, &self.sb, &mut lw.0, &bytes) {
                    Ok(true) => {
                        self.log_flushes.fetch_add(1, Ordering::Relaxed);
                        self.durable.fetch_max(upto, Ordering::AcqRel)
                    }
                    Ok(false) => {
                        // The log is full: the checkpoint holds these too.
                        self.checkpoint_locked(&mut lw)?;
                        0
                    }
                    Err(e) => {
                        lw.1 = true;
                        eprintln!("diskfs: log write failed, metadata changes now fail: {e}");
                        return Err(VfsError::Io);
                    }
                };
            }
        }
        self.reclaim();
        Ok(())
    }

    /// Make transaction `lsn` durable before the call answers: deferred
    /// when the calling protocol can wait for it without blocking its core
    /// (`vfs::durable::deferring`: the flush then runs on a worker and the
    /// reply leaves after it), otherwise now (`sync`).
    fn durable(&self, lsn: u64) -> VfsResult<()> {
        if self.durable.load(Ordering::Acquire) >= lsn || !vfs::durable::active() {
            return self.sync(lsn);
        }
        match self.me.upgrade() {
            Some(me) => vfs::durable::defer(|| me, lsn),
            None => self.sync(lsn),
        }
    }

    /// Write the whole state as a new checkpoint and restart the log.
    fn checkpoint_locked(&self, lw: &mut (LogPos, bool)) -> VfsResult<()> {
        if lw.1 {
            return Err(VfsError::Io);
        }
        // Data written so far becomes durable, so pending extents whose
        // write completed may be logged by the snapshot's callers later;
        // the snapshot itself holds logged extents only.
        self.devs.flush_all().map_err(|_| VfsError::Io)?;
        let (bytes, upto) = {
            let mut m = self.meta();
            let mut b = Vec::with_capacity(m.st.ckpt_bytes as usize + 4096);
            m.st.snapshot(&mut b);
            m.pending.clear();
            (b, m.lsn)
        };
        let epoch = lw.0.epoch + 1;
        if let Err(e) = journal::write_checkpoint(&self.devs, &self.sb, epoch, &bytes) {
            lw.1 = true;
            eprintln!("diskfs: checkpoint failed, metadata changes now fail: {e}");
            return Err(VfsError::Io);
        }
        lw.0 = LogPos { epoch, pos: 0, prev: 0 };
        self.durable.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// Make top-level directory `top` a tree of its own (a mount's root):
    /// it and everything below it are tagged, in one transaction.
    fn make_tree(&self, top: Ino) -> VfsResult<()> {
        let lsn = {
            let mut m = self.meta();
            let t = m.st.inodes.get(&top).ok_or(VfsError::Stale)?;
            if t.rec.tree == top {
                return Ok(());
            }
            if t.rec.tree != 0 || t.rec.ftype != FileType::Directory {
                return Err(VfsError::Inval);
            }
            let mut stack = vec![top];
            let mut seen = std::collections::HashSet::new();
            while let Some(x) = stack.pop() {
                if !seen.insert(x) {
                    continue;
                }
                let i = &m.st.inodes[&x];
                let children: Vec<Ino> = i.dir.as_ref().map(|d| d.by_cookie.values().map(|(_, c)| *c).collect()).unwrap_or_default();
                let mut rec = i.rec.clone();
                rec.tree = top;
                put(&mut m, Rec::InodePut(rec));
                stack.extend(children);
            }
            finish(&mut m)
        };
        self.sync(lsn)
    }

    /// Return freed blocks whose release is durable to the allocator, once
    /// no I/O that started before can touch them. Never waits: blocks whose
    /// grace period has not ended stay out until a later call (after the
    /// next metadata change, or when a data I/O exits).
    fn reclaim(&self) {
        self.reclaim_with(false)
    }

    /// `wait`: take the grace lock even when another thread holds it (it
    /// never waits for I/O while holding it). A data I/O leaving the gate
    /// waits, or a reclaim running meanwhile could have seen it still
    /// inside and left its blocks waiting with nobody to end the grace.
    fn reclaim_with(&self, wait: bool) {
        let mut g = match self.reclaiming.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if wait => lock(&self.reclaiming),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if !g.waiting.is_empty() {
            if !self.gate.drained(g.flip) {
                return;
            }
            self.free_blocks(std::mem::take(&mut g.waiting));
        }
        let durable = self.durable.load(Ordering::Acquire);
        let ready: Vec<Phys> = {
            let mut m = self.meta();
            if m.quarantine.is_empty() {
                self.grace_waiting.store(false, Ordering::Release);
                return;
            }
            let (ready, keep): (Vec<_>, Vec<_>) = m.quarantine.drain(..).partition(|(l, _)| *l <= durable);
            m.quarantine = keep;
            ready.into_iter().map(|(_, p)| p).collect()
        };
        if ready.is_empty() {
            self.grace_waiting.store(false, Ordering::Release);
            return;
        }
        g.flip = self.gate.flip();
        if self.gate.drained(g.flip) {
            self.free_blocks(ready);
            self.grace_waiting.store(false, Ordering::Release);
        } else {
            g.waiting = ready;
            self.grace_waiting.store(true, Ordering::Release);
        }
    }

    /// Blocks whose grace period ended go back to the allocator.
    fn free_blocks(&self, ps: Vec<Phys>) {
        let mut m = self.meta();
        for p in ps {
            m.alloc.free(p);
        }
    }

    /// A data I/O leaves the gate (never with the metadata lock held).
    fn gate_exit(&self, e: u64) {
        self.gate.exit(e);
        self.reclaim_if_waiting();
    }

    /// After a data I/O exits the gate: end a grace period it held up.
    fn reclaim_if_waiting(&self) {
        if self.grace_waiting.load(Ordering::Acquire) {
            self.reclaim_with(true);
        }
    }

    /// Flush data, then log the file's pending extents whose data is now
    /// durable and its attributes, and wait for that.
    fn commit_file(&self, fh: &FileHandle) -> VfsResult<()> {
        self.commit_check(fh)?;
        self.devs.flush_all().map_err(|_| VfsError::Io)?;
        let lsn = self.commit_log(fh)?;
        self.sync(lsn)
    }

    /// What COMMIT refuses before it flushes anything.
    fn commit_check(&self, fh: &FileHandle) -> VfsResult<()> {
        if self.meta().st.get(fh.ino, fh.generation)?.rec.ftype == FileType::Directory {
            return Err(VfsError::IsDir);
        }
        Ok(())
    }

    /// After a flush of every device: log the file's extents whose data it
    /// made durable, and its attributes; the transaction to wait for.
    fn commit_log(&self, fh: &FileHandle) -> VfsResult<u64> {
        let flushed = self.devs.flushed();
        let mut m = self.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        let rec = i.rec.clone();
        let ready: Vec<(u64, Phys)> =
            i.pending.iter().filter_map(|f| i.map.get(f).filter(|e| !e.logged && e.tag < flushed).map(|e| (*f, e.phys))).collect();
        for (fblock, phys, count) in meta::runs(ready.into_iter()) {
            put(&mut m, Rec::Map { ino: fh.ino, fblock, phys, count });
        }
        put(&mut m, Rec::InodePut(rec));
        Ok(finish(&mut m))
    }

    fn read_impl(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)> {
        loop {
            let e = self.gate.enter();
            let r = self.read_once(fh, offset, buf);
            self.gate_exit(e);
            match r? {
                Some(x) => return Ok(x),
                None => continue,
            }
        }
    }

    /// What a read of `len` bytes at `offset` returns: the byte count, end
    /// of file, the mapped blocks to read (holes read as zeros) and the
    /// file's unmap count, to tell afterwards whether blocks left it.
    fn plan_read(&self, fh: &FileHandle, offset: u64, len: usize) -> VfsResult<(usize, bool, Vec<(u64, Phys)>, u64)> {
        let m = self.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        regular(i)?;
        let size = i.rec.size;
        if offset >= size || len == 0 {
            return Ok((0, offset >= size, Vec::new(), i.unmaps));
        }
        let n = (len as u64).min(size - offset) as usize;
        let (b0, b1) = (offset / BLOCK, (offset + n as u64 - 1) / BLOCK);
        let plan: Vec<(u64, Phys)> = i.map.range(b0..=b1).filter(|(_, e)| e.logged || e.tag != u64::MAX).map(|(f, e)| (*f, e.phys)).collect();
        Ok((n, offset + n as u64 >= size, plan, i.unmaps))
    }

    /// One attempt; `None`: blocks left the file meanwhile, read again.
    fn read_once(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> VfsResult<Option<(usize, bool)>> {
        let (n, eof, plan, unmaps) = self.plan_read(fh, offset, buf.len())?;
        if n == 0 {
            return Ok(Some((0, eof)));
        }
        buf[..n].fill(0);
        let b0 = offset / BLOCK;
        let mut tmp = Vec::new();
        for (fblock, phys, count) in meta::runs(plan.into_iter()) {
            tmp.resize(count as usize * BLOCK as usize, 0);
            self.devs.read(meta::phys_dev(phys) as usize, meta::phys_lba(phys), &mut tmp).map_err(|_| VfsError::Io)?;
            // Copy the part of [fblock, fblock+count) inside [offset, offset+n).
            let run_start = fblock * BLOCK;
            let run_end = run_start + count as u64 * BLOCK;
            let lo = run_start.max(offset);
            let hi = run_end.min(offset + n as u64);
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(&tmp[(lo - run_start) as usize..(hi - run_start) as usize]);
            }
            let _ = b0;
        }
        let m = self.meta();
        match m.st.get(fh.ino, fh.generation) {
            Ok(i) if i.unmaps == unmaps => Ok(Some((n, eof))),
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write_impl(&self, fh: &FileHandle, offset: u64, data: &[u8], stable: Stability) -> VfsResult<(usize, Stability, Attr)> {
        let end = offset.checked_add(data.len() as u64).ok_or(VfsError::FileTooBig)?;
        if end > FILE_SIZE_MAX_BYTES {
            return Err(VfsError::FileTooBig);
        }
        let wlock = {
            let m = self.meta();
            let i = m.st.get(fh.ino, fh.generation)?;
            regular(i)?;
            i.wlock.clone()
        };
        let _w = wlock.lock(wlock::blocks(offset, end, BLOCK));
        if !data.is_empty() {
            let e = self.gate.enter();
            let r = self.write_blocks(fh, offset, data);
            self.gate_exit(e);
            r?;
        }
        if stable == Stability::Unstable {
            let m = self.meta();
            let i = m.st.get(fh.ino, fh.generation)?;
            return Ok((data.len(), Stability::Unstable, self.attr(i)));
        }
        self.commit_file(fh)?;
        let m = self.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        Ok((data.len(), Stability::FileSync, self.attr(i)))
    }

    /// Allocate what the write needs, write the blocks (read-modify-write
    /// at partial ends), then mark new blocks written.
    fn write_blocks(&self, fh: &FileHandle, offset: u64, data: &[u8]) -> VfsResult<()> {
        let plan = self.write_plan(fh, offset, data.len())?;
        self.write_exec(fh, offset, data, &plan)
    }

    /// The first half of a write, under the metadata lock: blocks for the
    /// holes it covers (reserved, mapped in memory only), the new size and
    /// times. The caller holds the file's write lock and the gate.
    fn write_plan(&self, fh: &FileHandle, offset: u64, len: usize) -> VfsResult<WritePlan> {
        let end = offset + len as u64;
        let (b0, b1) = (offset / BLOCK, (end - 1) / BLOCK);
        let mut m = self.meta();
        let m = &mut *m;
        let fresh = reserve_holes(m, fh, b0, b1)?;
        let missing: Vec<u64> = fresh.iter().map(|&(f, _)| f).collect();
        let i = m.st.get_mut(fh.ino, fh.generation)?;
        let plan = (b0..=b1)
            .map(|f| {
                let e = i.map[&f];
                let is_new = missing.binary_search(&f).is_ok();
                (f, e.phys, !is_new && (e.logged || e.tag != u64::MAX), is_new)
            })
            .collect();
        if end > i.rec.size {
            i.rec.size = end;
        }
        touch(&mut i.rec, now());
        Ok(plan)
    }

    /// Whether a planned write must read a block before writing it: a
    /// partial first or last block that already holds data.
    fn write_needs_read(offset: u64, end: u64, plan: &WritePlan) -> bool {
        plan.iter().any(|&(f, _, has, _)| has && (offset > f * BLOCK || end < (f + 1) * BLOCK))
    }

    /// The second half: write the planned blocks (read-modify-write at
    /// partial ends), then mark the new ones written.
    fn write_exec(&self, fh: &FileHandle, offset: u64, data: &[u8], plan: &WritePlan) -> VfsResult<()> {
        let end = offset + data.len() as u64;
        let mut buf: Vec<u8> = Vec::new();
        let mut k = 0;
        while k < plan.len() {
            // A run contiguous on one device.
            let mut j = k + 1;
            while j < plan.len() && plan[j].1 == plan[j - 1].1 + 1 && meta::phys_dev(plan[j].1) == meta::phys_dev(plan[k].1) {
                j += 1;
            }
            let run = &plan[k..j];
            let (dev, lba) = (meta::phys_dev(run[0].1) as usize, meta::phys_lba(run[0].1));
            buf.clear();
            buf.resize(run.len() * BLOCK as usize, 0);
            let run_start = run[0].0 * BLOCK;
            let run_end = run_start + run.len() as u64 * BLOCK;
            // Partial first / last block: keep what is there.
            for (idx, &(f, p, has, _)) in run.iter().enumerate() {
                let bs = f * BLOCK;
                let partial = offset > bs || end < bs + BLOCK;
                if partial && has {
                    let dst = &mut buf[idx * BLOCK as usize..(idx + 1) * BLOCK as usize];
                    self.devs.read(meta::phys_dev(p) as usize, meta::phys_lba(p), dst).map_err(|_| VfsError::Io)?;
                }
            }
            let lo = run_start.max(offset);
            let hi = run_end.min(end);
            buf[(lo - run_start) as usize..(hi - run_start) as usize].copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            self.devs.write(dev, lba, &buf).map_err(|_| VfsError::Io)?;
            k = j;
        }
        self.mark_written(fh, plan);
        Ok(())
    }

    /// A write's blocks are on the device: new ones are tagged with the
    /// flush count, so the next flush makes them loggable.
    fn mark_written(&self, fh: &FileHandle, plan: &WritePlan) {
        let tag = self.devs.write_tag();
        let mut m = self.meta();
        if let Ok(i) = m.st.get_mut(fh.ino, fh.generation) {
            for &(f, p, _, _) in plan {
                if let Some(e) = i.map.get_mut(&f) {
                    if e.phys == p && !e.logged && e.tag == u64::MAX {
                        e.tag = tag;
                    }
                }
            }
        }
    }

    /// An UNSTABLE write's answer once its blocks are written.
    fn unstable_written(&self, fh: &FileHandle, count: usize, fsid: u64) -> VfsResult<(usize, Stability, Attr)> {
        let m = self.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        Ok((count, Stability::Unstable, Attr { fsid, ..self.attr(i) }))
    }

    /// A stable write's answer once it is committed (FILE_SYNC, as
    /// `write_impl` answers every stable write).
    fn stable_written(&self, fh: &FileHandle, count: usize, fsid: u64) -> VfsResult<(usize, Stability, Attr)> {
        let m = self.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        Ok((count, Stability::FileSync, Attr { fsid, ..self.attr(i) }))
    }

    /// The answer of a write of `count` bytes whose blocks are written:
    /// UNSTABLE as it stands, or committed first.
    fn written(&self, fh: &FileHandle, count: usize, fsid: u64, stable: bool) -> VfsResult<(usize, Stability, Attr)> {
        if !stable {
            return self.unstable_written(fh, count, fsid);
        }
        self.commit_file(fh)?;
        self.stable_written(fh, count, fsid)
    }

    fn setattr_impl(&self, fh: &FileHandle, set: &SetAttr, guard: Option<Time>) -> VfsResult<Attr> {
        if let Some(mode) = set.mode {
            if mode & !0o7777 != 0 {
                return Err(VfsError::Inval);
            }
        }
        let wlock = {
            let m = self.meta();
            let i = m.st.get(fh.ino, fh.generation)?;
            if set.size.is_some() {
                regular(i)?;
            }
            i.wlock.clone()
        };
        let _w = set.size.map(|_| wlock.lock(wlock::WHOLE));
        if let Some(size) = set.size {
            if size > FILE_SIZE_MAX_BYTES {
                return Err(VfsError::FileTooBig);
            }
            // Shrinking to the middle of a mapped block: zero its tail on
            // the device first (durably), so a later extension reads zeros.
            let tail = {
                let m = self.meta();
                let i = m.st.get(fh.ino, fh.generation)?;
                if let Some(g) = guard {
                    if g != i.rec.ctime {
                        return Err(VfsError::NotSync);
                    }
                }
                let fb = size / BLOCK;
                (size < i.rec.size && size % BLOCK != 0).then(|| i.map.get(&fb).filter(|e| e.logged || e.tag != u64::MAX).map(|e| e.phys)).flatten()
            };
            if let Some(p) = tail {
                let e = self.gate.enter();
                let r = (|| {
                    let mut b = vec![0u8; BLOCK as usize];
                    let (d, l) = (meta::phys_dev(p) as usize, meta::phys_lba(p));
                    self.devs.read(d, l, &mut b)?;
                    b[(size % BLOCK) as usize..].fill(0);
                    self.devs.write(d, l, &b)?;
                    self.devs.flush_all()
                })();
                self.gate_exit(e);
                r.map_err(|_| VfsError::Io)?;
            }
        }
        let lsn = {
            let mut m = self.meta();
            let i = m.st.get(fh.ino, fh.generation)?;
            if let Some(g) = guard {
                if g != i.rec.ctime {
                    return Err(VfsError::NotSync);
                }
            }
            let mut rec = i.rec.clone();
            let t = now();
            if let Some(size) = set.size {
                if size != rec.size {
                    if size < rec.size {
                        let from = size.div_ceil(BLOCK);
                        if i.map.range(from..).next().is_some() {
                            put(&mut m, Rec::Trunc { ino: fh.ino, from });
                        }
                    }
                    rec.size = size;
                    rec.mtime = t;
                }
            }
            if let Some(mode) = set.mode {
                rec.mode = mode;
            }
            if let Some(uid) = set.uid {
                rec.uid = uid;
            }
            if let Some(gid) = set.gid {
                rec.gid = gid;
            }
            if let Some(a) = set_time(set.atime, t) {
                rec.atime = a;
            }
            if let Some(mt) = set_time(set.mtime, t) {
                rec.mtime = mt;
            }
            rec.ctime = t;
            rec.change += 1;
            put(&mut m, Rec::InodePut(rec));
            finish(&mut m)
        };
        self.durable(lsn)?;
        let m = self.meta();
        Ok(self.attr(m.st.get(fh.ino, fh.generation)?))
    }

    /// The file's write lock, after checking it is a live regular file.
    fn file_wlock(&self, fh: &FileHandle) -> VfsResult<Arc<wlock::WLock>> {
        let m = self.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        regular(i)?;
        Ok(i.wlock.clone())
    }

    /// fallocate mode 0 (NFSv4.2 ALLOCATE): holes in the range get blocks
    /// written with zeros, made durable, then mapped and logged with the
    /// new size. All or nothing on space.
    fn allocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        if len == 0 {
            return Err(VfsError::Inval);
        }
        let end = offset.checked_add(len).filter(|e| *e <= FILE_SIZE_MAX_BYTES).ok_or(VfsError::FileTooBig)?;
        let wlock = self.file_wlock(fh)?;
        let _w = wlock.lock(wlock::WHOLE);
        let (b0, b1) = (offset / BLOCK, (end - 1) / BLOCK);
        let fresh: Vec<(u64, Phys)> = {
            let mut m = self.meta();
            reserve_holes(&mut m, fh, b0, b1)?
        };
        let e = self.gate.enter();
        let r = (|| {
            let zeros = vec![0u8; dev::BUF_BLOCKS * BLOCK as usize];
            for (_, p, n) in meta::runs(fresh.iter().copied()) {
                let (d, mut lba) = (meta::phys_dev(p) as usize, meta::phys_lba(p));
                let mut left = n as usize;
                while left > 0 {
                    let k = left.min(dev::BUF_BLOCKS);
                    self.devs.write(d, lba, &zeros[..k * BLOCK as usize])?;
                    lba += k as u64;
                    left -= k;
                }
            }
            self.devs.flush_all()
        })();
        self.gate_exit(e);
        if r.is_err() {
            // Never logged: give the blocks back through the quarantine.
            let mut m = self.meta();
            let freed: Vec<Phys> = fresh.iter().map(|&(_, p)| p).collect();
            if let Ok(i) = m.st.get_mut(fh.ino, fh.generation) {
                for (f, _) in &fresh {
                    i.map.remove(f);
                    i.pending.remove(f);
                }
            }
            let next = m.lsn + 1;
            m.quarantine.extend(freed.into_iter().map(|p| (next, p)));
            return Err(VfsError::Io);
        }
        let lsn = {
            let mut m = self.meta();
            let i = m.st.get(fh.ino, fh.generation)?;
            let mut rec = i.rec.clone();
            if end > rec.size {
                rec.size = end;
            }
            let t = now();
            rec.ctime = t;
            rec.change += 1;
            for (fblock, phys, count) in meta::runs(fresh.iter().copied()) {
                put(&mut m, Rec::Map { ino: fh.ino, fblock, phys, count });
            }
            put(&mut m, Rec::InodePut(rec));
            finish(&mut m)
        };
        self.sync(lsn)?;
        let m = self.meta();
        Ok(self.attr(m.st.get(fh.ino, fh.generation)?))
    }

    /// fallocate PUNCH_HOLE | KEEP_SIZE (NFSv4.2 DEALLOCATE): whole blocks
    /// in the range are unmapped (their space returns), partial ones get
    /// zeros written; the size stays.
    fn deallocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        if len == 0 {
            return Err(VfsError::Inval);
        }
        let wlock = self.file_wlock(fh)?;
        let _w = wlock.lock(wlock::WHOLE);
        let size = self.meta().st.get(fh.ino, fh.generation)?.rec.size;
        let end = offset.saturating_add(len).min(size);
        if offset < end {
            // Partial blocks at the edges: zeros in place, as a write would.
            let first_whole = offset.div_ceil(BLOCK);
            let end_whole = end / BLOCK;
            let edges: Vec<(u64, u64)> = if first_whole > end_whole {
                // Inside one block.
                vec![(offset, end)]
            } else {
                let mut v = Vec::new();
                if offset % BLOCK != 0 {
                    v.push((offset, first_whole * BLOCK));
                }
                if end % BLOCK != 0 {
                    v.push((end_whole * BLOCK, end));
                }
                v
            };
            for (lo, hi) in edges {
                let mapped = self.meta().st.get(fh.ino, fh.generation)?.map.contains_key(&(lo / BLOCK));
                if mapped && hi > lo {
                    let e = self.gate.enter();
                    let r = self.write_blocks(fh, lo, &vec![0u8; (hi - lo) as usize]);
                    self.gate_exit(e);
                    r?;
                }
            }
            if end_whole > first_whole {
                let lsn = {
                    let mut m = self.meta();
                    let i = m.st.get(fh.ino, fh.generation)?;
                    let mut rec = i.rec.clone();
                    let t = now();
                    rec.mtime = t;
                    rec.ctime = t;
                    rec.change += 1;
                    put(&mut m, Rec::Punch { ino: fh.ino, from: first_whole, count: end_whole - first_whole });
                    put(&mut m, Rec::InodePut(rec));
                    finish(&mut m)
                };
                self.sync(lsn)?;
            }
            // Edge zeros durable like the rest of the call.
            self.commit_file(fh)?;
        }
        let m = self.meta();
        Ok(self.attr(m.st.get(fh.ino, fh.generation)?))
    }

    fn dir<'a>(&self, m: &'a Meta, fh: &FileHandle) -> VfsResult<&'a Inode> {
        let d = m.st.get(fh.ino, fh.generation)?;
        if d.dir.is_none() {
            return Err(VfsError::NotDir);
        }
        Ok(d)
    }

    fn entry(d: &Inode, name: &[u8]) -> Option<Ino> {
        d.dir.as_ref().and_then(|x| x.by_name.get(name)).map(|e| e.0)
    }

    /// Drop one link of a non-directory: free it when it was the last and
    /// nobody holds it open.
    fn drop_link(m: &mut Meta, ino: Ino, t: Time) {
        let i = &m.st.inodes[&ino];
        let mut rec = i.rec.clone();
        rec.nlink = rec.nlink.saturating_sub(1);
        if rec.nlink == 0 && i.pins == 0 {
            put(m, Rec::InodeFree { ino });
        } else {
            rec.ctime = t;
            rec.change += 1;
            put(m, Rec::InodePut(rec));
        }
    }

    fn next_cookie(d: &Inode) -> u64 {
        d.dir.as_ref().map_or(1, |x| x.cookie_next.max(1))
    }
}

impl Vfs for DiskFs {
    fn root(&self, export_id: ExportId) -> VfsResult<FileHandle> {
        if export_id != self.view.export_id {
            return Err(VfsError::Stale);
        }
        Ok(self.handle(self.view.root.0, self.view.root.1))
    }

    fn getattr(&self, fh: &FileHandle) -> VfsResult<Attr> {
        let s = &self.inner;
        self.check(fh)?;
        let m = s.meta();
        Ok(self.attr(m.st.get(fh.ino, fh.generation)?))
    }

    fn setattr(&self, fh: &FileHandle, set: &SetAttr, guard_ctime: Option<Time>) -> VfsResult<Attr> {
        self.check(fh)?;
        self.inner.setattr_impl(fh, set, guard_ctime).map(|a| self.fix(a))
    }

    fn lookup(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<(FileHandle, Attr)> {
        self.check(dir)?;
        check_name(name)?;
        let s = &self.inner;
        let m = s.meta();
        let d = s.dir(&m, dir)?;
        let ino = Inner::entry(d, name).ok_or(VfsError::NoEnt)?;
        let c = &m.st.inodes[&ino];
        Ok((self.handle(ino, c.rec.gen), self.attr(c)))
    }

    fn lookup_parent(&self, dir: &FileHandle) -> VfsResult<(FileHandle, Attr)> {
        self.check(dir)?;
        let s = &self.inner;
        let m = s.meta();
        let d = s.dir(&m, dir)?;
        if dir.ino == self.view.root.0 {
            // A mount's root is its own parent: ".." never leaves it.
            return Ok((self.handle(d.rec.ino, d.rec.gen), self.attr(d)));
        }
        let p = &m.st.inodes.get(&d.rec.parent).ok_or(VfsError::Stale)?;
        Ok((self.handle(p.rec.ino, p.rec.gen), self.attr(p)))
    }

    fn read(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)> {
        self.check(fh)?;
        self.inner.read_impl(fh, offset, buf)
    }

    fn write(&self, fh: &FileHandle, offset: u64, data: &[u8], stable: Stability) -> VfsResult<(usize, Stability, Attr)> {
        self.check(fh)?;
        self.inner.write_impl(fh, offset, data, stable).map(|(n, h, a)| (n, h, self.fix(a)))
    }

    fn commit(&self, fh: &FileHandle, _offset: u64, _count: u64) -> VfsResult<()> {
        self.check(fh)?;
        self.inner.commit_file(fh)
    }

    /// NFSv4.2 COPY inside the server: the bytes are copied (read and
    /// FILE_SYNC write through the log, 1 MiB at a time), never shared —
    /// diskfs has no reference-counted extents, so CLONE stays NOTSUPP.
    fn copy_range(&self, src: &FileHandle, src_offset: u64, dst: &FileHandle, dst_offset: u64, len: u64) -> VfsResult<u64> {
        self.check(src)?;
        self.check(dst)?;
        vfs::copy_by_chunks(self, src, src_offset, dst, dst_offset, len, COPY_CHUNK_BYTES)
    }

    fn read_start(&self, fh: &FileHandle, offset: u64, buf: &mut [u8], later: &mut dyn Later) -> VfsResult<Option<(usize, bool)>> {
        self.check(fh)?;
        if rpc::poller::available() {
            // On a core loop: plan here; holes and end of file answer at
            // once, device blocks are read on this core (`coreio`).
            let epoch = self.inner.gate.enter();
            let (n, eof, plan, unmaps) = match self.inner.plan_read(fh, offset, buf.len()) {
                Ok(x) => x,
                Err(e) => {
                    self.inner.gate_exit(epoch);
                    return Err(e);
                }
            };
            if plan.is_empty() {
                self.inner.gate_exit(epoch);
                buf[..n].fill(0);
                return Ok(Some((n, eof)));
            }
            let Some(done) = later.park() else {
                self.inner.gate_exit(epoch);
                return self.read(fh, offset, buf).map(Some);
            };
            let p = coreio::Planned { fh: *fh, offset, n, eof, plan, unmaps, epoch };
            if let Err((p, done)) = coreio::start(&self.inner, p, done) {
                self.inner.gate_exit(p.epoch);
                let (s, fh, len) = (self.inner.clone(), *fh, buf.len());
                self.inner.run(vfs::iopool::read_job(len, done, move |buf| s.read_impl(&fh, offset, buf)));
            }
            return Ok(None);
        }
        let Some(done) = later.park() else { return self.read(fh, offset, buf).map(Some) };
        let (s, fh, len) = (self.inner.clone(), *fh, buf.len());
        self.inner.run(vfs::iopool::read_job(len, done, move |buf| s.read_impl(&fh, offset, buf)));
        Ok(None)
    }

    fn write_start(&self, fh: &FileHandle, offset: u64, data: &[u8], stable: Stability, later: &mut dyn Later) -> VfsResult<Option<(usize, Stability, Attr)>> {
        self.check(fh)?;
        if rpc::poller::available() && !data.is_empty() {
            if let Some(r) = self.write_on_core(fh, offset, data, stable != Stability::Unstable, later) {
                return r;
            }
        }
        let Some(done) = later.park() else { return self.write(fh, offset, data, stable).map(Some) };
        let (s, fh, data, fsid) = (self.inner.clone(), *fh, data.to_vec(), self.view.export_id as u64);
        self.inner.run(Box::new(move || {
            let r = s.write_impl(&fh, offset, &data, stable).map(|(count, committed, attr)| IoDone::Write { count, committed, attr: Attr { fsid, ..attr } });
            done(r)
        }));
        Ok(None)
    }

    fn commit_start(&self, fh: &FileHandle, offset: u64, count: u64, later: &mut dyn Later) -> VfsResult<Option<()>> {
        self.check(fh)?;
        self.inner.commit_check(fh)?;
        let Some(done) = later.park() else { return self.commit(fh, offset, count).map(Some) };
        // On a core loop: the devices are flushed through this core's own
        // queues, then the log flush runs on a worker (`coreio`).
        let done = match coreio::start_commit(&self.inner, *fh, None, done) {
            Ok(()) => return Ok(None),
            Err(done) => done,
        };
        let (s, fh) = (self.inner.clone(), *fh);
        self.inner.run(Box::new(move || done(s.commit_file(&fh).map(|()| IoDone::Commit))));
        Ok(None)
    }

    fn write_verifier(&self) -> [u8; 8] {
        self.inner.verifier
    }

    fn create(&self, dir: &FileHandle, name: &[u8], kind: NodeKind<'_>, mode: u32, cred: &Cred<'_>, how: CreateMode) -> VfsResult<(FileHandle, Attr)> {
        self.check(dir)?;
        check_name(name)?;
        if mode & !0o7777 != 0 {
            return Err(VfsError::Inval);
        }
        let (ftype, rdev, target): (FileType, (u32, u32), &[u8]) = match kind {
            NodeKind::File => (FileType::Regular, (0, 0), &[]),
            NodeKind::Directory => (FileType::Directory, (0, 0), &[]),
            NodeKind::Symlink { target } => {
                if target.is_empty() || target.contains(&0) {
                    return Err(VfsError::Inval);
                }
                if target.len() > SYMLINK_TARGET_MAX_BYTES {
                    return Err(VfsError::NameTooLong);
                }
                (FileType::Symlink, (0, 0), target)
            }
            NodeKind::Device { ftype, rdev } => match ftype {
                FileType::BlockDevice | FileType::CharDevice => (ftype, rdev, &[]),
                FileType::Socket | FileType::Fifo => (ftype, (0, 0), &[]),
                _ => return Err(VfsError::Inval),
            },
        };
        let s = &self.inner;
        let (fh, lsn) = {
            let mut m = s.meta();
            let d = s.dir(&m, dir)?;
            if let Some(ino) = Inner::entry(d, name) {
                let c = &m.st.inodes[&ino];
                if c.rec.ftype != FileType::Regular || ftype != FileType::Regular {
                    return Err(VfsError::Exist);
                }
                match how {
                    CreateMode::Unchecked => {}
                    CreateMode::Guarded => return Err(VfsError::Exist),
                    CreateMode::Exclusive(v) => {
                        if c.rec.verf == [0; 8] {
                            return Err(VfsError::Exist);
                        }
                        if c.rec.verf != v {
                            return Err(VfsError::ExistVerifierMismatch);
                        }
                    }
                }
                return Ok((self.handle(ino, c.rec.gen), self.attr(c)));
            }
            if ftype == FileType::Directory && d.rec.nlink >= LINK_MAX {
                return Err(VfsError::TooManyLinks);
            }
            s.ckpt_room(&m)?;
            let t = now();
            let (ino, gen) = (m.st.ino_next, m.st.gen_next);
            let mut drec = d.rec.clone();
            let cookie = Inner::next_cookie(d);
            let rec = InodeRec {
                ino,
                gen,
                ftype,
                mode,
                nlink: if ftype == FileType::Directory { 2 } else { 1 },
                uid: cred.uid,
                gid: cred.gid,
                size: 0,
                rdev,
                atime: t,
                mtime: t,
                ctime: t,
                change: 1,
                volume: drec.volume,
                quota: 0,
                parent: if ftype == FileType::Directory { dir.ino } else { 0 },
                tree: tree_under(&drec, ftype, ino),
                verf: match how {
                    CreateMode::Exclusive(v) => v,
                    _ => [0; 8],
                },
                target: target.to_vec(),
            };
            if ftype == FileType::Directory {
                drec.nlink += 1;
            }
            touch(&mut drec, t);
            put(&mut m, Rec::InodePut(rec));
            put(&mut m, Rec::DirAdd { dir: dir.ino, cookie, ino, name: name.to_vec() });
            put(&mut m, Rec::InodePut(drec));
            (self.handle(ino, gen), finish(&mut m))
        };
        s.durable(lsn)?;
        let m = s.meta();
        let a = self.attr(m.st.get(fh.ino, fh.generation)?);
        Ok((fh, a))
    }

    fn remove(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        self.check(dir)?;
        check_name(name)?;
        let s = &self.inner;
        let lsn = {
            let mut m = s.meta();
            let d = s.dir(&m, dir)?;
            let ino = Inner::entry(d, name).ok_or(VfsError::NoEnt)?;
            if m.st.inodes[&ino].rec.ftype == FileType::Directory {
                return Err(VfsError::IsDir);
            }
            let mut drec = d.rec.clone();
            let t = now();
            touch(&mut drec, t);
            put(&mut m, Rec::DirDel { dir: dir.ino, name: name.to_vec() });
            put(&mut m, Rec::InodePut(drec));
            Inner::drop_link(&mut m, ino, t);
            finish(&mut m)
        };
        s.durable(lsn)
    }

    fn rmdir(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        self.check(dir)?;
        check_name(name)?;
        let s = &self.inner;
        let lsn = {
            let mut m = s.meta();
            let d = s.dir(&m, dir)?;
            let ino = Inner::entry(d, name).ok_or(VfsError::NoEnt)?;
            let c = &m.st.inodes[&ino];
            let Some(cd) = &c.dir else { return Err(VfsError::NotDir) };
            if !cd.by_name.is_empty() {
                return Err(VfsError::NotEmpty);
            }
            let mut drec = d.rec.clone();
            drec.nlink -= 1;
            touch(&mut drec, now());
            put(&mut m, Rec::DirDel { dir: dir.ino, name: name.to_vec() });
            put(&mut m, Rec::InodeFree { ino });
            put(&mut m, Rec::InodePut(drec));
            finish(&mut m)
        };
        s.durable(lsn)
    }

    fn rename(&self, from_dir: &FileHandle, from_name: &[u8], to_dir: &FileHandle, to_name: &[u8]) -> VfsResult<()> {
        self.check(from_dir)?;
        self.check(to_dir)?;
        check_name(from_name)?;
        check_name(to_name)?;
        let s = &self.inner;
        let lsn = {
            let mut m = s.meta();
            let fd = s.dir(&m, from_dir)?;
            let td = s.dir(&m, to_dir)?;
            let src = Inner::entry(fd, from_name).ok_or(VfsError::NoEnt)?;
            if from_dir.ino == to_dir.ino && from_name == to_name {
                return Ok(());
            }
            if src == to_dir.ino {
                return Err(VfsError::Inval);
            }
            let sr = m.st.inodes[&src].rec.clone();
            let src_is_dir = sr.ftype == FileType::Directory;
            if src_is_dir {
                // Not into its own subtree.
                let mut p = to_dir.ino;
                loop {
                    if p == src {
                        return Err(VfsError::Inval);
                    }
                    let pp = m.st.inodes.get(&p).map_or(meta::ROOT_INO, |i| i.rec.parent);
                    if pp == p || p == meta::ROOT_INO {
                        break;
                    }
                    p = pp;
                }
            }
            if tree_under(&td.rec, sr.ftype, src) != sr.tree {
                // Another mount's tree (or out of one into the root).
                return Err(VfsError::CrossDevice);
            }
            let outer = if sr.quota > 0 { 0 } else { sr.volume };
            if outer != td.rec.volume {
                return Err(VfsError::CrossDevice);
            }
            let tgt = Inner::entry(td, to_name);
            if let Some(t) = tgt {
                if t == src {
                    return Ok(());
                }
                if t == from_dir.ino {
                    return Err(if src_is_dir { VfsError::NotEmpty } else { VfsError::IsDir });
                }
                let ti = &m.st.inodes[&t];
                let tdir = ti.rec.ftype == FileType::Directory;
                match (src_is_dir, tdir) {
                    (true, false) => return Err(VfsError::NotDir),
                    (false, true) => return Err(VfsError::IsDir),
                    (true, true) if !ti.dir.as_ref().is_some_and(|x| x.by_name.is_empty()) => return Err(VfsError::NotEmpty),
                    _ => {}
                }
            }
            let across = src_is_dir && from_dir.ino != to_dir.ino;
            if across && tgt.is_none() && td.rec.nlink >= LINK_MAX {
                return Err(VfsError::TooManyLinks);
            }
            let t = now();
            put(&mut m, Rec::DirDel { dir: from_dir.ino, name: from_name.to_vec() });
            if let Some(tino) = tgt {
                put(&mut m, Rec::DirDel { dir: to_dir.ino, name: to_name.to_vec() });
                if m.st.inodes[&tino].rec.ftype == FileType::Directory {
                    put(&mut m, Rec::InodeFree { ino: tino });
                    let mut tr = m.st.inodes[&to_dir.ino].rec.clone();
                    tr.nlink -= 1;
                    put(&mut m, Rec::InodePut(tr));
                } else {
                    Inner::drop_link(&mut m, tino, t);
                }
            }
            let cookie = Inner::next_cookie(&m.st.inodes[&to_dir.ino]);
            put(&mut m, Rec::DirAdd { dir: to_dir.ino, cookie, ino: src, name: to_name.to_vec() });
            let mut sr = m.st.inodes[&src].rec.clone();
            if src_is_dir {
                sr.parent = to_dir.ino;
            }
            sr.ctime = t;
            sr.change += 1;
            put(&mut m, Rec::InodePut(sr));
            let mut fr = m.st.inodes[&from_dir.ino].rec.clone();
            if across {
                fr.nlink -= 1;
            }
            touch(&mut fr, t);
            put(&mut m, Rec::InodePut(fr));
            if from_dir.ino != to_dir.ino {
                let mut tr = m.st.inodes[&to_dir.ino].rec.clone();
                if across {
                    tr.nlink += 1;
                }
                touch(&mut tr, t);
                put(&mut m, Rec::InodePut(tr));
            }
            finish(&mut m)
        };
        s.durable(lsn)
    }

    fn link(&self, fh: &FileHandle, dir: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        self.check(dir)?;
        check_name(name)?;
        let s = &self.inner;
        self.check(fh)?;
        let lsn = {
            let mut m = s.meta();
            let d = s.dir(&m, dir)?;
            let c = m.st.get(fh.ino, fh.generation)?;
            if c.rec.ftype == FileType::Directory {
                return Err(VfsError::IsDir);
            }
            if c.rec.nlink == 0 {
                return Err(VfsError::NoEnt);
            }
            if c.rec.nlink >= LINK_MAX {
                return Err(VfsError::TooManyLinks);
            }
            if c.rec.volume != d.rec.volume || tree_under(&d.rec, c.rec.ftype, c.rec.ino) != c.rec.tree {
                return Err(VfsError::CrossDevice);
            }
            if Inner::entry(d, name).is_some() {
                return Err(VfsError::Exist);
            }
            s.ckpt_room(&m)?;
            let t = now();
            let cookie = Inner::next_cookie(d);
            let mut drec = d.rec.clone();
            touch(&mut drec, t);
            let mut crec = c.rec.clone();
            crec.nlink += 1;
            crec.ctime = t;
            crec.change += 1;
            put(&mut m, Rec::DirAdd { dir: dir.ino, cookie, ino: fh.ino, name: name.to_vec() });
            put(&mut m, Rec::InodePut(crec));
            put(&mut m, Rec::InodePut(drec));
            finish(&mut m)
        };
        s.durable(lsn)?;
        self.getattr(fh)
    }

    fn readlink(&self, fh: &FileHandle) -> VfsResult<Vec<u8>> {
        let s = &self.inner;
        self.check(fh)?;
        let m = s.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        if i.rec.ftype != FileType::Symlink {
            return Err(VfsError::Inval);
        }
        Ok(i.rec.target.clone())
    }

    fn readdir(&self, dir: &FileHandle, cookie: u64, visit: &mut dyn FnMut(DirEntry<'_>) -> bool) -> VfsResult<bool> {
        self.check(dir)?;
        let s = &self.inner;
        let mut after = cookie;
        loop {
            let batch: Vec<(u64, Vec<u8>, FileHandle, Attr)> = {
                let m = s.meta();
                let d = s.dir(&m, dir)?;
                let dd = d.dir.as_ref().expect("checked a directory");
                dd.by_cookie
                    .range(after.saturating_add(1)..)
                    .take(64)
                    .filter_map(|(c, (name, ino))| m.st.inodes.get(ino).map(|i| (*c, name.clone(), self.handle(*ino, i.rec.gen), self.attr(i))))
                    .collect()
            };
            if batch.is_empty() {
                return Ok(true);
            }
            for (c, name, fh, attr) in &batch {
                if !visit(DirEntry { cookie: *c, name, fh: *fh, attr: *attr }) {
                    return Ok(false);
                }
                after = *c;
            }
        }
    }

    fn cookie_verifier(&self, dir: &FileHandle) -> VfsResult<[u8; 8]> {
        self.check(dir)?;
        let s = &self.inner;
        let m = s.meta();
        let d = s.dir(&m, dir)?;
        Ok(d.rec.gen.to_be_bytes())
    }

    fn fsstat(&self, fh: &FileHandle) -> VfsResult<FsStat> {
        let s = &self.inner;
        self.check(fh)?;
        let m = s.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        let free = m.alloc.free_blocks() * BLOCK;
        let (total, free) = match i.rec.volume {
            0 => (m.alloc.total_blocks() * BLOCK, free),
            v => {
                let cap = m.st.inodes.get(&v).map_or(0, |r| r.rec.quota);
                let used = m.st.vol_used.get(&v).copied().unwrap_or(0);
                (cap, cap.saturating_sub(used).min(free))
            }
        };
        let files_total = s.sb.ckpt_blocks * format::PAYLOAD_BYTES as u64 * CKPT_FILL_MAX_PCT / 100 / 160;
        let files_free = files_total.saturating_sub(m.st.inodes.len() as u64);
        Ok(FsStat { total_bytes: total, free_bytes: free, avail_bytes: free, total_files: files_total, free_files: files_free, avail_files: files_free })
    }

    fn set_quota(&self, dir: &FileHandle, capacity_bytes: u64) -> VfsResult<()> {
        self.check(dir)?;
        let s = &self.inner;
        let lsn = {
            let mut m = s.meta();
            let d = s.dir(&m, dir)?;
            if capacity_bytes == 0 {
                return Err(VfsError::Inval);
            }
            let mut rec = d.rec.clone();
            if rec.quota > 0 {
                let used = m.st.vol_used.get(&dir.ino).copied().unwrap_or(0);
                if capacity_bytes < used {
                    return Err(VfsError::Inval);
                }
            } else {
                if rec.volume != 0 {
                    return Err(VfsError::Inval);
                }
                if !d.dir.as_ref().is_some_and(|x| x.by_name.is_empty()) {
                    return Err(VfsError::NotEmpty);
                }
                rec.volume = dir.ino;
            }
            rec.quota = capacity_bytes;
            rec.ctime = now();
            rec.change += 1;
            put(&mut m, Rec::InodePut(rec));
            finish(&mut m)
        };
        s.sync(lsn)
    }

    fn quota(&self, fh: &FileHandle) -> VfsResult<Option<QuotaUsage>> {
        let s = &self.inner;
        self.check(fh)?;
        let m = s.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        Ok(match i.rec.volume {
            0 => None,
            v => Some(QuotaUsage {
                capacity_bytes: m.st.inodes.get(&v).map_or(0, |r| r.rec.quota),
                used_bytes: m.st.vol_used.get(&v).copied().unwrap_or(0),
            }),
        })
    }

    /// `check` and the lookup under one metadata lock: this runs on every
    /// call into a mount with volume access rules.
    fn volume_of(&self, fh: &FileHandle) -> VfsResult<Option<Ino>> {
        if fh.export_id != self.view.export_id {
            return Err(VfsError::Stale);
        }
        let m = self.inner.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        if self.view.tree != 0 && i.rec.tree != self.view.tree {
            return Err(VfsError::Stale);
        }
        Ok((i.rec.volume != 0).then_some(i.rec.volume))
    }

    fn remove_tree(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        self.check(dir)?;
        check_name(name)?;
        let s = &self.inner;
        let lsn = {
            let mut m = s.meta();
            let d = s.dir(&m, dir)?;
            let top = Inner::entry(d, name).ok_or(VfsError::NoEnt)?;
            if m.st.inodes[&top].rec.ftype != FileType::Directory {
                return Err(VfsError::NotDir);
            }
            let t = now();
            let mut drec = d.rec.clone();
            drec.nlink -= 1;
            touch(&mut drec, t);
            put(&mut m, Rec::DirDel { dir: dir.ino, name: name.to_vec() });
            put(&mut m, Rec::InodePut(drec));
            let mut stack = vec![top];
            while let Some(x) = stack.pop() {
                let entries: Vec<(Vec<u8>, Ino)> =
                    m.st.inodes[&x].dir.as_ref().map(|dd| dd.by_cookie.values().cloned().collect()).unwrap_or_default();
                let mut subdirs = Vec::new();
                for (n, c) in entries {
                    put(&mut m, Rec::DirDel { dir: x, name: n });
                    if m.st.inodes[&c].rec.ftype == FileType::Directory {
                        subdirs.push(c);
                    } else {
                        Inner::drop_link(&mut m, c, t);
                    }
                }
                if subdirs.is_empty() {
                    put(&mut m, Rec::InodeFree { ino: x });
                } else {
                    // Free x after its subdirectories: push it back below them.
                    stack.push(x);
                    // Mark: its entries are gone now, so the next visit frees it.
                    stack.extend(subdirs);
                }
            }
            finish(&mut m)
        };
        s.sync(lsn)
    }

    fn pin(&self, fh: &FileHandle) -> VfsResult<()> {
        let s = &self.inner;
        self.check(fh)?;
        let mut m = s.meta();
        let i = m.st.get_mut(fh.ino, fh.generation)?;
        if i.rec.ftype == FileType::Directory {
            return Err(VfsError::IsDir);
        }
        i.pins = i.pins.checked_add(1).ok_or(VfsError::Inval)?;
        Ok(())
    }

    fn client_records(&self) -> Option<Vec<Vec<u8>>> {
        Some(self.inner.meta().st.clients.iter().cloned().collect())
    }

    fn seek(&self, fh: &FileHandle, offset: u64, what: vfs::Content) -> VfsResult<Option<(bool, u64)>> {
        self.check(fh)?;
        let m = self.inner.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        regular(i)?;
        let size = i.rec.size;
        if offset >= size {
            return Ok(None);
        }
        let fb = offset / BLOCK;
        let pos = match what {
            vfs::Content::Data => match i.map.range(fb..).next() {
                Some((f, _)) => (*f * BLOCK).max(offset),
                None => size,
            },
            vfs::Content::Hole => {
                let mut f = fb;
                while i.map.contains_key(&f) {
                    f += 1;
                }
                (f * BLOCK).max(offset)
            }
        };
        Ok(Some(if pos >= size { (true, size) } else { (false, pos) }))
    }

    fn allocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        self.check(fh)?;
        self.inner.allocate(fh, offset, len).map(|a| self.fix(a))
    }

    fn deallocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        self.check(fh)?;
        self.inner.deallocate(fh, offset, len).map(|a| self.fix(a))
    }

    fn record_client(&self, owner: &[u8], present: bool) {
        if owner.is_empty() || owner.len() > meta::CLIENT_OWNER_MAX {
            return;
        }
        let s = &self.inner;
        let lsn = {
            let mut m = s.meta();
            if m.st.clients.contains(owner) == present {
                return;
            }
            put(&mut m, Rec::Client { owner: owner.to_vec(), present });
            finish(&mut m)
        };
        if s.durable(lsn).is_err() {
            eprintln!("diskfs: an NFSv4 client record did not reach the log (log device failing)");
        }
    }

    fn private_get(&self, fh: &FileHandle) -> VfsResult<Option<Vec<u8>>> {
        self.check(fh)?;
        let m = self.inner.meta();
        let i = m.st.get(fh.ino, fh.generation)?;
        Ok((!i.private.is_empty()).then(|| i.private.clone()))
    }

    /// Logged as one `Private` record; durable before it returns.
    fn private_set(&self, fh: &FileHandle, data: Option<&[u8]>) -> VfsResult<()> {
        let data = data.unwrap_or_default();
        if data.len() > vfs::PRIVATE_BYTES_MAX {
            return Err(VfsError::Inval);
        }
        self.check(fh)?;
        let s = &self.inner;
        let lsn = {
            let mut m = s.meta();
            let i = m.st.get(fh.ino, fh.generation)?;
            if i.private == data {
                return Ok(());
            }
            if data.len() > i.private.len() {
                s.ckpt_room(&m)?;
            }
            put(&mut m, Rec::Private { ino: fh.ino, data: data.to_vec() });
            finish(&mut m)
        };
        s.durable(lsn)
    }

    fn unpin(&self, fh: &FileHandle) {
        if self.check(fh).is_err() {
            return;
        }
        let s = &self.inner;
        let lsn = {
            let mut m = s.meta();
            let Ok(i) = m.st.get_mut(fh.ino, fh.generation) else { return };
            if i.pins == 0 {
                return;
            }
            i.pins -= 1;
            if i.pins > 0 || i.rec.nlink > 0 {
                return;
            }
            put(&mut m, Rec::InodeFree { ino: fh.ino });
            finish(&mut m)
        };
        if s.durable(lsn).is_err() {
            eprintln!("diskfs: releasing an unlinked file failed to reach the log; recovery frees it at the next start");
        }
    }
}

impl DiskFs {
    /// An UNSTABLE WRITE on a core loop: planned here under the file's
    /// write lock (taken without waiting) and the gate, its blocks written
    /// through the core's own device queues (`coreio`); the lock and the
    /// gate are released when the last block is back. `None`: the file's
    /// lock is busy, so the write goes the worker's way (which waits).
    fn write_on_core(&self, fh: &FileHandle, offset: u64, data: &[u8], stable: bool, later: &mut dyn Later) -> Option<VfsResult<Option<(usize, Stability, Attr)>>> {
        let end = match offset.checked_add(data.len() as u64) {
            Some(e) if e <= FILE_SIZE_MAX_BYTES => e,
            _ => return Some(Err(VfsError::FileTooBig)),
        };
        let wlock = match self.inner.file_wlock(fh) {
            Ok(l) => l,
            Err(e) => return Some(Err(e)),
        };
        let range = wlock::blocks(offset, end, BLOCK);
        if !wlock.try_lock(range) {
            return None;
        }
        let inner = &self.inner;
        let epoch = inner.gate.enter();
        let release = |inner: &Inner| {
            wlock.unlock(range);
            inner.gate_exit(epoch);
        };
        let plan = match inner.write_plan(fh, offset, data.len()) {
            Ok(p) => p,
            Err(e) => {
                release(inner);
                return Some(Err(e));
            }
        };
        let fsid = self.view.export_id as u64;
        let Some(done) = later.park() else {
            let r = inner.write_exec(fh, offset, data, &plan);
            inner.gate_exit(epoch);
            let r = r.and_then(|()| inner.written(fh, data.len(), fsid, stable));
            wlock.unlock(range);
            return Some(r.map(Some));
        };
        let w = coreio::PlannedWrite { fh: *fh, offset, end, plan, epoch, wlock: wlock.clone(), fsid, stable };
        if Inner::write_needs_read(offset, end, &w.plan) {
            Self::write_on_worker(inner, w, data.to_vec(), done);
            return Some(Ok(None));
        }
        if let Err((w, done)) = coreio::start_write(inner, w, data, done) {
            Self::write_on_worker(inner, w, data.to_vec(), done);
        }
        Some(Ok(None))
    }

    /// Finish a planned write on a worker (it must read blocks first, or
    /// the core has no room): then release its lock and the gate.
    fn write_on_worker(inner: &Arc<Inner>, w: coreio::PlannedWrite, data: Vec<u8>, done: Done) {
        let s = inner.clone();
        inner.run(Box::new(move || {
            let r = s.write_exec(&w.fh, w.offset, &data, &w.plan);
            s.gate_exit(w.epoch);
            let r = r.and_then(|()| s.written(&w.fh, data.len(), w.fsid, w.stable)).map(write_done);
            w.wlock.unlock(w.range());
            done(r)
        }));
    }
}
