//! Buffer pools `AsConfigured` with the process's hugepage arena on (this
//! test binary is its own process, so it sets the policy once): pools are
//! carved from the arena's slabs instead of mapping (and rounding up to a
//! hugepage) each; given back when dropped; a pool the arena has no room
//! for falls back to ordinary pages with a warning naming what to raise;
//! the policy is set once.

use block::huge::{self, HugeConfig, PAGE_4K};
use block::{BufPool, Hugepages, PoolConfig};

#[test]
fn pools_are_carved_from_the_configured_arena() {
    // Ordinary pages stand in for hugepages (none on a build machine);
    // the carving is the same.
    let cfg = HugeConfig { page_bytes: PAGE_4K, slab_bytes: 256 << 10, preallocate: 1, slabs_max: 2 };
    let u = huge::configure(Some(cfg)).unwrap().unwrap();
    assert_eq!((u.slabs, u.mapped_bytes, u.carved_bytes), (1, 256 << 10, 0));
    assert!(huge::configure(None).unwrap_err().contains("once"), "the policy is set once");

    let pool = |bufs| BufPool::new(PoolConfig { buf_bytes: 16 << 10, bufs_max: bufs, hugepages: Hugepages::AsConfigured }).unwrap();
    let a = pool(4);
    let b = pool(4);
    assert!(a.carved() && b.carved() && a.hugepages() && a.warning().is_none());
    let (pa, la) = a.region();
    let (pb, _) = b.region();
    assert_eq!(la, 64 << 10, "carved to the pool's size, not rounded up to a hugepage");
    assert_eq!(pb as usize - pa as usize, 64 << 10, "the second pool right after the first in the slab");
    assert_eq!(huge::usage().unwrap().carved_bytes, 128 << 10);
    let mut x = a.get().unwrap();
    x[..5].copy_from_slice(b"hello");
    assert_eq!(&x[..5], b"hello");
    drop(x);
    drop(a);
    assert_eq!(huge::usage().unwrap().carved_bytes, 64 << 10, "a dropped pool gives its range back");

    // 1 MiB: more than a slab, and the second (last) slab is taken by it.
    let big = BufPool::new(PoolConfig { buf_bytes: 1 << 20, bufs_max: 1, hugepages: Hugepages::AsConfigured }).unwrap();
    assert!(big.carved());
    assert_eq!(huge::usage().unwrap().slabs, 2);
    let over = BufPool::new(PoolConfig { buf_bytes: 1 << 20, bufs_max: 1, hugepages: Hugepages::AsConfigured }).unwrap();
    assert!(!over.carved() && !over.hugepages());
    let w = over.warning().expect("a warning for the fallback");
    assert!(w.contains("common.slab_size") && w.contains("ordinary pages"), "{w}");
    // Explicit choices are not the arena's.
    let off = BufPool::new(PoolConfig { buf_bytes: 4096, bufs_max: 1, hugepages: Hugepages::Off }).unwrap();
    assert!(!off.carved());
    drop((b, big));
    assert_eq!(huge::usage().unwrap().carved_bytes, 0);
}
