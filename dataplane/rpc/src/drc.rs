//! Duplicate-request cache for non-idempotent procedures.
//!
//! A client that loses a reply (connection reset, timeout) retransmits the
//! call with the same xid. Re-executing REMOVE or RENAME would then report a
//! spurious error (the first execution already removed the name), so replies
//! to non-idempotent calls are kept, keyed by the caller's address, xid,
//! program/version/procedure and a hash of the arguments (so an xid reused for
//! a different call is not mistaken for a retransmission). Bounded by entry
//! count and bytes; oldest entries go first. Only non-idempotent calls reach
//! this cache, so its lock is never on the READ/WRITE path.
//!
//! A call that parked (its backend waits: a log flush, a data server) is
//! *in progress* until its reply exists: a retransmission arriving
//! meanwhile is dropped instead of executed a second time (the first
//! execution's reply answers it, or the cached one answers the next
//! retransmission). In-progress marks are bounded like the entries and
//! lapse after `IN_PROGRESS_TTL`, so a reply that never comes cannot
//! silence a call for good.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a parked call's mark keeps its retransmissions out.
pub const IN_PROGRESS_TTL: Duration = Duration::from_secs(120);

/// What the cache knows of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Its reply body, this many bytes, is copied out.
    Hit(usize),
    /// Its first execution is parked: drop this one.
    InProgress,
    Miss,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DrcKey {
    pub addr: IpAddr,
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_num: u32,
    pub args_hash: u64,
}

impl DrcKey {
    /// FNV-1a over the argument bytes.
    pub fn hash_args(args: &[u8]) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in args {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }
}

struct Inner {
    map: HashMap<DrcKey, Vec<u8>>,
    order: VecDeque<DrcKey>,
    bytes: usize,
    /// Parked calls without a reply yet, and since when.
    in_progress: HashMap<DrcKey, Instant>,
}

pub struct Drc {
    inner: Mutex<Inner>,
    entries_max: usize,
    bytes_max: usize,
}

impl Drc {
    pub fn new(entries_max: usize, bytes_max: usize) -> Self {
        assert!(entries_max > 0 && bytes_max > 0);
        Drc {
            inner: Mutex::new(Inner { map: HashMap::new(), order: VecDeque::new(), bytes: 0, in_progress: HashMap::new() }),
            entries_max,
            bytes_max,
        }
    }

    /// Copy the cached reply body for `key` into `out` (`Hit`), or say the
    /// call is parked (`InProgress`).
    pub fn lookup(&self, key: &DrcKey, out: &mut [u8]) -> Lookup {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reply) = inner.map.get(key) {
            if reply.len() > out.len() {
                return Lookup::Miss;
            }
            out[..reply.len()].copy_from_slice(reply);
            return Lookup::Hit(reply.len());
        }
        match inner.in_progress.get(key) {
            Some(t) if t.elapsed() < IN_PROGRESS_TTL => Lookup::InProgress,
            Some(_) => {
                inner.in_progress.remove(key);
                Lookup::Miss
            }
            None => Lookup::Miss,
        }
    }

    /// `key`'s call parked: its retransmissions are dropped until its reply
    /// is inserted (or `IN_PROGRESS_TTL`). When `entries_max` calls are
    /// marked already, lapsed marks go first; if none has, this one is not
    /// marked (a retransmission then runs again, as without the mark).
    pub fn begin(&self, key: DrcKey) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.in_progress.len() >= self.entries_max {
            inner.in_progress.retain(|_, t| t.elapsed() < IN_PROGRESS_TTL);
            if inner.in_progress.len() >= self.entries_max {
                return;
            }
        }
        inner.in_progress.insert(key, Instant::now());
    }

    /// Calls marked in progress now.
    pub fn in_progress(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).in_progress.len()
    }

    pub fn insert(&self, key: DrcKey, reply: &[u8]) {
        if reply.len() > self.bytes_max {
            self.inner.lock().unwrap_or_else(|e| e.into_inner()).in_progress.remove(&key);
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.in_progress.remove(&key);
        if let Some(old) = inner.map.insert(key, reply.to_vec()) {
            inner.bytes -= old.len();
        } else {
            inner.order.push_back(key);
        }
        inner.bytes += reply.len();
        while inner.order.len() > self.entries_max || inner.bytes > self.bytes_max {
            let Some(k) = inner.order.pop_front() else { break };
            if let Some(v) = inner.map.remove(&k) {
                inner.bytes -= v.len();
            }
        }
        debug_assert_eq!(inner.map.len(), inner.order.len());
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(xid: u32) -> DrcKey {
        DrcKey {
            addr: "127.0.0.1".parse().unwrap(),
            xid,
            prog: 100003,
            vers: 3,
            proc_num: 12,
            args_hash: DrcKey::hash_args(b"x"),
        }
    }

    #[test]
    fn hit_miss_and_bounds() {
        let drc = Drc::new(2, 1024);
        drc.insert(key(1), b"one");
        drc.insert(key(2), b"two");
        let mut out = [0u8; 16];
        assert_eq!(drc.lookup(&key(1), &mut out), Lookup::Hit(3));
        assert_eq!(&out[..3], b"one");
        drc.insert(key(3), b"three");
        assert_eq!(drc.len(), 2);
        assert_eq!(drc.lookup(&key(1), &mut out), Lookup::Miss, "oldest entry evicted");
        let mut other = key(3);
        other.args_hash ^= 1;
        assert_eq!(drc.lookup(&other, &mut out), Lookup::Miss, "same xid, different args");
    }

    #[test]
    fn a_parked_call_is_in_progress_until_its_reply_and_marks_are_bounded() {
        let drc = Drc::new(2, 1024);
        let mut out = [0u8; 16];
        drc.begin(key(7));
        assert_eq!(drc.lookup(&key(7), &mut out), Lookup::InProgress);
        let mut other = key(7);
        other.args_hash ^= 1;
        assert_eq!(drc.lookup(&other, &mut out), Lookup::Miss, "another call with the same xid runs");
        drc.insert(key(7), b"done");
        assert_eq!(drc.lookup(&key(7), &mut out), Lookup::Hit(4));
        assert_eq!(drc.in_progress(), 0, "the reply ends the mark");
        drc.begin(key(1));
        drc.begin(key(2));
        drc.begin(key(3));
        assert_eq!(drc.in_progress(), 2, "bounded by entries_max");
        assert_eq!(drc.lookup(&key(3), &mut out), Lookup::Miss, "not marked when full");
        // A reply too large to keep still ends the mark.
        drc.insert(key(1), &[0u8; 2048]);
        assert_eq!(drc.lookup(&key(1), &mut out), Lookup::Miss);
        assert_eq!(drc.in_progress(), 1);
    }

    #[test]
    fn byte_bound() {
        let drc = Drc::new(100, 10);
        drc.insert(key(1), b"123456");
        drc.insert(key(2), b"123456");
        assert_eq!(drc.len(), 1);
    }
}
