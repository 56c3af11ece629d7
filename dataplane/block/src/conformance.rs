//! Test support every device crate's tests use: byte patterns no other
//! (seed, block) pair produces, a bounded drain, and the conformance run
//! every `BlockDevice` implementation must pass (here, so device crates
//! outside `block` run the same checks).

use crate::{BlockDevice, BlockQueue, BufPool, Completion, ErrorKind, Hugepages, Op, PoolConfig, Rejected, BLOCK_BYTES};

pub fn pool(buf_bytes: usize, bufs_max: usize) -> BufPool {
    BufPool::new(PoolConfig { buf_bytes, bufs_max, hugepages: Hugepages::Off }).unwrap()
}

/// Bytes no other (seed, block) pair produces: every 8-byte word names the
/// seed, the block and its place in the block.
pub fn pattern(seed: u64, lba: u64, out: &mut [u8]) {
    for (b, block) in out.chunks_mut(BLOCK_BYTES).enumerate() {
        for (w, word) in block.chunks_mut(8).enumerate() {
            let v = (seed << 40) ^ ((lba + b as u64) << 12) ^ w as u64 ^ 0x5a5a_0000_0000_0000;
            word.copy_from_slice(&v.to_le_bytes());
        }
    }
}

pub fn pattern_vec(seed: u64, lba: u64, blocks: usize) -> Vec<u8> {
    let mut v = vec![0u8; blocks * BLOCK_BYTES];
    pattern(seed, lba, &mut v);
    v
}

/// Poll until nothing is in flight, collecting completions (bounded: a
/// device that never completes fails the test instead of hanging it).
pub fn drain(q: &mut dyn BlockQueue, done: &mut Vec<Completion>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while q.inflight() > 0 {
        assert!(std::time::Instant::now() < deadline, "{} operations never completed", q.inflight());
        if q.poll(done) == 0 {
            q.wait(done);
        }
    }
}

/// What every device must do, on any implementation: data written reads
/// back, zeroed ranges read zeros, range errors name device and offset,
/// depth is bounded, many operations in flight all complete once.
pub fn conformance(dev: &dyn BlockDevice, name: &str) {
    let blocks = dev.info().blocks;
    assert!(blocks >= 256, "conformance needs 256 blocks");
    assert_eq!(&*dev.info().name, name);
    let pool = pool(4 * BLOCK_BYTES, 80);
    let mut q = dev.queue(0, 8).unwrap();
    let q = &mut *q;
    assert_eq!(q.depth_max(), 8);

    // Write, flush, read back (multi-block and single-block, unaligned to buffers).
    let a = pattern_vec(1, 3, 4);
    crate::sync::write(q, &pool, 3, &a).unwrap();
    let b = pattern_vec(2, blocks - 1, 1);
    crate::sync::write(q, &pool, blocks - 1, &b).unwrap();
    crate::sync::flush(q).unwrap();
    let mut got = vec![0u8; 4 * BLOCK_BYTES];
    crate::sync::read(q, &pool, 3, &mut got).unwrap();
    assert!(got == a, "{name}: blocks 3..7 read back differ");
    let mut last = vec![0u8; BLOCK_BYTES];
    crate::sync::read(q, &pool, blocks - 1, &mut last).unwrap();
    assert!(last == b, "{name}: last block differs");
    // 9 blocks: two and a bit buffers, so the helper's chunking is used.
    let c = pattern_vec(3, 100, 9);
    crate::sync::write(q, &pool, 100, &c).unwrap();
    let mut got = vec![0u8; 9 * BLOCK_BYTES];
    crate::sync::read(q, &pool, 100, &mut got).unwrap();
    assert!(got == c, "{name}: 9-block write reads back differently");

    // Write-zeroes in the middle of the written range.
    crate::sync::write_zeroes(q, 4, 2).unwrap();
    crate::sync::flush(q).unwrap();
    let mut got = vec![0u8; 4 * BLOCK_BYTES];
    crate::sync::read(q, &pool, 3, &mut got).unwrap();
    assert!(got[..BLOCK_BYTES] == a[..BLOCK_BYTES], "{name}: block 3 lost");
    assert!(got[BLOCK_BYTES..3 * BLOCK_BYTES].iter().all(|&x| x == 0), "{name}: zeroed blocks 4,5 not zero");
    assert!(got[3 * BLOCK_BYTES..] == a[3 * BLOCK_BYTES..], "{name}: block 6 lost");

    // Out of range: at the end, across the end, overflowing; zero blocks.
    let end_bytes = blocks * BLOCK_BYTES as u64;
    for (lba, n) in [(blocks, 1u32), (blocks - 1, 2), (u64::MAX - 1, 4)] {
        let r = q.submit(Op::Read { lba, blocks: n, buf: pool.get().unwrap() }, 7);
        let Err(Rejected::Invalid(op, e)) = r else { panic!("{name}: read at {lba} x{n} accepted") };
        assert!(op.into_buf().is_some(), "the buffer comes back");
        assert_eq!(e.kind, ErrorKind::OutOfRange { blocks });
        assert_eq!(e.offset_bytes, Some(lba.saturating_mul(BLOCK_BYTES as u64)));
        let msg = e.to_string();
        assert!(msg.contains(name) && msg.contains(&format!("byte offset {}", lba.saturating_mul(4096))), "{msg}");
    }
    let e = match q.submit(Op::WriteZeroes { lba: blocks, blocks: 1 }, 7) {
        Err(Rejected::Invalid(_, e)) => e,
        other => panic!("{name}: zeroes past the end: {other:?}"),
    };
    assert!(e.to_string().contains(&format!("write-zeroes at byte offset {end_bytes}")), "{e}");
    match q.submit(Op::Write { lba: 0, blocks: 0, buf: pool.get().unwrap() }, 7) {
        Err(Rejected::Invalid(_, e)) => assert!(matches!(e.kind, ErrorKind::BadRequest { .. }), "{e}"),
        other => panic!("{name}: zero-block write: {other:?}"),
    }
    match q.submit(Op::Read { lba: 0, blocks: 5, buf: pool.get().unwrap() }, 7) {
        Err(Rejected::Invalid(_, e)) => assert!(matches!(e.kind, ErrorKind::BadRequest { .. }), "{e}"),
        other => panic!("{name}: read larger than its buffer: {other:?}"),
    }
    assert_eq!(q.inflight(), 0, "{name}: rejected operations are not in flight");

    // Depth bound: 8 accepted, the 9th Busy with its buffer back.
    for t in 0..8 {
        q.submit(Op::Read { lba: t, blocks: 1, buf: pool.get().unwrap() }, t).unwrap();
    }
    assert_eq!(q.inflight(), 8);
    match q.submit(Op::Read { lba: 9, blocks: 1, buf: pool.get().unwrap() }, 9) {
        Err(Rejected::Busy(op)) => assert!(op.into_buf().is_some()),
        other => panic!("{name}: 9th of depth 8: {other:?}"),
    }
    let mut done = Vec::new();
    drain(q, &mut done);
    let mut tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
    tokens.sort();
    assert_eq!(tokens, (0..8).collect::<Vec<_>>());
    assert!(done.iter().all(|c| c.result.is_ok() && c.buf.is_some()));
    drop(done);

    // Many in flight: 240 single-block writes with the queue kept full,
    // then read back with the queue kept full; every token exactly once.
    let ops = 240u64;
    let mut seen = vec![0u32; ops as usize];
    let mut done = Vec::new();
    let mut next = 0u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while next < ops || q.inflight() > 0 {
        assert!(std::time::Instant::now() < deadline, "{name}: writes did not complete");
        while next < ops {
            let mut buf = pool.get().expect("the pool covers depth 8");
            pattern(10, 10 + next, &mut buf[..BLOCK_BYTES]);
            match q.submit(Op::Write { lba: 10 + next, blocks: 1, buf }, next) {
                Ok(()) => next += 1,
                Err(Rejected::Busy(_)) => break,
                Err(r) => panic!("{name}: {r:?}"),
            }
        }
        if q.poll(&mut done) == 0 && q.inflight() == q.depth_max() {
            q.wait(&mut done);
        }
        for c in done.drain(..) {
            c.result.unwrap();
            seen[c.token as usize] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "{name}: a write token completed other than once");
    crate::sync::flush(q).unwrap();
    let mut next = 0u64;
    let mut checked = 0;
    while next < ops || q.inflight() > 0 {
        while next < ops {
            match q.submit(Op::Read { lba: 10 + next, blocks: 1, buf: pool.get().unwrap() }, next) {
                Ok(()) => next += 1,
                Err(Rejected::Busy(_)) => break,
                Err(r) => panic!("{name}: {r:?}"),
            }
        }
        if q.poll(&mut done) == 0 && q.inflight() > 0 {
            q.wait(&mut done);
        }
        for c in done.drain(..) {
            c.result.unwrap();
            let want = pattern_vec(10, 10 + c.token, 1);
            assert!(c.buf.unwrap()[..BLOCK_BYTES] == want[..], "{name}: block {} read back differently", 10 + c.token);
            checked += 1;
        }
    }
    assert_eq!(checked, ops);
    assert_eq!(pool.bufs_free(), pool.bufs_max(), "{name}: every buffer came back");
}
