//! A file's write lock, by block range: writers of disjoint blocks of one
//! file proceed together, writers of a common block (the read-modify-write
//! of a partial block) one after the other, and truncation, ALLOCATE and
//! DEALLOCATE take the whole file ([`WHOLE`]). A write on a core loop
//! (`coreio`) holds its range while its blocks are on the device and
//! releases it from that core's poll, so it is not a guard-scoped mutex:
//! [`WLock::try_lock`] (the core: never waits) and [`WLock::lock`] (workers
//! and metadata calls: wait) both end in [`WLock::unlock`] of the same
//! range. A core that must wait polls its own loop's pollers meanwhile —
//! the holder may be a write of that very core, which only its polling can
//! finish.
//!
//! Waiters are served in arrival order among those that overlap: a range
//! is not granted while an earlier waiter overlapping it waits, and
//! `try_lock` refuses a range any waiter overlaps, so a truncation waiting
//! for the whole file is not starved by a stream of writes on the cores.
//! Held and waiting ranges are as many as the writes in flight on the file
//! (bounded by the parked-request limits), so both lists stay short.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Inclusive file-block range `(first, last)`.
pub type Range = (u64, u64);

/// Every block of the file.
pub const WHOLE: Range = (0, u64::MAX);

/// The blocks a byte range `[offset, end)` touches (`end == offset`: the
/// block at `offset`).
pub fn blocks(offset: u64, end: u64, block: u64) -> Range {
    (offset / block, end.max(offset + 1).saturating_sub(1) / block)
}

fn overlap(a: Range, b: Range) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

#[derive(Default)]
struct State {
    held: Vec<Range>,
    /// (ticket, range) of the callers of `lock` still waiting.
    waiting: Vec<(u64, Range)>,
    next_ticket: u64,
}

#[derive(Default)]
pub struct WLock {
    st: Mutex<State>,
    cv: Condvar,
}

/// Releases a range taken with [`WLock::lock`] when dropped.
pub struct Guard<'a>(&'a WLock, Range);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.unlock(self.1);
    }
}

impl WLock {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take `r` if no holder or waiter overlaps it; never waits.
    pub fn try_lock(&self, r: Range) -> bool {
        let mut s = self.state();
        if s.held.iter().any(|&h| overlap(h, r)) || s.waiting.iter().any(|&(_, w)| overlap(w, r)) {
            return false;
        }
        s.held.push(r);
        true
    }

    /// Take `r`, waiting for the holders and earlier waiters overlapping it.
    pub fn lock(&self, r: Range) -> Guard<'_> {
        let mut s = self.state();
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.waiting.push((ticket, r));
        loop {
            let blocked = s.held.iter().any(|&h| overlap(h, r)) || s.waiting.iter().any(|&(t, w)| t < ticket && overlap(w, r));
            if !blocked {
                break;
            }
            if rpc::poller::available() {
                // On a core loop: the holder may be this core's own write.
                drop(s);
                rpc::poller::poll_all(&mut Vec::new());
                std::thread::yield_now();
                s = self.state();
            } else {
                s = self.cv.wait_timeout(s, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
        s.waiting.retain(|&(t, _)| t != ticket);
        s.held.push(r);
        drop(s);
        // Leaving the queue may unblock a later waiter.
        self.cv.notify_all();
        Guard(self, r)
    }

    /// Release a range taken with `try_lock` (or by a dropped guard).
    pub fn unlock(&self, r: Range) {
        let mut s = self.state();
        if let Some(k) = s.held.iter().position(|&h| h == r) {
            s.held.swap_remove(k);
        } else {
            debug_assert!(false, "unlock of a range not held: {r:?}");
        }
        drop(s);
        self.cv.notify_all();
    }
}

impl std::fmt::Debug for WLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state();
        write!(f, "WLock {{ held: {:?}, waiting: {} }}", s.held, s.waiting.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_waiter_gets_the_lock_when_the_holder_releases_it() {
        let l = Arc::new(WLock::default());
        assert!(l.try_lock(WHOLE));
        assert!(!l.try_lock(WHOLE));
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            let _g = l2.lock(WHOLE);
        });
        std::thread::sleep(Duration::from_millis(20));
        l.unlock(WHOLE);
        t.join().unwrap();
        assert!(l.try_lock(WHOLE), "the waiter's guard released it");
    }

    #[test]
    fn disjoint_ranges_are_held_together_and_a_common_block_excludes() {
        let l = WLock::default();
        assert!(l.try_lock((0, 3)));
        assert!(l.try_lock((4, 4)), "disjoint from the first");
        assert!(l.try_lock((10, 20)));
        assert!(!l.try_lock((3, 4)), "shares block 3 and 4");
        assert!(!l.try_lock((20, 30)), "shares block 20");
        assert!(!l.try_lock(WHOLE), "the whole file overlaps every holder");
        l.unlock((4, 4));
        assert!(l.try_lock((4, 5)), "block 4 is free again");
        for r in [(0, 3), (4, 5), (10, 20)] {
            l.unlock(r);
        }
        assert!(l.try_lock(WHOLE));
    }

    #[test]
    fn a_whole_file_waiter_waits_for_every_writer_and_holds_off_new_ones() {
        let l = Arc::new(WLock::default());
        assert!(l.try_lock((0, 0)));
        assert!(l.try_lock((5, 9)));
        let got = Arc::new(AtomicBool::new(false));
        let (l2, got2) = (l.clone(), got.clone());
        let t = std::thread::spawn(move || {
            let _g = l2.lock(WHOLE);
            got2.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
        });
        while l.state().waiting.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!l.try_lock((100, 100)), "a waiting truncation holds off a new writer even of other blocks");
        l.unlock((0, 0));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!got.load(Ordering::SeqCst), "one writer still holds blocks 5..9");
        l.unlock((5, 9));
        while !got.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!l.try_lock((100, 100)), "the truncation holds the whole file");
        t.join().unwrap();
        assert!(l.try_lock((100, 100)));
    }

    #[test]
    fn overlapping_waiters_are_served_in_arrival_order() {
        let l = Arc::new(WLock::default());
        assert!(l.try_lock((0, 0)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut ts = Vec::new();
        for k in 0..3u64 {
            let (l2, o2) = (l.clone(), order.clone());
            ts.push(std::thread::spawn(move || {
                let _g = l2.lock((0, 0));
                o2.lock().unwrap().push(k);
            }));
            while l.state().waiting.len() < k as usize + 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        l.unlock((0, 0));
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn blocks_of_a_byte_range() {
        assert_eq!(blocks(0, 4096, 4096), (0, 0));
        assert_eq!(blocks(4095, 4097, 4096), (0, 1));
        assert_eq!(blocks(8192, 8192, 4096), (2, 2), "an empty write names its block");
        assert_eq!(blocks(u64::MAX - 1, u64::MAX, 4096), ((u64::MAX - 1) / 4096, (u64::MAX - 1) / 4096));
    }
}
