//! NFSv3 + MOUNT against an in-process chimerad.

mod common;

use client::nfs3::{Nfs3, Stable};
use client::{Auth, Error};
use common::*;
use std::time::Duration;

#[test]
fn write_read_verify_sizes_and_offsets() {
    let s = start();
    let (mut c, root) = connect(&s);
    let fh = c.create(&root, b"f", 0o644, true).unwrap();
    // (offset, length): unaligned, crossing 4 KiB / 64 KiB, 1 MiB, sparse far offset.
    let cases: &[(u64, usize)] = &[(0, 1), (1, 4095), (4096, 4096), (65_000, 70_000), (1 << 20, 1 << 20), (100 << 20, 513)];
    for (i, &(off, len)) in cases.iter().enumerate() {
        let data = pattern(i as u8, off, len);
        let stable = if i % 2 == 0 { Stable::FileSync } else { Stable::Unstable };
        let w = c.write(&fh, off, &data, stable).unwrap();
        assert_eq!(w.count as usize, len);
    }
    c.commit(&fh).unwrap();
    assert!(c.uncommitted(&fh).is_empty(), "commit with the same verifier clears the writes");
    for (i, &(off, len)) in cases.iter().enumerate() {
        let mut out = Vec::new();
        let mut got = Vec::new();
        while got.len() < len {
            let eof = c.read(&fh, off + got.len() as u64, (len - got.len()) as u32, &mut out).unwrap();
            assert!(!out.is_empty() || eof);
            got.extend_from_slice(&out);
            if eof {
                break;
            }
        }
        assert_eq!(got.len(), len, "case {i}");
        assert!(got == pattern(i as u8, off, len), "case {i}: bytes differ");
    }
    // A hole reads back as zeroes; the size is the last write's end.
    let mut out = Vec::new();
    c.read(&fh, 50 << 20, 100, &mut out).unwrap();
    assert_eq!(out, vec![0u8; 100]);
    assert_eq!(c.getattr(&fh).unwrap().size, (100 << 20) + 513);
    // Reading at the end: no data, eof.
    assert!(c.read(&fh, (100 << 20) + 513, 10, &mut out).unwrap());
    assert!(out.is_empty());
}

#[test]
fn pipelined_writes_and_reads() {
    const N: usize = 32;
    const BS: usize = 16 << 10;
    let s = start();
    let (mut c, root) = connect(&s);
    let fh = c.create(&root, b"p", 0o644, false).unwrap();
    let bufs: Vec<Vec<u8>> = (0..N).map(|i| pattern(3, (i * BS) as u64, BS)).collect();
    let mut xids = Vec::new();
    for (i, b) in bufs.iter().enumerate() {
        xids.push(c.submit_write(&fh, (i * BS) as u64, b, Stable::Unstable).unwrap());
    }
    assert_eq!(c.rpc().in_flight(), N);
    let mut done = Vec::new();
    while done.len() < N {
        c.rpc().reap(&mut done, Duration::from_secs(1));
    }
    for d in &done {
        let i = xids.iter().position(|x| *x == d.xid).expect("one of ours");
        let reply = d.result.as_ref().unwrap();
        let w = c.finish_write(reply, &fh, (i * BS) as u64, &bufs[i]).unwrap();
        assert_eq!(w.count as usize, BS);
    }
    // memfs stores every WRITE stably (FILE_SYNC): nothing left to commit.
    assert!(c.uncommitted(&fh).is_empty());
    c.commit(&fh).unwrap();
    let rx: Vec<u32> = (0..N).map(|i| c.submit_read(&fh, (i * BS) as u64, BS as u32).unwrap()).collect();
    let mut done = Vec::new();
    while done.len() < N {
        c.rpc().reap(&mut done, Duration::from_secs(1));
    }
    let mut out = Vec::new();
    for d in &done {
        let i = rx.iter().position(|x| *x == d.xid).expect("one of ours");
        Nfs3::finish_read(d.result.as_ref().unwrap(), &mut out).unwrap();
        assert!(out == bufs[i], "block {i} read back differs");
    }
}

#[test]
fn namespace_ops_and_readdirplus() {
    let s = start();
    let (mut c, root) = connect(&s);
    let d = c.mkdir(&root, b"dir", 0o755).unwrap();
    for i in 0..40 {
        c.create(&d, format!("file{i:02}").as_bytes(), 0o600, true).unwrap();
    }
    let sub = c.mkdir(&d, b"sub", 0o755).unwrap();
    let f = c.create(&sub, b"deep", 0o644, true).unwrap();
    assert_eq!(c.walk(&root, "/dir/sub/deep").unwrap(), f);
    let all = c.readdir_all(&d, 1000).unwrap();
    let mut names: Vec<String> = all.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).filter(|n| n != "." && n != "..").collect();
    names.sort();
    assert_eq!(names.len(), 41, "{names:?}");
    assert_eq!(names[0], "file00");
    assert_eq!(names[40], "sub");
    let e = all.iter().find(|e| e.name == b"sub").unwrap();
    assert_eq!(e.fh.as_deref(), Some(&sub[..]));
    assert_eq!(e.attr.as_ref().map(|a| a.mode & 0o7777), Some(0o755));
    // Small pages: READDIRPLUS resumes from each page's last cookie and
    // sees every entry exactly once.
    let (mut cookie, mut verf, mut paged, mut pages) = (0u64, [0u8; 8], Vec::new(), 0);
    loop {
        let (es, v, eof) = c.readdirplus(&d, cookie, verf, 1024).unwrap();
        pages += 1;
        verf = v;
        if let Some(l) = es.last() {
            cookie = l.cookie;
        }
        paged.extend(es.into_iter().map(|e| e.name));
        if eof {
            break;
        }
        assert!(pages < 100, "no eof");
    }
    assert!(pages > 1, "1 KiB pages for 41 entries with handles and attributes");
    paged.retain(|n| n != b"." && n != b"..");
    paged.sort();
    let mut want: Vec<Vec<u8>> = (0..40).map(|i| format!("file{i:02}").into_bytes()).collect();
    want.push(b"sub".to_vec());
    assert_eq!(paged, want);
    c.remove(&d, b"file07").unwrap();
    let e = c.lookup(&d, b"file07").unwrap_err();
    assert_eq!(code(&e), 2, "{e}");
    assert!(e.to_string().contains("NFS3ERR_NOENT"), "{e}");
    assert_eq!(e.errno(), libc::ENOENT);
    // GUARDED create of an existing name: EEXIST.
    assert_eq!(code(&c.create(&d, b"file08", 0o600, true).unwrap_err()), 17);
}

#[test]
fn errors_are_mapped() {
    let s = start();
    let (mut c, root) = connect(&s);
    // MOUNT through a separate connection gives the same root.
    assert_eq!(client::nfs3::mount_at(&addr(&s), "/m", &root_auth(), limits()).unwrap(), root);
    // MOUNT of an export that does not exist.
    let e = c.mount("/nope").unwrap_err();
    assert!(matches!(&e, Error::Mount { stat, .. } if stat.starts_with("MNT3ERR_")), "{e}");
    // A user who may not write the root-owned export root: ACCES.
    let mut u = Nfs3::connect(&addr(&s), &Auth::sys(1000, 1000), limits()).unwrap();
    let uroot = u.mount("/m").unwrap();
    let e = u.create(&uroot, b"x", 0o644, true).unwrap_err();
    assert_eq!(code(&e), 13, "{e}");
    assert!(e.to_string().contains("NFS3ERR_ACCES"));
    assert_eq!(e.errno(), libc::EACCES);
    // A handle that is not the server's: BADHANDLE or STALE, never a hang.
    let mut bogus = root.clone();
    let n = bogus.len();
    bogus[n - 1] ^= 0xff;
    let e = c.getattr(&bogus).unwrap_err();
    assert!([70, 10001].contains(&code(&e)), "{e}");
}

#[test]
fn stale_handle_and_server_gone() {
    let s = start();
    let (mut c, root) = connect(&s);
    let fh = c.create(&root, b"gone", 0o644, true).unwrap();
    c.remove(&root, b"gone").unwrap();
    let e = c.getattr(&fh).unwrap_err();
    assert_eq!(code(&e), 70, "removed file: {e}");
    assert!(e.to_string().contains("NFS3ERR_STALE"));
    assert_eq!(e.errno(), libc::ESTALE);
    let a = addr(&s);
    s.shutdown();
    let e = c.getattr(&root).unwrap_err();
    assert!(e.is_connection(), "{e}");
    assert!(matches!(e, Error::Closed | Error::ConnectionLost(_)), "{e}");
    assert_eq!(e.errno(), libc::ECONNRESET);
    let e = Nfs3::connect(&a, &root_auth(), limits()).err().expect("nobody listens");
    assert!(matches!(e, Error::Connect { .. }), "{e}");
}

fn root_auth() -> Auth {
    root()
}

/// chimerad's memfs answers every WRITE FILE_SYNC, so a restart between
/// WRITE and COMMIT leaves nothing for the library to resend (the verifier
/// change itself is exercised against a scripted server, tests/verifier.rs);
/// the old handle is STALE on the new instance.
#[test]
fn restart_between_write_and_commit_against_chimerad() {
    let s = start();
    let a = addr(&s);
    let port = s.nfs_addr.unwrap().port();
    let (mut c, root) = connect(&s);
    let fh = c.create(&root, b"v", 0o644, true).unwrap();
    let w = c.write(&fh, 0, &pattern(5, 0, 10_000), Stable::Unstable).unwrap();
    assert!(w.stable, "memfs stores writes stably");
    assert!(c.uncommitted(&fh).is_empty());
    s.shutdown();
    let s2 = start_on(port);
    assert_eq!(addr(&s2), a);
    c.replace_conn(client::RpcConn::connect(&a, &root_auth(), limits()).unwrap());
    let e = c.getattr(&fh).unwrap_err();
    assert!([70, 10001].contains(&code(&e)), "old handle on the new instance: {e}");
    let root2 = c.mount("/m").unwrap();
    let fh2 = c.create(&root2, b"v", 0o644, true).unwrap();
    c.commit(&fh2).unwrap();
    s2.shutdown();
}
