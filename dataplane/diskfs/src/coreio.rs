//! READs on the core loops: a READ that needs the device is submitted on
//! the calling core's own queue to each device and completed when that
//! core's loop polls it (`rpc::poller`), so the call never leaves the core
//! — no hand-off to a worker thread and back.
//!
//! Per core and per file system: one queue per device (`CORE_QUEUE_DEPTH`)
//! and a buffer pool of its own (`CORE_BUFS` x `CORE_BUF_BYTES`), so the
//! reads in flight on a core are bounded and never take the buffers the
//! metadata log needs. A read that does not fit (no buffers, a full queue,
//! a thread that is not a polling loop) goes to the worker threads as
//! before. The data I/O gate (`IoGate`) is held from planning to the last
//! completion, exactly as a worker holds it; a read whose file lost blocks
//! meanwhile is done again on a worker (as `read_impl` retries).

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use block::{BlockQueue, BufPool, Completion, Op, BLOCK_BYTES};
use vfs::{Done, FileHandle, IoDone, VfsError};

use crate::meta::{self, Phys, BLOCK};
use crate::Inner;

/// Bytes per buffer of a core's read pool (and so per device read).
pub const CORE_BUF_BYTES: usize = 64 << 10;
/// Buffers per core and file system: bounds the reads in flight on a core
/// (64 x 4 KiB reads, or 4 x 1 MiB).
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

struct Read {
    p: Planned,
    out: Vec<u8>,
    pending: usize,
    failed: bool,
    done: Option<Done>,
}

struct OpCtx {
    read: usize,
    /// File byte offset of the first block the operation read.
    at: u64,
}

pub(crate) struct CoreIo {
    fs: Weak<Inner>,
    queues: Vec<Option<Box<dyn BlockQueue>>>,
    pool: BufPool,
    reads: Vec<Option<Read>>,
    free_reads: Vec<usize>,
    ops: Vec<Option<OpCtx>>,
    free_ops: Vec<usize>,
    done: Vec<Completion>,
}

/// Start `p` on this core. `Err` hands the read (and its `done`) back when
/// it cannot run here; the caller runs it on a worker. The gate stays
/// entered either way.
pub(crate) fn start(fs: &Arc<Inner>, p: Planned, done: Done) -> Result<(), (Planned, Done)> {
    if !rpc::poller::available() {
        return Err((p, done));
    }
    let Some(core) = core_for(fs) else { return Err((p, done)) };
    let mut c = core.borrow_mut();
    c.submit(fs, p, done)
}

/// This thread's state for `fs`, made (and registered with the loop) on
/// first use. `None` when it cannot be made.
fn core_for(fs: &Arc<Inner>) -> Option<Rc<RefCell<CoreIo>>> {
    CORES.with(|cores| {
        let mut cores = cores.borrow_mut();
        let me = Arc::downgrade(fs);
        if let Some(c) = cores.iter().find(|c| c.try_borrow().map(|c| Weak::ptr_eq(&c.fs, &me)).unwrap_or(false)) {
            return Some(c.clone());
        }
        // Forget states of file systems that are gone and idle.
        cores.retain(|c| c.try_borrow().map(|c| !c.is_gone()).unwrap_or(true));
        let pool = match BufPool::new(block::PoolConfig { buf_bytes: CORE_BUF_BYTES, bufs_max: CORE_BUFS, hugepages: block::Hugepages::Try }) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("diskfs: no read buffers for this core ({e}); its reads run on the I/O threads");
                return None;
            }
        };
        let c = Rc::new(RefCell::new(CoreIo {
            fs: me,
            queues: fs.devs.devs.iter().map(|_| None).collect(),
            pool,
            reads: Vec::new(),
            free_reads: Vec::new(),
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
        self.fs.strong_count() == 0 && self.reads.iter().all(|r| r.is_none())
    }

    fn inflight(&self) -> usize {
        self.queues.iter().flatten().map(|q| q.inflight()).sum()
    }

    fn submit(&mut self, fs: &Arc<Inner>, p: Planned, done: Done) -> Result<(), (Planned, Done)> {
        let ops = device_ops(&p.plan);
        // Everything the read needs, or nothing: a read is never half on
        // the device and half waiting.
        if ops.len() > self.pool.bufs_free() {
            return Err((p, done));
        }
        for d in 0..self.queues.len() {
            let want = ops.iter().filter(|o| o.0 == d).count();
            if want == 0 {
                continue;
            }
            if self.queues[d].is_none() {
                match fs.devs.devs[d].queue(0, CORE_QUEUE_DEPTH) {
                    Ok(q) => self.queues[d] = Some(q),
                    Err(e) => {
                        eprintln!("diskfs: no core queue on {}: {e}; reads run on the I/O threads", fs.devs.name(d));
                        return Err((p, done));
                    }
                }
            }
            let q = self.queues[d].as_ref().expect("made above");
            if q.depth_max() - q.inflight() < want {
                return Err((p, done));
            }
        }
        let out = vec![0u8; p.n];
        let r = match self.free_reads.pop() {
            Some(i) => i,
            None => {
                self.reads.push(None);
                self.reads.len() - 1
            }
        };
        let (mut pending, mut failed) = (0, false);
        for (d, lba, blocks, fblock) in ops {
            let buf = self.pool.get().expect("counted above");
            let o = match self.free_ops.pop() {
                Some(i) => i,
                None => {
                    self.ops.push(None);
                    self.ops.len() - 1
                }
            };
            let q = self.queues[d].as_mut().expect("made above");
            match q.submit(Op::Read { lba, blocks, buf }, o as u64) {
                Ok(()) => {
                    self.ops[o] = Some(OpCtx { read: r, at: fblock * BLOCK });
                    pending += 1;
                }
                Err(rej) => {
                    // Room was counted, so only an invalid operation (a
                    // plan outside the device: corrupt metadata) lands here.
                    if let block::Rejected::Invalid(_, e) = rej {
                        eprintln!("diskfs: read refused: {e}");
                    }
                    fs.devs.io_errors.fetch_add(1, Ordering::Relaxed);
                    self.free_ops.push(o);
                    failed = true;
                }
            }
        }
        fs.core_reads.fetch_add(1, Ordering::Relaxed);
        self.reads[r] = Some(Read { p, out, pending, failed, done: Some(done) });
        if pending == 0 {
            self.finish(r);
        }
        Ok(())
    }

    fn on_completion(&mut self, c: Completion) {
        let o = c.token as usize;
        let Some(ctx) = self.ops.get_mut(o).and_then(|x| x.take()) else { return };
        self.free_ops.push(o);
        let fs = self.fs.upgrade();
        let Some(rd) = self.reads[ctx.read].as_mut() else { return };
        match (c.result, c.buf) {
            (Ok(()), Some(buf)) => {
                // The part of the operation's blocks inside the reply.
                let start = rd.p.offset;
                let end = start + rd.p.n as u64;
                let lo = ctx.at.max(start);
                let hi = (ctx.at + CORE_BUF_BYTES as u64).min(end);
                if lo < hi {
                    rd.out[(lo - start) as usize..(hi - start) as usize].copy_from_slice(&buf[(lo - ctx.at) as usize..(hi - ctx.at) as usize]);
                }
            }
            (r, _) => {
                if let Err(e) = r {
                    eprintln!("diskfs: {e}");
                }
                if let Some(fs) = &fs {
                    fs.devs.io_errors.fetch_add(1, Ordering::Relaxed);
                }
                rd.failed = true;
            }
        }
        rd.pending -= 1;
        if rd.pending == 0 {
            self.finish(ctx.read);
        }
    }

    /// Every operation of read `r` is back: answer it, or do it again on a
    /// worker when the file lost blocks meanwhile.
    fn finish(&mut self, r: usize) {
        let Some(mut rd) = self.reads[r].take() else { return };
        self.free_reads.push(r);
        let done = rd.done.take().expect("answered once");
        let Some(fs) = self.fs.upgrade() else {
            done(Err(VfsError::Io));
            return;
        };
        if rd.failed {
            fs.gate_exit(rd.p.epoch);
            done(Err(VfsError::Io));
            return;
        }
        let same = fs.meta().st.get(rd.p.fh.ino, rd.p.fh.generation).map(|i| i.unmaps == rd.p.unmaps);
        fs.gate_exit(rd.p.epoch);
        match same {
            Ok(true) => done(Ok(IoDone::Read { data: rd.out, eof: rd.p.eof })),
            Ok(false) => {
                fs.core_read_retries.fetch_add(1, Ordering::Relaxed);
                let (s, fh, offset, len) = (fs.clone(), rd.p.fh, rd.p.offset, rd.out.len());
                fs.run(vfs::iopool::read_job(len, done, move |buf| s.read_impl(&fh, offset, buf)));
            }
            Err(e) => done(Err(e)),
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
