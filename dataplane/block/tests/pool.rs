//! Buffer pools: aligned, disjoint, inside one region, bounded (exhaustion
//! answers None, a returned buffer is reused — from any thread), bad sizes
//! refused, and hugepages either used or refused/fallen back with a message
//! that says what to do.

mod common;

use block::{BufPool, Hugepages, PoolConfig, PoolError, BLOCK_BYTES};

#[test]
fn bounded_aligned_disjoint_and_returned() {
    let pool = common::pool(2 * BLOCK_BYTES, 4);
    let (base, bytes) = pool.region();
    assert_eq!(bytes, 4 * 2 * BLOCK_BYTES);
    let mut bufs: Vec<_> = (0..4).map(|_| pool.get().expect("four buffers")).collect();
    assert!(pool.get().is_none(), "a fifth buffer from a pool of four");
    assert_eq!(pool.bufs_free(), 0);
    for (i, b) in bufs.iter_mut().enumerate() {
        let p = b.as_ptr() as usize;
        assert_eq!(p % BLOCK_BYTES, 0, "aligned for O_DIRECT");
        assert!(p >= base as usize && p + b.len() <= base as usize + bytes, "inside the region");
        assert_eq!(b.len(), 2 * BLOCK_BYTES);
        assert_eq!(b.blocks(), 2);
        b.fill(i as u8 + 1);
    }
    // Disjoint: each still holds its own fill.
    for (i, b) in bufs.iter().enumerate() {
        assert!(b.iter().all(|&x| x == i as u8 + 1));
    }
    let idx = bufs[2].index();
    drop(bufs.remove(2));
    assert_eq!(pool.bufs_free(), 1);
    let again = pool.get().expect("a returned buffer is free again");
    assert_eq!(again.index(), idx);
    assert!(pool.get().is_none());
    // Dropped on another thread (a completion handed on), it still returns.
    std::thread::spawn(move || drop(again)).join().unwrap();
    assert_eq!(pool.bufs_free(), 1);
    drop(bufs);
    assert_eq!(pool.bufs_free(), 4);
}

#[test]
fn bad_configs_are_refused() {
    for (buf_bytes, bufs_max) in [(1000, 4), (0, 4), (BLOCK_BYTES, 0), (2 << 20, 1), (1 << 20, 1 << 20)] {
        match BufPool::new(PoolConfig { buf_bytes, bufs_max, hugepages: Hugepages::Off }) {
            Err(PoolError::BadConfig(msg)) => assert!(msg.contains("buf_bytes") || msg.contains("bufs_max"), "{msg}"),
            Err(e) => panic!("{buf_bytes} x {bufs_max}: {e}"),
            Ok(_) => panic!("{buf_bytes} x {bufs_max} accepted"),
        }
    }
}

#[test]
fn hugepages_used_or_explained() {
    let cfg = PoolConfig { buf_bytes: 64 << 10, bufs_max: 40, hugepages: Hugepages::Require };
    match BufPool::new(cfg) {
        Ok(p) => {
            assert!(p.hugepages());
            assert_eq!(p.region().1 % block::pool::HUGEPAGE_BYTES, 0, "whole hugepages");
            assert_eq!(p.region().0 as usize % block::pool::HUGEPAGE_BYTES, 0);
        }
        Err(e @ PoolError::NoHugepages { .. }) => assert!(e.to_string().contains("vm.nr_hugepages"), "{e}"),
        Err(e) => panic!("{e}"),
    }
    let p = BufPool::new(PoolConfig { hugepages: Hugepages::Try, ..cfg }).expect("Try always gets memory");
    if p.hugepages() {
        assert!(p.warning().is_none());
    } else {
        let w = p.warning().expect("a fallback says why");
        assert!(w.contains("hugepages") && w.contains("using ordinary pages"), "{w}");
        assert_eq!(p.region().1, 40 * (64 << 10), "no rounding without hugepages");
    }
    assert_eq!(p.bufs_max(), 40);
    let mut b = p.get().unwrap();
    b.fill(0xab);
    assert!(b.iter().all(|&x| x == 0xab));
    let off = BufPool::new(PoolConfig { hugepages: Hugepages::Off, ..cfg }).unwrap();
    assert!(!off.hugepages() && off.warning().is_none());
}
