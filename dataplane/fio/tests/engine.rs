//! The engine against an in-process chimerad (memfs, and diskfs for the
//! restart cases), driven the way fio drives it: queue up to a depth,
//! reap, verify.

use chimerad::serve::Running;
use chimera_fio::{Config, Engine, Op};
mod common;

use common::{device, drain, pattern, start_diskfs, start_memfs};
use std::time::{Duration, Instant};

fn cfg(s: &Running, export: &str, conns: usize, iodepth: usize) -> Config {
    Config { conns, ..common::config(s, export, iodepth, false) }
}

#[test]
fn random_writes_then_reads_verify_at_depth_over_several_connections() {
    let s = start_memfs();
    let depth = 32;
    let mut e = Engine::connect(cfg(&s, "/m", 3, depth)).unwrap();
    let f = e.open("dir/sub/file.0", true).unwrap();
    const BS: usize = 4096;
    const BLOCKS: u64 = 256;
    // A permutation of the blocks, written with `depth` in flight.
    let order: Vec<u64> = (0..BLOCKS).map(|i| (i * 97) % BLOCKS).collect();
    let mut bufs: Vec<Vec<u8>> = order.iter().map(|&b| pattern(1, b * BS as u64, BS)).collect();
    let mut next = 0;
    let mut done = 0;
    let mut out = vec![(0u64, 0i64); depth];
    while done < order.len() {
        while next < order.len() && e.in_flight() < depth {
            let b = order[next];
            unsafe { e.queue(f, Op::Write, b * BS as u64, bufs[next].as_mut_ptr(), BS, next as u64) }.unwrap();
            next += 1;
        }
        e.commit();
        let n = e.reap(1, Some(Duration::from_secs(10)), &mut out);
        assert!(n > 0, "no completion within 10 s");
        for &(tag, res) in &out[..n] {
            assert_eq!(res, BS as i64, "write {tag}");
        }
        done += n;
    }
    // A sync (COMMIT) completes with 0.
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 999) }.unwrap();
    assert_eq!(drain(&mut e), vec![(999, 0)]);
    // Read back in another order, all in flight at once (depth 256 > 32:
    // the connections admit it).
    let mut rbufs: Vec<Vec<u8>> = (0..BLOCKS).map(|_| vec![0u8; BS]).collect();
    for b in 0..BLOCKS {
        unsafe { e.queue(f, Op::Read, b * BS as u64, rbufs[b as usize].as_mut_ptr(), BS, b) }.unwrap();
    }
    let got = drain(&mut e);
    assert_eq!(got.len(), BLOCKS as usize);
    for (tag, res) in got {
        assert_eq!(res, BS as i64, "read {tag}");
    }
    for b in 0..BLOCKS {
        assert!(rbufs[b as usize] == pattern(1, b * BS as u64, BS), "block {b} reads back what was written");
    }
    // 1 MiB I/O, the largest, unaligned offset.
    let mut big = pattern(2, 12345, 1 << 20);
    unsafe { e.queue(f, Op::Write, 12345, big.as_mut_ptr(), big.len(), 1) }.unwrap();
    assert_eq!(drain(&mut e), vec![(1, 1 << 20)]);
    let mut back = vec![0u8; 1 << 20];
    unsafe { e.queue(f, Op::Read, 12345, back.as_mut_ptr(), back.len(), 2) }.unwrap();
    assert_eq!(drain(&mut e), vec![(2, 1 << 20)]);
    assert!(back == big);
    assert_eq!(e.placed_reads(), 1, "the 1 MiB READ's data was received straight into fio's buffer, the 4 KiB ones were not");
    // A read past the end is short (fio sees the residual).
    let mut tail = vec![0u8; 8192];
    let size = 12345 + (1u64 << 20);
    unsafe { e.queue(f, Op::Read, size - 100, tail.as_mut_ptr(), tail.len(), 3) }.unwrap();
    assert_eq!(drain(&mut e), vec![(3, 100)]);
    e.close(f).unwrap();
    // Nothing in flight: reap returns at once.
    let t = Instant::now();
    assert_eq!(e.reap(1, None, &mut out), 0);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(e.errors(), 0);
}

#[test]
fn bad_options_paths_and_ios_are_named_errors() {
    let s = start_memfs();
    let e = Engine::connect(cfg(&s, "/nope", 1, 1)).err().expect("unknown export");
    assert!(e.contains("/nope") && e.contains("MOUNT"), "{e}");
    let e = Engine::connect(cfg(&s, "m", 1, 1)).err().expect("relative export");
    assert!(e.contains("chimera_export"), "{e}");
    // Nobody listening: the error names the address.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = l.local_addr().unwrap().to_string();
    drop(l);
    let c = Config { server: dead.clone(), ..cfg(&s, "/m", 1, 1) };
    let e = Engine::connect(c).err().expect("refused");
    assert!(e.contains(&dead), "{e}");

    let mut e = Engine::connect(cfg(&s, "/m", 2, 4)).unwrap();
    let (errno, msg) = e.open("missing", false).unwrap_err();
    assert_eq!(errno, libc::ENOENT);
    assert!(msg.contains("missing"), "{msg}");
    let (errno, msg) = e.open("../etc/passwd", true).unwrap_err();
    assert_eq!(errno, libc::EINVAL);
    assert!(msg.contains(".."), "{msg}");
    assert_eq!(e.open("/", true).unwrap_err().0, libc::EINVAL);
    let f = e.open("f", true).unwrap();
    let mut b = vec![0u8; 2 << 20];
    let (errno, msg) = unsafe { e.queue(f, Op::Write, 0, b.as_mut_ptr(), b.len(), 1) }.unwrap_err();
    assert_eq!(errno, libc::EINVAL);
    assert!(msg.contains("bs"), "{msg}");
    assert_eq!(unsafe { e.queue(f + 7, Op::Read, 0, b.as_mut_ptr(), 4096, 1) }.unwrap_err().0, libc::EBADF);
    // A directory opened as the file: reads fail with the server's error,
    // as a result, not a hang.
    let d = e.open("dir/x", true).unwrap();
    e.close(d).unwrap();
    let dir = e.open("dir", false).unwrap();
    unsafe { e.queue(dir, Op::Read, 0, b.as_mut_ptr(), 4096, 5) }.unwrap();
    let r = drain(&mut e);
    assert_eq!(r.len(), 1);
    assert!(r[0].1 < 0, "READ of a directory fails: {r:?}");
    assert_eq!(e.errors(), 1);
    // The file still works after all that.
    b[..4096].copy_from_slice(&pattern(3, 0, 4096));
    unsafe { e.queue(f, Op::Write, 0, b.as_mut_ptr(), 4096, 6) }.unwrap();
    assert_eq!(drain(&mut e), vec![(6, 4096)]);
}

/// With `chimera_retry_s=0` (fail at once): a lost server fails queued
/// I/Os at once, and the next I/O reconnects to the restarted one.
/// UNSTABLE writes the old server answered and then lost (diskfs logs their
/// block maps only at COMMIT; its stop does not) are sent again from the
/// engine's copies when the COMMIT shows the new verifier: fsync succeeds
/// and the data is there. With `chimera_hold_mib=0` nothing is kept: that
/// COMMIT fails with EIO and the data is indeed gone.
#[test]
fn a_restart_lost_writes_are_resent_from_held_copies_or_reported_by_commit() {
    let img = device("restart");
    let s = start_diskfs(&img, 0, true, 0);
    let port = s.nfs_addr.unwrap().port();
    let mut kept = Engine::connect(Config { retry_s: 0, ..cfg(&s, "/d", 1, 8) }).unwrap();
    let mut bare = Engine::connect(Config { retry_s: 0, hold_mib: 0, ..cfg(&s, "/d", 1, 8) }).unwrap();
    let (fk, fb) = (kept.open("kept", true).unwrap(), bare.open("bare", true).unwrap());
    let mut b = pattern(4, 0, 8192);
    unsafe { kept.queue(fk, Op::Write, 0, b.as_mut_ptr(), 8192, 1) }.unwrap();
    assert_eq!(drain(&mut kept), vec![(1, 8192)]);
    unsafe { bare.queue(fb, Op::Write, 0, b.as_mut_ptr(), 8192, 1) }.unwrap();
    assert_eq!(drain(&mut bare), vec![(1, 8192)]);
    assert_eq!((kept.held_bytes(), bare.held_bytes()), (8192, 0));
    // The server goes away: a queued I/O fails (connection lost), no hang.
    s.shutdown();
    let mut r = vec![0u8; 4096];
    for (e, f) in [(&mut kept, fk), (&mut bare, fb)] {
        match unsafe { e.queue(f, Op::Read, 0, r.as_mut_ptr(), 4096, 2) } {
            Ok(()) => {
                let got = drain(e);
                assert_eq!(got.len(), 1);
                assert!(got[0].1 < 0, "{got:?}");
            }
            Err((errno, msg)) => assert!(errno > 0 && !msg.is_empty()),
        }
    }
    // Back on the same port (a new verifier): each engine reconnects.
    let s2 = start_diskfs(&img, port, false, 0);
    let sync = |e: &mut Engine, f: u32| {
        for _ in 0..3 {
            if unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 3) }.is_ok() {
                return drain(e);
            }
        }
        panic!("the engine reconnects to the restarted server");
    };
    assert_eq!(sync(&mut bare, fb), vec![(3, -(libc::EIO as i64))], "nothing held: the COMMIT reports possible loss");
    assert_eq!(sync(&mut kept, fk), vec![(3, 0)], "held: the lost write is sent again and the COMMIT is clean");
    assert_eq!(kept.resent(), (1, 8192));
    assert_eq!(kept.held_bytes(), 0, "covered by the COMMIT of the new verifier");
    let mut got = vec![0u8; 8192];
    unsafe { kept.queue(fk, Op::Read, 0, got.as_mut_ptr(), 8192, 4) }.unwrap();
    assert_eq!(drain(&mut kept), vec![(4, 8192)]);
    assert!(got == b, "the resent data is on the restarted server");
    got.fill(0);
    unsafe { bare.queue(fb, Op::Read, 0, got.as_mut_ptr(), 8192, 4) }.unwrap();
    let r = drain(&mut bare);
    assert!(r[0].1 < 8192 || got != b, "without held copies the write was lost ({r:?}): the test's loss is real");
    // Later writes and commits are clean again.
    unsafe { bare.queue(fb, Op::Write, 0, b.as_mut_ptr(), 8192, 5) }.unwrap();
    assert_eq!(drain(&mut bare), vec![(5, 8192)]);
    bare.close(fb).unwrap();
    kept.close(fk).unwrap();
    s2.shutdown();
}

/// `chimera_hold_mib` bounds the copies: at the bound the engine COMMITs
/// on its own (what it held is then durable and dropped), so 2 MiB of
/// writes under a 1 MiB bound hold at most the bound plus the writes in
/// flight. A restart after that resends only what the last COMMIT did not
/// cover, and every block reads back.
#[test]
fn held_copies_stay_under_the_bound_and_a_restart_resends_only_the_uncovered() {
    let img = device("bound");
    let s = start_diskfs(&img, 0, true, 0);
    let port = s.nfs_addr.unwrap().port();
    let depth = 8;
    let mut e = Engine::connect(Config { retry_s: 20, hold_mib: 1, ..cfg(&s, "/d", 2, depth) }).unwrap();
    let f = e.open("b", true).unwrap();
    const BLOCKS: u64 = 512;
    let mut data: Vec<Vec<u8>> = (0..BLOCKS).map(|b| pattern(11, b * 4096, 4096)).collect();
    let mut peak = 0;
    let mut next = 0u64;
    let mut done = 0;
    let mut out = vec![(0u64, 0i64); depth];
    while done < BLOCKS as usize {
        while next < BLOCKS && e.in_flight() < depth {
            let d = &mut data[next as usize];
            unsafe { e.queue(f, Op::Write, next * 4096, d.as_mut_ptr(), 4096, next) }.unwrap();
            next += 1;
        }
        e.commit();
        let n = e.reap(1, None, &mut out);
        assert!(out[..n].iter().all(|r| r.1 == 4096), "{:?}", &out[..n]);
        done += n;
        peak = peak.max(e.held_bytes());
    }
    assert!(peak <= (1 << 20) + depth * 4096, "held {peak} bytes under a 1 MiB bound");
    let held = e.held_bytes();
    assert!(held > 0 && held < BLOCKS as usize * 4096, "{held}");
    s.shutdown();
    let s2 = start_diskfs(&img, port, false, 0);
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 1000) }.unwrap();
    assert_eq!(drain(&mut e), vec![(1000, 0)]);
    assert_eq!(e.resent(), ((held / 4096) as u64, held as u64), "only the writes no COMMIT covered went again");
    let at: Vec<u64> = (0..BLOCKS).collect();
    let mut bufs = vec![vec![0u8; 4096]; BLOCKS as usize];
    for chunk in at.chunks(depth) {
        let (lo, hi) = (chunk[0] as usize, chunk[0] as usize + chunk.len());
        check_reads(&mut e, f, chunk, &mut bufs[lo..hi]);
        assert!(drain(&mut e).iter().all(|r| r.1 == 4096));
    }
    for (b, buf) in bufs.iter().enumerate() {
        assert!(*buf == data[b], "block {b} after the restart");
    }
    e.close(f).unwrap();
    s2.shutdown();
}

/// Queue READs of the 4 KiB blocks `at` of `f` into `bufs` (tags from
/// 100); the caller drains and checks them.
#[test]
fn commit_sends_each_half_of_the_window_and_every_call_at_depth_one() {
    let s = start_memfs();
    const BS: usize = 4096;
    let mut bufs: Vec<Vec<u8>> = (0..32).map(|i| pattern(3, i * BS as u64, BS)).collect();
    // iodepth 32, one connection: the first 15 wait, the 16th sends all
    // 16, the next 15 wait again, the 32nd sends them; every commit in
    // between leaves them queued.
    let mut e = Engine::connect(cfg(&s, "/m", 1, 32)).unwrap();
    let f = e.open("batch", true).unwrap();
    for i in 0..32usize {
        unsafe { e.queue(f, Op::Write, (i * BS) as u64, bufs[i].as_mut_ptr(), BS, i as u64) }.unwrap();
        e.commit();
        let want = if (i + 1) % 16 == 0 { 0 } else { (i + 1) % 16 };
        assert_eq!(e.unsent(), want, "after the commit of I/O {i}");
    }
    let got = drain(&mut e);
    assert_eq!(got.len(), 32);
    assert!(got.iter().all(|&(_, r)| r == BS as i64), "{got:?}");
    // A partial window leaves at reap: 5 queued, none sent by commit.
    for i in 0..5usize {
        unsafe { e.queue(f, Op::Read, (i * BS) as u64, bufs[i].as_mut_ptr(), BS, 100 + i as u64) }.unwrap();
        e.commit();
    }
    assert_eq!(e.unsent(), 5);
    assert_eq!(drain(&mut e).len(), 5);
    assert_eq!(e.unsent(), 0);
    // iodepth 1: each commit sends its call (no added latency).
    let mut one = Engine::connect(cfg(&s, "/m", 1, 1)).unwrap();
    let g = one.open("batch", false).unwrap();
    unsafe { one.queue(g, Op::Read, 0, bufs[0].as_mut_ptr(), BS, 7) }.unwrap();
    one.commit();
    assert_eq!(one.unsent(), 0);
    assert_eq!(drain(&mut one), vec![(7, BS as i64)]);
    assert!(bufs[0] == pattern(3, 0, BS));
    assert_eq!(e.errors() + one.errors(), 0);
}

fn check_reads(e: &mut Engine, f: u32, at: &[u64], bufs: &mut [Vec<u8>]) {
    for (k, (&b, buf)) in at.iter().zip(bufs.iter_mut()).enumerate() {
        buf.fill(0);
        unsafe { e.queue(f, Op::Read, b * 4096, buf.as_mut_ptr(), 4096, 100 + k as u64) }.unwrap();
    }
    e.commit();
}

/// A server that goes away and comes back on its port (a pod's restart):
/// I/Os in flight on the lost connections, and I/Os queued while it is
/// down, wait and go out again once the engine reconnects — fio sees no
/// error and the data verifies; a server that stays away fails them with
/// EIO once `chimera_retry_s` has passed, naming the server.
#[test]
fn ios_of_a_lost_connection_wait_for_the_restarted_server_and_go_out_again() {
    let img = device("retry");
    let s = start_diskfs(&img, 0, true, 0);
    let port = s.nfs_addr.unwrap().port();
    let mut e = Engine::connect(Config { retry_s: 20, ..cfg(&s, "/d", 2, 16) }).unwrap();
    let f = e.open("r", true).unwrap();
    let mut data: Vec<Vec<u8>> = (0..32).map(|b| pattern(9, b * 4096, 4096)).collect();
    for (b, d) in data.iter_mut().enumerate() {
        unsafe { e.queue(f, Op::Write, b as u64 * 4096, d.as_mut_ptr(), 4096, b as u64) }.unwrap();
    }
    e.commit();
    assert!(drain(&mut e).iter().all(|r| r.1 == 4096));
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 50) }.unwrap();
    assert_eq!(drain(&mut e), vec![(50, 0)]);

    // Reads in flight when the server stops (those not answered yet wait).
    let at: Vec<u64> = (0..16).map(|k| (k * 7) % 32).collect();
    let mut bufs = vec![vec![0u8; 4096]; 16];
    check_reads(&mut e, f, &at, &mut bufs);
    s.shutdown();
    let t0 = Instant::now();
    let img_b = img.clone();
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        start_diskfs(&img_b, port, false, 0)
    });
    let got = drain(&mut e);
    assert_eq!(got.len(), 16, "{got:?}");
    assert!(got.iter().all(|r| r.1 == 4096), "reads across the restart: {got:?}");
    for (k, &b) in at.iter().enumerate() {
        assert!(bufs[k] == pattern(9, b * 4096, 4096), "block {b} read across the restart");
    }
    let s2 = back.join().unwrap();
    eprintln!("16 reads across a server restart answered after {:?}", t0.elapsed());

    // Queued while the server is down: writes and a COMMIT wait, then land.
    s2.shutdown();
    let mut fresh: Vec<Vec<u8>> = (0..8).map(|b| pattern(10, b * 4096, 4096)).collect();
    for (b, d) in fresh.iter_mut().enumerate() {
        unsafe { e.queue(f, Op::Write, b as u64 * 4096, d.as_mut_ptr(), 4096, 200 + b as u64) }.unwrap();
    }
    e.commit();
    let e_out = std::thread::scope(|sc| {
        let h = sc.spawn(|| drain(&mut e));
        std::thread::sleep(Duration::from_millis(500));
        let s3 = start_diskfs(&img, port, false, 0);
        let out = h.join().unwrap();
        (out, s3)
    });
    let (got, s3) = e_out;
    assert!(got.len() == 8 && got.iter().all(|r| r.1 == 4096), "writes queued while the server was down: {got:?}");
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 60) }.unwrap();
    assert_eq!(drain(&mut e), vec![(60, 0)], "every write went to the restarted server: its COMMIT is clean");
    let mut bufs = vec![vec![0u8; 4096]; 8];
    check_reads(&mut e, f, &(0..8).collect::<Vec<u64>>(), &mut bufs);
    assert!(drain(&mut e).iter().all(|r| r.1 == 4096));
    for (b, buf) in bufs.iter().enumerate() {
        assert!(*buf == pattern(10, b as u64 * 4096, 4096), "block {b} written while the server was down");
    }

    // A server that stays away: after chimera_retry_s, EIO.
    drop(e);
    let mut e = Engine::connect(Config { retry_s: 1, ..cfg(&s3, "/d", 1, 4) }).unwrap();
    let f = e.open("r", false).unwrap();
    s3.shutdown();
    let mut r = vec![0u8; 4096];
    let t0 = Instant::now();
    unsafe { e.queue(f, Op::Read, 0, r.as_mut_ptr(), 4096, 7) }.unwrap();
    let got = drain(&mut e);
    let took = t0.elapsed();
    assert_eq!(got, vec![(7, -(libc::EIO as i64))]);
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "gave up after {took:?}");
    assert!(e.errors() >= 1);
}
