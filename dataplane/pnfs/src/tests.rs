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
    let mut high = device_id(7);
    high[5] = 1;
    assert_eq!(id_of_device(&high), None, "reserved bytes must be zero");
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
