//! A file's write lock: serialises the writers of one file (read-modify-
//! write of a partial block, truncation, ALLOCATE / DEALLOCATE). A write on
//! a core loop (`coreio`) holds it while its blocks are on the device and
//! releases it from that core's poll, so it is not a guard-scoped mutex:
//! [`WLock::try_lock`] (the core: never waits) and [`WLock::lock`] (workers
//! and metadata calls: wait) both end in [`WLock::unlock`]. A core that must
//! wait polls its own loop's pollers meanwhile — the holder may be a write
//! of that very core, which only its polling can finish.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
pub struct WLock {
    held: Mutex<bool>,
    cv: Condvar,
}

/// Releases a lock taken with [`WLock::lock`] when dropped.
pub struct Guard<'a>(&'a WLock);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

impl WLock {
    /// Take the lock if it is free; never waits.
    pub fn try_lock(&self) -> bool {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if *h {
            return false;
        }
        *h = true;
        true
    }

    /// Take the lock, waiting for it.
    pub fn lock(&self) -> Guard<'_> {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        while *h {
            if rpc::poller::available() {
                // On a core loop: the holder may be this core's own write.
                drop(h);
                rpc::poller::poll_all(&mut Vec::new());
                std::thread::yield_now();
                h = self.held.lock().unwrap_or_else(|e| e.into_inner());
            } else {
                h = self.cv.wait_timeout(h, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
        *h = true;
        Guard(self)
    }

    /// Release a lock taken with `try_lock` (or by a dropped guard).
    pub fn unlock(&self) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.cv.notify_one();
    }
}

impl std::fmt::Debug for WLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WLock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_waiter_gets_the_lock_when_the_holder_releases_it() {
        let l = Arc::new(WLock::default());
        assert!(l.try_lock());
        assert!(!l.try_lock());
        let l2 = l.clone();
        let t = std::thread::spawn(move || {
            let _g = l2.lock();
        });
        std::thread::sleep(Duration::from_millis(20));
        l.unlock();
        t.join().unwrap();
        assert!(l.try_lock(), "the waiter's guard released it");
    }
}
