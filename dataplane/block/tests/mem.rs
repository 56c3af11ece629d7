//! MemDevice: passes the conformance run in order and reordered; with a
//! seed, completions come late and out of order, repeatably, and a read
//! can overtake a write submitted before it (as on hardware); a read-only
//! one refuses writes.

mod common;

use block::mem::{Image, MemDevice};
use block::{BlockDevice, Op, Rejected, BLOCK_BYTES};
use common::*;

#[test]
fn conformance_in_order_and_reordered() {
    conformance(&MemDevice::new("mem0", 512), "mem0");
    conformance(&MemDevice::new("mem1", 512).with_reorder(7), "mem1");
}

/// Submit 32 single-block writes and return the token order of completion.
fn completion_order(dev: &MemDevice) -> Vec<u64> {
    let pool = pool(BLOCK_BYTES, 32);
    let mut q = dev.queue(0, 32).unwrap();
    for t in 0..32 {
        let mut buf = pool.get().unwrap();
        pattern(t, t, &mut buf);
        q.submit(Op::Write { lba: t, blocks: 1, buf }, t).unwrap();
    }
    let mut done = Vec::new();
    drain(&mut *q, &mut done);
    done.iter().map(|c| c.token).collect()
}

#[test]
fn seeded_reordering_is_real_and_repeatable() {
    let in_order = completion_order(&MemDevice::new("m", 64));
    assert_eq!(in_order, (0..32).collect::<Vec<_>>());
    let a = completion_order(&MemDevice::new("m", 64).with_reorder(1));
    let b = completion_order(&MemDevice::new("m", 64).with_reorder(1));
    let c = completion_order(&MemDevice::new("m", 64).with_reorder(2));
    assert_eq!(a, b, "same seed, same order");
    assert_ne!(a, in_order, "seed 1 reorders");
    assert_ne!(a, c, "another seed, another order");
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, in_order, "every operation completes exactly once");
}

#[test]
fn delayed_completions_need_several_polls() {
    let dev = MemDevice::new("m", 64).with_reorder(3);
    let pool = pool(BLOCK_BYTES, 16);
    let mut q = dev.queue(0, 16).unwrap();
    for t in 0..16 {
        q.submit(Op::Read { lba: t, blocks: 1, buf: pool.get().unwrap() }, t).unwrap();
    }
    let mut done = Vec::new();
    let first = q.poll(&mut done);
    assert!(first < 16, "a reordering device does not finish everything at once");
    let mut polls = 1;
    while q.inflight() > 0 {
        q.poll(&mut done);
        polls += 1;
        assert!(polls < 1000);
    }
    assert!(polls > 1);
    assert_eq!(done.len(), 16);
}

#[test]
fn a_read_can_overtake_an_earlier_write() {
    // Both in flight together: either order is allowed, and both happen.
    let (mut old, mut new) = (0, 0);
    for seed in 0..64 {
        let mut img = Image::new(8);
        img.write(2, &pattern_vec(1, 2, 1));
        let dev = MemDevice::from_image("m", img).with_reorder(seed);
        let pool = pool(BLOCK_BYTES, 2);
        let mut q = dev.queue(0, 2).unwrap();
        let mut w = pool.get().unwrap();
        pattern(2, 2, &mut w);
        q.submit(Op::Write { lba: 2, blocks: 1, buf: w }, 0).unwrap();
        q.submit(Op::Read { lba: 2, blocks: 1, buf: pool.get().unwrap() }, 1).unwrap();
        let mut done = Vec::new();
        drain(&mut *q, &mut done);
        let read = done.into_iter().find(|c| c.token == 1).unwrap().buf.unwrap();
        if read[..BLOCK_BYTES] == pattern_vec(1, 2, 1)[..] {
            old += 1;
        } else {
            assert!(read[..BLOCK_BYTES] == pattern_vec(2, 2, 1)[..], "the read saw neither version");
            new += 1;
        }
        assert!(dev.snapshot().block(2) == &pattern_vec(2, 2, 1)[..], "the write landed");
    }
    assert!(old > 0 && new > 0, "old {old} new {new}: both orders must occur over 64 seeds");
}

#[test]
fn read_only_refuses_writes_at_submit() {
    let dev = MemDevice::new("ro", 8).read_only();
    let mut q = dev.queue(0, 1).unwrap();
    match q.submit(Op::WriteZeroes { lba: 0, blocks: 1 }, 0) {
        Err(Rejected::Invalid(_, e)) => assert_eq!(e.to_string(), "device ro: write-zeroes at byte offset 0: device is read-only"),
        other => panic!("{other:?}"),
    }
    assert_eq!(block::sync::flush(&mut *q), Ok(()));
}

#[test]
fn images_compare_by_content() {
    let mut a = Image::new(4);
    let mut b = Image::new(4);
    a.write(1, &vec![0u8; BLOCK_BYTES]); // zeros written = a hole
    assert_eq!(a, b);
    a.write(1, &pattern_vec(1, 1, 2));
    b.write(1, &pattern_vec(1, 1, 2));
    assert_eq!(a, b);
    assert_eq!(a.nonzero_blocks().map(|(l, _)| l).collect::<Vec<_>>(), vec![1, 2]);
    b.set(2, None);
    assert_ne!(a, b);
    assert!(b.block(2).iter().all(|&x| x == 0));
}

