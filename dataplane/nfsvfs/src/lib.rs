//! The `nfs` mount module: another NFS server's export served as one of
//! chimerad's mounts, through the userspace client (`client`) over NFSv3.
//!
//! Handles. A local `FileHandle` is 24 bytes (export id, inode, generation),
//! an NFSv3 handle up to 64. Two forms carry a remote handle:
//! - compact: a remote handle as long as the remote root's that shares all
//!   but its last 16 bytes with it (chimerad's handles: version, export id,
//!   then inode and generation) keeps those 16 bytes as (ino, generation),
//!   generation below 2^63. Nothing is remembered, so such handles survive
//!   a restart of either side when the remote's handles do.
//! - mapped: any other remote handle gets (hash, hash | 2^63) and is kept in
//!   a map of at most `HANDLE_MAP_MAX` entries; a full map refuses new
//!   handles with `Io` rather than evicting handles clients still hold.
//!   With `Options::handle_map` (a file) every new mapped handle is
//!   appended there and flushed (fdatasync) before any client sees it, and
//!   the file is read back at start, so mapped handles survive a restart of
//!   this server; without it they do not (a client then sees `Stale`).
//!   The file is a sequence of records `[len u8][ino u64 BE][generation
//!   u64 BE][handle: len bytes]`; a record is checked by recomputing its
//!   (ino, generation) from its handle. A short last record (a crash in
//!   the middle of an append) is cut off; any other record that does not
//!   check refuses the start, naming the file and the record's offset.
//!
//! The export root is always (0, u64::MAX), whatever the remote root
//! handle: the mount starts, and its root stays valid, while the remote is
//! down or after it hands out a new root handle. A local handle naming
//! nothing remote is `Stale`, never a panic: the remote says STALE or
//! BADHANDLE for a forged compact handle, the map says it for a mapped one.
//!
//! Calls. `connections` TCP connections (each with its own MOUNT), one call
//! in flight on each at a time; a call takes a free connection, or waits
//! for one. Every remote call is bounded by `timeout` (the client's
//! per-call timeout), connecting too. READ, WRITE and COMMIT park the call
//! (`Later`) and run on a pool of `connections` workers (`vfs::iopool`);
//! metadata calls run there too, whole: `Vfs::offload_pool` names the pool;
//! NFSv3 parks every procedure on this mount and runs it on a worker, an
//! NFSv4.1 COMPOUND runs there from its first operation on this mount to
//! its end, and MOUNT resolves a path into it there. So a slow remote
//! holds the calls that wait on it, not a core's loop.
//!
//! Outages. A lost connection (the remote closed it, a call timed out) is
//! dropped; the next call on it reconnects and MOUNTs again. A failed
//! connect is not retried on that connection for `retry_after`: calls fail
//! fast with `Io` (NFS3ERR_IO / NFS4ERR_IO) while the remote is down,
//! never hang. `notify` hears the transitions (connected, lost, root
//! changed). Reports (`/metrics`, the admin API) take the remote's space
//! from `Vfs::fsstat_now`: the last FSSTAT figures (asked at connect and by
//! any FSSTAT through the mount), refreshed on a worker when older than
//! `FSSTAT_REFRESH`, so a stalled remote never holds them.
//!
//! Write verifier. There is no data of ours between the client and the
//! remote: an UNSTABLE write is unstable on the remote. So the verifier we
//! answer is the remote's, the one its last WRITE or COMMIT reply carried.
//! When the remote restarts and loses unstable data, its next reply has a
//! new verifier, we pass it on, and the client resends — as if it talked to
//! the remote. When this server restarts, nothing is lost (the remote still
//! holds the data) and the verifier rightly does not change. Until the
//! first reply the verifier is random.
//!
//! Directory cookies are the remote's, passed through; the cookie verifier
//! is always zero (the remote's is not tracked, and a zero verifier asks
//! neither side to check). Not here: MKNOD (devices, sockets, FIFOs are
//! `NotSupported`), quotas and volume deletion (`NotSupported`; `quota` is
//! none), pinning (a remove on the remote destroys the file), pipelined
//! calls on one connection.
//!
//! MOUNT. Asked on the NFS connection (chimerad serves it on its NFS port);
//! a remote that has no MOUNT there (PROG_UNAVAIL, as the Linux server and
//! Ganesha answer) is asked at the port its portmapper names
//! (`MountAt::Portmap`, the default, port 111), or at a port given
//! (`MountAt::Port`).

use client::nfs3::{Fattr, Nfs3, SetAttr as RSetAttr, SetTime as RSetTime, Stable};
use client::{Auth, Limits};
use proto::nfs3::ftype3;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use vfs::iopool::IoPool;
use vfs::*;

/// Most remote handles kept in the map (those without the compact form).
pub const HANDLE_MAP_MAX: usize = 1 << 18;
/// Longest remote handle (NFSv3's NFS3_FHSIZE).
pub const REMOTE_HANDLE_MAX: usize = 64;
/// Bytes of a handle-map record before the handle.
const HANDLE_REC_HEAD: usize = 17;
/// Most connections to one remote.
pub const CONNECTIONS_MAX: usize = 16;
/// Largest READ or WRITE sent to the remote; bigger calls are split.
pub const IO_CHUNK_BYTES_MAX: usize = 1 << 20;
/// READDIRPLUS reply size asked of the remote per page.
const READDIR_BYTES: u32 = 32 << 10;

const ROOT_INO: u64 = 0;
const ROOT_GEN: u64 = u64::MAX;
const MAPPED: u64 = 1 << 63;

/// How old the remote's space figures may be before a report
/// (`Vfs::fsstat_now`) asks the remote again, on a worker.
const FSSTAT_REFRESH: Duration = Duration::from_secs(1);

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// What to mount and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// Mount name, for messages.
    pub name: String,
    pub export_id: ExportId,
    /// "host:port" or "[v6]:port".
    pub addr: String,
    /// The remote export, "/path".
    pub path: String,
    pub connections: usize,
    /// Bound on every remote call, connecting included.
    pub timeout: Duration,
    /// A connection whose connect failed is not tried again before this.
    pub retry_after: Duration,
    /// Where MOUNT is asked when the NFS port does not serve it.
    pub mount_at: MountAt,
    /// The file that keeps mapped handles across restarts (see the crate
    /// comment); None: they last as long as the process.
    pub handle_map: Option<std::path::PathBuf>,
}

/// Where a remote's MOUNT service is (see the module's "MOUNT").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountAt {
    /// On the NFS port; where the remote has none there, at the port its
    /// portmapper (on this port) names.
    Portmap(u16),
    /// At this port, only.
    Port(u16),
}

impl Default for MountAt {
    fn default() -> Self {
        MountAt::Portmap(111)
    }
}

/// `addr` ("host:port", "[v6]:port") with another port.
fn with_port(addr: &str, port: u16) -> String {
    match addr.rfind(':') {
        Some(i) => format!("{}:{port}", &addr[..i]),
        None => format!("{addr}:{port}"),
    }
}

/// MOUNT of `path` for a connection to `addr` (see `MountAt`).
fn mount_root(c: &mut Nfs3, addr: &str, path: &str, at: MountAt, limits: Limits) -> client::Result<Vec<u8>> {
    const MOUNT_PROGRAM: u32 = 100_005;
    const PROG_UNAVAIL: u32 = 1;
    let auth = Auth::sys(0, 0);
    match at {
        MountAt::Port(p) => client::nfs3::mount_at(&with_port(addr, p), path, &auth, limits),
        MountAt::Portmap(pm) => match c.mount(path) {
            Err(client::Error::Accept { code: PROG_UNAVAIL, .. }) => {
                let pm_addr = with_port(addr, pm);
                let port = client::nfs3::portmap_getport(&pm_addr, MOUNT_PROGRAM, 3, &auth, limits)?;
                if port == 0 {
                    return Err(client::Error::Invalid(format!(
                        "no MOUNT service: the NFS port does not serve it and the portmapper at {pm_addr} has none registered"
                    )));
                }
                client::nfs3::mount_at(&with_port(addr, port), path, &auth, limits)
            }
            r => r,
        },
    }
}

/// A transition worth a log line: `error` is set for the bad ones.
pub type Notify = Arc<dyn Fn(&str, Option<&str>) + Send + Sync>;

/// Counters for the metrics endpoint.
#[derive(Debug, Default)]
pub struct Stats {
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
    pub connections_lost: AtomicU64,
    pub calls_failed: AtomicU64,
}

struct Slot {
    nfs: Option<Nfs3>,
}

struct Inner {
    opts: Options,
    slots: Vec<Mutex<Slot>>,
    next: AtomicUsize,
    /// No connect before this (the last one failed).
    retry_at: Mutex<Option<Instant>>,
    /// The remote root handle from the last MOUNT.
    root: RwLock<Option<Vec<u8>>>,
    map: Mutex<HashMap<(u64, u64), Vec<u8>>>,
    /// `Options::handle_map` opened for appending, with its path.
    handle_log: Option<(std::path::PathBuf, std::fs::File)>,
    verifier: Mutex<[u8; 8]>,
    /// Whether the remote answered last time: `UNKNOWN`, `UP` or `DOWN`
    /// (a change is logged through `notify`).
    state: AtomicU8,
    notify: Notify,
    stats: Stats,
    /// The remote's space figures as last seen, and when (for reports).
    fs_seen: Mutex<Option<(FsStat, Instant)>>,
    /// A refresh of `fs_seen` is queued or running.
    fs_refreshing: AtomicBool,
}

pub struct NfsVfs {
    inner: Arc<Inner>,
    pool: IoPool,
}

/// The failure of a remote call as a backend error.
pub fn vfs_error(e: &client::Error) -> VfsError {
    match e {
        client::Error::Nfs3 { code, .. } => nfs3_error(*code),
        _ => VfsError::Io,
    }
}

/// An nfsstat3 as a backend error.
pub fn nfs3_error(code: u32) -> VfsError {
    match code {
        1 => VfsError::Perm,
        2 => VfsError::NoEnt,
        13 => VfsError::Access,
        17 => VfsError::Exist,
        18 => VfsError::CrossDevice,
        20 => VfsError::NotDir,
        21 => VfsError::IsDir,
        22 | 10003 => VfsError::Inval,
        27 => VfsError::FileTooBig,
        28 => VfsError::NoSpace,
        30 => VfsError::ReadOnly,
        31 => VfsError::TooManyLinks,
        63 => VfsError::NameTooLong,
        66 => VfsError::NotEmpty,
        69 => VfsError::QuotaExceeded,
        // The local handle was well formed; the remote names nothing by it.
        70 | 10001 => VfsError::Stale,
        10002 => VfsError::NotSync,
        10004 | 10007 | 19 => VfsError::NotSupported,
        _ => VfsError::Io,
    }
}

fn ftype(t: &ftype3) -> FileType {
    match t {
        ftype3::NF3REG => FileType::Regular,
        ftype3::NF3DIR => FileType::Directory,
        ftype3::NF3BLK => FileType::BlockDevice,
        ftype3::NF3CHR => FileType::CharDevice,
        ftype3::NF3LNK => FileType::Symlink,
        ftype3::NF3SOCK => FileType::Socket,
        ftype3::NF3FIFO => FileType::Fifo,
    }
}

fn hash64(seed: u64, b: &[u8]) -> u64 {
    // FNV-1a, then a final mix so nearby handles spread.
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &c in b {
        h = (h ^ c as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The local (ino, generation) of a remote handle without the compact
/// form: its two hashes, the generation marked `MAPPED`, never the root's.
fn mapped_key(remote: &[u8]) -> (u64, u64) {
    let key = (hash64(0, remote), hash64(0x9e37_79b9_7f4a_7c15, remote) | MAPPED);
    if key == (ROOT_INO, ROOT_GEN) {
        (1, ROOT_GEN)
    } else {
        key
    }
}

/// One handle-map record (see the crate comment).
fn handle_record(key: (u64, u64), remote: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(HANDLE_REC_HEAD + remote.len());
    r.push(remote.len() as u8);
    r.extend_from_slice(&key.0.to_be_bytes());
    r.extend_from_slice(&key.1.to_be_bytes());
    r.extend_from_slice(remote);
    r
}

/// Open (creating it) the handle map at `path` and read its records into
/// a map. A short last record is cut off (the file is truncated to the
/// records before it); a record that does not check is an error naming
/// the file and its offset.
fn load_handle_map(path: &std::path::Path) -> Result<(std::fs::File, HashMap<(u64, u64), Vec<u8>>), String> {
    use std::io::Read;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("handle map {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| format!("handle map {}: {e}", path.display()))?;
    let mut map = HashMap::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let len = bytes[at] as usize;
        if at + HANDLE_REC_HEAD + len > bytes.len() {
            // A torn append: the handle was never answered.
            file.set_len(at as u64).map_err(|e| format!("handle map {}: cutting a torn record at offset {at}: {e}", path.display()))?;
            file.sync_data().map_err(|e| format!("handle map {}: {e}", path.display()))?;
            break;
        }
        let ino = u64::from_be_bytes(bytes[at + 1..at + 9].try_into().unwrap());
        let generation = u64::from_be_bytes(bytes[at + 9..at + 17].try_into().unwrap());
        let remote = &bytes[at + HANDLE_REC_HEAD..at + HANDLE_REC_HEAD + len];
        if len > REMOTE_HANDLE_MAX || mapped_key(remote) != (ino, generation) {
            return Err(format!(
                "handle map {}: the record at offset {at} does not match its handle (the file is damaged); \
                 move it away to start with an empty map (clients then see stale handles for the files they had open)",
                path.display()
            ));
        }
        if map.len() >= HANDLE_MAP_MAX {
            return Err(format!("handle map {}: more than {HANDLE_MAP_MAX} handles at offset {at}", path.display()));
        }
        if let Some(old) = map.insert((ino, generation), remote.to_vec()) {
            if old != remote {
                return Err(format!("handle map {}: two handles for one key at offset {at}", path.display()));
            }
        }
        at += HANDLE_REC_HEAD + len;
    }
    Ok((file, map))
}

fn set_time(t: SetTime) -> Option<RSetTime> {
    match t {
        SetTime::DontChange => None,
        SetTime::ServerNow => Some(RSetTime::Server),
        SetTime::Client(t) => Some(RSetTime::Client(
            t.sec.clamp(0, u32::MAX as i64) as u32,
            t.nsec,
        )),
    }
}

impl Inner {
    fn attr(&self, a: &Fattr) -> Attr {
        let t = |t: &proto::nfs3::nfstime3| Time {
            sec: t.seconds as i64,
            nsec: t.nseconds,
        };
        Attr {
            ftype: ftype(&a.r#type),
            mode: a.mode & 0o7777,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            used: a.used,
            rdev: (a.rdev.specdata1, a.rdev.specdata2),
            // Ours, as every mount's: clients tell mounts apart by it.
            fsid: self.opts.export_id as u64,
            fileid: a.fileid,
            atime: t(&a.atime),
            mtime: t(&a.mtime),
            ctime: t(&a.ctime),
            // NFSv3 has no change attribute: the ctime stands in for it.
            change: ((a.ctime.seconds as u64) << 32) | a.ctime.nseconds as u64,
        }
    }

    fn root_remote(&self) -> VfsResult<Vec<u8>> {
        if let Some(r) = &*self.root.read().unwrap_or_else(|e| e.into_inner()) {
            return Ok(r.clone());
        }
        // Never mounted (the remote was down at start): connecting now
        // MOUNTs and learns the root; bounded like any call.
        self.call(|_| Ok(()))?;
        self.root
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(VfsError::Io)
    }

    /// The remote handle a local handle carries.
    fn remote(&self, fh: &FileHandle) -> VfsResult<Vec<u8>> {
        if fh.export_id != self.opts.export_id {
            return Err(VfsError::Stale);
        }
        if (fh.ino, fh.generation) == (ROOT_INO, ROOT_GEN) {
            return self.root_remote();
        }
        if fh.generation & MAPPED != 0 {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            return map
                .get(&(fh.ino, fh.generation))
                .cloned()
                .ok_or(VfsError::Stale);
        }
        let root = self.root_remote()?;
        if root.len() < 16 {
            return Err(VfsError::Stale);
        }
        let mut r = root[..root.len() - 16].to_vec();
        r.extend_from_slice(&fh.ino.to_be_bytes());
        r.extend_from_slice(&fh.generation.to_be_bytes());
        Ok(r)
    }

    /// The local handle for a remote one (see the crate comment).
    fn local(&self, remote: &[u8]) -> VfsResult<FileHandle> {
        let fh = |ino, generation| FileHandle {
            export_id: self.opts.export_id,
            ino,
            generation,
        };
        let root = self.root_remote()?;
        if remote == root.as_slice() {
            return Ok(fh(ROOT_INO, ROOT_GEN));
        }
        let n = root.len();
        if n >= 16 && remote.len() == n && remote[..n - 16] == root[..n - 16] {
            let ino = u64::from_be_bytes(remote[n - 16..n - 8].try_into().unwrap());
            let generation = u64::from_be_bytes(remote[n - 8..].try_into().unwrap());
            if generation & MAPPED == 0 {
                return Ok(fh(ino, generation));
            }
        }
        let key = mapped_key(remote);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some(r) if r.as_slice() == remote => return Ok(fh(key.0, key.1)),
            // Two remote handles with one 128-bit hash: refuse the second.
            Some(_) => return Err(VfsError::Io),
            None => {}
        }
        if map.len() >= HANDLE_MAP_MAX {
            drop(map);
            (self.notify)(
                "handle map full: new remote handles refused",
                Some("HANDLE_MAP_MAX reached"),
            );
            return Err(VfsError::Io);
        }
        if remote.len() > REMOTE_HANDLE_MAX {
            return Err(VfsError::Io);
        }
        if let Some((path, file)) = &self.handle_log {
            use std::io::Write;
            // Appended under the map's lock (file and map agree), flushed
            // after it; either way before the handle is answered.
            let rec = handle_record(key, remote);
            if let Err(e) = (&*file).write_all(&rec) {
                drop(map);
                (self.notify)(
                    "handle map: cannot append, new remote handles refused",
                    Some(&format!("{}: {e}", path.display())),
                );
                return Err(VfsError::Io);
            }
            map.insert(key, remote.to_vec());
            drop(map);
            if let Err(e) = file.sync_data() {
                (self.notify)(
                    "handle map: flush failed, a new remote handle refused",
                    Some(&format!("{}: {e}", path.display())),
                );
                return Err(VfsError::Io);
            }
            return Ok(fh(key.0, key.1));
        }
        map.insert(key, remote.to_vec());
        Ok(fh(key.0, key.1))
    }

    fn set_root(&self, root: Vec<u8>) {
        let mut cur = self.root.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = cur.as_ref() {
            if *old != root {
                (self.notify)(
                    "remote root handle changed: the remote's handles did not survive its restart, clients see stale handles",
                    Some("root handle changed"),
                );
            }
        }
        *cur = Some(root);
    }

    fn limits(&self) -> Limits {
        Limits {
            timeout: self.opts.timeout,
            connect_timeout: self.opts.timeout,
            ..Limits::default()
        }
    }

    /// Record whether the remote answered; log the changes.
    fn set_state(&self, to: u8, what: &str, error: Option<&str>) {
        if self.state.swap(to, Ordering::AcqRel) != to {
            (self.notify)(what, error);
        }
    }

    /// Connect and MOUNT on `slot` (it had no connection). After a failed
    /// connect, no connection tries again for `retry_after`.
    fn connect(&self, slot: &mut Slot) -> VfsResult<()> {
        let mut retry = self.retry_at.lock().unwrap_or_else(|e| e.into_inner());
        if retry.is_some_and(|t| Instant::now() < t) {
            return Err(VfsError::Io);
        }
        let r =
            Nfs3::connect(&self.opts.addr, &Auth::sys(0, 0), self.limits()).and_then(|mut c| {
                let root = mount_root(&mut c, &self.opts.addr, &self.opts.path, self.opts.mount_at, self.limits())?;
                Ok((c, root))
            });
        match r {
            Ok((c, root)) => {
                self.stats.connects.fetch_add(1, Ordering::Relaxed);
                self.set_root(root);
                slot.nfs = Some(c);
                *retry = None;
                self.set_state(UP, "remote export connected", None);
                Ok(())
            }
            Err(e) => {
                self.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                *retry = Some(Instant::now() + self.opts.retry_after);
                let what = match e {
                    // It answers but refuses the export: a configuration error.
                    client::Error::Mount { .. } => {
                        "remote refused MOUNT of the export (no such export, or not exported to us)"
                    }
                    client::Error::Invalid(_) => "remote has no MOUNT service we can reach (set the mount's mount_port)",
                    _ => "remote export unreachable",
                };
                self.set_state(DOWN, what, Some(&e.to_string()));
                Err(VfsError::Io)
            }
        }
    }

    /// Run `f` on a connection, connecting first if it has none; a failure
    /// of the connection drops it (the next call reconnects).
    fn call<T>(&self, mut f: impl FnMut(&mut Nfs3) -> client::Result<T>) -> VfsResult<T> {
        let n = self.slots.len();
        if n == 0 {
            return Err(VfsError::Io);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut slot = None;
        for i in 0..n {
            if let Ok(s) = self.slots[(start + i) % n].try_lock() {
                slot = Some(s);
                break;
            }
        }
        let mut slot = match slot {
            Some(s) => s,
            None => self.slots[start % n]
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        };
        if slot.nfs.is_none() {
            self.connect(&mut slot)?;
        }
        let r = f(slot.nfs.as_mut().expect("connected above"));
        match r {
            Ok(v) => Ok(v),
            Err(e) => {
                if e.is_connection() || matches!(e, client::Error::Timeout { .. }) {
                    slot.nfs = None;
                    self.stats.connections_lost.fetch_add(1, Ordering::Relaxed);
                    self.set_state(DOWN, "remote export lost", Some(&e.to_string()));
                }
                self.stats.calls_failed.fetch_add(1, Ordering::Relaxed);
                Err(vfs_error(&e))
            }
        }
    }

    /// FSSTAT on the remote; the figures are kept for reports.
    fn fsstat(&self, fh: &FileHandle) -> VfsResult<FsStat> {
        let r = self.remote(fh)?;
        let s = self.call(|c| c.fsstat(&r))?;
        let st = FsStat {
            total_bytes: s.tbytes,
            free_bytes: s.fbytes,
            avail_bytes: s.abytes,
            total_files: s.tfiles,
            free_files: s.ffiles,
            avail_files: s.afiles,
        };
        *self.fs_seen.lock().unwrap_or_else(|e| e.into_inner()) = Some((st, Instant::now()));
        Ok(st)
    }

    fn getattr_remote(&self, r: &[u8]) -> VfsResult<Attr> {
        let a = self.call(|c| c.getattr(r))?;
        Ok(self.attr(&a))
    }

    fn attr_or_get(&self, r: &[u8], a: Option<Fattr>) -> VfsResult<Attr> {
        match a {
            Some(a) => Ok(self.attr(&a)),
            None => self.getattr_remote(r),
        }
    }

    fn read(&self, r: &[u8], offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)> {
        let mut done = 0usize;
        while done < buf.len() {
            let want = (buf.len() - done).min(IO_CHUNK_BYTES_MAX);
            let at = offset + done as u64;
            let piece = &mut buf[done..done + want];
            let (n, eof) = self.call(|c| {
                let xid = c.submit_read(r, at, want as u32)?;
                let reply = c.rpc().wait(xid)?;
                let got = Nfs3::read_into(&reply, piece);
                c.rpc().recycle(reply);
                got
            })?;
            done += n;
            if eof {
                return Ok((done, true));
            }
            if n == 0 {
                // Neither data nor eof: do not spin on a confused remote.
                return Err(VfsError::Io);
            }
        }
        Ok((done, false))
    }

    fn write(
        &self,
        r: &[u8],
        offset: u64,
        data: &[u8],
        stable: Stability,
    ) -> VfsResult<(usize, Stability, Attr)> {
        let how = if stable == Stability::Unstable {
            Stable::Unstable
        } else {
            Stable::FileSync
        };
        let mut done = 0usize;
        let mut all_stable = true;
        let mut last = None;
        while done < data.len() || (data.is_empty() && last.is_none()) {
            let piece = &data[done..(done + IO_CHUNK_BYTES_MAX).min(data.len())];
            let at = offset + done as u64;
            let (w, a) = self.call(|c| {
                let xid = c.submit_write(r, at, piece, how)?;
                let reply = c.rpc().wait(xid)?;
                let got = Nfs3::written_attr(&reply, piece.len());
                c.rpc().recycle(reply);
                got
            })?;
            *self.verifier.lock().unwrap_or_else(|e| e.into_inner()) = w.verf;
            all_stable &= w.stable;
            last = Some(a);
            done += w.count as usize;
            if (w.count as usize) < piece.len() {
                break; // a short write: report what was written
            }
            if data.is_empty() {
                break;
            }
        }
        let attr = self.attr_or_get(r, last.flatten())?;
        // What the remote achieved, as far as its answer tells: FILE_SYNC
        // when we asked for it (DataSync is sent as FILE_SYNC too), at
        // least DATA_SYNC when it stored an UNSTABLE write stably anyway.
        let committed = match (all_stable, how) {
            (false, _) => Stability::Unstable,
            (true, Stable::FileSync) => Stability::FileSync,
            (true, Stable::Unstable) => Stability::DataSync,
        };
        Ok((done, committed, attr))
    }

    fn commit(&self, r: &[u8]) -> VfsResult<()> {
        let verf = self.call(|c| {
            let xid = c.submit_commit(r)?;
            let reply = c.rpc().wait(xid)?;
            Nfs3::committed(&reply)
        })?;
        *self.verifier.lock().unwrap_or_else(|e| e.into_inner()) = verf;
        Ok(())
    }
}

impl NfsVfs {
    /// Set up the mount; the first connection is made on a worker, so a
    /// remote that is down or slow never holds the server's start (calls
    /// fail with `Io` until it answers; `notify` says why).
    pub fn new(opts: Options, notify: Notify) -> Result<NfsVfs, String> {
        if opts.connections == 0 || opts.connections > CONNECTIONS_MAX {
            return Err(format!(
                "{}: connections must be 1..={CONNECTIONS_MAX}, got {}",
                opts.name, opts.connections
            ));
        }
        let slots = (0..opts.connections)
            .map(|_| Mutex::new(Slot { nfs: None }))
            .collect();
        let (handle_log, map) = match &opts.handle_map {
            Some(p) => {
                let (file, map) = load_handle_map(p).map_err(|e| format!("{}: {e}", opts.name))?;
                (Some((p.clone(), file)), map)
            }
            None => (None, HashMap::new()),
        };
        let pool = IoPool::start(&format!("nfs-{}", opts.name), opts.connections)?;
        let inner = Arc::new(Inner {
            opts,
            slots,
            next: AtomicUsize::new(0),
            retry_at: Mutex::new(None),
            root: RwLock::new(None),
            map: Mutex::new(map),
            handle_log,
            verifier: Mutex::new(random_verifier()),
            state: AtomicU8::new(UNKNOWN),
            notify,
            stats: Stats::default(),
            fs_seen: Mutex::new(None),
            fs_refreshing: AtomicBool::new(false),
        });
        let first = inner.clone();
        pool.run(Box::new(move || {
            let connected = {
                let mut slot = first.slots[0].lock().unwrap_or_else(|e| e.into_inner());
                first.connect(&mut slot).is_ok()
            };
            if connected {
                // The first space figures for reports.
                let root = FileHandle { export_id: first.opts.export_id, ino: ROOT_INO, generation: ROOT_GEN };
                let _ = first.fsstat(&root);
            }
        }));
        Ok(NfsVfs { inner, pool })
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Whether the last connect or call found the remote up.
    pub fn is_up(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) == UP
    }
}

impl Vfs for NfsVfs {
    fn root(&self, export_id: ExportId) -> VfsResult<FileHandle> {
        if export_id != self.inner.opts.export_id {
            return Err(VfsError::Stale);
        }
        Ok(FileHandle {
            export_id,
            ino: ROOT_INO,
            generation: ROOT_GEN,
        })
    }

    fn getattr(&self, fh: &FileHandle) -> VfsResult<Attr> {
        let r = self.inner.remote(fh)?;
        self.inner.getattr_remote(&r)
    }

    fn setattr(
        &self,
        fh: &FileHandle,
        set: &SetAttr,
        guard_ctime: Option<Time>,
    ) -> VfsResult<Attr> {
        let r = self.inner.remote(fh)?;
        let s = RSetAttr {
            mode: set.mode,
            uid: set.uid,
            gid: set.gid,
            size: set.size,
            atime: set_time(set.atime),
            mtime: set_time(set.mtime),
        };
        let guard = guard_ctime.map(|t| (t.sec.clamp(0, u32::MAX as i64) as u32, t.nsec));
        let a = self.inner.call(|c| c.setattr_guarded(&r, &s, guard))?;
        self.inner.attr_or_get(&r, a)
    }

    /// Every metadata call waits on the remote: the protocols run them
    /// whole on this mount's workers (the pool READ, WRITE and COMMIT use),
    /// never on a core.
    fn offload_pool(&self, _fh: &FileHandle) -> Option<&IoPool> {
        Some(&self.pool)
    }

    fn lookup(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<(FileHandle, Attr)> {
        check_name(name)?;
        let d = self.inner.remote(dir)?;
        let (r, a) = self.inner.call(|c| c.lookup(&d, name))?;
        Ok((self.inner.local(&r)?, self.inner.attr_or_get(&r, a)?))
    }

    fn lookup_parent(&self, dir: &FileHandle) -> VfsResult<(FileHandle, Attr)> {
        let d = self.inner.remote(dir)?;
        if (dir.ino, dir.generation) == (ROOT_INO, ROOT_GEN) {
            // Our root is the remote export's root: never above it.
            return Ok((*dir, self.inner.getattr_remote(&d)?));
        }
        let (r, a) = self.inner.call(|c| c.lookup(&d, b".."))?;
        Ok((self.inner.local(&r)?, self.inner.attr_or_get(&r, a)?))
    }

    fn read(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)> {
        let r = self.inner.remote(fh)?;
        self.inner.read(&r, offset, buf)
    }

    fn write(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stability,
    ) -> VfsResult<(usize, Stability, Attr)> {
        let r = self.inner.remote(fh)?;
        self.inner.write(&r, offset, data, stable)
    }

    fn commit(&self, fh: &FileHandle, _offset: u64, _count: u64) -> VfsResult<()> {
        let r = self.inner.remote(fh)?;
        self.inner.commit(&r)
    }

    fn read_start(
        &self,
        fh: &FileHandle,
        offset: u64,
        buf: &mut [u8],
        later: &mut dyn Later,
    ) -> VfsResult<Option<(usize, bool)>> {
        let r = self.inner.remote(fh)?;
        let Some(done) = later.park() else {
            return self.inner.read(&r, offset, buf).map(Some);
        };
        let (inner, len) = (self.inner.clone(), buf.len());
        self.pool
            .run(vfs::iopool::read_job(len, done, move |buf| inner.read(&r, offset, buf)));
        Ok(None)
    }

    fn write_start(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stability,
        later: &mut dyn Later,
    ) -> VfsResult<Option<(usize, Stability, Attr)>> {
        let r = self.inner.remote(fh)?;
        let Some(done) = later.park() else {
            return self.inner.write(&r, offset, data, stable).map(Some);
        };
        let (inner, data) = (self.inner.clone(), data.to_vec());
        self.pool.run(Box::new(move || {
            let res = inner
                .write(&r, offset, &data, stable)
                .map(|(count, committed, attr)| IoDone::Write {
                    count,
                    committed,
                    attr,
                });
            done(res)
        }));
        Ok(None)
    }

    fn commit_start(
        &self,
        fh: &FileHandle,
        _offset: u64,
        _count: u64,
        later: &mut dyn Later,
    ) -> VfsResult<Option<()>> {
        let r = self.inner.remote(fh)?;
        let Some(done) = later.park() else {
            return self.inner.commit(&r).map(Some);
        };
        let inner = self.inner.clone();
        self.pool.run(Box::new(move || {
            done(inner.commit(&r).map(|()| IoDone::Commit))
        }));
        Ok(None)
    }

    fn write_verifier(&self) -> [u8; 8] {
        *self
            .inner
            .verifier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
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
        check_name(name)?;
        let d = self.inner.remote(dir)?;
        let mode = mode & 0o7777;
        let r = match (kind, how) {
            (NodeKind::File, CreateMode::Unchecked) => {
                self.inner.call(|c| c.create(&d, name, mode, false))?
            }
            (NodeKind::File, CreateMode::Guarded) => {
                self.inner.call(|c| c.create(&d, name, mode, true))?
            }
            (NodeKind::File, CreateMode::Exclusive(verf)) => {
                match self.inner.call(|c| c.create_exclusive(&d, name, verf)) {
                    // The name exists with another verifier (RFC 1813 §3.3.8).
                    Err(VfsError::Exist) => return Err(VfsError::ExistVerifierMismatch),
                    other => other?,
                }
            }
            (NodeKind::Directory, _) => self.inner.call(|c| c.mkdir(&d, name, mode))?,
            (NodeKind::Symlink { target }, _) => {
                self.inner.call(|c| c.symlink(&d, name, target))?
            }
            (NodeKind::Device { .. }, _) => return Err(VfsError::NotSupported),
        };
        let fh = self.inner.local(&r)?;
        // We call the remote as root: the caller becomes the owner, as in
        // a local backend. An exclusive create leaves its times (they hold
        // the verifier) and mode for the SETATTR that follows it.
        let exclusive = matches!(how, CreateMode::Exclusive(_));
        let set = RSetAttr {
            uid: (cred.uid != 0).then_some(cred.uid),
            gid: (cred.gid != 0).then_some(cred.gid),
            mode: (matches!(kind, NodeKind::Symlink { .. }) && !exclusive).then_some(mode),
            ..Default::default()
        };
        let a = if set != RSetAttr::default() {
            self.inner.call(|c| c.setattr(&r, &set))?
        } else {
            None
        };
        Ok((fh, self.inner.attr_or_get(&r, a)?))
    }

    fn remove(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        check_name(name)?;
        let d = self.inner.remote(dir)?;
        self.inner.call(|c| c.remove(&d, name))
    }

    fn rmdir(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        check_name(name)?;
        let d = self.inner.remote(dir)?;
        self.inner.call(|c| c.rmdir(&d, name))
    }

    fn rename(
        &self,
        from_dir: &FileHandle,
        from_name: &[u8],
        to_dir: &FileHandle,
        to_name: &[u8],
    ) -> VfsResult<()> {
        check_name(from_name)?;
        check_name(to_name)?;
        let (f, t) = (self.inner.remote(from_dir)?, self.inner.remote(to_dir)?);
        self.inner.call(|c| c.rename(&f, from_name, &t, to_name))
    }

    fn link(&self, fh: &FileHandle, dir: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        check_name(name)?;
        let (r, d) = (self.inner.remote(fh)?, self.inner.remote(dir)?);
        let a = self.inner.call(|c| c.link(&r, &d, name))?;
        self.inner.attr_or_get(&r, a)
    }

    fn readlink(&self, fh: &FileHandle) -> VfsResult<Vec<u8>> {
        let r = self.inner.remote(fh)?;
        self.inner.call(|c| c.readlink(&r))
    }

    fn readdir(
        &self,
        dir: &FileHandle,
        cookie: u64,
        visit: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> VfsResult<bool> {
        let d = self.inner.remote(dir)?;
        let mut cookie = cookie;
        loop {
            // One page at a time, visited without holding a connection.
            let (page, _verf, eof) = self
                .inner
                .call(|c| c.readdirplus(&d, cookie, [0; 8], READDIR_BYTES))?;
            for e in &page {
                cookie = e.cookie;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let r = match &e.fh {
                    Some(r) => r.clone(),
                    None => self.inner.call(|c| c.lookup(&d, &e.name))?.0,
                };
                let attr = self.inner.attr_or_get(&r, e.attr.clone())?;
                let fh = self.inner.local(&r)?;
                if !visit(DirEntry {
                    cookie: e.cookie,
                    name: &e.name,
                    fh,
                    attr,
                }) {
                    return Ok(false);
                }
            }
            if eof {
                return Ok(true);
            }
            if page.is_empty() {
                // Not at the end, yet nothing fits: a confused remote.
                return Err(VfsError::Io);
            }
        }
    }

    fn cookie_verifier(&self, dir: &FileHandle) -> VfsResult<[u8; 8]> {
        self.inner.remote(dir)?;
        Ok([0; 8])
    }

    fn fsstat(&self, fh: &FileHandle) -> VfsResult<FsStat> {
        self.inner.fsstat(fh)
    }

    /// The figures the remote last gave (any FSSTAT through this mount, or
    /// a refresh); older than `FSSTAT_REFRESH`, one refresh is queued on
    /// the mount's workers (never run here: a stalled remote must not hold
    /// a scrape). `None` until the remote has answered one.
    fn fsstat_now(&self, fh: &FileHandle) -> Option<FsStat> {
        if fh.export_id != self.inner.opts.export_id {
            return None;
        }
        let seen = *self.inner.fs_seen.lock().unwrap_or_else(|e| e.into_inner());
        let stale = seen.is_none_or(|(_, at)| at.elapsed() >= FSSTAT_REFRESH);
        if stale && !self.inner.fs_refreshing.swap(true, Ordering::AcqRel) {
            let inner = self.inner.clone();
            let fh = *fh;
            let queued = self.pool.try_run(Box::new(move || {
                let _ = inner.fsstat(&fh);
                inner.fs_refreshing.store(false, Ordering::Release);
            }));
            if !queued {
                self.inner.fs_refreshing.store(false, Ordering::Release);
            }
        }
        seen.map(|(s, _)| s)
    }

    /// Quotas are the remote's business: it cannot be asked over NFSv3.
    fn set_quota(&self, _dir: &FileHandle, _capacity_bytes: u64) -> VfsResult<()> {
        Err(VfsError::NotSupported)
    }

    fn quota(&self, fh: &FileHandle) -> VfsResult<Option<QuotaUsage>> {
        self.inner.remote(fh)?;
        Ok(None)
    }

    /// No volumes here (quotas are the remote's), so no call goes out.
    fn volume_of(&self, _fh: &FileHandle) -> VfsResult<Option<vfs::Ino>> {
        Ok(None)
    }

    fn remove_tree(&self, _dir: &FileHandle, _name: &[u8]) -> VfsResult<()> {
        Err(VfsError::NotSupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_nfs3_error_has_its_meaning() {
        let cases = [
            (1, VfsError::Perm),
            (2, VfsError::NoEnt),
            (5, VfsError::Io),
            (13, VfsError::Access),
            (17, VfsError::Exist),
            (20, VfsError::NotDir),
            (21, VfsError::IsDir),
            (27, VfsError::FileTooBig),
            (28, VfsError::NoSpace),
            (30, VfsError::ReadOnly),
            (63, VfsError::NameTooLong),
            (66, VfsError::NotEmpty),
            (69, VfsError::QuotaExceeded),
            (70, VfsError::Stale),
            (10001, VfsError::Stale),
            (10002, VfsError::NotSync),
            (10004, VfsError::NotSupported),
            (10008, VfsError::Io),
            (424242, VfsError::Io),
        ];
        for (code, want) in cases {
            assert_eq!(nfs3_error(code), want, "nfsstat3 {code}");
        }
        assert_eq!(vfs_error(&client::Error::Closed), VfsError::Io);
    }

    fn inner_with_root(root: &[u8]) -> Inner {
        Inner {
            opts: Options {
                name: "t".into(),
                export_id: 3,
                addr: "127.0.0.1:1".into(),
                path: "/x".into(),
                connections: 1,
                timeout: Duration::from_secs(1),
                retry_after: Duration::from_secs(1),
                mount_at: Default::default(),
                handle_map: None,
            },
            slots: vec![],
            next: AtomicUsize::new(0),
            root: RwLock::new(Some(root.to_vec())),
            map: Mutex::new(HashMap::new()),
            handle_log: None,
            verifier: Mutex::new([0; 8]),
            retry_at: Mutex::new(None),
            state: AtomicU8::new(UP),
            notify: Arc::new(|_, _| {}),
            stats: Stats::default(),
            fs_seen: Mutex::new(None),
            fs_refreshing: AtomicBool::new(false),
        }
    }

    /// Compact handles round-trip without the map, mapped ones through it;
    /// handles that name nothing are `Stale`, another export's too.
    #[test]
    fn handles_compact_mapped_and_forged() {
        let root = [
            1, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1,
        ];
        let i = inner_with_root(&root);
        let rootfh = i.local(&root).unwrap();
        assert_eq!((rootfh.ino, rootfh.generation), (ROOT_INO, ROOT_GEN));
        assert_eq!(i.remote(&rootfh).unwrap(), root);

        let mut child = root;
        child[15] = 42;
        child[23] = 5;
        let fh = i.local(&child).unwrap();
        assert_eq!((fh.ino, fh.generation), (42, 5));
        assert_eq!(i.remote(&fh).unwrap(), child);
        assert!(
            i.map.lock().unwrap().is_empty(),
            "compact handles need no map"
        );

        for other in [&b"a handle of another shape"[..], &[9u8; 64][..], &[][..]] {
            let fh = i.local(other).unwrap();
            assert!(fh.generation & MAPPED != 0);
            assert_eq!(i.remote(&fh).unwrap(), other);
            assert_eq!(
                i.local(other).unwrap(),
                fh,
                "the same remote handle maps to the same local one"
            );
        }
        let forged = FileHandle {
            export_id: 3,
            ino: 1,
            generation: MAPPED | 99,
        };
        assert_eq!(i.remote(&forged), Err(VfsError::Stale));
        let foreign = FileHandle {
            export_id: 4,
            ino: 42,
            generation: 5,
        };
        assert_eq!(i.remote(&foreign), Err(VfsError::Stale));

        // A remote whose root handle is short: everything is mapped.
        let j = inner_with_root(b"short");
        let fh = j.local(b"child").unwrap();
        assert_eq!(j.remote(&fh).unwrap(), b"child");
        let compact = FileHandle {
            export_id: 3,
            ino: 1,
            generation: 2,
        };
        assert_eq!(j.remote(&compact), Err(VfsError::Stale));
    }

    #[test]
    fn never_mounted_is_io_not_a_panic() {
        let i = inner_with_root(b"");
        *i.root.write().unwrap() = None;
        let fh = FileHandle {
            export_id: 3,
            ino: ROOT_INO,
            generation: ROOT_GEN,
        };
        assert_eq!(i.remote(&fh), Err(VfsError::Io));
        assert_eq!(i.local(b"x"), Err(VfsError::Io));
    }

    fn with_handle_map(root: &[u8], path: &std::path::Path) -> Inner {
        let mut i = inner_with_root(root);
        let (file, map) = load_handle_map(path).unwrap();
        i.handle_log = Some((path.to_path_buf(), file));
        i.map = Mutex::new(map);
        i
    }

    fn temp_map(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("nfsvfs-{name}-{}.map", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// With a handle map, mapped handles survive a restart (a new `Inner`
    /// reading the file back); without one they do not. A torn last record
    /// is cut off; a damaged record refuses the start, naming its offset.
    #[test]
    fn mapped_handles_survive_a_restart_through_the_handle_map() {
        let root = b"a root handle of a remote with its own handle shape";
        let path = temp_map("survive");
        let remotes: Vec<Vec<u8>> = (0..50u8).map(|k| vec![k; 20 + k as usize % 40]).collect();
        let fhs: Vec<FileHandle> = {
            let i = with_handle_map(root, &path);
            remotes.iter().map(|r| i.local(r).unwrap()).collect()
        };
        assert!(fhs.iter().all(|f| f.generation & MAPPED != 0), "none has the compact form");
        // The same remote handle again appends nothing.
        let len = std::fs::metadata(&path).unwrap().len();
        {
            let i = with_handle_map(root, &path);
            assert_eq!(i.local(&remotes[3]).unwrap(), fhs[3]);
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "a known handle is not logged twice");
        let expect: u64 = remotes.iter().map(|r| (HANDLE_REC_HEAD + r.len()) as u64).sum();
        assert_eq!(len, expect);
        // "Restarted": every handle a client holds resolves again.
        let i = with_handle_map(root, &path);
        for (fh, r) in fhs.iter().zip(&remotes) {
            assert_eq!(&i.remote(fh).unwrap(), r);
        }
        // Without the file they are stale after a restart (the old way).
        let j = inner_with_root(root);
        assert_eq!(j.remote(&fhs[0]), Err(VfsError::Stale));
        drop(i);

        // A crash in the middle of an append: the short record goes.
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
            let rec = handle_record(mapped_key(b"half written"), b"half written");
            f.write_all(&rec[..rec.len() - 3]).unwrap();
        }
        let i = with_handle_map(root, &path);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "the torn record was cut off");
        assert_eq!(i.remote(&fhs[49]).unwrap(), remotes[49]);
        let fresh = i.local(b"after the cut").unwrap();
        drop(i);
        let i = with_handle_map(root, &path);
        assert_eq!(i.remote(&fresh).unwrap(), b"after the cut");
        drop(i);

        // A flipped bit in a handle: the record no longer checks.
        let mut bytes = std::fs::read(&path).unwrap();
        let second = HANDLE_REC_HEAD + remotes[0].len();
        bytes[second + HANDLE_REC_HEAD + 2] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let e = load_handle_map(&path).unwrap_err();
        assert!(e.contains(&format!("offset {second}")) && e.contains(&path.display().to_string()), "{e}");
        // A length beyond any NFSv3 handle, also.
        bytes[second + HANDLE_REC_HEAD + 2] ^= 0x10;
        bytes[second] = 200;
        std::fs::write(&path, &bytes).unwrap();
        assert!(load_handle_map(&path).unwrap_err().contains(&format!("offset {second}")));
        let _ = std::fs::remove_file(&path);

        // A handle map that cannot be opened is a start-up error naming it.
        let e = load_handle_map(std::path::Path::new("/nonexistent-dir/x.map")).unwrap_err();
        assert!(e.contains("/nonexistent-dir/x.map"), "{e}");
    }
}
