//! Per-device counters and a latency histogram, shared by every queue of a
//! device (relaxed atomics: each queue adds, `/metrics` reads). A device
//! that keeps them answers `BlockDevice::stats`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds (the last bucket
/// is everything above the largest bound).
pub const LATENCY_BOUNDS_US: [u64; 16] = [5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 500_000, 1_000_000];

#[derive(Default)]
pub struct Stats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    pub zeroes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
    pub timeouts: AtomicU64,
    pub aborts: AtomicU64,
    pub resets: AtomicU64,
    /// NVMe commands submitted (an operation larger than the controller's
    /// transfer limit takes several).
    pub commands: AtomicU64,
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    latency_sum_ns: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub zeroes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub aborts: u64,
    pub resets: u64,
    pub commands: u64,
    /// Per bucket (not cumulative), bounds `LATENCY_BOUNDS_US` then +Inf.
    pub latency_buckets: Vec<u64>,
    pub latency_sum_s: f64,
}

impl Stats {
    pub fn latency(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = LATENCY_BOUNDS_US.iter().position(|&b| us <= b).unwrap_or(LATENCY_BOUNDS_US.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            reads: l(&self.reads),
            writes: l(&self.writes),
            flushes: l(&self.flushes),
            zeroes: l(&self.zeroes),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            errors: l(&self.errors),
            timeouts: l(&self.timeouts),
            aborts: l(&self.aborts),
            resets: l(&self.resets),
            commands: l(&self.commands),
            latency_buckets: self.buckets.iter().map(l).collect(),
            latency_sum_s: l(&self.latency_sum_ns) as f64 / 1e9,
        }
    }
}
