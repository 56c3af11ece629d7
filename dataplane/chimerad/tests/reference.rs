//! Proves issue 13 item 6, "the reference deployment's configs run", on the
//! real binary and on the two configs of that deployment, kept verbatim in
//! tests/reference/ (pnfs.json: MDS that is also a DS; chimera.json: a DS):
//! - `chimerad --check-config` accepts both as written, prints OK and a
//!   warning naming every reference key this server does not implement, and
//!   a note that an admin token will be generated; it writes nothing;
//! - parsed, they say what the reference means (16 VFIO devices, the data
//!   servers RDMA-first, the diskfs and nfs mounts);
//! - started with only device edits (and their fixed ports moved to
//!   loopback port 0), the data server's runs on diskfs and restarts onto
//!   the same file system; its 1 GiB hugepage slabs are mapped where they
//!   are reserved, else a warning names what to reserve; the MDS's starts too, its `nfs` mount's
//!   remote (not here) logged as unreachable by the mount's name;
//! - with the admin API on and no token, the first start generates one into
//!   `<config>.admin-token` (mode 0600), requests with it get 200 and without
//!   it 401, and the next start reuses it; a token file others can read is
//!   refused.

mod common;
mod process;

use process::{listening, spawn, until_started_or_exit, wait_exit};

use chimerad::config::{Config, DiskfsDevice, Module, Netid};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;


fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference").join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("chimerad-ref-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Reference keys each fixture carries that we accept but do not implement.
const COMMON_WARNED: &[&str] = &[
    "common.async_delegation",
    "common.preallocate_threads",
    "common.sync_delegation",
    "server.tcp_flavor",
    "server.vfs.diskfs.path",
];

fn expected_warnings(fixture: &str) -> Vec<&'static str> {
    let mut w = COMMON_WARNED.to_vec();
    match fixture {
        "chimera.json" => w.extend(["shares", "buckets"]),
        "pnfs.json" => w.extend(["server.nfs4_session_slots", "mounts.mds.create", "mounts.ds2.create", "exports./ds1.path"]),
        _ => unreachable!(),
    }
    // 80 loops are capped at the CPUs usable here.
    if std::thread::available_parallelism().unwrap().get() < 80 {
        w.push("server.threads");
    }
    w
}

#[test]
fn check_config_accepts_both_reference_configs_as_written() {
    for name in ["chimera.json", "pnfs.json"] {
        let f = fixture(name);
        let out = Command::new(env!("CARGO_BIN_EXE_chimerad")).args(["--check-config", "--config"]).arg(&f).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "OK\n", "{name}");
        let warned: Vec<&str> =
            stderr.lines().filter_map(|l| l.strip_prefix("warning: ")).map(|l| l.split(": ").next().unwrap()).collect();
        let mut want = expected_warnings(name);
        let mut got = warned.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{name}: warnings\n{stderr}");
        let token = PathBuf::from(format!("{}.admin-token", f.display()));
        let note = format!("note: admin.token: none set (server.rest_http_port / admin API enabled); a random token is generated at start and kept in {} (mode 0600)", token.display());
        assert!(stderr.lines().any(|l| l == note), "{name}: no token note in\n{stderr}");
        assert!(!stderr.contains("error"), "{name}: {stderr}");
        // A check writes nothing.
        assert!(!token.exists(), "--check-config created {}", token.display());
    }
}

#[test]
fn reference_configs_mean_what_the_reference_means() {
    let mds = Config::load(&fixture("pnfs.json")).unwrap();
    assert!(mds.server.pnfs.enabled);
    let ds = &mds.server.pnfs.data_servers;
    assert_eq!(ds.len(), 2);
    for (d, host, backing) in [(&ds[0], "10.67.25.209", "/ds1"), (&ds[1], "10.67.25.211", "/ds2")] {
        assert_eq!((d.netid, d.host.as_str(), d.port, d.backing_path.as_deref()), (Netid::Rdma, host, 20049, Some(backing)));
    }
    let modules: Vec<(&str, Module, &str)> = mds.mounts.iter().map(|m| (m.name.as_str(), m.module, m.path.as_str())).collect();
    assert_eq!(
        modules,
        [("ds1", Module::Nfs, "10.67.25.209:/ds"), ("ds2", Module::Diskfs, "/ds"), ("mds", Module::Diskfs, "/mds")]
    );
    let nfs = mds.mounts[0].nfs.as_ref().expect("ds1's nfs settings");
    assert_eq!((nfs.port, nfs.connections, nfs.timeout_ms), (2049, 2, 10_000), "the defaults");
    assert_eq!(mds.exports.iter().map(|e| (e.name.as_str(), e.path.as_str())).collect::<Vec<_>>(), [("/export", "/mds")]);
    // Volumes live beside what clients mount, not on the nfs mount that sorts first.
    assert_eq!(mds.volumes_path, "/mds/volumes");
    assert!(mds.server.rdma && mds.server.rdma_port == 20049);
    assert_eq!((mds.admin.port, mds.metrics.port), (8080, 9000));
    assert!(mds.admin.token_generate);

    for cfg in [&mds, &Config::load(&fixture("chimera.json")).unwrap()] {
        let d = cfg.diskfs.as_ref().expect("diskfs config");
        assert!(d.initialize);
        assert_eq!((d.block_cache_blocks, d.inode_cache_inodes), (1 << 20, 1 << 20));
        let pci: Vec<String> = d
            .devices
            .iter()
            .map(|x| match x {
                DiskfsDevice::Vfio { pci } => pci.to_string(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(pci.len(), 16);
        assert_eq!((pci[0].as_str(), pci[15].as_str()), ("0000:01:00.0", "0000:c7:00.0"));
        assert!(cfg.server.cores <= std::thread::available_parallelism().unwrap().get());
    }
}

/// A chimerad started from `cfg`, its JSON log lines on a channel.
fn start_error(lines: &[Value]) -> String {
    let e = lines.iter().find(|v| v["msg"] == "start-up failed").unwrap_or_else(|| panic!("no start-up failure logged: {lines:?}"));
    assert_eq!(e["level"], "error");
    e["error"].as_str().unwrap().to_string()
}

/// The reference config with this machine's device (a file) instead of
/// its NVMe controllers, its fixed ports moved to loopback port 0 (tests
/// never bind fixed ports), and RDMA off: this host has no RDMA device (the
/// guest suite, e2e/guest/test-rdma.sh, serves `rdma: true`; a start with it
/// here fails naming `server.rdma`, see below).
fn with_device_edits(dir: &Path, name: &str) -> PathBuf {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap();
    let img = dir.join(format!("{name}.img"));
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    v["server"]["vfs"]["diskfs"]["config"]["devices"] = json!([{ "type": "io_uring", "path": img.to_str().unwrap() }]);
    for (k, val) in [("bind", json!("127.0.0.1")), ("nfs_port", json!(0)), ("mount_port", json!(0)), ("portmap_port", json!(0)),
                     ("rest_http_port", json!(0)), ("metrics_port", json!(0)), ("grace_time_s", json!(0)), ("rdma", json!(false))] {
        v["server"][k] = val;
    }
    v["admin"] = json!({ "bind": "127.0.0.1" });
    v["metrics"] = json!({ "bind": "127.0.0.1" });
    let cfg = dir.join(name);
    std::fs::write(&cfg, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    cfg
}

fn mounted(lines: &[Value]) -> &Value {
    lines.iter().find(|v| v["msg"] == "diskfs mounted").unwrap_or_else(|| panic!("no diskfs mount logged: {lines:?}"))
}

#[test]
fn reference_ds_config_runs_on_diskfs_with_device_edits_and_restarts() {
    let dir = scratch("devices");
    let cfg = with_device_edits(&dir, "chimera.json");
    let mut p = spawn(&cfg);
    let lines = until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
    let m = mounted(&lines);
    assert_eq!(m["formatted"], true, "{m}");
    assert_eq!(m["mount"], "ds");
    // huge_pages: true, 1 GiB pages, 8 slabs of 1 GiB preallocated: mapped
    // where they are reserved; elsewhere a warning naming what to reserve,
    // and the server runs on ordinary pages.
    let free_1g: u64 = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages")
        .map_or(0, |s| s.trim().parse().unwrap_or(0));
    if free_1g >= 8 {
        let h = lines.iter().find(|v| v["msg"] == "hugepages").unwrap_or_else(|| panic!("no hugepages line: {lines:?}"));
        assert_eq!((h["page_bytes"].as_u64(), h["slabs"].as_u64()), (Some(1 << 30), Some(8)), "{h}");
    } else {
        let w = lines
            .iter()
            .find(|v| v["msg"] == "hugepages unavailable: DMA memory on ordinary pages")
            .unwrap_or_else(|| panic!("no warning about the missing 1 GiB hugepages: {lines:?}"));
        let e = w["error"].as_str().unwrap_or("");
        assert!(e.contains("1 GiB hugepages") && e.contains("hugepages-1048576kB") && e.contains("common.huge_pages"), "{w}");
    }
    let cluster = m["cluster"].as_str().unwrap().to_string();
    listening(&lines, "nfs");
    drop(p);
    // Killed and started again: the same file system, recovered, not formatted.
    let mut p = spawn(&cfg);
    let lines = until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
    let m = mounted(&lines);
    assert_eq!(m["formatted"], false, "{m}");
    assert_eq!(m["cluster"].as_str().unwrap(), cluster);
    drop(p);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `server.rdma: true` on an address without an RDMA device (loopback; on
/// this host there is no connection manager at all): exit 1
/// with an error naming `server.rdma` and what is missing, before any
/// client could find a half-served port.
#[test]
fn rdma_without_an_rdma_device_fails_at_start_naming_server_rdma() {
    let dir = scratch("rdma-off-host");
    let cfg = with_device_edits(&dir, "chimera.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["server"]["rdma"] = json!(true);
    v["server"]["rdma_hostname"] = json!("127.0.0.1");
    v["server"]["rdma_port"] = json!(0);
    std::fs::write(&cfg, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let mut p = spawn(&cfg);
    let (code, lines) = until_started_or_exit(&mut p).expect_err("no RDMA here");
    assert_eq!(code, Some(1), "{lines:?}");
    let e = start_error(&lines);
    assert!(e.starts_with("server.rdma: ") || e.contains("server.rdma: "), "{e:?}");
    assert!(e.contains("rdma_ucm") || e.contains("libibverbs") || e.contains("librdmacm") || e.contains("RDMA device"), "names what is missing: {e:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reference_mds_config_starts_with_its_nfs_mount_unreachable() {
    let dir = scratch("devices-mds");
    let cfg = with_device_edits(&dir, "pnfs.json");
    let mut p = spawn(&cfg);
    let lines = until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
    listening(&lines, "nfs");
    // The nfs mount's remote (10.67.25.209) is not here: the server runs
    // anyway and says so, naming the mount.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen = lines;
    let v = loop {
        if let Some(v) = seen.iter().find(|v| v["msg"] == "remote export unreachable") {
            break v.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no outage logged: {seen:?}");
        if let Ok(v) = p.lines.recv_timeout(std::time::Duration::from_millis(100)) {
            seen.push(v);
        }
    };
    assert_eq!(v["mount"], "ds1", "{v}");
    assert_eq!(v["remote"], "10.67.25.209:2049:/ds", "{v}");
    drop(p);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A memfs config plus an `nfs` mount whose remote is down: accepted by
/// --check-config, and it starts (the remote's absence is logged).
#[test]
fn nfs_mount_with_its_remote_down_starts() {
    let dir = scratch("nfs");
    let cfg = dir.join("chimera.json");
    let (_held, free) = common::held_port::held_port();
    let v = json!({
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
        "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": "64M" },
                    "remote": { "module": "nfs", "path": "127.0.0.1:/ds", "port": free } },
        "exports": { "/memfs": { "path": "/memfs" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": "nfs-mount-test", "tls": false },
        "metrics": { "bind": "127.0.0.1", "port": 0 }
    });
    std::fs::write(&cfg, v.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chimerad")).args(["--check-config", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut p = spawn(&cfg);
    let lines = until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
    listening(&lines, "nfs");
    drop(p);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_admin_token_is_generated_beside_the_config_and_reused() {
    let dir = scratch("token");
    let cfg = dir.join("pnfs.json");
    // The reference's shape: the admin API on through server.rest_http_port,
    // no token anywhere; kernel-chosen ports on loopback.
    let v = json!({
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0,
                    "rest_http_port": 0, "metrics_port": 0 },
        "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": "64M" } },
        "exports": { "/memfs": { "path": "/memfs" } },
        "admin": { "bind": "127.0.0.1" },
        "metrics": { "bind": "127.0.0.1" }
    });
    std::fs::write(&cfg, v.to_string()).unwrap();
    let token_file = dir.join("pnfs.json.admin-token");

    let mut token = String::new();
    for round in ["generated", "reused"] {
        let mut p = spawn(&cfg);
        let lines = until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
        let logged = lines.iter().find(|v| v["msg"] == format!("admin token {round}")).unwrap_or_else(|| panic!("{round}: {lines:?}"));
        assert_eq!(logged["file"], token_file.to_str().unwrap());
        // Where it is, never what it is.
        assert!(!lines.iter().any(|v| !token.is_empty() && v.to_string().contains(&token)));
        let meta = std::fs::metadata(&token_file).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let t = std::fs::read_to_string(&token_file).unwrap().trim_end().to_string();
        assert_eq!(t.len(), 64, "{t:?}");
        assert!(t.bytes().all(|c| c.is_ascii_hexdigit()), "{t:?}");
        if round == "reused" {
            assert_eq!(t, token, "the second start uses the first start's token");
        }
        token = t;
        let admin = listening(&lines, "admin");
        assert_eq!(common::get(admin, "/api/v1/volumes", Some(&token)).status, 200);
        assert_eq!(common::get(admin, "/api/v1/volumes", None).status, 401);
        assert_eq!(common::get(admin, "/api/v1/volumes", Some("not-the-token")).status, 401);
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) }, 0);
        assert_eq!(wait_exit(&mut p).code(), Some(0));
    }

    // A token file others may read is not a secret any more: refused.
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut p = spawn(&cfg);
    let (code, lines) = until_started_or_exit(&mut p).expect_err("a readable token file is refused");
    assert_eq!(code, Some(1));
    let e = start_error(&lines);
    assert!(e.starts_with("admin.token: ") && e.contains("has mode 0644") && e.contains("must be mode 0600"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
