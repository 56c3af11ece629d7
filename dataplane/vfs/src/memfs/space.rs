//! Space accounting: the whole backend and each volume (quota root) are a
//! `Space` that charges are reserved against before any state changes, so a
//! full backend or volume fails an operation without partial effects.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Ino, VfsError, VfsResult};

/// A capacity and what is charged against it. Lock-free: reservation is a
/// compare-and-swap loop, so writers to different files never serialise on
/// a lock to account their space.
#[derive(Debug)]
pub(crate) struct Space {
    capacity_bytes: AtomicU64,
    used_bytes: AtomicU64,
}

impl Space {
    pub(crate) fn new(capacity_bytes: u64, used_bytes: u64) -> Space {
        assert!(used_bytes <= capacity_bytes, "space created over capacity");
        Space { capacity_bytes: AtomicU64::new(capacity_bytes), used_bytes: AtomicU64::new(used_bytes) }
    }

    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes.load(Ordering::Acquire)
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Acquire)
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.capacity_bytes().saturating_sub(self.used_bytes())
    }

    /// Reserve `bytes`; false (and nothing reserved) when it would exceed the capacity.
    pub(crate) fn try_charge(&self, bytes: u64) -> bool {
        let capacity_bytes = self.capacity_bytes();
        let mut used = self.used_bytes.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(bytes) else { return false };
            if next > capacity_bytes {
                return false;
            }
            match self.used_bytes.compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    pub(crate) fn release(&self, bytes: u64) {
        let before = self.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
        assert!(before >= bytes, "space released more than was charged ({before} < {bytes})");
    }

    /// Change the capacity; `Inval` when below what is already used. Callers
    /// serialise capacity changes (the namespace lock), so a concurrent
    /// charge can at worst see the old capacity for one reservation.
    pub(crate) fn set_capacity(&self, capacity_bytes: u64) -> VfsResult<()> {
        if capacity_bytes < self.used_bytes() {
            return Err(VfsError::Inval);
        }
        self.capacity_bytes.store(capacity_bytes, Ordering::Release);
        Ok(())
    }
}

/// A quota root: a directory whose subtree is charged to its own `Space`.
#[derive(Debug)]
pub(crate) struct Volume {
    pub(crate) root_ino: Ino,
    pub(crate) space: Space,
}
