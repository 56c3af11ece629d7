//! pNFS flex-files (RFC 8435) on the metadata server: data-server
//! membership and health, placement of each regular file's data files,
//! layout state, and I/O through the MDS for clients without a layout.
//!
//! - `Pnfs` implements `nfs4::layout::LayoutServer` (LAYOUTGET & co.).
//! - `PnfsVfs` wraps the MDS's `Vfs`: READ/WRITE/COMMIT of a placed file go
//!   to its data files on the DSes; truncation resizes them; removal queues
//!   their removal. Everything else is the wrapped backend's.
//! - `client3` is the blocking NFSv3 client the MDS uses towards DSes.
//!
//! Locking: one mutex (`State`) over the tables; it is never held across a
//! network call (DS connections have their own mutexes, taken after).
//! Placement of a new file is serialised by `place_lock`.

pub mod client3;
mod layouts;
mod mdsio;
mod orphans;
mod persist;
mod registry;
mod resync;

pub use mdsio::PnfsVfs;
pub use registry::{DsSpec, DsState, Netid};

/// Workers for proxied data-server I/O: each waits on at most one data
/// server at a time (see `vfs::iopool`).
pub const IO_THREADS: usize = 4;

use client3::{CtlError, Sattr};
use nfs4::layout::DeviceId;
use nfs4::state::Stateid;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};
use vfs::{FileHandle, Vfs};

/// Most data servers (config, admin API) — CONFIG.md.
pub const DATA_SERVERS_MAX: usize = 1024;
/// Most DS records ever kept (ids are never reused; removed DSes stay
/// known so clients holding their device ids still get GETDEVICEINFO).
pub const DS_RECORDS_MAX: usize = 4 * DATA_SERVERS_MAX;
pub const MIRRORS_MAX: u32 = 3;
/// Mode of data files: only the owner (the synthetic uid) and root.
pub const DATA_FILE_MODE: u32 = 0o600;
/// layouttype4 LAYOUT4_FLEX_FILES.
pub const LAYOUT4_FLEX_FILES: u32 = 4;

/// Configuration of the pNFS MDS (chimerad's `server.pnfs`). Limits are
/// asserted by `check`.
#[derive(Debug, Clone)]
pub struct PnfsConfig {
    pub stripe_unit_bytes: u64,
    /// DSes one file stripes over; 0 = all active ones.
    pub stripe_width: u32,
    pub mirrors: u32,
    pub synthetic_uid: u32,
    pub synthetic_gid: u32,
    pub layouts_per_client_max: usize,
    pub layouts_max: usize,
    pub ds_timeout_ms: u64,
    pub remove_queue_max: usize,
    /// How long a DS reported unreachable stays out before a probe may
    /// bring it back.
    pub ds_recheck_ms: u64,
    /// rsize/wsize advertised for DS I/O (ffdv_rsize/ffdv_wsize).
    pub ds_io_bytes_max: u32,
    /// How long a client may keep a recalled layout before the MDS revokes
    /// it (fences the file): a client that never answers its recall must
    /// not hold a drain (or a resync) for ever.
    pub recall_timeout_ms: u64,
    /// How often the data servers' data directories are swept for data
    /// files whose MDS file is gone (`orphans`); 0 turns the sweep off.
    pub orphan_sweep_interval_ms: u64,
}

impl Default for PnfsConfig {
    fn default() -> Self {
        PnfsConfig {
            stripe_unit_bytes: 1 << 20,
            stripe_width: 0,
            mirrors: 1,
            synthetic_uid: 1_000_000,
            synthetic_gid: 1_000_000,
            layouts_per_client_max: 4096,
            layouts_max: 262_144,
            ds_timeout_ms: 3000,
            remove_queue_max: 65_536,
            ds_recheck_ms: 30_000,
            ds_io_bytes_max: 1 << 20,
            recall_timeout_ms: 60_000,
            orphan_sweep_interval_ms: 3_600_000,
        }
    }
}

impl PnfsConfig {
    pub fn check(&self) -> Result<(), String> {
        let range = |name: &str, v: u64, min: u64, max: u64| {
            if v < min || v > max {
                return Err(format!("pnfs config: {name} = {v} is outside {min}..={max}"));
            }
            Ok(())
        };
        range("stripe_unit_bytes", self.stripe_unit_bytes, 4096, 64 << 20)?;
        if !self.stripe_unit_bytes.is_power_of_two() {
            return Err(format!("pnfs config: stripe_unit_bytes = {} is not a power of two", self.stripe_unit_bytes));
        }
        range("stripe_width", self.stripe_width.into(), 0, DATA_SERVERS_MAX as u64)?;
        range("mirrors", self.mirrors.into(), 1, MIRRORS_MAX.into())?;
        range("synthetic_uid", self.synthetic_uid.into(), 1, i32::MAX as u64)?;
        range("synthetic_gid", self.synthetic_gid.into(), 1, i32::MAX as u64)?;
        range("layouts_per_client_max", self.layouts_per_client_max as u64, 1, 1 << 20)?;
        range("layouts_max", self.layouts_max as u64, 1, 1 << 24)?;
        range("ds_timeout_ms", self.ds_timeout_ms, 100, 60_000)?;
        range("remove_queue_max", self.remove_queue_max as u64, 1, 1 << 20)?;
        range("ds_io_bytes_max", self.ds_io_bytes_max.into(), 4096, 1 << 20)?;
        range("recall_timeout_ms", self.recall_timeout_ms, 1000, 600_000)?;
        if self.orphan_sweep_interval_ms != 0 {
            range("orphan_sweep_interval_ms", self.orphan_sweep_interval_ms, 1000, 7 * 86_400_000)?;
        }
        Ok(())
    }
}

/// A recall's outcome as queued: layout key, client, file, end, and whether
/// the recall revokes (fences) when it fails.
pub(crate) type RecallEndEntry = (u32, u64, FileHandle, RecallEnd, bool);

/// How a CB_LAYOUTRECALL ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecallEnd {
    /// The client will LAYOUTRETURN what was recalled.
    Accepted,
    /// NFS4ERR_NOMATCHING_LAYOUT: the client holds none of it; the server
    /// treats the layout as returned (RFC 8881 §20.3.4).
    NoMatchingLayout,
    /// Refused with another error, or never answered (timeouts, no back
    /// channel any more).
    Failed(String),
}

/// Sends CB_LAYOUTRECALL (implemented over `nfs4::callback::Callbacks` by
/// chimerad's wiring; tests use their own). Never blocks; `on_done` runs
/// once with the outcome when the recall was sent (Ok), on whichever
/// thread sees it — it only queues it.
pub trait LayoutRecaller: Send + Sync {
    fn recall_file(&self, clientid: u64, fh: &FileHandle, stateid: &Stateid, on_done: Box<dyn FnOnce(RecallEnd) + Send>) -> Result<(), String>;
}

impl LayoutRecaller for nfs4::callback::Callbacks {
    fn recall_file(&self, clientid: u64, fh: &FileHandle, stateid: &Stateid, on_done: Box<dyn FnOnce(RecallEnd) + Send>) -> Result<(), String> {
        let r = nfs4::callback::LayoutRecall {
            layout_type: LAYOUT4_FLEX_FILES,
            iomode: 3,
            changed: true,
            kind: nfs4::callback::RecallKind::File { fh: *fh, stateid: *stateid, offset: 0, length: u64::MAX },
        };
        let done = Box::new(move |_t: nfs4::callback::RecallTicket, res: nfs4::callback::RecallResult| {
            on_done(match res {
                Ok(nfs4::callback::RecallOutcome::Accepted) => RecallEnd::Accepted,
                Ok(nfs4::callback::RecallOutcome::NoMatchingLayout) => RecallEnd::NoMatchingLayout,
                Err(e) => RecallEnd::Failed(format!("{e:?}")),
            })
        });
        self.layout_recall_notify(clientid, r, done).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Counters exported on /metrics.
#[derive(Default)]
pub struct Metrics {
    pub layouts_granted_read: AtomicU64,
    pub layouts_granted_rw: AtomicU64,
    pub layouts_returned: AtomicU64,
    pub layouts_recalled: AtomicU64,
    pub layoutget_trylater: AtomicU64,
    pub layoutget_unavailable: AtomicU64,
    pub layoutget_bad_stateid: AtomicU64,
    pub layoutcommits: AtomicU64,
    pub layoutstats: AtomicU64,
    pub layouterrors: AtomicU64,
    pub fences: AtomicU64,
    /// Recalled layouts not returned in time, revoked by fencing their file.
    pub layouts_revoked: AtomicU64,
    pub mds_read_bytes: AtomicU64,
    pub mds_write_bytes: AtomicU64,
    /// READs / WRITEs through the MDS that reached no copy (NFS4ERR_IO).
    pub mds_read_failures: AtomicU64,
    pub mds_write_failures: AtomicU64,
    pub removals_queued: AtomicU64,
    /// Placements read back from stable storage (after a restart).
    pub placements_restored: AtomicU64,
    /// Stored placements that did not decode (their files fail with Io).
    pub placements_unreadable: AtomicU64,
    /// Placement changes that did not reach stable storage.
    pub placements_unsaved: AtomicU64,
    /// Stale copies brought back in step with a good mirror (`resync`).
    pub resyncs: AtomicU64,
    pub resync_bytes: AtomicU64,
    /// Resyncs that stopped (a copy failed or a write to the copy failed).
    pub resync_failures: AtomicU64,
    /// Data files removed by the orphan sweep (their MDS file was gone).
    pub orphans_removed: AtomicU64,
}

/// Where one regular file's data lives.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// DS ids in stripe order: stripe unit k, mirror m is on
    /// `dses[(k + m) % dses.len()]`; each holds one sparse data file whose
    /// offsets are the file's offsets.
    pub dses: Vec<u64>,
    pub mirrors: u32,
    pub stripe_unit_bytes: u64,
    /// Fencing epoch: data files are owned by synthetic uid/gid + epoch.
    pub epoch: u32,
    /// Data file handle on `dses[i]`.
    pub data_fh: Vec<Vec<u8>>,
    /// `stale[i]`: the copy on `dses[i]` missed writes; never read it again.
    pub stale: Vec<bool>,
}

impl Placement {
    pub fn width(&self) -> u64 {
        self.dses.len() as u64
    }

    /// Striped with one layout segment per stripe unit (more DSes than
    /// mirrors); otherwise one whole-file segment, mirror m on `dses[m]`.
    pub fn segmented(&self) -> bool {
        self.width() > self.mirrors as u64
    }

    /// Whether every stripe unit slot `i` holds a copy of also has a good
    /// copy elsewhere: a slot that is not stale, on a DS other than `id`.
    /// Only then may slot `i` go stale (miss writes the others take); the
    /// last good copy of a unit never does — its DS being away fails the
    /// I/O until it is back, it does not make the data unreachable.
    pub fn others_cover(&self, i: usize, id: u64) -> bool {
        let good = |j: usize| j != i && !self.stale[j] && self.dses[j] != id;
        let mirrors = self.mirrors as usize;
        if !self.segmented() {
            return (0..mirrors).any(good);
        }
        // Slot i is mirror m of the units u with (u + m) % w == i; such a
        // unit's copies are slots (u + k) % w for k < mirrors.
        let w = self.dses.len();
        (0..mirrors).all(|m| {
            let u = (i + w - m) % w;
            (0..mirrors).map(|k| (u + k) % w).any(good)
        })
    }

    /// Index into `dses` of stripe unit `unit`, mirror `m`.
    pub fn slot(&self, unit: u64, m: u32) -> usize {
        if !self.segmented() {
            return m as usize;
        }
        ((unit + m as u64) % self.width()) as usize
    }
}

/// One layout state: one client, one file (RFC 8881 §12.5.2).
#[derive(Debug, Clone)]
pub(crate) struct LayoutState {
    pub clientid: u64,
    pub fh: FileHandle,
    pub fsid: u64,
    pub seqid: u32,
    /// DS ids any segment granted under this state names.
    pub dses: Vec<u64>,
    /// When its first recall was sent (`now_ms`): not returned within
    /// `recall_timeout_ms`, it is revoked.
    pub recalled_ms: Option<u64>,
    /// The recall failed (refused, or not answered): revoke at the next
    /// tick instead of waiting for `recall_timeout_ms`.
    pub revoke_now: bool,
    /// The client's address at its last LAYOUTGET, and whether any RW
    /// layout was granted under this state (`recall_narrowed`).
    pub peer: Option<std::net::IpAddr>,
    pub rw: bool,
}

pub(crate) struct State {
    pub ds: registry::Registry,
    pub files: HashMap<FileHandle, Placement>,
    pub layouts: HashMap<u32, LayoutState>,
    pub by_client_file: HashMap<(u64, FileHandle), u32>,
    pub per_client: HashMap<u64, usize>,
    pub next_layout_key: u32,
    /// Rotates the first DS of each new file (placement spread).
    pub next_first: u64,
    /// Files in `files` with at least one stale copy (what `resync` walks
    /// instead of every placement).
    pub stale_files: HashSet<FileHandle>,
    /// The copy being resynced (file, slot): no layout of the file is
    /// granted meanwhile and writes through the MDS go to it too.
    pub resyncing: Option<(FileHandle, usize)>,
    /// A write through the MDS missed the copy being resynced: the resync
    /// must not call it good.
    pub resync_broken: bool,
    /// (file, slot) → `now_ms` before which a failed resync is not retried.
    pub resync_retry_after: HashMap<(FileHandle, usize), u64>,
}

/// A data-file removal for the control thread.
pub(crate) struct RemoveJob {
    pub conns: Vec<Arc<Mutex<registry::DsConn>>>,
    pub name: String,
}

pub struct Pnfs {
    pub(crate) cfg: PnfsConfig,
    pub(crate) vfs: Arc<dyn Vfs>,
    pub(crate) st: Mutex<State>,
    pub(crate) place_lock: Mutex<()>,
    /// Serialises writes of stored placements (`persist`).
    pub(crate) persist_lock: Mutex<()>,
    /// Writes and resizes through the MDS hold it shared; a resync holds it
    /// exclusively while it copies one chunk, so no write through the MDS
    /// lands between its read of the good copy and its write of the stale one.
    pub(crate) resync_gate: RwLock<()>,
    pub(crate) boot: u32,
    pub(crate) recaller: OnceLock<Arc<dyn LayoutRecaller>>,
    pub metrics: Metrics,
    pub(crate) remove_tx: Mutex<Option<SyncSender<RemoveJob>>>,
    /// Outcomes of CB_LAYOUTRECALLs (layout key, client, file, end), queued
    /// by the callback's completion and applied by the control thread.
    pub(crate) recall_ends: Arc<Mutex<Vec<RecallEndEntry>>>,
    pub(crate) started: Instant,
    control: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Workers for I/O proxied through the MDS (`PnfsVfs`).
    pub(crate) io: vfs::iopool::IoPool,
    /// Where the orphan sweep is (`orphans`).
    pub(crate) sweep: Mutex<orphans::Sweep>,
    /// The log of I/O through the MDS that reached no copy.
    pub(crate) io_fail_log: LogLimit,
    /// Striped by inode: a file's size is read and grown under its lock
    /// (`grow_size`), so growths that race never shrink it.
    size_locks: [Mutex<()>; SIZE_LOCKS],
}

/// Stripes of `Pnfs::size_locks`.
const SIZE_LOCKS: usize = 64;

impl Pnfs {
    /// Hold `fh`'s size lock: its size is read and grown under it (writes
    /// through the MDS, LAYOUTCOMMIT), so that two growths finishing out of
    /// order keep the larger — each compares with the size as it is then,
    /// not as it was before its data-server writes.
    pub(crate) fn size_lock(&self, fh: &FileHandle) -> std::sync::MutexGuard<'_, ()> {
        self.size_locks[(fh.ino % SIZE_LOCKS as u64) as usize].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pNFS MDS over `vfs` (the namespace it wraps) with `dses`; starts
    /// the control thread (removals, health probes), which stops when the
    /// last `Arc` is dropped.
    pub fn new(cfg: PnfsConfig, vfs: Arc<dyn Vfs>, dses: Vec<DsSpec>) -> Result<Arc<Pnfs>, String> {
        cfg.check()?;
        // Layout stateids of an earlier instance must be STALE here, even
        // one started within the same second.
        let boot = nfs4::instance_epoch();
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.remove_queue_max);
        let timeout = Duration::from_millis(cfg.ds_timeout_ms);
        let p = Arc::new(Pnfs {
            st: Mutex::new(State {
                ds: registry::Registry::new(timeout),
                files: HashMap::new(),
                layouts: HashMap::new(),
                by_client_file: HashMap::new(),
                per_client: HashMap::new(),
                next_layout_key: 1,
                next_first: 0,
                stale_files: HashSet::new(),
                resyncing: None,
                resync_broken: false,
                resync_retry_after: HashMap::new(),
            }),
            cfg,
            vfs,
            place_lock: Mutex::new(()),
            persist_lock: Mutex::new(()),
            resync_gate: RwLock::new(()),
            boot,
            recaller: OnceLock::new(),
            metrics: Metrics::default(),
            io_fail_log: LogLimit::default(),
            size_locks: std::array::from_fn(|_| Mutex::new(())),
            remove_tx: Mutex::new(Some(tx)),
            recall_ends: Arc::new(Mutex::new(Vec::new())),
            started: Instant::now(),
            control: Mutex::new(None),
            io: vfs::iopool::IoPool::start("pnfs-io", IO_THREADS)?,
            sweep: Mutex::new(orphans::Sweep::default()),
        });
        p.set_data_servers(dses)?;
        let weak = Arc::downgrade(&p);
        let t = std::thread::Builder::new()
            .name("pnfs-control".into())
            .spawn(move || control_loop(weak, rx))
            .map_err(|e| format!("pnfs: cannot start the control thread: {e}"))?;
        *p.control.lock().unwrap() = Some(t);
        Ok(p)
    }

    /// Where CB_LAYOUTRECALL goes (set once, after the NFSv4 program exists).
    pub fn set_recaller(&self, r: Arc<dyn LayoutRecaller>) {
        let _ = self.recaller.set(r);
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> &PnfsConfig {
        &self.cfg
    }

    /// Replace the DS list (admin API, config). DSes are matched by name;
    /// a DS that leaves, stops being ready or starts draining has the
    /// layouts naming it recalled (or its files fenced when the recall
    /// cannot be sent).
    pub fn set_data_servers(&self, list: Vec<DsSpec>) -> Result<(), String> {
        if list.len() > DATA_SERVERS_MAX {
            return Err(format!("{} data servers, more than {DATA_SERVERS_MAX}", list.len()));
        }
        let gone = self.state().ds.replace(list)?;
        if !gone.is_empty() {
            self.recall_where(|l| l.dses.iter().any(|d| gone.contains(d)), true);
        }
        Ok(())
    }

    /// Admin/metrics view of every current DS.
    pub fn ds_states(&self) -> Vec<DsState> {
        let st = self.state();
        let mut out = st.ds.states();
        // One walk over the layout states (bounded by layouts_max) per call:
        // the admin API's rate, never the data path's.
        let mut held_by_id: HashMap<u64, u64> = HashMap::new();
        for l in st.layouts.values() {
            for (i, id) in l.dses.iter().enumerate() {
                if !l.dses[..i].contains(id) {
                    *held_by_id.entry(*id).or_default() += 1;
                }
            }
        }
        let held: HashMap<String, u64> = held_by_id.into_iter().map(|(id, n)| (st.ds.name_of(id), n)).collect();
        let stale: HashMap<String, u64> = self.stale_by_ds(&st).into_iter().map(|(id, n)| (st.ds.name_of(id), n)).collect();
        for d in &mut out {
            d.layouts_held = held.get(&d.name).copied().unwrap_or(0);
            d.stale_copies = stale.get(&d.name).copied().unwrap_or(0);
        }
        out
    }

    pub fn layouts_active(&self) -> usize {
        self.state().layouts.len()
    }

    pub fn files_placed(&self) -> usize {
        self.state().files.len()
    }

    /// DS ids and data-file handles of a placed file (tests, admin).
    pub fn placement_of(&self, fh: &FileHandle) -> Option<Vec<(String, Vec<u8>)>> {
        let st = self.state();
        let p = st.files.get(fh)?;
        Some(p.dses.iter().zip(&p.data_fh).map(|(id, h)| (st.ds.name_of(*id), h.clone())).collect())
    }

    /// Mark a DS unreachable (a client's report or a failed control call).
    pub(crate) fn ds_failed(&self, id: u64) {
        let mut st = self.state();
        st.ds.mark_unhealthy(id, self.now_ms());
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Recall every layout `pred` selects. With `fence_on_failure`, a
    /// recall that cannot be sent fences the file instead (its data files
    /// change owner, so the client's layout stops working on the DSes) —
    /// used when a DS leaves or drains, never on the common paths
    /// (truncate), because a fenced client sees NFS3ERR_ACCES from the DS.
    /// Returns how many layouts it recalled.
    pub(crate) fn recall_where(&self, pred: impl Fn(&LayoutState) -> bool, fence_on_failure: bool) -> usize {
        // A recall is a new state of the layout (RFC 8881 §12.5.5.2.1): its
        // stateid carries the next seqid, which the Linux client checks
        // (one it already has is NFS4ERR_OLD_STATEID), and the client's
        // LAYOUTRETURN then names that seqid. A recall that never reaches
        // the client gives the seqid back: the client's next recall must
        // be exactly one ahead of what it holds (further ahead, Linux
        // answers NFS4ERR_DELAY until the recall times out).
        let victims: Vec<(u32, u32, LayoutState)> = {
            let mut st = self.state();
            st.layouts
                .iter_mut()
                .filter(|(_, l)| pred(l))
                .map(|(k, l)| {
                    let prev = l.seqid;
                    l.seqid = if l.seqid == u32::MAX { 1 } else { l.seqid + 1 };
                    (*k, prev, l.clone())
                })
                .collect()
        };
        let mut fence = Vec::new();
        let recalled = victims.len();
        for (key, prev, l) in victims {
            self.metrics.layouts_recalled.fetch_add(1, Ordering::Relaxed);
            let sid = self.layout_stateid(key, l.seqid);
            let ends = Arc::clone(&self.recall_ends);
            let (clientid, fh) = (l.clientid, l.fh);
            let on_done: Box<dyn FnOnce(RecallEnd) + Send> = Box::new(move |end| {
                ends.lock().unwrap_or_else(|e| e.into_inner()).push((key, clientid, fh, end, fence_on_failure));
            });
            let sent = match self.recaller.get() {
                Some(r) => r.recall_file(l.clientid, &l.fh, &sid, on_done),
                None => Err("no back channel wired".into()),
            };
            match sent {
                // Only the recalls that fence when they cannot be sent (a DS
                // leaving or draining, a resync) are revoked when not
                // answered in time; a truncation's recall never fences.
                Ok(()) if fence_on_failure => {
                    let now = self.now_ms();
                    if let Some(l) = self.state().layouts.get_mut(&key) {
                        l.recalled_ms.get_or_insert(now);
                    }
                }
                Ok(()) => {}
                Err(_) => {
                    if let Some(held) = self.state().layouts.get_mut(&key) {
                        if held.clientid == l.clientid && held.fh == l.fh && held.seqid == l.seqid {
                            held.seqid = prev;
                        }
                    }
                    if fence_on_failure && !fence.contains(&l.fh) {
                        fence.push(l.fh);
                    }
                }
            }
        }
        for fh in fence {
            self.fence(&fh);
        }
        recalled
    }

    /// Recall the layouts of clients an export or volume rule change
    /// narrowed: `grant(fh, peer)` is the access the client has now (`None`:
    /// none). A layout whose client lost access, or holds an RW layout and
    /// may now only read, is recalled, and revoked (its file fenced) if not
    /// returned in time or if the recall cannot be sent — a layout is a
    /// handle too, and the DSes do not see the rules. A layout of unknown
    /// address is recalled as well. Returns how many were recalled.
    pub fn recall_narrowed(&self, grant: impl Fn(&FileHandle, std::net::IpAddr) -> Option<vfs::clients::Grant>) -> usize {
        let narrowed = |l: &LayoutState| match l.peer {
            None => true,
            Some(ip) => match grant(&l.fh, ip) {
                None => true,
                Some(g) => l.rw && !g.writable,
            },
        };
        self.recall_where(|l| l.recalled_ms.is_none() && narrowed(l), true)
    }

    /// Apply the recalls' outcomes: a client that holds no matching layout
    /// has returned it (§20.3.4); a recall that failed is revoked now.
    pub(crate) fn apply_recall_ends(&self) {
        let ends = std::mem::take(&mut *self.recall_ends.lock().unwrap_or_else(|e| e.into_inner()));
        if ends.is_empty() {
            return;
        }
        let mut st = self.state();
        for (key, clientid, fh, end, revocable) in ends {
            // The key may have been reused since: it must still be this
            // client's layout of this file.
            if !st.layouts.get(&key).is_some_and(|l| l.clientid == clientid && l.fh == fh) {
                continue;
            }
            match end {
                RecallEnd::NoMatchingLayout => {
                    eprintln!("pnfs: client {clientid:#x} holds no layout of {} (NFS4ERR_NOMATCHING_LAYOUT): taken as returned", data_file_name(&fh));
                    self.metrics.layouts_returned.fetch_add(1, Ordering::Relaxed);
                    layouts::forget_layout(&mut st, key);
                }
                RecallEnd::Failed(why) if revocable => {
                    eprintln!("pnfs: the layout recall of {} to client {clientid:#x} failed ({why}): revoking it", data_file_name(&fh));
                    if let Some(l) = st.layouts.get_mut(&key) {
                        l.revoke_now = true;
                    }
                }
                RecallEnd::Failed(why) => eprintln!("pnfs: the layout recall of {} to client {clientid:#x} failed ({why})", data_file_name(&fh)),
                RecallEnd::Accepted => eprintln!("pnfs: client {clientid:#x} accepted the layout recall of {}", data_file_name(&fh)),
            }
        }
    }

    /// Revoke the layouts recalled more than `recall_timeout_ms` ago and
    /// still held: their files are fenced (a revoked layout no longer
    /// writes on the DSes; the client falls back to the MDS and asks again).
    pub(crate) fn revoke_unreturned(&self) {
        let now = self.now_ms();
        let mut files: Vec<FileHandle> = {
            let st = self.state();
            st.layouts
                .values()
                .filter(|l| l.revoke_now || l.recalled_ms.is_some_and(|t| now.saturating_sub(t) >= self.cfg.recall_timeout_ms))
                .map(|l| l.fh)
                .collect()
        };
        files.sort_unstable_by_key(|f| f.to_bytes());
        files.dedup();
        for fh in files {
            self.metrics.layouts_revoked.fetch_add(1, Ordering::Relaxed);
            eprintln!("pnfs: a recalled layout of {} was not returned within {} ms: revoked (file fenced)", data_file_name(&fh), self.cfg.recall_timeout_ms);
            self.fence(&fh);
        }
    }

    /// Fence a file: every data file moves to the next synthetic owner and
    /// every layout of the file is forgotten, so DS I/O under an old layout
    /// gets NFS3ERR_ACCES and the client must come back for a new one.
    pub fn fence(&self, fh: &FileHandle) {
        let (conns, fhs, epoch) = {
            let mut st = self.state();
            let Some(p) = st.files.get_mut(fh) else { return };
            p.epoch = (p.epoch + 1) % persist::EPOCH_LIMIT;
            let epoch = p.epoch;
            let ids = p.dses.clone();
            let fhs = p.data_fh.clone();
            let conns: Vec<_> = ids.iter().map(|id| st.ds.conn(*id)).collect();
            layouts::forget_file(&mut st, fh);
            (conns, fhs, epoch)
        };
        self.metrics.fences.fetch_add(1, Ordering::Relaxed);
        // The new epoch is stored before the data files change owner.
        self.persist(fh);
        let s = Sattr { uid: Some(self.cfg.synthetic_uid + epoch), gid: Some(self.cfg.synthetic_gid + epoch), ..Default::default() };
        for (c, h) in conns.iter().zip(&fhs) {
            if let Some(c) = c {
                let id = c.lock().unwrap_or_else(|e| e.into_inner()).id;
                if let Err(e) = c.lock().unwrap_or_else(|e| e.into_inner()).client.setattr(h, &s) {
                    if matches!(e, CtlError::Unreachable(_)) {
                        self.ds_failed(id);
                    }
                }
            }
        }
    }

    /// Queue removal of a file's data files (REMOVE of the last link).
    pub(crate) fn forget_placement(&self, fh: &FileHandle) {
        let job = {
            let mut st = self.state();
            layouts::forget_file(&mut st, fh);
            let Some(p) = st.files.remove(fh) else { return };
            st.stale_files.remove(fh);
            st.resync_retry_after.retain(|(f, _), _| f != fh);
            for id in &p.dses {
                st.ds.file_count(*id, -1);
            }
            let conns: Vec<_> = p.dses.iter().filter_map(|id| st.ds.conn(*id)).collect();
            RemoveJob { conns, name: data_file_name(fh) }
        };
        self.metrics.removals_queued.fetch_add(1, Ordering::Relaxed);
        let tx = self.remove_tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match tx.map(|t| t.try_send(job)) {
            Some(Ok(())) => {}
            Some(Err(std::sync::mpsc::TrySendError::Full(job))) | Some(Err(std::sync::mpsc::TrySendError::Disconnected(job))) => {
                run_remove(&job)
            }
            None => {}
        }
    }

    /// Build a layout stateid (see `layouts`).
    pub(crate) fn layout_stateid(&self, key: u32, seqid: u32) -> Stateid {
        let mut other = [0u8; 12];
        other[..4].copy_from_slice(&layouts::LAYOUT_STATEID_MAGIC);
        other[4..8].copy_from_slice(&self.boot.to_be_bytes());
        other[8..].copy_from_slice(&key.to_be_bytes());
        Stateid { seqid, other }
    }

    /// The device id of DS `id`.
    pub fn device_id(id: u64) -> DeviceId {
        registry::device_id(id)
    }
}

impl Drop for Pnfs {
    fn drop(&mut self) {
        // Closing the channel stops the control thread after the queue drains.
        self.remove_tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// At most one log line per `LOG_EVERY` for one kind of repeated failure
/// (a data server away fails every I/O through the MDS that reaches it);
/// the next line says how many were left out.
#[derive(Default)]
pub(crate) struct LogLimit {
    /// Milliseconds since `log_epoch()` before which lines are counted.
    quiet_until: AtomicU64,
    skipped: AtomicU64,
}

const LOG_EVERY: Duration = Duration::from_secs(5);

fn log_epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl LogLimit {
    /// `Some(lines left out since the last one)` when this one is logged.
    pub(crate) fn admit(&self) -> Option<u64> {
        let now = log_epoch().elapsed().as_millis() as u64;
        let until = self.quiet_until.load(Ordering::Relaxed);
        if now >= until && self.quiet_until.compare_exchange(until, now + LOG_EVERY.as_millis() as u64, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            return Some(self.skipped.swap(0, Ordering::Relaxed));
        }
        self.skipped.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// ", N more like it in the last 5 s" for a line `LogLimit` admitted.
pub(crate) fn and_more(skipped: u64) -> String {
    if skipped == 0 {
        String::new()
    } else {
        format!("; {skipped} more like it since the last such line")
    }
}

/// Name of a file's data file on every DS: the MDS handle in hex (unique
/// per MDS namespace object, including its generation).
pub fn data_file_name(fh: &FileHandle) -> String {
    fh.to_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn run_remove(job: &RemoveJob) {
    for c in &job.conns {
        let mut c = c.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(root) = c.root() {
            let _ = c.client.remove(&root, job.name.as_bytes());
        }
    }
}

/// How often the control thread probes unhealthy DSes.
pub const PROBE_INTERVAL_MS: u64 = 1000;

fn control_loop(p: std::sync::Weak<Pnfs>, rx: Receiver<RemoveJob>) {
    loop {
        match rx.recv_timeout(Duration::from_millis(PROBE_INTERVAL_MS)) {
            Ok(job) => run_remove(&job),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(p) = p.upgrade() else { return };
        let now = p.now_ms();
        let due = p.state().ds.probe_due(now, p.cfg.ds_recheck_ms);
        for (id, conn) in due {
            let ok = conn.lock().unwrap_or_else(|e| e.into_inner()).client.null().is_ok();
            let mut st = p.state();
            if ok {
                st.ds.mark_healthy(id);
            } else {
                st.ds.mark_unhealthy(id, now);
            }
        }
        p.apply_recall_ends();
        p.revoke_unreturned();
        p.resync_some();
        p.sweep_orphans_some();
    }
}

#[cfg(test)]
mod tests;
