//! `RecordingDevice` and crash images (the CrashMonkey / ALICE technique).
//!
//! The recording device wraps any device and logs, in order, every write
//! (its blocks and bytes) and every flush, each with the logical time it
//! was submitted and completed, across all queues. From a [`Recording`] and
//! the image the device held when recording started, a test builds the
//! states a crash could leave:
//!
//! - **Flush points.** A flush makes durable every write that completed
//!   before the flush was submitted (NVMe and Linux promise no more). Flush
//!   point `k` (1-based, in order of completion; 0 is the start) is the
//!   moment flush `k` completed: its image holds exactly the writes durable
//!   then, applied in the order they completed.
//! - **Between flush points.** A crash after flush point `k` and before
//!   point `k + 1` may also leave any of the writes that were not durable
//!   at `k` and were submitted before point `k + 1` (the *pending* writes),
//!   each 4 KiB block on its own (a multi-block write tears at 4 KiB), and
//!   when several pending writes cover one block any of them may be the one
//!   that landed. `crash_image` draws one such state from a seed: for each
//!   block a pending write touches, uniformly one of {its content at `k`,
//!   each pending write's content}.
//!
//! A failed write stays pending forever (an erroring device may have
//! written part of it); a failed flush is no flush point. Write-zeroes is
//! recorded as a write of zero blocks.

use crate::error::BlockError;
use crate::mem::Image;
use crate::rng::SeededRng;
use crate::{BlockDevice, BlockQueue, Completion, Device, DeviceInfo, Op, Rejected, BLOCK_BYTES};
use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

/// A write's contents per 4 KiB block (`None`: a zero block).
pub type BlockData = Vec<Option<Arc<[u8]>>>;

/// One recorded write: where, what (per block; `None` is a zero block),
/// and when it was submitted and completed (logical time).
#[derive(Debug, Clone)]
pub struct WriteRecord {
    pub lba: u64,
    pub data: BlockData,
    pub submitted: u64,
    pub completed: Option<u64>,
    pub ok: bool,
}

#[derive(Debug, Clone)]
pub struct FlushRecord {
    pub submitted: u64,
    pub completed: Option<u64>,
    pub ok: bool,
}

#[derive(Default)]
struct Log {
    clock: u64,
    writes: Vec<WriteRecord>,
    flushes: Vec<FlushRecord>,
}

impl Log {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

pub struct RecordingDevice {
    inner: Device,
    log: Arc<Mutex<Log>>,
}

impl RecordingDevice {
    /// Record from now on; the caller keeps the image the device holds now
    /// (e.g. `MemDevice::snapshot`) as the base of every crash image.
    pub fn new(inner: Device) -> RecordingDevice {
        RecordingDevice { inner, log: Arc::new(Mutex::new(Log::default())) }
    }

    /// What was recorded so far (a copy; block contents are shared).
    pub fn recording(&self) -> Recording {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        Recording { blocks: self.inner.info().blocks, writes: log.writes.clone(), flushes: log.flushes.clone() }
    }
}

impl BlockDevice for RecordingDevice {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn queue(&self, core: usize, depth_max: usize) -> Result<Box<dyn BlockQueue>, BlockError> {
        let inner = self.inner.queue(core, depth_max)?;
        Ok(Box::new(RecordingQueue {
            inner,
            log: self.log.clone(),
            tags: (0..depth_max).map(|_| None).collect(),
            free: (0..depth_max as u64).rev().collect(),
            scratch: Vec::with_capacity(depth_max),
        }))
    }
}

#[derive(Clone, Copy)]
enum Tag {
    Write(usize),
    Flush(usize),
    Read,
}

struct RecordingQueue {
    inner: Box<dyn BlockQueue>,
    log: Arc<Mutex<Log>>,
    /// Per inner token (a slot): the caller's token and what to record.
    tags: Vec<Option<(u64, Tag)>>,
    free: Vec<u64>,
    scratch: Vec<Completion>,
}

fn block_data(op: &Op) -> Option<(u64, BlockData)> {
    match op {
        Op::Write { lba, blocks, buf } => {
            let d = buf[..*blocks as usize * BLOCK_BYTES].chunks(BLOCK_BYTES).map(|b| Some(Arc::from(b))).collect();
            Some((*lba, d))
        }
        Op::WriteZeroes { lba, blocks } => Some((*lba, vec![None; *blocks as usize])),
        Op::Read { .. } | Op::Flush => None,
    }
}

impl BlockQueue for RecordingQueue {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn depth_max(&self) -> usize {
        self.inner.depth_max()
    }

    fn inflight(&self) -> usize {
        self.inner.inflight()
    }

    fn submit(&mut self, op: Op, token: u64) -> Result<(), Rejected> {
        // Copy before the operation moves; recorded only once accepted.
        let data = if self.info().check(&op).is_ok() { block_data(&op) } else { None };
        let is_flush = matches!(op, Op::Flush);
        let Some(slot) = self.free.pop() else { return Err(Rejected::Busy(op)) };
        if let Err(r) = self.inner.submit(op, slot) {
            self.free.push(slot);
            return Err(r);
        }
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let submitted = log.tick();
        let tag = match (data, is_flush) {
            (Some((lba, data)), _) => {
                log.writes.push(WriteRecord { lba, data, submitted, completed: None, ok: false });
                Tag::Write(log.writes.len() - 1)
            }
            (None, true) => {
                log.flushes.push(FlushRecord { submitted, completed: None, ok: false });
                Tag::Flush(log.flushes.len() - 1)
            }
            (None, false) => Tag::Read,
        };
        self.tags[slot as usize] = Some((token, tag));
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<Completion>) -> usize {
        let mut got = std::mem::take(&mut self.scratch);
        self.inner.poll(&mut got);
        let n = self.finish(&mut got, done);
        self.scratch = got;
        n
    }

    fn wait(&mut self, done: &mut Vec<Completion>) -> usize {
        let mut got = std::mem::take(&mut self.scratch);
        self.inner.wait(&mut got);
        let n = self.finish(&mut got, done);
        self.scratch = got;
        n
    }

    fn notify_fd(&self) -> Option<RawFd> {
        self.inner.notify_fd()
    }
}

impl RecordingQueue {
    /// Record the completions in `got` and hand them on with the caller's tokens.
    fn finish(&mut self, got: &mut Vec<Completion>, done: &mut Vec<Completion>) -> usize {
        let n = got.len();
        if n == 0 {
            return 0;
        }
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        for mut c in got.drain(..) {
            let slot = c.token;
            let (token, tag) = self.tags[slot as usize].take().expect("a completion for a recorded submission");
            self.free.push(slot);
            let t = log.tick();
            let ok = c.result.is_ok();
            match tag {
                Tag::Write(i) => (log.writes[i].completed, log.writes[i].ok) = (Some(t), ok),
                Tag::Flush(i) => (log.flushes[i].completed, log.flushes[i].ok) = (Some(t), ok),
                Tag::Read => {}
            }
            c.token = token;
            done.push(c);
        }
        n
    }
}

/// A finished recording: every write and flush, with their times.
#[derive(Debug, Clone)]
pub struct Recording {
    blocks: u64,
    writes: Vec<WriteRecord>,
    flushes: Vec<FlushRecord>,
}

impl Recording {
    pub fn writes(&self) -> &[WriteRecord] {
        &self.writes
    }

    pub fn flushes(&self) -> &[FlushRecord] {
        &self.flushes
    }

    /// The successful flushes in order of completion: (submitted, completed).
    fn points(&self) -> Vec<(u64, u64)> {
        let mut p: Vec<(u64, u64)> =
            self.flushes.iter().filter(|f| f.ok).filter_map(|f| f.completed.map(|c| (f.submitted, c))).collect();
        p.sort_by_key(|&(_, c)| c);
        p
    }

    /// Flush points: successful flushes (point 0, the start, not counted).
    pub fn flush_points(&self) -> usize {
        self.points().len()
    }

    /// A write completed before this time is durable at point `k`.
    fn durable_before(points: &[(u64, u64)], k: usize) -> u64 {
        points[..k].iter().map(|&(s, _)| s).max().unwrap_or(0)
    }

    /// Indexes of the writes durable at flush point `k`, in completion order.
    pub fn durable_writes(&self, k: usize) -> Vec<usize> {
        let points = self.points();
        assert!(k <= points.len(), "flush point {k} of {}", points.len());
        let before = Self::durable_before(&points, k);
        let mut w: Vec<usize> =
            (0..self.writes.len()).filter(|&i| self.writes[i].ok && self.writes[i].completed.is_some_and(|c| c < before)).collect();
        w.sort_by_key(|&i| self.writes[i].completed);
        w
    }

    /// Indexes of the writes a crash between points `k` and `k + 1` may or
    /// may not have left: not durable at `k`, submitted before point `k + 1`.
    pub fn pending_writes(&self, k: usize) -> Vec<usize> {
        let points = self.points();
        assert!(k <= points.len(), "flush point {k} of {}", points.len());
        let before = Self::durable_before(&points, k);
        let end = points.get(k).map_or(u64::MAX, |&(_, c)| c);
        let durable = |w: &WriteRecord| w.ok && w.completed.is_some_and(|c| c < before);
        (0..self.writes.len()).filter(|&i| !durable(&self.writes[i]) && self.writes[i].submitted < end).collect()
    }

    fn apply(img: &mut Image, w: &WriteRecord) {
        for (i, d) in w.data.iter().enumerate() {
            img.set(w.lba + i as u64, d.clone());
        }
    }

    /// The image at flush point `k`: `base` plus exactly the writes durable then.
    pub fn image_at_flush(&self, base: &Image, k: usize) -> Image {
        assert_eq!(base.blocks(), self.blocks, "base image of another size");
        let mut img = base.clone();
        for i in self.durable_writes(k) {
            Self::apply(&mut img, &self.writes[i]);
        }
        img
    }

    /// The image with every successful write applied in completion order
    /// (what the device holds when nothing crashed).
    pub fn image_all(&self, base: &Image) -> Image {
        let mut w: Vec<&WriteRecord> = self.writes.iter().filter(|w| w.ok && w.completed.is_some()).collect();
        w.sort_by_key(|w| w.completed);
        let mut img = base.clone();
        w.into_iter().for_each(|w| Self::apply(&mut img, w));
        img
    }

    /// One crash state between flush points `k` and `k + 1`, drawn from
    /// `seed` (see the module comment). Images drawn from the same seed are
    /// equal.
    pub fn crash_image(&self, base: &Image, k: usize, seed: u64) -> Image {
        let mut img = self.image_at_flush(base, k);
        let mut candidates: BTreeMap<u64, Vec<&Option<Arc<[u8]>>>> = BTreeMap::new();
        for i in self.pending_writes(k) {
            let w = &self.writes[i];
            for (j, d) in w.data.iter().enumerate() {
                candidates.entry(w.lba + j as u64).or_default().push(d);
            }
        }
        let mut rng = SeededRng::new(seed);
        for (lba, c) in candidates {
            let pick = rng.below(c.len() as u64 + 1) as usize;
            if pick > 0 {
                img.set(lba, c[pick - 1].clone());
            }
        }
        img
    }
}
