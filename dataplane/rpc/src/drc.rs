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

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;

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
            inner: Mutex::new(Inner { map: HashMap::new(), order: VecDeque::new(), bytes: 0 }),
            entries_max,
            bytes_max,
        }
    }

    /// Copy the cached reply body for `key` into `out`; returns its length.
    pub fn lookup(&self, key: &DrcKey, out: &mut [u8]) -> Option<usize> {
        let inner = self.inner.lock().unwrap();
        let reply = inner.map.get(key)?;
        if reply.len() > out.len() {
            return None;
        }
        out[..reply.len()].copy_from_slice(reply);
        Some(reply.len())
    }

    pub fn insert(&self, key: DrcKey, reply: &[u8]) {
        if reply.len() > self.bytes_max {
            return;
        }
        let mut inner = self.inner.lock().unwrap();
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
        assert_eq!(drc.lookup(&key(1), &mut out), Some(3));
        assert_eq!(&out[..3], b"one");
        drc.insert(key(3), b"three");
        assert_eq!(drc.len(), 2);
        assert_eq!(drc.lookup(&key(1), &mut out), None, "oldest entry evicted");
        let mut other = key(3);
        other.args_hash ^= 1;
        assert_eq!(drc.lookup(&other, &mut out), None, "same xid, different args");
    }

    #[test]
    fn byte_bound() {
        let drc = Drc::new(100, 10);
        drc.insert(key(1), b"123456");
        drc.insert(key(2), b"123456");
        assert_eq!(drc.len(), 1);
    }
}
