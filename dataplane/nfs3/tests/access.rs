//! Export access rules on NFSv3 and MOUNT: calls from different peer
//! addresses against one memfs export with rules — `none` / no match gets
//! NFS3ERR_ACCES on every procedure (with a well-formed failure result),
//! `ro` gets NFS3ERR_ROFS on every procedure that modifies and nothing
//! changes, squash rewrites the credential the backend sees, a rule change
//! applies to handles learned before it, MNT refuses a client the rules do
//! not admit; a volume's own rules narrow the export's for handles inside
//! it only.

use nfs3::{Export, Mount3Program, Nfs3Program};
use proto::nfs3::*;
use proto::xdr::{to_vec, Decoder, Encoder, Xdr};
use rpc::{Auth, CallContext, Program};
use std::sync::Arc;
use vfs::clients::{AccessTable, AccessType, Net, Rule, Squash};
use vfs::memfs::{MemFs, MemFsConfig};
use vfs::{Cred, FileHandle, NodeKind, Vfs};

fn ctx(proc_num: u32, uid: u32, peer: &str) -> CallContext<'static> {
    CallContext {
        xid: 1,
        prog: NFS_PROGRAM,
        vers: NFS_V3,
        proc_num,
        auth: Auth::Sys { stamp: 0, machine_name: b"test", uid, gid: uid, gids: &[] },
        conn_id: 1,
        peer: peer.parse().unwrap(),
        core: 0,
        lend: None,
        park: None,
        resumed: None,
    }
}

struct T {
    fs: Arc<MemFs>,
    p: Nfs3Program,
    table: Arc<AccessTable>,
    root: Vec<u8>,
    file: Vec<u8>,
    dir: Vec<u8>,
}

fn rule(clients: &[&str], access: AccessType, squash: Squash) -> Rule {
    Rule { clients: clients.iter().map(|c| Net::parse(c).unwrap()).collect(), access, squash, anon_uid: 4242, anon_gid: 4343 }
}

impl T {
    fn new() -> T {
        let fs = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 64 << 20 }));
        let root = fs.root(1).unwrap();
        T::at(fs, root, Arc::new(AccessTable::new()))
    }

    /// The same objects inside a volume (directory `vol`, a quota root):
    /// `root` is the volume's root, and the table may hold volume rules.
    fn in_volume() -> T {
        let fs = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 64 << 20 }));
        let root = fs.root(1).unwrap();
        let (vol, _) = fs.create(&root, b"vol", NodeKind::Directory, 0o777, &Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
        fs.set_quota(&vol, 16 << 20).unwrap();
        let table = Arc::new(AccessTable::with_volumes(fs.clone()));
        T::at(fs, vol, table)
    }

    fn at(fs: Arc<MemFs>, root: FileHandle, table: Arc<AccessTable>) -> T {
        fs.setattr(&root, &vfs::SetAttr { mode: Some(0o777), ..Default::default() }, None).unwrap();
        let (file, _) = fs.create(&root, b"f", NodeKind::File, 0o666, &Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
        fs.write(&file, 0, b"hello", vfs::Stability::FileSync).unwrap();
        let (dir, _) = fs.create(&root, b"d", NodeKind::Directory, 0o777, &Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
        T {
            p: Nfs3Program::new(fs.clone()).with_access(table.clone()),
            fs,
            table,
            root: root.to_bytes().to_vec(),
            file: file.to_bytes().to_vec(),
            dir: dir.to_bytes().to_vec(),
        }
    }

    fn raw(&self, proc_num: u32, args: &[u8], uid: u32, peer: &str) -> Vec<u8> {
        let mut buf = vec![0u8; 1 << 20];
        let mut e = Encoder::new(&mut buf);
        self.p.call(&ctx(proc_num, uid, peer), args, &mut e).expect("call accepted");
        e.written().to_vec()
    }

    /// Arguments for every procedure but NULL, on the root, the file and
    /// the directory; names are fresh so a call that got through would
    /// change something.
    fn every_call(&self) -> Vec<(u32, Vec<u8>)> {
        let r = || nfs_fh3 { data: &self.root };
        let f = || nfs_fh3 { data: &self.file };
        let d = || nfs_fh3 { data: &self.dir };
        fn at<'a>(dir: nfs_fh3<'a>, name: &'a [u8]) -> diropargs3<'a> {
            diropargs3 { dir, name }
        }
        vec![
            (NFSPROC3_GETATTR, to_vec(&GETATTR3args { object: f() }).unwrap()),
            (
                NFSPROC3_SETATTR,
                to_vec(&SETATTR3args {
                    object: f(),
                    new_attributes: sattr3 { mode: set_mode3::TRUE(0o600), ..unset() },
                    guard: sattrguard3::FALSE,
                })
                .unwrap(),
            ),
            (NFSPROC3_LOOKUP, to_vec(&LOOKUP3args { what: at(r(), b"f") }).unwrap()),
            (NFSPROC3_ACCESS, to_vec(&ACCESS3args { object: f(), access: 0x3f }).unwrap()),
            (NFSPROC3_READLINK, to_vec(&READLINK3args { symlink: f() }).unwrap()),
            (NFSPROC3_READ, to_vec(&READ3args { file: f(), offset: 0, count: 5 }).unwrap()),
            (
                NFSPROC3_WRITE,
                to_vec(&WRITE3args { file: f(), offset: 0, count: 3, stable: stable_how::FILE_SYNC, data: b"bye" }).unwrap(),
            ),
            (NFSPROC3_CREATE, to_vec(&CREATE3args { r#where: at(r(), b"new"), how: createhow3::GUARDED(unset()) }).unwrap()),
            (NFSPROC3_MKDIR, to_vec(&MKDIR3args { r#where: at(r(), b"newdir"), attributes: unset() }).unwrap()),
            (
                NFSPROC3_SYMLINK,
                to_vec(&SYMLINK3args {
                    r#where: at(r(), b"newlink"),
                    symlink: symlinkdata3 { symlink_attributes: unset(), symlink_data: b"f" },
                })
                .unwrap(),
            ),
            (NFSPROC3_MKNOD, to_vec(&MKNOD3args { r#where: at(r(), b"newfifo"), what: mknoddata3::NF3FIFO(unset()) }).unwrap()),
            (NFSPROC3_REMOVE, to_vec(&REMOVE3args { object: at(r(), b"f") }).unwrap()),
            (NFSPROC3_RMDIR, to_vec(&RMDIR3args { object: at(r(), b"d") }).unwrap()),
            (NFSPROC3_RENAME, to_vec(&RENAME3args { from: at(r(), b"f"), to: at(d(), b"moved") }).unwrap()),
            (NFSPROC3_LINK, to_vec(&LINK3args { file: f(), link: at(d(), b"hard") }).unwrap()),
            (NFSPROC3_READDIR, to_vec(&READDIR3args { dir: r(), cookie: 0, cookieverf: [0; 8], count: 4096 }).unwrap()),
            (
                NFSPROC3_READDIRPLUS,
                to_vec(&READDIRPLUS3args { dir: r(), cookie: 0, cookieverf: [0; 8], dircount: 4096, maxcount: 8192 }).unwrap(),
            ),
            (NFSPROC3_FSSTAT, to_vec(&FSSTAT3args { fsroot: r() }).unwrap()),
            (NFSPROC3_FSINFO, to_vec(&FSINFO3args { fsroot: r() }).unwrap()),
            (NFSPROC3_PATHCONF, to_vec(&PATHCONF3args { object: r() }).unwrap()),
            (NFSPROC3_COMMIT, to_vec(&COMMIT3args { file: f(), offset: 0, count: 0 }).unwrap()),
        ]
    }

    fn names(&self) -> Vec<Vec<u8>> {
        let root = FileHandle::from_bytes(&self.root).unwrap();
        let mut v: Vec<Vec<u8>> = Vec::new();
        self.fs
            .readdir(&root, 0, &mut |e| {
                v.push(e.name.to_vec());
                true
            })
            .unwrap();
        v.sort();
        v
    }
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

fn dec<'a, X: Xdr<'a>>(b: &'a [u8]) -> X {
    let mut d = Decoder::new(b);
    let v = X::decode(&mut d).expect("result decodes");
    assert_eq!(d.remaining(), 0, "no trailing bytes in result");
    v
}

/// The status of a procedure's result, after decoding the whole result
/// with its type (so a malformed failure body fails the test).
fn status(proc_num: u32, b: &[u8]) -> i32 {
    macro_rules! st {
        ($t:ident) => {{
            use $t as X;
            match dec::<X>(b) {
                X::NFS3_OK(..) => 0,
                X::default(s, ..) => s,
            }
        }};
    }
    match proc_num {
        NFSPROC3_GETATTR => st!(GETATTR3res),
        NFSPROC3_SETATTR => st!(SETATTR3res),
        NFSPROC3_LOOKUP => st!(LOOKUP3res),
        NFSPROC3_ACCESS => st!(ACCESS3res),
        NFSPROC3_READLINK => st!(READLINK3res),
        NFSPROC3_READ => st!(READ3res),
        NFSPROC3_WRITE => st!(WRITE3res),
        NFSPROC3_CREATE => st!(CREATE3res),
        NFSPROC3_MKDIR => st!(MKDIR3res),
        NFSPROC3_SYMLINK => st!(SYMLINK3res),
        NFSPROC3_MKNOD => st!(MKNOD3res),
        NFSPROC3_REMOVE => st!(REMOVE3res),
        NFSPROC3_RMDIR => st!(RMDIR3res),
        NFSPROC3_RENAME => st!(RENAME3res),
        NFSPROC3_LINK => st!(LINK3res),
        NFSPROC3_READDIR => st!(READDIR3res),
        NFSPROC3_READDIRPLUS => st!(READDIRPLUS3res),
        NFSPROC3_FSSTAT => st!(FSSTAT3res),
        NFSPROC3_FSINFO => st!(FSINFO3res),
        NFSPROC3_PATHCONF => st!(PATHCONF3res),
        NFSPROC3_COMMIT => st!(COMMIT3res),
        p => panic!("proc {p}"),
    }
}

const MODIFYING: [u32; 11] = [
    NFSPROC3_SETATTR,
    NFSPROC3_WRITE,
    NFSPROC3_CREATE,
    NFSPROC3_MKDIR,
    NFSPROC3_SYMLINK,
    NFSPROC3_MKNOD,
    NFSPROC3_REMOVE,
    NFSPROC3_RMDIR,
    NFSPROC3_RENAME,
    NFSPROC3_LINK,
    NFSPROC3_COMMIT,
];

#[test]
fn no_rules_is_open_to_every_client() {
    let t = T::new();
    for peer in ["10.0.0.1:700", "[2001:db8::1]:700", "[::ffff:192.168.0.1]:1"] {
        let r = t.raw(NFSPROC3_GETATTR, &to_vec(&GETATTR3args { object: nfs_fh3 { data: &t.file } }).unwrap(), 0, peer);
        assert_eq!(status(NFSPROC3_GETATTR, &r), 0);
    }
}

#[test]
fn no_match_and_none_get_acces_on_every_procedure() {
    let t = T::new();
    t.table.set(
        1,
        Some(vec![
            rule(&["10.0.0.9"], AccessType::None, Squash::NoRootSquash),
            rule(&["10.0.0.0/24", "fd00::/64"], AccessType::ReadWrite, Squash::NoRootSquash),
        ]),
    );
    let before = t.names();
    for peer in ["10.0.0.9:900", "10.0.1.1:900", "[fd00:0:0:1::1]:900", "[::ffff:10.0.0.9]:900", "127.0.0.1:1"] {
        for (p, args) in t.every_call() {
            let r = t.raw(p, &args, 0, peer);
            assert_eq!(status(p, &r), nfsstat3::NFS3ERR_ACCES as i32, "proc {p} from {peer}");
        }
    }
    assert_eq!(t.names(), before, "nothing changed");
    let at = t.fs.getattr(&FileHandle::from_bytes(&t.file).unwrap()).unwrap();
    assert_eq!((at.mode & 0o777, at.size), (0o666, 5));
    // The allowed ones get through (v4, v4-mapped, v6).
    for peer in ["10.0.0.8:1", "[::ffff:10.0.0.8]:1", "[fd00::5]:1"] {
        let r = t.raw(NFSPROC3_READ, &to_vec(&READ3args { file: nfs_fh3 { data: &t.file }, offset: 0, count: 5 }).unwrap(), 0, peer);
        match dec::<READ3res>(&r) {
            READ3res::NFS3_OK(ok) => assert_eq!(ok.data, b"hello"),
            other => panic!("{peer}: {other:?}"),
        }
    }
}

#[test]
fn read_only_gets_rofs_on_every_modifying_procedure() {
    let t = T::new();
    t.table.set(1, Some(vec![rule(&["*"], AccessType::ReadOnly, Squash::NoRootSquash)]));
    let before = t.names();
    for (p, args) in t.every_call() {
        let r = t.raw(p, &args, 0, "10.1.2.3:1");
        let s = status(p, &r);
        if MODIFYING.contains(&p) {
            assert_eq!(s, nfsstat3::NFS3ERR_ROFS as i32, "proc {p}");
        } else {
            assert!(s != nfsstat3::NFS3ERR_ROFS as i32 && s != nfsstat3::NFS3ERR_ACCES as i32, "proc {p}: {s}");
        }
    }
    assert_eq!(t.names(), before, "nothing created or removed");
    let at = t.fs.getattr(&FileHandle::from_bytes(&t.file).unwrap()).unwrap();
    assert_eq!((at.mode & 0o777, at.size), (0o666, 5), "no SETATTR, no WRITE");
    // Under a rule list where this client is rw, the same call goes through.
    t.table.set(1, Some(vec![rule(&["10.9.9.9"], AccessType::ReadWrite, Squash::NoRootSquash)]));
    let r = t.raw(
        NFSPROC3_REMOVE,
        &to_vec(&REMOVE3args { object: diropargs3 { dir: nfs_fh3 { data: &t.root }, name: b"f" } }).unwrap(),
        0,
        "10.9.9.9:1",
    );
    assert_eq!(status(NFSPROC3_REMOVE, &r), 0, "the writable client may");
}

#[test]
fn root_squash_and_all_squash_rewrite_the_credential() {
    let t = T::new();
    t.table.set(
        1,
        Some(vec![
            rule(&["10.0.0.1"], AccessType::ReadWrite, Squash::RootSquash),
            rule(&["10.0.0.2"], AccessType::ReadWrite, Squash::AllSquash),
            rule(&["10.0.0.3"], AccessType::ReadWrite, Squash::NoRootSquash),
        ]),
    );
    let owner = |name: &[u8], uid: u32, peer: &str| -> (u32, u32) {
        let args = CREATE3args {
            r#where: diropargs3 { dir: nfs_fh3 { data: &t.root }, name },
            how: createhow3::GUARDED(unset()),
        };
        let r = t.raw(NFSPROC3_CREATE, &to_vec(&args).unwrap(), uid, peer);
        assert_eq!(status(NFSPROC3_CREATE, &r), 0, "{peer}");
        let root = FileHandle::from_bytes(&t.root).unwrap();
        let (_, at) = t.fs.lookup(&root, name).unwrap();
        (at.uid, at.gid)
    };
    assert_eq!(owner(b"r0", 0, "10.0.0.1:1"), (4242, 4343), "root squashed");
    assert_eq!(owner(b"r1", 1000, "10.0.0.1:1"), (1000, 1000), "others pass");
    assert_eq!(owner(b"a0", 0, "10.0.0.2:1"), (4242, 4343), "all squashed: root");
    assert_eq!(owner(b"a1", 1000, "10.0.0.2:1"), (4242, 4343), "all squashed: a user");
    assert_eq!(owner(b"n0", 0, "10.0.0.3:1"), (0, 0), "no_root_squash");
    // A squashed root cannot do what only root may: chown to another uid.
    let args = SETATTR3args {
        object: nfs_fh3 { data: &t.file },
        new_attributes: sattr3 { uid: set_uid3::TRUE(7), ..unset() },
        guard: sattrguard3::FALSE,
    };
    let r = t.raw(NFSPROC3_SETATTR, &to_vec(&args).unwrap(), 0, "10.0.0.1:1");
    assert_eq!(status(NFSPROC3_SETATTR, &r), nfsstat3::NFS3ERR_PERM as i32);
    let r = t.raw(NFSPROC3_SETATTR, &to_vec(&args).unwrap(), 0, "10.0.0.3:1");
    assert_eq!(status(NFSPROC3_SETATTR, &r), 0);
}

#[test]
fn a_rule_change_applies_to_handles_learned_before() {
    let t = T::new();
    let args = to_vec(&READ3args { file: nfs_fh3 { data: &t.file }, offset: 0, count: 5 }).unwrap();
    assert_eq!(status(NFSPROC3_READ, &t.raw(NFSPROC3_READ, &args, 0, "10.0.0.1:1")), 0);
    t.table.set(1, Some(vec![rule(&["10.0.0.2"], AccessType::ReadWrite, Squash::NoRootSquash)]));
    assert_eq!(status(NFSPROC3_READ, &t.raw(NFSPROC3_READ, &args, 0, "10.0.0.1:1")), nfsstat3::NFS3ERR_ACCES as i32);
    assert_eq!(status(NFSPROC3_READ, &t.raw(NFSPROC3_READ, &args, 0, "10.0.0.2:1")), 0);
    t.table.set(1, None);
    assert_eq!(status(NFSPROC3_READ, &t.raw(NFSPROC3_READ, &args, 0, "10.0.0.1:1")), 0);
}

/// A volume's own rules, every procedure on handles inside it: `none` is
/// NFS3ERR_ACCES everywhere, `ro` NFS3ERR_ROFS on every change (nothing
/// changes), root_squash in the volume rewrites root's credential while
/// the export itself is open; the same calls in a second volume of the
/// export, and in the export outside any volume, are untouched; RENAME and
/// LINK into the read-only volume from another are ROFS (their second
/// handle is checked too).
#[test]
fn volume_rules_apply_to_every_procedure_inside_the_volume() {
    let t = T::in_volume();
    let vol = FileHandle::from_bytes(&t.root).unwrap();
    let export_root = t.fs.root(1).unwrap();
    let (other, _) = t.fs.create(&export_root, b"other", NodeKind::Directory, 0o777, &Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
    t.fs.set_quota(&other, 16 << 20).unwrap();
    let (other_file, _) = t.fs.create(&other, b"g", NodeKind::File, 0o666, &Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
    let before = t.names();

    t.table.set_volume(1, vol.ino, Some(vec![rule(&["10.9.0.0/16"], AccessType::ReadWrite, Squash::NoRootSquash)])).unwrap();
    for (p, args) in t.every_call() {
        let r = t.raw(p, &args, 0, "10.1.2.3:1");
        assert_eq!(status(p, &r), nfsstat3::NFS3ERR_ACCES as i32, "proc {p} (no match in the volume)");
    }
    t.table.set_volume(1, vol.ino, Some(vec![rule(&["*"], AccessType::ReadOnly, Squash::NoRootSquash)])).unwrap();
    for (p, args) in t.every_call() {
        let s = status(p, &t.raw(p, &args, 0, "10.1.2.3:1"));
        if MODIFYING.contains(&p) {
            assert_eq!(s, nfsstat3::NFS3ERR_ROFS as i32, "proc {p}");
        } else {
            assert!(s != nfsstat3::NFS3ERR_ROFS as i32 && s != nfsstat3::NFS3ERR_ACCES as i32, "proc {p}: {s}");
        }
    }
    assert_eq!(t.names(), before, "nothing created or removed in the volume");
    let at = t.fs.getattr(&FileHandle::from_bytes(&t.file).unwrap()).unwrap();
    assert_eq!((at.mode & 0o777, at.size), (0o666, 5), "no SETATTR, no WRITE");

    // Across volumes: the target directory's volume is read-only.
    let og = other_file.to_bytes();
    let ob = other.to_bytes();
    let rename = RENAME3args {
        from: diropargs3 { dir: nfs_fh3 { data: &ob }, name: b"g" },
        to: diropargs3 { dir: nfs_fh3 { data: &t.dir }, name: b"moved" },
    };
    assert_eq!(status(NFSPROC3_RENAME, &t.raw(NFSPROC3_RENAME, &to_vec(&rename).unwrap(), 0, "10.1.2.3:1")), nfsstat3::NFS3ERR_ROFS as i32);
    let link = LINK3args { file: nfs_fh3 { data: &og }, link: diropargs3 { dir: nfs_fh3 { data: &t.dir }, name: b"hard" } };
    assert_eq!(status(NFSPROC3_LINK, &t.raw(NFSPROC3_LINK, &to_vec(&link).unwrap(), 0, "10.1.2.3:1")), nfsstat3::NFS3ERR_ROFS as i32);

    // The other volume and the export's root take changes, root unsquashed.
    let create = |dir: &[u8], name: &'static [u8]| -> i32 {
        let args = CREATE3args { r#where: diropargs3 { dir: nfs_fh3 { data: dir }, name }, how: createhow3::GUARDED(unset()) };
        status(NFSPROC3_CREATE, &t.raw(NFSPROC3_CREATE, &to_vec(&args).unwrap(), 0, "10.1.2.3:1"))
    };
    assert_eq!(create(&ob, b"new"), 0);
    assert_eq!(create(&export_root.to_bytes(), b"new"), 0);
    assert_eq!(t.fs.lookup(&other, b"new").unwrap().1.uid, 0);

    // Root squash in the volume only; the export stays unsquashed.
    t.table.set_volume(1, vol.ino, Some(vec![rule(&["*"], AccessType::ReadWrite, Squash::RootSquash)])).unwrap();
    assert_eq!(create(&t.root, b"by-root"), 0);
    assert_eq!(t.fs.lookup(&vol, b"by-root").map(|(_, a)| (a.uid, a.gid)).unwrap(), (4242, 4343));
    assert_eq!(create(&ob, b"by-root"), 0);
    assert_eq!(t.fs.lookup(&other, b"by-root").unwrap().1.uid, 0);
    // Cleared: the export's (open) grant again.
    t.table.set_volume(1, vol.ino, None).unwrap();
    assert_eq!(create(&t.root, b"by-root-2"), 0);
    assert_eq!(t.fs.lookup(&vol, b"by-root-2").unwrap().1.uid, 0);
}

#[test]
fn mount_refuses_a_client_the_rules_do_not_admit() {
    let t = T::new();
    let fs = t.fs.clone();
    let resolve = Arc::new(move |p: &[u8]| -> vfs::VfsResult<FileHandle> {
        let mut fh = fs.root(1)?;
        for c in p.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
            fh = fs.lookup(&fh, c)?.0;
        }
        Ok(fh)
    });
    let m = Mount3Program::new(vec![Export { name: b"/share".to_vec(), path: b"/".to_vec() }], resolve)
        .with_access(t.table.clone());
    let mnt = |path: &[u8], peer: &str| -> u32 {
        let mut args = vec![0u8; 8 + path.len()];
        let n = {
            let mut e = Encoder::new(&mut args);
            e.opaque_var(path).unwrap();
            e.position()
        };
        args.truncate(n);
        let mut c = ctx(proto::mount3::MOUNTPROC3_MNT, 0, peer);
        c.prog = proto::mount3::MOUNT_PROGRAM;
        let mut buf = vec![0u8; 4096];
        let mut e = Encoder::new(&mut buf);
        m.call(&c, &args, &mut e).unwrap();
        u32::from_be_bytes(e.written()[..4].try_into().unwrap())
    };
    assert_eq!(mnt(b"/share", "192.168.1.1:1"), 0, "no rules: mounts");
    t.table.set(1, Some(vec![rule(&["192.168.0.0/16"], AccessType::ReadOnly, Squash::RootSquash)]));
    assert_eq!(mnt(b"/share", "192.168.1.1:1"), 0);
    assert_eq!(mnt(b"/share/d", "[::ffff:192.168.1.1]:1"), 0);
    assert_eq!(mnt(b"/share", "10.0.0.1:1"), proto::mount3::mountstat3::MNT3ERR_ACCES as u32);
    assert_eq!(mnt(b"/share/d", "[2001:db8::1]:1"), proto::mount3::mountstat3::MNT3ERR_ACCES as u32);
    assert_eq!(mnt(b"/share/missing", "192.168.1.1:1"), proto::mount3::mountstat3::MNT3ERR_NOENT as u32);
    // EXPORT lists the export only to clients that may mount it.
    let exports = |peer: &str| -> Vec<u8> {
        let mut c = ctx(proto::mount3::MOUNTPROC3_EXPORT, 0, peer);
        c.prog = proto::mount3::MOUNT_PROGRAM;
        let mut buf = vec![0u8; 4096];
        let mut e = Encoder::new(&mut buf);
        m.call(&c, &[], &mut e).unwrap();
        e.written().to_vec()
    };
    let listed = exports("192.168.1.1:1");
    assert_eq!(&listed[..4], &[0, 0, 0, 1], "one entry");
    assert_eq!(&listed[8..14], b"/share");
    assert_eq!(exports("10.0.0.1:1"), vec![0, 0, 0, 0], "an empty list");
}

/// Stands in for the NFSv4 server: `fh` is under another client's
/// delegation (a write delegation when `write_deleg`), or nothing is when
/// `held` is false. Records what it was asked.
struct FakeDelegations {
    fh: FileHandle,
    write_deleg: bool,
    held: bool,
    asked: std::sync::Mutex<Vec<(FileHandle, bool)>>,
}

impl vfs::DelegationBreaker for FakeDelegations {
    fn active(&self) -> bool {
        self.held
    }
    fn must_wait(&self, fh: &FileHandle, write: bool) -> bool {
        self.asked.lock().unwrap().push((*fh, write));
        self.held && *fh == self.fh && (write || self.write_deleg)
    }
}

#[test]
fn nfsv4_delegations_make_conflicting_calls_wait_with_jukebox() {
    for (write_deleg, held, waiting) in [
        (true, true, &[NFSPROC3_GETATTR, NFSPROC3_SETATTR, NFSPROC3_READ, NFSPROC3_WRITE, NFSPROC3_REMOVE, NFSPROC3_RENAME, NFSPROC3_LINK][..]),
        (false, true, &[NFSPROC3_SETATTR, NFSPROC3_WRITE, NFSPROC3_REMOVE, NFSPROC3_RENAME, NFSPROC3_LINK][..]),
        (true, false, &[][..]),
    ] {
        let mut t = T::new();
        let file = FileHandle::from_bytes(&t.file).unwrap();
        let d = Arc::new(FakeDelegations { fh: file, write_deleg, held, asked: Default::default() });
        t.p = Nfs3Program::new(t.fs.clone()).with_delegations(d.clone());
        let before = t.names();
        for (proc_num, args) in t.every_call() {
            if !waiting.contains(&proc_num) {
                continue;
            }
            let st = status(proc_num, &t.raw(proc_num, &args, 0, "127.0.0.1:900"));
            assert_eq!(st, nfsstat3::NFS3ERR_JUKEBOX as i32, "proc {proc_num} (write delegation: {write_deleg})");
        }
        // Nothing changed while they waited.
        assert_eq!(t.names(), before);
        let mut buf = [0u8; 8];
        assert_eq!(t.fs.read(&file, 0, &mut buf).unwrap().0, 5);
        assert_eq!(&buf[..5], b"hello");
        // REMOVE and RENAME asked about the file their name names, as a change.
        if held {
            let asked = d.asked.lock().unwrap().clone();
            assert!(asked.iter().all(|(fh, _)| *fh == file), "only the file was asked about: {asked:?}");
            assert_eq!(asked.iter().filter(|(_, w)| *w).count(), 5, "SETATTR, WRITE, REMOVE, RENAME, LINK change it");
        }
        // Everything else goes through (against a fresh tree).
        let mut t = T::new();
        t.p = Nfs3Program::new(t.fs.clone()).with_delegations(d.clone());
        for (proc_num, args) in t.every_call() {
            if waiting.contains(&proc_num) {
                continue;
            }
            let st = status(proc_num, &t.raw(proc_num, &args, 0, "127.0.0.1:900"));
            assert_ne!(st, nfsstat3::NFS3ERR_JUKEBOX as i32, "proc {proc_num} does not wait");
        }
    }
}
