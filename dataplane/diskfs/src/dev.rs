//! The devices one diskfs spans, and blocking I/O on them from the thread
//! that calls (a diskfs worker, or a core for metadata; see lib.rs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;

use block::{BlockError, BlockQueue, BufPool, Device, Op, BLOCK_BYTES};

/// Blocks per I/O buffer (and so per device operation).
pub const BUF_BLOCKS: usize = 64;
/// Buffers in a server's pool: bounds the memory for data in flight (the
/// pool is mapped and populated at start). Tools use `TOOL_BUFS`.
pub const BUFS_MAX: usize = 128;
pub const TOOL_BUFS: usize = 4;
/// Queues kept per device: one per thread that does I/O (an io_uring
/// queue belongs to the first thread that submits on it), so bounded by
/// the server's threads (cores, workers).
const QUEUES_KEPT: usize = 256;

pub struct Devs {
    pub devs: Vec<Device>,
    queues: Vec<Mutex<HashMap<ThreadId, Box<dyn BlockQueue>>>>,
    pool: BufPool,
    /// Flushes started (all devices); a data write that completed when
    /// this read `k` is durable once a flush numbered above `k` completes.
    flush_started: AtomicU64,
    /// Highest flush number completed.
    flush_done: AtomicU64,
    pub io_errors: AtomicU64,
}

impl Devs {
    pub fn new(devs: Vec<Device>, bufs: usize) -> Result<Devs, String> {
        let pool = BufPool::new(block::PoolConfig {
            buf_bytes: BUF_BLOCKS * BLOCK_BYTES,
            bufs_max: bufs.max(1),
            hugepages: block::Hugepages::AsConfigured,
        })
        .map_err(|e| format!("diskfs: {e}"))?;
        // Hugepages asked for (common.huge_pages) and not had: say so.
        if let Some(w) = pool.warning().filter(|_| block::huge::usage().is_some()) {
            eprintln!("diskfs: I/O buffers: {w}");
        }
        let queues = devs.iter().map(|_| Mutex::new(HashMap::new())).collect();
        Ok(Devs { devs, queues, pool, flush_started: AtomicU64::new(0), flush_done: AtomicU64::new(0), io_errors: AtomicU64::new(0) })
    }

    pub fn name(&self, d: usize) -> &str {
        &self.devs[d].info().name
    }

    fn with_queue<T>(&self, d: usize, f: impl FnOnce(&mut dyn BlockQueue) -> T) -> Result<T, BlockError> {
        let me = std::thread::current().id();
        let q = self.queues[d].lock().unwrap_or_else(|e| e.into_inner()).remove(&me);
        let mut q = match q {
            Some(q) => q,
            None => self.devs[d].queue(0, 4)?,
        };
        let r = f(q.as_mut());
        let mut kept = self.queues[d].lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < QUEUES_KEPT && q.inflight() == 0 {
            kept.insert(me, q);
        }
        Ok(r)
    }

    fn buf(&self) -> block::Buf {
        loop {
            if let Some(b) = self.pool.get() {
                return b;
            }
            std::thread::yield_now();
        }
    }

    fn count<T>(&self, r: Result<T, BlockError>) -> Result<T, BlockError> {
        if r.is_err() {
            self.io_errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Read whole blocks at `lba` of device `d` into `out`.
    pub fn read(&self, d: usize, lba: u64, out: &mut [u8]) -> Result<(), BlockError> {
        let r = self.with_queue(d, |q| {
            for (i, part) in out.chunks_mut(BUF_BLOCKS * BLOCK_BYTES).enumerate() {
                let buf = self.buf();
                let at = lba + (i * BUF_BLOCKS) as u64;
                let c = block::sync::run(q, Op::Read { lba: at, blocks: (part.len() / BLOCK_BYTES) as u32, buf });
                c.result?;
                part.copy_from_slice(&c.buf.expect("a read returns its buffer")[..part.len()]);
            }
            Ok(())
        });
        self.count(r.and_then(|x| x))
    }

    /// Write whole blocks at `lba` of device `d`.
    pub fn write(&self, d: usize, lba: u64, data: &[u8]) -> Result<(), BlockError> {
        let r = self.with_queue(d, |q| {
            for (i, part) in data.chunks(BUF_BLOCKS * BLOCK_BYTES).enumerate() {
                let mut buf = self.buf();
                buf[..part.len()].copy_from_slice(part);
                let at = lba + (i * BUF_BLOCKS) as u64;
                block::sync::run(q, Op::Write { lba: at, blocks: (part.len() / BLOCK_BYTES) as u32, buf }).result?;
            }
            Ok(())
        });
        self.count(r.and_then(|x| x))
    }

    /// The flush count now: tag a data write that just completed with it.
    pub fn write_tag(&self) -> u64 {
        self.flush_started.load(Ordering::Acquire)
    }

    /// Highest flush number completed: writes tagged below it are durable.
    pub fn flushed(&self) -> u64 {
        self.flush_done.load(Ordering::Acquire)
    }

    /// Flush every device; afterwards every write that completed before the
    /// call is durable.
    pub fn flush_all(&self) -> Result<(), BlockError> {
        let k = self.flush_begin();
        for d in 0..self.devs.len() {
            let r = self.with_queue(d, |q| block::sync::flush(q));
            self.count(r.and_then(|x| x))?;
        }
        self.flush_end(k);
        Ok(())
    }

    /// A flush of every device starts (elsewhere: a core's own queues): its
    /// number, for `flush_end` once every device has answered.
    pub fn flush_begin(&self) -> u64 {
        self.flush_started.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Flush `k` of every device succeeded: writes tagged before it are
    /// durable.
    pub fn flush_end(&self, k: u64) {
        self.flush_done.fetch_max(k, Ordering::AcqRel);
    }

    /// Flush one device (the log's).
    pub fn flush(&self, d: usize) -> Result<(), BlockError> {
        let r = self.with_queue(d, |q| block::sync::flush(q));
        self.count(r.and_then(|x| x))
    }
}
