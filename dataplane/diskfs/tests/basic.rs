//! diskfs semantics, restarts, and bad devices.

use std::sync::Arc;

use block::fault::{FaultDevice, Faulty};
use block::mem::MemDevice;
use block::{BlockDevice, Device};
use diskfs::{DiskFs, Options};
use vfs::{CreateMode, Cred, FileHandle, NodeKind, SetAttr, Stability, Vfs, VfsError};

const EXPORT: u32 = 7;

fn opts() -> Options {
    Options::new(EXPORT, true)
}

fn mem(blocks: u64) -> Device {
    Arc::new(MemDevice::new("mem0", blocks))
}

fn create(fs: &DiskFs, dir: &FileHandle, name: &str) -> FileHandle {
    fs.create(dir, name.as_bytes(), NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0
}

fn mkdir(fs: &DiskFs, dir: &FileHandle, name: &str) -> FileHandle {
    fs.create(dir, name.as_bytes(), NodeKind::Directory, 0o755, &Cred::ROOT, CreateMode::Guarded).unwrap().0
}

fn read_all(fs: &DiskFs, fh: &FileHandle) -> Vec<u8> {
    let size = fs.getattr(fh).unwrap().size as usize;
    let mut b = vec![0u8; size];
    let (n, eof) = fs.read(fh, 0, &mut b).unwrap();
    assert_eq!(n, size);
    assert!(eof);
    b
}

fn fsck_clean(dev: &Device) {
    let r = diskfs::fsck::check(vec![dev.clone()]).unwrap();
    assert!(r.clean(), "fsck: {:?}", r.violations);
}

#[test]
fn files_survive_a_restart_with_their_handles() {
    let dev = mem(8192);
    let (f, d, l, v1) = {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        assert!(fs.report().formatted);
        let root = fs.root(EXPORT).unwrap();
        let d = mkdir(&fs, &root, "dir");
        let f = create(&fs, &d, "file");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        fs.write(&f, 1000, &data, Stability::FileSync).unwrap();
        let l = fs.create(&d, b"link", NodeKind::Symlink { target: b"file" }, 0o777, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        fs.link(&f, &root, b"hard").unwrap();
        fs.setattr(&f, &SetAttr { mode: Some(0o600), uid: Some(42), ..Default::default() }, None).unwrap();
        (f, d, l, fs.write_verifier())
    };
    fsck_clean(&dev);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    assert!(!fs.report().formatted);
    assert_ne!(fs.write_verifier(), v1, "the write verifier changes every start");
    let a = fs.getattr(&f).unwrap();
    assert_eq!((a.size, a.mode, a.uid, a.nlink), (301_000, 0o600, 42, 2));
    let got = read_all(&fs, &f);
    assert!(got[..1000].iter().all(|&b| b == 0));
    assert!(got[1000..].iter().enumerate().all(|(i, &b)| b == (i as u32 % 251) as u8));
    assert_eq!(fs.readlink(&l).unwrap(), b"file");
    assert_eq!(fs.lookup(&d, b"file").unwrap().0, f);
    let root = fs.root(EXPORT).unwrap();
    assert_eq!(fs.lookup(&root, b"hard").unwrap().0, f);
    assert_eq!(fs.lookup_parent(&d).unwrap().0, root);
}

#[test]
fn unstable_writes_need_commit_and_commit_makes_them_durable() {
    let inner = Arc::new(MemDevice::new("mem0", 8192));
    let dev: Device = inner.clone();
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let root = fs.root(EXPORT).unwrap();
    let f = create(&fs, &root, "u");
    let (_, how, _) = fs.write(&f, 0, &[7u8; 8192], Stability::Unstable).unwrap();
    assert_eq!(how, Stability::Unstable);
    // Not committed: a restart from the device as it is now forgets it.
    let img = inner.snapshot();
    let fs2 = DiskFs::open(vec![Arc::new(MemDevice::from_image("copy", img)) as Device], &opts()).unwrap();
    let f2 = fs2.lookup(&fs2.root(EXPORT).unwrap(), b"u").unwrap().0;
    assert_eq!(fs2.getattr(&f2).unwrap().size, 0);
    drop(fs2);
    fs.commit(&f, 0, 0).unwrap();
    let img = inner.snapshot();
    let fs3 = DiskFs::open(vec![Arc::new(MemDevice::from_image("copy", img)) as Device], &opts()).unwrap();
    let f3 = fs3.lookup(&fs3.root(EXPORT).unwrap(), b"u").unwrap().0;
    assert_eq!(read_all(&fs3, &f3), vec![7u8; 8192]);
}

#[test]
fn readdir_cookies_rename_and_quota_survive_restart() {
    let dev = mem(8192);
    let vol;
    {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        vol = mkdir(&fs, &root, "vol");
        fs.set_quota(&vol, 64 << 10).unwrap();
        for i in 0..100 {
            create(&fs, &vol, &format!("f{i}"));
        }
        let f = fs.lookup(&vol, b"f1").unwrap().0;
        fs.write(&f, 0, &[1u8; 60 << 10], Stability::FileSync).unwrap();
        fs.setattr(&f, &SetAttr { size: Some(0), ..Default::default() }, None).unwrap();
        fs.rename(&vol, b"f2", &vol, b"f3").unwrap();
        // Rename out of the volume is cross-device.
        assert_eq!(fs.rename(&vol, b"f4", &root, b"x"), Err(VfsError::CrossDevice));
    }
    fsck_clean(&dev);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let q = fs.quota(&vol).unwrap().unwrap();
    assert_eq!(q.capacity_bytes, 64 << 10);
    let mut names = Vec::new();
    fs.readdir(&vol, 0, &mut |e| {
        names.push(String::from_utf8_lossy(e.name).to_string());
        true
    })
    .unwrap();
    assert_eq!(names.len(), 99);
    assert!(!names.contains(&"f2".to_string()));
    let f = fs.lookup(&vol, b"f5").unwrap().0;
    assert_eq!(fs.write(&f, 0, &[1u8; 128 << 10], Stability::FileSync), Err(VfsError::QuotaExceeded));
    fs.write(&f, 0, &[1u8; 32 << 10], Stability::FileSync).unwrap();
    assert_eq!(fs.quota(&vol).unwrap().unwrap().used_bytes, 32 << 10);
    // Resume a listing from a cookie handed out before the restart.
    let root = fs.root(EXPORT).unwrap();
    fs.remove_tree(&root, b"vol").unwrap();
    assert_eq!(fs.getattr(&f), Err(VfsError::Stale));
    drop(fs);
    fsck_clean(&dev);
}

#[test]
fn open_files_outlive_their_names_and_orphans_go_at_restart() {
    let dev = mem(8192);
    let f;
    {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        f = create(&fs, &root, "open");
        fs.write(&f, 0, &[3u8; 40960], Stability::FileSync).unwrap();
        fs.pin(&f).unwrap();
        fs.remove(&root, b"open").unwrap();
        assert_eq!(fs.getattr(&f).unwrap().nlink, 0);
        assert_eq!(read_all(&fs, &f), vec![3u8; 40960]);
        // Stopped while the file is open.
    }
    let r = diskfs::fsck::check(vec![dev.clone()]).unwrap();
    assert!(r.clean(), "{:?}", r.violations);
    assert_eq!(r.orphans, 1);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    assert_eq!(fs.report().orphans_freed, 1);
    assert_eq!(fs.report().data_blocks_used, 0);
    assert_eq!(fs.getattr(&f), Err(VfsError::Stale));
    drop(fs);
    let r = diskfs::fsck::check(vec![dev.clone()]).unwrap();
    assert!(r.clean() && r.orphans == 0, "{:?}", r.violations);
}

#[test]
fn full_device_is_nospace_and_deleting_gives_space_back() {
    let dev = mem(2048);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let root = fs.root(EXPORT).unwrap();
    let total = fs.fsstat(&root).unwrap().free_bytes;
    let f = create(&fs, &root, "big");
    let chunk = vec![9u8; 256 << 10];
    let mut off = 0u64;
    let err = loop {
        match fs.write(&f, off, &chunk, Stability::Unstable) {
            Ok(_) => off += chunk.len() as u64,
            Err(e) => break e,
        }
    };
    assert_eq!(err, VfsError::NoSpace);
    fs.commit(&f, 0, 0).unwrap();
    assert!(fs.fsstat(&root).unwrap().free_bytes < chunk.len() as u64);
    fs.remove(&root, b"big").unwrap();
    // Another commit point lets the freed blocks back in.
    let g = create(&fs, &root, "small");
    fs.write(&g, 0, &chunk, Stability::FileSync).unwrap();
    assert_eq!(fs.fsstat(&root).unwrap().free_bytes, total - chunk.len() as u64);
    drop(fs);
    fsck_clean(&dev);
}

#[test]
fn the_log_wraps_through_checkpoints() {
    let dev = mem(1024); // a 64-block log
    {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        for i in 0..400 {
            let f = create(&fs, &root, &format!("n{i}"));
            if i % 3 == 0 {
                fs.remove(&root, format!("n{i}").as_bytes()).unwrap();
            } else {
                fs.write(&f, 0, format!("{i}").as_bytes(), Stability::FileSync).unwrap();
            }
        }
    }
    fsck_clean(&dev);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let root = fs.root(EXPORT).unwrap();
    for i in 0..400 {
        let r = fs.lookup(&root, format!("n{i}").as_bytes());
        if i % 3 == 0 {
            assert_eq!(r.unwrap_err(), VfsError::NoEnt);
        } else {
            assert_eq!(read_all(&fs, &r.unwrap().0), format!("{i}").as_bytes());
        }
    }
}

#[test]
fn a_failing_device_region_fails_only_the_files_on_it() {
    let inner: Device = mem(8192);
    let fault = Arc::new(FaultDevice::new(inner));
    let ctl = fault.control();
    let dev: Device = fault;
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let root = fs.root(EXPORT).unwrap();
    let a = create(&fs, &root, "a");
    let b = create(&fs, &root, "b");
    fs.write(&a, 0, &[1u8; 4096], Stability::FileSync).unwrap();
    fs.write(&b, 0, &[2u8; 4096], Stability::FileSync).unwrap();
    // Find a's block: the data area starts after the metadata areas; a got
    // the first data block, b the next.
    let used = fs.report().data_blocks_total;
    let first_data = dev.info().blocks - used;
    ctl.fail_range(first_data..first_data + 1, Faulty::Reads);
    let mut buf = [0u8; 4096];
    assert_eq!(fs.read(&a, 0, &mut buf), Err(VfsError::Io));
    assert_eq!(fs.read(&b, 0, &mut buf).unwrap().0, 4096);
    assert_eq!(buf, [2u8; 4096]);
    assert!(fs.io_errors() >= 1);
}

fn flip(dev: &Arc<MemDevice>, byte: u64) {
    let mut img = dev.snapshot();
    let lba = byte / 4096;
    let mut b = img.block(lba).to_vec();
    b[(byte % 4096) as usize] ^= 0x10;
    img.set(lba, Some(b.into()));
    // Write it back through a queue of the same device.
    let mut q = dev.queue(0, 4).unwrap();
    let pool = block::BufPool::new(block::PoolConfig { buf_bytes: 4096, bufs_max: 1, hugepages: block::Hugepages::Try }).unwrap();
    block::sync::write(q.as_mut(), &pool, lba, img.block(lba)).unwrap();
}

fn formatted_with_log() -> (Arc<MemDevice>, diskfs::format::Super) {
    let m = Arc::new(MemDevice::new("flipme", 4096));
    {
        let fs = DiskFs::open(vec![m.clone() as Device], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        for i in 0..5 {
            create(&fs, &root, &format!("f{i}"));
        }
    }
    let mut b = vec![0u8; 4096];
    m.snapshot().read(0, &mut b);
    (m.clone(), diskfs::format::Super::decode(&b).unwrap())
}

#[test]
fn flipped_bits_refuse_start_naming_device_and_offset() {
    // Superblock.
    let (m, _) = formatted_with_log();
    flip(&m, 200);
    let e = DiskFs::open(vec![m.clone() as Device], &opts()).unwrap_err();
    assert!(e.contains("flipme") && e.contains("offset 0") && e.contains("checksum"), "{e}");
    assert!(!diskfs::fsck::check(vec![m.clone() as Device]).unwrap().clean());
    // A checkpoint (metadata) block.
    let (m, s) = formatted_with_log();
    let ck = s.ckpt_start[1] * 4096 + 100;
    flip(&m, ck);
    let e = DiskFs::open(vec![m.clone() as Device], &opts()).unwrap_err();
    assert!(e.contains("flipme") && e.contains(&format!("offset {}", s.ckpt_start[1] * 4096)), "{e}");
    // A log record in the middle of the log.
    let (m, s) = formatted_with_log();
    let lg = (s.log_start + 1) * 4096 + 80;
    flip(&m, lg);
    let e = DiskFs::open(vec![m.clone() as Device], &opts()).unwrap_err();
    assert!(e.contains("flipme") && e.contains(&format!("offset {}", (s.log_start + 1) * 4096)), "{e}");
    let r = diskfs::fsck::check(vec![m.clone() as Device]).unwrap();
    assert!(r.violations.iter().any(|v| v.contains("checksum")), "{:?}", r.violations);
}

#[test]
fn bad_devices_are_clear_start_errors() {
    // Too small.
    let e = DiskFs::open(vec![mem(100)], &opts()).unwrap_err();
    assert!(e.contains("mem0") && e.contains("at least"), "{e}");
    // Blank without initialize.
    let e = DiskFs::open(vec![mem(4096)], &Options { io_buffers: 4, ..Options::new(EXPORT, false) }).unwrap_err();
    assert!(e.contains("initialize"), "{e}");
    // Read-only.
    let ro: Device = Arc::new(MemDevice::new("ro", 4096).read_only());
    let e = DiskFs::open(vec![ro], &opts()).unwrap_err();
    assert!(e.contains("read-only"), "{e}");
    // Another file system's device.
    let a = mem(4096);
    let b: Device = Arc::new(MemDevice::new("other", 4096));
    drop(DiskFs::open(vec![a.clone()], &opts()).unwrap());
    drop(DiskFs::open(vec![b.clone()], &opts()).unwrap());
    let e = DiskFs::open(vec![a.clone(), b.clone()], &opts()).unwrap_err();
    assert!(e.contains("other") && e.contains("another file system"), "{e}");
    // mkfs refuses a formatted device unless forced.
    let e = diskfs::format(vec![a.clone()], EXPORT, false).unwrap_err();
    assert!(e.contains("already holds"), "{e}");
    diskfs::format(vec![a.clone()], EXPORT, true).unwrap();
}

#[test]
fn data_spreads_over_several_devices_and_they_must_stay_in_order() {
    let (a, b) = (mem(4096), Arc::new(MemDevice::new("mem1", 4096)) as Device);
    {
        let fs = DiskFs::open(vec![a.clone(), b.clone()], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        for i in 0..8 {
            let f = create(&fs, &root, &format!("f{i}"));
            fs.write(&f, 0, &[i as u8 + 1; 65536], Stability::FileSync).unwrap();
        }
    }
    let r = diskfs::fsck::check(vec![a.clone(), b.clone()]).unwrap();
    assert!(r.clean(), "{:?}", r.violations);
    let e = DiskFs::open(vec![b.clone(), a.clone()], &opts()).unwrap_err();
    assert!(e.contains("position"), "{e}");
    let fs = DiskFs::open(vec![a.clone(), b.clone()], &opts()).unwrap();
    let root = fs.root(EXPORT).unwrap();
    for i in 0..8 {
        let f = fs.lookup(&root, format!("f{i}").as_bytes()).unwrap().0;
        assert_eq!(read_all(&fs, &f), vec![i as u8 + 1; 65536]);
    }
}

/// `volume_of` names the quota root an object is in (the root itself
/// included), nothing outside volumes, and survives a restart; in a view
/// of a top-level directory, handles of another tree are Stale as for
/// every other call.
#[test]
fn volume_of_names_the_quota_root_across_restart_and_views() {
    let dev = mem(8192);
    let (vol, inner, file, outside);
    {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        vol = mkdir(&fs, &root, "vol");
        fs.set_quota(&vol, 1 << 20).unwrap();
        inner = mkdir(&fs, &vol, "d");
        file = create(&fs, &inner, "f");
        outside = create(&fs, &root, "g");
        assert_eq!(fs.volume_of(&vol), Ok(Some(vol.ino)));
        assert_eq!(fs.volume_of(&file), Ok(Some(vol.ino)));
        assert_eq!(fs.volume_of(&outside), Ok(None));
        assert_eq!(fs.volume_of(&root), Ok(None));
    }
    fsck_clean(&dev);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    assert_eq!(fs.volume_of(&file), Ok(Some(vol.ino)), "after a restart");
    assert_eq!(fs.volume_of(&inner), Ok(Some(vol.ino)));
    fs.remove(&inner, b"f").unwrap();
    assert_eq!(fs.volume_of(&file), Err(VfsError::Stale));
    assert_eq!(fs.volume_of(&FileHandle { export_id: EXPORT + 1, ..vol }), Err(VfsError::Stale));
    // Views: a volume under /m is found through /m's mount; /m's handles
    // mean nothing in /n's.
    let root = fs.root(EXPORT).unwrap();
    mkdir(&fs, &root, "m");
    mkdir(&fs, &root, "n");
    let m = fs.view("/m", 2).unwrap();
    let n = fs.view("/n", 3).unwrap();
    let mv = mkdir(&m, &m.root(2).unwrap(), "vol");
    m.set_quota(&mv, 1 << 20).unwrap();
    let mf = create(&m, &mv, "f");
    assert_eq!(m.volume_of(&mf), Ok(Some(mv.ino)));
    assert_eq!(n.volume_of(&FileHandle { export_id: 3, ..mf }), Err(VfsError::Stale));
    drop((m, n, fs));
    fsck_clean(&dev);
}

#[test]
fn mounts_of_top_level_directories_do_not_reach_each_other() {
    let dev = mem(8192);
    let whole = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let a = whole.view("/mds", 2).unwrap();
    let b = whole.view("/ds", 3).unwrap();
    let ra = a.root(2).unwrap();
    let rb = b.root(3).unwrap();
    assert_eq!(a.root(3), Err(VfsError::Stale));
    assert_eq!(a.lookup_parent(&ra).unwrap().0, ra, "a mount's root is its own parent");
    let fa = create(&a, &ra, "secret");
    a.write(&fa, 0, b"mds data", Stability::FileSync).unwrap();
    // b's export id on a's inode: outside b's tree.
    let forged = FileHandle { export_id: 3, ..fa };
    let mut buf = [0u8; 8];
    assert_eq!(b.read(&forged, 0, &mut buf), Err(VfsError::Stale));
    assert_eq!(b.getattr(&forged), Err(VfsError::Stale));
    assert_eq!(a.getattr(&rb), Err(VfsError::Stale), "b's handle in a");
    let fb = create(&b, &rb, "data");
    assert_eq!(b.link(&fb, &rb, b"again").map(|a| a.nlink), Ok(2));
    drop((a, b, whole));
    fsck_clean(&dev);
    // The trees survive a restart; an existing non-empty directory can
    // become a mount (its contents are tagged).
    let whole = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let root = whole.root(EXPORT).unwrap();
    let old = mkdir(&whole, &root, "old");
    let inside = create(&whole, &old, "f");
    let a = whole.view("/mds", 2).unwrap();
    assert_eq!(a.lookup(&a.root(2).unwrap(), b"secret").unwrap().0, FileHandle { export_id: 2, ..fa });
    let o = whole.view("/old", 4).unwrap();
    assert!(o.getattr(&FileHandle { export_id: 4, ..inside }).is_ok());
    drop((a, o, whole));
    fsck_clean(&dev);
}

#[test]
fn nfs4_client_records_survive_restarts() {
    let dev = mem(4096);
    {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        assert_eq!(fs.client_records(), Some(vec![]));
        fs.record_client(b"linux-client-a", true);
        fs.record_client(b"linux-client-b", true);
        fs.record_client(b"linux-client-a", false);
        fs.record_client(b"linux-client-c", true);
        fs.checkpoint().unwrap();
        fs.record_client(b"linux-client-c", false);
    }
    fsck_clean(&dev);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    assert_eq!(fs.client_records(), Some(vec![b"linux-client-b".to_vec()]));
    let v = fs.view("/mds", 9).unwrap();
    assert_eq!(v.client_records(), Some(vec![b"linux-client-b".to_vec()]), "one set for every mount");
}

#[test]
fn seek_allocate_and_punch_holes_survive_restart() {
    use vfs::Content;
    let dev = mem(8192);
    let f;
    {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        f = create(&fs, &root, "sparse");
        // Data at [64K, 72K), then a hole to 1 MiB.
        fs.write(&f, 65536, &[7u8; 8192], Stability::FileSync).unwrap();
        fs.setattr(&f, &SetAttr { size: Some(1 << 20), ..Default::default() }, None).unwrap();
        assert_eq!(fs.seek(&f, 0, Content::Data), Ok(Some((false, 65536))));
        assert_eq!(fs.seek(&f, 65536, Content::Hole), Ok(Some((false, 73728))));
        assert_eq!(fs.seek(&f, 80000, Content::Data), Ok(Some((true, 1 << 20))));
        assert_eq!(fs.seek(&f, 1 << 20, Content::Data), Ok(None));
        // ALLOCATE past the end grows the file with zeros and charges space.
        let used = fs.getattr(&f).unwrap().used;
        let a = fs.allocate(&f, (1 << 20) - 4096, 3 * 4096).unwrap();
        assert_eq!(a.size, (1 << 20) + 8192);
        assert_eq!(a.used, used + 3 * 4096);
        assert_eq!(fs.allocate(&f, 0, 0), Err(VfsError::Inval));
        assert_eq!(fs.allocate(&f, 0, 1 << 40).unwrap_err(), VfsError::NoSpace);
        assert_eq!(fs.getattr(&f).unwrap().used, used + 3 * 4096, "a failed ALLOCATE changes nothing");
        // DEALLOCATE of [66K, 74K+100): block 17 (whole) unmapped, the tail
        // of block 16 zeroed, block 18 (a hole) untouched.
        let a = fs.deallocate(&f, 66 * 1024, 2 * 4096 + 100).unwrap();
        assert_eq!(a.size, (1 << 20) + 8192, "the size stays");
        assert_eq!(a.used, used + 3 * 4096 - 4096);
    }
    fsck_clean(&dev);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let mut b = vec![0u8; 8192];
    fs.read(&f, 65536, &mut b).unwrap();
    let mut want = vec![7u8; 8192];
    want[2048..].iter_mut().for_each(|x| *x = 0);
    assert!(b == want, "punched range reads zeros, the rest keeps its data");
    assert_eq!(fs.getattr(&f).unwrap().size, (1 << 20) + 8192);
    assert_eq!(fs.seek(&f, (1 << 20) - 4096, Content::Data), Ok(Some((false, (1 << 20) - 4096))));
}

/// Proves server-private blobs (`Vfs::private_set`) are durable metadata of
/// their object: set, replaced and removed ones come back exactly after a
/// restart from the log alone and from a checkpoint plus the log; a blob
/// over the limit is refused; the blob goes with its inode (removed file:
/// its handle is Stale, and a new file reusing nothing sees none); fsck is
/// clean throughout.
#[test]
fn private_blobs_survive_restart_and_checkpoint_and_die_with_their_inode() {
    let dev = mem(4096);
    let big: Vec<u8> = (0..vfs::PRIVATE_BYTES_MAX).map(|i| (i % 253) as u8).collect();
    let (a, b, c, gone) = {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        let (a, b, c, gone) = (create(&fs, &root, "a"), create(&fs, &root, "b"), create(&fs, &root, "c"), create(&fs, &root, "gone"));
        assert_eq!(fs.private_get(&a).unwrap(), None, "a new object has no blob");
        fs.private_set(&a, Some(b"placement-a-1")).unwrap();
        fs.private_set(&b, Some(&big)).unwrap();
        let over = vec![1u8; vfs::PRIVATE_BYTES_MAX + 1];
        assert_eq!(fs.private_set(&c, Some(&over)), Err(VfsError::Inval), "over the limit");
        fs.private_set(&c, Some(b"c")).unwrap();
        fs.private_set(&gone, Some(b"gone")).unwrap();
        assert_eq!(fs.private_get(&a).unwrap().as_deref(), Some(&b"placement-a-1"[..]));
        (a, b, c, gone)
    };
    fsck_clean(&dev);
    {
        // Restart 1: everything from the log.
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        assert_eq!(fs.private_get(&a).unwrap().as_deref(), Some(&b"placement-a-1"[..]));
        assert_eq!(fs.private_get(&b).unwrap(), Some(big.clone()), "a full-size blob, byte for byte");
        assert_eq!(fs.private_get(&c).unwrap().as_deref(), Some(&b"c"[..]), "the refused set changed nothing");
        // A checkpoint holds some of the state, the log the rest.
        fs.private_set(&a, Some(b"placement-a-2")).unwrap();
        fs.checkpoint().unwrap();
        fs.private_set(&c, None).unwrap();
        fs.private_set(&b, Some(b"")).unwrap();
        let root = fs.root(EXPORT).unwrap();
        fs.remove(&root, b"gone").unwrap();
        assert_eq!(fs.private_get(&gone), Err(VfsError::Stale));
        assert_eq!(fs.private_set(&gone, Some(b"x")), Err(VfsError::Stale));
    }
    fsck_clean(&dev);
    {
        // Restart 2: checkpoint + log.
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        assert_eq!(fs.private_get(&a).unwrap().as_deref(), Some(&b"placement-a-2"[..]), "replaced before the checkpoint");
        assert_eq!(fs.private_get(&b).unwrap(), None, "an empty blob removes it");
        assert_eq!(fs.private_get(&c).unwrap(), None, "removed after the checkpoint");
        assert_eq!(fs.private_get(&gone), Err(VfsError::Stale), "the blob went with its inode");
        fs.checkpoint().unwrap();
        let root = fs.root(EXPORT).unwrap();
        let fresh = create(&fs, &root, "gone");
        assert_eq!(fs.private_get(&fresh).unwrap(), None, "a new object under the old name has none");
    }
    fsck_clean(&dev);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    assert_eq!(fs.private_get(&a).unwrap().as_deref(), Some(&b"placement-a-2"[..]), "from the newest checkpoint");
    assert_eq!(fs.private_get(&b).unwrap(), None);
}

/// NFSv4.2 COPY on diskfs: `copy_range` copies (unaligned offsets, more
/// than one chunk, short at the source's end), the copy is durable across a
/// restart and fsck stays clean; a directory is refused; CLONE is not
/// offered (no shared extents).
#[test]
fn copy_range_copies_durably_and_clone_is_not_offered() {
    let dev = mem(16384);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let (src, dst) = {
        let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
        let root = fs.root(EXPORT).unwrap();
        let src = create(&fs, &root, "src");
        let dst = create(&fs, &root, "dst");
        fs.write(&src, 0, &data, Stability::FileSync).unwrap();
        assert_eq!(fs.copy_range(&src, 123, &dst, 4567, 2_500_000).unwrap(), 2_500_000);
        // Asked past the source's end: short.
        assert_eq!(fs.copy_range(&src, 2_999_000, &dst, 0, 5000).unwrap(), 1000);
        assert_eq!(fs.copy_range(&root, 0, &dst, 0, 10).unwrap_err(), VfsError::IsDir);
        assert_eq!(fs.clone_block_bytes(&src), 0, "diskfs does not clone");
        assert_eq!(fs.clone_range(&src, 0, &dst, 0, 4096).unwrap_err(), VfsError::NotSupported);
        (src, dst)
    };
    fsck_clean(&dev);
    let fs = DiskFs::open(vec![dev.clone()], &opts()).unwrap();
    let got = read_all(&fs, &dst);
    assert_eq!(got.len(), 4567 + 2_500_000);
    assert_eq!(&got[..1000], &data[2_999_000..], "the short copy at offset 0");
    assert!(got[1000..4567].iter().all(|&b| b == 0));
    assert!(got[4567..] == data[123..123 + 2_500_000], "the copied range after a restart");
    assert_eq!(read_all(&fs, &src), data, "the source is untouched");
}
