//! READs, WRITEs and COMMIT on the core loops: their device operations
//! are submitted on the calling core's own queue to each device and
//! completed when that core's loop polls it (`rpc::poller`), so the call
//! never leaves the core — no hand-off to a worker thread and back. A
//! COMMIT (and a stable WRITE, once its blocks are written) flushes every
//! device through the core's queues; only the log flush that follows, when
//! the file has something to log, runs on a worker while the call stays
//! parked (`vfs::durable::Durability::sync_later`).
//!
//! Per core and per file system: one queue per device (`CORE_QUEUE_DEPTH`)
//! and a buffer pool of its own (`CORE_BUFS` x `CORE_BUF_BYTES`), so the
//! reads in flight on a core are bounded and never take the buffers the
//! metadata log needs. A read that does not fit (no buffers, a full queue,
//! a thread that is not a polling loop) goes to the worker threads as
//! before. The data I/O gate (`IoGate`) is held from planning to the last
//! completion, exactly as a worker holds it; a read whose file lost blocks
//! meanwhile is done again on a worker (as `read_impl` retries). A write
//! holds its blocks' range of its file's write lock (`WLock`, taken
//! without waiting) as long, so writes of disjoint blocks of one file are
//! in flight together;
//! one that must read a partial block first runs on a worker.

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use block::{BlockQueue, BufPool, Completion, Op, BLOCK_BYTES};
use vfs::{Done, FileHandle, IoDone, VfsError};

use crate::meta::{self, Phys, BLOCK};
use crate::wlock::WLock;
use crate::{Inner, WritePlan};

/// Bytes per buffer of a core's pool (and so per device operation).
pub const CORE_BUF_BYTES: usize = 64 << 10;
/// Buffers per core and file system: bounds the reads and writes in flight
/// on a core (64 x 4 KiB, or 4 x 1 MiB).
pub const CORE_BUFS: usize = 64;
/// Operations in flight per core on each device.
pub const CORE_QUEUE_DEPTH: usize = 128;

const BLOCKS_PER_BUF: u64 = (CORE_BUF_BYTES / BLOCK_BYTES) as u64;

thread_local! {
    /// This thread's state per file system it read from.
    static CORES: RefCell<Vec<Rc<RefCell<CoreIo>>>> = const { RefCell::new(Vec::new()) };
}

/// A read the caller asked for, planned under the metadata lock.
pub(crate) struct Planned {
    pub fh: FileHandle,
    pub offset: u64,
    /// Bytes the reply carries (inside the file).
    pub n: usize,
    pub eof: bool,
    /// Mapped blocks of the range: (file block, physical block).
    pub plan: Vec<(u64, Phys)>,
    /// The file's unmap count when planned (`Inode::unmaps`).
    pub unmaps: u64,
    /// The gate epoch entered for it.
    pub epoch: u64,
}

/// A write planned under its file's write lock (its blocks' range, held)
/// and the gate.
pub(crate) struct PlannedWrite {
    pub fh: FileHandle,
    pub offset: u64,
    pub end: u64,
    pub plan: WritePlan,
    pub epoch: u64,
    pub wlock: Arc<WLock>,
    /// The mount's fsid for the attributes answered.
    pub fsid: u64,
    /// FILE_SYNC or DATA_SYNC: committed before it answers.
    pub stable: bool,
}

impl PlannedWrite {
    /// The blocks of its file it holds locked.
    pub fn range(&self) -> crate::wlock::Range {
        crate::wlock::blocks(self.offset, self.end, BLOCK)
    }
}

enum Kind {
    Read { p: Planned, out: Vec<u8> },
    Write { w: PlannedWrite },
    /// Flush `flush` (`Devs::flush_begin`) of every device for a COMMIT of
    /// `fh`, or for a stable write of `write` = (bytes, fsid).
    Commit { fh: FileHandle, flush: u64, write: Option<(usize, u64)> },
}

/// A call whose device operations are in flight on this core.
struct Job {
    kind: Kind,
    pending: usize,
    failed: bool,
    done: Option<Done>,
}

struct OpCtx {
    job: usize,
    /// File byte offset of the first block the operation reads or writes,
    /// and its length.
    at: u64,
    bytes: u64,
}

pub(crate) struct CoreIo {
    fs: Weak<Inner>,
    queues: Vec<Option<Box<dyn BlockQueue>>>,
    pool: BufPool,
    jobs: Vec<Option<Job>>,
    free_jobs: Vec<usize>,
    ops: Vec<Option<OpCtx>>,
    free_ops: Vec<usize>,
    done: Vec<Completion>,
}

/// Start `p` on this core. `Err` hands the read (and its `done`) back when
/// it cannot run here; the caller runs it on a worker. The gate stays
/// entered either way.
pub(crate) fn start(fs: &Arc<Inner>, p: Planned, done: Done) -> Result<(), (Planned, Done)> {
    let Some(core) = core_for(fs) else { return Err((p, done)) };
    let mut c = core.borrow_mut();
    let ops = device_ops(&p.plan);
    if !c.room(fs, &ops) {
        return Err((p, done));
    }
    let out = vec![0u8; p.n];
    c.submit(fs, ops, Job { kind: Kind::Read { p, out }, pending: 0, failed: false, done: Some(done) }, None);
    Ok(())
}

/// Start the planned write `w` of `data` on this core; `Err` hands it back
/// (still holding its lock and the gate) when it cannot run here.
pub(crate) fn start_write(fs: &Arc<Inner>, w: PlannedWrite, data: &[u8], done: Done) -> Result<(), (PlannedWrite, Done)> {
    let Some(core) = core_for(fs) else { return Err((w, done)) };
    let mut c = core.borrow_mut();
    let mapped: Vec<(u64, Phys)> = w.plan.iter().map(|&(f, p, _, _)| (f, p)).collect();
    let ops = device_ops(&mapped);
    if !c.room(fs, &ops) {
        return Err((w, done));
    }
    let (offset, end) = (w.offset, w.end);
    c.submit(fs, ops, Job { kind: Kind::Write { w }, pending: 0, failed: false, done: Some(done) }, Some((offset, end, data)));
    Ok(())
}

/// Start a COMMIT of `fh` (`write`: the stable write it ends) on this
/// core: a flush of every device on the core's queues. `Err` hands `done`
/// back when it cannot run here (the caller commits on a worker).
pub(crate) fn start_commit(fs: &Arc<Inner>, fh: FileHandle, write: Option<(usize, u64)>, done: Done) -> Result<(), Done> {
    let Some(core) = core_for(fs) else { return Err(done) };
    let mut c = core.borrow_mut();
    c.commit(fs, fh, write, done)
}

/// A free index of a slab of optional entries (`free` lists them), or a
/// new one at its end.
fn slot<T>(slab: &mut Vec<Option<T>>, free: &mut Vec<usize>) -> usize {
    free.pop().unwrap_or_else(|| {
        slab.push(None);
        slab.len() - 1
    })
}

/// This thread's state for `fs`, made (and registered with the loop) on
/// first use. `None` when the thread is not a polling loop, or the state
/// cannot be made.
fn core_for(fs: &Arc<Inner>) -> Option<Rc<RefCell<CoreIo>>> {
    if !rpc::poller::available() {
        return None;
    }
    CORES.with(|cores| {
        let mut cores = cores.borrow_mut();
        let me = Arc::downgrade(fs);
        if let Some(c) = cores.iter().find(|c| c.try_borrow().map(|c| Weak::ptr_eq(&c.fs, &me)).unwrap_or(false)) {
            return Some(c.clone());
        }
        // Forget states of file systems that are gone and idle.
        cores.retain(|c| c.try_borrow().map(|c| !c.is_gone()).unwrap_or(true));
        let pool = match BufPool::new(block::PoolConfig { buf_bytes: CORE_BUF_BYTES, bufs_max: CORE_BUFS, hugepages: block::Hugepages::AsConfigured }) {
            Ok(p) => {
                if let Some(w) = p.warning().filter(|_| block::huge::usage().is_some()) {
                    eprintln!("diskfs: a core's I/O buffers: {w}");
                }
                p
            }
            Err(e) => {
                eprintln!("diskfs: no I/O buffers for this core ({e}); its reads and writes run on the I/O threads");
                return None;
            }
        };
        let c = Rc::new(RefCell::new(CoreIo {
            fs: me,
            queues: fs.devs.devs.iter().map(|_| None).collect(),
            pool,
            jobs: Vec::new(),
            free_jobs: Vec::new(),
            ops: Vec::new(),
            free_ops: Vec::new(),
            done: Vec::with_capacity(CORE_QUEUE_DEPTH),
        }));
        if !rpc::poller::register(c.clone()) {
            return None;
        }
        cores.push(c.clone());
        Some(c)
    })
}

/// The device operations of a plan: (device, lba, blocks, file block).
fn device_ops(plan: &[(u64, Phys)]) -> Vec<(usize, u64, u32, u64)> {
    let mut out = Vec::new();
    for (fblock, phys, count) in meta::runs(plan.iter().copied()) {
        let (d, lba) = (meta::phys_dev(phys) as usize, meta::phys_lba(phys));
        let mut k = 0u64;
        while k < count as u64 {
            let blocks = (count as u64 - k).min(BLOCKS_PER_BUF);
            out.push((d, lba + k, blocks as u32, fblock + k));
            k += blocks;
        }
    }
    out
}

impl CoreIo {
    fn is_gone(&self) -> bool {
        self.fs.strong_count() == 0 && self.jobs.iter().all(|r| r.is_none())
    }

    fn inflight(&self) -> usize {
        self.queues.iter().flatten().map(|q| q.inflight()).sum()
    }

    /// Whether buffers and queue slots are free for every operation of a
    /// call (making the queues on first use): a call is never half on the
    /// device and half waiting.
    fn room(&mut self, fs: &Arc<Inner>, ops: &[(usize, u64, u32, u64)]) -> bool {
        if ops.len() > self.pool.bufs_free() {
            return false;
        }
        let want: Vec<usize> = (0..self.queues.len()).map(|d| ops.iter().filter(|o| o.0 == d).count()).collect();
        self.slots(fs, &want)
    }

    /// Whether device `d`'s queue has `want[d]` free slots, for every `d`
    /// (making the queues on first use).
    fn slots(&mut self, fs: &Arc<Inner>, want: &[usize]) -> bool {
        for (d, &want) in want.iter().enumerate() {
            if want == 0 {
                continue;
            }
            if self.queues[d].is_none() {
                match fs.devs.devs[d].queue(0, CORE_QUEUE_DEPTH) {
                    Ok(q) => self.queues[d] = Some(q),
                    Err(e) => {
                        eprintln!("diskfs: no core queue on {}: {e}; its I/O runs on the I/O threads", fs.devs.name(d));
                        return false;
                    }
                }
            }
            let q = self.queues[d].as_ref().expect("made above");
            if q.depth_max() - q.inflight() < want {
                return false;
            }
        }
        true
    }

    /// Submit a call's operations (room was checked). A write's blocks are
    /// filled from `data` (bytes `offset..end` of the file; the rest of a
    /// partial new block is zeros).
    fn submit(&mut self, fs: &Arc<Inner>, ops: Vec<(usize, u64, u32, u64)>, mut job: Job, data: Option<(u64, u64, &[u8])>) {
        let j = slot(&mut self.jobs, &mut self.free_jobs);
        let is_read = data.is_none();
        for (d, lba, blocks, fblock) in ops {
            let mut buf = self.pool.get().expect("counted by room");
            let at = fblock * BLOCK;
            if let Some((offset, end, data)) = data {
                let len = blocks as usize * BLOCK_BYTES;
                let (lo, hi) = (at.max(offset), (at + len as u64).min(end));
                buf[..len].fill(0);
                buf[(lo - at) as usize..(hi - at) as usize].copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            }
            let o = slot(&mut self.ops, &mut self.free_ops);
            let q = self.queues[d].as_mut().expect("made by room");
            let op = if is_read { Op::Read { lba, blocks, buf } } else { Op::Write { lba, blocks, buf } };
            match q.submit(op, o as u64) {
                Ok(()) => {
                    self.ops[o] = Some(OpCtx { job: j, at, bytes: blocks as u64 * BLOCK });
                    job.pending += 1;
                }
                Err(rej) => {
                    // Room was counted, so only an invalid operation (a
                    // plan outside the device: corrupt metadata) lands here.
                    if let block::Rejected::Invalid(_, e) = rej {
                        eprintln!("diskfs: operation refused: {e}");
                    }
                    fs.devs.io_errors.fetch_add(1, Ordering::Relaxed);
                    self.free_ops.push(o);
                    job.failed = true;
                }
            }
        }
        match job.kind {
            Kind::Read { .. } => fs.core_reads.fetch_add(1, Ordering::Relaxed),
            Kind::Write { .. } => fs.core_writes.fetch_add(1, Ordering::Relaxed),
            Kind::Commit { .. } => unreachable!("submitted by commit"),
        };
        self.launched(j, job);
    }

    /// Keep job `j` until its operations are back; one with none on the
    /// device (every submit refused) is answered now.
    fn launched(&mut self, j: usize, job: Job) {
        let pending = job.pending;
        self.jobs[j] = Some(job);
        if pending == 0 {
            self.finish(j);
        }
    }

    /// A flush of every device for a COMMIT (see `start_commit`); `Err`
    /// hands `done` back when a queue has no room.
    fn commit(&mut self, fs: &Arc<Inner>, fh: FileHandle, write: Option<(usize, u64)>, done: Done) -> Result<(), Done> {
        if !self.slots(fs, &vec![1; self.queues.len()]) {
            return Err(done);
        }
        let j = slot(&mut self.jobs, &mut self.free_jobs);
        let flush = fs.devs.flush_begin();
        let mut job = Job { kind: Kind::Commit { fh, flush, write }, pending: 0, failed: false, done: Some(done) };
        for d in 0..self.queues.len() {
            let o = slot(&mut self.ops, &mut self.free_ops);
            let q = self.queues[d].as_mut().expect("made by slots");
            match q.submit(Op::Flush, o as u64) {
                Ok(()) => {
                    self.ops[o] = Some(OpCtx { job: j, at: 0, bytes: 0 });
                    job.pending += 1;
                }
                Err(_) => {
                    fs.devs.io_errors.fetch_add(1, Ordering::Relaxed);
                    self.free_ops.push(o);
                    job.failed = true;
                }
            }
        }
        fs.core_commits.fetch_add(1, Ordering::Relaxed);
        self.launched(j, job);
        Ok(())
    }

    fn on_completion(&mut self, c: Completion) {
        let o = c.token as usize;
        let Some(ctx) = self.ops.get_mut(o).and_then(|x| x.take()) else { return };
        self.free_ops.push(o);
        let fs = self.fs.upgrade();
        let Some(job) = self.jobs[ctx.job].as_mut() else { return };
        match (c.result, c.buf) {
            // A flush (no buffer).
            (Ok(()), None) if matches!(job.kind, Kind::Commit { .. }) => {}
            (Ok(()), Some(buf)) => {
                if let Kind::Read { p, out } = &mut job.kind {
                    // The part of the operation's blocks inside the reply.
                    let start = p.offset;
                    let end = start + p.n as u64;
                    let lo = ctx.at.max(start);
                    let hi = (ctx.at + ctx.bytes).min(end);
                    if lo < hi {
                        out[(lo - start) as usize..(hi - start) as usize].copy_from_slice(&buf[(lo - ctx.at) as usize..(hi - ctx.at) as usize]);
                    }
                }
            }
            (r, _) => {
                if let Err(e) = r {
                    eprintln!("diskfs: {e}");
                }
                if let Some(fs) = &fs {
                    fs.devs.io_errors.fetch_add(1, Ordering::Relaxed);
                }
                job.failed = true;
            }
        }
        job.pending -= 1;
        if job.pending == 0 {
            self.finish(ctx.job);
        }
    }

    /// Every operation of job `j` is back: answer it (a read whose file
    /// lost blocks meanwhile is done again on a worker); a write releases
    /// its file's lock.
    fn finish(&mut self, j: usize) {
        let Some(mut job) = self.jobs[j].take() else { return };
        self.free_jobs.push(j);
        let done = job.done.take().expect("answered once");
        let fs = self.fs.upgrade();
        match job.kind {
            Kind::Write { w } => {
                let count = (w.end - w.offset) as usize;
                let r = match &fs {
                    Some(fs) if !job.failed => {
                        fs.mark_written(&w.fh, &w.plan);
                        fs.unstable_written(&w.fh, count, w.fsid).map(crate::write_done)
                    }
                    _ => Err(VfsError::Io),
                };
                w.wlock.unlock(w.range());
                let Some(fs) = fs else { return done(r) };
                fs.gate_exit(w.epoch);
                if r.is_err() || !w.stable {
                    return done(r);
                }
                // Stable: its blocks are written; now the COMMIT, here if
                // the queues have room, else on a worker.
                if let Err(done) = self.commit(&fs, w.fh, Some((count, w.fsid)), done) {
                    let (s, fh, fsid) = (fs.clone(), w.fh, w.fsid);
                    fs.run(Box::new(move || done(s.written(&fh, count, fsid, true).map(crate::write_done))));
                }
            }
            Kind::Commit { fh, flush, write } => {
                let Some(fs) = fs else { return done(Err(VfsError::Io)) };
                if job.failed {
                    return done(Err(VfsError::Io));
                }
                fs.devs.flush_end(flush);
                let lsn = match fs.commit_log(&fh) {
                    Ok(l) => l,
                    Err(e) => return done(Err(e)),
                };
                let s = fs.clone();
                let answer = move |r: vfs::VfsResult<()>| {
                    done(r.and_then(|()| match write {
                        None => Ok(IoDone::Commit),
                        Some((count, fsid)) => s.stable_written(&fh, count, fsid).map(crate::write_done),
                    }))
                };
                // Answered at once when another call's flush covered it.
                vfs::durable::Durability::sync_later(&*fs, lsn, Box::new(answer));
            }
            Kind::Read { p, out } => {
                let Some(fs) = fs else { return done(Err(VfsError::Io)) };
                if job.failed {
                    fs.gate_exit(p.epoch);
                    return done(Err(VfsError::Io));
                }
                let same = fs.meta().st.get(p.fh.ino, p.fh.generation).map(|i| i.unmaps == p.unmaps);
                fs.gate_exit(p.epoch);
                match same {
                    Ok(true) => done(Ok(IoDone::Read { data: out, eof: p.eof })),
                    Ok(false) => {
                        fs.core_read_retries.fetch_add(1, Ordering::Relaxed);
                        let (s, fh, offset, len) = (fs.clone(), p.fh, p.offset, out.len());
                        fs.run(vfs::iopool::read_job(len, done, move |buf| s.read_impl(&fh, offset, buf)));
                    }
                    Err(e) => done(Err(e)),
                }
            }
        }
    }
}

impl rpc::poller::Poller for CoreIo {
    fn poll(&mut self) -> usize {
        if self.inflight() == 0 {
            return 0;
        }
        let mut done = std::mem::take(&mut self.done);
        for q in self.queues.iter_mut().flatten() {
            q.poll(&mut done);
        }
        let n = done.len();
        for c in done.drain(..) {
            self.on_completion(c);
        }
        self.done = done;
        n
    }

    fn busy(&self) -> bool {
        self.inflight() > 0
    }

    fn notify_fds(&self, out: &mut Vec<RawFd>) {
        let busy = || self.queues.iter().flatten().filter(|q| q.inflight() > 0);
        // A queue that completes only when polled (a VFIO queue pair):
        // report none, so the loop keeps spinning while it is busy.
        if busy().any(|q| q.notify_fd().is_none()) {
            return;
        }
        out.extend(busy().filter_map(|q| q.notify_fd()));
    }

    fn gone(&self) -> bool {
        self.is_gone()
    }
}
