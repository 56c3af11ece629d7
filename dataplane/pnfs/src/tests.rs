//! Unit tests of the pure parts: config limits, device ids, netaddrs (RDMA
//! first, uaddr encoding), membership changes (which DSes stop being
//! active), the stripe-slot math, splitting I/O at stripe-unit boundaries,
//! and layout-stateid checks. The network paths are proved end to end in
//! `chimerad/tests/pnfs.rs`.

use crate::registry::{device_id, id_of_device, Registry};
use crate::{DsSpec, Netid, Placement, Pnfs, PnfsConfig};
use nfs4::layout::{IoMode, LayoutGetArgs, LayoutServer};
use nfs4::state::Stateid;
use proto::nfs4 as p;
use std::sync::Arc;
use std::time::Duration;
use vfs::memfs::{MemFs, MemFsConfig};
use vfs::FileHandle;

fn spec(name: &str, host: &str, port: u16, netid: Netid) -> DsSpec {
    DsSpec {
        name: name.into(),
        host: host.into(),
        port,
        netid,
        tcp_port: if netid == Netid::Rdma { 2049 } else { port },
        backing_path: None,
        ready: true,
        draining: false,
    }
}

#[test]
fn config_limits_name_the_field() {
    assert!(PnfsConfig::default().check().is_ok());
    let bad = |f: fn(&mut PnfsConfig)| {
        let mut c = PnfsConfig::default();
        f(&mut c);
        c.check().unwrap_err()
    };
    assert!(bad(|c| c.stripe_unit_bytes = 3 << 20).contains("power of two"));
    assert!(bad(|c| c.stripe_unit_bytes = 2048).contains("stripe_unit_bytes"));
    assert!(bad(|c| c.mirrors = 4).contains("mirrors"));
    assert!(bad(|c| c.mirrors = 0).contains("mirrors"));
    assert!(bad(|c| c.stripe_width = 1025).contains("stripe_width"));
    assert!(bad(|c| c.layouts_max = 0).contains("layouts_max"));
    assert!(bad(|c| c.ds_timeout_ms = 10).contains("ds_timeout_ms"));
}

#[test]
fn device_ids_round_trip_and_reject_foreign_ones() {
    for id in [1u64, 2, 1023, u64::MAX] {
        assert_eq!(id_of_device(&device_id(id)), Some(id));
    }
    let mut foreign = device_id(7);
    foreign[0] = b'X';
    assert_eq!(id_of_device(&foreign), None);
    let moved = crate::registry::device_id_gen(7, 3);
    assert_ne!(moved, device_id(7), "a moved DS gets another device id");
    assert_eq!(crate::registry::id_and_gen(&moved), Some((7, 3)));
}

#[test]
fn a_moved_data_server_gets_a_new_device_id() {
    let mut r = Registry::new(Duration::from_millis(100));
    r.replace(vec![spec("ds0", "10.0.0.5", 2049, Netid::Tcp)]).unwrap();
    let before = r.states()[0].device_id.clone();
    r.replace(vec![spec("ds0", "10.0.0.5", 2049, Netid::Tcp)]).unwrap();
    assert_eq!(r.states()[0].device_id, before, "same address: same device id");
    r.replace(vec![spec("ds0", "10.0.0.9", 2049, Netid::Tcp)]).unwrap();
    let after = r.states()[0].device_id.clone();
    assert_ne!(after, before, "a new address: a new device id (clients must not dial the old one)");
    assert_eq!(&after[16..], &before[16..], "the same DS id");
}

#[test]
fn netaddrs_put_rdma_first_and_encode_the_port() {
    let mut r = Registry::new(Duration::from_millis(100));
    r.replace(vec![spec("a", "10.0.0.2", 2049, Netid::Tcp), spec("b", "10.0.0.3", 20049, Netid::Rdma), spec("c", "fd00::5", 2050, Netid::Tcp)])
        .unwrap();
    assert_eq!(r.netaddrs(1).unwrap(), [("tcp".to_string(), "10.0.0.2.8.1".to_string())]);
    assert_eq!(
        r.netaddrs(2).unwrap(),
        [("rdma".to_string(), "10.0.0.3.78.81".to_string()), ("tcp".to_string(), "10.0.0.3.8.1".to_string())],
        "RDMA first, then TCP on 2049"
    );
    assert_eq!(r.netaddrs(3).unwrap(), [("tcp6".to_string(), "fd00::5.8.2".to_string())]);
    assert!(r.netaddrs(4).is_none());
}

#[test]
fn membership_changes_report_what_stopped_being_active() {
    let mut r = Registry::new(Duration::from_millis(100));
    assert!(r.replace(vec![spec("a", "127.0.0.1", 1, Netid::Tcp), spec("b", "127.0.0.1", 2, Netid::Tcp)]).unwrap().is_empty());
    assert_eq!(r.active_ids(), [1, 2]);
    // b drains, c joins: b stops, ids stay stable, c gets a new id.
    let mut b = spec("b", "127.0.0.1", 2, Netid::Tcp);
    b.draining = true;
    let gone = r.replace(vec![spec("a", "127.0.0.1", 1, Netid::Tcp), b, spec("c", "127.0.0.1", 3, Netid::Tcp)]).unwrap();
    assert_eq!(gone, [2]);
    assert_eq!(r.active_ids(), [1, 3]);
    // a leaves the list: reported; its record stays (device id not reused).
    let gone = r.replace(vec![spec("c", "127.0.0.1", 3, Netid::Tcp)]).unwrap();
    assert_eq!(gone, [1]);
    assert_eq!(r.active_ids(), [3]);
    assert_eq!(r.states().len(), 1, "only listed DSes are shown");
    assert!(r.replace(vec![spec("x", "h", 1, Netid::Tcp), spec("x", "h", 2, Netid::Tcp)]).unwrap_err().contains("duplicate"));
    // Health is separate from membership.
    r.mark_unhealthy(3, 0);
    assert!(r.active_ids().is_empty());
    assert_eq!(r.probe_due(10, 1000).len(), 0, "quarantine not over");
    assert_eq!(r.probe_due(1000, 1000).len(), 1);
    r.mark_healthy(3);
    assert_eq!(r.active_ids(), [3]);
}

fn placement(width: usize, mirrors: u32) -> Placement {
    Placement {
        dses: (1..=width as u64).collect(),
        mirrors,
        stripe_unit_bytes: 4096,
        epoch: 0,
        data_fh: vec![vec![]; width],
        stale: vec![false; width],
    }
}

#[test]
fn stripe_slots_rotate_and_mirrors_differ() {
    let p = placement(3, 2);
    assert!(p.segmented());
    let got: Vec<(usize, usize)> = (0..6).map(|k| (p.slot(k, 0), p.slot(k, 1))).collect();
    assert_eq!(got, [(0, 1), (1, 2), (2, 0), (0, 1), (1, 2), (2, 0)]);
    for k in 0..100 {
        assert_ne!(p.slot(k, 0), p.slot(k, 1), "mirrors of unit {k} on different DSes");
    }
    // As many DSes as mirrors (how mirrored files are placed): whole file,
    // mirror m on DS m for every unit.
    let m = placement(2, 2);
    assert!(!m.segmented());
    assert!((0..10).all(|k| m.slot(k, 0) == 0 && m.slot(k, 1) == 1));
    let one = placement(1, 1);
    assert!(!one.segmented());
    assert!((0..10).all(|k| one.slot(k, 0) == 0));
}

/// The last good copy of a stripe unit never goes stale: with one copy no
/// slot may; with two, a slot may while its partner copies are good, and
/// not once one of them is stale; a whole-file mirror likewise.
#[test]
fn only_a_copy_with_a_good_partner_may_go_stale() {
    let p = placement(3, 1);
    assert!((0..3).all(|i| !p.others_cover(i, p.dses[i])), "one copy: never stale");
    let mut p = placement(3, 2);
    assert!((0..3).all(|i| p.others_cover(i, p.dses[i])), "two copies, all good");
    // Slot 1 is a partner of slots 0 (unit 0: slots 0, 1) and 2 (unit 1:
    // slots 1, 2); stale, it leaves both without a good partner.
    p.stale[1] = true;
    assert!(!p.others_cover(0, p.dses[0]));
    assert!(!p.others_cover(2, p.dses[2]));
    let mut p = placement(2, 2);
    assert!(!p.segmented());
    assert!(p.others_cover(0, p.dses[0]) && p.others_cover(1, p.dses[1]));
    p.stale[0] = true;
    assert!(!p.others_cover(1, p.dses[1]), "the last good whole-file copy");
    // Two slots on the same DS are no cover for each other.
    let mut p = placement(2, 2);
    p.dses = vec![7, 7];
    assert!(!p.others_cover(0, 7));
}

#[test]
fn io_splits_at_stripe_unit_boundaries() {
    let p = placement(3, 1);
    let pieces = crate::mdsio::PnfsVfs::pieces_for_test(&p, 4000, 10_000);
    assert_eq!(pieces, [(4000, 0, 96), (4096, 96, 4096), (8192, 4192, 4096), (12288, 8288, 1712)]);
    assert_eq!(pieces.iter().map(|x| x.2).sum::<usize>(), 10_000);
    assert_eq!(crate::mdsio::PnfsVfs::pieces_for_test(&p, 0, 0), []);
}

#[test]
fn layout_stateids_are_checked() {
    let memfs: Arc<dyn vfs::Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 16 << 20 }));
    let pn = Pnfs::new(PnfsConfig::default(), memfs, vec![]).unwrap();
    let sid = pn.layout_stateid(5, 1);
    assert!(pn.is_layout_stateid(&sid));
    assert!(!pn.is_layout_stateid(&Stateid { seqid: 1, other: [1; 12] }), "an open stateid is not ours");
    let fh = FileHandle { export_id: 1, ino: 9, generation: 1 };
    let a = LayoutGetArgs {
        clientid: 1,
        fh,
        fsid: 1,
        iomode: IoMode::Rw,
        offset: 0,
        length: u64::MAX,
        minlength: 0,
        stateid: sid,
        layout_stateid: true,
        maxcount: 4096,
        peer: None,
    };
    assert_eq!(pn.layoutget(&a).unwrap_err(), p::NFS4ERR_BAD_STATEID, "unknown key");
    let mut other_boot = sid;
    other_boot.other[7] ^= 1;
    assert_eq!(pn.layoutget(&LayoutGetArgs { stateid: other_boot, ..a }).unwrap_err(), p::NFS4ERR_STALE_STATEID);
    // No data servers: nothing to place the file on.
    assert_eq!(pn.layoutget(&LayoutGetArgs { layout_stateid: false, ..a }).unwrap_err(), p::NFS4ERR_LAYOUTUNAVAILABLE);
    assert_eq!(pn.getdeviceinfo(&device_id(1)).unwrap_err(), p::NFS4ERR_NOENT);
    assert!(pn.getdevicelist().is_empty());
}

#[test]
fn an_open_unlinked_placed_file_keeps_its_data_files_until_unpin() {
    use vfs::{CreateMode, Cred, NodeKind, Vfs, VfsError};
    let memfs: Arc<dyn vfs::Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 16 << 20 }));
    let pn = Pnfs::new(PnfsConfig::default(), memfs, vec![]).unwrap();
    let v = crate::mdsio::PnfsVfs::new(pn.clone());
    let root = v.root(1).unwrap();
    let mk = |name: &[u8]| v.create(&root, name, NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
    let queued = || pn.metrics.removals_queued.load(std::sync::atomic::Ordering::Relaxed);
    let placed = |fh: &FileHandle| pn.state().files.contains_key(fh);
    // REMOVE while open: the placement (and so the data files) stays.
    let f = mk(b"f");
    pn.state().files.insert(f, placement(1, 1));
    v.pin(&f).unwrap();
    v.remove(&root, b"f").unwrap();
    assert!(placed(&f), "data files kept while the file is open");
    assert_eq!(queued(), 0);
    assert_eq!(v.getattr(&f).unwrap().nlink, 0);
    v.unpin(&f);
    assert!(!placed(&f), "the last close removes the data files");
    assert_eq!(queued(), 1);
    assert_eq!(v.getattr(&f), Err(VfsError::Stale));
    // RENAME over an open file: likewise.
    let old = mk(b"old");
    let new = mk(b"new");
    pn.state().files.insert(old, placement(1, 1));
    v.pin(&old).unwrap();
    v.rename(&root, b"new", &root, b"old").unwrap();
    assert!(placed(&old));
    assert_eq!(queued(), 1);
    v.unpin(&old);
    assert!(!placed(&old));
    assert_eq!(queued(), 2);
    // Unpinning a file that still has its name removes nothing; an
    // unopened file's last REMOVE removes its data files at once.
    pn.state().files.insert(new, placement(1, 1));
    v.pin(&new).unwrap();
    v.unpin(&new);
    assert!(placed(&new));
    v.remove(&root, b"old").unwrap();
    assert!(!placed(&new));
    assert_eq!(queued(), 3);
}

fn stored(width: usize) -> crate::persist::Stored {
    crate::persist::Stored {
        names: (0..width).map(|i| format!("ds-{i}")).collect(),
        stale: (0..width).map(|i| i % 2 == 1).collect(),
        handles: Some((0..width).map(|i| vec![i as u8 + 1; 32]).collect()),
        mirrors: 2,
        stripe_unit_bytes: 1 << 20,
        epoch: 7,
    }
}

/// Proves the stored-placement encoding round-trips (with handles, and
/// without them once they no longer fit in `PRIVATE_BYTES_MAX`), refuses
/// what does not fit at all, and names every kind of garbage: each valid
/// blob turned invalid one field at a time is refused, never accepted as
/// some other placement.
#[test]
fn stored_placements_round_trip_and_garbage_is_refused() {
    use crate::persist::{decode, encode};
    let s = stored(3);
    let b = encode(&s).unwrap();
    assert_eq!(decode(&b).unwrap(), s);
    // 120 DSes with 32-byte handles: over 4 KiB, so the handles are left out.
    let fits = stored(90);
    assert!(decode(&encode(&fits).unwrap()).unwrap() == fits, "90 DSes fit with their handles");
    let wide = stored(120);
    let b120 = encode(&wide).unwrap();
    assert!(b120.len() <= vfs::PRIVATE_BYTES_MAX);
    assert!(decode(&b120).unwrap() == crate::persist::Stored { handles: None, ..wide });
    // Names alone over 4 KiB: nothing to store.
    let mut huge = stored(40);
    huge.names = (0..40).map(|i| format!("{i:0>200}")).collect();
    assert!(encode(&huge).is_none());

    let bad = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut x = b.clone();
        f(&mut x);
        decode(&x).map(|_| ()).unwrap_err()
    };
    assert!(bad(&|x| x[0] = b'X').contains("magic"));
    assert!(bad(&|x| x[4] = 2).contains("version"));
    assert!(bad(&|x| x[5] = 3).contains("flags"));
    assert!(bad(&|x| x[6] = 0).contains("mirrors"));
    assert!(bad(&|x| x[6] = 4).contains("mirrors"));
    assert!(bad(&|x| x[7] = 1).contains("reserved"));
    assert!(bad(&|x| x[8..10].copy_from_slice(&1u16.to_be_bytes())).contains("mirrors over 1"));
    assert!(bad(&|x| x[8..10].copy_from_slice(&4u16.to_be_bytes())).contains("truncated"));
    assert!(bad(&|x| x[10..18].copy_from_slice(&3000u64.to_be_bytes())).contains("stripe unit"));
    assert!(bad(&|x| x[10..18].copy_from_slice(&(128u64 << 20).to_be_bytes())).contains("stripe unit"));
    assert!(bad(&|x| x[18..22].copy_from_slice(&1_000_000u32.to_be_bytes())).contains("epoch"));
    // First DS entry at byte 22: name length, "ds-0", stale, handle length.
    assert!(bad(&|x| x[22] = 0).contains("name of 0"));
    assert!(bad(&|x| x[27] = 2).contains("stale flag"));
    assert!(bad(&|x| x[28] = 0).contains("handle of 0"));
    assert!(bad(&|x| x[28] = 65).contains("handle of 65"));
    assert!(bad(&|x| x[26] = b'1').contains("twice"), "ds-1 named twice");
    assert!(bad(&|x| x[23] = 0xff).contains("UTF-8"));
    assert!(bad(&|x| x.push(0)).contains("after the end"));
    assert!(bad(&|x| {
        x.pop();
    })
    .contains("truncated"));
    assert!(bad(&|x| x.truncate(3)).contains("truncated"));
    assert!(decode(&[]).is_err());
    assert!(decode(&vec![0u8; vfs::PRIVATE_BYTES_MAX + 1]).unwrap_err().contains("more than"));
}

/// Proves a forged or corrupt stored placement fails only its own file, and
/// never loses the data it points to: READ, WRITE, COMMIT, truncation and
/// LAYOUTGET of that file fail with Io / NFS4ERR_IO (the blob is kept, not
/// replaced by a new placement), while another file of the same DiskFs-
/// backed MDS is served; a valid blob naming a DS not in the list restores
/// with that copy unavailable (Io for a single copy, no layout, not in
/// GETDEVICELIST). A memfs MDS keeps no blobs: nothing is restored.
#[test]
fn a_garbage_stored_placement_fails_only_its_file() {
    use std::sync::atomic::Ordering::Relaxed;
    use vfs::{CreateMode, Cred, NodeKind, SetAttr, Stability, Vfs, VfsError};
    let dev: block::Device = Arc::new(block::mem::MemDevice::new("mds", 4096));
    let fs: Arc<dyn Vfs> = Arc::new(diskfs::DiskFs::open(vec![dev], &diskfs::Options::new(1, true)).unwrap());
    let pn = Pnfs::new(PnfsConfig::default(), fs.clone(), vec![spec("listed", "127.0.0.1", 9, Netid::Tcp)]).unwrap();
    let v = crate::mdsio::PnfsVfs::new(pn.clone());
    let root = v.root(1).unwrap();
    let mk = |name: &[u8]| v.create(&root, name, NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
    let (bad, plain, gone) = (mk(b"bad"), mk(b"plain"), mk(b"gone"));
    v.setattr(&bad, &SetAttr { size: Some(100), ..Default::default() }, None).unwrap();
    let garbage = b"CHPL\x01\x00\x09garbage".to_vec();
    fs.private_set(&bad, Some(&garbage)).unwrap();
    let mut buf = [0u8; 10];
    assert_eq!(v.read(&bad, 0, &mut buf), Err(VfsError::Io));
    assert_eq!(v.write(&bad, 0, b"new", Stability::FileSync).map(|x| x.0), Err(VfsError::Io));
    assert_eq!(v.commit(&bad, 0, 0), Err(VfsError::Io));
    assert_eq!(v.setattr(&bad, &SetAttr { size: Some(0), ..Default::default() }, None).map(|a| a.size), Err(VfsError::Io));
    assert_eq!(v.getattr(&bad).unwrap().size, 100, "a refused truncation changed nothing");
    let a = LayoutGetArgs {
        clientid: 1,
        fh: bad,
        fsid: 1,
        iomode: IoMode::Rw,
        offset: 0,
        length: u64::MAX,
        minlength: 0,
        stateid: Stateid { seqid: 1, other: [1; 12] },
        layout_stateid: false,
        maxcount: 4096,
        peer: None,
    };
    assert_eq!(pn.layoutget(&a).unwrap_err(), p::NFS4ERR_IO);
    assert_eq!(fs.private_get(&bad).unwrap(), Some(garbage), "the stored placement is kept for repair, not replaced");
    assert!(pn.placement_of(&bad).is_none());
    assert!(pn.metrics.placements_unreadable.load(Relaxed) >= 5);
    // Another file is served (never placed: its bytes are the MDS's own).
    assert_eq!(v.getattr(&plain).unwrap().size, 0);
    assert_eq!(v.read(&plain, 0, &mut buf), Ok((0, true)));
    // A valid blob naming a DS that is not listed: restored, copy unavailable.
    let s = crate::persist::Stored {
        names: vec!["left".into()],
        stale: vec![false],
        handles: Some(vec![vec![7; 16]]),
        mirrors: 1,
        stripe_unit_bytes: 1 << 20,
        epoch: 3,
    };
    fs.private_set(&gone, Some(&crate::persist::encode(&s).unwrap())).unwrap();
    v.setattr(&gone, &SetAttr { size: Some(10), ..Default::default() }, None).unwrap();
    assert_eq!(v.read(&gone, 0, &mut buf), Err(VfsError::Io), "its only copy is on a DS that is not listed");
    assert_eq!(pn.placement_of(&gone).unwrap(), [("left".to_string(), vec![7; 16])]);
    assert_eq!(pn.metrics.placements_restored.load(Relaxed), 1);
    assert_eq!(pn.layoutget(&LayoutGetArgs { fh: gone, ..a }).unwrap_err(), p::NFS4ERR_LAYOUTUNAVAILABLE);
    assert_eq!(pn.getdevicelist(), [device_id(1)], "the unlisted DS is known, not listed");
    assert_eq!(pn.ds_states().len(), 1);

    // memfs keeps no blobs: the wrapper sees no placement, reads the MDS's bytes.
    let memfs: Arc<dyn Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 16 << 20 }));
    assert_eq!(memfs.private_get(&memfs.root(1).unwrap()), Err(VfsError::NotSupported));
    let pm = Pnfs::new(PnfsConfig::default(), memfs, vec![]).unwrap();
    let vm = crate::mdsio::PnfsVfs::new(pm.clone());
    let r = vm.root(1).unwrap();
    let f = vm.create(&r, b"f", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
    assert_eq!(vm.read(&f, 0, &mut buf), Ok((0, true)));
    assert_eq!(pm.metrics.placements_restored.load(Relaxed), 0);
}

/// Proves the restore path of a placement stored without its data-file
/// handles (a wide placement's handles do not fit): a new `Pnfs` over the
/// same DiskFs-backed namespace finds the handle again by LOOKUP on the DS
/// (the same handle as before) and reads the data written through the MDS;
/// when the data file is gone from the DS the file fails with Io and the
/// blob is left as it was. One data server runs in process.
#[test]
fn a_placement_stored_without_handles_finds_them_on_the_ds() {
    use vfs::{CreateMode, Cred, NodeKind, Stability, Vfs, VfsError};
    let ds = data_server();
    let port = ds.nfs_addr.unwrap().port();
    let dev: block::Device = Arc::new(block::mem::MemDevice::new("mds", 4096));
    let fs: Arc<dyn Vfs> = Arc::new(diskfs::DiskFs::open(vec![dev], &diskfs::Options::new(1, true)).unwrap());
    let specs = vec![spec("solo", "127.0.0.1", port, Netid::Tcp)];
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 249) as u8).collect();
    let strip = |fh: &FileHandle| {
        let mut s = crate::persist::decode(&fs.private_get(fh).unwrap().unwrap()).unwrap();
        assert!(s.handles.is_some(), "one DS: the handle fits");
        s.handles = None;
        fs.private_set(fh, Some(&crate::persist::encode_form(&s, false))).unwrap();
    };
    let (f, g, f_placed) = {
        let pn = Pnfs::new(PnfsConfig::default(), fs.clone(), specs.clone()).unwrap();
        let v = crate::mdsio::PnfsVfs::new(pn.clone());
        let root = v.root(1).unwrap();
        let mk = |name: &[u8]| v.create(&root, name, NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        let (f, g) = (mk(b"f"), mk(b"g"));
        for fh in [f, g] {
            assert_eq!(v.write(&fh, 0, &data, Stability::FileSync).unwrap().0, data.len());
            strip(&fh);
        }
        // g's data file leaves the DS.
        let mut c = crate::client3::Client3::new(&format!("127.0.0.1:{port}"), Duration::from_secs(5));
        let pseudo = vfs::router::PSEUDO_ROOT.to_bytes().to_vec();
        let first = c.first_entry(&pseudo).unwrap().unwrap();
        let dir = c.lookup(&pseudo, &first).unwrap();
        c.remove(&dir, crate::data_file_name(&g).as_bytes()).unwrap();
        (f, g, pn.placement_of(&f).unwrap())
    };
    // A new MDS instance over the same namespace: nothing in memory.
    let pn = Pnfs::new(PnfsConfig::default(), fs.clone(), specs).unwrap();
    let v = crate::mdsio::PnfsVfs::new(pn.clone());
    let mut buf = vec![0u8; 20_000];
    assert_eq!(v.read(&f, 0, &mut buf), Ok((data.len(), true)));
    assert!(buf[..data.len()] == data[..], "read back through the handle found by LOOKUP");
    assert_eq!(pn.placement_of(&f).unwrap(), f_placed, "the same handle as before");
    let blob = fs.private_get(&g).unwrap();
    assert_eq!(v.read(&g, 0, &mut buf), Err(VfsError::Io), "its data file is gone");
    assert!(pn.placement_of(&g).is_none(), "not restored, tried again at the next use");
    assert_eq!(fs.private_get(&g).unwrap(), blob, "the stored placement is left as it was");
    drop(v);
    drop(pn);
    ds.shutdown();
}

/// A data server (chimerad, memfs) in process on a port it picks.
fn data_server() -> chimerad::serve::Running {
    let cfg = serde_json::json!({
        "common": { "log_level": "warn" },
        "server": { "role": "ds", "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0 },
        "metrics": { "enabled": false }
    });
    chimerad::serve::start(&chimerad::config::Config::parse(&cfg.to_string()).unwrap()).unwrap()
}

/// A recaller that sends nothing and reports every recall as sent: the
/// client that acknowledges CB_LAYOUTRECALL and never returns its layout.
struct DeafClient;

impl crate::LayoutRecaller for DeafClient {
    fn recall_file(&self, _clientid: u64, _fh: &FileHandle, _stateid: &Stateid, _on_done: Box<dyn FnOnce(crate::RecallEnd) + Send>) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn a_recalled_layout_never_returned_is_revoked_after_the_timeout() {
    use vfs::{CreateMode, Cred, NodeKind, Vfs};
    let memfs: Arc<dyn vfs::Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 16 << 20 }));
    let pn = Pnfs::new(PnfsConfig { recall_timeout_ms: 1000, ..PnfsConfig::default() }, memfs, vec![]).unwrap();
    pn.set_recaller(Arc::new(DeafClient));
    let v = crate::mdsio::PnfsVfs::new(pn.clone());
    let root = v.root(1).unwrap();
    let f = v.create(&root, b"held", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
    pn.state().files.insert(f, placement(1, 1));
    pn.state().layouts.insert(7, crate::LayoutState { clientid: 9, fh: f, fsid: 1, seqid: 1, dses: vec![1], recalled_ms: None, revoke_now: false, peer: None, rw: true });
    let held = || pn.state().layouts.len();
    let revoked = || pn.metrics.layouts_revoked.load(std::sync::atomic::Ordering::Relaxed);
    pn.revoke_unreturned();
    assert_eq!((held(), revoked()), (1, 0), "never recalled: kept");
    pn.recall_where(|_| true, true);
    pn.revoke_unreturned();
    assert_eq!((held(), revoked()), (1, 0), "recalled just now: the client has time to return it");
    let epoch = pn.state().files[&f].epoch;
    std::thread::sleep(Duration::from_millis(1100));
    pn.revoke_unreturned();
    assert_eq!((held(), revoked()), (0, 1), "not returned within recall_timeout_ms: revoked");
    assert_eq!(pn.state().files[&f].epoch, epoch + 1, "revoked by fencing: the data files have a new owner");
    assert!(PnfsConfig { recall_timeout_ms: 10, ..PnfsConfig::default() }.check().unwrap_err().contains("recall_timeout_ms"));
}

/// A recaller whose client answers every recall with `end` (at once).
struct Answers(crate::RecallEnd);

impl crate::LayoutRecaller for Answers {
    fn recall_file(&self, _clientid: u64, _fh: &FileHandle, _stateid: &Stateid, on_done: Box<dyn FnOnce(crate::RecallEnd) + Send>) -> Result<(), String> {
        on_done(self.0.clone());
        Ok(())
    }
}

#[test]
fn a_recall_answered_nomatching_layout_forgets_the_state_and_a_failed_one_revokes_it() {
    use vfs::{CreateMode, Cred, NodeKind, Vfs};
    for (end, fencing, held_after, revoked_after) in [
        (crate::RecallEnd::NoMatchingLayout, true, 0, 0),
        (crate::RecallEnd::NoMatchingLayout, false, 0, 0),
        (crate::RecallEnd::Failed("BADHANDLE".into()), true, 0, 1),
        // A truncation's recall (no fencing) is never revoked.
        (crate::RecallEnd::Failed("BADHANDLE".into()), false, 1, 0),
        (crate::RecallEnd::Accepted, true, 1, 0),
    ] {
        let memfs: Arc<dyn vfs::Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 16 << 20 }));
        let pn = Pnfs::new(PnfsConfig { recall_timeout_ms: 600_000, ..PnfsConfig::default() }, memfs, vec![]).unwrap();
        pn.set_recaller(Arc::new(Answers(end.clone())));
        let v = crate::mdsio::PnfsVfs::new(pn.clone());
        let root = v.root(1).unwrap();
        let f = v.create(&root, b"f", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        pn.state().files.insert(f, placement(1, 1));
        pn.state().layouts.insert(7, crate::LayoutState { clientid: 9, fh: f, fsid: 1, seqid: 1, dses: vec![1], recalled_ms: None, revoke_now: false, peer: None, rw: true });
        pn.recall_where(|_| true, fencing);
        pn.apply_recall_ends();
        pn.revoke_unreturned();
        let held = pn.state().layouts.len();
        let revoked = pn.metrics.layouts_revoked.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!((held, revoked), (held_after, revoked_after), "{end:?}, fencing {fencing}");
    }
}

/// Records the stateids recalls carry.
struct Records(std::sync::Mutex<Vec<Stateid>>);

impl crate::LayoutRecaller for Records {
    fn recall_file(&self, _clientid: u64, _fh: &FileHandle, stateid: &Stateid, _on_done: Box<dyn FnOnce(crate::RecallEnd) + Send>) -> Result<(), String> {
        self.0.lock().unwrap().push(*stateid);
        Ok(())
    }
}

/// An MDS whose recalls go to `rec`, holding one layout state (key 7) the
/// client got at seqid 3.
fn holding_one_layout_at_seqid_3(rec: Arc<dyn crate::LayoutRecaller>) -> Arc<Pnfs> {
    let memfs: Arc<dyn vfs::Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 16 << 20 }));
    let pn = Pnfs::new(PnfsConfig::default(), memfs, vec![]).unwrap();
    pn.set_recaller(rec);
    let mut b = [0u8; 24];
    (b[0], b[7], b[15], b[23]) = (1, 1, 5, 1);
    let f = FileHandle::from_bytes(&b).expect("a file handle");
    pn.state().layouts.insert(7, crate::LayoutState { clientid: 9, fh: f, fsid: 1, seqid: 3, dses: vec![1], recalled_ms: None, revoke_now: false, peer: None, rw: true });
    pn
}

#[test]
fn a_recall_carries_the_next_seqid_of_the_layout_stateid() {
    let rec = Arc::new(Records(std::sync::Mutex::new(Vec::new())));
    let pn = holding_one_layout_at_seqid_3(rec.clone());
    pn.recall_where(|_| true, false);
    pn.recall_where(|_| true, false);
    let seqids: Vec<u32> = rec.0.lock().unwrap().iter().map(|s| s.seqid).collect();
    // The client holds seqid 3 from LAYOUTGET: each recall is the next state.
    assert_eq!(seqids, vec![4, 5]);
    assert_eq!(pn.state().layouts[&7].seqid, 5, "the client's LAYOUTRETURN names the recall's seqid");
}

/// A back channel that is down for the first `down` recalls.
struct DownThenUp {
    down: std::sync::atomic::AtomicUsize,
    sent: std::sync::Mutex<Vec<Stateid>>,
}

impl crate::LayoutRecaller for DownThenUp {
    fn recall_file(&self, _clientid: u64, _fh: &FileHandle, stateid: &Stateid, _on_done: Box<dyn FnOnce(crate::RecallEnd) + Send>) -> Result<(), String> {
        if self.down.fetch_update(std::sync::atomic::Ordering::SeqCst, std::sync::atomic::Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err("no back channel".into());
        }
        self.sent.lock().unwrap().push(*stateid);
        Ok(())
    }
}

#[test]
fn a_recall_that_is_not_sent_gives_its_seqid_back() {
    let rec = Arc::new(DownThenUp { down: 1.into(), sent: std::sync::Mutex::new(Vec::new()) });
    let pn = holding_one_layout_at_seqid_3(rec.clone());
    pn.recall_where(|_| true, false);
    assert_eq!(pn.state().layouts[&7].seqid, 3, "the client never saw the recall: it still holds seqid 3");
    pn.recall_where(|_| true, false);
    // The recall that reaches the client is exactly one ahead of its seqid.
    assert_eq!(rec.sent.lock().unwrap().iter().map(|s| s.seqid).collect::<Vec<_>>(), vec![4]);
    assert_eq!(pn.state().layouts[&7].seqid, 4);
}

#[test]
fn only_data_file_names_are_taken_for_handles() {
    let mut b = [0u8; 24];
    (b[0], b[7], b[15], b[23]) = (1, 1, 0xab, 1);
    let f = FileHandle::from_bytes(&b).expect("a file handle");
    let name = crate::data_file_name(&f);
    assert!(name.contains("ab"));
    assert_eq!(crate::orphans::handle_of_name(name.as_bytes()), Some(f));
    for other in [name.to_uppercase(), name[1..].to_string(), format!("{name}00"), "notes.txt".into(), String::new(), "zz".repeat(24)] {
        assert_eq!(crate::orphans::handle_of_name(other.as_bytes()), None, "{other:?} is not a data file name");
    }
}

/// A data file already on the DS under the name a new placement takes
/// (its MDS file is gone: a namespace that was not kept, then the same
/// handle handed out again) is emptied when the new file is placed: none
/// of its bytes show through. One data server runs in process.
#[test]
fn a_new_placement_empties_a_leftover_data_file_of_its_name() {
    use crate::client3::{Client3, Sattr};
    use vfs::{CreateMode, Cred, NodeKind, Stability, Vfs};
    let ds = data_server();
    let port = ds.nfs_addr.unwrap().port();
    let fs: Arc<dyn Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 64 << 20 }));
    let pn = Pnfs::new(PnfsConfig::default(), fs, vec![spec("solo", "127.0.0.1", port, Netid::Tcp)]).unwrap();
    let v = crate::mdsio::PnfsVfs::new(pn.clone());
    let root = v.root(1).unwrap();
    let f = v.create(&root, b"f", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
    assert!(pn.placement_of(&f).is_none(), "placed at first use");
    // The leftover: 8 KiB under f's data-file name.
    let mut c = Client3::new(&format!("127.0.0.1:{port}"), Duration::from_secs(5));
    let pseudo = vfs::router::PSEUDO_ROOT.to_bytes().to_vec();
    let first = c.first_entry(&pseudo).unwrap().unwrap();
    let dir = c.lookup(&pseudo, &first).unwrap();
    let old = c.create(&dir, crate::data_file_name(&f).as_bytes(), &Sattr { mode: Some(0o600), uid: None, gid: None, size: None }).unwrap();
    c.write(&old, 0, &[0xab; 8192], 2).unwrap();
    assert_eq!(c.getattr(&old).unwrap().size, 8192);
    assert_eq!(v.write(&f, 0, b"new", Stability::FileSync).unwrap().0, 3);
    let data_fh = pn.placement_of(&f).expect("placed")[0].1.clone();
    assert_eq!(data_fh, old, "the same data file, reused");
    assert_eq!(c.getattr(&old).unwrap().size, 3, "emptied when placed, then written");
    let mut out = Vec::new();
    c.read(&old, 0, 8192, &mut out).unwrap();
    assert_eq!(out, b"new");
    drop(v);
    drop(pn);
    ds.shutdown();
}

/// A burst of the same failure logs one line, then none until the quiet
/// period ends; the next line counts those left out.
#[test]
fn repeated_failures_log_once_per_period() {
    let l = crate::LogLimit::default();
    assert_eq!(l.admit(), Some(0));
    for _ in 0..5 {
        assert_eq!(l.admit(), None);
    }
    assert_eq!(crate::and_more(5), "; 5 more like it since the last such line");
    assert_eq!(crate::and_more(0), "");
}

/// Writes through the MDS that finish out of order never shrink the file:
/// each grew the size to its own end from the size it read before its
/// (slow) data-server write, so the last to finish set it, and a read past
/// it found EOF for data that was written and acknowledged. Found with the
/// fio engine's asynchronous NFSv4.1 I/O through the MDS (six FILE_SYNC
/// writes in flight together; the read of the last came back empty).
#[test]
fn writes_through_the_mds_finishing_out_of_order_keep_the_largest_size() {
    use vfs::{CreateMode, Cred, NodeKind, Stability, Vfs};
    let ds = data_server();
    let port = ds.nfs_addr.unwrap().port();
    let fs: Arc<dyn Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 64 << 20 }));
    let pn = Pnfs::new(PnfsConfig::default(), fs, vec![spec("solo", "127.0.0.1", port, Netid::Tcp)]).unwrap();
    let v = Arc::new(crate::mdsio::PnfsVfs::new(pn.clone()));
    let root = v.root(1).unwrap();
    let f = v.create(&root, b"f", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
    const BLOCK: u64 = 4096;
    for round in 0..8u64 {
        let base = round * 64 * BLOCK;
        let threads: Vec<_> = (0..16u64)
            .map(|k| {
                let v = v.clone();
                // Offsets in an order the writes do not finish in.
                let at = base + ((k * 7) % 16) * BLOCK;
                std::thread::spawn(move || v.write(&f, at, &[k as u8 + 1; BLOCK as usize], Stability::FileSync).map(|w| w.0))
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap().unwrap(), BLOCK as usize);
        }
        let want = base + 16 * BLOCK;
        assert_eq!(v.getattr(&f).unwrap().size, want, "round {round}: the end of the furthest write");
        let mut buf = vec![0u8; BLOCK as usize];
        assert_eq!(v.read(&f, want - BLOCK, &mut buf).unwrap().0, BLOCK as usize, "round {round}: the last block reads back");
    }
    drop(v);
    drop(pn);
    ds.shutdown();
}
