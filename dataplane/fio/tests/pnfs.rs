//! The engine in pNFS mode against an in-process metadata server and three
//! data servers (each a chimerad on its own 127.0.0.1 port): I/O goes
//! straight to the data servers the flex-files layouts name — striped over
//! all three, or mirrored on two — reads verify, the data is on the data
//! servers (read back from each with its own NFSv3 connection), nothing goes
//! through the MDS, and a data server killed under a mirrors=2 layout
//! leaves every I/O completing with the right data.

use chimerad::config::Config as ServerConfig;
use chimerad::serve::{self, Running};
use chimera_fio::{Config, Engine, Op};
use client::flexfiles::IoMode;
use client::nfs3::Nfs3;
use client::nfs4::Nfs41;
use client::{Auth, Limits};
use serde_json::{json, Value};
mod common;

use common::{drain, pattern};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Cluster {
    mds: Option<Running>,
    ds: Vec<Option<Running>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(m) = self.mds.take() {
            m.shutdown();
        }
        for d in self.ds.iter_mut().filter_map(Option::take) {
            d.shutdown();
        }
    }
}

/// A data server on `port` (0: any): memfs, or diskfs on the image `img`
/// (formatted when `initialize`), which keeps its data files across a
/// restart.
fn start_ds(port: u16, img: Option<(&Path, bool)>) -> Running {
    let mut v = json!({
        "common": { "log_level": "warn" },
        "server": { "role": "ds", "bind": "127.0.0.1", "threads": 1, "nfs_port": port, "mount_port": 0, "portmap_port": 0 },
        "metrics": { "enabled": false }
    });
    if let Some((img, initialize)) = img {
        v["server"]["vfs"] = json!({ "diskfs": { "config": { "initialize": initialize, "devices": [{ "type": "io_uring", "path": img.to_str().unwrap() }] } } });
        v["mounts"] = json!({ "ds": { "module": "diskfs", "path": "/" } });
    }
    serve::start(&ServerConfig::parse(&v.to_string()).unwrap()).expect("start DS")
}

fn cluster(pnfs: Value) -> Cluster {
    cluster_on(pnfs, &[None, None, None])
}

fn cluster_on(pnfs: Value, imgs: &[Option<&Path>]) -> Cluster {
    let (ds, pn) = data_servers(pnfs, imgs);
    Cluster { mds: Some(mds_on_memfs(&pn, 0)), ds }
}

/// The MDS on memfs on `port` (0: any): its namespace, placements and
/// client records go with it when it stops.
fn mds_on_memfs(pn: &Value, port: u16) -> Running {
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "role": "mds", "bind": "127.0.0.1", "threads": 1, "nfs_port": port, "mount_port": 0, "portmap_port": 0,
                    "grace_time_s": 0, "pnfs": pn },
        "mounts": { "m": { "module": "memfs", "capacity_bytes": "256M" } },
        "exports": { "/m": { "path": "/m" } },
        "admin": { "enabled": false },
        "metrics": { "enabled": false }
    });
    serve::start(&ServerConfig::parse(&v.to_string()).unwrap()).expect("start MDS")
}

/// This test process's scratch directory `name`, empty.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fio-pnfs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A 64 MiB image file `name`.img in `dir`, zeroed.
fn image(dir: &Path, name: &str) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    img
}

/// The three data servers each on diskfs over an image of its own in
/// `dir` (kept across their restarts), and an MDS placing `mirrors` copies.
fn diskfs_cluster(dir: &Path, mirrors: u32) -> (Cluster, Vec<PathBuf>) {
    let imgs: Vec<PathBuf> = (0..3).map(|i| image(dir, &format!("ds{i}"))).collect();
    let c = cluster_on(json!({ "mirrors": mirrors }), &imgs.iter().map(|p| Some(p.as_path())).collect::<Vec<_>>());
    (c, imgs)
}

/// The MDS config on diskfs (the image `img`, formatted when
/// `initialize`) on `port`, so that it can restart keeping its namespace,
/// its placements and its NFSv4.1 client records.
fn mds_on_diskfs(pn: &Value, img: &Path, initialize: bool, port: u16, grace_s: u32) -> Running {
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "role": "mds", "bind": "127.0.0.1", "threads": 1, "nfs_port": port, "mount_port": 0, "portmap_port": 0,
                    "grace_time_s": grace_s, "pnfs": pn,
                    "vfs": { "diskfs": { "config": { "initialize": initialize, "devices": [{ "type": "io_uring", "path": img.to_str().unwrap() }] } } } },
        "mounts": { "m": { "module": "diskfs", "path": "/" } },
        "exports": { "/m": { "path": "/m" } },
        "admin": { "enabled": false },
        "metrics": { "enabled": false }
    });
    serve::start(&ServerConfig::parse(&v.to_string()).unwrap()).expect("start the MDS on diskfs")
}

/// Three data servers (memfs, or diskfs on `imgs`) and the MDS's pnfs
/// section naming them (`pnfs` overrides its keys).
fn data_servers(pnfs: Value, imgs: &[Option<&Path>]) -> (Vec<Option<Running>>, Value) {
    let ds: Vec<Option<Running>> = imgs.iter().map(|img| Some(start_ds(0, img.map(|i| (i, true))))).collect();
    let list: Vec<Value> = ds
        .iter()
        .enumerate()
        .map(|(i, d)| json!({ "name": format!("ds{i}"), "uaddr": d.as_ref().unwrap().nfs_addr.unwrap().to_string() }))
        .collect();
    let mut pn = json!({ "enabled": true, "stripe_unit_bytes": "64K", "data_servers": list, "ds_timeout_ms": 1000 });
    for (k, v) in pnfs.as_object().unwrap() {
        pn[k] = v.clone();
    }
    (ds, pn)
}

fn engine(c: &Cluster, depth: usize) -> Engine {
    engine_with(c, depth, chimera_fio::RETRY_S_DEFAULT)
}

fn engine_with(c: &Cluster, depth: usize, retry_s: u32) -> Engine {
    Engine::connect(engine_cfg(c, depth, retry_s)).expect("pNFS engine")
}

fn engine_cfg(c: &Cluster, depth: usize, retry_s: u32) -> Config {
    Config { retry_s, ..common::config(c.mds.as_ref().unwrap(), "/m", depth, true) }
}

const BS: usize = 4096;

/// Write `blocks` blocks (a permutation, `depth` in flight) then read them
/// all back and compare; every result must be the full block.
fn write_read_verify(e: &mut Engine, f: u32, seed: u64, blocks: u64, depth: usize) {
    let order: Vec<u64> = (0..blocks).map(|i| (i * 37) % blocks).collect();
    let mut bufs: Vec<Vec<u8>> = order.iter().map(|&b| pattern(seed, b * BS as u64, BS)).collect();
    let mut out = vec![(0u64, 0i64); depth];
    let (mut next, mut done) = (0, 0);
    while done < order.len() {
        while next < order.len() && e.in_flight() < depth {
            unsafe { e.queue(f, Op::Write, order[next] * BS as u64, bufs[next].as_mut_ptr(), BS, next as u64) }.unwrap();
            next += 1;
        }
        e.commit();
        let n = e.reap(1, Some(Duration::from_secs(10)), &mut out);
        assert!(n > 0, "no completion within 10 s");
        for &(tag, res) in &out[..n] {
            assert_eq!(res, BS as i64, "write {tag}");
        }
        done += n;
    }
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 7777) }.unwrap();
    assert_eq!(drain(e), vec![(7777, 0)], "fsync: COMMIT to the data servers + LAYOUTCOMMIT");
    let mut rbufs: Vec<Vec<u8>> = (0..blocks).map(|_| vec![0u8; BS]).collect();
    let mut next = 0u64;
    let mut done = 0;
    while done < blocks as usize {
        while next < blocks && e.in_flight() < depth {
            unsafe { e.queue(f, Op::Read, next * BS as u64, rbufs[next as usize].as_mut_ptr(), BS, next) }.unwrap();
            next += 1;
        }
        e.commit();
        let n = e.reap(1, Some(Duration::from_secs(10)), &mut out);
        assert!(n > 0, "no read completion within 10 s");
        for &(tag, res) in &out[..n] {
            assert_eq!(res, BS as i64, "read {tag}");
        }
        done += n;
    }
    for b in 0..blocks {
        assert!(rbufs[b as usize] == pattern(seed, b * BS as u64, BS), "block {b} reads back");
    }
}

/// The data of [0, len) of `name` as each mirror's data server holds it,
/// read with a fresh NFSv4.1 session (for the layout) and NFSv3 to the DS.
fn data_on_each_ds(c: &Cluster, name: &str, offset: u64, len: u32) -> Vec<(String, Vec<u8>)> {
    let mds = c.mds.as_ref().unwrap().nfs_addr.unwrap().to_string();
    let lim = Limits { timeout: Duration::from_secs(10), ..Limits::default() };
    let mut v = Nfs41::connect(&mds, &Auth::sys(0, 0), lim, b"checker").unwrap();
    let o = v.open("/m", name, 1, None).unwrap();
    let seg = v.layoutget(&o.fh, &o.stateid, IoMode::Read, offset, len as u64).unwrap();
    let mut out = Vec::new();
    for m in &seg.mirrors {
        let addr = v.getdeviceinfo(&m.deviceid).unwrap().tcp_addrs[0].clone();
        let mut ds = Nfs3::connect(&addr, &Auth::sys(m.uid, m.gid), lim).unwrap();
        let mut data = Vec::new();
        ds.read(&m.fh, offset, len, &mut data).unwrap();
        out.push((addr, data));
    }
    out
}

#[test]
fn striped_io_goes_to_every_data_server_and_verifies() {
    let c = cluster(json!({ "mirrors": 1 }));
    let depth = 16;
    let mut e = engine(&c, depth);
    let f = e.open("striped.0", true).unwrap();
    // 1 MiB over 64 KiB stripe units: 16 segments over the 3 DSes.
    write_read_verify(&mut e, f, 1, 256, depth);
    assert_eq!(e.through_mds(), 0, "no I/O went through the MDS");
    assert_eq!(e.errors(), 0);
    e.close(f).unwrap();
    // Each stripe unit's bytes are on the DS its layout names; three
    // neighbouring units are on three different DSes.
    let mut addrs = Vec::new();
    for unit in 0..3u64 {
        let on = data_on_each_ds(&c, "striped.0", unit * 65536, 65536);
        assert_eq!(on.len(), 1);
        assert!(on[0].1 == pattern(1, unit * 65536, 65536), "unit {unit} is on its data server");
        addrs.push(on[0].0.clone());
    }
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 3, "three units on three data servers");
}

#[test]
fn mirrored_writes_reach_both_copies_and_survive_a_data_server_kill() {
    let mut c = cluster(json!({ "mirrors": 2 }));
    let depth = 8;
    let mut e = engine(&c, depth);
    let f = e.open("mirrored.0", true).unwrap();
    write_read_verify(&mut e, f, 2, 64, depth);
    assert_eq!(e.through_mds(), 0);
    // Both copies hold the bytes.
    let on = data_on_each_ds(&c, "mirrored.0", 0, 64 * BS as u32);
    assert_eq!(on.len(), 2, "two mirrors");
    assert_ne!(on[0].0, on[1].0, "on two data servers");
    for (addr, data) in &on {
        assert!(*data == pattern(2, 0, 64 * BS), "the copy on {addr} is complete");
    }
    // Kill the first mirror's data server: writes and reads go on (the
    // engine reports it, takes a new layout without it) with no error.
    let victim = on[0].0.clone();
    let i = c.ds.iter().position(|d| d.as_ref().is_some_and(|d| d.nfs_addr.unwrap().to_string() == victim)).unwrap();
    c.ds[i].take().unwrap().shutdown();
    write_read_verify(&mut e, f, 3, 64, depth);
    assert_eq!(e.errors(), 0, "no I/O failed with a data server gone");
    // Reported with LAYOUTERROR (the session is NFSv4.2) and LAYOUTRETURN.
    let m = &c.mds.as_ref().unwrap().pnfs.as_ref().expect("pNFS").metrics;
    assert!(m.layouterrors.load(std::sync::atomic::Ordering::Relaxed) >= 1, "LAYOUTERROR reached the MDS");
    e.close(f).unwrap();
    // The surviving copy has the new data.
    let mut v = Nfs41::connect(
        &c.mds.as_ref().unwrap().nfs_addr.unwrap().to_string(),
        &Auth::sys(0, 0),
        Limits { timeout: Duration::from_secs(10), ..Limits::default() },
        b"after",
    )
    .unwrap();
    let o = v.open("/m", "mirrored.0", 1, None).unwrap();
    let mut data = Vec::new();
    v.read(&o, 0, (64 * BS) as u32, &mut data).unwrap();
    assert!(data == pattern(3, 0, 64 * BS), "the file reads back through the MDS after the kill");
}

#[test]
fn pnfs_errors_are_named() {
    let c = cluster(json!({}));
    let mut e = engine(&c, 4);
    let (errno, msg) = e.open("no/such/dir/f", true).unwrap_err();
    assert!(errno > 0 && msg.contains("OPEN of no/such/dir/f"), "{msg}");
    let (_, msg) = e.open("missing", false).unwrap_err();
    assert!(msg.contains("missing"), "{msg}");
    let bad = Config {
        server: c.mds.as_ref().unwrap().nfs_addr.unwrap().to_string(),
        export: "/m".into(),
        mount_port: 0,
        conns: 1,
        iodepth: 1,
        uid: 0,
        gid: 0,
        pnfs: true,
        busy_poll_us: 0,
        retry_s: chimera_fio::RETRY_S_DEFAULT,
        hold_mib: chimera_fio::HOLD_MIB_DEFAULT,
        rdma: false,
    };
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = l.local_addr().unwrap().to_string();
    drop(l);
    let err = Engine::connect(Config { server: dead.clone(), ..bad }).err().unwrap();
    assert!(err.contains("metadata server") && err.contains(&dead), "{err}");
}

/// One copy (mirrors=1) and a data server that restarts (on diskfs, so its
/// data files and handles survive): the engine reports the lost connection
/// as the data server failing, and the MDS marks it unhealthy but does not
/// mark the only copy stale (before, it did, and every later I/O of that
/// range failed with EIO for good, through the MDS too). A write queued
/// while the data server is away waits (`chimera_retry_s`) and completes
/// once it is back, with no error; what was COMMITted before the restart
/// reads back with it.
#[test]
fn a_single_copy_survives_its_data_server_restarting() {
    let dir = scratch("restart");
    let (mut c, imgs) = diskfs_cluster(&dir, 1);
    let mut e = engine(&c, 4);
    let f = e.open("restart.0", true).unwrap();
    let mut a = pattern(5, 0, BS);
    unsafe { e.queue(f, Op::Write, 0, a.as_mut_ptr(), BS, 1) }.unwrap();
    assert_eq!(drain(&mut e), vec![(1, BS as i64)]);
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 2) }.unwrap();
    assert_eq!(drain(&mut e), vec![(2, 0)]);
    // The data server of stripe unit 0, and a later unit on the same one.
    let ds_of = |c: &Cluster, unit: u64| data_on_each_ds(c, "restart.0", unit * 65536, 1)[0].0.clone();
    let victim = ds_of(&c, 0);
    let unit = (1..12).find(|&u| ds_of(&c, u) == victim).expect("a later unit on the same data server");
    let i = c.ds.iter().position(|d| d.as_ref().is_some_and(|d| d.nfs_addr.unwrap().to_string() == victim)).unwrap();
    let port = c.ds[i].as_ref().unwrap().nfs_addr.unwrap().port();
    c.ds[i].take().unwrap().shutdown();
    // A write to it while it is away, and it comes back 700 ms later.
    let mut b = pattern(6, unit * 65536, BS);
    unsafe { e.queue(f, Op::Write, unit * 65536, b.as_mut_ptr(), BS, 10) }.unwrap();
    let img = imgs[i].clone();
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        start_ds(port, Some((&img, false)))
    });
    let t0 = Instant::now();
    assert_eq!(drain(&mut e), vec![(10, BS as i64)], "the write waited for the data server");
    eprintln!("a write across a data-server restart completed after {:?}", t0.elapsed());
    c.ds[i] = Some(back.join().unwrap());
    assert_eq!(e.errors(), 0, "no I/O failed");
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 100) }.unwrap();
    assert_eq!(drain(&mut e), vec![(100, 0)]);
    for (off, want) in [(0, &a), (unit * 65536, &b)] {
        let mut got = vec![0u8; BS];
        unsafe { e.queue(f, Op::Read, off, got.as_mut_ptr(), BS, 200) }.unwrap();
        assert_eq!(drain(&mut e), vec![(200, BS as i64)], "read at {off}");
        assert!(got == *want, "the data at {off} after its data server restarted");
    }
    e.close(f).unwrap();
    // A data server that stays away: after chimera_retry_s, EIO.
    let mut e = engine_with(&c, 4, 1);
    let f = e.open("restart.0", false).unwrap();
    c.ds[i].take().unwrap().shutdown();
    let t0 = Instant::now();
    unsafe { e.queue(f, Op::Write, unit * 65536, b.as_mut_ptr(), BS, 300) }.unwrap();
    assert_eq!(drain(&mut e), vec![(300, -(libc::EIO as i64))]);
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(15), "gave up after {took:?}");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// UNSTABLE writes data servers answered and then lost by restarting
/// (diskfs logs their block maps only at COMMIT; all three restart): the
/// fsync's COMMIT, on a new connection, carries a new write verifier. The
/// engine sends the held copies again and COMMITs: the fsync succeeds and
/// the data reads back. With `chimera_hold_mib=0` the fsync fails with EIO
/// naming the data server instead of reporting the write durable (before,
/// it returned 0), and the block is indeed gone.
#[test]
fn unstable_writes_a_data_server_lost_are_resent_or_fail_the_fsync() {
    let dir = scratch("lost");
    let (mut c, imgs) = diskfs_cluster(&dir, 1);
    let mut kept = engine(&c, 4);
    let mut bare = Engine::connect(Config { hold_mib: 0, ..engine_cfg(&c, 4, chimera_fio::RETRY_S_DEFAULT) }).unwrap();
    let (fk, fb) = (kept.open("kept.0", true).unwrap(), bare.open("bare.0", true).unwrap());
    let mut a = pattern(7, 0, 3 * 65536);
    for (e, f) in [(&mut kept, fk), (&mut bare, fb)] {
        // One block in each of three stripe units: on each data server.
        for u in 0..3u64 {
            let at = (u * 65536) as usize;
            unsafe { e.queue(f, Op::Write, u * 65536, a[at..].as_mut_ptr(), BS, u) }.unwrap();
        }
        assert_eq!(drain(e).len(), 3, "answered UNSTABLE, not COMMITted");
    }
    assert_eq!(kept.held_bytes(), 3 * BS);
    for i in 0..3 {
        let port = c.ds[i].as_ref().unwrap().nfs_addr.unwrap().port();
        c.ds[i].take().unwrap().shutdown();
        c.ds[i] = Some(start_ds(port, Some((&imgs[i], false))));
    }
    unsafe { kept.queue(fk, Op::Sync, 0, std::ptr::null_mut(), 0, 10) }.unwrap();
    assert_eq!(drain(&mut kept), vec![(10, 0)], "the held writes were sent again");
    assert_eq!(kept.resent(), (3, 3 * BS as u64));
    assert_eq!(kept.held_bytes(), 0);
    unsafe { bare.queue(fb, Op::Sync, 0, std::ptr::null_mut(), 0, 10) }.unwrap();
    assert_eq!(drain(&mut bare), vec![(10, -(libc::EIO as i64))], "nothing held: the fsync reports what the restart may have lost");
    for u in 0..3u64 {
        let at = (u * 65536) as usize;
        let want = &a[at..at + BS];
        let mut got = vec![0u8; BS];
        unsafe { kept.queue(fk, Op::Read, u * 65536, got.as_mut_ptr(), BS, 20) }.unwrap();
        assert_eq!(drain(&mut kept), vec![(20, BS as i64)]);
        assert!(got == want, "unit {u} of the held file after the restart");
        got.fill(0);
        unsafe { bare.queue(fb, Op::Read, u * 65536, got.as_mut_ptr(), BS, 21) }.unwrap();
        let r = drain(&mut bare);
        assert!(r[0].1 < BS as i64 || got != want, "unit {u} of the unheld file was really lost ({r:?})");
    }
    // Nothing else is wrong: writes and an fsync now are clean.
    unsafe { bare.queue(fb, Op::Write, 0, a.as_mut_ptr(), BS, 30) }.unwrap();
    assert_eq!(drain(&mut bare), vec![(30, BS as i64)]);
    unsafe { bare.queue(fb, Op::Sync, 0, std::ptr::null_mut(), 0, 31) }.unwrap();
    assert_eq!(drain(&mut bare), vec![(31, 0)]);
    kept.close(fk).unwrap();
    bare.close(fb).unwrap();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MDS restarts (on diskfs: namespace, placements and client records
/// kept) in the middle of a job, with and without a grace period: the
/// engine's next call to it finds the session gone, re-establishes it
/// (reclaiming its open in the grace period, or opening the file again by
/// name when there is none) and goes on — new layouts, writes, fsync
/// (LAYOUTCOMMIT under a new layout), close — with no I/O failing, and
/// every block reads back. Before, every later LAYOUTGET failed and the
/// I/Os ended with EIO.
#[test]
fn the_engine_rides_out_a_metadata_server_restart() {
    let dir = scratch("mds");
    let img = image(&dir, "mds");
    let (ds, pn) = data_servers(json!({ "mirrors": 1 }), &[None, None, None]);
    let mut c = Cluster { mds: Some(mds_on_diskfs(&pn, &img, true, 0, 1)), ds };
    let port = c.mds.as_ref().unwrap().nfs_addr.unwrap().port();
    let depth = 4;
    let mut e = engine(&c, depth);
    let f = e.open("mds-restart.0", true).unwrap();
    // 12 units of 64 KiB, one 4 KiB block each: units 0..4 before, the rest
    // after each restart (new units need new layouts from the MDS).
    let mut data: Vec<Vec<u8>> = (0..12u64).map(|u| pattern(9, u * 65536, BS)).collect();
    let write_units = |e: &mut Engine, units: std::ops::Range<u64>, data: &mut Vec<Vec<u8>>| {
        for u in units {
            unsafe { e.queue(f, Op::Write, u * 65536, data[u as usize].as_mut_ptr(), BS, u) }.unwrap();
            assert_eq!(drain(e), vec![(u, BS as i64)], "write of unit {u}");
        }
        unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 1000) }.unwrap();
        assert_eq!(drain(e), vec![(1000, 0)], "fsync");
    };
    write_units(&mut e, 0..4, &mut data);
    // With a grace period of 1 s: the open is reclaimed.
    c.mds.take().unwrap().shutdown();
    c.mds = Some(mds_on_diskfs(&pn, &img, false, port, 1));
    write_units(&mut e, 4..8, &mut data);
    // Without one: the file is opened again.
    c.mds.take().unwrap().shutdown();
    c.mds = Some(mds_on_diskfs(&pn, &img, false, port, 0));
    write_units(&mut e, 8..12, &mut data);
    assert_eq!(e.errors(), 0, "no I/O failed across the restarts");
    for u in 0..12u64 {
        let mut got = vec![0u8; BS];
        unsafe { e.queue(f, Op::Read, u * 65536, got.as_mut_ptr(), BS, 2000 + u) }.unwrap();
        assert_eq!(drain(&mut e), vec![(2000 + u, BS as i64)], "read of unit {u}");
        assert!(got == data[u as usize], "unit {u} reads back");
    }
    e.close(f).unwrap();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}


/// The MDS restarts on memfs: its namespace is gone, and with it the
/// engine's open file. The engine's next call finds the session lost,
/// re-establishes it, and cannot open the file again: the I/Os of that
/// file fail with ESTALE naming the file and the lost namespace, promptly
/// (not after waiting out `chimera_retry_s`), and every later I/O of it
/// fails the same way; the engine itself keeps working — a file created
/// now is written, synced and read back.
#[test]
fn a_metadata_server_that_lost_its_namespace_fails_that_file_and_nothing_else() {
    let (ds, pn) = data_servers(json!({ "mirrors": 1 }), &[None, None, None]);
    let mut c = Cluster { mds: Some(mds_on_memfs(&pn, 0)), ds };
    let port = c.mds.as_ref().unwrap().nfs_addr.unwrap().port();
    let mut e = engine_with(&c, 4, 30);
    let f = e.open("gone.0", true).unwrap();
    let mut a = pattern(12, 0, BS);
    unsafe { e.queue(f, Op::Write, 0, a.as_mut_ptr(), BS, 1) }.unwrap();
    assert_eq!(drain(&mut e), vec![(1, BS as i64)]);
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 2) }.unwrap();
    assert_eq!(drain(&mut e), vec![(2, 0)]);
    c.mds.take().unwrap().shutdown();
    c.mds = Some(mds_on_memfs(&pn, port));
    // A unit with no layout yet: its LAYOUTGET meets the new server.
    let t0 = Instant::now();
    let mut b = pattern(13, 5 * 65536, BS);
    let r = unsafe { e.queue(f, Op::Write, 5 * 65536, b.as_mut_ptr(), BS, 3) };
    let got = match r {
        Ok(()) => drain(&mut e)[0].1,
        Err((errno, msg)) => {
            assert!(msg.contains("gone.0"), "{msg}");
            -(errno as i64)
        }
    };
    assert_eq!(got, -(libc::ESTALE as i64), "the lost file's I/O is ESTALE");
    assert!(t0.elapsed() < Duration::from_secs(10), "failed promptly ({:?}), not after chimera_retry_s", t0.elapsed());
    let mut r = vec![0u8; BS];
    let again = match unsafe { e.queue(f, Op::Read, 0, r.as_mut_ptr(), BS, 4) } {
        Ok(()) => drain(&mut e)[0].1,
        Err((errno, _)) => -(errno as i64),
    };
    assert_eq!(again, -(libc::ESTALE as i64), "and stays so");
    // The engine goes on with files the new server has.
    let g = e.open("new.0", true).unwrap();
    // A new file shows nothing of the old server's data files.
    r.fill(0xee);
    unsafe { e.queue(g, Op::Read, 0, r.as_mut_ptr(), BS, 5) }.unwrap();
    let n = drain(&mut e)[0].1;
    assert!(n == 0 || (n > 0 && r[..n as usize].iter().all(|&x| x == 0)), "a new file reads empty ({n} bytes)");
    write_read_verify(&mut e, g, 14, 32, 4);
    e.close(g).unwrap();
    let _ = e.close(f);
}

/// fio issues an fsync while writes are in flight (it does not quiesce
/// first). A write answered after that fsync began is not covered by it,
/// so the next fsync must COMMIT its data server: after it nothing is
/// held. Before, the fsync forgot the data files of writes still in
/// flight, the next one never COMMITted them (and would not have resent
/// them after a data-server restart), and their copies stayed held.
#[test]
fn a_write_in_flight_across_an_fsync_is_committed_by_the_next() {
    // diskfs data servers: their WRITEs answer UNSTABLE (memfs's FILE_SYNC).
    let dir = scratch("inflight");
    let (c, _imgs) = diskfs_cluster(&dir, 1);
    let mut e = engine(&c, 8);
    let f = e.open("inflight.0", true).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..3u64).map(|u| pattern(15, u * 65536, BS)).collect();
    for (u, b) in bufs.iter_mut().enumerate() {
        unsafe { e.queue(f, Op::Write, u as u64 * 65536, b.as_mut_ptr(), BS, u as u64) }.unwrap();
    }
    // The fsync is queued with the three writes unanswered.
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 10) }.unwrap();
    let mut got = drain(&mut e);
    got.sort();
    assert_eq!(got, vec![(0, BS as i64), (1, BS as i64), (2, BS as i64), (10, 0)]);
    assert!(e.held_bytes() > 0, "answered after the fsync began: not covered by it");
    unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 11) }.unwrap();
    assert_eq!(drain(&mut e), vec![(11, 0)]);
    assert_eq!(e.held_bytes(), 0, "the second fsync COMMITted what the first could not cover");
    for (u, want) in bufs.iter().enumerate() {
        let mut r = vec![0u8; BS];
        unsafe { e.queue(f, Op::Read, u as u64 * 65536, r.as_mut_ptr(), BS, 20) }.unwrap();
        assert_eq!(drain(&mut e), vec![(20, BS as i64)]);
        assert!(r == *want, "unit {u}");
    }
    e.close(f).unwrap();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MDS recalls the engine's layouts (here: a data server drained, as
/// the admin API's PUT /api/v1/dataservers does). The engine's session has
/// a back channel: it answers CB_LAYOUTRECALL, returns each layout once
/// none of its file's I/O is left on a data server, and takes new ones
/// for the I/O that waited — nothing is fenced or revoked, no I/O fails,
/// every block reads back. Before, the session had no back channel and
/// the MDS could only fence the file (the engine's next I/O to its data
/// servers was refused and went through a new layout after an error).
#[test]
fn a_recalled_layout_is_answered_returned_and_io_goes_on() {
    let mut c = cluster(json!({ "mirrors": 1 }));
    let depth = 8;
    let mut e = engine(&c, depth);
    let f = e.open("recall.0", true).unwrap();
    let mut data: Vec<Vec<u8>> = (0..12u64).map(|u| pattern(16, u * 65536, BS)).collect();
    let write_units = |e: &mut Engine, units: std::ops::Range<u64>, data: &mut Vec<Vec<u8>>| {
        for u in units {
            unsafe { e.queue(f, Op::Write, u * 65536, data[u as usize].as_mut_ptr(), BS, u) }.unwrap();
        }
        let got = drain(e);
        assert!(got.iter().all(|r| r.1 == BS as i64), "{got:?}");
        unsafe { e.queue(f, Op::Sync, 0, std::ptr::null_mut(), 0, 1000) }.unwrap();
        assert_eq!(drain(e), vec![(1000, 0)], "fsync");
    };
    write_units(&mut e, 0..6, &mut data);
    let pn = c.mds.as_ref().unwrap().pnfs.clone().expect("the MDS's pNFS state");
    let m = &pn.metrics;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let specs: Vec<pnfs::DsSpec> = c
        .ds
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let port = d.as_ref().unwrap().nfs_addr.unwrap().port();
            pnfs::DsSpec {
                name: format!("ds{i}"),
                host: "127.0.0.1".into(),
                port,
                netid: pnfs::Netid::Tcp,
                tcp_port: port,
                backing_path: None,
                ready: true,
                draining: i == 0,
            }
        })
        .collect();
    pn.set_data_servers(specs).expect("drain ds0");
    assert!(load(&m.layouts_recalled) >= 1, "the engine's layout naming ds0 was recalled");
    let returned = load(&m.layouts_returned);
    // The recall is read while the next I/Os are reaped.
    std::thread::sleep(Duration::from_millis(100));
    write_units(&mut e, 6..12, &mut data);
    assert!(e.recalls() >= 1, "the engine answered the recall");
    assert!(load(&m.layouts_returned) > returned, "and returned the layout");
    assert_eq!(load(&m.fences), 0, "nothing fenced");
    assert_eq!(load(&m.layouts_revoked), 0, "nothing revoked");
    assert_eq!(e.errors(), 0, "no I/O failed");
    for u in 0..12u64 {
        let mut got = vec![0u8; BS];
        unsafe { e.queue(f, Op::Read, u * 65536, got.as_mut_ptr(), BS, 2000 + u) }.unwrap();
        assert_eq!(drain(&mut e), vec![(2000 + u, BS as i64)]);
        assert!(got == data[u as usize], "unit {u} reads back");
    }
    e.close(f).unwrap();
    c.mds.take().unwrap().shutdown();
}
