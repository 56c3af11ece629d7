//! The block layer: devices addressed in 4 KiB blocks, driven from the core
//! loops without blocking.
//!
//! A [`BlockDevice`] is opened once per server; each core takes its own
//! [`BlockQueue`] (`device.queue(core)`) and uses it only from its own
//! thread. A queue is bounded (`depth_max` operations in flight):
//! [`BlockQueue::submit`] never blocks — it queues the operation or answers
//! `Busy` — and [`BlockQueue::poll`] hands queued operations to the device
//! (one system call per batch) and drains finished ones as [`Completion`]s
//! carrying the caller's token, so a core polls its device queues next to
//! its sockets. Data moves in [`Buf`]s from a per-core [`BufPool`]: a
//! request owns its buffer while in flight and the completion hands it back.
//!
//! Ordering and durability follow NVMe and Linux: operations in flight
//! together complete in any order; a write is durable only once a flush
//! submitted after the write completed has completed. The test devices
//! ([`mem::MemDevice`], [`recording::RecordingDevice`], [`fault::FaultDevice`])
//! model exactly that, so a file system proven on them holds on hardware.
//!
//! Knows nothing of files, NFS or the `Vfs` trait.

pub mod conformance;
pub mod error;
pub mod fault;
pub mod huge;
pub mod mem;
pub mod pool;
pub mod recording;
pub mod rng;
pub mod stats;
pub mod sync;
pub mod uring;

pub use error::{BlockError, ErrorKind, OpKind};
pub use pool::{Buf, BufPool, Hugepages, PoolConfig, PoolError};

use std::os::fd::RawFd;
use std::sync::Arc;

/// The logical block: every address and length is in these.
pub const BLOCK_BYTES: usize = 4096;
/// Largest queue depth a device hands out (rings, slabs and test devices
/// are sized by it at queue creation).
pub const DEPTH_MAX: usize = 4096;

/// One operation, owning its buffer while in flight.
#[derive(Debug)]
pub enum Op {
    /// Read `blocks` blocks at `lba` into the start of `buf`.
    Read { lba: u64, blocks: u32, buf: Buf },
    /// Write the first `blocks` blocks of `buf` at `lba`.
    Write { lba: u64, blocks: u32, buf: Buf },
    /// Make every write that completed before this was submitted durable.
    Flush,
    /// After completion `blocks` blocks at `lba` read as zeros (the device
    /// may deallocate them; see each implementation).
    WriteZeroes { lba: u64, blocks: u64 },
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Read { .. } => OpKind::Read,
            Op::Write { .. } => OpKind::Write,
            Op::Flush => OpKind::Flush,
            Op::WriteZeroes { .. } => OpKind::WriteZeroes,
        }
    }

    /// First block and block count (`None` for a flush).
    pub fn range(&self) -> Option<(u64, u64)> {
        match *self {
            Op::Read { lba, blocks, .. } | Op::Write { lba, blocks, .. } => Some((lba, blocks as u64)),
            Op::WriteZeroes { lba, blocks } => Some((lba, blocks)),
            Op::Flush => None,
        }
    }

    /// Byte offset on the device, for error messages.
    pub fn offset_bytes(&self) -> Option<u64> {
        self.range().map(|(lba, _)| lba.saturating_mul(BLOCK_BYTES as u64))
    }

    /// The buffer back, for a completion or a rejection.
    pub fn into_buf(self) -> Option<Buf> {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => Some(buf),
            Op::Flush | Op::WriteZeroes { .. } => None,
        }
    }

    pub fn is_write(&self) -> bool {
        matches!(self, Op::Write { .. } | Op::WriteZeroes { .. })
    }
}

/// A finished operation: the caller's token, its result, and the buffer it
/// was submitted with (for a read, now filled).
#[derive(Debug)]
pub struct Completion {
    pub token: u64,
    pub result: Result<(), BlockError>,
    pub buf: Option<Buf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// `depth_max` operations are in flight: poll, then submit again.
    Busy,
}

/// A refused submission: the operation (and its buffer) comes back.
#[derive(Debug)]
pub enum Rejected {
    Busy(Op),
    /// The operation can never succeed on this device (out of range,
    /// read-only, malformed); nothing was queued.
    Invalid(Op, BlockError),
}

impl Rejected {
    pub fn into_op(self) -> Op {
        match self {
            Rejected::Busy(op) | Rejected::Invalid(op, _) => op,
        }
    }
}

/// What every device says about itself.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// The path (or test name) every error carries.
    pub name: Arc<str>,
    /// Capacity in 4 KiB blocks.
    pub blocks: u64,
    pub read_only: bool,
}

impl DeviceInfo {
    pub fn bytes(&self) -> u64 {
        self.blocks * BLOCK_BYTES as u64
    }

    /// Check an operation against the device before queueing it: range,
    /// buffer size, writability. Every implementation submits through it,
    /// so the checks (and their messages) are the same on every device.
    pub fn check(&self, op: &Op) -> Result<(), BlockError> {
        let err = |kind| Err(BlockError::new(&self.name, op.kind(), op.offset_bytes(), kind));
        if op.is_write() && self.read_only {
            return err(ErrorKind::ReadOnly { errno: None });
        }
        let Some((lba, blocks)) = op.range() else { return Ok(()) };
        if blocks == 0 {
            return err(ErrorKind::BadRequest { why: "zero blocks" });
        }
        if let Op::Read { buf, .. } | Op::Write { buf, .. } = op {
            if blocks > buf.blocks() as u64 {
                return err(ErrorKind::BadRequest { why: "buffer smaller than the request" });
            }
        }
        match lba.checked_add(blocks) {
            Some(end) if end <= self.blocks => Ok(()),
            _ => err(ErrorKind::OutOfRange { blocks: self.blocks }),
        }
    }
}

/// A device: opened once, one queue per core.
pub trait BlockDevice: Send + Sync {
    fn info(&self) -> &DeviceInfo;

    /// A new queue for `core` with at most `depth_max` operations in flight
    /// (1..=`DEPTH_MAX`). The queue belongs to the first thread that
    /// submits or polls on it.
    fn queue(&self, core: usize, depth_max: usize) -> Result<Box<dyn BlockQueue>, BlockError>;

    /// The device's counters and latency histogram, if it keeps them.
    fn stats(&self) -> Option<stats::Snapshot> {
        None
    }
}

/// One core's queue to a device. Never blocks, except `wait` (tools, tests).
pub trait BlockQueue: Send {
    fn info(&self) -> &DeviceInfo;

    fn depth_max(&self) -> usize;

    /// Operations submitted and not yet returned by `poll` / `wait`.
    fn inflight(&self) -> usize;

    /// Queue `op`; its completion carries `token`. `Busy` at `depth_max`.
    fn submit(&mut self, op: Op, token: u64) -> Result<(), Rejected>;

    /// Hand queued operations to the device and append finished ones to
    /// `done`; returns how many were appended. Never blocks.
    fn poll(&mut self, done: &mut Vec<Completion>) -> usize;

    /// As `poll`, but blocks until at least one operation finished (returns
    /// 0 only when nothing is in flight). Not for the core loops.
    fn wait(&mut self, done: &mut Vec<Completion>) -> usize;

    /// An eventfd that becomes readable when completions are waiting, for a
    /// loop that sleeps in its own ring; `None`: the queue completes only
    /// when polled, so keep polling while `inflight() > 0`.
    fn notify_fd(&self) -> Option<RawFd>;
}

/// Shared handle to any device (what wrappers and the backend hold).
pub type Device = Arc<dyn BlockDevice>;

pub(crate) fn check_depth(info: &DeviceInfo, depth_max: usize) -> Result<(), BlockError> {
    if depth_max == 0 || depth_max > DEPTH_MAX {
        return Err(BlockError::new(&info.name, OpKind::Open, None, ErrorKind::BadRequest { why: "queue depth_max must be 1..=4096" }));
    }
    Ok(())
}
