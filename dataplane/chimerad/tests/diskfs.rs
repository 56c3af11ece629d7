//! diskfs through the real binary and the userspace NFSv3 client:
//! - kill -9 under load: rounds of a writer (4 KiB writes at random
//!   offsets, FILE_SYNC and UNSTABLE + COMMIT mixed) killed with SIGKILL at
//!   a random moment, restarted; every write acknowledged durable reads
//!   back (or a later write to the same block, which may have landed), the
//!   file handle from before the kill still works, the write verifier
//!   changed; RSS before the kill and recovery time printed per round.
//!   `DISKFS_KILL_ROUNDS` sets the rounds (default 20).
//! - admin-API volumes (directories with quotas) and what they hold survive
//!   a kill -9: listed with their capacity and usage after the restart.

mod common;
mod process;

use client::nfs3::{Nfs3, Stable};
use client::{Auth, Limits};
use process::{listening, spawn, until_started_or_exit, Proc};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FILE_BLOCKS: u64 = 256;
const BLOCK: usize = 4096;

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("diskfs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(dir: &Path) -> PathBuf {
    let img = dir.join("dev0.img");
    std::fs::File::create(&img).unwrap().set_len(256 << 20).unwrap();
    let v = json!({
        "common": { "log_level": "info" },
        "server": { "bind": "127.0.0.1", "threads": 2, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0,
                    "vfs": { "diskfs": { "config": { "initialize": true, "devices": [{ "type": "io_uring", "path": img.to_str().unwrap() }] } } } },
        "mounts": { "ds": { "module": "diskfs", "path": "/" } },
        "exports": { "/ds": { "path": "/ds" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": "diskfs-test-token", "tls": false },
        "metrics": { "bind": "127.0.0.1", "port": 0 }
    });
    let cfg = dir.join("chimera.json");
    std::fs::write(&cfg, v.to_string()).unwrap();
    cfg
}

fn limits() -> Limits {
    Limits { timeout: Duration::from_secs(5), ..Limits::default() }
}

fn rss_mib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|k| k.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0
}

struct Up {
    proc: Proc,
    nfs: String,
    admin: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
    recovery_ms: u64,
    formatted: bool,
}

fn start(cfg: &Path) -> Up {
    let mut p = spawn(cfg);
    let lines = until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
    let m: &Value = lines.iter().find(|v| v["msg"] == "diskfs mounted").expect("diskfs mounted");
    Up {
        nfs: listening(&lines, "nfs").to_string(),
        admin: listening(&lines, "admin"),
        metrics: listening(&lines, "metrics"),
        recovery_ms: m["recovery_ms"].as_u64().unwrap(),
        formatted: m["formatted"].as_bool().unwrap(),
        proc: p,
    }
}

/// Deterministic 4 KiB block content: (round, write number).
fn block(round: u32, n: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    for (i, x) in b.iter_mut().enumerate() {
        *x = ((i as u64 * 131 + n * 7 + round as u64 * 977) % 253) as u8 + 1;
    }
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..12].copy_from_slice(&round.to_le_bytes());
    b
}

/// Per block: what it may hold — its durable content first, then writes
/// sent after it (they may or may not have landed).
type Model = HashMap<u64, Vec<Vec<u8>>>;

/// Write until the server goes away; returns the model.
fn load(nfs: &str, fh: &[u8], round: u32, seed: u64, mut model: Model, stop: &AtomicBool) -> (Model, u64) {
    let mut c = Nfs3::connect(nfs, &Auth::sys(0, 0), limits()).unwrap();
    let mut rng = seed;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut unstable: Vec<u64> = Vec::new();
    let mut acked = 0u64;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let idx = next() % FILE_BLOCKS;
        let data = block(round, n);
        // Sent: from now on it may be there.
        model.entry(idx).or_insert_with(|| vec![vec![0u8; BLOCK]]).push(data.clone());
        let stable = if next() % 3 == 0 { Stable::FileSync } else { Stable::Unstable };
        match c.write(fh, idx * BLOCK as u64, &data, stable) {
            Ok(w) if w.stable => {
                model.insert(idx, vec![data]);
                acked += 1;
            }
            Ok(_) => unstable.push(idx),
            Err(_) => break,
        }
        if unstable.len() >= 8 {
            if c.commit(fh).is_err() {
                break;
            }
            // Everything sent before the COMMIT is durable: the newest write
            // of each block is its content now.
            for idx in unstable.drain(..) {
                let last = model[&idx].last().unwrap().clone();
                model.insert(idx, vec![last]);
                acked += 1;
            }
        }
    }
    (model, acked)
}

#[test]
fn kill_9_under_load_keeps_every_acknowledged_write() {
    let rounds: u32 = std::env::var("DISKFS_KILL_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let dir = scratch("kill9");
    let cfg = config(&dir);
    let mut up = start(&cfg);
    assert!(up.formatted);
    let root = client::nfs3::mount_at(&up.nfs, "/ds", &Auth::sys(0, 0), limits()).unwrap();
    let mut c = Nfs3::connect(&up.nfs, &Auth::sys(0, 0), limits()).unwrap();
    let fh = c.create(&root, b"data", 0o644, true).unwrap();
    c.write(&fh, (FILE_BLOCKS - 1) * BLOCK as u64, &vec![0u8; BLOCK], Stable::FileSync).unwrap();
    let mut verf = c.write(&fh, 0, &vec![0u8; BLOCK], Stable::FileSync).unwrap().verf;
    drop(c);
    let mut model: Model = (0..FILE_BLOCKS).map(|i| (i, vec![vec![0u8; BLOCK]])).collect();
    for round in 1..=rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let (nfs, fh2, m, st) = (up.nfs.clone(), fh.clone(), std::mem::take(&mut model), stop.clone());
        let writer = std::thread::spawn(move || load(&nfs, &fh2, round, 0x9E37_79B9 ^ round as u64, m, &st));
        std::thread::sleep(Duration::from_millis(150 + (round as u64 * 37) % 300));
        let rss = rss_mib(up.proc.child.id());
        // SIGKILL, mid-run.
        up.proc.child.kill().unwrap();
        up.proc.child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        let (m, acked) = writer.join().unwrap();
        model = m;
        let t0 = Instant::now();
        up = start(&cfg);
        let restart_ms = t0.elapsed().as_millis();
        assert!(!up.formatted);
        let mut c = Nfs3::connect(&up.nfs, &Auth::sys(0, 0), limits()).unwrap();
        // The handle from before the kill still names the file.
        let a = c.getattr(&fh).unwrap();
        assert_eq!(a.size, FILE_BLOCKS * BLOCK as u64);
        let mut checked = 0;
        for idx in 0..FILE_BLOCKS {
            let mut got = Vec::new();
            c.read(&fh, idx * BLOCK as u64, BLOCK as u32, &mut got).unwrap();
            let allowed = &model[&idx];
            assert!(
                allowed.iter().any(|a| a == &got),
                "round {round}: block {idx} holds write {:?} of round {:?}, not its durable content or a later write",
                u64::from_le_bytes(got[..8].try_into().unwrap()),
                u32::from_le_bytes(got[8..12].try_into().unwrap())
            );
            // What it holds is its durable content from now on.
            model.insert(idx, vec![got]);
            checked += 1;
        }
        let w = c.write(&fh, 0, &model[&0][0].clone(), Stable::FileSync).unwrap();
        assert_ne!(w.verf, verf, "round {round}: the write verifier must change across a restart");
        verf = w.verf;
        println!(
            "kill -9 round {round}: {acked} writes acknowledged durable before the kill; RSS before kill {rss:.1} MiB; \
             recovery {} ms (start to serving {restart_ms} ms); {checked} blocks verified",
            up.recovery_ms
        );
    }
    drop(up);
    // The file system is consistent after all of it.
    let mut o = block::uring::UringOptions::new(dir.join("dev0.img"));
    o.read_only = true;
    let dev: block::Device = Arc::new(block::uring::UringDevice::open(&o).unwrap());
    let rep = diskfs::fsck::check(vec![dev]).unwrap();
    assert!(rep.clean(), "fsck: {:?}", rep.violations);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A volume's access rules are kept with it on diskfs: after a kill -9
/// and restart `GET` shows them and the data path enforces them (CREATE
/// in the read-only volume is NFS3ERR_ROFS, another volume takes it);
/// a volume deleted and made again under its name has none.
#[test]
fn volume_access_rules_survive_kill_9() {
    let dir = scratch("volaccess");
    let cfg = config(&dir);
    let token = Some("diskfs-test-token");
    let up = start(&cfg);
    let ro = json!([{ "clients": "*", "access_type": "ro", "squash": "all_squash", "anonymous_uid": 7, "anonymous_gid": 8 }]);
    let r = common::send(up.admin, "POST", "/api/v1/volumes", token, &json!({"name": "pvc-ro", "capacityBytes": 4 << 20, "access": ro}));
    assert_eq!(r.status, 201, "{}", r.text());
    let shown = r.json()["access"].clone();
    for name in ["pvc-rw", "pvc-gone"] {
        let r = common::send(up.admin, "POST", "/api/v1/volumes", token, &json!({"name": name, "capacityBytes": 4 << 20}));
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = common::send(up.admin, "PATCH", "/api/v1/volumes/pvc-gone", token, &json!({"access": [{"clients": "10.0.0.0/8"}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = common::send(up.admin, "DELETE", "/api/v1/volumes/pvc-gone", token, &json!({}));
    assert_eq!(r.status, 204, "{}", r.text());
    drop(up); // SIGKILL
    let up = start(&cfg);
    assert_eq!(common::get(up.admin, "/api/v1/volumes/pvc-ro", token).json()["access"], shown, "the rules came back");
    assert_eq!(common::get(up.admin, "/api/v1/volumes/pvc-rw", token).json()["access"], Value::Null);
    let r = common::send(up.admin, "POST", "/api/v1/volumes", token, &json!({"name": "pvc-gone", "capacityBytes": 4 << 20}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["access"], Value::Null, "a deleted volume's rules went with it");
    let mut c = Nfs3::connect(&up.nfs, &Auth::sys(0, 0), limits()).unwrap();
    let vro = client::nfs3::mount_at(&up.nfs, "/ds/volumes/pvc-ro", &Auth::sys(0, 0), limits()).unwrap();
    match c.create(&vro, b"f", 0o644, true) {
        Err(client::Error::Nfs3 { code: 30, .. }) => {}
        other => panic!("CREATE in a read-only volume after a restart: {other:?}"),
    }
    for name in ["pvc-rw", "pvc-gone"] {
        let v = client::nfs3::mount_at(&up.nfs, &format!("/ds/volumes/{name}"), &Auth::sys(0, 0), limits()).unwrap();
        let f = c.create(&v, b"f", 0o644, true).unwrap();
        assert_eq!(c.getattr(&f).unwrap().uid, 0, "{name}: no squash");
    }
    drop(up);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn admin_volumes_and_their_data_survive_kill_9() {
    let dir = scratch("volumes");
    let cfg = config(&dir);
    let token = Some("diskfs-test-token");
    let up = start(&cfg);
    let r = common::send(up.admin, "POST", "/api/v1/volumes", token, &json!({"name": "pvc-a", "capacityBytes": 8 << 20}));
    assert_eq!(r.status, 201, "{}", r.text());
    let export = r.json()["exportPath"].as_str().unwrap().to_string();
    let r = common::send(up.admin, "POST", "/api/v1/volumes", token, &json!({"name": "pvc-b", "capacityBytes": 4 << 20}));
    assert_eq!(r.status, 201, "{}", r.text());
    // 1 MiB into pvc-a through NFS, FILE_SYNC.
    let vol = client::nfs3::mount_at(&up.nfs, &export, &Auth::sys(0, 0), limits()).unwrap();
    let mut c = Nfs3::connect(&up.nfs, &Auth::sys(0, 0), limits()).unwrap();
    let f = c.create(&vol, b"payload", 0o644, true).unwrap();
    c.write(&f, 0, &vec![0x5a; 1 << 20], Stable::FileSync).unwrap();
    // Past the 8 MiB quota: NFS3ERR_DQUOT (69); removing the file gives
    // the space back.
    let big = c.create(&vol, b"big", 0o644, true).unwrap();
    let mut off = 0u64;
    let err = loop {
        match c.write(&big, off, &vec![0x33; 1 << 20], Stable::FileSync) {
            Ok(_) => off += 1 << 20,
            Err(e) => break e,
        }
        assert!(off <= 8 << 20, "the quota was not enforced");
    };
    assert!(matches!(&err, client::Error::Nfs3 { code: 69, .. }), "{err:?}");
    c.remove(&vol, b"big").unwrap();
    drop(c);
    let r = common::send(up.admin, "DELETE", "/api/v1/volumes/pvc-b", token, &json!({}));
    assert!(r.status == 200 || r.status == 204, "{} {}", r.status, r.text());
    drop(up); // SIGKILL
    let up = start(&cfg);
    let list = common::get(up.admin, "/api/v1/volumes", token).json();
    let vols = list.as_array().or_else(|| list["volumes"].as_array()).unwrap_or_else(|| panic!("{list}")).clone();
    assert_eq!(vols.len(), 1, "{list}");
    assert_eq!(vols[0]["id"], "pvc-a");
    assert_eq!(vols[0]["capacityBytes"], 8 << 20);
    assert_eq!(vols[0]["usedBytes"], 1 << 20, "{list}");
    let vol = client::nfs3::mount_at(&up.nfs, &export, &Auth::sys(0, 0), limits()).unwrap();
    let mut c = Nfs3::connect(&up.nfs, &Auth::sys(0, 0), limits()).unwrap();
    let (f2, _) = c.lookup(&vol, b"payload").unwrap();
    assert_eq!(f2, f, "the handle survives the restart");
    let mut got = Vec::new();
    c.read(&f, 0, 1 << 20, &mut got).unwrap();
    assert!(got.len() == 1 << 20 && got.iter().all(|&b| b == 0x5a));
    // An UNSTABLE write + COMMIT, read back.
    let u = c.create(&vol, b"unstable", 0o644, true).unwrap();
    c.write(&u, 4096, &vec![0x77; 64 << 10], Stable::Unstable).unwrap();
    c.commit(&u).unwrap();
    let mut back = Vec::new();
    c.read(&u, 0, 4096 + (64 << 10), &mut back).unwrap();
    assert!(back.len() == 4096 + (64 << 10) && back[..4096].iter().all(|&b| b == 0) && back[4096..].iter().all(|&b| b == 0x77));
    // Those READs and the UNSTABLE WRITE ran on the core that decoded them,
    // through the core's own queue.
    let m = common::get(up.metrics, "/metrics", None).text();
    let core_reads: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("chimera_diskfs_core_reads_total "))
        .unwrap_or_else(|| panic!("no chimera_diskfs_core_reads_total in\n{m}"))
        .parse()
        .unwrap();
    assert!(core_reads >= 2, "the READs did not run on a core:\n{m}");
    assert!(m.contains("chimera_diskfs_core_writes_total 1\n"), "the UNSTABLE WRITE did not run on a core:\n{m}");
    assert!(m.contains("chimera_diskfs_io_errors_total 0"), "{m}");
    // The CREATE since the restart waited for its log flush parked, not on
    // the core.
    let counter = |name: &str| -> u64 {
        m.lines().find_map(|l| l.strip_prefix(name)).unwrap_or_else(|| panic!("no {name} in\n{m}")).trim().parse().unwrap()
    };
    assert_eq!(counter("chimera_diskfs_core_commits_total "), 1, "the COMMIT's device flush did not run on the core:\n{m}");
    assert!(counter("chimera_diskfs_log_waits_parked_total ") >= 1, "the CREATE's flush did not wait off the core:\n{m}");
    assert!(counter("chimera_diskfs_log_flushes_total ") >= 1, "{m}");
    drop(up);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_or_foreign_devices_are_start_errors_naming_the_device() {
    let dir = scratch("baddev");
    let cfg = config(&dir);
    let img = dir.join("dev0.img");
    // Missing.
    std::fs::remove_file(&img).unwrap();
    let mut p = spawn(&cfg);
    let (code, lines) = until_started_or_exit(&mut p).expect_err("a missing device cannot start");
    assert_eq!(code, Some(1));
    let e = lines.iter().find(|v| v["msg"] == "start-up failed").map(|v| v["error"].to_string()).unwrap_or_default();
    assert!(e.contains("dev0.img") && e.contains("mounts.ds"), "{e}");
    // Another file system's device (formatted by chimera-mkfs's library call).
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    let other = dir.join("other.img");
    std::fs::File::create(&other).unwrap().set_len(64 << 20).unwrap();
    let open = |p: &Path| -> block::Device { Arc::new(block::uring::UringDevice::open(&block::uring::UringOptions::new(p)).unwrap()) };
    diskfs::format(vec![open(&img)], 1, false).unwrap();
    diskfs::format(vec![open(&other)], 1, false).unwrap();
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["server"]["vfs"]["diskfs"]["config"]["devices"] =
        json!([{ "type": "io_uring", "path": img.to_str().unwrap() }, { "type": "io_uring", "path": other.to_str().unwrap() }]);
    std::fs::write(&cfg, v.to_string()).unwrap();
    let mut p = spawn(&cfg);
    let (code, lines) = until_started_or_exit(&mut p).expect_err("a foreign device cannot start");
    assert_eq!(code, Some(1));
    let e = lines.iter().find(|v| v["msg"] == "start-up failed").map(|v| v["error"].to_string()).unwrap_or_default();
    assert!(e.contains("other.img") && e.contains("another file system"), "{e}");
    // A vfio device that is not on this machine (the userspace NVMe driver
    // refuses before touching anything; the QEMU guest test shows the rest).
    v["server"]["vfs"]["diskfs"]["config"]["devices"] = json!([{ "type": "vfio", "path": "7f:1f.7" }]);
    std::fs::write(&cfg, v.to_string()).unwrap();
    let mut p = spawn(&cfg);
    let (code, lines) = until_started_or_exit(&mut p).expect_err("an absent NVMe device cannot start");
    assert_eq!(code, Some(1));
    let e = lines.iter().find(|v| v["msg"] == "start-up failed").map(|v| v["error"].to_string()).unwrap_or_default();
    assert!(e.contains("NVMe device 0000:7f:1f.7") && e.contains("no such PCI device") && e.contains("mounts.ds"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
