//! `MemDevice`: an in-memory device with the queue semantics of a real one,
//! and `Image`, a sparse device image (what crash images are made of).
//!
//! An operation takes effect when it completes, not when it is submitted,
//! so with a reorder seed the device behaves like hardware: a poll
//! completes a random subset of what is in flight, in a random order (a
//! read overtakes a write, two writes land in either order). Without a seed
//! every poll completes everything, in submission order. There is no
//! volatile cache here (a flush completes at once): crashes are modelled by
//! `recording`, which builds images from what was written and flushed.

use crate::error::BlockError;
use crate::rng::SeededRng;
use crate::{check_depth, BlockDevice, BlockQueue, Completion, DeviceInfo, Op, Rejected, BLOCK_BYTES};
use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

static ZERO_BLOCK: [u8; BLOCK_BYTES] = [0; BLOCK_BYTES];

/// A sparse device image: blocks never written (or zeroed) read as zeros.
/// Block contents are shared (`Arc`), so copies of an image are cheap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    blocks: u64,
    map: BTreeMap<u64, Arc<[u8]>>,
}

impl Image {
    pub fn new(blocks: u64) -> Image {
        Image { blocks, map: BTreeMap::new() }
    }

    /// Capacity in blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// One block's bytes.
    pub fn block(&self, lba: u64) -> &[u8] {
        assert!(lba < self.blocks, "block {lba} beyond an image of {} blocks", self.blocks);
        self.map.get(&lba).map_or(&ZERO_BLOCK[..], |b| &b[..])
    }

    /// Set one block; `None` or all zeros makes it a hole again (so equal
    /// contents compare equal however they were written).
    pub fn set(&mut self, lba: u64, data: Option<Arc<[u8]>>) {
        assert!(lba < self.blocks, "block {lba} beyond an image of {} blocks", self.blocks);
        match data {
            Some(d) if d.iter().any(|&b| b != 0) => {
                assert_eq!(d.len(), BLOCK_BYTES);
                self.map.insert(lba, d);
            }
            _ => {
                self.map.remove(&lba);
            }
        }
    }

    /// Blocks holding anything but zeros, in address order.
    pub fn nonzero_blocks(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.map.iter().map(|(&l, b)| (l, &b[..]))
    }

    /// Copy `out.len()` bytes (whole blocks) from block `lba`.
    pub fn read(&self, lba: u64, out: &mut [u8]) {
        for (i, part) in out.chunks_mut(BLOCK_BYTES).enumerate() {
            part.copy_from_slice(self.block(lba + i as u64));
        }
    }

    /// Store `data` (whole blocks) at block `lba`.
    pub fn write(&mut self, lba: u64, data: &[u8]) {
        assert_eq!(data.len() % BLOCK_BYTES, 0);
        for (i, part) in data.chunks(BLOCK_BYTES).enumerate() {
            self.set(lba + i as u64, Some(Arc::from(part)));
        }
    }
}

pub struct MemDevice {
    info: DeviceInfo,
    store: Arc<Mutex<Image>>,
    reorder_seed: Option<u64>,
}

impl MemDevice {
    /// A zeroed device of `blocks` blocks.
    pub fn new(name: &str, blocks: u64) -> MemDevice {
        MemDevice::from_image(name, Image::new(blocks))
    }

    /// A device holding `image` (a crash image to recover from).
    pub fn from_image(name: &str, image: Image) -> MemDevice {
        let info = DeviceInfo { name: name.into(), blocks: image.blocks(), read_only: false };
        MemDevice { info, store: Arc::new(Mutex::new(image)), reorder_seed: None }
    }

    /// Complete operations late and out of order; queue `core` draws from
    /// `seed` mixed with its core number, so runs repeat exactly.
    pub fn with_reorder(mut self, seed: u64) -> MemDevice {
        self.reorder_seed = Some(seed);
        self
    }

    pub fn read_only(mut self) -> MemDevice {
        self.info.read_only = true;
        self
    }

    /// The device's contents now (operations still in flight excluded).
    pub fn snapshot(&self) -> Image {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl BlockDevice for MemDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn queue(&self, core: usize, depth_max: usize) -> Result<Box<dyn BlockQueue>, BlockError> {
        check_depth(&self.info, depth_max)?;
        let rng = self.reorder_seed.map(|s| SeededRng::new(s ^ (core as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        Ok(Box::new(MemQueue {
            info: self.info.clone(),
            store: self.store.clone(),
            rng,
            pending: Vec::with_capacity(depth_max),
            picked: Vec::with_capacity(depth_max),
            depth_max,
        }))
    }
}

struct MemQueue {
    info: DeviceInfo,
    store: Arc<Mutex<Image>>,
    rng: Option<SeededRng>,
    pending: Vec<Option<(Op, u64)>>,
    /// Indexes into `pending` chosen to complete in this poll.
    picked: Vec<usize>,
    depth_max: usize,
}

impl MemQueue {
    fn execute(&self, op: &mut Op) {
        let mut img = self.store.lock().unwrap_or_else(|e| e.into_inner());
        match op {
            Op::Read { lba, blocks, buf } => img.read(*lba, &mut buf[..*blocks as usize * BLOCK_BYTES]),
            Op::Write { lba, blocks, buf } => img.write(*lba, &buf[..*blocks as usize * BLOCK_BYTES]),
            Op::WriteZeroes { lba, blocks } => (*lba..*lba + *blocks).for_each(|l| img.set(l, None)),
            Op::Flush => {}
        }
    }

    /// Complete the operations at `picked` (in that order), then compact.
    fn complete_picked(&mut self, done: &mut Vec<Completion>) -> usize {
        let picked = std::mem::take(&mut self.picked);
        for &i in &picked {
            let (mut op, token) = self.pending[i].take().expect("picked once");
            self.execute(&mut op);
            done.push(Completion { token, result: Ok(()), buf: op.into_buf() });
        }
        let n = picked.len();
        self.picked = picked;
        self.picked.clear();
        self.pending.retain(|p| p.is_some());
        n
    }
}

impl BlockQueue for MemQueue {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn depth_max(&self) -> usize {
        self.depth_max
    }

    fn inflight(&self) -> usize {
        self.pending.len()
    }

    fn submit(&mut self, op: Op, token: u64) -> Result<(), Rejected> {
        if let Err(e) = self.info.check(&op) {
            return Err(Rejected::Invalid(op, e));
        }
        if self.pending.len() >= self.depth_max {
            return Err(Rejected::Busy(op));
        }
        self.pending.push(Some((op, token)));
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<Completion>) -> usize {
        debug_assert!(self.picked.is_empty());
        match self.rng.as_mut() {
            None => self.picked.extend(0..self.pending.len()),
            Some(rng) => {
                for i in 0..self.pending.len() {
                    if rng.coin() {
                        self.picked.push(i);
                    }
                }
                rng.shuffle(&mut self.picked);
            }
        }
        self.complete_picked(done)
    }

    fn wait(&mut self, done: &mut Vec<Completion>) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        let n = self.poll(done);
        if n > 0 {
            return n;
        }
        // Nothing drawn this time: complete one, so a waiter always progresses.
        let i = self.rng.as_mut().map_or(0, |r| r.below(self.pending.len() as u64) as usize);
        self.picked.push(i);
        self.complete_picked(done)
    }

    fn notify_fd(&self) -> Option<RawFd> {
        None
    }
}
