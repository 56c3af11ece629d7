//! fio's external engine over the userspace NFS client (README.md).
//!
//! One `Engine` per fio job (fio runs each job in its own process or
//! thread, so nothing here is shared): `conns` NFSv3 connections to one
//! server, the export mounted once, files opened by path. `queue` submits a
//! READ, WRITE or COMMIT on the next connection round-robin and returns at
//! once; `reap` polls every connection's socket with one poll(2) and hands
//! back (tag, result) pairs as replies arrive, in any order. READ data is
//! copied straight from the reply into fio's buffer; reply buffers are
//! recycled, so a warm engine allocates nothing per I/O.
//!
//! WRITEs go UNSTABLE (as the kernel client and libnfs send them); fio's
//! fsync (and a file's close) sends COMMIT. fio reuses its buffers once an
//! I/O is reaped, so the engine keeps a copy of each answered UNSTABLE
//! write until a COMMIT with the same write verifier covers it (`Held`,
//! up to `hold_mib`; at the bound the engine COMMITs every file itself
//! first). A COMMIT whose verifier differs from a write's (the server
//! restarted and may have dropped it) makes the engine send those writes
//! again from its copies and COMMIT again, so fio sees no error; with
//! `hold_mib` 0 nothing is kept and such a COMMIT fails with EIO naming
//! the file.
//!
//! I/Os in flight on a connection that is lost (a server restarting, a
//! network blip) are not failed: they wait, their buffers still fio's and
//! untouched, while the engine reconnects (backing off from 50 ms to 1 s)
//! and then go out again — for up to `retry_s` seconds from the loss,
//! after which they fail with EIO naming the server.

pub mod capi;
mod pnfs;

use client::nfs3::{self, Nfs3, Stable};
use client::{Auth, Completion, Error, Limits, RpcConn, XidMap};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Largest READ or WRITE one I/O may carry (chimerad's rsize/wsize).
pub const IO_BYTES_MAX: usize = 1 << 20;
/// Longest busy poll `busy_poll_us` accepts (1 ms).
pub const BUSY_POLL_US_MAX: u32 = 1000;
/// Connections per job the `conns` option accepts.
pub const CONNS_MAX: usize = 64;
/// I/O failures logged per engine; later ones are counted, not printed.
const ERRORS_LOGGED_MAX: u32 = 16;
/// The message of `queue`'s EAGAIN (back-pressure; fio never shows it).
pub(crate) const BUSY: &str = "busy: the send queue is full; reap first";

/// What one job connects to (fio's engine options).
#[derive(Debug, Clone)]
pub struct Config {
    /// `host:port` of the NFS server (port 2049 when left out).
    pub server: String,
    /// The export MOUNT asks for, e.g. `/memfs`.
    pub export: String,
    /// MOUNT's port when the server does not serve it on its NFS port
    /// (0: the NFS connection).
    pub mount_port: u16,
    /// TCP connections to the server; I/Os spread round-robin.
    pub conns: usize,
    /// fio's iodepth: calls in flight the connections must admit together.
    pub iodepth: usize,
    pub uid: u32,
    pub gid: u32,
    /// NFSv4.1 to the server as a pNFS metadata server, I/O straight to the
    /// data servers its flex-files layouts name (pnfs.rs); false: NFSv3.
    pub pnfs: bool,
    /// Before sleeping in poll(2) for replies, poll without sleeping for
    /// this many microseconds (0: never): trades client CPU for latency.
    pub busy_poll_us: u32,
    /// How long I/Os of a lost connection wait for a reconnect before they
    /// fail (0: fail at once).
    pub retry_s: u32,
    /// MiB of answered UNSTABLE writes kept for resending after a server
    /// restart (0: none; a restart then fails the next COMMIT with EIO).
    pub hold_mib: u32,
    /// RPC-over-RDMA to the server (`server` is its RDMA listener, port
    /// 20049 when left out) instead of TCP.
    pub rdma: bool,
}

/// Largest `hold_mib` accepted (4 GiB).
pub const HOLD_MIB_MAX: u32 = 4096;
/// The default `hold_mib`.
pub const HOLD_MIB_DEFAULT: u32 = 16;
/// Rounds of resend + COMMIT one COMMIT tries while the verifier keeps
/// changing (a server restarting again and again) before it fails.
const RESEND_ROUNDS_MAX: usize = 3;

/// Longest `retry_s` accepts (one hour).
pub const RETRY_S_MAX: u32 = 3600;
/// The default `retry_s`: longer than a data server's restart and its
/// recovery, shorter than an operator's patience.
pub const RETRY_S_DEFAULT: u32 = 60;
/// First and longest pause between reconnect attempts.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

impl Config {
    /// Check the options before any connection: each error names the option.
    pub fn validate(&self) -> Result<(), String> {
        if self.server.is_empty() {
            return Err("chimera_server is required (host or host:port of the NFS server)".into());
        }
        if !self.export.starts_with('/') {
            return Err(format!("chimera_export '{}' must be an absolute export path such as /memfs", self.export));
        }
        if self.busy_poll_us > BUSY_POLL_US_MAX {
            return Err(format!("chimera_busy_poll_us {} is over {BUSY_POLL_US_MAX}", self.busy_poll_us));
        }
        if self.conns == 0 || self.conns > CONNS_MAX {
            return Err(format!("chimera_conns {} is out of range 1..={CONNS_MAX}", self.conns));
        }
        if self.retry_s > RETRY_S_MAX {
            return Err(format!("chimera_retry_s {} is over {RETRY_S_MAX}", self.retry_s));
        }
        if self.hold_mib > HOLD_MIB_MAX {
            return Err(format!("chimera_hold_mib {} is over {HOLD_MIB_MAX}", self.hold_mib));
        }
        Ok(())
    }

    /// `server` with the NFS port filled in (20049, NFS over RDMA's, with
    /// `rdma`).
    pub fn nfs_addr(&self) -> String {
        with_port(&self.server, if self.rdma { 20049 } else { 2049 })
    }

    /// A connection to `addr` over the configured transport.
    pub(crate) fn rpc_connect(&self, addr: &str, auth: &Auth, limits: Limits) -> client::Result<RpcConn> {
        if self.rdma {
            RpcConn::connect_rdma(addr, auth, limits)
        } else {
            RpcConn::connect(addr, auth, limits)
        }
    }
}

/// `chimera_transport`'s value as `Config::rdma`.
pub fn parse_transport(v: &str) -> Result<bool, String> {
    match v {
        "" | "tcp" => Ok(false),
        "rdma" => Ok(true),
        other => Err(format!("chimera_transport '{other}' is neither tcp nor rdma")),
    }
}

fn with_port(server: &str, port: u16) -> String {
    let host_only = if server.starts_with('[') { !server.contains("]:") } else { server.matches(':').count() != 1 };
    if host_only {
        if server.contains(':') && !server.starts_with('[') {
            format!("[{server}]:{port}")
        } else {
            format!("{server}:{port}")
        }
    } else {
        server.to_string()
    }
}

fn host_of(server: &str) -> String {
    let a = with_port(server, 2049);
    a.rsplit_once(':').map(|(h, _)| h.to_string()).unwrap_or(a)
}

/// What an I/O does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    /// COMMIT the whole file (fio's fsync / fdatasync).
    Sync,
}

struct InFlight {
    tag: u64,
    op: Op,
    file: u32,
    offset: u64,
    buf: *mut u8,
    len: usize,
    /// pNFS: the I/O this data-server call is part of (`NO_IO`: the call
    /// is the whole I/O).
    io: u32,
    /// A COMMIT: the last held write it covers (`Held::seq` when sent).
    seq: u64,
}

/// Copies of answered UNSTABLE writes not yet covered by a COMMIT of the
/// same verifier, all files together, in the order they were answered:
/// one byte arena (appended to; entries a COMMIT covered are dead until
/// the arena is compacted or emptied) and its entries. Both keep their
/// capacity, so a warm engine allocates nothing to hold a write.
#[derive(Default)]
struct Held {
    arena: Vec<u8>,
    entries: Vec<HeldWrite>,
    /// Bytes of dead entries still in the arena.
    dead: usize,
    /// Writes answered so far (the last entry's `seq`).
    seq: u64,
    /// The bound (`hold_mib`), bytes.
    max: usize,
    /// Writes and bytes sent again after a verifier change.
    resent: (u64, u64),
}

struct HeldWrite {
    file: u32,
    /// pNFS mode: the data-server connection it was answered on (the
    /// file's data file there), or `MDS_HELD` through the metadata server;
    /// `NO_CONN` in NFSv3 mode.
    conn: u32,
    offset: u64,
    len: u32,
    /// Where its bytes are in the arena.
    at: usize,
    verf: [u8; 8],
    seq: u64,
    live: bool,
}

/// `Engine::pfd_conn` of the metadata server's connection (pNFS mode).
const MDS_PFD: usize = usize::MAX;

/// `HeldWrite::conn` of NFSv3 mode.
const NO_CONN: u32 = u32::MAX;

/// `HeldWrite::conn` of a write through the metadata server (pNFS mode).
const MDS_HELD: u32 = u32::MAX - 1;

/// Where held writes are sent again (`Engine::resend_rounds`).
struct ResendTo<'a> {
    /// The connection; `None`: any that works (NFSv3 mode).
    conn: Option<usize>,
    /// Their `HeldWrite::conn`.
    held: u32,
    /// The file's handle there.
    fh: &'a [u8],
    /// The server, for messages.
    server: &'a str,
}

impl Held {
    fn live_bytes(&self) -> usize {
        self.arena.len() - self.dead
    }

    fn add(&mut self, file: u32, conn: u32, offset: u64, data: &[u8], verf: [u8; 8]) {
        self.seq += 1;
        let at = self.arena.len();
        self.arena.extend_from_slice(data);
        self.entries.push(HeldWrite { file, conn, offset, len: data.len() as u32, at, verf, seq: self.seq, live: true });
    }

    /// `file`'s live writes (on `conn`) answered up to `upto` whose
    /// verifier is not `verf` (indices into `entries`).
    fn stale(&self, file: u32, conn: u32, upto: u64, verf: [u8; 8], out: &mut Vec<usize>) {
        out.clear();
        out.extend(
            self.entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.live && e.file == file && e.conn == conn && e.seq <= upto && e.verf != verf)
                .map(|(i, _)| i),
        );
    }

    /// A COMMIT covered `file`'s writes answered up to `upto`: drop them.
    fn covered(&mut self, file: u32, upto: u64) {
        self.covered_on(file, None, upto)
    }

    /// As `covered`, only those answered on `conn` when given.
    fn covered_on(&mut self, file: u32, conn: Option<u32>, upto: u64) {
        for e in self.entries.iter_mut().filter(|e| e.live && e.file == file && conn.is_none_or(|c| e.conn == c) && e.seq <= upto) {
            e.live = false;
            self.dead += e.len as usize;
        }
        if self.dead == self.arena.len() {
            self.arena.clear();
            self.entries.clear();
            self.dead = 0;
        } else if self.dead > self.arena.len() / 2 {
            self.compact();
        }
    }

    /// Move the live entries' bytes to the front, in order.
    fn compact(&mut self) {
        let mut to = 0;
        for e in self.entries.iter_mut().filter(|e| e.live) {
            self.arena.copy_within(e.at..e.at + e.len as usize, to);
            e.at = to;
            to += e.len as usize;
        }
        self.arena.truncate(to);
        self.entries.retain(|e| e.live);
        self.dead = 0;
    }

    /// Whether `len` more bytes fit under the bound, compacting the arena
    /// when that is what makes them fit.
    fn has_room(&mut self, len: usize) -> bool {
        if self.arena.len() + len <= self.max {
            return true;
        }
        if self.dead >= len {
            self.compact();
        }
        self.arena.len() + len <= self.max
    }

    fn holds(&self, file: u32) -> bool {
        self.entries.iter().any(|e| e.live && e.file == file)
    }

    fn holds_on(&self, file: u32, conn: u32) -> bool {
        self.entries.iter().any(|e| e.live && e.file == file && e.conn == conn)
    }

    /// Files with live entries, once each.
    fn files(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.entries.iter().filter(|e| e.live).map(|e| e.file).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

const NO_IO: u32 = u32::MAX;

struct File {
    path: String,
    fh: Vec<u8>,
    /// Verifier of the first UNSTABLE write since the last COMMIT (pNFS
    /// mode: of writes through the metadata server; a data server's are
    /// on its `Written`).
    unstable_verf: Option<[u8; 8]>,
    /// Two UNSTABLE writes since the last COMMIT carried different
    /// verifiers: the server restarted between them.
    verf_changed: bool,
    /// An UNSTABLE write was answered that `Held` does not hold (holding
    /// is off, or the bound was reached while no COMMIT could be made):
    /// a changed verifier cannot be repaired until the next COMMIT.
    unheld: bool,
    /// A COMMIT the engine made itself (at the `Held` bound) found writes
    /// lost; the file's next fsync reports it.
    lost: Option<String>,
    /// pNFS: the open, the layout segments held, what was written where.
    pnfs: Option<pnfs::FileLayouts>,
}

impl File {
    /// A COMMIT answered `verf`: whether the server restarted since the
    /// UNSTABLE writes it covers (a verifier changed), and whether any of
    /// them was not held; the file's unstable state starts over.
    fn take_unstable(&mut self, verf: [u8; 8]) -> (bool, bool) {
        let changed = self.verf_changed || self.unstable_verf.is_some_and(|v| v != verf);
        let unheld = self.unheld;
        self.unstable_verf = None;
        self.verf_changed = false;
        self.unheld = false;
        (changed, unheld)
    }
}

struct Conn {
    nfs: Nfs3,
    ops: XidMap<InFlight>,
    /// Calls queued since the last send (corked: they leave together).
    unsent: usize,
    /// The loss has been logged (once per connection).
    loss_logged: bool,
    /// Where it connects, as whom (for messages and reconnects).
    addr: String,
    auth: Auth,
    /// pNFS: the data server (device) it reaches.
    device: Option<[u8; 16]>,
}

/// One job's client: see the module comment.
pub struct Engine {
    cfg: Config,
    auth: Auth,
    limits: Limits,
    conns: Vec<Conn>,
    /// The export's root handle (MOUNT at connect).
    root: Vec<u8>,
    files: Vec<Option<File>>,
    next_conn: usize,
    in_flight: usize,
    completions: Vec<Completion>,
    ready: VecDeque<(u64, i64)>,
    pfds: Vec<libc::pollfd>,
    pfd_conn: Vec<usize>,
    errors: u64,
    /// pNFS mode: the MDS session and the I/Os spread over data servers.
    pnfs: Option<pnfs::State>,
    /// Poll without sleeping this long before blocking (`busy_poll_us`).
    busy_poll: Duration,
    /// NFSv3 I/Os of lost connections, waiting to go out again.
    retry: VecDeque<InFlight>,
    /// Since when they wait, when to try to reconnect next, and the pause
    /// after that.
    retry_since: Option<Instant>,
    retry_at: Instant,
    retry_pause: Duration,
    /// NFSv3 mode: copies of answered UNSTABLE writes (`Held`).
    held: Held,
    stale: Vec<usize>,
    /// Calls queued on a connection that `commit` sends together.
    send_batch: usize,
}

// The buffers in flight belong to fio, which keeps them alive and
// untouched until their completion is reaped; an engine lives on one thread
// at a time.
unsafe impl Send for Engine {}

impl Engine {
    /// Connect `conns` times and mount the export (on the first connection,
    /// or at `mount_port`). Errors name the server, the export and why.
    pub fn connect(cfg: Config) -> Result<Engine, String> {
        cfg.validate()?;
        let auth = Auth::Sys { machine: "chimera-fio".into(), uid: cfg.uid, gid: cfg.gid, gids: Vec::new() };
        let per_conn = cfg.iodepth.div_ceil(cfg.conns).max(1);
        let limits = Limits { in_flight_max: per_conn.max(Limits::default().in_flight_max), ..Limits::default() };
        let addr = cfg.nfs_addr();
        let mut conns = Vec::with_capacity(cfg.conns);
        // pNFS: the connections are to the data servers, made as layouts
        // name them.
        for i in 0..if cfg.pnfs { 0 } else { cfg.conns } {
            conns.push(Self::new_conn(&cfg, &addr, &auth, limits).map_err(|e| format!("connection {} to {addr}: {e}", i + 1))?);
        }
        let pnfs = if cfg.pnfs { Some(pnfs::State::connect(&cfg, &auth, limits)?) } else { None };
        let mut e = Engine {
            conns,
            auth,
            limits,
            root: Vec::new(),
            files: Vec::new(),
            next_conn: 0,
            in_flight: 0,
            completions: Vec::with_capacity(cfg.iodepth.max(1)),
            ready: VecDeque::with_capacity(cfg.iodepth.max(1)),
            pfds: Vec::with_capacity(cfg.conns),
            pfd_conn: Vec::with_capacity(cfg.conns),
            errors: 0,
            pnfs,
            busy_poll: Duration::from_micros(cfg.busy_poll_us as u64),
            retry: VecDeque::new(),
            retry_since: None,
            retry_at: Instant::now(),
            retry_pause: RETRY_FIRST,
            held: Held { max: (cfg.hold_mib as usize) << 20, ..Default::default() },
            stale: Vec::new(),
            send_batch: per_conn.div_ceil(2),
            cfg,
        };
        if e.pnfs.is_none() {
            e.root = e.mount()?;
        }
        Ok(e)
    }

    fn new_conn(cfg: &Config, addr: &str, auth: &Auth, limits: Limits) -> client::Result<Conn> {
        let mut nfs = Nfs3::over(cfg.rpc_connect(addr, auth, limits)?);
        // fio queues a batch, then commits it: one send per batch.
        nfs.rpc().set_corked(true);
        Ok(Conn {
            nfs,
            ops: XidMap::with_capacity_and_hasher(64, Default::default()),
            unsent: 0,
            loss_logged: false,
            addr: addr.to_string(),
            auth: auth.clone(),
            device: None,
        })
    }

    fn mount(&mut self) -> Result<Vec<u8>, String> {
        let export = self.cfg.export.clone();
        let r = if self.cfg.mount_port == 0 {
            self.conns[0].nfs.mount(&export)
        } else {
            let at = with_port(&host_of(&self.cfg.server), self.cfg.mount_port);
            nfs3::mount_at(&at, &export, &self.auth, self.limits)
        };
        r.map_err(|e| format!("MOUNT of export {export} on {}: {e}", self.cfg.server))
    }

    /// Open `path` (relative to the export; `/` separates directories).
    /// With `create`, missing directories and the file are created (an
    /// existing file is reused). Returns the file's index for `queue`.
    pub fn open(&mut self, path: &str, create: bool) -> Result<u32, (i32, String)> {
        if self.pnfs.is_some() {
            let f = self.pnfs_open(path, create)?;
            return Ok(self.add_file(f));
        }
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
        let Some((name, dirs)) = parts.split_last() else {
            return Err((libc::EINVAL, format!("file name '{path}' names no file")));
        };
        if parts.contains(&"..") {
            return Err((libc::EINVAL, format!("file name '{path}' leaves the export ('..')")));
        }
        let c = &mut self.conns[0].nfs;
        let fail = |what: &str, e: Error| (e.errno(), format!("{what} {path} in export {}: {e}", self.cfg.export));
        let mut dir = self.root.clone();
        for d in dirs {
            dir = match c.lookup(&dir, d.as_bytes()) {
                Ok((fh, _)) => fh,
                Err(e) if create && e.errno() == libc::ENOENT => match c.mkdir(&dir, d.as_bytes(), 0o755) {
                    Ok(fh) => fh,
                    // Another job made it meanwhile.
                    Err(e) if e.errno() == libc::EEXIST => c.lookup(&dir, d.as_bytes()).map_err(|e| fail("looking up", e))?.0,
                    Err(e) => return Err(fail("creating a directory for", e)),
                },
                Err(e) => return Err(fail("looking up", e)),
            };
        }
        let fh = match c.lookup(&dir, name.as_bytes()) {
            Ok((fh, _)) => fh,
            Err(e) if create && e.errno() == libc::ENOENT => {
                c.create(&dir, name.as_bytes(), 0o644, false).map_err(|e| fail("creating", e))?
            }
            Err(e) => return Err(fail("opening", e)),
        };
        let f = File { path: path.to_string(), fh, unstable_verf: None, verf_changed: false, unheld: false, lost: None, pnfs: None };
        Ok(self.add_file(f))
    }

    fn add_file(&mut self, f: File) -> u32 {
        let idx = match self.files.iter().position(Option::is_none) {
            Some(i) => {
                self.files[i] = Some(f);
                i
            }
            None => {
                self.files.push(Some(f));
                self.files.len() - 1
            }
        };
        idx as u32
    }

    /// COMMIT what is unstable (checking verifiers) and forget the file.
    pub fn close(&mut self, file: u32) -> Result<(), (i32, String)> {
        let Some(Some(f)) = self.files.get(file as usize) else {
            return Err((libc::EBADF, format!("file {file} is not open")));
        };
        if f.pnfs.is_some() {
            let r = self.pnfs_close(file);
            self.held.covered(file, u64::MAX);
            self.files[file as usize] = None;
            return r;
        }
        let r = if f.unstable_verf.is_some() || self.held.holds(file) {
            self.commit_now(file, "at close")
        } else {
            Ok(())
        };
        self.held.covered(file, u64::MAX);
        self.files[file as usize] = None;
        r
    }

    /// COMMIT `file` and wait (on a connection that works, reconnecting
    /// one if none does), then settle its held writes.
    fn commit_now(&mut self, file: u32, when: &str) -> Result<(), (i32, String)> {
        let f = self.files[file as usize].as_ref().expect("open");
        let (fh, path) = (f.fh.clone(), f.path.clone());
        let upto = self.held.seq;
        let i = self.usable_conn().map_err(|m| (libc::EIO, format!("COMMIT of {path} {when}: {m}")))?;
        let c = &mut self.conns[i].nfs;
        let verf = c
            .submit_commit(&fh)
            .and_then(|x| c.rpc().wait(x))
            .and_then(|r| Nfs3::committed(&r))
            .map_err(|e| (e.errno(), format!("COMMIT of {path} {when}: {e}")))?;
        self.check_commit(file, verf, upto)
    }

    /// A connection with no loss pending, reconnecting the first if needed.
    fn usable_conn(&mut self) -> Result<usize, String> {
        if let Some(i) = self.conns.iter_mut().position(|c| c.nfs.rpc().broken().is_none()) {
            return Ok(i);
        }
        self.reconnect(0).map(|()| 0)
    }

    /// A COMMIT of `file` answered with `verf`; it covers the writes
    /// answered up to `upto`. Held writes with another verifier (the server
    /// restarted after answering them) are sent again and COMMITted, until
    /// every one carries the COMMIT's verifier; then they are dropped. A
    /// change nothing held can repair fails with EIO naming the file.
    fn check_commit(&mut self, file: u32, verf: [u8; 8], upto: u64) -> Result<(), (i32, String)> {
        let f = self.files[file as usize].as_mut().expect("open");
        if let Some(m) = f.lost.take() {
            // A COMMIT the engine made itself found a loss (`hold_room`).
            return Err((libc::EIO, m));
        }
        let (changed, unheld) = f.take_unstable(verf);
        if changed && unheld {
            self.held.covered(file, upto);
            let path = &self.files[file as usize].as_ref().expect("open").path;
            return Err((
                libc::EIO,
                format!(
                    "{path}: the server restarted since UNSTABLE writes it acknowledged (COMMIT verifier changed); they may be lost \
                     (not all were held for resending: chimera_hold_mib)"
                ),
            ));
        }
        let (fh, path) = {
            let f = self.files[file as usize].as_ref().expect("open");
            (f.fh.clone(), f.path.clone())
        };
        let to = ResendTo { conn: None, held: NO_CONN, fh: &fh, server: "the server" };
        self.resend_rounds(file, &to, &path, verf, upto)
    }

    /// Until every live held write of `file` on `to` answered up to `upto`
    /// carries `verf`, the verifier of the COMMIT that covers it: send
    /// those answered with another verifier (the server restarted since)
    /// again, UNSTABLE and waiting for each, then COMMIT again and take
    /// its verifier — at most `RESEND_ROUNDS_MAX` rounds. Then drop the
    /// writes it covered, whatever the outcome (an error says they may be
    /// lost).
    fn resend_rounds(&mut self, file: u32, to: &ResendTo, path: &str, mut verf: [u8; 8], upto: u64) -> Result<(), (i32, String)> {
        let server = to.server;
        let mut stale = std::mem::take(&mut self.stale);
        let mut conn = to.conn;
        let mut r = Ok(());
        for round in 0.. {
            self.held.stale(file, to.held, upto, verf, &mut stale);
            if stale.is_empty() {
                break;
            }
            if round == RESEND_ROUNDS_MAX {
                let m = format!("{path} on {server}: the write verifier kept changing while resending uncommitted writes ({RESEND_ROUNDS_MAX} rounds)");
                r = Err((libc::EIO, m));
                break;
            }
            let i = match conn {
                Some(i) => i,
                None => match self.usable_conn() {
                    Ok(i) => *conn.insert(i),
                    Err(m) => {
                        r = Err((libc::EIO, format!("resending writes of {path} to {server}: {m}")));
                        break;
                    }
                },
            };
            match self.resend(i, to.fh, &stale, path, server) {
                Ok(v) => verf = v,
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        self.stale = stale;
        self.held.covered_on(file, Some(to.held), upto);
        r
    }

    /// Send the held writes `which` again on connection `i` to `fh`
    /// (UNSTABLE, waiting for each), then COMMIT: the COMMIT's verifier.
    /// The writes take the verifiers of their new answers.
    fn resend(&mut self, i: usize, fh: &[u8], which: &[usize], path: &str, server: &str) -> Result<[u8; 8], (i32, String)> {
        let bytes: u64 = which.iter().map(|&k| self.held.entries[k].len as u64).sum();
        eprintln!(
            "chimera-fio: {server} restarted (its write verifier changed): sending {} uncommitted write(s) of {path}, {bytes} bytes, again",
            which.len()
        );
        let fail = |e: Error| (e.errno(), format!("resending writes of {path} to {server}: {e}"));
        for &k in which {
            let e = &self.held.entries[k];
            let data = &self.held.arena[e.at..e.at + e.len as usize];
            let c = &mut self.conns[i].nfs;
            let reply = c.submit_write(fh, e.offset, data, Stable::Unstable).and_then(|x| c.rpc().wait(x)).map_err(fail)?;
            let w = Nfs3::written(&reply, e.len as usize).map_err(fail)?;
            c.rpc().recycle(reply);
            if (w.count as usize) < e.len as usize {
                return Err((libc::EIO, format!("resending writes of {path} to {server}: {} of {} bytes at {} written", w.count, e.len, e.offset)));
            }
            self.held.entries[k].verf = w.verf;
        }
        self.held.resent.0 += which.len() as u64;
        self.held.resent.1 += bytes;
        let c = &mut self.conns[i].nfs;
        c.submit_commit(fh).and_then(|x| c.rpc().wait(x)).and_then(|r| Nfs3::committed(&r)).map_err(fail)
    }

    /// Make room in `Held` for a write of `len` bytes: COMMIT (and settle)
    /// every file with held writes when the bound would be passed. When no
    /// COMMIT can be made now (the server is away), the write goes out
    /// unheld and its file is marked so (`File::unheld`).
    fn hold_room(&mut self, file: u32, len: usize) {
        if self.held.max == 0 {
            if let Some(f) = self.files[file as usize].as_mut() {
                f.unheld = true;
            }
            return;
        }
        if self.held.has_room(len) {
            return;
        }
        for f in self.held.files() {
            if let Err((_, m)) = self.commit_now(f, "to make room for held writes (chimera_hold_mib)") {
                eprintln!("chimera-fio: {m}");
                // Settled with a loss (its copies are gone): the file's
                // next COMMIT reports it. Not made at all (no connection):
                // its copies are still held for that COMMIT.
                if !self.held.holds(f) {
                    if let Some(f) = self.files[f as usize].as_mut() {
                        f.lost = Some(m);
                    }
                }
            }
        }
        if !self.held.has_room(len) {
            if let Some(f) = self.files[file as usize].as_mut() {
                f.unheld = true;
            }
        }
    }

    /// Bytes of answered UNSTABLE writes held now (not yet covered by a
    /// COMMIT of their verifier).
    pub fn held_bytes(&self) -> usize {
        self.held.live_bytes()
    }

    /// Writes and bytes sent again after a server restart changed the
    /// write verifier (from the held copies).
    pub fn resent(&self) -> (u64, u64) {
        self.held.resent
    }

    /// I/Os queued and not yet handed back by `reap`.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Calls queued on the connections and not yet handed to a socket
    /// (`commit` sends a connection's once they reach `send_batch`).
    pub fn unsent(&self) -> usize {
        self.conns.iter().map(|c| c.unsent).sum()
    }

    /// READs whose data was received from the socket straight into fio's
    /// buffer (`Nfs3::submit_read_into`: those longer than a receive
    /// chunk), on the connections open now.
    pub fn placed_reads(&mut self) -> u64 {
        self.conns.iter_mut().map(|c| c.nfs.rpc().placed_records()).sum()
    }

    /// I/Os that completed with an error so far.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// Submit one I/O; its result comes back from `reap` with `tag`. An
    /// `EAGAIN` error means "busy": nothing was queued, reap and try again
    /// (only while other I/Os are in flight).
    ///
    /// # Safety
    /// `buf` must be valid for `len` bytes (written by a READ, read by a
    /// WRITE) and stay so, untouched, until `reap` returns `tag`.
    pub unsafe fn queue(&mut self, file: u32, op: Op, offset: u64, buf: *mut u8, len: usize, tag: u64) -> Result<(), (i32, String)> {
        let Some(Some(f)) = self.files.get(file as usize) else {
            return Err((libc::EBADF, format!("file {file} is not open")));
        };
        if op != Op::Sync && (len == 0 || len > IO_BYTES_MAX) {
            return Err((libc::EINVAL, format!("{}: I/O of {len} bytes (1..={IO_BYTES_MAX} per I/O; lower bs)", f.path)));
        }
        if self.pnfs.is_some() {
            return self.pnfs_queue(file, op, offset, buf, len, tag);
        }
        let io = InFlight { tag, op, file, offset, buf, len, io: NO_IO, seq: self.held.seq };
        if !self.retry.is_empty() {
            // Waiting for a reconnect: this one waits with them (its
            // buffer stays fio's until it is reaped).
            if self.retry.len() >= self.cfg.iodepth.max(1) * 2 {
                return Err((libc::EAGAIN, BUSY.into()));
            }
            self.retry.push_back(io);
            self.in_flight += 1;
            return Ok(());
        }
        let i = self.next_conn % self.conns.len();
        self.next_conn = self.next_conn.wrapping_add(1);
        if self.conns[i].nfs.rpc().broken().is_some() {
            if let Err(m) = self.reconnect(i) {
                if self.cfg.retry_s == 0 {
                    return Err((libc::EIO, m));
                }
                self.hold(io, &m);
                self.in_flight += 1;
                return Ok(());
            }
        }
        if self.in_flight > 0 && !self.conns[i].nfs.rpc().has_room(if op == Op::Write { len } else { 0 }) {
            // A full send queue (the server reads slower than fio submits:
            // iodepth x bs beyond the client's send bound) is
            // back-pressure, not an error: fio reaps and queues the I/O
            // again.
            return Err((libc::EAGAIN, BUSY.into()));
        }
        if op == Op::Write {
            self.hold_room(file, len);
        }
        self.submit_on(i, io)?;
        self.in_flight += 1;
        Ok(())
    }

    /// Send `op` (an NFSv3 I/O of its own) on connection `i`.
    fn submit_on(&mut self, i: usize, op: InFlight) -> Result<(), (i32, String)> {
        let Some(Some(f)) = self.files.get(op.file as usize) else {
            return Err((libc::EBADF, format!("file {} is not open", op.file)));
        };
        let c = &mut self.conns[i];
        let (offset, len) = (op.offset, op.len);
        let r = match op.op {
            // SAFETY: `queue`'s caller keeps `buf` valid for `len` bytes
            // and leaves it alone until the I/O is reaped; the call's sink
            // goes with its completion (a large READ's data lands there).
            Op::Read => unsafe { c.nfs.submit_read_into(&f.fh, offset, len as u32, op.buf) },
            // SAFETY: `queue`'s caller keeps `buf` valid for `len` bytes
            // until the I/O is reaped.
            Op::Write => c.nfs.submit_write(&f.fh, offset, unsafe { std::slice::from_raw_parts(op.buf, len) }, Stable::Unstable),
            Op::Sync => c.nfs.submit_commit(&f.fh),
        };
        match r {
            Ok(xid) => {
                c.ops.insert(xid, op);
                c.unsent += 1;
                Ok(())
            }
            Err(e) => Err((e.errno(), format!("{:?} of {len} bytes at {offset} on {}: {e}", op.op, f.path))),
        }
    }

    /// Keep `op` (its connection was lost: `why`) until a reconnect.
    fn hold(&mut self, op: InFlight, why: &str) {
        if self.retry_since.is_none() {
            let now = Instant::now();
            self.retry_since = Some(now);
            self.retry_at = now + RETRY_FIRST;
            self.retry_pause = RETRY_FIRST;
            eprintln!(
                "chimera-fio: {why}; I/Os in flight wait for a reconnect (up to chimera_retry_s={} s)",
                self.cfg.retry_s
            );
        }
        self.retry.push_back(op);
    }

    /// Held I/Os: when it is time, reconnect every lost connection and
    /// send them again; after `retry_s` without a connection, fail them.
    fn retry_due(&mut self) {
        let Some(since) = self.retry_since else { return };
        let now = Instant::now();
        if now < self.retry_at {
            return;
        }
        let mut failed = None;
        for i in 0..self.conns.len() {
            if self.conns[i].nfs.rpc().broken().is_some() {
                if let Err(m) = self.reconnect(i) {
                    failed = Some(m);
                    break;
                }
            }
        }
        if let Some(m) = failed {
            if now.duration_since(since) >= Duration::from_secs(self.cfg.retry_s as u64) {
                let msg = format!("{m}; gave up after chimera_retry_s={} s", self.cfg.retry_s);
                eprintln!("chimera-fio: {msg}");
                while let Some(op) = self.retry.pop_front() {
                    self.complete(op.tag, op.op, op.file, op.offset, op.len, Err((libc::EIO, msg.clone())));
                }
                self.retry_since = None;
            } else {
                self.retry_pause = (self.retry_pause * 2).min(RETRY_MAX);
                self.retry_at = now + self.retry_pause;
            }
            return;
        }
        let n = self.retry.len();
        eprintln!("chimera-fio: sending {n} I/O(s) again after {} ms", now.duration_since(since).as_millis());
        self.retry_since = None;
        while let Some(op) = self.retry.pop_front() {
            let i = self.next_conn % self.conns.len();
            self.next_conn = self.next_conn.wrapping_add(1);
            let (tag, kind, file, offset, len) = (op.tag, op.op, op.file, op.offset, op.len);
            if let Err(e) = self.submit_on(i, op) {
                self.complete(tag, kind, file, offset, len, Err(e));
            }
        }
        self.send_all();
    }

    fn reconnect(&mut self, i: usize) -> Result<(), String> {
        // The lost connection failed its calls: hand them back first (their
        // completions would go with the old connection).
        let mut done = Vec::new();
        self.conns[i].nfs.rpc().on_ready(0, &mut done);
        for c in done {
            self.finish(i, c);
        }
        let left: Vec<InFlight> = self.conns[i].ops.drain().map(|(_, op)| op).collect();
        for op in left {
            if op.io != NO_IO {
                self.pnfs_part_done(i, op, Err((libc::EIO, "connection lost".into(), true)));
                continue;
            }
            if self.cfg.retry_s > 0 {
                let why = format!("connection {} to {} lost", i + 1, self.conns[i].addr);
                self.hold(op, &why);
                continue;
            }
            self.errors += 1;
            self.ready.push_back((op.tag, -(libc::EIO as i64)));
        }
        let addr = self.conns[i].addr.clone();
        let auth = self.conns[i].auth.clone();
        let rpc = self.cfg.rpc_connect(&addr, &auth, self.limits).map_err(|e| format!("reconnecting to {addr}: {e}"))?;
        let c = &mut self.conns[i];
        c.nfs.replace_conn(rpc);
        c.unsent = 0;
        c.nfs.rpc().set_corked(true);
        c.loss_logged = false;
        eprintln!("chimera-fio: connection {} to {addr} re-established", i + 1);
        Ok(())
    }

    /// fio's commit, after each `queue` (or batch of them). A connection
    /// sends once `send_batch` calls wait on it (half its share of the
    /// depth; at iodepth 1 or 2 every call at once, no added latency); the
    /// rest leave at the next `reap`, which fio calls as soon as its depth
    /// is full. So a window of 32 leaves in two sends of 16: the server
    /// works on the first half while fio queues the second (measured at
    /// QD32 4 KiB on loopback: 1.3-1.7x the IOPS of sending the window
    /// whole at reap, at the same client CPU per I/O), and each half
    /// reaches the server in one receive — what Nagle's algorithm would
    /// do, without its timer.
    pub fn commit(&mut self) {
        for c in &mut self.conns {
            if c.unsent >= self.send_batch {
                c.nfs.rpc().send_queued();
                c.unsent = 0;
            }
        }
    }

    /// Send everything queued on every connection.
    pub fn send_all(&mut self) {
        for c in &mut self.conns {
            if c.unsent > 0 {
                c.nfs.rpc().send_queued();
                c.unsent = 0;
            }
        }
    }

    /// Hand back at least `min` and at most `out`'s length of finished
    /// I/Os as (tag, bytes or -errno), waiting up to `timeout` (None:
    /// as long as it takes). Returns how many were written into `out`; fewer
    /// than `min` only when the timeout passed or nothing is in flight.
    pub fn reap(&mut self, min: usize, timeout: Option<Duration>, out: &mut [(u64, i64)]) -> usize {
        let max = out.len();
        let min = min.min(max);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut n = 0;
        let mut polled = false;
        loop {
            while n < max {
                match self.ready.pop_front() {
                    Some(x) => {
                        out[n] = x;
                        n += 1;
                        self.in_flight -= 1;
                    }
                    None => break,
                }
            }
            // Nothing left on any connection: no poll can add more.
            if n >= max || (n >= min && polled) || self.in_flight == 0 {
                return n;
            }
            let wait = if n >= min {
                Some(Duration::ZERO)
            } else {
                deadline.map(|d| d.saturating_duration_since(Instant::now()))
            };
            if polled && wait == Some(Duration::ZERO) {
                return n;
            }
            if self.retry_since.is_some() {
                self.retry_due();
                if self.retry_since.is_some() && self.conns.iter().all(|c| c.ops.is_empty()) {
                    // Only held I/Os: sleep until the next attempt.
                    let pause = self.retry_at.saturating_duration_since(Instant::now());
                    std::thread::sleep(wait.map_or(pause, |w| w.min(pause)));
                    polled = true;
                    continue;
                }
            }
            if let Some(at) = self.pnfs_wait_at() {
                if Instant::now() >= at {
                    self.pnfs_retry_due();
                    polled = true;
                    continue;
                }
                if self.conns.iter().all(|c| c.ops.is_empty()) {
                    // Only waiting pNFS I/Os: sleep until they are due.
                    let pause = at.saturating_duration_since(Instant::now());
                    std::thread::sleep(wait.map_or(pause, |w| w.min(pause)));
                    polled = true;
                    continue;
                }
            }
            self.pump(wait);
            polled = true;
        }
    }

    /// One poll(2) over every connection with calls in flight (up to
    /// `wait`; None: until one is ready or a call's own deadline), then
    /// turn what completed into results.
    fn pump(&mut self, wait: Option<Duration>) {
        self.send_all();
        self.pfds.clear();
        self.pfd_conn.clear();
        let mut until = wait.map(|w| Instant::now() + w);
        if self.retry_since.is_some() {
            until = Some(until.map_or(self.retry_at, |u| u.min(self.retry_at)));
        }
        if let Some(at) = self.pnfs_wait_at() {
            until = Some(until.map_or(at, |u| u.min(at)));
        }
        for (i, c) in self.conns.iter_mut().enumerate() {
            if c.ops.is_empty() {
                continue;
            }
            let rpc = c.nfs.rpc();
            if rpc.broken().is_some() {
                // Its calls are failed already: only collect them.
                self.pfd_conn.push(i);
                self.pfds.push(libc::pollfd { fd: -1, events: 0, revents: 0 });
                until = Some(Instant::now());
                continue;
            }
            if let Some(d) = rpc.next_deadline() {
                until = Some(until.map_or(d, |u| u.min(d)));
            }
            self.pfds.push(rpc.poll_fd());
            self.pfd_conn.push(i);
        }
        // pNFS: the metadata server may call back (layout recalls), and
        // answers I/Os sent through it.
        self.pnfs_mds_send_queued();
        let mds = self.pnfs_mds_pollfd();
        if self.pfds.is_empty() && mds.is_none() {
            return;
        }
        if let Some(fd) = mds {
            let (now, deadline) = self.pnfs_mds_due();
            if now {
                until = Some(Instant::now());
            }
            if let Some(d) = deadline {
                until = Some(until.map_or(d, |u| u.min(d)));
            }
            self.pfds.push(fd);
            self.pfd_conn.push(MDS_PFD);
        }
        let ms = until.map_or(-1, |u| {
            let d = u.saturating_duration_since(Instant::now());
            // Round up: a 0.3 ms wait must not become a busy 0.
            (d.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
        });
        // Busy poll first (when asked): a reply that arrives within it is
        // taken without the scheduler's wake-up.
        let mut r = 0;
        if ms != 0 && self.busy_poll > Duration::ZERO {
            let spin_until = Instant::now() + self.busy_poll;
            while r == 0 && Instant::now() < spin_until {
                // SAFETY: as below.
                r = unsafe { libc::poll(self.pfds.as_mut_ptr(), self.pfds.len() as libc::nfds_t, 0) };
            }
        }
        if r == 0 {
            // SAFETY: `pfds` is a valid array of its length for the call.
            r = unsafe { libc::poll(self.pfds.as_mut_ptr(), self.pfds.len() as libc::nfds_t, ms) };
        }
        if r < 0 {
            // EINTR: fio's own signals; the caller loops.
            return;
        }
        for k in 0..self.pfds.len() {
            let i = self.pfd_conn[k];
            let revents = self.pfds[k].revents;
            if i == MDS_PFD {
                if revents != 0 || self.mds_io_in_flight() > 0 {
                    self.pnfs_mds_ready(revents);
                }
                continue;
            }
            self.completions.clear();
            let mut done = std::mem::take(&mut self.completions);
            self.conns[i].nfs.rpc().on_ready(revents, &mut done);
            for c in done.drain(..) {
                self.finish(i, c);
            }
            self.completions = done;
        }
        // Recalls read now, or while an MDS call waited for its reply.
        self.pnfs_recalls();
    }

    fn finish(&mut self, i: usize, c: Completion) {
        let Some(op) = self.conns[i].ops.remove(&c.xid) else { return };
        if op.io != NO_IO {
            let r = match c.result {
                Ok(reply) => {
                    let r = match op.op {
                        // SAFETY: `queue`'s contract keeps the buffer valid and ours.
                        Op::Read => Nfs3::read_into(&reply, unsafe { std::slice::from_raw_parts_mut(op.buf, op.len) })
                            .map(|(n, _)| n as i64),
                        Op::Write => Nfs3::written(&reply, op.len).map(|w| {
                            if !w.stable {
                                self.pnfs_write_verf(op.file, i, w.verf);
                                if self.held.max > 0 {
                                    // SAFETY: as below.
                                    let data = unsafe { std::slice::from_raw_parts(op.buf, (w.count as usize).min(op.len)) };
                                    self.held.add(op.file, i as u32, op.offset, data, w.verf);
                                }
                            }
                            w.count as i64
                        }),
                        Op::Sync => Nfs3::committed(&reply).map(|_| 0),
                    };
                    self.conns[i].nfs.rpc().recycle(reply);
                    r.map_err(|e| (e.errno(), e.to_string(), e.is_connection()))
                }
                Err(e) => Err((e.errno(), e.to_string(), e.is_connection())),
            };
            self.pnfs_part_done(i, op, r);
            return;
        }
        let res = match c.result {
            Ok(reply) => {
                let r = match op.op {
                    // SAFETY: `queue`'s contract keeps the buffer valid and ours.
                    Op::Read => Nfs3::read_into(&reply, unsafe { std::slice::from_raw_parts_mut(op.buf, op.len) })
                        .map(|(n, _eof)| n as i64)
                        .map_err(|e| (e.errno(), e.to_string())),
                    Op::Write => Nfs3::written(&reply, op.len).map_err(|e| (e.errno(), e.to_string())).map(|w| {
                        if !w.stable {
                            if let Some(f) = self.files.get_mut(op.file as usize).and_then(Option::as_mut) {
                                match f.unstable_verf {
                                    None => f.unstable_verf = Some(w.verf),
                                    Some(v) if v != w.verf => f.verf_changed = true,
                                    Some(_) => {}
                                }
                                if self.held.max > 0 {
                                    // SAFETY: `queue`'s contract: fio's buffer
                                    // is valid and untouched until reaped.
                                    let data = unsafe { std::slice::from_raw_parts(op.buf, (w.count as usize).min(op.len)) };
                                    self.held.add(op.file, NO_CONN, op.offset, data, w.verf);
                                }
                            }
                        }
                        w.count as i64
                    }),
                    Op::Sync => Nfs3::committed(&reply).map_err(|e| (e.errno(), e.to_string())).and_then(|verf| {
                        if self.files.get(op.file as usize).is_some_and(Option::is_some) {
                            self.check_commit(op.file, verf, op.seq)?;
                        }
                        Ok(0)
                    }),
                };
                self.conns[i].nfs.rpc().recycle(reply);
                r
            }
            Err(e) if e.is_connection() && self.cfg.retry_s > 0 => {
                // Sent again once the connection is back (`retry_due`).
                let why = format!("connection {} to {} lost ({e})", i + 1, self.conns[i].addr);
                self.hold(op, &why);
                return;
            }
            Err(e) => {
                if e.is_connection() && !self.conns[i].loss_logged {
                    self.conns[i].loss_logged = true;
                    eprintln!(
                        "chimera-fio: connection {} to {} lost ({e}); its I/Os fail, the next I/O reconnects",
                        i + 1,
                        self.conns[i].addr
                    );
                }
                Err((e.errno(), e.to_string()))
            }
        };
        self.complete(op.tag, op.op, op.file, op.offset, op.len, res);
    }

    /// Hand an I/O's result to `reap`; a failure is counted and logged
    /// (the first `ERRORS_LOGGED_MAX`).
    fn complete(&mut self, tag: u64, op: Op, file: u32, offset: u64, len: usize, res: Result<i64, (i32, String)>) {
        let res = match res {
            Ok(n) => n,
            Err((errno, msg)) => {
                self.errors += 1;
                if self.errors <= ERRORS_LOGGED_MAX as u64 {
                    let path = self.files.get(file as usize).and_then(Option::as_ref).map_or("?", |f| f.path.as_str());
                    eprintln!("chimera-fio: {op:?} of {len} bytes at {offset} on {path} failed: {msg}");
                    if self.errors == ERRORS_LOGGED_MAX as u64 {
                        eprintln!("chimera-fio: further I/O errors are counted, not logged");
                    }
                }
                -(errno.max(1) as i64)
            }
        };
        self.ready.push_back((tag, res));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses() {
        assert_eq!(with_port("127.0.0.1", 2049), "127.0.0.1:2049");
        assert_eq!(with_port("127.0.0.1:20049", 2049), "127.0.0.1:20049");
        assert_eq!(with_port("::1", 2049), "[::1]:2049");
        assert_eq!(with_port("[::1]:7", 2049), "[::1]:7");
        assert_eq!(with_port("[::1]", 2049), "[::1]:2049");
        assert_eq!(host_of("10.0.0.1:2049"), "10.0.0.1");
        assert_eq!(host_of("nfs.example"), "nfs.example");
    }

    #[test]
    fn options_are_checked_by_name() {
        let ok = Config { server: "127.0.0.1".into(), export: "/m".into(), mount_port: 0, conns: 1, iodepth: 1, uid: 0, gid: 0, pnfs: false, busy_poll_us: 0, retry_s: RETRY_S_DEFAULT, hold_mib: HOLD_MIB_DEFAULT, rdma: false };
        assert!(ok.validate().is_ok());
        let e = Config { server: String::new(), ..ok.clone() }.validate().unwrap_err();
        assert!(e.contains("chimera_server"), "{e}");
        let e = Config { export: "m".into(), ..ok.clone() }.validate().unwrap_err();
        assert!(e.contains("chimera_export"), "{e}");
        let e = Config { conns: 0, ..ok.clone() }.validate().unwrap_err();
        assert!(e.contains("chimera_conns"), "{e}");
        let e = Config { busy_poll_us: 5000, ..ok.clone() }.validate().unwrap_err();
        assert!(e.contains("chimera_busy_poll_us"), "{e}");
        let e = Config { retry_s: RETRY_S_MAX + 1, ..ok.clone() }.validate().unwrap_err();
        assert!(e.contains("chimera_retry_s"), "{e}");
        let e = Config { hold_mib: HOLD_MIB_MAX + 1, ..ok.clone() }.validate().unwrap_err();
        assert!(e.contains("chimera_hold_mib"), "{e}");
        let e = Config { conns: CONNS_MAX + 1, ..ok }.validate().unwrap_err();
        assert!(e.contains("chimera_conns"), "{e}");
    }
}
