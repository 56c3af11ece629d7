//! Per-operation counters and latency histograms, sharded per core.
//!
//! Every event loop writes only its own shard (relaxed atomics on cache lines
//! no other core writes), so recording costs a few uncontended increments; a
//! scrape sums the shards. Operations are registered once at start-up and
//! referred to by a dense [`OpId`].

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// Most cores (event loops) that record metrics; later cores share the last shard.
pub const CORES_MAX: usize = 64;
/// Most distinct operations.
pub const OPS_MAX: usize = 256;
/// Latency histogram buckets: upper bounds 1 µs, 2 µs, 4 µs, ... 2^(N-1) µs, +Inf.
pub const LATENCY_BUCKETS: usize = 26;

#[derive(Default)]
#[repr(align(64))]
struct OpCounters {
    count: AtomicU64,
    errors: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    latency_ns_sum: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS + 1],
}

#[derive(Default)]
#[repr(align(64))]
struct ConnCounters {
    accepted: AtomicU64,
    closed: AtomicU64,
    rejected: AtomicU64,
    protocol_errors: AtomicU64,
}

struct Registry {
    names: Mutex<Vec<(&'static str, &'static str)>>,
    ops: Box<[OpCounters]>,
    conns: Box<[ConnCounters]>,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        names: Mutex::new(Vec::new()),
        ops: (0..CORES_MAX * OPS_MAX).map(|_| OpCounters::default()).collect(),
        conns: (0..CORES_MAX).map(|_| ConnCounters::default()).collect(),
    })
}

thread_local! {
    static CORE: Cell<usize> = const { Cell::new(0) };
}

/// Declare which shard the current thread records into (called by each
/// event loop at start).
pub fn set_core(core: usize) {
    CORE.with(|c| c.set(core.min(CORES_MAX - 1)));
}

fn core() -> usize {
    CORE.with(|c| c.get())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpId(u16);

/// Register (or find) an operation by program and name.
pub fn register_op(program: &'static str, op: &'static str) -> OpId {
    let mut names = registry().names.lock().unwrap();
    if let Some(i) = names.iter().position(|&(p, o)| p == program && o == op) {
        return OpId(i as u16);
    }
    assert!(names.len() < OPS_MAX, "more than OPS_MAX ({OPS_MAX}) operations registered");
    names.push((program, op));
    OpId((names.len() - 1) as u16)
}

fn bucket(latency_ns: u64) -> usize {
    let us = latency_ns.div_ceil(1000).max(1);
    // ceil(log2(us)): 1 µs -> 0, 2 -> 1, 3..4 -> 2 ...
    let b = (64 - (us - 1).leading_zeros()) as usize;
    b.min(LATENCY_BUCKETS)
}

/// Record one completed operation.
#[inline]
pub fn record(op: OpId, latency_ns: u64, bytes_in: u64, bytes_out: u64, ok: bool) {
    let c = &registry().ops[core() * OPS_MAX + op.0 as usize];
    c.count.fetch_add(1, Relaxed);
    if !ok {
        c.errors.fetch_add(1, Relaxed);
    }
    c.bytes_in.fetch_add(bytes_in, Relaxed);
    c.bytes_out.fetch_add(bytes_out, Relaxed);
    c.latency_ns_sum.fetch_add(latency_ns, Relaxed);
    c.latency[bucket(latency_ns)].fetch_add(1, Relaxed);
}

#[derive(Debug, Clone, Copy)]
pub enum ConnEvent {
    Accepted,
    Closed,
    /// Refused because `conns_max` was reached.
    Rejected,
    /// Closed because of a framing violation (oversize or malformed record).
    ProtocolError,
}

pub fn conn_event(ev: ConnEvent) {
    let c = &registry().conns[core()];
    match ev {
        ConnEvent::Accepted => &c.accepted,
        ConnEvent::Closed => &c.closed,
        ConnEvent::Rejected => &c.rejected,
        ConnEvent::ProtocolError => &c.protocol_errors,
    }
    .fetch_add(1, Relaxed);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSnapshot {
    pub program: &'static str,
    pub op: &'static str,
    pub count: u64,
    pub errors: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub latency_ns_sum: u64,
    /// (upper bound in µs, cumulative count); the last bound is u64::MAX (+Inf).
    pub latency_buckets: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub ops: Vec<OpSnapshot>,
    pub conns_accepted: u64,
    pub conns_closed: u64,
    pub conns_rejected: u64,
    pub conns_protocol_errors: u64,
}

/// Sum every shard (control path: allocates).
pub fn snapshot() -> Snapshot {
    let r = registry();
    let names = r.names.lock().unwrap().clone();
    let mut s = Snapshot::default();
    for (i, (program, op)) in names.into_iter().enumerate() {
        let mut o = OpSnapshot {
            program,
            op,
            count: 0,
            errors: 0,
            bytes_in: 0,
            bytes_out: 0,
            latency_ns_sum: 0,
            latency_buckets: Vec::with_capacity(LATENCY_BUCKETS + 1),
        };
        let mut buckets = [0u64; LATENCY_BUCKETS + 1];
        for core in 0..CORES_MAX {
            let c = &r.ops[core * OPS_MAX + i];
            o.count += c.count.load(Relaxed);
            o.errors += c.errors.load(Relaxed);
            o.bytes_in += c.bytes_in.load(Relaxed);
            o.bytes_out += c.bytes_out.load(Relaxed);
            o.latency_ns_sum += c.latency_ns_sum.load(Relaxed);
            for (b, v) in buckets.iter_mut().zip(c.latency.iter()) {
                *b += v.load(Relaxed);
            }
        }
        let mut cum = 0;
        for (i, b) in buckets.iter().enumerate() {
            cum += b;
            let le = if i == LATENCY_BUCKETS { u64::MAX } else { 1u64 << i };
            o.latency_buckets.push((le, cum));
        }
        s.ops.push(o);
    }
    for c in r.conns.iter() {
        s.conns_accepted += c.accepted.load(Relaxed);
        s.conns_closed += c.closed.load(Relaxed);
        s.conns_rejected += c.rejected.load(Relaxed);
        s.conns_protocol_errors += c.protocol_errors.load(Relaxed);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_microseconds() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1000), 0);
        assert_eq!(bucket(1001), 1);
        assert_eq!(bucket(4000), 2);
        assert_eq!(bucket(u64::MAX / 2), LATENCY_BUCKETS);
    }

    #[test]
    fn record_and_snapshot() {
        let op = register_op("test", "op_a");
        assert_eq!(register_op("test", "op_a"), op);
        set_core(3);
        record(op, 1500, 10, 20, true);
        record(op, 3000, 10, 20, false);
        let s = snapshot();
        let o = s.ops.iter().find(|o| o.program == "test" && o.op == "op_a").unwrap();
        assert_eq!((o.count, o.errors, o.bytes_in, o.bytes_out), (2, 1, 20, 40));
        assert_eq!(o.latency_buckets[1], (2, 1));
        assert_eq!(o.latency_buckets[2], (4, 2));
        assert_eq!(o.latency_buckets.last().unwrap().1, 2);
    }
}
