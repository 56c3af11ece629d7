//! pNFS flex-files end to end, in process: an MDS and three data servers,
//! each a real chimerad on its own 127.0.0.1 port, driven by a small test
//! client that does what the Linux flex-files client does (NFSv4.1 session
//! to the MDS, LAYOUTGET + GETDEVICEINFO, NFSv3 READ/WRITE to the DS
//! address the device names, with the layout's synthetic uid, LAYOUTCOMMIT).
//! Each test says what it proves.

mod pnfs_client;
mod relay;

use pnfs_client::*;
use relay::relay;
use proto::nfs4 as p;
use serde_json::json;
use std::collections::HashSet;
use std::time::{Duration, Instant};

const RW: u32 = 2;
const READ: u32 = 1;
const SHARE_BOTH: u32 = 3;
const SU: u64 = 64 * 1024;
const NFS3ERR_ACCES: u32 = 13;

fn mds_addr(c: &Cluster) -> std::net::SocketAddr {
    c.mds().nfs_addr.unwrap()
}

/// Proves the striping math: a file spanning 9 stripe units gets one
/// segment per unit, unit k on DS (first + k) mod 3 (so units k and k+3
/// share a DS and neighbours differ, all three DSes used); data written to
/// each DS with the layout's uid reads back from that DS; LAYOUTCOMMIT sets
/// the size the MDS reports; and a READ through the MDS (no layout)
/// assembles the same bytes from the three DSes.
#[test]
fn striping_places_units_round_robin() {
    let c = cluster(3, 3, json!({}));
    let mut v = V4::connect(mds_addr(&c), b"stripe");
    let (open, fh) = v.open(&["m"], "striped", SHARE_BOTH);
    let units = 9u64;
    let mut ds_of_unit = Vec::new();
    let mut lsid = open;
    for k in 0..units {
        let l = v.layoutget(&fh, 4, RW, k * SU, u64::MAX, 4096, &lsid).expect("RW layout");
        assert_eq!((l.offset, l.length, l.iomode), (k * SU, SU, RW), "one segment per stripe unit");
        assert_eq!(l.mirrors.len(), 1);
        assert_eq!(l.mirrors[0].uid, SYNTH_UID, "synthetic owner handed out");
        lsid = l.stateid;
        let addr = v.ds_of(&l.mirrors[0].deviceid);
        let mut ds = ds_client(addr, l.mirrors[0].uid, l.mirrors[0].gid);
        let data = pattern(1, k * SU, SU as usize);
        assert_eq!(ds.write(&l.mirrors[0].fh, k * SU, &data, 0).unwrap().0 as u64, SU);
        ds.commit(&l.mirrors[0].fh).unwrap();
        let mut back = Vec::new();
        ds.read(&l.mirrors[0].fh, k * SU, SU as u32, &mut back).unwrap();
        assert!(back == data, "unit {k} reads back from its DS");
        ds_of_unit.push(c.ds_index_of(addr));
    }
    for k in 0..units as usize {
        if k + 3 < units as usize {
            assert_eq!(ds_of_unit[k], ds_of_unit[k + 3], "unit {k} and {} share a DS", k + 3);
        }
        if k + 1 < units as usize {
            assert_ne!(ds_of_unit[k], ds_of_unit[k + 1], "neighbouring units on different DSes");
        }
    }
    assert_eq!(ds_of_unit.iter().collect::<HashSet<_>>().len(), 3, "all three DSes hold data");
    assert_eq!(v.layoutcommit(&fh, &lsid, units * SU - 1), Ok(Some(units * SU)));
    assert_eq!(v.size(&fh), units * SU, "GETATTR size after LAYOUTCOMMIT");
    // Through the MDS: 3 READs of 3 units each cross DS boundaries.
    for chunk in 0..3u64 {
        let off = chunk * 3 * SU;
        let got = v.read(&fh, &open, off, (3 * SU) as u32).expect("READ through the MDS");
        assert!(got == pattern(1, off, 3 * SU as usize), "MDS-through read of units {}..{}", chunk * 3, chunk * 3 + 3);
    }
    let m = metrics(&c);
    assert_eq!(metric(&m, "chimera_pnfs_layouts_granted_total{iomode=\"rw\"}"), Some(units as f64));
    assert!(metric(&m, "chimera_pnfs_mds_io_bytes_total{op=\"read\"}").unwrap() >= (units * SU) as f64);
}

/// Proves mirroring: with mirrors = 2 a file's one whole-file segment names
/// two different DSes; a client writing both copies can read the same bytes from either;
/// a write through the MDS lands on both copies too (read back from each
/// DS as root).
#[test]
fn mirrors_two_write_both_copies() {
    let c = cluster(3, 3, json!({ "mirrors": 2 }));
    let mut v = V4::connect(mds_addr(&c), b"mirror");
    let (open, fh) = v.open(&["m"], "mirrored", SHARE_BOTH);
    let l = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("RW layout");
    assert_eq!(l.mirrors.len(), 2, "two mirrors");
    assert_eq!((l.offset, l.length), (0, u64::MAX), "a mirrored file gets one whole-file segment (Linux needs it)");
    let addrs: Vec<_> = l.mirrors.iter().map(|m| v.ds_of(&m.deviceid)).collect();
    assert_ne!(addrs[0], addrs[1], "mirrors on different DSes");
    let data = pattern(2, 0, 8192);
    for (m, a) in l.mirrors.iter().zip(&addrs) {
        ds_client(*a, m.uid, m.gid).write(&m.fh, 0, &data, 2).unwrap();
    }
    for (m, a) in l.mirrors.iter().zip(&addrs) {
        let mut back = Vec::new();
        ds_client(*a, m.uid, m.gid).read(&m.fh, 0, 8192, &mut back).unwrap();
        assert!(back == data, "copy on {a} holds the data");
    }
    // Through the MDS: unit 1 (its own two mirrors), then both copies.
    let w = pattern(3, SU, 5000);
    assert_eq!(v.write(&fh, &open, SU, &w), Ok(5000));
    let l1 = v.layoutget(&fh, 4, READ, SU, SU, 0, &l.stateid).expect("READ layout");
    assert_eq!(l1.mirrors.len(), 2);
    let mut spread = HashSet::new();
    for i in 0..6 {
        let (o, f) = v.open(&["m"], &format!("spread{i}"), SHARE_BOTH);
        for m in v.layoutget(&f, 4, RW, 0, u64::MAX, 0, &o).unwrap().mirrors {
            spread.insert(v.ds_of(&m.deviceid));
        }
    }
    assert_eq!(spread.len(), 3, "mirrored files still spread over all DSes");
    for m in &l1.mirrors {
        let a = v.ds_of(&m.deviceid);
        let mut back = Vec::new();
        ds_client(a, 0, 0).read(&m.fh, SU, 5000, &mut back).unwrap();
        assert!(back == w, "MDS write reached the copy on {a}");
    }
    assert_eq!(v.size(&fh), SU + 5000, "MDS write extended the size");
}

/// Proves placement spreads files: with stripe_width 1 and three DSes,
/// twelve new files land four on each DS (counted by the cluster document
/// and by the devices their layouts name).
#[test]
fn placement_spreads_files_evenly() {
    let c = cluster(3, 3, json!({ "stripe_width": 1 }));
    let mut v = V4::connect(mds_addr(&c), b"spread");
    let mut per_ds = [0usize; 3];
    for i in 0..12 {
        let (open, fh) = v.open(&["m"], &format!("f{i}"), SHARE_BOTH);
        let l = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("layout");
        assert_eq!((l.offset, l.length), (0, u64::MAX), "width 1: one segment for the whole file");
        per_ds[c.ds_index_of(v.ds_of(&l.mirrors[0].deviceid))] += 1;
    }
    assert_eq!(per_ds, [4, 4, 4]);
    let (st, cl) = admin(&c, "GET", "/api/v1/cluster", None);
    assert_eq!(st, 200);
    let files: Vec<u64> = cl["pnfs"]["dataServers"].as_array().unwrap().iter().map(|d| d["files"].as_u64().unwrap()).collect();
    assert_eq!(files, [4, 4, 4], "cluster document: {cl}");
}

/// Proves the MDS announces pNFS the way the Linux client looks for it:
/// EXCHANGE_ID answers USE_PNFS_MDS (and not USE_NON_PNFS), the file
/// system's fs_layout_types is [LAYOUT4_FLEX_FILES] and layout_blksize is
/// the stripe unit; GETDEVICELIST lists the three DSes.
#[test]
fn mds_advertises_flex_files() {
    let c = cluster(3, 3, json!({}));
    let mut v = V4::connect(mds_addr(&c), b"adv");
    assert_eq!(v.eir_flags & (p::EXCHGID4_FLAG_USE_PNFS_MDS | p::EXCHGID4_FLAG_USE_NON_PNFS), p::EXCHGID4_FLAG_USE_PNFS_MDS);
    // GETATTR fs_layout_types (62: word 1 bit 30) and layout_blksize (65: word 2 bit 1).
    let mut r = v.call(&[raw(p::OP_PUTROOTFH, W::default()), raw(p::OP_LOOKUP, W::default().opaque(b"m")), raw(p::OP_GETATTR, W::default().u32(3).u32(0).u32(1 << 30).u32(1 << 1))]);
    r.ok(p::OP_PUTROOTFH);
    r.ok(p::OP_LOOKUP);
    r.ok(p::OP_GETATTR);
    let (types, blksize) = r.with(|d| {
        let n = d.u32().unwrap();
        let words: Vec<u32> = (0..n).map(|_| d.u32().unwrap()).collect();
        assert_eq!(words, [0, 1 << 30, 1 << 1], "both attributes returned");
        let _len = d.u32().unwrap();
        let cnt = d.u32().unwrap();
        let types: Vec<u32> = (0..cnt).map(|_| d.u32().unwrap()).collect();
        (types, d.u32().unwrap())
    });
    assert_eq!(types, [4], "fs_layout_types = [LAYOUT4_FLEX_FILES]");
    assert_eq!(blksize as u64, SU, "layout_blksize = stripe unit");
    let mut r = v.call(&[raw(p::OP_PUTROOTFH, W::default()), raw(p::OP_GETDEVICELIST, W::default().u32(4).u32(16).u64(0).bytes(&[0; 8]))]);
    r.ok(p::OP_PUTROOTFH);
    r.ok(p::OP_GETDEVICELIST);
    let (n, eof) = r.with(|d| {
        d.u64().unwrap();
        d.opaque_fixed::<8>().unwrap();
        let n = d.u32().unwrap();
        for _ in 0..n {
            d.opaque_fixed::<16>().unwrap();
        }
        (n, d.bool().unwrap())
    });
    assert_eq!((n, eof), (3, true));
}

/// Proves the RFC's errors for hostile layout requests: a directory
/// (WRONG_TYPE), another layout type (UNKNOWN_LAYOUTTYPE), iomode ANY
/// (BADIOMODE), length < minlength (INVAL), a forged open stateid and a
/// forged layout stateid (BAD_STATEID), a layout stateid of another boot
/// (STALE_STATEID), an RW layout on a read-only open (OPENMODE), an unknown
/// device (NOENT), and LAYOUTCOMMIT with a forged stateid (BAD_STATEID).
#[test]
fn hostile_layout_requests_get_rfc_errors() {
    let c = cluster(3, 3, json!({}));
    let mut v = V4::connect(mds_addr(&c), b"hostile");
    let (open, fh) = v.open(&["m"], "h", SHARE_BOTH);
    // The directory /m.
    let mut r = v.call(&[raw(p::OP_PUTROOTFH, W::default()), raw(p::OP_LOOKUP, W::default().opaque(b"m")), raw(p::OP_GETFH, W::default())]);
    r.ok(p::OP_PUTROOTFH);
    r.ok(p::OP_LOOKUP);
    r.ok(p::OP_GETFH);
    let dir = r.with(|d| d.opaque_var(128).unwrap().to_vec());
    assert_eq!(v.layoutget(&dir, 4, RW, 0, u64::MAX, 0, &open).unwrap_err(), p::NFS4ERR_WRONG_TYPE);
    assert_eq!(v.layoutget(&fh, 1, RW, 0, u64::MAX, 0, &open).unwrap_err(), p::NFS4ERR_UNKNOWN_LAYOUTTYPE);
    assert_eq!(v.layoutget(&fh, 4, 3, 0, u64::MAX, 0, &open).unwrap_err(), p::NFS4ERR_BADIOMODE);
    assert_eq!(v.layoutget(&fh, 4, RW, 0, 4096, 8192, &open).unwrap_err(), p::NFS4ERR_INVAL);
    let mut forged = open;
    forged.other[11] ^= 0x5a;
    assert_eq!(v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &forged).unwrap_err(), p::NFS4ERR_BAD_STATEID);
    let good = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("layout");
    let mut forged_l = good.stateid;
    forged_l.other[11] ^= 0x5a;
    assert_eq!(v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &forged_l).unwrap_err(), p::NFS4ERR_BAD_STATEID);
    let mut other_boot = good.stateid;
    other_boot.other[5] ^= 1;
    assert_eq!(v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &other_boot).unwrap_err(), p::NFS4ERR_STALE_STATEID);
    assert_eq!(v.layoutcommit(&fh, &forged_l, 10), Err(p::NFS4ERR_BAD_STATEID));
    let (ro, rofh) = v.open(&["m"], "readonly", 1);
    assert_eq!(v.layoutget(&rofh, 4, RW, 0, u64::MAX, 0, &ro).unwrap_err(), p::NFS4ERR_OPENMODE);
    assert!(v.layoutget(&rofh, 4, READ, 0, u64::MAX, 0, &ro).is_ok(), "READ layout on a read-only open");
    let mut unknown = good.mirrors[0].deviceid;
    unknown[15] ^= 0x77;
    assert_eq!(v.getdeviceinfo(&unknown).unwrap_err(), p::NFS4ERR_NOENT);
    let (addrs, vers) = v.getdeviceinfo(&good.mirrors[0].deviceid).unwrap();
    assert_eq!(addrs.len(), 1, "TCP only without RDMA");
    assert_eq!(vers.len(), 1);
    assert_eq!((vers[0].0, vers[0].1, vers[0].4), (3, 0, false), "NFSv3, loosely coupled");
    assert!(vers[0].2 >= 4096 && vers[0].3 >= 4096, "rsize/wsize advertised");
    // The session still works after all of that.
    assert_eq!(v.size(&fh), 0);
}

/// Proves LAYOUTCOMMIT past a volume's quota is NFS4ERR_DQUOT and leaves the
/// size alone, while one inside it is applied.
#[test]
fn layoutcommit_past_quota_is_dquot() {
    let c = cluster(3, 3, json!({}));
    let (st, _) = admin(&c, "POST", "/api/v1/volumes", Some(&json!({ "name": "small", "capacityBytes": 1 << 20 })));
    assert!(st == 201 || st == 200, "volume created: {st}");
    let mut v = V4::connect(mds_addr(&c), b"quota");
    let (open, fh) = v.open(&["m", "volumes", "small"], "q", SHARE_BOTH);
    let l = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("layout");
    assert_eq!(v.layoutcommit(&fh, &l.stateid, (4 << 20) - 1), Err(p::NFS4ERR_DQUOT));
    assert_eq!(v.size(&fh), 0);
    assert_eq!(v.layoutcommit(&fh, &l.stateid, 4095), Ok(Some(4096)));
    assert_eq!(v.size(&fh), 4096);
}

/// Proves fencing: a DS refuses a data-file WRITE whose AUTH_SYS uid is not
/// the synthetic owner (NFS3ERR_ACCES); after the MDS fences the file the
/// old layout's uid is refused too, and a new LAYOUTGET hands out the new
/// owner, which works.
#[test]
fn fencing_refuses_the_old_uid() {
    let c = cluster(3, 3, json!({ "stripe_width": 1 }));
    let mut v = V4::connect(mds_addr(&c), b"fence");
    let (open, fh) = v.open(&["m"], "fenced", SHARE_BOTH);
    let l = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("layout");
    let m = &l.mirrors[0];
    let addr = v.ds_of(&m.deviceid);
    assert_eq!(ds_client(addr, 4242, 4242).write(&m.fh, 0, b"intruder", 2).unwrap_err(), pnfs::client3::CtlError::Status(NFS3ERR_ACCES));
    ds_client(addr, m.uid, m.gid).write(&m.fh, 0, b"owner ok", 2).unwrap();
    let vfh = vfs::FileHandle::from_bytes(&fh).unwrap();
    c.pnfs().fence(&vfh);
    assert_eq!(ds_client(addr, m.uid, m.gid).write(&m.fh, 0, b"stale uid", 2).unwrap_err(), pnfs::client3::CtlError::Status(NFS3ERR_ACCES));
    assert_eq!(
        v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &l.stateid).unwrap_err(),
        p::NFS4ERR_BAD_STATEID,
        "the fenced layout state is gone"
    );
    let l2 = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("new layout");
    assert_ne!(l2.mirrors[0].uid, m.uid, "new synthetic owner");
    ds_client(addr, l2.mirrors[0].uid, l2.mirrors[0].gid).write(&l2.mirrors[0].fh, 0, b"new uid!", 2).unwrap();
    let m = metrics(&c);
    assert_eq!(metric(&m, "chimera_pnfs_fences_total"), Some(1.0));
}

/// Proves failure reports: LAYOUTERROR naming a DS marks it unhealthy
/// (cluster document and `chimera_pnfs_ds_healthy`), and no new file or
/// layout is placed on it afterwards.
#[test]
fn layouterror_marks_ds_unhealthy() {
    let c = cluster(3, 3, json!({ "stripe_width": 1 }));
    let mut v = V4::connect(mds_addr(&c), b"err");
    let (open, fh) = v.open(&["m"], "e", SHARE_BOTH);
    let l = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("layout");
    let bad = l.mirrors[0].deviceid;
    let bad_ds = c.ds_index_of(v.ds_of(&bad));
    let args = W::default().u64(0).u64(u64::MAX).sid(&l.stateid).u32(1).bytes(&bad).u32(p::NFS4ERR_NXIO as u32).u32(p::OP_WRITE as u32);
    let mut r = v.call(&[putfh(&fh), raw(p::OP_LAYOUTERROR, args)]);
    r.ok(p::OP_PUTFH);
    r.ok(p::OP_LAYOUTERROR);
    let (_, cl) = admin(&c, "GET", "/api/v1/cluster", None);
    let name = format!("ds{bad_ds}");
    let d = cl["pnfs"]["dataServers"].as_array().unwrap().iter().find(|d| d["name"] == name.as_str()).unwrap().clone();
    assert_eq!(d["healthy"], false, "{d}");
    assert!(d["errors"].as_u64().unwrap() >= 1);
    assert_eq!(metric(&metrics(&c), &format!("chimera_pnfs_ds_healthy{{ds=\"{name}\"}}")), Some(0.0));
    for i in 0..6 {
        let (o, f) = v.open(&["m"], &format!("after{i}"), SHARE_BOTH);
        let l = v.layoutget(&f, 4, RW, 0, u64::MAX, 0, &o).expect("layout on a healthy DS");
        assert_ne!(l.mirrors[0].deviceid, bad, "no new layouts on the unhealthy DS");
    }
    // The file whose only copy is on it: no layout; I/O through the MDS still
    // reaches the (actually alive) DS.
    assert_eq!(v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &l.stateid).unwrap_err(), p::NFS4ERR_LAYOUTUNAVAILABLE);
}

/// Proves runtime membership: a DS added with PUT /api/v1/dataservers takes
/// new files (width grows to 3); a DS marked draining gets no new files or
/// layouts, the layouts naming it are recalled (without a back channel the
/// file is fenced: the old uid stops working on every DS), and its data
/// stays readable through the MDS.
#[test]
fn membership_add_and_drain() {
    let c = cluster(3, 2, json!({}));
    let mut v = V4::connect(mds_addr(&c), b"member");
    let (o1, f1) = v.open(&["m"], "before", SHARE_BOTH);
    let mut before = HashSet::new();
    for k in 0..4 {
        let dev = v.layoutget(&f1, 4, RW, k * SU, u64::MAX, 0, &o1).unwrap().mirrors[0].deviceid;
        before.insert(c.ds_index_of(v.ds_of(&dev)));
    }
    assert_eq!(before, HashSet::from([0, 1]), "two DSes listed at start");
    let entry = |i: usize, draining: bool| json!({ "name": format!("ds{i}"), "address": ds_addr(c.ds[i].as_ref().unwrap()).to_string(), "draining": draining });
    let (st, body) = admin(&c, "PUT", "/api/v1/dataservers", Some(&json!({ "dataServers": [entry(0, false), entry(1, false), entry(2, false)] })));
    assert_eq!(st, 200, "{body}");
    let (o2, f2) = v.open(&["m"], "after-add", SHARE_BOTH);
    let mut after = HashSet::new();
    for k in 0..6 {
        let dev = v.layoutget(&f2, 4, RW, k * SU, u64::MAX, 0, &o2).unwrap().mirrors[0].deviceid;
        after.insert(c.ds_index_of(v.ds_of(&dev)));
    }
    assert_eq!(after, HashSet::from([0, 1, 2]), "the new DS takes new files");
    // Write unit 0 of f2 through its layout, then drain the DS holding it.
    let l0 = v.layoutget(&f2, 4, RW, 0, u64::MAX, 0, &o2).unwrap();
    let drained = c.ds_index_of(v.ds_of(&l0.mirrors[0].deviceid));
    let data = pattern(9, 0, 4096);
    let a0 = v.ds_of(&l0.mirrors[0].deviceid);
    ds_client(a0, l0.mirrors[0].uid, l0.mirrors[0].gid).write(&l0.mirrors[0].fh, 0, &data, 2).unwrap();
    assert_eq!(v.layoutcommit(&f2, &l0.stateid, 4095), Ok(Some(4096)));
    let held = |c: &Cluster, i: usize| -> u64 {
        let (st, body) = admin(c, "GET", "/api/v1/cluster", None);
        assert_eq!(st, 200, "{body}");
        let ds = body["pnfs"]["dataServers"].as_array().expect("pnfs.dataServers");
        let d = ds.iter().find(|d| d["name"] == format!("ds{i}")).expect("listed");
        d["layoutsHeld"].as_u64().expect("layoutsHeld is a number")
    };
    assert!(held(&c, drained) >= 1, "the layout just granted is held and names ds{drained}");
    let list: Vec<_> = (0..3).map(|i| entry(i, i == drained)).collect();
    let (st, body) = admin(&c, "PUT", "/api/v1/dataservers", Some(&json!({ "dataServers": list })));
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["dataServers"][drained]["draining"], true);
    let m = metrics(&c);
    assert!(metric(&m, "chimera_pnfs_layouts_recalled_total").unwrap() >= 1.0, "layouts naming the drained DS recalled");
    assert_eq!(metric(&m, "chimera_pnfs_layouts_revoked_total"), Some(0.0), "fenced at once (no back channel), nothing left to revoke");
    assert_eq!(metric(&m, &format!("chimera_pnfs_ds_draining{{ds=\"ds{drained}\"}}")), Some(1.0));
    // Drained: no layout state names it any more (recalled, here fenced),
    // which is what the operator's rolling update waits for.
    assert_eq!(held(&c, drained), 0, "layouts naming the draining DS are gone");
    assert_eq!(metric(&m, &format!("chimera_pnfs_ds_layouts_held{{ds=\"ds{drained}\"}}")), Some(0.0));
    assert_eq!(
        ds_client(a0, l0.mirrors[0].uid, l0.mirrors[0].gid).write(&l0.mirrors[0].fh, 0, b"late", 2).unwrap_err(),
        pnfs::client3::CtlError::Status(NFS3ERR_ACCES),
        "the recalled (fenced) layout no longer writes"
    );
    assert_eq!(v.layoutget(&f2, 4, RW, 0, u64::MAX, 0, &o2).unwrap_err(), p::NFS4ERR_LAYOUTUNAVAILABLE, "no layout on a draining DS");
    assert_eq!(v.read(&f2, &o2, 0, 4096).unwrap(), data, "drained data readable through the MDS");
    let drained_dev = l0.mirrors[0].deviceid;
    for i in 0..4 {
        let (o, f) = v.open(&["m"], &format!("post-drain{i}"), SHARE_BOTH);
        for k in 0..3 {
            let l = v.layoutget(&f, 4, RW, k * SU, u64::MAX, 0, &o).unwrap();
            assert_ne!(l.mirrors[0].deviceid, drained_dev, "no new layouts on the draining DS");
        }
    }
}

/// Proves I/O through the MDS (a client without a layout): WRITE through
/// the MDS lands in the data file on the DS (read back as root), READ
/// returns it; with a single copy whose DS is down the READ is a clear
/// NFS4ERR_IO (never zeros); REMOVE of the open file keeps its data file
/// (the open still reads it through the MDS) and the CLOSE removes it from
/// the DS (asynchronously; polled with a deadline); truncation resizes it.
#[test]
fn mds_through_io_and_single_copy_failure() {
    let mut c = cluster(3, 3, json!({ "stripe_width": 1 }));
    let mut v = V4::connect(mds_addr(&c), b"mdsio");
    let (open, fh) = v.open(&["m"], "through", SHARE_BOTH);
    let data = pattern(5, 0, 100_000);
    assert_eq!(v.write(&fh, &open, 0, &data), Ok(100_000));
    assert_eq!(v.size(&fh), 100_000);
    assert_eq!(v.read(&fh, &open, 0, 100_000).unwrap(), data);
    let vfh = vfs::FileHandle::from_bytes(&fh).unwrap();
    let placement = c.pnfs().placement_of(&vfh).expect("placed");
    assert_eq!(placement.len(), 1);
    let (ds_name, dfh) = placement[0].clone();
    let idx: usize = ds_name.trim_start_matches("ds").parse().unwrap();
    let addr = ds_addr(c.ds[idx].as_ref().unwrap());
    let mut back = Vec::new();
    ds_client(addr, 0, 0).read(&dfh, 0, 100_000, &mut back).unwrap();
    assert!(back == data, "the data file on {ds_name} holds what went through the MDS");
    // Truncate through the MDS: the data file shrinks too.
    let mut r = v.call(&[putfh(&fh), raw(p::OP_SETATTR, W::default().sid(&open).u32(1).u32(1 << 4).opaque(&10u64.to_be_bytes()))]);
    r.ok(p::OP_PUTFH);
    r.ok(p::OP_SETATTR);
    assert_eq!(ds_client(addr, 0, 0).getattr(&dfh).unwrap().size, 10, "data file truncated");
    // Remove: the data file goes away on the DS.
    let mut r = v.call(&[raw(p::OP_PUTROOTFH, W::default()), raw(p::OP_LOOKUP, W::default().opaque(b"m")), raw(p::OP_REMOVE, W::default().opaque(b"through"))]);
    r.ok(p::OP_PUTROOTFH);
    r.ok(p::OP_LOOKUP);
    r.ok(p::OP_REMOVE);
    // Still open: the data file stays and the open reads it.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ds_client(addr, 0, 0).getattr(&dfh).expect("data file kept while open").size, 10);
    assert_eq!(v.read(&fh, &open, 0, 100).unwrap(), data[..10]);
    assert_eq!(v.close(&fh, &open), 0, "CLOSE after REMOVE is OK");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ds_client(addr, 0, 0).getattr(&dfh) {
            Err(pnfs::client3::CtlError::Status(s)) if s == 70 || s == 2 => break, // STALE / NOENT
            r => assert!(Instant::now() < deadline, "data file still on the DS: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // A single copy on a DS that is down: NFS4ERR_IO, not zeros.
    let (o2, f2) = v.open(&["m"], "single", SHARE_BOTH);
    assert_eq!(v.write(&f2, &o2, 0, &data[..5000]), Ok(5000));
    let v2 = vfs::FileHandle::from_bytes(&f2).unwrap();
    let (n2, _) = c.pnfs().placement_of(&v2).unwrap()[0].clone();
    let i2: usize = n2.trim_start_matches("ds").parse().unwrap();
    c.ds[i2].take().unwrap().shutdown();
    assert_eq!(v.read(&f2, &o2, 0, 5000), Err(p::NFS4ERR_IO));
    assert_eq!(v.write(&f2, &o2, 0, b"x"), Err(p::NFS4ERR_IO));
    let m = metrics(&c);
    assert_eq!(metric(&m, "chimera_pnfs_mds_io_failures_total{op=\"read\"}"), Some(1.0));
    assert_eq!(metric(&m, "chimera_pnfs_mds_io_failures_total{op=\"write\"}"), Some(1.0));
    let (_, cl) = admin(&c, "GET", "/api/v1/cluster", None);
    let d = cl["pnfs"]["dataServers"].as_array().unwrap().iter().find(|d| d["name"] == n2.as_str()).unwrap().clone();
    assert_eq!(d["healthy"], false, "a failed control call marks the DS unhealthy: {d}");
}

/// Proves mirrors keep data available: with mirrors = 2, after one DS of a
/// file stops, READ through the MDS still returns every byte from the
/// surviving copy, and a new READ layout names only the survivor.
#[test]
fn mirror_survives_one_ds_down() {
    let mut c = cluster(3, 3, json!({ "mirrors": 2, "stripe_width": 2 }));
    let mut v = V4::connect(mds_addr(&c), b"survive");
    let (open, fh) = v.open(&["m"], "m2", SHARE_BOTH);
    let data = pattern(6, 0, 3 * SU as usize);
    assert_eq!(v.write(&fh, &open, 0, &data[..SU as usize]), Ok(SU as u32));
    assert_eq!(v.write(&fh, &open, SU, &data[SU as usize..2 * SU as usize]), Ok(SU as u32));
    assert_eq!(v.write(&fh, &open, 2 * SU, &data[2 * SU as usize..]), Ok(SU as u32));
    let vfh = vfs::FileHandle::from_bytes(&fh).unwrap();
    let pl = c.pnfs().placement_of(&vfh).unwrap();
    assert_eq!(pl.len(), 2);
    let (dead, _) = pl[0].clone();
    let di: usize = dead.trim_start_matches("ds").parse().unwrap();
    let dead_addr = ds_addr(c.ds[di].as_ref().unwrap());
    c.ds[di].take().unwrap().shutdown();
    assert_eq!(v.read(&fh, &open, 0, 3 * SU as u32).unwrap(), data, "every byte from the surviving copy");
    let l = v.layoutget(&fh, 4, READ, 0, SU, 0, &open).expect("READ layout");
    assert_eq!(l.mirrors.len(), 1, "only the surviving mirror");
    assert_ne!(v.ds_of(&l.mirrors[0].deviceid), dead_addr);
}

/// Proves I/O through the MDS does not block its core (the call parks while
/// a pnfs-io worker waits on the data server): with one core and the only
/// data server stalled, a READ through the MDS waits, while another
/// client's GETATTR on the same core is answered at once; when the data
/// server resumes, the READ returns every byte.
#[test]
fn mds_io_parks_instead_of_blocking_the_core() {
    use std::sync::atomic::Ordering;
    let ds = start_ds();
    let r = relay(ds_addr(&ds));
    let list = json!([{ "name": "ds0", "uaddr": r.addr.to_string() }]);
    let c = cluster(0, 0, json!({ "data_servers": list, "ds_timeout_ms": 10000 }));
    let mut a = V4::connect(mds_addr(&c), b"parked-a");
    let mut b = V4::connect(mds_addr(&c), b"parked-b");
    let (open, fh) = a.open(&["m"], "slow", SHARE_BOTH);
    let data = pattern(9, 0, 200_000);
    assert_eq!(a.write(&fh, &open, 0, &data), Ok(200_000));
    r.paused.store(true, Ordering::SeqCst);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let t = Instant::now();
            (a.read(&fh, &open, 0, 200_000), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        // The READ is parked on the only core; GETATTR still answers.
        let t = Instant::now();
        assert_eq!(b.size(&fh), 200_000);
        let took = t.elapsed();
        // Blocking, the core would answer only after the 2 s the DS stalls.
        assert!(took < Duration::from_millis(500), "GETATTR took {took:?} while a READ waited on the DS");
        assert!(!reader.is_finished(), "the READ waits for the stalled data server");
        std::thread::sleep(Duration::from_millis(1700));
        r.paused.store(false, Ordering::SeqCst);
        let (got, waited) = reader.join().unwrap();
        assert!(got.as_ref().is_ok_and(|g| *g == data), "every byte after the DS resumed");
        assert!(waited >= Duration::from_millis(1900), "the READ really waited ({waited:?})");
    });
    // NFSv3 through the MDS parks the same way: WRITE, COMMIT, READ back.
    let mut v3 = ds_client(mds_addr(&c), 0, 0);
    let more = pattern(3, 0, 70_000);
    v3.write(&fh, 50_000, &more, 0).expect("NFSv3 WRITE through the MDS");
    v3.commit(&fh).expect("NFSv3 COMMIT through the MDS");
    let mut back = Vec::new();
    v3.read(&fh, 0, 200_000, &mut back).expect("NFSv3 READ through the MDS");
    let mut want = data.clone();
    want[50_000..120_000].copy_from_slice(&more);
    assert!(back == want, "NFSv3 READ through the MDS returns what was written");
    drop(c);
    ds.shutdown();
}

/// Proves the pNFS config keys are parsed with their limits and that a bad
/// value is an error naming its key path (CONFIG.md).
#[test]
fn pnfs_config_keys_are_checked() {
    use chimerad::config::Config;
    let parse = |pnfs: serde_json::Value| {
        Config::parse(
            &json!({
                "server": { "role": "mds", "pnfs": pnfs },
                "mounts": { "m": { "module": "memfs" } },
                "admin": { "token": "t", "tls": false }
            })
            .to_string(),
        )
    };
    let ok = parse(json!({ "enabled": true, "stripe_width": 2, "synthetic_uid": 5000, "synthetic_gid": 6000,
                           "layouts_per_client_max": 10, "layouts_max": 100, "ds_timeout_ms": 500, "remove_queue_max": 8,
                           "recall_timeout_ms": 2000, "orphan_sweep_interval_ms": 0,
                           "data_servers": [ { "name": "a", "uaddr": "10.0.0.1" }, { "uaddr": "10.0.0.2:2050" } ] }))
    .unwrap();
    let p = &ok.server.pnfs;
    assert_eq!((p.stripe_width, p.synthetic_uid, p.synthetic_gid, p.ds_timeout_ms, p.recall_timeout_ms), (2, 5000, 6000, 500, 2000));
    assert_eq!(p.orphan_sweep_interval_ms, 0, "0 turns the orphan sweep off");
    assert_eq!(p.data_servers[0].name.as_deref(), Some("a"));
    assert_eq!(p.data_servers[1].name, None);
    for (bad, path) in [
        (json!({ "stripe_width": 1025 }), "server.pnfs.stripe_width"),
        (json!({ "synthetic_uid": 0 }), "server.pnfs.synthetic_uid"),
        (json!({ "ds_timeout_ms": 5 }), "server.pnfs.ds_timeout_ms"),
        (json!({ "layouts_max": 0 }), "server.pnfs.layouts_max"),
        (json!({ "recall_timeout_ms": 999 }), "server.pnfs.recall_timeout_ms"),
        (json!({ "recall_timeout_ms": 600_001 }), "server.pnfs.recall_timeout_ms"),
        (json!({ "orphan_sweep_interval_ms": 500 }), "server.pnfs.orphan_sweep_interval_ms"),
        (json!({ "orphan_sweep_interval_ms": 604_800_001u64 }), "server.pnfs.orphan_sweep_interval_ms"),
        (json!({ "data_servers": [ { "name": "", "uaddr": "h" } ] }), "server.pnfs.data_servers[0].name"),
        (json!({ "stripes": 2 }), "server.pnfs.stripes"),
    ] {
        let e = parse(bad.clone()).unwrap_err();
        assert_eq!(e.path, path, "{bad} -> {e:?}");
    }
}

/// Proves deleting a volume through the admin API also removes the data
/// files of the pNFS files inside it from the DSes (no REMOVE names them:
/// the whole tree goes at once) once they are closed, while a file outside
/// the volume keeps its data file.
#[test]
fn volume_delete_removes_its_data_files() {
    let c = cluster(3, 3, json!({ "stripe_width": 1 }));
    let (code, vol) = admin(&c, "POST", "/api/v1/volumes", Some(&json!({ "name": "pv-1", "capacityBytes": 16 << 20 })));
    assert!(code == 200 || code == 201, "create volume: {code} {vol}");
    let id = vol["id"].as_str().unwrap().to_string();
    let mut v = V4::connect(mds_addr(&c), b"voldel");
    let data = pattern(7, 0, 20_000);
    let mut inside = Vec::new();
    let mut opens = Vec::new();
    for name in ["a", "b", "c"] {
        let (open, fh) = v.open(&["m", "volumes", &id], name, SHARE_BOTH);
        assert_eq!(v.write(&fh, &open, 0, &data), Ok(20_000));
        let vfh = vfs::FileHandle::from_bytes(&fh).unwrap();
        inside.push(c.pnfs().placement_of(&vfh).expect("placed")[0].clone());
        opens.push((open, fh));
    }
    let (open, keep) = v.open(&["m"], "outside", SHARE_BOTH);
    assert_eq!(v.write(&keep, &open, 0, &data), Ok(20_000));
    let kept = c.pnfs().placement_of(&vfs::FileHandle::from_bytes(&keep).unwrap()).expect("placed")[0].clone();

    let (code, body) = admin(&c, "DELETE", &format!("/api/v1/volumes/{id}"), None);
    assert!(code == 200 || code == 204, "delete volume: {code} {body}");
    // Still open: the files live on, nameless, with their data files.
    let (open, fh) = &opens[0];
    assert_eq!(v.read(fh, open, 0, 20_000).unwrap(), data);
    for (open, fh) in &opens {
        assert_eq!(v.close(fh, open), 0);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (ds_name, dfh) in &inside {
        let idx: usize = ds_name.trim_start_matches("ds").parse().unwrap();
        let addr = ds_addr(c.ds[idx].as_ref().unwrap());
        loop {
            match ds_client(addr, 0, 0).getattr(dfh) {
                Err(pnfs::client3::CtlError::Status(s)) if s == 70 || s == 2 => break, // STALE / NOENT
                r => assert!(Instant::now() < deadline, "data file of a deleted volume still on {ds_name}: {r:?}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let idx: usize = kept.0.trim_start_matches("ds").parse().unwrap();
    let addr = ds_addr(c.ds[idx].as_ref().unwrap());
    assert_eq!(ds_client(addr, 0, 0).getattr(&kept.1).unwrap().size, 20_000, "a file outside the volume keeps its data");
}

/// The copy on `ds{i}` of the file as the MDS's admin API counts it:
/// stale copies per DS (`staleCopies`).
fn stale_copies(c: &Cluster, i: usize) -> u64 {
    let (st, body) = admin(c, "GET", "/api/v1/cluster", None);
    assert_eq!(st, 200, "{body}");
    let ds = body["pnfs"]["dataServers"].as_array().expect("pnfs.dataServers");
    let d = ds.iter().find(|d| d["name"] == format!("ds{i}")).expect("listed");
    d["staleCopies"].as_u64().expect("staleCopies is a number")
}

/// The whole data file `dfh` on `addr`, read as root.
fn data_file(addr: std::net::SocketAddr, dfh: &[u8], len: u64) -> Vec<u8> {
    let mut c = ds_client(addr, 0, 0);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while (out.len() as u64) < len {
        let eof = c.read(dfh, out.len() as u64, 256 << 10, &mut buf).unwrap();
        out.extend_from_slice(&buf);
        if eof || buf.is_empty() {
            break;
        }
    }
    out.resize(len as usize, 0); // a hole at the end reads as zeros
    out
}

/// Proves a stale mirror copy comes back (what a rolling restart needs:
/// otherwise the second DS to restart takes the last good copy with it).
/// mirrors = 2 on two DSes: draining ds0 makes the next RW layout leave it
/// out, so its copy goes stale (admin `staleCopies` 1) and misses writes
/// through the layout and through the MDS, including one that extends the
/// file. Undrained, the MDS copies the good mirror over it while a second
/// client keeps writing through the MDS: the counter goes back to 0, both
/// data files end byte-identical to what was written (the racing writes
/// included), a new RW layout names both mirrors again, the resync is
/// counted on /metrics, and with ds1 stopped every byte reads back from
/// ds0 alone.
#[test]
fn stale_mirror_copy_is_resynced() {
    const MIB: u64 = 1 << 20;
    let mut c = cluster(2, 2, json!({ "mirrors": 2 }));
    let mut v = V4::connect(mds_addr(&c), b"resync");
    let (open, fh) = v.open(&["m"], "mirrored", SHARE_BOTH);
    // Big enough that copying it takes a while: the racing writer below
    // gets writes in while the resync copies.
    const BASE: u64 = 12 * MIB;
    let mut model = pattern(1, 0, BASE as usize);
    for off in (0..BASE).step_by(256 << 10) {
        assert_eq!(v.write(&fh, &open, off, &model[off as usize..(off + (256 << 10)) as usize]), Ok(256 << 10));
    }
    let vfh = vfs::FileHandle::from_bytes(&fh).unwrap();
    let place = c.pnfs().placement_of(&vfh).expect("placed");
    assert_eq!(place.len(), 2, "a copy on each DS");
    let dfh = |name: &str| place.iter().find(|(n, _)| n == name).expect("a copy on each DS").1.clone();
    let entry = |i: usize, draining: bool| json!({ "name": format!("ds{i}"), "address": ds_addr(c.ds[i].as_ref().unwrap()).to_string(), "draining": draining });
    let (st, body) = admin(&c, "PUT", "/api/v1/dataservers", Some(&json!({ "dataServers": [entry(0, true), entry(1, false)] })));
    assert_eq!(st, 200, "{body}");
    let l = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("RW layout on the one active DS");
    assert_eq!(l.mirrors.len(), 1, "the draining DS is left out");
    assert_eq!(v.ds_of(&l.mirrors[0].deviceid), ds_addr(c.ds[1].as_ref().unwrap()));
    assert_eq!(stale_copies(&c, 0), 1, "ds0's copy missed the writes to come: stale");
    let (_, doc) = admin(&c, "GET", "/api/v1/cluster", None);
    assert_eq!(doc["graceRemainingMs"], 0, "an MDS with grace_time_s 0 is out of grace: {doc}");
    // Writes ds0 misses: through the layout, and through the MDS (one
    // extending the file by half a MiB).
    let a1 = ds_addr(c.ds[1].as_ref().unwrap());
    let w = pattern(2, 0, MIB as usize);
    ds_client(a1, l.mirrors[0].uid, l.mirrors[0].gid).write(&l.mirrors[0].fh, 0, &w, 2).unwrap();
    model[..MIB as usize].copy_from_slice(&w);
    assert_eq!(v.layoutcommit(&fh, &l.stateid, MIB - 1), Ok(None));
    let ext = pattern(3, BASE, (MIB / 2) as usize);
    for (k, chunk) in ext.chunks(64 << 10).enumerate() {
        assert_eq!(v.write(&fh, &open, BASE + k as u64 * (64 << 10), chunk), Ok(chunk.len() as u32));
    }
    model.extend_from_slice(&ext);
    let size = model.len() as u64;
    assert_eq!(v.size(&fh), size);
    assert_ne!(data_file(entry_addr(&c, 0), &dfh("ds0"), size), model, "ds0's copy is behind");
    // A second client writes through the MDS while the resync runs.
    let mds = mds_addr(&c);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut w2 = V4::connect(mds, b"resync-racer");
            let (o2, f2) = w2.open(&["m"], "mirrored", SHARE_BOTH);
            let mut done: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut k = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || done.len() < 8 {
                // Offsets spread over the file, 16 KiB each, a new pattern each round.
                let off = (k * 7919 * 4096) % (size - (16 << 10));
                let d = pattern((k % 200) as u8 + 10, off, 16 << 10);
                assert_eq!(w2.write(&f2, &o2, off, &d), Ok(16 << 10), "a write through the MDS during the resync");
                done.push((off, d));
                k += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            done
        })
    };
    let (st, body) = admin(&c, "PUT", "/api/v1/dataservers", Some(&json!({ "dataServers": [entry(0, false), entry(1, false)] })));
    assert_eq!(st, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while stale_copies(&c, 0) != 0 {
        assert!(Instant::now() < deadline, "ds0's copy not resynced within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300)); // the racer writes on after the resync too
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for (off, d) in writer.join().expect("the racing writer") {
        model[off as usize..off as usize + d.len()].copy_from_slice(&d);
    }
    let copy0 = data_file(entry_addr(&c, 0), &dfh("ds0"), size);
    let copy1 = data_file(a1, &dfh("ds1"), size);
    assert!(copy1 == model, "ds1's copy holds every write");
    assert!(copy0 == model, "ds0's resynced copy holds every write, the racing ones included");
    let m = metrics(&c);
    assert!(metric(&m, "chimera_pnfs_resyncs_total").unwrap() >= 1.0, "resync counted");
    assert!(metric(&m, "chimera_pnfs_resync_bytes_total").unwrap() >= size as f64 * 0.9, "the copy was written");
    assert_eq!(metric(&m, "chimera_pnfs_ds_stale_copies{ds=\"ds0\"}"), Some(0.0));
    let l2 = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("RW layout after the resync");
    assert_eq!(l2.mirrors.len(), 2, "both mirrors again");
    // The good copy's DS stops: every byte comes from the resynced copy.
    c.ds[1].take().unwrap().shutdown();
    let mut back = Vec::new();
    for off in (0..size).step_by(256 << 10) {
        back.extend(v.read(&fh, &open, off, (256 << 10).min(size - off) as u32).expect("READ from the resynced copy"));
    }
    assert!(back == model, "read back from ds0 alone");
}

fn entry_addr(c: &Cluster, i: usize) -> std::net::SocketAddr {
    ds_addr(c.ds[i].as_ref().unwrap())
}

/// Proves the orphan sweep (`server.pnfs.orphan_sweep_interval_ms`): on a
/// DS's data directory, a data file named after an MDS file that no longer
/// exists (what a removal that never reached the DS, or an MDS stopped with
/// removals queued, leaves) is removed within a sweep and counted on
/// /metrics; the data file of a live placed file, one named after a live
/// file that is not placed (an MDS stopped between creating it and
/// recording the placement: the next placement reuses it), and a file whose
/// name is not a handle all stay.
#[test]
fn orphaned_data_files_are_swept() {
    let c = cluster(1, 1, json!({ "orphan_sweep_interval_ms": 1000 }));
    let mut v = V4::connect(mds_addr(&c), b"orphans");
    let data = pattern(9, 0, 20_000);
    let (open, live) = v.open(&["m"], "live", SHARE_BOTH);
    assert_eq!(v.write(&live, &open, 0, &data), Ok(20_000));
    let (_, live_dfh) = c.pnfs().placement_of(&vfs::FileHandle::from_bytes(&live).unwrap()).expect("placed")[0].clone();
    let (open2, unplaced) = v.open(&["m"], "unplaced", SHARE_BOTH);
    let (open3, gone) = v.open(&["m"], "gone", SHARE_BOTH);
    assert_eq!(v.close(&gone, &open3), 0);
    let mut r = v.call(&[raw(p::OP_PUTROOTFH, W::default()), raw(p::OP_LOOKUP, W::default().opaque(b"m")), raw(p::OP_REMOVE, W::default().opaque(b"gone"))]);
    r.ok(p::OP_PUTROOTFH);
    r.ok(p::OP_LOOKUP);
    r.ok(p::OP_REMOVE);

    // The DS's data directory, as the MDS finds it (its first mount).
    let addr = ds_addr(c.ds[0].as_ref().unwrap());
    let mut d = ds_client(addr, 0, 0);
    let top = vfs::router::PSEUDO_ROOT.to_bytes().to_vec();
    let first = d.first_entry(&top).unwrap().expect("the DS has a mount");
    let dir = d.lookup(&top, &first).unwrap();
    let name_of = |fh: &[u8]| pnfs::data_file_name(&vfs::FileHandle::from_bytes(fh).unwrap());
    let attrs = pnfs::client3::Sattr { mode: Some(0o600), uid: None, gid: None, size: None };
    for name in [name_of(&gone), name_of(&unplaced), "notes.txt".to_string()] {
        let h = d.create(&dir, name.as_bytes(), &attrs).unwrap();
        d.write(&h, 0, b"left behind", 2).unwrap();
    }
    let exists = |name: &str| ds_client(addr, 0, 0).lookup(&dir, name.as_bytes()).is_ok();
    let deadline = Instant::now() + Duration::from_secs(15);
    while exists(&name_of(&gone)) {
        assert!(Instant::now() < deadline, "the data file of a removed MDS file is still on the DS after 15 s of 1 s sweeps");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A sweep after the one that removed it: nothing else goes.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(exists(&name_of(&unplaced)), "a live file's data file stays, placed or not");
    assert!(exists("notes.txt"), "a name that is not a handle stays");
    assert_eq!(ds_client(addr, 0, 0).getattr(&live_dfh).unwrap().size, 20_000, "a placed file's data file stays");
    assert_eq!(v.read(&live, &open, 0, 20_000).unwrap(), data);
    assert_eq!(metric(&metrics(&c), "chimera_pnfs_orphan_data_files_removed_total"), Some(1.0));
    assert_eq!(v.close(&unplaced, &open2), 0);
}

/// Proves a layout is a handle too: an export rule change that leaves a
/// client read-write recalls nothing, while one that makes it read-only
/// recalls its RW layout; this client never returns it (no callback
/// service), so the MDS revokes it: the file is fenced and the layout's
/// synthetic uid is refused on the DS (NFS3ERR_ACCES) — a client whose
/// access was narrowed cannot keep writing through its layout.
#[test]
fn narrowed_access_recalls_layouts() {
    let c = cluster(1, 1, json!({ "recall_timeout_ms": 1000 }));
    let mut v = V4::connect(mds_addr(&c), b"narrowed");
    let (open, fh) = v.open(&["m"], "f", SHARE_BOTH);
    let l = v.layoutget(&fh, 4, RW, 0, u64::MAX, 0, &open).expect("RW layout");
    let m = &l.mirrors[0];
    let addr = v.ds_of(&m.deviceid);
    ds_client(addr, m.uid, m.gid).write(&m.fh, 0, b"allowed", 2).unwrap();
    let rule = |access: &str| json!({ "access": [{ "clients": "127.0.0.1", "access_type": access, "squash": "no_root_squash" }] });
    let recalled = |c: &Cluster| metric(&metrics(c), "chimera_pnfs_layouts_recalled_total").unwrap_or(0.0);

    let (code, body) = admin(&c, "PUT", "/api/v1/access/m", Some(&rule("rw")));
    assert_eq!(code, 200, "{body}");
    assert_eq!(recalled(&c), 0.0, "a change that keeps the client read-write recalls nothing");
    ds_client(addr, m.uid, m.gid).write(&m.fh, 0, b"still ok", 2).unwrap();
    v.layoutcommit(&fh, &l.stateid, 7).expect("LAYOUTCOMMIT");

    let (code, body) = admin(&c, "PUT", "/api/v1/access/m", Some(&rule("ro")));
    assert_eq!(code, 200, "{body}");
    assert_eq!(recalled(&c), 1.0, "read-only now: its RW layout is recalled");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ds_client(addr, m.uid, m.gid).write(&m.fh, 0, b"after ro", 2) {
            Err(pnfs::client3::CtlError::Status(NFS3ERR_ACCES)) => break,
            r => assert!(Instant::now() < deadline, "the narrowed client still writes through its layout after 10 s: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = metrics(&c);
    assert_eq!(metric(&text, "chimera_pnfs_fences_total"), Some(1.0));
    assert_eq!(v.read(&fh, &open, 0, 8).unwrap(), b"still ok", "reads through the MDS go on");
}
