//! RecordingDevice and crash images: the image at flush point k holds
//! exactly the writes durable then (those completed before flush k was
//! submitted), checked by hand and against a model of a random reordered
//! workload; images between flush points differ from the flush image only
//! in blocks of pending writes, take only their contents, tear at 4 KiB,
//! repeat by seed; a failed flush is no flush point and a failed write is
//! never durable.

mod common;

use block::fault::FaultDevice;
use block::mem::{Image, MemDevice};
use block::recording::RecordingDevice;
use block::rng::SeededRng;
use block::{BlockDevice, Op, Rejected, BLOCK_BYTES};
use common::*;
use std::collections::BTreeSet;
use std::sync::Arc;

fn base_device(blocks: u64) -> Arc<MemDevice> {
    let mut img = Image::new(blocks);
    img.write(blocks - 1, &pattern_vec(99, blocks - 1, 1));
    Arc::new(MemDevice::from_image("rec", img))
}

#[test]
fn image_at_each_flush_holds_exactly_the_writes_before_it() {
    let mem = base_device(64);
    let base = mem.snapshot();
    let rec = RecordingDevice::new(mem.clone());
    let pool = pool(4 * BLOCK_BYTES, 2);
    let mut q = rec.queue(0, 4).unwrap();
    for e in 0..5u64 {
        block::sync::write(&mut *q, &pool, 8 + 4 * e, &pattern_vec(e, 8 + 4 * e, 4)).unwrap();
        block::sync::write(&mut *q, &pool, 0, &pattern_vec(100 + e, 0, 1)).unwrap();
        block::sync::flush(&mut *q).unwrap();
    }
    // Reads are not recorded as writes.
    let mut scratch = vec![0u8; BLOCK_BYTES];
    block::sync::read(&mut *q, &pool, 0, &mut scratch).unwrap();
    let r = rec.recording();
    assert_eq!(r.flush_points(), 5);
    assert_eq!(r.writes().len(), 10);
    for k in 0..=5u64 {
        let mut want = base.clone();
        for e in 0..k {
            want.write(8 + 4 * e, &pattern_vec(e, 8 + 4 * e, 4));
            want.write(0, &pattern_vec(100 + e, 0, 1));
        }
        assert!(r.image_at_flush(&base, k as usize) == want, "flush point {k}");
    }
    assert_eq!(r.image_at_flush(&base, 0), base);
    assert_eq!(r.image_all(&base), mem.snapshot(), "the recording replays to the device's contents");
    assert!(r.pending_writes(5).is_empty());
    assert_eq!(r.crash_image(&base, 5, 1), r.image_at_flush(&base, 5));
}

#[test]
fn a_flush_covers_only_writes_completed_before_it_was_submitted() {
    let mem = base_device(16);
    let base = mem.snapshot();
    let rec = RecordingDevice::new(mem.clone());
    let pool = pool(BLOCK_BYTES, 4);
    let mut q = rec.queue(0, 4).unwrap();
    block::sync::write(&mut *q, &pool, 4, &pattern_vec(1, 4, 1)).unwrap(); // write 0
    // Write 1 and the flush in flight together: the flush does not cover it.
    let mut b = pool.get().unwrap();
    pattern(2, 5, &mut b);
    q.submit(Op::Write { lba: 5, blocks: 1, buf: b }, 1).unwrap();
    q.submit(Op::Flush, 2).unwrap();
    let mut done = Vec::new();
    drain(&mut *q, &mut done);
    assert!(done.iter().all(|c| c.result.is_ok()));
    block::sync::flush(&mut *q).unwrap();
    let r = rec.recording();
    assert_eq!(r.flush_points(), 2);
    assert_eq!(r.durable_writes(1), vec![0]);
    assert_eq!(r.pending_writes(1), vec![1]);
    assert_eq!(r.durable_writes(2), vec![0, 1]);
    let at1 = r.image_at_flush(&base, 1);
    assert!(at1.block(4) == &pattern_vec(1, 4, 1)[..]);
    assert!(at1.block(5).iter().all(|&x| x == 0), "write 1 is not durable at flush point 1");
    assert!(r.image_at_flush(&base, 2).block(5) == &pattern_vec(2, 5, 1)[..]);
}

#[test]
fn crash_images_between_flushes() {
    let mem = base_device(64);
    let base = mem.snapshot();
    let rec = RecordingDevice::new(mem.clone());
    let pool = pool(4 * BLOCK_BYTES, 8);
    let mut q = rec.queue(0, 8).unwrap();
    block::sync::write(&mut *q, &pool, 10, &pattern_vec(0, 10, 1)).unwrap();
    block::sync::write(&mut *q, &pool, 21, &pattern_vec(0, 21, 1)).unwrap();
    block::sync::flush(&mut *q).unwrap(); // point 1
    // Pending in window 1: A (4 blocks at 20), B (30), C (21, over A), Z (zeroes at 10).
    let (a, b, c) = (pattern_vec(1, 20, 4), pattern_vec(2, 30, 1), pattern_vec(3, 21, 1));
    block::sync::write(&mut *q, &pool, 20, &a).unwrap();
    block::sync::write(&mut *q, &pool, 30, &b).unwrap();
    block::sync::write(&mut *q, &pool, 21, &c).unwrap();
    block::sync::write_zeroes(&mut *q, 10, 1).unwrap();
    block::sync::flush(&mut *q).unwrap(); // point 2
    let d = pattern_vec(4, 40, 1);
    block::sync::write(&mut *q, &pool, 40, &d).unwrap(); // pending in window 2 only
    let r = rec.recording();
    assert_eq!(r.flush_points(), 2);
    assert_eq!(r.pending_writes(1), vec![2, 3, 4, 5]);
    assert_eq!(r.pending_writes(2), vec![6]);

    let at1 = r.image_at_flush(&base, 1);
    let blk = |v: &Vec<u8>, i: usize| v[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES].to_vec();
    let zero = vec![0u8; BLOCK_BYTES];
    // Allowed contents per block a pending write touches.
    let allowed: Vec<(u64, Vec<Vec<u8>>)> = vec![
        (10, vec![at1.block(10).to_vec(), zero.clone()]),
        (20, vec![at1.block(20).to_vec(), blk(&a, 0)]),
        (21, vec![at1.block(21).to_vec(), blk(&a, 1), blk(&c, 0)]),
        (22, vec![at1.block(22).to_vec(), blk(&a, 2)]),
        (23, vec![at1.block(23).to_vec(), blk(&a, 3)]),
        (30, vec![at1.block(30).to_vec(), blk(&b, 0)]),
    ];
    let touched: BTreeSet<u64> = allowed.iter().map(|(l, _)| *l).collect();
    let mut seen: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); allowed.len()];
    let (mut torn, mut none, mut all) = (0, 0, 0);
    for seed in 0..300 {
        let img = r.crash_image(&base, 1, seed);
        for l in 0..64 {
            if !touched.contains(&l) {
                assert!(img.block(l) == at1.block(l), "seed {seed}: block {l} changed but no pending write touches it");
            }
        }
        for (i, (l, choices)) in allowed.iter().enumerate() {
            let pos = choices.iter().position(|c| c[..] == *img.block(*l));
            let pos = pos.unwrap_or_else(|| panic!("seed {seed}: block {l} holds bytes no write put there"));
            seen[i].insert(pos);
        }
        // A's blocks not overlapped by C: 20, 22, 23.
        let applied = [(20, 0), (22, 2), (23, 3)].iter().filter(|&&(l, j)| *img.block(l) == blk(&a, j)[..]).count();
        match applied {
            0 => none += 1,
            3 => all += 1,
            _ => torn += 1,
        }
        assert_eq!(img, r.crash_image(&base, 1, seed), "seed {seed} repeats");
    }
    for (i, (l, choices)) in allowed.iter().enumerate() {
        assert_eq!(seen[i].len(), choices.len(), "block {l}: every allowed content occurs over 300 seeds");
    }
    assert!(torn > 0 && none > 0 && all > 0, "torn {torn} none {none} all {all}");

    let at2 = r.image_at_flush(&base, 2);
    let mut with_d = at2.clone();
    with_d.write(40, &d);
    let mut kinds = BTreeSet::new();
    for seed in 0..40 {
        let img = r.crash_image(&base, 2, seed);
        assert!(img == at2 || img == with_d, "window 2 differs only by write D");
        kinds.insert(img == with_d);
    }
    assert_eq!(kinds.len(), 2);
}

#[test]
fn flush_points_match_a_model_of_a_random_reordered_workload() {
    // The test keeps its own account of what completed before each flush
    // was submitted and rebuilds every flush image from it.
    let blocks = 32u64;
    let mem = Arc::new(MemDevice::new("rec", blocks).with_reorder(11));
    let base = mem.snapshot();
    let rec = RecordingDevice::new(mem.clone());
    let pool = pool(3 * BLOCK_BYTES, 16);
    let mut q = rec.queue(0, 8).unwrap();
    let mut rng = SeededRng::new(5);
    let mut writes: Vec<(u64, Vec<u8>)> = Vec::new(); // by token
    let mut completed: Vec<usize> = Vec::new(); // write tokens, in completion order
    let mut flush_cover: Vec<usize> = Vec::new(); // per flush token: writes completed at its submit
    let mut points: Vec<usize> = Vec::new(); // flushes in completion order
    const FLUSH: u64 = 1 << 32;
    let mut done = Vec::new();
    for step in 0..600 {
        if rng.below(8) == 0 {
            match q.submit(Op::Flush, FLUSH + flush_cover.len() as u64) {
                Ok(()) => flush_cover.push(completed.len()),
                Err(Rejected::Busy(_)) => {}
                Err(e) => panic!("{e:?}"),
            }
        } else if let Some(mut buf) = pool.get() {
            let n = 1 + rng.below(3) as u32;
            let lba = rng.below(blocks - n as u64 + 1);
            pattern(step, lba, &mut buf[..n as usize * BLOCK_BYTES]);
            let data = buf[..n as usize * BLOCK_BYTES].to_vec();
            if q.submit(Op::Write { lba, blocks: n, buf }, writes.len() as u64).is_ok() {
                writes.push((lba, data));
            }
        }
        q.poll(&mut done);
        for c in done.drain(..) {
            c.result.unwrap();
            if c.token >= FLUSH {
                points.push((c.token - FLUSH) as usize);
            } else {
                completed.push(c.token as usize);
            }
        }
    }
    drain(&mut *q, &mut done);
    for c in done.drain(..) {
        if c.token >= FLUSH {
            points.push((c.token - FLUSH) as usize);
        } else {
            completed.push(c.token as usize);
        }
    }
    let r = rec.recording();
    assert_eq!(r.flush_points(), points.len());
    assert!(points.len() > 20, "the workload flushed {} times", points.len());
    let mut cover = 0;
    for (k, &f) in points.iter().enumerate() {
        cover = cover.max(flush_cover[f]);
        let mut want = base.clone();
        for &w in &completed[..cover] {
            want.write(writes[w].0, &writes[w].1);
        }
        assert!(r.image_at_flush(&base, k + 1) == want, "flush point {}", k + 1);
    }
    assert_eq!(r.image_all(&base), mem.snapshot());
}

#[test]
fn failed_flushes_and_writes_are_never_durable() {
    let mem = Arc::new(MemDevice::new("rec", 16));
    let base = mem.snapshot();
    let fault = Arc::new(FaultDevice::new(mem.clone()));
    let ctl = fault.control();
    let rec = RecordingDevice::new(fault.clone());
    let pool = pool(BLOCK_BYTES, 2);
    let mut q = rec.queue(0, 2).unwrap();
    block::sync::write(&mut *q, &pool, 1, &pattern_vec(1, 1, 1)).unwrap();
    ctl.fail_after_ops(0);
    assert!(block::sync::write(&mut *q, &pool, 2, &pattern_vec(2, 2, 1)).is_err());
    assert!(block::sync::flush(&mut *q).is_err());
    ctl.clear();
    block::sync::flush(&mut *q).unwrap();
    let r = rec.recording();
    assert_eq!(r.flushes().len(), 2);
    assert_eq!(r.flush_points(), 1, "the failed flush is no flush point");
    assert_eq!(r.durable_writes(1), vec![0]);
    assert_eq!(r.pending_writes(1), vec![1], "a failed write may have landed in part");
    assert!(r.image_at_flush(&base, 1).block(2).iter().all(|&x| x == 0));
}
