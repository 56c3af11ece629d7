//! pNFS mode (`chimera_pnfs=1`): an NFSv4.1 session to the metadata server
//! for OPEN, LAYOUTGET, GETDEVICEINFO, LAYOUTCOMMIT, LAYOUTRETURN and
//! CLOSE; READ / WRITE / COMMIT go over NFSv3 straight to the data servers
//! the flex-files layout names, as the layout's synthetic uid/gid, on the
//! same polled connections as NFSv3 mode (made when a layout first names a
//! data server).
//!
//! A WRITE goes to every mirror of the segment and completes when all have
//! answered; a READ goes to one mirror (round-robin) and, if it fails, to
//! the next. A data server that fails (no answer, lost connection, an
//! error status) is reported to the MDS in LAYOUTRETURN (ff_ioerr4), the
//! file's layout is dropped, and the I/O is sent again under a fresh layout
//! (the MDS leaves the failed server out) — at most `REDRIVES_MAX` times,
//! then once through the MDS itself. When that fails too (the only copy's
//! data server is away, e.g. restarting), the I/O waits and is driven
//! again from the start (backing off from 50 ms to 1 s) for up to
//! `retry_s` seconds from its first failure, as NFSv3 mode waits for a
//! reconnect; then it fails. fio's fsync COMMITs every data file
//! written and LAYOUTCOMMITs the size; close does the same, returns the
//! layout and CLOSEs.
//!
//! A metadata server that restarted (its connection or session lost:
//! BADSESSION, STALE_CLIENTID, ...) is met with a new session that reclaims
//! the engine's opens in the server's grace period, or, when the server
//! has no grace or no record of this client, opens the files again by
//! name; layouts are asked for again. Calls to it wait meanwhile (GRACE,
//! DELAY, the server away) for up to `retry_s` (`Engine::mds`).

use crate::{Conn, Engine, File, InFlight, Op, MDS_HELD, NO_IO};
use client::flexfiles::{DsError, IoMode};
use client::nfs3::Stable;
use client::nfs4::{InFlight as InFlight41, Nfs41, Open4, Stateid};
use client::{Auth, Limits};
use proto::nfs4 as p;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Layout segments kept per file (a striped file has one per stripe unit);
/// beyond it the cache starts over.
const SEGMENTS_MAX: usize = 4096;
/// Times an I/O is sent again under a new layout after a data-server
/// failure before it goes through the MDS.
const REDRIVES_MAX: u32 = 2;

/// The metadata-server session and the I/Os spread over data servers.
pub(crate) struct State {
    mds: Nfs41,
    /// Where the metadata server is and as whom (re-establishing after it
    /// restarted).
    addr: String,
    auth: Auth,
    export: String,
    ios: Vec<Option<Io>>,
    free: Vec<u32>,
    ds: HashMap<[u8; 16], Ds>,
    next_mirror: usize,
    /// I/Os that ended up going through the MDS.
    pub(crate) through_mds: u64,
    /// I/Os that failed everywhere, waiting to be driven again (`retry_s`),
    /// when, and the pause after that.
    waiting: VecDeque<u32>,
    wait_at: Instant,
    wait_pause: Duration,
    /// An episode of waiting I/Os is going on (logged once).
    wait_logged: bool,
    /// I/Os of files whose layouts are being returned after a recall,
    /// driven again once the LAYOUTRETURN went (`pnfs_finish_returns`).
    recall_parked: Vec<u32>,
    /// Files with a LAYOUTRETURN owed (`FileLayouts::returning`).
    returns_pending: usize,
    /// CB_LAYOUTRECALLs answered.
    pub(crate) recalls: u64,
    /// I/Os through the MDS in flight on its session (`pnfs_mds_submit`):
    /// xid -> (I/O, its slot); the most there were at once.
    mds_io: client::XidMap<(u32, InFlight41)>,
    pub(crate) mds_io_max: usize,
    /// I/Os through the MDS waiting for a slot of the session.
    mds_queue: VecDeque<u32>,
    /// Completions taken from the MDS connection (reused).
    mds_done: Vec<client::Completion>,
    /// A file without layouts was reported (once per engine).
    no_layouts_logged: bool,
}

struct Ds {
    conns: Vec<usize>,
    next: usize,
    cred: (u32, u32),
}

struct Io {
    tag: u64,
    op: Op,
    file: u32,
    offset: u64,
    buf: *mut u8,
    len: usize,
    parts_left: usize,
    count: Option<i64>,
    errors: Vec<DsError>,
    last_error: String,
    /// Mirrors of the current segment a READ has tried (bit per mirror).
    tried: u64,
    redrives: u32,
    /// The file's layout generation this I/O was last sent under.
    generation: u64,
    /// When it first failed everywhere (it waits `retry_s` from then).
    since: Option<Instant>,
}

/// A data file written since the last COMMIT: where, and the write
/// verifiers of its answers, compared with the COMMIT's: a data server
/// that restarted in between may have lost them.
struct Written {
    conn: usize,
    fh: Vec<u8>,
    /// Copies of the segment it was written under: with one, a data
    /// server reported failed still holds the only copy (the MDS keeps it).
    mirrors: usize,
    /// The verifier of the first UNSTABLE answer.
    verf: Option<[u8; 8]>,
    /// A later answer carried another one.
    changed: bool,
}

/// A file's pNFS state.
pub(crate) struct FileLayouts {
    open: Open4,
    iomode: IoMode,
    segs: Vec<client::flexfiles::FfSegment>,
    /// The layout stateid once a LAYOUTGET granted one.
    lstateid: Option<Stateid>,
    /// Every data file written since the last COMMIT.
    written: Vec<Written>,
    /// End of the furthest write since the last LAYOUTCOMMIT.
    write_end: u64,
    /// Bumped each time the layout is dropped after a failure: an I/O driven
    /// under an older one that fails later is not reported again (the
    /// other I/Os in flight on the same dead server would each report it).
    generation: u64,
    /// Data servers reported failed for this file (their copies are stale:
    /// no COMMIT is sent to them) until a write to one succeeds again.
    failed: Vec<[u8; 16]>,
    /// The metadata server restarted without this file (its namespace was
    /// not kept): why. Every later I/O of it fails with ESTALE saying so.
    gone: Option<String>,
    /// A CB_LAYOUTRECALL took the layout: the stateid to LAYOUTRETURN it
    /// with once no I/O of the file is on a data server; its new I/Os
    /// wait until then (`State::recall_parked`).
    returning: Option<Stateid>,
    /// The metadata server grants no layouts for the file (it is a plain
    /// NFSv4.1 server, or keeps no flex-files layouts): why. Its I/O goes
    /// through the server without asking again.
    no_layouts: Option<String>,
}

/// LAYOUTGET answers that mean no layout will come for the file: its I/O
/// then goes through the metadata server (NFSv4.1 without pNFS).
/// (NFS4ERR_LAYOUTUNAVAILABLE is not among them: a pNFS server may say it
/// for a while, e.g. while a data server drains.)
const NO_LAYOUT_CODES: [i32; 2] = [p::NFS4ERR_UNKNOWN_LAYOUTTYPE, p::NFS4ERR_NOTSUPP];

/// Errors of a call on a file no wait repairs: the file (or its handle)
/// is not there, or the call is refused as such. I/O through the MDS that
/// ends with one of them fails at once instead of waiting `retry_s` for a
/// data server.
const FINAL_ERRNOS: [i32; 9] = [libc::ESTALE, libc::ENOENT, libc::EACCES, libc::EPERM, libc::EROFS, libc::ENOSPC, libc::EDQUOT, libc::EFBIG, libc::EINVAL];

fn nfs(e: client::Error, what: &str) -> (i32, String) {
    (e.errno(), format!("{what}: {e}"))
}

impl State {
    /// Whether an I/O of `len` bytes can go through the MDS session now,
    /// leaving a slot for the engine's own calls.
    fn mds_has_room(&mut self, len: usize) -> bool {
        self.mds.free_slots() >= 2 && self.mds.rpc().has_room(len)
    }

    pub(crate) fn connect(cfg: &crate::Config, auth: &Auth, limits: Limits) -> Result<State, String> {
        let addr = cfg.nfs_addr();
        // A client owner of its own per engine: two fio jobs are two clients.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let owner = format!("chimera-fio-{}-{nanos}", std::process::id());
        // A back channel for layout recalls, NFSv4.2 for LAYOUTERROR.
        let opts = client::nfs4::SessionOpts { back_channel: true, minor_max: 2, rdma: cfg.rdma };
        let mut mds = Nfs41::connect_opts(&addr, auth, limits, owner.as_bytes(), opts)
            .map_err(|e| format!("NFSv4.1 session with the metadata server {addr}: {e}"))?;
        // UNSTABLE writes through the MDS are held and checked by the
        // engine (`Held`, `pnfs_commit_mds`), not copied again by the session.
        mds.set_track_unstable(false);
        Ok(State {
            mds,
            addr: addr.clone(),
            auth: auth.clone(),
            export: cfg.export.trim_end_matches('/').to_string(),
            ios: Vec::new(),
            free: Vec::new(),
            ds: HashMap::new(),
            next_mirror: 0,
            through_mds: 0,
            waiting: VecDeque::new(),
            wait_at: Instant::now(),
            wait_pause: crate::RETRY_FIRST,
            wait_logged: false,
            recall_parked: Vec::new(),
            returns_pending: 0,
            recalls: 0,
            mds_io: client::XidMap::default(),
            mds_io_max: 0,
            mds_queue: VecDeque::new(),
            mds_done: Vec::new(),
            no_layouts_logged: false,
        })
    }
}

impl Engine {
    fn st(&mut self) -> &mut State {
        self.pnfs.as_mut().expect("pNFS mode")
    }

    /// OPEN `path` under the export (its directories must exist).
    pub(crate) fn pnfs_open(&mut self, path: &str, create: bool) -> Result<File, (i32, String)> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
        if parts.contains(&"..") {
            return Err((libc::EINVAL, format!("file name '{path}' leaves the export ('..')")));
        }
        let Some((name, dirs)) = parts.split_last() else {
            return Err((libc::EINVAL, format!("file name '{path}' names no file")));
        };
        let (name, dir) = (name.to_string(), format!("{}/{}", self.st().export, dirs.join("/")));
        let what = format!("OPEN of {path} in export {} (pNFS mode creates no directories)", self.st().export);
        let o = self.mds(&what, |e| e.st().mds.open(&dir, &name, 3, create.then_some(0o644)))?;
        let fh = o.fh.clone();
        let iomode = if create { IoMode::Rw } else { IoMode::Read };
        let no_layouts = !self.st().mds.is_pnfs_mds();
        if no_layouts && !self.st().no_layouts_logged {
            self.st().no_layouts_logged = true;
            let minor = self.st().mds.minor;
            eprintln!("chimera-fio: {} is not a pNFS metadata server: I/O goes through it over NFSv4.{minor}", self.cfg.server);
        }
        Ok(File {
            path: path.to_string(),
            fh,
            unstable_verf: None,
            verf_changed: false,
            unheld: false,
            lost: None,
            pnfs: Some(FileLayouts {
                open: o,
                iomode,
                segs: Vec::new(),
                lstateid: None,
                written: Vec::new(),
                write_end: 0,
                generation: 0,
                failed: Vec::new(),
                gone: None,
                returning: None,
                no_layouts: no_layouts.then(|| format!("{} is not a pNFS metadata server (EXCHANGE_ID: no USE_PNFS_MDS)", self.cfg.server)),
            }),
        })
    }

    fn layouts(&mut self, file: u32) -> &mut FileLayouts {
        self.files[file as usize].as_mut().and_then(|f| f.pnfs.as_mut()).expect("a pNFS file")
    }

    /// The index of a held segment covering [offset, offset + len), after a
    /// LAYOUTGET when none does.
    fn segment(&mut self, file: u32, offset: u64, len: u64) -> Result<usize, (i32, String)> {
        if let Some(i) = self.layouts(file).segs.iter().position(|s| s.covers(offset, len.max(1))) {
            return Ok(i);
        }
        if let Some(m) = &self.layouts(file).gone {
            return Err((libc::ESTALE, m.clone()));
        }
        if let Some(m) = &self.layouts(file).no_layouts {
            return Err((libc::EIO, m.clone()));
        }
        let path = self.files[file as usize].as_ref().expect("open").path.clone();
        let seg = self.mds(&format!("LAYOUTGET of {path} at {offset}"), |e| {
            // Read again on each attempt: re-establishing replaces the stateids.
            let (fh, sid, iomode) = {
                let f = e.files[file as usize].as_ref().expect("open");
                let l = f.pnfs.as_ref().expect("pNFS file");
                (f.fh.clone(), l.lstateid.clone().unwrap_or_else(|| l.open.stateid.clone()), l.iomode)
            };
            let r = e.st().mds.layoutget(&fh, &sid, iomode, offset, len.max(1));
            if let Err(client::Error::Nfs4 { code, .. }) = &r {
                if NO_LAYOUT_CODES.iter().any(|&c| c as u32 == *code) {
                    let why = format!("the metadata server grants no layout for {path} ({})", r.as_ref().err().expect("an error"));
                    if !e.st().no_layouts_logged {
                        e.st().no_layouts_logged = true;
                        eprintln!("chimera-fio: {why}: its I/O goes through the server over NFSv4.1");
                    }
                    e.layouts(file).no_layouts = Some(why);
                }
            }
            r
        })
        .map_err(|(errno, m)| {
            if errno != libc::ESTALE {
                return (errno, m);
            }
            let gone = &mut self.layouts(file).gone;
            (errno, gone.get_or_insert_with(|| format!("{m} (the metadata server no longer knows the file)")).clone())
        })?;
        if !seg.covers(offset, len.max(1)) {
            return Err((libc::EIO, format!("LAYOUTGET of {path} at {offset}: the segment granted does not cover the I/O")));
        }
        let l = self.layouts(file);
        l.lstateid = Some(seg.stateid.clone());
        if l.segs.len() >= SEGMENTS_MAX {
            l.segs.clear();
        }
        l.segs.push(seg);
        Ok(l.segs.len() - 1)
    }

    /// A connection to the data server `deviceid` as (uid, gid), made (after
    /// GETDEVICEINFO) the first time a layout names it.
    fn ds_conn(&mut self, deviceid: [u8; 16], uid: u32, gid: u32) -> Result<usize, (i32, String)> {
        let auth = Auth::Sys { machine: "chimera-fio".into(), uid, gid, gids: Vec::new() };
        if let Some(d) = self.pnfs.as_mut().expect("pNFS").ds.get_mut(&deviceid) {
            let i = d.conns[d.next % d.conns.len()];
            d.next = d.next.wrapping_add(1);
            if d.cred != (uid, gid) {
                d.cred = (uid, gid);
                for &c in &d.conns {
                    self.conns[c].nfs.rpc().set_auth(&auth).map_err(|e| nfs(e, "data-server credentials"))?;
                    self.conns[c].auth = auth.clone();
                }
            }
            return Ok(i);
        }
        let dev = self.mds("GETDEVICEINFO", |e| e.st().mds.getdeviceinfo(&deviceid))?;
        let addr = match self.cfg.rdma {
            true => dev.rdma_addrs.first().cloned().ok_or((libc::EIO, format!("GETDEVICEINFO: the data server has no RDMA address (netid rdma; it has TCP {:?})", dev.tcp_addrs)))?,
            false => dev.tcp_addrs.first().cloned().ok_or((libc::EIO, "GETDEVICEINFO: the data server has no TCP address".to_string()))?,
        };
        if !dev.speaks_v3() {
            return Err((libc::EPROTONOSUPPORT, format!("data server {addr} does not offer NFSv3 (versions {:?})", dev.versions)));
        }
        let mut conns = Vec::with_capacity(self.cfg.conns);
        for _ in 0..self.cfg.conns {
            let mut c = Self::new_conn(&self.cfg, &addr, &auth, self.limits).map_err(|e| nfs(e, &format!("connecting to data server {addr}")))?;
            c.device = Some(deviceid);
            self.conns.push(c);
            conns.push(self.conns.len() - 1);
        }
        let i = conns[0];
        self.st().ds.insert(deviceid, Ds { conns, next: 1, cred: (uid, gid) });
        Ok(i)
    }

    /// Queue one I/O in pNFS mode (see the module comment).
    ///
    /// # Safety
    /// As `Engine::queue`.
    pub(crate) unsafe fn pnfs_queue(&mut self, file: u32, op: Op, offset: u64, buf: *mut u8, len: usize, tag: u64) -> Result<(), (i32, String)> {
        if self.st().mds.renew_due() {
            self.mds("renewing the lease with the metadata server", |e| e.st().mds.renew())?;
        }
        // Back-pressure as in plain mode: a data-server connection whose
        // send queue is full makes fio reap first (a refused submit would
        // otherwise count as that data server failing).
        if self.in_flight > 0 && op != Op::Sync {
            let payload = if op == Op::Write { len } else { 0 };
            for c in &mut self.conns {
                if c.nfs.rpc().broken().is_none() && !c.nfs.rpc().has_room(payload) {
                    return Err((libc::EAGAIN, crate::BUSY.into()));
                }
            }
        }
        if let Some(m) = self.layouts(file).gone.clone() {
            self.in_flight += 1;
            self.complete(tag, op, file, offset, len, Err((libc::ESTALE, m)));
            return Ok(());
        }
        if op == Op::Write {
            self.pnfs_hold_room(len);
        }
        self.in_flight += 1;
        if op == Op::Sync {
            let r = self.pnfs_sync(file).map(|_| 0);
            self.complete(tag, op, file, offset, 0, r);
            return Ok(());
        }
        let io = Io { tag, op, file, offset, buf, len, parts_left: 0, count: None, errors: Vec::new(), last_error: String::new(), tried: 0, redrives: 0, generation: 0, since: None };
        let st = self.st();
        let idx = match st.free.pop() {
            Some(i) => {
                st.ios[i as usize] = Some(io);
                i
            }
            None => {
                st.ios.push(Some(io));
                (st.ios.len() - 1) as u32
            }
        };
        self.pnfs_drive(idx);
        Ok(())
    }

    fn io(&mut self, idx: u32) -> &mut Io {
        self.st().ios[idx as usize].as_mut().expect("an I/O in flight")
    }

    /// Send I/O `idx` to the data servers of its segment.
    fn pnfs_drive(&mut self, idx: u32) {
        let (file, op, offset, len) = {
            let io = self.io(idx);
            (io.file, io.op, io.offset, io.len)
        };
        if self.layouts(file).returning.is_some() {
            // Not under the recalled layout, nor a new one before it is
            // returned (the server would refuse it: RECALLCONFLICT).
            return self.st().recall_parked.push(idx);
        }
        let si = match self.segment(file, offset, len as u64) {
            Ok(si) => si,
            Err((libc::ESTALE, msg)) => {
                let io = self.st().ios[idx as usize].take().expect("in flight");
                self.st().free.push(idx);
                return self.complete(io.tag, io.op, io.file, io.offset, io.len, Err((libc::ESTALE, msg)));
            }
            Err((_, msg)) => {
                self.io(idx).last_error = msg;
                return self.pnfs_through_mds(idx);
            }
        };
        let nm = self.layouts(file).segs[si].mirrors.len();
        let generation = self.layouts(file).generation;
        self.io(idx).generation = generation;
        let targets: u64 = match op {
            Op::Write => (1u64 << nm) - 1,
            _ => {
                let tried = self.io(idx).tried;
                let st = self.st();
                let start = st.next_mirror;
                st.next_mirror = st.next_mirror.wrapping_add(1);
                match (0..nm).map(|k| (start + k) % nm).find(|k| tried & (1 << k) == 0) {
                    Some(k) => 1 << k,
                    None => 0,
                }
            }
        };
        if targets == 0 {
            return self.pnfs_failed(idx);
        }
        self.io(idx).parts_left = targets.count_ones() as usize;
        self.io(idx).tried |= targets;
        for k in 0..nm {
            if targets & (1 << k) == 0 {
                continue;
            }
            let (deviceid, uid, gid) = {
                let m = &self.layouts(file).segs[si].mirrors[k];
                (m.deviceid, m.uid, m.gid)
            };
            let part = {
                let io = self.io(idx);
                InFlight { tag: io.tag, op, file, offset, buf: io.buf, len, io: idx, seq: 0 }
            };
            let conn = match self.ds_conn(deviceid, uid, gid) {
                Ok(c) => c,
                Err((errno, msg)) => {
                    self.pnfs_part_error(idx, deviceid, errno, msg, true);
                    continue;
                }
            };
            if self.conns[conn].nfs.rpc().broken().is_some() {
                if let Err(msg) = self.reconnect(conn) {
                    self.pnfs_part_error(idx, deviceid, libc::EIO, msg, true);
                    continue;
                }
            }
            // Disjoint fields: the segment's handle is borrowed from
            // `files` while the call goes out on `conns`.
            let fh = &self.files[file as usize].as_ref().expect("open").pnfs.as_ref().expect("pNFS").segs[si].mirrors[k].fh;
            let c: &mut Conn = &mut self.conns[conn];
            let r = match op {
                // SAFETY: `queue`'s contract keeps the part's buffer valid
                // for `len` and ours until the part is answered (one mirror
                // at a time reads into it).
                Op::Read => unsafe { c.nfs.submit_read_into(fh, offset, len as u32, part.buf) },
                // SAFETY: `queue`'s contract keeps the buffer valid for `len`.
                Op::Write => c.nfs.submit_write(fh, offset, unsafe { std::slice::from_raw_parts(part.buf, len) }, Stable::Unstable),
                Op::Sync => unreachable!("sync is not sent to a data server"),
            };
            match r {
                Ok(xid) => {
                    c.ops.insert(xid, part);
                    c.unsent += 1;
                    // Remembered for COMMIT once per data file (no copy per I/O).
                    if op == Op::Write {
                        let l = self.files[file as usize].as_ref().expect("open").pnfs.as_ref().expect("pNFS");
                        if !l.written.iter().any(|w| w.conn == conn && w.fh == *fh) {
                            let fh = fh.clone();
                            self.layouts(file).written.push(Written { conn, fh, mirrors: nm, verf: None, changed: false });
                        }
                    }
                }
                Err(e) => {
                    let conn_err = e.is_connection();
                    self.pnfs_part_error(idx, deviceid, e.errno(), e.to_string(), conn_err);
                }
            }
        }
    }

    fn pnfs_part_error(&mut self, idx: u32, deviceid: [u8; 16], errno: i32, msg: String, connection: bool) {
        let (offset, len, write) = {
            let io = self.io(idx);
            (io.offset, io.len, io.op == Op::Write)
        };
        let status = if connection { p::nfsstat4::NFS4ERR_NXIO } else { p::nfsstat4::NFS4ERR_IO };
        let io = self.io(idx);
        io.errors.push(DsError { deviceid, offset, length: len as u64, status, write });
        io.last_error = format!("data server: {msg} (errno {errno})");
        io.parts_left -= 1;
        if io.parts_left == 0 {
            self.pnfs_settle(idx);
        }
    }

    /// One data-server call of a pNFS I/O finished.
    pub(crate) fn pnfs_part_done(&mut self, conn: usize, part: InFlight, r: Result<i64, (i32, String, bool)>) {
        debug_assert_ne!(part.io, NO_IO);
        let idx = part.io;
        if self.pnfs.as_ref().and_then(|s| s.ios.get(idx as usize)).and_then(Option::as_ref).is_none() {
            return;
        }
        match r {
            Ok(n) => {
                let (op, offset) = (part.op, part.offset);
                let io = self.io(idx);
                io.count = Some(io.count.map_or(n, |c| c.min(n)));
                io.parts_left -= 1;
                if op == Op::Write {
                    let device = self.conns[conn].device;
                    let l = self.layouts(part.file);
                    l.write_end = l.write_end.max(offset + n as u64);
                    if !l.failed.is_empty() {
                        l.failed.retain(|d| Some(*d) != device);
                    }
                }
                if self.io(idx).parts_left == 0 {
                    self.pnfs_settle(idx);
                }
            }
            Err((errno, msg, connection)) => {
                let deviceid = self.conns[conn].device.unwrap_or([0; 16]);
                self.pnfs_part_error(idx, deviceid, errno, msg, connection);
            }
        }
    }

    /// Every call of I/O `idx` answered: complete it, or retry after a
    /// data-server failure.
    fn pnfs_settle(&mut self, idx: u32) {
        if self.io(idx).errors.is_empty() {
            let io = self.st().ios[idx as usize].take().expect("in flight");
            self.st().free.push(idx);
            return self.complete(io.tag, io.op, io.file, io.offset, io.len, Ok(io.count.unwrap_or(0)));
        }
        // A READ with an untried mirror in the same segment tries it.
        if self.io(idx).op == Op::Read {
            let (file, offset, len, tried) = {
                let io = self.io(idx);
                (io.file, io.offset, io.len as u64, io.tried)
            };
            if let Some(si) = self.layouts(file).segs.iter().position(|s| s.covers(offset, len)) {
                let nm = self.layouts(file).segs[si].mirrors.len();
                if (0..nm).any(|k| tried & (1 << k) == 0) {
                    self.io(idx).count = None;
                    return self.pnfs_drive(idx);
                }
            }
        }
        self.pnfs_failed(idx);
    }

    /// The I/O's data servers failed: report them (LAYOUTRETURN with the
    /// errors), drop the layout, and send the I/O again under a new one —
    /// or, after `REDRIVES_MAX`, through the MDS.
    fn pnfs_failed(&mut self, idx: u32) {
        let (file, errors, generation) = {
            let io = self.io(idx);
            (io.file, std::mem::take(&mut io.errors), io.generation)
        };
        let (fh, sid, iomode, current) = {
            let f = self.files[file as usize].as_ref().expect("open");
            let l = f.pnfs.as_ref().expect("pNFS");
            (f.fh.clone(), l.lstateid.clone(), l.iomode, l.generation == generation)
        };
        // Only the first I/O to fail under a layout reports and drops it;
        // the others sent under it go straight to the new one.
        if current {
            if self.layouts(file).failed.is_empty() || errors.iter().any(|e| !self.layouts(file).failed.contains(&e.deviceid)) {
                let names: Vec<String> = errors
                    .iter()
                    .map(|e| {
                        let st = self.pnfs.as_ref().expect("pNFS");
                        st.ds.get(&e.deviceid).map_or_else(|| "(no address)".to_string(), |d| self.conns[d.conns[0]].addr.clone())
                    })
                    .collect();
                eprintln!("chimera-fio note: data server(s) {} failed; reported to the MDS, taking a new layout", names.join(", "));
            }
            if let Some(sid) = sid {
                // NFSv4.2: LAYOUTERROR first (the MDS counts and acts on it
                // as it does on LAYOUTRETURN's ff_ioerr4, which follows).
                if self.st().mds.minor >= 2 {
                    if let Err(e) = self.st().mds.layouterror(&fh, &sid, &errors) {
                        eprintln!("chimera-fio: LAYOUTERROR reporting a data-server failure: {e}");
                    }
                }
                if let Err(e) = self.st().mds.layoutreturn(&fh, &sid, iomode, &errors) {
                    eprintln!("chimera-fio: LAYOUTRETURN reporting a data-server failure: {e}");
                }
            }
            let l = self.layouts(file);
            l.segs.clear();
            l.lstateid = None;
            l.generation += 1;
        }
        let l = self.layouts(file);
        for e in &errors {
            if !l.failed.contains(&e.deviceid) {
                l.failed.push(e.deviceid);
            }
        }
        let io = self.io(idx);
        io.redrives += 1;
        io.tried = 0;
        io.count = None;
        if io.redrives <= REDRIVES_MAX {
            return self.pnfs_drive(idx);
        }
        self.pnfs_through_mds(idx);
    }

    /// The I/O through the MDS (NFSv4.1 READ / UNSTABLE WRITE with the open
    /// stateid; fsync COMMITs on the MDS, `pnfs_commit_mds`): on the session
    /// without waiting when it can take it (`pnfs_mds_submit`), else waited
    /// for (`pnfs_through_mds_wait`).
    fn pnfs_through_mds(&mut self, idx: u32) {
        self.st().through_mds += 1;
        if !self.pnfs_mds_submit(idx) {
            self.pnfs_through_mds_wait(idx);
        }
    }

    /// Send I/O `idx` through the MDS without waiting for it: its answer is
    /// taken when the pump finds the MDS connection ready
    /// (`pnfs_mds_ready`). One slot of the session is always left for the
    /// engine's own calls (OPEN, LAYOUTGET, ...); when none is free the I/O
    /// waits for one in `mds_queue`. False: the session cannot take it
    /// (lost, or it has a single slot) — the caller waits for it instead.
    fn pnfs_mds_submit(&mut self, idx: u32) -> bool {
        let (op, file, offset, len, buf) = {
            let io = self.io(idx);
            (io.op, io.file, io.offset, io.len, io.buf)
        };
        if op == Op::Sync {
            return false;
        }
        // Disjoint fields: the open state (no copy per I/O) and the session.
        let open = &self.files[file as usize].as_ref().and_then(|f| f.pnfs.as_ref()).expect("a pNFS file").open;
        let st = self.pnfs.as_mut().expect("pNFS mode");
        if st.mds.rpc().broken().is_some() || st.mds.usable_slots() < 2 {
            return false;
        }
        if !st.mds_has_room(len) {
            if st.mds_io.is_empty() {
                return false;
            }
            st.mds_queue.push_back(idx);
            return true;
        }
        let sent = match op {
            Op::Read => st.mds.submit_read(open, offset, len as u32),
            // SAFETY: `queue`'s contract keeps the buffer valid for `len`.
            _ => st.mds.submit_write(open, offset, unsafe { std::slice::from_raw_parts(buf, len) }, false),
        };
        match sent {
            Ok(fl) => {
                st.mds_io.insert(fl.xid, (idx, fl));
                st.mds_io_max = st.mds_io_max.max(st.mds_io.len());
                true
            }
            Err(_) => false,
        }
    }

    /// The answer to an I/O `pnfs_mds_submit` sent. An error goes the
    /// waiting way (`pnfs_through_mds_wait`: the session re-established,
    /// GRACE / DELAY and a data server away waited out, final errors
    /// reported), which sends it once more.
    fn pnfs_mds_io_done(&mut self, idx: u32, fl: InFlight41, reply: client::Result<client::Reply>) {
        let (op, file, offset, len, buf) = {
            let io = self.io(idx);
            (io.op, io.file, io.offset, io.len, io.buf)
        };
        let open = &self.files[file as usize].as_ref().and_then(|f| f.pnfs.as_ref()).expect("a pNFS file").open;
        let st = self.pnfs.as_mut().expect("pNFS mode");
        let r = match op {
            // SAFETY: `queue`'s contract keeps the buffer valid and ours.
            Op::Read => st.mds.finish_read_into(fl, reply, unsafe { std::slice::from_raw_parts_mut(buf, len) }).map(|(n, _)| n as i64),
            // SAFETY: as above.
            _ => st.mds.finish_write(fl, reply, open, offset, unsafe { std::slice::from_raw_parts(buf, len) }).map(|(count, stable, verf)| {
                if !stable {
                    // SAFETY: as above.
                    self.pnfs_mds_unstable(file, offset, unsafe { std::slice::from_raw_parts(buf, (count as usize).min(len)) }, verf);
                }
                count as i64
            }),
        };
        match r {
            Ok(n) => {
                let io = self.st().ios[idx as usize].take().expect("in flight");
                self.st().free.push(idx);
                self.complete(io.tag, io.op, io.file, io.offset, io.len, Ok(n));
            }
            Err(e) => {
                self.io(idx).last_error = e.to_string();
                self.pnfs_through_mds_wait(idx);
            }
        }
    }

    /// Send the I/Os waiting for a session slot while slots are free.
    pub(crate) fn pnfs_mds_send_queued(&mut self) {
        while let Some(&idx) = self.pnfs.as_ref().and_then(|s| s.mds_queue.front()) {
            let st = self.st();
            let len = st.ios[idx as usize].as_ref().map_or(0, |io| io.len);
            if !st.mds_io.is_empty() && !st.mds_has_room(len) {
                return;
            }
            st.mds_queue.pop_front();
            if !self.pnfs_mds_submit(idx) {
                self.pnfs_through_mds_wait(idx);
            }
        }
    }

    /// The I/O through the MDS, waited for here: the path of last resort
    /// (and of an answer that was an error).
    fn pnfs_through_mds_wait(&mut self, idx: u32) {
        let mut io = self.st().ios[idx as usize].take().expect("in flight");
        let what = format!("through the MDS after \"{}\"", io.last_error);
        let (op, file, offset, len, buf) = (io.op, io.file, io.offset, io.len, io.buf);
        let mut r = self.mds(&what, |e| {
            let open = e.layouts(file).open.clone();
            match op {
                Op::Read => {
                    let mut data = Vec::with_capacity(len);
                    e.st().mds.read(&open, offset, len as u32, &mut data).map(|_| {
                        // SAFETY: `queue`'s contract keeps the buffer valid for `len`.
                        unsafe { std::slice::from_raw_parts_mut(buf, len)[..data.len()].copy_from_slice(&data) };
                        data.len() as i64
                    })
                }
                // SAFETY: as above.
                Op::Write => e.st().mds.write(&open, offset, unsafe { std::slice::from_raw_parts(buf, len) }, false).map(|(count, stable, verf)| {
                    if !stable {
                        // SAFETY: as above.
                        e.pnfs_mds_unstable(file, offset, unsafe { std::slice::from_raw_parts(buf, (count as usize).min(len)) }, verf);
                    }
                    count as i64
                }),
                Op::Sync => Ok(0),
            }
        });
        if let Err((errno, msg)) = &r {
            if FINAL_ERRNOS.contains(errno) {
                if *errno == libc::ESTALE {
                    self.layouts(file).gone.get_or_insert_with(|| format!("{msg} (the metadata server no longer knows the file)"));
                }
                self.st().free.push(idx);
                return self.complete(io.tag, io.op, io.file, io.offset, io.len, r);
            }
            let now = Instant::now();
            let since = *io.since.get_or_insert(now);
            let window = Duration::from_secs(self.cfg.retry_s as u64);
            if now.duration_since(since) < window {
                // Wait and drive it again from the start.
                let st = self.st();
                if st.waiting.is_empty() && !st.wait_logged {
                    st.wait_pause = crate::RETRY_FIRST;
                    st.wait_at = now + st.wait_pause;
                    st.wait_logged = true;
                    eprintln!("chimera-fio: {msg}; I/Os wait for the data server (up to chimera_retry_s={} s)", self.cfg.retry_s);
                }
                io.redrives = 0;
                io.tried = 0;
                io.count = None;
                io.errors.clear();
                let st = self.st();
                st.ios[idx as usize] = Some(io);
                st.waiting.push_back(idx);
                return;
            }
            if self.cfg.retry_s > 0 {
                r = Err((libc::EIO, format!("{msg}; gave up after chimera_retry_s={} s", self.cfg.retry_s)));
            }
        }
        self.st().free.push(idx);
        self.complete(io.tag, io.op, io.file, io.offset, io.len, r);
    }

    /// Make room in `Held` for a write of `len` bytes (one copy per mirror
    /// answer): at the bound, sync every file with held writes (COMMIT on
    /// their data servers, resending what a restart lost). A failure is
    /// reported by that file's next fsync.
    fn pnfs_hold_room(&mut self, len: usize) {
        if self.held.max == 0 || self.held.has_room(len) {
            return;
        }
        for f in self.held.files() {
            if let Err((_, m)) = self.pnfs_sync(f) {
                eprintln!("chimera-fio: a COMMIT to make room for held writes (chimera_hold_mib) failed: {m}");
                if let Some(f) = self.files[f as usize].as_mut() {
                    f.lost = Some(m);
                }
            }
            // A file whose data servers all failed holds nothing to keep.
            self.held.covered(f, u64::MAX);
        }
    }

    /// A call to the metadata server, `f`, made again while the server is
    /// away or in its grace period, for up to `retry_s`: a lost connection
    /// or session (the server restarted) re-establishes the session and
    /// reclaims the opens first (`mds_recover`); GRACE and DELAY wait.
    /// Other errors, and the window's end, are errors naming `what`.
    pub(crate) fn mds<R>(&mut self, what: &str, mut f: impl FnMut(&mut Engine) -> client::Result<R>) -> Result<R, (i32, String)> {
        let since = Instant::now();
        let window = Duration::from_secs(self.cfg.retry_s as u64);
        let mut pause = crate::RETRY_FIRST;
        let mut logged = false;
        loop {
            let e = match f(self) {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            let code = match &e {
                client::Error::Nfs4 { code, .. } => *code,
                _ => 0,
            };
            let lost = e.is_connection()
                || matches!(e, client::Error::Timeout { .. })
                || [p::NFS4ERR_BADSESSION, p::NFS4ERR_DEADSESSION, p::NFS4ERR_STALE_CLIENTID, p::NFS4ERR_EXPIRED, p::NFS4ERR_STALE_STATEID]
                    .iter()
                    .any(|&s| s as u32 == code);
            let wait = [p::NFS4ERR_GRACE, p::NFS4ERR_DELAY].iter().any(|&s| s as u32 == code);
            if !lost && !wait {
                return Err(nfs(e, what));
            }
            if since.elapsed() >= window {
                return Err((e.errno(), format!("{what}: {e}; gave up after chimera_retry_s={} s", self.cfg.retry_s)));
            }
            if !logged {
                logged = true;
                let doing = if lost { "re-establishing the session with the metadata server" } else { "waiting for the metadata server" };
                eprintln!("chimera-fio: {what}: {e}; {doing} (up to chimera_retry_s={} s)", self.cfg.retry_s);
            }
            if lost {
                match self.mds_recover() {
                    Ok(()) => continue,
                    Err(m) if since.elapsed() >= window => {
                        return Err((libc::EIO, format!("{what}: {m}; gave up after chimera_retry_s={} s", self.cfg.retry_s)))
                    }
                    Err(_) => {}
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(crate::RETRY_MAX);
        }
    }

    /// A new connection, client ID and session with the metadata server,
    /// reclaiming every open file in its grace period; a server that kept
    /// no record of this client (or no grace) gets them opened again by
    /// name. Layouts are gone with the old session: dropped, to be asked
    /// for again.
    fn mds_recover(&mut self) -> Result<(), String> {
        let (addr, auth, limits) = (self.st().addr.clone(), self.st().auth.clone(), self.limits);
        // I/Os in flight on the old session: sent again on the new one
        // (their answers, if any come, belong to the old connection).
        let st = self.st();
        let orphans: Vec<u32> = st.mds_io.drain().map(|(_, (idx, _))| idx).collect();
        for idx in orphans.into_iter().rev() {
            st.mds_queue.push_front(idx);
        }
        let files: Vec<usize> = (0..self.files.len()).filter(|&i| self.files[i].as_ref().is_some_and(|f| f.pnfs.is_some())).collect();
        let mut opens: Vec<(Open4, u32)> = files.iter().map(|&i| (self.layouts(i as u32).open.clone(), 3)).collect();
        match self.st().mds.reestablish_reclaiming(&addr, &auth, limits, &mut opens) {
            Ok(()) => {
                for (k, &i) in files.iter().enumerate() {
                    self.layouts(i as u32).open = opens[k].0.clone();
                }
                eprintln!("chimera-fio: metadata-server session re-established, {} open(s) reclaimed", files.len());
            }
            Err(e) => {
                self.st().mds.reestablish(&addr, &auth, limits).map_err(|e2| format!("re-establishing the session with {addr}: {e2} (reclaiming: {e})"))?;
                let mut lost = 0;
                for &i in &files {
                    if self.layouts(i as u32).gone.is_some() {
                        continue;
                    }
                    let path = self.files[i].as_ref().expect("open").path.clone();
                    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
                    let (name, dirs) = parts.split_last().expect("opened by this path");
                    let dir = format!("{}/{}", self.st().export, dirs.join("/"));
                    match self.st().mds.open(&dir, name, 3, None) {
                        Ok(o) if o.fh == self.files[i].as_ref().expect("open").fh => self.layouts(i as u32).open = o,
                        // Not there, or another file by that name now: the
                        // server did not keep its namespace.
                        r => {
                            let why = r.err().map_or_else(|| "another file has its name now".to_string(), |e| e.to_string());
                            let m = format!("{path}: the metadata server restarted without it ({why}); its data cannot be reached");
                            eprintln!("chimera-fio: {m}");
                            self.layouts(i as u32).gone = Some(m);
                            lost += 1;
                        }
                    }
                }
                eprintln!("chimera-fio: metadata-server session re-established ({e}: {} file(s) opened again, {lost} gone)", files.len() - lost);
            }
        }
        for &i in &files {
            let l = self.layouts(i as u32);
            l.segs.clear();
            l.lstateid = None;
            l.generation += 1;
            // Layouts of the old session need no return.
            l.returning = None;
        }
        self.st().returns_pending = 0;
        Ok(())
    }

    /// The metadata server's connection for `pump`'s poll(2), when it may
    /// call back (a back channel was granted and the connection is up).
    pub(crate) fn pnfs_mds_pollfd(&mut self) -> Option<libc::pollfd> {
        let st = self.pnfs.as_mut()?;
        if (!st.mds.back_channel && st.mds_io.is_empty()) || st.mds.rpc().broken().is_some() {
            return None;
        }
        Some(st.mds.rpc().poll_fd())
    }

    /// Whether the pump must look at the MDS connection without waiting:
    /// answers to I/Os through it are in (a blocking MDS call took them
    /// off the socket), or its connection broke under them. Also when a
    /// call on it is due to time out.
    pub(crate) fn pnfs_mds_due(&mut self) -> (bool, Option<Instant>) {
        let Some(st) = self.pnfs.as_mut() else { return (false, None) };
        if st.mds_io.is_empty() {
            return (false, None);
        }
        let rpc = st.mds.rpc();
        (rpc.completed() > 0 || rpc.broken().is_some(), rpc.next_deadline())
    }

    /// I/Os through the MDS in flight on its session now.
    pub fn mds_io_in_flight(&self) -> usize {
        self.pnfs.as_ref().map_or(0, |s| s.mds_io.len())
    }

    /// The most I/Os through the MDS that were in flight at once.
    pub fn mds_io_in_flight_max(&self) -> usize {
        self.pnfs.as_ref().map_or(0, |s| s.mds_io_max)
    }

    /// `pump` found the metadata server's connection ready (or answers
    /// waiting on it): take the answers to I/Os through it, send the I/Os
    /// waiting for a slot, answer the recalls it brought and return what
    /// can be returned.
    pub(crate) fn pnfs_mds_ready(&mut self, revents: i16) {
        let mut done = std::mem::take(&mut self.st().mds_done);
        self.st().mds.rpc().on_ready(revents, &mut done);
        for c in done.drain(..) {
            // Not found: an answer from before the session was re-established.
            if let Some((idx, fl)) = self.st().mds_io.remove(&c.xid) {
                self.pnfs_mds_io_done(idx, fl, c.result);
            }
        }
        self.st().mds_done = done;
        self.pnfs_mds_send_queued();
        self.pnfs_recalls();
    }

    /// Answer every CB_LAYOUTRECALL received (RFC 8881 §12.5.5): a file
    /// whose layout is held drops its segments at once (new I/O waits)
    /// and owes a LAYOUTRETURN, sent when none of its I/O is left on a data
    /// server (`pnfs_finish_returns`); nothing held is NOMATCHING_LAYOUT.
    pub(crate) fn pnfs_recalls(&mut self) {
        let Some(st) = self.pnfs.as_mut() else { return };
        if !st.mds.back_channel {
            return;
        }
        while let Some(r) = self.st().mds.next_recall() {
            let matched: Vec<usize> = (0..self.files.len())
                .filter(|&i| {
                    let Some(f) = self.files[i].as_ref() else { return false };
                    let Some(l) = f.pnfs.as_ref() else { return false };
                    // A return already owed counts: it is on its way.
                    let held = l.lstateid.is_some() || !l.segs.is_empty() || l.returning.is_some();
                    held && match &r.what {
                        client::nfs4::RecallWhat::File { fh, .. } => *fh == f.fh,
                        _ => true,
                    }
                })
                .collect();
            let status = if matched.is_empty() { p::NFS4ERR_NOMATCHING_LAYOUT } else { p::NFS4_OK };
            if let Err(e) = self.st().mds.answer_recall(&r, status) {
                eprintln!("chimera-fio: answering a layout recall of the metadata server: {e}");
            }
            self.st().recalls += 1;
            for i in matched {
                let l = self.layouts(i as u32);
                let sid = match &r.what {
                    // The server names the seqid it wants returned.
                    client::nfs4::RecallWhat::File { stateid, .. } => Some(stateid.clone()),
                    _ => l.lstateid.clone(),
                };
                l.segs.clear();
                l.lstateid = None;
                l.generation += 1;
                // A recall again before the return: the newest seqid.
                let owed = l.returning.is_some();
                if let Some(sid) = sid.or_else(|| l.returning.clone()) {
                    l.returning = Some(sid);
                    if !owed {
                        self.st().returns_pending += 1;
                    }
                }
            }
        }
        self.pnfs_finish_returns();
    }

    /// LAYOUTRETURN every recalled layout whose file has no I/O left on a
    /// data server, then drive the I/Os that waited for it.
    pub(crate) fn pnfs_finish_returns(&mut self) {
        let Some(st) = self.pnfs.as_ref() else { return };
        if st.returns_pending == 0 && st.recall_parked.is_empty() {
            return;
        }
        for i in 0..self.files.len() {
            let Some((fh, path, sid, iomode)) = self.files[i].as_ref().and_then(|f| {
                let l = f.pnfs.as_ref()?;
                Some((f.fh.clone(), f.path.clone(), l.returning.clone()?, l.iomode))
            }) else {
                continue;
            };
            if self.conns.iter().any(|c| c.ops.values().any(|op| op.io != NO_IO && op.file as usize == i)) {
                continue;
            }
            if let Err(e) = self.st().mds.layoutreturn(&fh, &sid, iomode, &[]) {
                // The server revokes it in time; new layouts are asked for.
                eprintln!("chimera-fio: LAYOUTRETURN of a recalled layout of {path}: {e}");
            }
            self.layouts(i as u32).returning = None;
            self.st().returns_pending -= 1;
        }
        let parked = std::mem::take(&mut self.st().recall_parked);
        for idx in parked {
            self.pnfs_drive(idx);
        }
        self.send_all();
    }

    /// Layout recalls answered so far (pNFS mode).
    pub fn recalls(&self) -> u64 {
        self.pnfs.as_ref().map_or(0, |s| s.recalls)
    }

    /// When the next waiting I/O is due (None: none waits).
    pub(crate) fn pnfs_wait_at(&self) -> Option<Instant> {
        self.pnfs.as_ref().filter(|s| !s.waiting.is_empty()).map(|s| s.wait_at)
    }

    /// Drive every waiting I/O again (it is time); those that fail again
    /// wait once more, after a longer pause.
    pub(crate) fn pnfs_retry_due(&mut self) {
        let st = self.st();
        let pause = (st.wait_pause * 2).min(crate::RETRY_MAX);
        let ready: Vec<u32> = st.waiting.drain(..).collect();
        for idx in ready {
            self.pnfs_drive(idx);
        }
        let st = self.st();
        st.wait_pause = pause;
        st.wait_at = Instant::now() + pause;
        if st.waiting.is_empty() {
            // Every one went out (or failed for good): the episode is over.
            st.wait_logged = false;
        }
        self.send_all();
    }

    /// COMMIT `file`'s data file on the data server of `w`, covering the
    /// writes answered up to `upto`. Held writes answered with another
    /// verifier (the data server restarted since) are sent again there
    /// and COMMITted, until they all carry the COMMIT's verifier; without
    /// copies of them (`chimera_hold_mib=0`) a changed verifier is EIO
    /// naming the data server.
    fn pnfs_commit_ds(&mut self, file: u32, w: &Written, upto: u64) -> Result<(), (i32, String)> {
        let addr = self.conns[w.conn].addr.clone();
        let commit = |c: &mut Conn| {
            c.nfs.submit_commit(&w.fh).and_then(|x| c.nfs.rpc().wait(x)).and_then(|r| client::nfs3::Nfs3::committed(&r))
        };
        let verf = match commit(&mut self.conns[w.conn]) {
            // A connection found lost only now (the data server restarted
            // while nothing was in flight): once more on a new one.
            Err(e) if e.is_connection() => {
                self.reconnect(w.conn).map_err(|m| (libc::EIO, format!("COMMIT on data server {addr}: {m}")))?;
                commit(&mut self.conns[w.conn])
            }
            r => r,
        }
        .map_err(|e| nfs(e, &format!("COMMIT on data server {addr}")))?;
        let changed = w.changed || w.verf.is_some_and(|v| v != verf);
        if changed && self.held.max == 0 {
            let why = "restarted since UNSTABLE writes it acknowledged (COMMIT verifier changed); they may be lost";
            return Err((libc::EIO, format!("data server {addr} {why}")));
        }
        let path = self.files[file as usize].as_ref().expect("open").path.clone();
        let server = format!("data server {addr}");
        let to = crate::ResendTo { conn: Some(w.conn), held: w.conn as u32, fh: &w.fh, server: &server };
        self.resend_rounds(file, &to, &path, verf, upto)
    }

    /// The write verifier of an UNSTABLE answer on connection `conn` to
    /// `file`'s data there.
    pub(crate) fn pnfs_write_verf(&mut self, file: u32, conn: usize, verf: [u8; 8]) {
        let Some(l) = self.files.get_mut(file as usize).and_then(Option::as_mut).and_then(|f| f.pnfs.as_mut()) else { return };
        for w in l.written.iter_mut().filter(|w| w.conn == conn) {
            match w.verf {
                None => w.verf = Some(verf),
                Some(v) if v != verf => w.changed = true,
                Some(_) => {}
            }
        }
    }

    /// An UNSTABLE answer to a WRITE of `data` at `offset` through the MDS:
    /// its verifier is noted on the file, and a copy is held (`Held`, on
    /// `MDS_HELD`) for a resend should the MDS restart before the COMMIT.
    pub(crate) fn pnfs_mds_unstable(&mut self, file: u32, offset: u64, data: &[u8], verf: [u8; 8]) {
        let Some(f) = self.files.get_mut(file as usize).and_then(Option::as_mut) else { return };
        match f.unstable_verf {
            None => f.unstable_verf = Some(verf),
            Some(v) if v != verf => f.verf_changed = true,
            Some(_) => {}
        }
        if self.held.max > 0 {
            self.held.add(file, MDS_HELD, offset, data, verf);
        } else {
            f.unheld = true;
        }
    }

    /// COMMIT on the MDS what was written UNSTABLE through it (answered up
    /// to `upto`). Held writes it answered with another verifier (it
    /// restarted since) are written again through it and COMMITted, until
    /// they all carry the COMMIT's verifier; without copies of them
    /// (`chimera_hold_mib=0`) a changed verifier is EIO naming the file.
    fn pnfs_commit_mds(&mut self, file: u32, upto: u64) -> Result<(), (i32, String)> {
        let f = self.files[file as usize].as_ref().expect("open");
        if f.unstable_verf.is_none() && !f.verf_changed && !self.held.holds_on(file, MDS_HELD) {
            return Ok(());
        }
        let (fh, path) = (f.fh.clone(), f.path.clone());
        let mut verf = self.mds("COMMIT on the metadata server", |e| e.st().mds.commit(&fh))?;
        let (changed, unheld) = self.files[file as usize].as_mut().expect("open").take_unstable(verf);
        if changed && unheld {
            self.held.covered_on(file, Some(MDS_HELD), upto);
            let why = "the metadata server restarted since UNSTABLE writes it acknowledged (COMMIT verifier changed); they may be lost";
            return Err((libc::EIO, format!("{path}: {why} (not all were held for resending: chimera_hold_mib)")));
        }
        let mut stale = std::mem::take(&mut self.stale);
        let mut r = Ok(());
        for round in 0.. {
            self.held.stale(file, MDS_HELD, upto, verf, &mut stale);
            if stale.is_empty() {
                break;
            }
            if round == crate::RESEND_ROUNDS_MAX {
                let m = format!("{path} on the metadata server: the write verifier kept changing while resending uncommitted writes ({} rounds)", crate::RESEND_ROUNDS_MAX);
                r = Err((libc::EIO, m));
                break;
            }
            let bytes: u64 = stale.iter().map(|&k| self.held.entries[k].len as u64).sum();
            eprintln!(
                "chimera-fio: the metadata server restarted (its write verifier changed): sending {} uncommitted write(s) of {path}, {bytes} bytes, again",
                stale.len()
            );
            match self.pnfs_resend_mds(file, &stale, &path) {
                Ok(()) => {}
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
            self.held.resent.0 += stale.len() as u64;
            self.held.resent.1 += bytes;
            match self.mds("COMMIT on the metadata server", |e| e.st().mds.commit(&fh)) {
                Ok(v) => verf = v,
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        self.stale = stale;
        self.held.covered_on(file, Some(MDS_HELD), upto);
        r
    }

    /// Write the held writes `which` of `file` again through the MDS
    /// (UNSTABLE, waiting for each); they take their new answers' verifiers.
    fn pnfs_resend_mds(&mut self, file: u32, which: &[usize], path: &str) -> Result<(), (i32, String)> {
        for &k in which {
            let (offset, at, len) = {
                let e = &self.held.entries[k];
                (e.offset, e.at, e.len as usize)
            };
            let what = format!("resending writes of {path} through the metadata server");
            let (count, stable, verf) = self.mds(&what, |e| {
                let open = &e.files[file as usize].as_ref().and_then(|f| f.pnfs.as_ref()).expect("a pNFS file").open;
                let st = e.pnfs.as_mut().expect("pNFS mode");
                st.mds.write(open, offset, &e.held.arena[at..at + len], false)
            })?;
            if (count as usize) < len {
                return Err((libc::EIO, format!("{what}: {count} of {len} bytes at {offset} written")));
            }
            if stable {
                // Stored stably: nothing left to resend.
                self.held.entries[k].live = false;
                self.held.dead += len;
            } else {
                self.held.entries[k].verf = verf;
            }
        }
        Ok(())
    }

    /// COMMIT every data file written since the last sync, then
    /// LAYOUTCOMMIT the size to the MDS.
    fn pnfs_sync(&mut self, file: u32) -> Result<(), (i32, String)> {
        if let Some(m) = self.layouts(file).gone.clone() {
            // Nothing written to it can be reached: nothing to keep either.
            self.layouts(file).written.clear();
            self.held.covered(file, u64::MAX);
            return Err((libc::ESTALE, m));
        }
        let upto = self.held.seq;
        let written = std::mem::take(&mut self.layouts(file).written);
        let failed = self.layouts(file).failed.clone();
        let mut first_err = self.files[file as usize].as_mut().and_then(|f| f.lost.take()).map(|m| (libc::EIO, m));
        if let Err(e) = self.pnfs_commit_mds(file, upto) {
            first_err.get_or_insert(e);
        }
        for w in &written {
            let c = &mut self.conns[w.conn];
            if w.mirrors > 1 && c.device.is_some_and(|d| failed.contains(&d)) {
                // Reported failed: its copy is stale, the MDS knows (and
                // brings it back from a good one); nothing to resend there.
                self.held.covered_on(file, Some(w.conn as u32), upto);
                continue;
            }
            if c.nfs.rpc().broken().is_some() {
                if let Err(m) = self.reconnect(w.conn) {
                    first_err.get_or_insert((libc::EIO, format!("COMMIT on a data server: {m}")));
                    continue;
                }
            }
            if let Err(e) = self.pnfs_commit_ds(file, w, upto) {
                first_err.get_or_insert(e);
            }
        }
        // fio does not quiesce before an fsync: writes still in flight are
        // answered after this COMMIT and not covered by it. Their data
        // files stay listed for the next one.
        for w in written {
            let in_flight = self.conns[w.conn].ops.values().any(|op| op.op == Op::Write && op.file == file);
            let l = self.layouts(file);
            if in_flight && !l.written.iter().any(|x| x.conn == w.conn && x.fh == w.fh) {
                l.written.push(Written { verf: None, changed: false, ..w });
            }
        }
        let end = self.layouts(file).write_end;
        if end > 0 && self.layouts(file).lstateid.is_none() && self.layouts(file).returning.is_none() {
            // The layout was dropped (a data server failed, or the session
            // was re-established): a new one to LAYOUTCOMMIT under, for
            // the range written last (its data server just answered).
            self.segment(file, end - 1, 1)?;
        }
        if end > 0 {
            self.mds("LAYOUTCOMMIT", |e| {
                let f = e.files[file as usize].as_ref().expect("open");
                let l = f.pnfs.as_ref().expect("pNFS");
                // A recalled layout is still ours until returned.
                let sid = l.lstateid.clone().or_else(|| l.returning.clone()).expect("a layout");
                let fh = f.fh.clone();
                e.st().mds.layoutcommit(&fh, &sid, end - 1)
            })?;
            self.layouts(file).write_end = 0;
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Sync, return the layout, CLOSE.
    pub(crate) fn pnfs_close(&mut self, file: u32) -> Result<(), (i32, String)> {
        let r = self.pnfs_sync(file);
        if self.layouts(file).gone.is_some() {
            // Its open and layout belonged to the server's old life.
            return r;
        }
        // A recalled layout is returned here (fio quiesces before close).
        let recalled = self.layouts(file).returning.take();
        if recalled.is_some() {
            self.st().returns_pending -= 1;
        }
        let (fh, sid, iomode) = {
            let f = self.files[file as usize].as_ref().expect("open");
            let l = f.pnfs.as_ref().expect("pNFS");
            (f.fh.clone(), recalled.or_else(|| l.lstateid.clone()), l.iomode)
        };
        if let Some(sid) = sid {
            self.mds("LAYOUTRETURN at close", |e| e.st().mds.layoutreturn(&fh, &sid, iomode, &[]))?;
        }
        self.mds("CLOSE", |e| {
            let open = e.layouts(file).open.clone();
            e.st().mds.close(&open)
        })?;
        r
    }

    /// I/Os that went through the MDS (pNFS mode).
    pub fn through_mds(&self) -> u64 {
        self.pnfs.as_ref().map_or(0, |s| s.through_mds)
    }
}
