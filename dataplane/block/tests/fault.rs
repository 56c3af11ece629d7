//! FaultDevice: EIO on configured ranges (reads, writes or both) naming
//! the device and the first failing block's offset while the rest of the
//! device works; a device that dies after N operations; one made read-only
//! (EROFS for writes, reads still served); healing; and the conformance
//! run through the wrapper when no fault is planned.

mod common;

use block::fault::{FaultDevice, Faulty};
use block::mem::MemDevice;
use block::{BlockDevice, ErrorKind, OpKind, BLOCK_BYTES};
use common::*;
use std::sync::Arc;

fn device() -> FaultDevice {
    FaultDevice::new(Arc::new(MemDevice::new("faulty", 512)))
}

#[test]
fn conformance_without_faults() {
    conformance(&device(), "faulty");
}

#[test]
fn ranges_fail_with_eio_at_their_offset() {
    let dev = device();
    let ctl = dev.control();
    let pool = pool(8 * BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 4).unwrap();
    block::sync::write(&mut *q, &pool, 8, &pattern_vec(1, 8, 8)).unwrap();
    ctl.fail_range(10..12, Faulty::Reads);
    let mut got = vec![0u8; 8 * BLOCK_BYTES];
    let e = block::sync::read(&mut *q, &pool, 8, &mut got).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io { errno: libc::EIO });
    assert_eq!((e.op, e.offset_bytes), (OpKind::Read, Some(10 * BLOCK_BYTES as u64)));
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().starts_with("device faulty: read at byte offset 40960: "), "{e}");
    // Around the range, and writes into it, still work.
    let mut two = vec![0u8; 2 * BLOCK_BYTES];
    block::sync::read(&mut *q, &pool, 8, &mut two).unwrap();
    assert!(two == pattern_vec(1, 8, 2));
    block::sync::read(&mut *q, &pool, 12, &mut two).unwrap();
    block::sync::write(&mut *q, &pool, 11, &pattern_vec(2, 11, 1)).unwrap();
    // Writes-only and all-operations ranges.
    ctl.fail_range(100..101, Faulty::Writes);
    let e = block::sync::write_zeroes(&mut *q, 98, 4).unwrap_err();
    assert_eq!((e.op, e.offset_bytes), (OpKind::WriteZeroes, Some(100 * BLOCK_BYTES as u64)));
    block::sync::read(&mut *q, &pool, 100, &mut two).unwrap();
    ctl.fail_range(200..300, Faulty::All);
    assert!(block::sync::read(&mut *q, &pool, 299, &mut two[..BLOCK_BYTES]).is_err());
    assert!(block::sync::write(&mut *q, &pool, 199, &pattern_vec(3, 199, 2)).is_err());
    block::sync::flush(&mut *q).unwrap();
    assert_eq!(ctl.failed(), 4);
    ctl.clear();
    block::sync::read(&mut *q, &pool, 8, &mut got).unwrap();
    let mut want = pattern_vec(1, 8, 8);
    want[3 * BLOCK_BYTES..4 * BLOCK_BYTES].copy_from_slice(&pattern_vec(2, 11, 1));
    assert!(got == want, "healed: the data is all there");
}

#[test]
fn a_device_that_dies_after_n_operations() {
    let dev = device();
    let ctl = dev.control();
    let pool = pool(BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 2).unwrap();
    ctl.fail_after_ops(3);
    let before = ctl.ops();
    block::sync::write(&mut *q, &pool, 1, &pattern_vec(1, 1, 1)).unwrap();
    block::sync::flush(&mut *q).unwrap();
    let mut got = vec![0u8; BLOCK_BYTES];
    block::sync::read(&mut *q, &pool, 1, &mut got).unwrap();
    for _ in 0..3 {
        let e = block::sync::read(&mut *q, &pool, 1, &mut got).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io { errno: libc::EIO });
    }
    let e = block::sync::flush(&mut *q).unwrap_err();
    assert_eq!((e.op, e.offset_bytes), (OpKind::Flush, None));
    assert_eq!(e.to_string(), format!("device faulty: flush: {}", std::io::Error::from_raw_os_error(libc::EIO)));
    assert_eq!(ctl.ops() - before, 7);
    assert_eq!(ctl.failed(), 4);
}

#[test]
fn made_read_only_it_refuses_writes_and_serves_reads() {
    let dev = device();
    let ctl = dev.control();
    let pool = pool(BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 2).unwrap();
    block::sync::write(&mut *q, &pool, 3, &pattern_vec(1, 3, 1)).unwrap();
    ctl.set_read_only(true);
    let e = block::sync::write(&mut *q, &pool, 3, &pattern_vec(2, 3, 1)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::ReadOnly { errno: Some(libc::EROFS) });
    assert_eq!(e.errno(), libc::EROFS);
    assert!(block::sync::write_zeroes(&mut *q, 3, 1).is_err());
    let mut got = vec![0u8; BLOCK_BYTES];
    block::sync::read(&mut *q, &pool, 3, &mut got).unwrap();
    assert!(got == pattern_vec(1, 3, 1), "the refused writes changed nothing");
    block::sync::flush(&mut *q).unwrap();
    ctl.set_read_only(false);
    block::sync::write(&mut *q, &pool, 3, &pattern_vec(2, 3, 1)).unwrap();
}

#[test]
fn failures_count_against_the_depth_until_polled() {
    let dev = device();
    let ctl = dev.control();
    let pool = pool(BLOCK_BYTES, 4);
    let mut q = dev.queue(0, 2).unwrap();
    ctl.fail_range(0..1, Faulty::All);
    q.submit(block::Op::Read { lba: 0, blocks: 1, buf: pool.get().unwrap() }, 1).unwrap();
    q.submit(block::Op::Read { lba: 5, blocks: 1, buf: pool.get().unwrap() }, 2).unwrap();
    assert!(matches!(q.submit(block::Op::Flush, 3), Err(block::Rejected::Busy(_))));
    let mut done = Vec::new();
    drain(&mut *q, &mut done);
    done.sort_by_key(|c| c.token);
    assert!(done[0].result.is_err() && done[0].buf.is_some(), "a failed read returns its buffer");
    assert!(done[1].result.is_ok());
}
