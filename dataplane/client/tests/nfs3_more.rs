//! SETATTR, ACCESS, READLINK, SYMLINK, RMDIR, RENAME, LINK, FSSTAT against
//! an in-process chimerad.

mod common;

use client::nfs3::{Nfs3, SetAttr, SetTime, Stable};
use client::Error;
use common::*;

#[test]
fn setattr_mode_owner_size_times() {
    let s = start();
    let (mut c, root) = connect(&s);
    let fh = c.create(&root, b"f", 0o644, true).unwrap();
    c.write(&fh, 0, &pattern(1, 0, 10_000), Stable::FileSync).unwrap();
    let a = c.setattr(&fh, &SetAttr { mode: Some(0o600), uid: Some(1234), gid: Some(5678), ..Default::default() }).unwrap();
    let g = c.getattr(&fh).unwrap();
    assert_eq!((g.mode & 0o7777, g.uid, g.gid), (0o600, 1234, 5678));
    if let Some(a) = a {
        assert_eq!(a.mode & 0o7777, 0o600);
    }
    c.setattr(&fh, &SetAttr { size: Some(100), ..Default::default() }).unwrap();
    assert_eq!(c.getattr(&fh).unwrap().size, 100);
    let mut out = Vec::new();
    c.read(&fh, 0, 1000, &mut out).unwrap();
    assert_eq!(out, pattern(1, 0, 100));
    c.setattr(&fh, &SetAttr { atime: Some(SetTime::Client(1_000_000, 5)), mtime: Some(SetTime::Client(2_000_000, 7)), ..Default::default() })
        .unwrap();
    let g = c.getattr(&fh).unwrap();
    assert_eq!((g.atime.seconds, g.mtime.seconds), (1_000_000, 2_000_000));
    c.setattr(&fh, &SetAttr { mtime: Some(SetTime::Server), ..Default::default() }).unwrap();
    assert!(c.getattr(&fh).unwrap().mtime.seconds > 2_000_000);
    // A handle that names nothing: an NFS error, not a hang.
    let e = c.setattr(b"no such handle", &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap_err();
    assert!(matches!(e, Error::Nfs3 { .. }), "{e}");
}

#[test]
fn symlink_readlink_link_rename_rmdir_fsstat_access() {
    let s = start();
    let (mut c, root) = connect(&s);
    let l = c.symlink(&root, b"sl", b"some/target").unwrap();
    assert_eq!(c.readlink(&l).unwrap(), b"some/target");
    assert_eq!(c.getattr(&l).unwrap().r#type, proto::nfs3::ftype3::NF3LNK);
    assert_eq!(code(&c.symlink(&root, b"sl", b"x").unwrap_err()), 17, "EXIST");

    let f = c.create(&root, b"f", 0o644, true).unwrap();
    c.link(&f, &root, b"f2").unwrap();
    assert_eq!(c.getattr(&f).unwrap().nlink, 2);
    assert_eq!(c.lookup(&root, b"f2").unwrap().0, f);
    assert_eq!(code(&c.link(&f, &root, b"f2").unwrap_err()), 17);

    let d = c.mkdir(&root, b"d", 0o755).unwrap();
    c.rename(&root, b"f2", &d, b"moved").unwrap();
    assert_eq!(code(&c.lookup(&root, b"f2").unwrap_err()), 2, "NOENT");
    assert_eq!(c.lookup(&d, b"moved").unwrap().0, f);
    assert_eq!(code(&c.rename(&root, b"nope", &d, b"x").unwrap_err()), 2);

    assert_eq!(code(&c.rmdir(&root, b"d").unwrap_err()), 66, "NOTEMPTY");
    c.remove(&d, b"moved").unwrap();
    assert_eq!(c.getattr(&f).unwrap().nlink, 1);
    c.rmdir(&root, b"d").unwrap();
    assert_eq!(code(&c.rmdir(&root, b"d").unwrap_err()), 2);
    assert_eq!(code(&c.rmdir(&root, b"f").unwrap_err()), 20, "NOTDIR");

    let st = c.fsstat(&root).unwrap();
    assert!(st.tbytes >= st.fbytes && st.fbytes >= st.abytes, "{st:?}");
    assert!(st.tbytes > 0);
    assert_eq!(c.access(&f, 0x3) .unwrap() & 0x1, 0x1, "root may read");
}

/// The calls the `nfs` backend (crate `nfsvfs`) added: CREATE EXCLUSIVE
/// is exactly once per verifier, a guarded SETATTR applies only while the
/// ctime matches, and a WRITE reply's attributes come back with it.
#[test]
fn create_exclusive_setattr_guard_write_attrs() {
    let s = start();
    let (mut c, root) = connect(&s);
    let fh = c.create_exclusive(&root, b"x", [1; 8]).unwrap();
    assert_eq!(c.create_exclusive(&root, b"x", [1; 8]).unwrap(), fh, "a retry returns the same file");
    assert_eq!(code(&c.create_exclusive(&root, b"x", [2; 8]).unwrap_err()), 17, "another verifier is NFS3ERR_EXIST");

    let before = c.getattr(&fh).unwrap().ctime;
    let stale = (before.seconds.wrapping_sub(1), before.nseconds);
    let e = c.setattr_guarded(&fh, &SetAttr { size: Some(5), ..Default::default() }, Some(stale)).unwrap_err();
    assert_eq!(code(&e), 10002, "NFS3ERR_NOT_SYNC");
    assert_eq!(c.getattr(&fh).unwrap().size, 0, "a failed guard changes nothing");
    c.setattr_guarded(&fh, &SetAttr { size: Some(5), ..Default::default() }, Some((before.seconds, before.nseconds))).unwrap();
    assert_eq!(c.getattr(&fh).unwrap().size, 5);

    let data = pattern(3, 0, 3000);
    let xid = c.submit_write(&fh, 100, &data, Stable::FileSync).unwrap();
    let reply = c.rpc().wait(xid).unwrap();
    let (w, attr) = Nfs3::written_attr(&reply, data.len()).unwrap();
    assert_eq!((w.count, w.stable), (3000, true));
    assert_eq!(attr.expect("chimerad sends the attributes after").size, 3100);
}
