//! Drives every NFSv3 procedure (and MOUNT/portmap) through `Program::call`
//! over a real memfs, encoding arguments and decoding results with the
//! generated types, and asserts on the data and statuses that come back —
//! including forged and stale handles, quota and permission failures.

use nfs3::{Export, Mount3Program, Nfs3Program, PortmapProgram, Registration};
use proto::nfs3::*;
use proto::xdr::{to_vec, Decoder, Encoder, Xdr};
use rpc::{Auth, CallContext, CallError, Program};
use std::sync::Arc;
use vfs::memfs::{MemFs, MemFsConfig};
use vfs::{FileHandle, Vfs};

struct T {
    fs: Arc<MemFs>,
    p: Nfs3Program,
    root: Vec<u8>,
}

fn ctx(proc_num: u32, uid: u32) -> CallContext<'static> {
    CallContext {
        xid: 1,
        prog: NFS_PROGRAM,
        vers: NFS_V3,
        proc_num,
        auth: Auth::Sys { stamp: 0, machine_name: b"test", uid, gid: uid, gids: &[] },
        conn_id: 1,
        peer: "127.0.0.1:1".parse().unwrap(),
        core: 0,
        lend: None,
        park: None,
        resumed: None,
    }
}

impl T {
    fn new(capacity: u64) -> T {
        let fs = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: capacity }));
        let root = fs.root(1).unwrap().to_bytes().to_vec();
        T { p: Nfs3Program::new(fs.clone()), fs, root }
    }

    /// Run a procedure; returns the encoded result.
    fn raw(&self, proc_num: u32, args: &[u8], uid: u32) -> Result<Vec<u8>, CallError> {
        let mut buf = vec![0u8; 2 << 20];
        let mut e = Encoder::new(&mut buf);
        self.p.call(&ctx(proc_num, uid), args, &mut e)?;
        Ok(e.written().to_vec())
    }

    fn call<'a, A: Xdr<'a>>(&self, proc_num: u32, args: &A) -> Vec<u8> {
        self.raw(proc_num, &to_vec(args).unwrap(), 0).expect("call accepted")
    }

    fn fh(&self) -> nfs_fh3<'_> {
        nfs_fh3 { data: &self.root }
    }
}

fn dec<'a, T: Xdr<'a>>(b: &'a [u8]) -> T {
    let mut d = Decoder::new(b);
    let v = T::decode(&mut d).expect("result decodes");
    assert_eq!(d.remaining(), 0, "no trailing bytes in result");
    v
}

fn unset() -> sattr3 {
    sattr3 {
        mode: set_mode3::FALSE,
        uid: set_uid3::FALSE,
        gid: set_gid3::FALSE,
        size: set_size3::FALSE,
        atime: set_atime::DONT_CHANGE,
        mtime: set_mtime::DONT_CHANGE,
    }
}

fn create(t: &mut T, dir: &[u8], name: &[u8]) -> Vec<u8> {
    let r = t.call(
        NFSPROC3_CREATE,
        &CREATE3args { r#where: diropargs3 { dir: nfs_fh3 { data: dir }, name }, how: createhow3::GUARDED(unset()) },
    );
    match dec::<CREATE3res>(&r) {
        CREATE3res::NFS3_OK(ok) => match ok.obj {
            post_op_fh3::TRUE(h) => h.data.to_vec(),
            _ => panic!("no handle"),
        },
        other => panic!("create failed: {other:?}"),
    }
}

fn write(t: &mut T, fh: &[u8], off: u64, data: &[u8]) -> Vec<u8> {
    t.call(
        NFSPROC3_WRITE,
        &WRITE3args { file: nfs_fh3 { data: fh }, offset: off, count: data.len() as u32, stable: stable_how::FILE_SYNC, data },
    )
}

#[test]
fn write_read_getattr_roundtrip() {
    let mut t = T::new(64 << 20);
    let root = t.root.clone();
    let fh = create(&mut t, &root, b"f");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let r = write(&mut t, &fh, 10, &data);
    match dec::<WRITE3res>(&r) {
        WRITE3res::NFS3_OK(ok) => {
            assert_eq!(ok.count, 100_000);
            assert_eq!(ok.verf, t.fs.write_verifier());
        }
        other => panic!("{other:?}"),
    }
    let r = t.call(NFSPROC3_READ, &READ3args { file: nfs_fh3 { data: &fh }, offset: 10, count: 200_000 });
    match dec::<READ3res>(&r) {
        READ3res::NFS3_OK(ok) => {
            assert_eq!(ok.count, 100_000);
            assert!(ok.eof);
            assert_eq!(ok.data, &data[..]);
            match ok.file_attributes {
                post_op_attr::TRUE(a) => assert_eq!(a.size, 100_010),
                _ => panic!("attributes expected"),
            }
        }
        other => panic!("{other:?}"),
    }
    let r = t.call(NFSPROC3_GETATTR, &GETATTR3args { object: nfs_fh3 { data: &fh } });
    match dec::<GETATTR3res>(&r) {
        GETATTR3res::NFS3_OK(ok) => {
            assert_eq!(ok.obj_attributes.size, 100_010);
            assert_eq!(ok.obj_attributes.r#type, ftype3::NF3REG);
        }
        other => panic!("{other:?}"),
    }
    // A read at EOF returns 0 bytes and eof.
    let r = t.call(NFSPROC3_READ, &READ3args { file: nfs_fh3 { data: &fh }, offset: 200_000, count: 10 });
    assert!(matches!(dec::<READ3res>(&r), READ3res::NFS3_OK(ok) if ok.count == 0 && ok.eof));
    let r = t.call(NFSPROC3_COMMIT, &COMMIT3args { file: nfs_fh3 { data: &fh }, offset: 0, count: 0 });
    assert!(matches!(dec::<COMMIT3res>(&r), COMMIT3res::NFS3_OK(_)));
}

#[test]
fn namespace_operations() {
    let mut t = T::new(64 << 20);
    let root = t.root.clone();
    let r = t.call(
        NFSPROC3_MKDIR,
        &MKDIR3args { r#where: diropargs3 { dir: t.fh(), name: b"d" }, attributes: unset() },
    );
    let d = match dec::<MKDIR3res>(&r) {
        MKDIR3res::NFS3_OK(ok) => match ok.obj {
            post_op_fh3::TRUE(h) => h.data.to_vec(),
            _ => panic!(),
        },
        other => panic!("{other:?}"),
    };
    // 1,000 entries, listed through READDIR and READDIRPLUS with resumption.
    for i in 0..1000 {
        create(&mut t, &d, format!("file-{i:04}").as_bytes());
    }
    for plus in [false, true] {
        let mut names = Vec::new();
        let mut cookie = 0;
        let mut verf = [0u8; 8];
        loop {
            let r = if plus {
                t.call(
                    NFSPROC3_READDIRPLUS,
                    &READDIRPLUS3args { dir: nfs_fh3 { data: &d }, cookie, cookieverf: verf, dircount: 4096, maxcount: 16384 },
                )
            } else {
                t.call(NFSPROC3_READDIR, &READDIR3args { dir: nfs_fh3 { data: &d }, cookie, cookieverf: verf, count: 4096 })
            };
            let (eof, last) = if plus {
                match dec::<READDIRPLUS3res>(&r) {
                    READDIRPLUS3res::NFS3_OK(ok) => {
                        verf = ok.cookieverf;
                        let mut e = ok.reply.entries.as_deref();
                        let mut last = cookie;
                        while let Some(x) = e {
                            names.push(String::from_utf8(x.name.to_vec()).unwrap());
                            assert!(matches!(x.name_handle, post_op_fh3::TRUE(_)));
                            last = x.cookie;
                            e = x.nextentry.as_deref();
                        }
                        (ok.reply.eof, last)
                    }
                    other => panic!("{other:?}"),
                }
            } else {
                match dec::<READDIR3res>(&r) {
                    READDIR3res::NFS3_OK(ok) => {
                        verf = ok.cookieverf;
                        let mut e = ok.reply.entries.as_deref();
                        let mut last = cookie;
                        while let Some(x) = e {
                            names.push(String::from_utf8(x.name.to_vec()).unwrap());
                            last = x.cookie;
                            e = x.nextentry.as_deref();
                        }
                        (ok.reply.eof, last)
                    }
                    other => panic!("{other:?}"),
                }
            };
            if eof {
                break;
            }
            assert_ne!(last, cookie, "progress");
            cookie = last;
        }
        names.sort();
        assert_eq!(names.len(), 1000, "plus={plus}");
        assert_eq!(names[0], "file-0000");
        assert_eq!(names[999], "file-0999");
    }
    // rename, link, symlink + readlink, remove, rmdir of non-empty.
    let f = create(&mut t, &root, b"a");
    let r = t.call(
        NFSPROC3_RENAME,
        &RENAME3args { from: diropargs3 { dir: t.fh(), name: b"a" }, to: diropargs3 { dir: t.fh(), name: b"b" } },
    );
    assert!(matches!(dec::<RENAME3res>(&r), RENAME3res::NFS3_OK(_)));
    let r = t.call(NFSPROC3_LOOKUP, &LOOKUP3args { what: diropargs3 { dir: t.fh(), name: b"a" } });
    assert!(matches!(dec::<LOOKUP3res>(&r), LOOKUP3res::default(NFS3ERR_NOENT, _)));
    let r = t.call(NFSPROC3_LINK, &LINK3args { file: nfs_fh3 { data: &f }, link: diropargs3 { dir: t.fh(), name: b"c" } });
    assert!(matches!(dec::<LINK3res>(&r), LINK3res::NFS3_OK(_)));
    let r = t.call(NFSPROC3_GETATTR, &GETATTR3args { object: nfs_fh3 { data: &f } });
    assert!(matches!(dec::<GETATTR3res>(&r), GETATTR3res::NFS3_OK(ok) if ok.obj_attributes.nlink == 2));
    let r = t.call(
        NFSPROC3_SYMLINK,
        &SYMLINK3args {
            r#where: diropargs3 { dir: t.fh(), name: b"s" },
            symlink: symlinkdata3 { symlink_attributes: unset(), symlink_data: b"target/path" },
        },
    );
    let s = match dec::<SYMLINK3res>(&r) {
        SYMLINK3res::NFS3_OK(ok) => match ok.obj {
            post_op_fh3::TRUE(h) => h.data.to_vec(),
            _ => panic!(),
        },
        other => panic!("{other:?}"),
    };
    let r = t.call(NFSPROC3_READLINK, &READLINK3args { symlink: nfs_fh3 { data: &s } });
    assert!(matches!(dec::<READLINK3res>(&r), READLINK3res::NFS3_OK(ok) if ok.data == b"target/path"));
    let r = t.call(NFSPROC3_RMDIR, &RMDIR3args { object: diropargs3 { dir: t.fh(), name: b"d" } });
    assert!(matches!(dec::<RMDIR3res>(&r), RMDIR3res::default(NFS3ERR_NOTEMPTY, _)));
    let r = t.call(NFSPROC3_REMOVE, &REMOVE3args { object: diropargs3 { dir: t.fh(), name: b"b" } });
    assert!(matches!(dec::<REMOVE3res>(&r), REMOVE3res::NFS3_OK(_)));
    // GUARDED create of an existing name fails; UNCHECKED succeeds.
    let r = t.call(
        NFSPROC3_CREATE,
        &CREATE3args { r#where: diropargs3 { dir: t.fh(), name: b"c" }, how: createhow3::GUARDED(unset()) },
    );
    assert!(matches!(dec::<CREATE3res>(&r), CREATE3res::default(NFS3ERR_EXIST, _)));
    let r = t.call(
        NFSPROC3_CREATE,
        &CREATE3args { r#where: diropargs3 { dir: t.fh(), name: b"c" }, how: createhow3::UNCHECKED(unset()) },
    );
    assert!(matches!(dec::<CREATE3res>(&r), CREATE3res::NFS3_OK(_)));
    // EXCLUSIVE create is idempotent for the same verifier.
    for _ in 0..2 {
        let r = t.call(
            NFSPROC3_CREATE,
            &CREATE3args { r#where: diropargs3 { dir: t.fh(), name: b"x" }, how: createhow3::EXCLUSIVE(*b"verifier") },
        );
        assert!(matches!(dec::<CREATE3res>(&r), CREATE3res::NFS3_OK(_)));
    }
    let r = t.call(
        NFSPROC3_CREATE,
        &CREATE3args { r#where: diropargs3 { dir: t.fh(), name: b"x" }, how: createhow3::EXCLUSIVE(*b"other!!!") },
    );
    assert!(matches!(dec::<CREATE3res>(&r), CREATE3res::default(NFS3ERR_EXIST, _)));
    let _ = root;
}

#[test]
fn setattr_truncate_chmod_and_guard() {
    let mut t = T::new(64 << 20);
    let root = t.root.clone();
    let f = create(&mut t, &root, b"f");
    write(&mut t, &f, 0, &[1u8; 5000]);
    let mut s = unset();
    s.size = set_size3::TRUE(100);
    s.mode = set_mode3::TRUE(0o600);
    s.uid = set_uid3::TRUE(1000);
    let r = t.call(NFSPROC3_SETATTR, &SETATTR3args { object: nfs_fh3 { data: &f }, new_attributes: s, guard: sattrguard3::FALSE });
    assert!(matches!(dec::<SETATTR3res>(&r), SETATTR3res::NFS3_OK(_)));
    let r = t.call(NFSPROC3_GETATTR, &GETATTR3args { object: nfs_fh3 { data: &f } });
    match dec::<GETATTR3res>(&r) {
        GETATTR3res::NFS3_OK(ok) => {
            assert_eq!((ok.obj_attributes.size, ok.obj_attributes.mode, ok.obj_attributes.uid), (100, 0o600, 1000));
        }
        other => panic!("{other:?}"),
    }
    let r = t.call(
        NFSPROC3_SETATTR,
        &SETATTR3args {
            object: nfs_fh3 { data: &f },
            new_attributes: unset(),
            guard: sattrguard3::TRUE(nfstime3 { seconds: 1, nseconds: 2 }),
        },
    );
    assert!(matches!(dec::<SETATTR3res>(&r), SETATTR3res::default(NFS3ERR_NOT_SYNC, _)));
    // Another user cannot chmod or write a 0600 file it does not own.
    let mut s = unset();
    s.mode = set_mode3::TRUE(0o777);
    let args = to_vec(&SETATTR3args { object: nfs_fh3 { data: &f }, new_attributes: s, guard: sattrguard3::FALSE }).unwrap();
    let r = t.raw(NFSPROC3_SETATTR, &args, 2000).unwrap();
    assert!(matches!(dec::<SETATTR3res>(&r), SETATTR3res::default(NFS3ERR_PERM, _)));
    let d = [9u8; 10];
    let args = to_vec(&WRITE3args { file: nfs_fh3 { data: &f }, offset: 0, count: 10, stable: stable_how::UNSTABLE, data: &d }).unwrap();
    let r = t.raw(NFSPROC3_WRITE, &args, 2000).unwrap();
    assert!(matches!(dec::<WRITE3res>(&r), WRITE3res::default(NFS3ERR_ACCES, _)));
}

#[test]
fn hostile_handles_and_arguments() {
    let mut t = T::new(64 << 20);
    let root = t.root.clone();
    // Forged handle: wrong length / version.
    let r = t.call(NFSPROC3_GETATTR, &GETATTR3args { object: nfs_fh3 { data: b"forged-handle" } });
    assert!(matches!(dec::<GETATTR3res>(&r), GETATTR3res::default(NFS3ERR_BADHANDLE)));
    // Stale handle: removed object.
    let f = create(&mut t, &root, b"gone");
    let r = t.call(NFSPROC3_REMOVE, &REMOVE3args { object: diropargs3 { dir: t.fh(), name: b"gone" } });
    assert!(matches!(dec::<REMOVE3res>(&r), REMOVE3res::NFS3_OK(_)));
    let r = t.call(NFSPROC3_GETATTR, &GETATTR3args { object: nfs_fh3 { data: &f } });
    assert!(matches!(dec::<GETATTR3res>(&r), GETATTR3res::default(NFS3ERR_STALE)));
    let r = write(&mut t, &f, 0, b"x");
    assert!(matches!(dec::<WRITE3res>(&r), WRITE3res::default(NFS3ERR_STALE, _)));
    // A handle naming another export.
    let mut other = FileHandle::from_bytes(&root).unwrap();
    other.export_id = 99;
    let r = t.call(NFSPROC3_GETATTR, &GETATTR3args { object: nfs_fh3 { data: &other.to_bytes() } });
    assert!(matches!(dec::<GETATTR3res>(&r), GETATTR3res::default(NFS3ERR_STALE | NFS3ERR_BADHANDLE)));
    // Garbage arguments and unknown procedures are RPC-level errors.
    assert_eq!(t.raw(NFSPROC3_READ, &[0, 0, 0], 0), Err(CallError::GarbageArgs));
    assert_eq!(t.raw(NFSPROC3_READ, &[0xff; 64], 0), Err(CallError::GarbageArgs));
    assert_eq!(t.raw(22, &[], 0), Err(CallError::ProcUnavail));
    // WRITE whose count disagrees with its data.
    let args = to_vec(&WRITE3args { file: t.fh(), offset: 0, count: 99, stable: stable_how::UNSTABLE, data: b"abc" }).unwrap();
    let r = t.raw(NFSPROC3_WRITE, &args, 0).unwrap();
    assert!(matches!(dec::<WRITE3res>(&r), WRITE3res::default(NFS3ERR_INVAL | NFS3ERR_ISDIR, _)));
    // Names: "..", "a/b", too long.
    for bad in [&b".."[..], b"a/b", &[b'n'; 300]] {
        let r = t.call(
            NFSPROC3_CREATE,
            &CREATE3args { r#where: diropargs3 { dir: t.fh(), name: bad }, how: createhow3::UNCHECKED(unset()) },
        );
        assert!(
            matches!(dec::<CREATE3res>(&r), CREATE3res::default(NFS3ERR_INVAL | NFS3ERR_NAMETOOLONG | NFS3ERR_EXIST, _)),
            "bad name {:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn quota_and_capacity() {
    let mut t = T::new(64 << 20);
    let root = t.root.clone();
    let r = t.call(NFSPROC3_MKDIR, &MKDIR3args { r#where: diropargs3 { dir: t.fh(), name: b"vol" }, attributes: unset() });
    let vol = match dec::<MKDIR3res>(&r) {
        MKDIR3res::NFS3_OK(ok) => match ok.obj {
            post_op_fh3::TRUE(h) => h.data.to_vec(),
            _ => panic!(),
        },
        other => panic!("{other:?}"),
    };
    t.fs.set_quota(&FileHandle::from_bytes(&vol).unwrap(), 1 << 20).unwrap();
    let f = create(&mut t, &vol, b"big");
    let chunk = vec![7u8; 256 << 10];
    let mut dquot = false;
    for i in 0..8u64 {
        let r = write(&mut t, &f, i * chunk.len() as u64, &chunk);
        match dec::<WRITE3res>(&r) {
            WRITE3res::NFS3_OK(_) => {}
            WRITE3res::default(NFS3ERR_DQUOT, _) => {
                dquot = true;
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(dquot, "writes past the volume's capacity fail with DQUOT");
    let r = t.call(NFSPROC3_FSSTAT, &FSSTAT3args { fsroot: nfs_fh3 { data: &vol } });
    match dec::<FSSTAT3res>(&r) {
        FSSTAT3res::NFS3_OK(ok) => {
            assert_eq!(ok.tbytes, 1 << 20, "FSSTAT inside a volume reports its capacity");
            assert!(ok.fbytes < 1 << 20);
        }
        other => panic!("{other:?}"),
    }
    let r = t.call(NFSPROC3_FSSTAT, &FSSTAT3args { fsroot: nfs_fh3 { data: &root } });
    assert!(matches!(dec::<FSSTAT3res>(&r), FSSTAT3res::NFS3_OK(ok) if ok.tbytes == 64 << 20));
    let r = t.call(NFSPROC3_FSINFO, &FSINFO3args { fsroot: nfs_fh3 { data: &root } });
    assert!(matches!(dec::<FSINFO3res>(&r), FSINFO3res::NFS3_OK(ok) if ok.wtmax == 1 << 20));
    let r = t.call(NFSPROC3_PATHCONF, &PATHCONF3args { object: nfs_fh3 { data: &root } });
    assert!(matches!(dec::<PATHCONF3res>(&r), PATHCONF3res::NFS3_OK(ok) if ok.name_max == 255));
    let r = t.call(NFSPROC3_ACCESS, &ACCESS3args { object: nfs_fh3 { data: &root }, access: 0x3f });
    assert!(matches!(dec::<ACCESS3res>(&r), ACCESS3res::NFS3_OK(ok) if ok.access & 0x1 != 0));
}

#[test]
fn mount_and_portmap() {
    let fs = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 16 << 20 }));
    let root = fs.root(1).unwrap();
    fs.create(&root, b"sub", vfs::NodeKind::Directory, 0o755, &vfs::Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
    let fs2 = fs.clone();
    let resolve = Arc::new(move |p: &[u8]| -> vfs::VfsResult<FileHandle> {
        let mut fh = fs2.root(1)?;
        for c in p.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
            fh = fs2.lookup(&fh, c)?.0;
        }
        Ok(fh)
    });
    let m = Mount3Program::new(vec![Export { name: b"/share".to_vec(), path: b"/".to_vec() }], resolve);
    let mut buf = vec![0u8; 4096];
    let mut mnt = |path: &[u8]| -> Vec<u8> {
        let mut args = vec![0u8; 4 + path.len() + 4];
        let n = {
            let mut e = Encoder::new(&mut args);
            e.opaque_var(path).unwrap();
            e.position()
        };
        let mut c = ctx(proto::mount3::MOUNTPROC3_MNT, 0);
        c.prog = proto::mount3::MOUNT_PROGRAM;
        c.vers = 3;
        let mut e = Encoder::new(&mut buf);
        m.call(&c, &args[..n], &mut e).unwrap();
        e.written().to_vec()
    };
    let ok = mnt(b"/share");
    assert_eq!(&ok[..4], &[0, 0, 0, 0], "MNT3_OK");
    assert_eq!(&ok[4..8], &[0, 0, 0, 24], "24-byte handle");
    assert_eq!(&ok[8..32], &root.to_bytes());
    let sub = mnt(b"/share/sub/");
    assert_eq!(&sub[..4], &[0, 0, 0, 0]);
    assert_ne!(&sub[8..32], &root.to_bytes());
    assert_eq!(&mnt(b"/share/missing")[..4], &[0, 0, 0, 2], "MNT3ERR_NOENT");
    assert_eq!(&mnt(b"/other")[..4], &[0, 0, 0, 2]);
    assert_eq!(&mnt(b"/share/../etc")[..4], &[0, 0, 0, 2]);

    let pm = PortmapProgram::new(vec![Registration { prog: NFS_PROGRAM, vers: 3, prot: 6, port: 2049 }]);
    let mut c = ctx(proto::portmap::PMAPPROC_GETPORT, 0);
    c.prog = proto::portmap::PMAP_PROG;
    c.vers = 2;
    let q = to_vec(&proto::portmap::mapping { prog: NFS_PROGRAM, vers: 3, prot: 6, port: 0 }).unwrap();
    let mut e = Encoder::new(&mut buf);
    pm.call(&c, &q, &mut e).unwrap();
    assert_eq!(e.written(), &[0, 0, 8, 1]);
    let q = to_vec(&proto::portmap::mapping { prog: 99, vers: 3, prot: 6, port: 0 }).unwrap();
    let mut e = Encoder::new(&mut buf);
    pm.call(&c, &q, &mut e).unwrap();
    assert_eq!(e.written(), &[0, 0, 0, 0], "unregistered program: port 0");
}

/// LOOKUP "." is the directory, ".." its parent, and the export root is its
/// own parent (§3.3.3).
#[test]
fn lookup_dot_and_dotdot() {
    let t = T::new(64 << 20);
    let r = t.call(NFSPROC3_MKDIR, &MKDIR3args { r#where: diropargs3 { dir: t.fh(), name: b"d" }, attributes: unset() });
    let d = match dec::<MKDIR3res>(&r) {
        MKDIR3res::NFS3_OK(ok) => match ok.obj {
            post_op_fh3::TRUE(h) => h.data.to_vec(),
            _ => panic!("no handle"),
        },
        other => panic!("mkdir failed: {other:?}"),
    };
    let look = |dir: &[u8], name: &[u8]| -> Vec<u8> {
        let r = t.call(NFSPROC3_LOOKUP, &LOOKUP3args { what: diropargs3 { dir: nfs_fh3 { data: dir }, name } });
        match dec::<LOOKUP3res>(&r) {
            LOOKUP3res::NFS3_OK(ok) => ok.object.data.to_vec(),
            other => panic!("lookup {:?} failed: {other:?}", String::from_utf8_lossy(name)),
        }
    };
    assert_eq!(look(&d, b"."), d);
    assert_eq!(look(&d, b".."), t.root);
    assert_eq!(look(&t.root, b".."), t.root);
    assert_eq!(look(&t.root, b"."), t.root);
}
