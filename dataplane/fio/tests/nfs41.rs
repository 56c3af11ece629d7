//! The engine's pNFS mode against a server that grants no layouts (a
//! chimerad without pNFS: LAYOUTGET answers NFS4ERR_LAYOUTUNAVAILABLE):
//! plain NFSv4.1. Every I/O goes through the server's session, in flight
//! together up to the depth (not one at a time), and the data is there for
//! any other client.

use chimera_fio::{Engine, Op};
use client::nfs3::Nfs3;
use client::{Auth, Limits};
use std::time::Duration;
mod common;

use common::{drain, pattern};

const BS: usize = 4096;

#[test]
fn without_layouts_every_io_goes_through_the_session_at_depth() {
    let s = common::start_memfs();
    let depth = 16;
    let mut e = Engine::connect(common::config(&s, "/m", depth, true)).expect("an NFSv4.1 engine");
    let f = e.open("plain.0", true).unwrap();
    // The first write learns there is no layout (its LAYOUTGET waits); then
    // the rest go out together without waiting.
    let blocks = 64u64;
    let mut bufs: Vec<Vec<u8>> = (0..blocks).map(|b| pattern(5, b * BS as u64, BS)).collect();
    unsafe { e.queue(f, Op::Write, 0, bufs[0].as_mut_ptr(), BS, 0) }.unwrap();
    e.commit();
    assert_eq!(drain(&mut e), vec![(0, BS as i64)]);
    for b in 1..=depth as u64 {
        unsafe { e.queue(f, Op::Write, b * BS as u64, bufs[b as usize].as_mut_ptr(), BS, b) }.unwrap();
    }
    e.commit();
    assert_eq!(e.mds_io_in_flight(), depth, "{depth} writes queued, none reaped: all on the session at once");
    let mut got = drain(&mut e);
    got.sort_unstable();
    assert_eq!(got, (1..=depth as u64).map(|b| (b, BS as i64)).collect::<Vec<_>>());
    // Another file opened while I/O is in flight (OPEN and LAYOUTGET need a
    // slot of the session: one is always left).
    let mut out = vec![(0u64, 0i64); depth];
    let mut next = depth as u64 + 1;
    let mut done = 0;
    let mut g = None;
    while done < blocks - 1 - depth as u64 {
        while next < blocks && e.in_flight() < depth {
            unsafe { e.queue(f, Op::Write, next * BS as u64, bufs[next as usize].as_mut_ptr(), BS, next) }.unwrap();
            next += 1;
        }
        e.commit();
        if g.is_none() {
            g = Some(e.open("other.0", true).expect("an open while I/O is in flight on the session"));
        }
        let n = e.reap(1, Some(Duration::from_secs(10)), &mut out);
        assert!(n > 0, "no completion within 10 s");
        for &(tag, res) in &out[..n] {
            assert_eq!(res, BS as i64, "write {tag}");
        }
        done += n as u64;
    }
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 999) }.unwrap();
    assert_eq!(drain(&mut e), vec![(999, 0)], "fsync");
    // Read everything back at depth.
    let mut rbufs: Vec<Vec<u8>> = (0..blocks).map(|_| vec![0u8; BS]).collect();
    for b in 0..blocks {
        unsafe { e.queue(f, Op::Read, b * BS as u64, rbufs[b as usize].as_mut_ptr(), BS, b) }.unwrap();
        if e.in_flight() >= depth {
            e.commit();
            let n = e.reap(1, Some(Duration::from_secs(10)), &mut out);
            assert!(out[..n].iter().all(|&(_, r)| r == BS as i64), "reads: {:?}", &out[..n]);
        }
    }
    e.commit();
    assert!(drain(&mut e).iter().all(|&(_, r)| r == BS as i64));
    for b in 0..blocks {
        assert!(rbufs[b as usize] == bufs[b as usize], "block {b} reads back");
    }
    assert_eq!(e.through_mds(), 2 * blocks, "every write and read went through the server");
    assert!(e.mds_io_in_flight_max() >= depth - 1, "at most {} through the session at once", e.mds_io_in_flight_max());
    assert_eq!(e.errors(), 0);
    // Another client (NFSv3) sees the data.
    let lim = Limits { timeout: Duration::from_secs(10), ..Limits::default() };
    let mut v3 = Nfs3::connect(&s.nfs_addr.unwrap().to_string(), &Auth::sys(0, 0), lim).unwrap();
    let root = v3.mount("/m").unwrap();
    let (fh, _) = v3.lookup(&root, b"plain.0").unwrap();
    let mut data = Vec::new();
    v3.read(&fh, 0, (blocks as usize * BS) as u32, &mut data).unwrap();
    assert!(data == bufs.concat(), "the file as NFSv3 reads it");
    e.close(f).unwrap();
    e.close(g.unwrap()).unwrap();
    s.shutdown();
}

/// Writes through the session are UNSTABLE (before, FILE_SYNC: a device
/// flush each on a durable backend). A plain NFSv4.1 server on diskfs
/// answers three of them and restarts before the fsync (diskfs maps new
/// blocks only at COMMIT: they are gone); the fsync's COMMIT carries the
/// new write verifier, and the engine writes its held copies again through
/// the new session and COMMITs: the fsync succeeds and the data reads back.
/// With `chimera_hold_mib=0` the fsync fails with EIO naming the file
/// instead of reporting the writes durable, and the blocks are indeed gone.
#[test]
fn unstable_writes_a_restart_lost_are_written_again_through_the_session_or_fail_the_fsync() {
    let img = common::device("nfs41-lost");
    let mut s = common::start_diskfs(&img, 0, true, 1);
    let port = s.nfs_addr.unwrap().port();
    let mut kept = Engine::connect(common::config(&s, "/d", 4, true)).unwrap();
    let mut bare = Engine::connect(chimera_fio::Config { hold_mib: 0, ..common::config(&s, "/d", 4, true) }).unwrap();
    let (fk, fb) = (kept.open("kept.0", true).unwrap(), bare.open("bare.0", true).unwrap());
    let mut a = pattern(11, 0, 3 * 65536);
    for (e, f) in [(&mut kept, fk), (&mut bare, fb)] {
        for u in 0..3u64 {
            let at = (u * 65536) as usize;
            unsafe { e.queue(f, Op::Write, u * 65536, a[at..].as_mut_ptr(), BS, u) }.unwrap();
        }
        e.commit();
        let mut got = drain(e);
        got.sort_unstable();
        assert_eq!(got, vec![(0, BS as i64), (1, BS as i64), (2, BS as i64)]);
        assert_eq!(e.through_mds(), 3, "through the session");
    }
    assert_eq!(kept.held_bytes(), 3 * BS, "answered UNSTABLE and held");
    assert_eq!(bare.held_bytes(), 0);
    s.shutdown();
    s = common::start_diskfs(&img, port, false, 1);
    unsafe { kept.queue(fk, Op::Sync, 0, std::ptr::null_mut(), 0, 10) }.unwrap();
    assert_eq!(drain(&mut kept), vec![(10, 0)], "the held writes were written again");
    assert_eq!(kept.resent(), (3, 3 * BS as u64));
    assert_eq!(kept.held_bytes(), 0);
    unsafe { bare.queue(fb, Op::Sync, 0, std::ptr::null_mut(), 0, 10) }.unwrap();
    assert_eq!(drain(&mut bare), vec![(10, -(libc::EIO as i64))], "nothing held: the fsync reports what the restart may have lost");
    for u in 0..3u64 {
        let at = (u * 65536) as usize;
        let want = &a[at..at + BS];
        let mut got = vec![0u8; BS];
        unsafe { kept.queue(fk, Op::Read, u * 65536, got.as_mut_ptr(), BS, 20) }.unwrap();
        kept.commit();
        assert_eq!(drain(&mut kept), vec![(20, BS as i64)]);
        assert!(got == want, "block {u} of the held file after the restart");
        got.fill(0);
        unsafe { bare.queue(fb, Op::Read, u * 65536, got.as_mut_ptr(), BS, 21) }.unwrap();
        bare.commit();
        let r = drain(&mut bare);
        assert!(r[0].1 < BS as i64 || got != want, "block {u} of the unheld file was really lost ({r:?})");
    }
    // Nothing else is wrong: a write and an fsync now are clean.
    unsafe { bare.queue(fb, Op::Write, 0, a.as_mut_ptr(), BS, 30) }.unwrap();
    bare.commit();
    assert_eq!(drain(&mut bare), vec![(30, BS as i64)]);
    unsafe { bare.queue(fb, Op::Sync, 0, std::ptr::null_mut(), 0, 31) }.unwrap();
    assert_eq!(drain(&mut bare), vec![(31, 0)]);
    kept.close(fk).unwrap();
    bare.close(fb).unwrap();
    s.shutdown();
    let _ = std::fs::remove_dir_all(img.parent().unwrap());
}
