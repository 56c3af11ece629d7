//! NFSv4.1 sessions against an in-process chimerad.

mod common;

use client::nfs4::Nfs41;
use client::Error;
use common::*;
use std::time::Duration;

fn connect(s: &chimerad::serve::Running, owner: &str) -> Nfs41 {
    Nfs41::connect(&addr(s), &root(), limits(), owner.as_bytes()).unwrap()
}

fn stat(e: &Error) -> String {
    match e {
        Error::Nfs4 { stat, .. } => stat.clone(),
        other => panic!("expected an nfsstat4, got {other}"),
    }
}

#[test]
fn session_open_write_read_close_round_trip() {
    let s = start();
    let mut c = connect(&s, "rt");
    assert!(c.slots() >= 1 && c.slots() <= client::nfs4::SLOTS_WANTED as usize, "{} slots", c.slots());
    assert!(c.lease() >= Duration::from_secs(1));
    let o = c.open("/m", "f", 3, Some(0o640)).unwrap();
    let cases: &[(u64, usize)] = &[(0, 1), (3, 5000), (8192, 65_536), (1 << 20, 1 << 20), (7 << 20, 100)];
    for (i, &(off, len)) in cases.iter().enumerate() {
        let data = pattern(i as u8 + 40, off, len);
        let (n, _stable, _verf) = c.write(&o, off, &data, i % 2 == 0).unwrap();
        assert_eq!(n as usize, len);
    }
    c.commit(&o.fh).unwrap();
    for (i, &(off, len)) in cases.iter().enumerate() {
        let mut got = Vec::new();
        let mut out = Vec::new();
        while got.len() < len {
            let eof = c.read(&o, off + got.len() as u64, (len - got.len()) as u32, &mut out).unwrap();
            got.extend_from_slice(&out);
            if eof || out.is_empty() {
                break;
            }
        }
        assert!(got == pattern(i as u8 + 40, off, len), "case {i}: bytes differ");
    }
    let a = c.getattr(&o.fh).unwrap();
    assert_eq!(a.size, (7 << 20) + 100);
    assert_eq!(a.mode & 0o7777, 0o640);
    assert_eq!(a.ftype, 1, "NF4REG");
    assert_eq!(c.lookup_path("/m/f").unwrap(), o.fh);
    let closed = c.close(&o).unwrap();
    assert_ne!(closed, o.stateid);
    // The closed stateid no longer reads.
    let e = c.read(&o, 0, 10, &mut Vec::new()).unwrap_err();
    assert!(stat(&e).contains("STATEID"), "{e}");
    // Reopen without create: same file, same data.
    let o2 = c.open("/m", "f", 1, None).unwrap();
    assert_eq!(o2.fh, o.fh);
    let mut out = Vec::new();
    c.read(&o2, 3, 5000, &mut out).unwrap();
    assert!(out == pattern(41, 3, 5000));
    c.close(&o2).unwrap();
}

#[test]
fn pipelined_on_all_slots() {
    const BS: usize = 8192;
    let s = start();
    let mut c = connect(&s, "pipe");
    let n = c.slots().min(32);
    let o = c.open("/m", "p", 3, Some(0o644)).unwrap();
    let bufs: Vec<Vec<u8>> = (0..n).map(|i| pattern(9, (i * BS) as u64, BS)).collect();
    let fls: Vec<_> = bufs.iter().enumerate().map(|(i, b)| c.submit_write(&o, (i * BS) as u64, b, true).unwrap()).collect();
    if n == c.slots() {
        // Every slot busy: one more is refused until a reply is finished.
        assert!(matches!(c.submit_write(&o, 0, b"x", true), Err(Error::TooManyInFlight { .. })));
    }
    let mut done = Vec::new();
    while done.len() < n {
        c.rpc().reap(&mut done, Duration::from_secs(1));
    }
    for d in done {
        let fl = *fls.iter().find(|f| f.xid == d.xid).expect("one of ours");
        let i = fls.iter().position(|f| f.xid == d.xid).unwrap();
        let (cnt, _, _) = c.finish_write(fl, d.result, &o, (i * BS) as u64, &bufs[i]).unwrap();
        assert_eq!(cnt as usize, BS);
    }
    let fls: Vec<_> = (0..n).map(|i| c.submit_read(&o, (i * BS) as u64, BS as u32).unwrap()).collect();
    let mut done = Vec::new();
    while done.len() < n {
        c.rpc().reap(&mut done, Duration::from_secs(1));
    }
    let mut out = Vec::new();
    for d in done {
        let i = fls.iter().position(|f| f.xid == d.xid).expect("one of ours");
        c.finish_read(fls[i], d.result, &mut out).unwrap();
        assert!(out == bufs[i], "block {i}");
    }
    // The slots' sequence ids advanced: further COMPOUNDs still succeed.
    c.renew().unwrap();
    c.close(&o).unwrap();
}

#[test]
fn errors_and_renewal() {
    let s = start();
    let mut c = connect(&s, "err");
    let e = c.lookup_path("/m/none").unwrap_err();
    assert_eq!(stat(&e), "NFS4ERR_NOENT");
    assert!(e.to_string().contains("OP_LOOKUP"), "{e}");
    let e = c.open("/m", "missing", 1, None).unwrap_err();
    assert_eq!(stat(&e), "NFS4ERR_NOENT", "{e}");
    assert!(!c.renew_due(), "just renewed by the last SEQUENCE");
    for _ in 0..3 {
        c.renew().unwrap();
    }
    // An AUTH_SYS user who may not create in the root-owned export root.
    let mut u = Nfs41::connect(&addr(&s), &client::Auth::sys(1000, 1000), limits(), b"user").unwrap();
    let e = u.open("/m", "x", 3, Some(0o644)).unwrap_err();
    assert_eq!(stat(&e), "NFS4ERR_ACCESS", "{e}");
    // The server goes away: a connection error, not a hang.
    s.shutdown();
    let e = c.renew().unwrap_err();
    assert!(e.is_connection(), "{e}");
    // The slot of the unanswered COMPOUND is in doubt and not used again.
    assert_eq!(c.usable_slots(), c.slots() - 1);
}

#[test]
fn server_restart_then_reestablish() {
    let s = start();
    let a = addr(&s);
    let port = s.nfs_addr.unwrap().port();
    let mut c = connect(&s, "restart");
    let o = c.open("/m", "r", 3, Some(0o644)).unwrap();
    c.write(&o, 0, &pattern(1, 0, 5000), true).unwrap();
    s.shutdown();
    let e = c.renew().unwrap_err();
    assert!(e.is_connection(), "{e}");
    let s2 = start_on(port);
    c.reestablish(&a, &root(), limits()).unwrap();
    assert_eq!(c.usable_slots(), c.slots(), "a new session has every slot");
    // The old open is gone with the old server (memfs lost the file too).
    let e = c.read(&o, 0, 10, &mut Vec::new()).unwrap_err();
    assert!(matches!(&e, Error::Nfs4 { .. }), "{e}");
    let o2 = c.open("/m", "r", 3, Some(0o644)).unwrap();
    let data = pattern(2, 100, 7000);
    c.write(&o2, 100, &data, false).unwrap();
    c.commit(&o2.fh).unwrap();
    let mut out = Vec::new();
    c.read(&o2, 100, 7000, &mut out).unwrap();
    assert!(out == data);
    c.close(&o2).unwrap();
    s2.shutdown();
}
