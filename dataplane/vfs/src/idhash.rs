//! Hash maps keyed by server-issued numbers (inode numbers, export ids).
//!
//! Every NFS call looks its inode up in memfs's table and its export up in the
//! router; with std's SipHash those lookups were ~15 % of a 4 KiB READ's
//! instructions (`make bench-profile`). These keys are issued by the server, and
//! a client can only name ones that exist or get STALE/BADHANDLE, so a keyed
//! hash buys nothing here. Maps keyed by client-chosen bytes (directory entry
//! names) keep SipHash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub(crate) type IdHashMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A 64-bit finalizer (xor-shift, multiply) over one integer key: every input
/// bit reaches the low bits hashbrown indexes by, so sequential numbers that
/// share a memfs shard (same low bits) still spread.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
    fn write(&mut self, bytes: &[u8]) {
        // Integer keys use the typed writers below; fold anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        // Unseeded (0): the key itself. Seeded: the key mixed with the seed
        // before the finalizer (both steps are bijections).
        self.0 = (self.0 ^ n).wrapping_mul(self.0 | 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// Proves: keys that share their low bits (one memfs shard holds inode
    /// numbers k, k+16, k+32, ...) still land in distinct low-bit buckets.
    #[test]
    fn shard_mates_spread_over_low_bits() {
        let b = BuildHasherDefault::<IdHasher>::default();
        let buckets: std::collections::HashSet<u64> = (0..1024u64).map(|i| b.hash_one(3 + 16 * i) & 1023).collect();
        assert!(buckets.len() > 600, "only {} of 1024 buckets used", buckets.len());
    }
}

/// A hash map keyed by numbers a client chooses indirectly (memfs chunk
/// indices are file offsets / chunk size): the same cheap finalizer, over
/// the key mixed with a per-process random seed, so a client cannot aim
/// offsets at one bucket without knowing the seed.
pub(crate) type SeededIdHashMap<K, V> = HashMap<K, V, SeededIdState>;

#[derive(Clone, Copy)]
pub(crate) struct SeededIdState(u64);

impl Default for SeededIdState {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        SeededIdState(*SEED.get_or_init(|| {
            use std::hash::BuildHasher;
            // std's RandomState is seeded from the OS once per process.
            std::collections::hash_map::RandomState::new().hash_one(0x6368_756e_6b73_u64) | 1
        }))
    }
}

impl std::hash::BuildHasher for SeededIdState {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.0)
    }
}
