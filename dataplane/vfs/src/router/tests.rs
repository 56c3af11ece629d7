//! Router tests: the pseudo-root is read-only and lists the mounts, calls
//! reach the backend named by the handle's export id, unknown exports are
//! stale and forged pseudo-root handles bad, paths resolve across mounts,
//! and the pseudo-root's space is the sum of the backends'.

use super::*;
use crate::memfs::{MemFs, MemFsConfig};

const MIB: u64 = 1 << 20;

fn mem(export_id: ExportId, capacity_bytes: u64) -> Arc<MemFs> {
    Arc::new(MemFs::new(MemFsConfig { export_id, capacity_bytes }))
}

fn router() -> (Router, Arc<MemFs>, Arc<MemFs>) {
    let (a, b) = (mem(1, 8 * MIB), mem(2, 16 * MIB));
    let r = Router::new(vec![
        Mount { name: b"share".to_vec(), export_id: 1, backend: a.clone() },
        Mount { name: b"scratch".to_vec(), export_id: 2, backend: b.clone() },
    ])
    .unwrap();
    (r, a, b)
}

fn mkdir(v: &dyn Vfs, dir: &FileHandle, name: &[u8]) -> FileHandle {
    v.create(dir, name, NodeKind::Directory, 0o755, &Cred::ROOT, CreateMode::Guarded).unwrap().0
}

#[test]
fn construction_rejects_bad_mount_tables() {
    let m = |name: &[u8], export_id| Mount { name: name.to_vec(), export_id, backend: mem(export_id.max(1), MIB) };
    let err = |mounts| Router::new(mounts).unwrap_err().0;
    assert!(err(vec![m(b"a/b", 1)]).contains("not a single path component"));
    assert!(err(vec![m(b"", 1)]).contains("not a single path component"));
    assert!(err(vec![m(b"..", 1)]).contains("not a single path component"));
    assert!(err(vec![m(b"a", 0)]).contains("reserved for the pseudo-root"));
    assert!(err(vec![m(b"a", 1), m(b"b", 1)]).contains("export id 1 is used by another mount"));
    assert!(err(vec![m(b"a", 1), m(b"a", 2)]).contains("used twice"));
    let wrong = Mount { name: b"w".to_vec(), export_id: 3, backend: mem(4, MIB) };
    assert!(err(vec![wrong]).contains("does not serve export id 3"));
    assert!(Router::new(vec![]).is_ok(), "an empty namespace is valid");
}

#[test]
fn pseudo_root_lists_mounts_and_is_read_only() {
    let (r, a, _) = router();
    let p = r.root(0).unwrap();
    assert_eq!(p, PSEUDO_ROOT);
    let attr = r.getattr(&p).unwrap();
    assert_eq!((attr.ftype, attr.mode, attr.nlink, attr.fsid), (FileType::Directory, 0o555, 4, 0));
    let mut seen = Vec::new();
    assert!(r
        .readdir(&p, 0, &mut |e| {
            seen.push((e.name.to_vec(), e.fh, e.cookie));
            true
        })
        .unwrap());
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].0, b"share");
    assert_eq!(seen[0].1, a.root(1).unwrap());
    assert_eq!(seen[1].0, b"scratch");
    assert_eq!(seen[1].1.export_id, 2);
    // Resume after the first entry, and stop early.
    let mut rest = Vec::new();
    r.readdir(&p, seen[0].2, &mut |e| {
        rest.push(e.name.to_vec());
        true
    })
    .unwrap();
    assert_eq!(rest, vec![b"scratch".to_vec()]);
    assert_eq!(r.readdir(&p, 0, &mut |_| false), Ok(false));
    assert_eq!(r.readdir(&p, 999, &mut |_| true), Err(VfsError::Inval));
    let mut from_dotdot = 0;
    r.readdir(&p, 2, &mut |_| {
        from_dotdot += 1;
        true
    })
    .unwrap();
    assert_eq!(from_dotdot, 2, "cookie 2 resumes at the first mount");
    // Every change to the pseudo-root is refused.
    let cred = Cred::ROOT;
    assert_eq!(
        r.create(&p, b"x", NodeKind::File, 0o644, &cred, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::ReadOnly)
    );
    assert_eq!(r.remove(&p, b"share"), Err(VfsError::ReadOnly));
    assert_eq!(r.rmdir(&p, b"share"), Err(VfsError::ReadOnly));
    assert_eq!(r.remove_tree(&p, b"share"), Err(VfsError::ReadOnly));
    assert_eq!(r.setattr(&p, &SetAttr::default(), None), Err(VfsError::ReadOnly));
    assert_eq!(r.set_quota(&p, MIB), Err(VfsError::ReadOnly));
    assert_eq!(r.rename(&p, b"share", &p, b"other"), Err(VfsError::ReadOnly));
    assert_eq!(r.quota(&p), Ok(None));
    let mut buf = [0u8; 4];
    assert_eq!(r.read(&p, 0, &mut buf), Err(VfsError::IsDir));
    assert_eq!(r.write(&p, 0, b"x", Stability::FileSync).map(|_| ()), Err(VfsError::IsDir));
    assert_eq!(r.readlink(&p), Err(VfsError::Inval));
    assert_eq!(r.cookie_verifier(&p), r.cookie_verifier(&p));
    assert_eq!(r.lookup(&p, b"nope").map(|x| x.0), Err(VfsError::NoEnt));
    assert_eq!(r.lookup(&p, b"a/b").map(|x| x.0), Err(VfsError::Inval));
}

#[test]
fn dispatch_by_export_and_parent_of_mount_root() {
    let (r, a, b) = router();
    let p = PSEUDO_ROOT;
    let (share, sattr) = r.lookup(&p, b"share").unwrap();
    assert_eq!(share, a.root(1).unwrap());
    assert_eq!(sattr.fsid, 1);
    let (scratch, _) = r.lookup(&p, b"scratch").unwrap();
    let d = mkdir(&r, &share, b"d");
    let (f, _) = r.create(&d, b"f", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap();
    r.write(&f, 0, b"through the router", Stability::FileSync).unwrap();
    // The object lives in backend 1 only.
    assert_eq!(a.lookup(&d, b"f").unwrap().0, f);
    assert_eq!(b.lookup(&scratch, b"d").map(|x| x.0), Err(VfsError::NoEnt));
    let mut buf = [0u8; 64];
    let (n, eof) = r.read(&f, 0, &mut buf).unwrap();
    assert_eq!((&buf[..n], eof), (&b"through the router"[..], true));
    // Parents: inside a mount, the backend's; of a mount root, the pseudo-root.
    assert_eq!(r.lookup_parent(&d).unwrap().0, share);
    assert_eq!(r.lookup_parent(&share).unwrap().0, p);
    assert_eq!(r.lookup_parent(&p).unwrap().0, p);
    // Two-handle calls across mounts are cross-device.
    assert_eq!(r.rename(&d, b"f", &scratch, b"f"), Err(VfsError::CrossDevice));
    assert_eq!(r.link(&f, &scratch, b"l"), Err(VfsError::CrossDevice));
    assert_eq!(r.rename(&p, b"share", &scratch, b"x"), Err(VfsError::CrossDevice));
    r.rename(&d, b"f", &share, b"g").unwrap();
    assert_eq!(r.link(&f, &d, b"h").unwrap().nlink, 2);
    // Quotas pass through.
    let v = mkdir(&r, &scratch, b"vol");
    r.set_quota(&v, MIB).unwrap();
    assert_eq!(r.quota(&v).unwrap().unwrap().capacity_bytes, MIB);
    assert_eq!(r.fsstat(&v).unwrap().total_bytes, MIB);
    r.remove_tree(&scratch, b"vol").unwrap();
    assert_eq!(r.getattr(&v), Err(VfsError::Stale));
}

#[test]
fn unknown_exports_are_stale_and_forgeries_bad() {
    let (r, _, _) = router();
    assert_eq!(r.root(9), Err(VfsError::Stale));
    let unknown = FileHandle { export_id: 9, ino: 1, generation: 1 };
    assert_eq!(r.getattr(&unknown), Err(VfsError::Stale));
    assert_eq!(r.lookup(&unknown, b"x").map(|x| x.0), Err(VfsError::Stale));
    for forged in
        [FileHandle { export_id: 0, ino: 2, generation: 1 }, FileHandle { export_id: 0, ino: 1, generation: 7 }]
    {
        assert_eq!(r.getattr(&forged), Err(VfsError::BadHandle));
        assert_eq!(r.readdir(&forged, 0, &mut |_| true), Err(VfsError::BadHandle));
    }
    // A handle with a known export but an object never issued is the backend's call.
    let never = FileHandle { export_id: 1, ino: 77, generation: 1 };
    assert_eq!(r.getattr(&never), Err(VfsError::BadHandle));
    // Two-handle calls check both handles before anything else.
    let share = r.root(1).unwrap();
    assert_eq!(r.rename(&share, b"a", &unknown, b"b"), Err(VfsError::Stale));
    assert_eq!(r.link(&unknown, &share, b"b"), Err(VfsError::Stale));
}

#[test]
fn resolve_path_walks_mounts() {
    let (r, _, _) = router();
    let share = r.root(1).unwrap();
    let vols = mkdir(&r, &share, b"volumes");
    let x = mkdir(&r, &vols, b"x");
    let (f, _) = r.create(&x, b"file", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap();
    assert_eq!(r.resolve_path(b"/share/volumes/x"), Ok(x));
    assert_eq!(r.resolve_path(b"share/volumes/x/"), Ok(x));
    assert_eq!(r.resolve_path(b"//share/./volumes//x"), Ok(x));
    assert_eq!(r.resolve_path(b"/share/volumes/x/../x/file"), Ok(f));
    assert_eq!(r.resolve_path(b"/share/.."), Ok(PSEUDO_ROOT));
    assert_eq!(r.resolve_path(b"/.."), Ok(PSEUDO_ROOT));
    assert_eq!(r.resolve_path(b"/"), Ok(PSEUDO_ROOT));
    assert_eq!(r.resolve_path(b""), Ok(PSEUDO_ROOT));
    assert_eq!(r.resolve_path(b"/scratch"), r.root(2));
    assert_eq!(r.resolve_path(b"/nope"), Err(VfsError::NoEnt));
    assert_eq!(r.resolve_path(b"/share/missing/x"), Err(VfsError::NoEnt));
    assert_eq!(r.resolve_path(b"/share/volumes/x/file/deeper"), Err(VfsError::NotDir));
    assert_eq!(r.resolve_path(b"/share/a\0b"), Err(VfsError::Inval));
    assert_eq!(r.resolve_path(&vec![b'/'; PATH_MAX_BYTES + 1]), Err(VfsError::NameTooLong));
    let mut long = b"/share/".to_vec();
    long.extend(std::iter::repeat_n(b'n', 300));
    assert_eq!(r.resolve_path(&long), Err(VfsError::NameTooLong));
}

#[test]
fn pseudo_root_fsstat_sums_backends_and_verifier_follows_backends() {
    let (r, a, b) = router();
    let s = r.fsstat(&PSEUDO_ROOT).unwrap();
    let (sa, sb) = (a.fsstat(&a.root(1).unwrap()).unwrap(), b.fsstat(&b.root(2).unwrap()).unwrap());
    assert_eq!(s.total_bytes, 24 * MIB);
    assert_eq!(s.total_bytes, sa.total_bytes + sb.total_bytes);
    assert_eq!(s.free_bytes, sa.free_bytes + sb.free_bytes);
    assert_eq!(s.total_files, sa.total_files + sb.total_files);
    let share = r.root(1).unwrap();
    let (f, _) = r.create(&share, b"f", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap();
    r.write(&f, 0, &[1u8; 10_000], Stability::FileSync).unwrap();
    assert!(r.fsstat(&PSEUDO_ROOT).unwrap().free_bytes < s.free_bytes);
    assert_eq!(r.fsstat(&share).unwrap().total_bytes, 8 * MIB);
    // The router's write verifier is derived from every backend's.
    let expect: Vec<u8> = a.write_verifier().iter().zip(b.write_verifier()).map(|(x, y)| x ^ y).collect();
    assert_eq!(r.write_verifier().to_vec(), expect);
}
