//! `FaultDevice`: wraps a device and fails I/O on purpose — on configured
//! block ranges, after a number of operations (a device that starts
//! dying), or every write once made read-only — so a backend's error paths
//! are tested against errors a real device gives (EIO, EROFS), each naming
//! the device and the failing offset. The plan can change while queues run
//! (`FaultControl`), like a device failing under load.
//!
//! A failed operation never reaches the inner device; its completion comes
//! from the next poll. Queues of this device have no notify fd: keep
//! polling while operations are in flight.

use crate::error::{BlockError, ErrorKind};
use crate::{BlockDevice, BlockQueue, Completion, Device, DeviceInfo, Op, Rejected, BLOCK_BYTES};
use std::ops::Range;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which operations a faulty range fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Faulty {
    Reads,
    Writes,
    All,
}

#[derive(Debug, Clone, Default)]
struct Plan {
    ranges: Vec<(Range<u64>, Faulty)>,
    /// Operations that still succeed before every operation fails.
    ops_left: Option<u64>,
    read_only: bool,
    /// How long each flush takes (a slow device's cache flush): it reaches
    /// the inner device at once, and its completion is held until then —
    /// a caller that waits (`wait`) sleeps that long, a polling loop goes
    /// on serving.
    flush_delay: Option<std::time::Duration>,
}

struct Faults {
    plan: Mutex<Plan>,
    ops: AtomicU64,
    failed: AtomicU64,
    flushes: AtomicU64,
}

/// Changes a `FaultDevice`'s plan and reads its counters, from any thread.
#[derive(Clone)]
pub struct FaultControl(Arc<Faults>);

impl FaultControl {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.0.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fail `which` operations touching any block in `lbas` with EIO.
    pub fn fail_range(&self, lbas: Range<u64>, which: Faulty) {
        self.plan().ranges.push((lbas, which));
    }

    /// Let `ops` more operations through, then fail every one with EIO.
    pub fn fail_after_ops(&self, ops: u64) {
        self.plan().ops_left = Some(ops);
    }

    /// Fail every write and write-zeroes with EROFS (reads and flushes work).
    pub fn set_read_only(&self, read_only: bool) {
        self.plan().read_only = read_only;
    }

    /// Make every flush take `delay` on the submitting thread (`None`:
    /// as fast as the inner device).
    pub fn set_flush_delay(&self, delay: Option<std::time::Duration>) {
        self.plan().flush_delay = delay;
    }

    /// Flushes submitted so far, over all queues.
    pub fn flushes(&self) -> u64 {
        self.0.flushes.load(Ordering::Relaxed)
    }

    /// Heal the device.
    pub fn clear(&self) {
        *self.plan() = Plan::default();
    }

    /// Operations submitted so far, over all queues.
    pub fn ops(&self) -> u64 {
        self.0.ops.load(Ordering::Relaxed)
    }

    /// Operations failed on purpose so far.
    pub fn failed(&self) -> u64 {
        self.0.failed.load(Ordering::Relaxed)
    }
}

pub struct FaultDevice {
    inner: Device,
    faults: Arc<Faults>,
}

impl FaultDevice {
    pub fn new(inner: Device) -> FaultDevice {
        let faults = Arc::new(Faults { plan: Mutex::new(Plan::default()), ops: AtomicU64::new(0), failed: AtomicU64::new(0), flushes: AtomicU64::new(0) });
        FaultDevice { inner, faults }
    }

    pub fn control(&self) -> FaultControl {
        FaultControl(self.faults.clone())
    }
}

impl BlockDevice for FaultDevice {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn queue(&self, core: usize, depth_max: usize) -> Result<Box<dyn BlockQueue>, BlockError> {
        let inner = self.inner.queue(core, depth_max)?;
        Ok(Box::new(FaultQueue { inner, faults: self.faults.clone(), failed: Vec::with_capacity(depth_max), slow: Vec::new(), held: Vec::new() }))
    }
}

struct FaultQueue {
    inner: Box<dyn BlockQueue>,
    faults: Arc<Faults>,
    /// Completions of operations failed on purpose, returned by the next poll.
    failed: Vec<Completion>,
    /// Flushes given a delay: (token, when they may complete).
    slow: Vec<(u64, Instant)>,
    /// Their completions, back from the inner device early.
    held: Vec<(Instant, Completion)>,
}

impl FaultQueue {
    /// The error `op` must fail with under the current plan, if any.
    fn verdict(&self, op: &Op) -> Option<ErrorKind> {
        let mut plan = self.faults.plan.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(left) = plan.ops_left.as_mut() {
            if *left == 0 {
                return Some(ErrorKind::Io { errno: libc::EIO });
            }
            *left -= 1;
        }
        if plan.read_only && op.is_write() {
            return Some(ErrorKind::ReadOnly { errno: Some(libc::EROFS) });
        }
        None
    }

    /// The first block of `op` inside a faulty range that fails it.
    fn faulty_block(&self, op: &Op) -> Option<u64> {
        let (lba, blocks) = op.range()?;
        let plan = self.faults.plan.lock().unwrap_or_else(|e| e.into_inner());
        let hit = |(r, which): &(Range<u64>, Faulty)| {
            let applies = match which {
                Faulty::All => true,
                Faulty::Reads => matches!(op, Op::Read { .. }),
                Faulty::Writes => op.is_write(),
            };
            let (start, end) = (lba.max(r.start), (lba + blocks).min(r.end));
            (applies && start < end).then_some(start)
        };
        plan.ranges.iter().filter_map(hit).min()
    }
}

impl BlockQueue for FaultQueue {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn depth_max(&self) -> usize {
        self.inner.depth_max()
    }

    fn inflight(&self) -> usize {
        self.inner.inflight() + self.failed.len() + self.held.len()
    }

    fn submit(&mut self, op: Op, token: u64) -> Result<(), Rejected> {
        if let Err(e) = self.info().check(&op) {
            return Err(Rejected::Invalid(op, e));
        }
        if self.inflight() >= self.depth_max() {
            return Err(Rejected::Busy(op));
        }
        self.faults.ops.fetch_add(1, Ordering::Relaxed);
        if matches!(op, Op::Flush) {
            self.faults.flushes.fetch_add(1, Ordering::Relaxed);
            let delay = self.faults.plan.lock().unwrap_or_else(|e| e.into_inner()).flush_delay;
            if let Some(d) = delay {
                self.slow.push((token, Instant::now() + d));
            }
        }
        let fail = match self.verdict(&op) {
            Some(kind) => Some((kind, op.offset_bytes())),
            None => self.faulty_block(&op).map(|b| (ErrorKind::Io { errno: libc::EIO }, Some(b * BLOCK_BYTES as u64))),
        };
        let Some((kind, offset)) = fail else { return self.inner.submit(op, token) };
        self.faults.failed.fetch_add(1, Ordering::Relaxed);
        let err = BlockError::new(&self.info().name, op.kind(), offset, kind);
        self.failed.push(Completion { token, result: Err(err), buf: op.into_buf() });
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<Completion>) -> usize {
        let n = self.failed.len();
        done.append(&mut self.failed);
        if self.slow.is_empty() && self.held.is_empty() {
            return n + self.inner.poll(done);
        }
        let at = done.len();
        self.inner.poll(done);
        // Slow flushes back early wait for their time.
        let mut k = at;
        while k < done.len() {
            match self.slow.iter().position(|s| s.0 == done[k].token) {
                Some(i) => {
                    let (_, when) = self.slow.swap_remove(i);
                    self.held.push((when, done.swap_remove(k)));
                }
                None => k += 1,
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].0 <= now {
                done.push(self.held.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        n + done.len() - at
    }

    fn wait(&mut self, done: &mut Vec<Completion>) -> usize {
        if !self.failed.is_empty() {
            return self.poll(done);
        }
        if self.slow.is_empty() && self.held.is_empty() {
            return self.inner.wait(done);
        }
        loop {
            let n = self.poll(done);
            if n > 0 || self.inflight() == 0 {
                return n;
            }
            let next = self.held.iter().map(|h| h.0).min();
            let nap = next.map_or(Duration::from_micros(50), |t| t.saturating_duration_since(Instant::now()).min(Duration::from_millis(5)));
            std::thread::sleep(nap);
        }
    }

    fn notify_fd(&self) -> Option<RawFd> {
        None
    }
}
