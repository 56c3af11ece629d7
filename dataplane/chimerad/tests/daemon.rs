//! Proves the real `chimerad` binary end to end on 127.0.0.1:
//! - it starts from a config file (all ports 0 = kernel-chosen), logs one
//!   JSON object per line including the addresses it listens on;
//! - the admin API, `/metrics` and the NFS port answer; a volume created
//!   over the admin API is mountable with MOUNT3 at its `exportPath`, and
//!   NFSv3 FSSTAT on it reports the volume's capacity, before and after an
//!   expand (the quota is what statfs shows);
//! - SIGTERM (and SIGINT) stop it gracefully: an admin request in progress
//!   completes, the process logs "stopped" and exits 0;
//! - a DS-role process serves NFSv3 only (MOUNT and NFSv4 are
//!   PROG_UNAVAIL there) and runs no admin API;
//! - an invalid config exits 1 before listening, naming the bad key.

mod common;
mod process;

use common::{get, rpc_call, rpc_call_raw, send, xdr_opaque};
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

const TOKEN: &str = "daemon-test-token";
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

struct Daemon {
    proc: process::Proc,
    admin: SocketAddr,
    metrics: SocketAddr,
    nfs: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Never leave a server behind when a test fails half-way.
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(dir: &std::path::Path) -> Value {
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    json!({
        "common": { "log_level": "info" },
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0,
                    "grace_time_s": 0, "delegation_threads": 2 },
        "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": "64M" } },
        "exports": { "/memfs": { "path": "/memfs" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token_file": token_file.to_str().unwrap(), "tls": false },
        "metrics": { "bind": "127.0.0.1", "port": 0 }
    })
}

fn start(name: &str) -> Daemon {
    start_with(name, |_| {})
}

fn start_with(name: &str, edit: impl FnOnce(&mut Value)) -> Daemon {
    let dir = std::env::temp_dir().join(format!("chimerad-daemon-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("chimera.json");
    let mut v = config(&dir);
    edit(&mut v);
    std::fs::write(&cfg, v.to_string()).unwrap();
    let mut addrs = std::collections::HashMap::new();
    let deadline = Instant::now() + START_TIMEOUT;
    let mut d = Daemon { proc: process::spawn(&cfg), admin: "0.0.0.0:0".parse().unwrap(), metrics: "0.0.0.0:0".parse().unwrap(), nfs: "0.0.0.0:0".parse().unwrap(), dir };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = d.proc.lines.recv_timeout(left).expect("chimerad logged 'started' in time");
        assert!(v["ts"].is_string() && v["level"].is_string(), "{v}");
        if v["msg"] == "listening" {
            addrs.insert(v["service"].as_str().unwrap().to_string(), v["addr"].as_str().unwrap().parse::<SocketAddr>().unwrap());
        }
        if v["msg"] == "config" {
            assert!(v["warning"].as_str().unwrap().starts_with("server.delegation_threads:"), "{v}");
        }
        if v["msg"] == "started" {
            break;
        }
        assert_ne!(v["level"], "error", "{v}");
    }
    let unset: SocketAddr = "0.0.0.0:0".parse().unwrap();
    d.admin = addrs.get("admin").copied().unwrap_or(unset);
    d.metrics = addrs.get("metrics").copied().unwrap_or(unset);
    d.nfs = addrs["nfs"];
    d
}

/// Wait for exit within STOP_TIMEOUT; returns the exit status and the
/// messages logged after the signal.
fn wait_exit(d: &mut Daemon) -> (std::process::ExitStatus, Vec<String>) {
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        if let Some(st) = d.proc.child.try_wait().unwrap() {
            let msgs = d.proc.lines.try_iter().map(|v| v["msg"].as_str().unwrap_or("").to_string()).collect();
            return (st, msgs);
        }
        assert!(Instant::now() < deadline, "chimerad did not exit within {STOP_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(d: &Daemon, sig: i32) {
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(d.proc.child.id() as i32, sig) }, 0);
}

#[test]
fn serves_admin_metrics_and_nfs_then_stops_on_sigterm() {
    let mut d = start("term");
    assert_eq!(get(d.admin, "/readyz", None).status, 200);
    assert_eq!(get(d.admin, "/api/v1/volumes", None).status, 401);
    let r = send(d.admin, "POST", "/api/v1/volumes", Some(TOKEN), &json!({"name": "pvc-a", "capacityBytes": 4 << 20}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["exportPath"], "/memfs/volumes/pvc-a");
    let c = get(d.admin, "/api/v1/cluster", Some(TOKEN)).json();
    assert_eq!(c["capacityBytes"], 64 << 20);
    assert!(c["usedBytes"].as_u64().unwrap() > 0);
    let m = get(d.metrics, "/metrics", None);
    assert_eq!(m.status, 200);
    assert!(m.text().lines().any(|l| l == format!("chimera_volume_capacity_bytes{{volume=\"pvc-a\"}} {}", 4u64 << 20)), "{}", m.text());
    // MOUNT3 MNT of the volume's exportPath (on the NFS port, which serves
    // every program), then NFSv3 FSSTAT on the handle it returns.
    let mut nfs = TcpStream::connect_timeout(&d.nfs, common::TIMEOUT).expect("NFS port accepts");
    let mnt = rpc_call(&mut nfs, 1, 100005, 3, 1, &xdr_opaque(b"/memfs/volumes/pvc-a"));
    assert_eq!(&mnt[..4], &[0, 0, 0, 0], "MNT3_OK");
    let fh_len = u32::from_be_bytes(mnt[4..8].try_into().unwrap()) as usize;
    let fh = mnt[8..8 + fh_len].to_vec();
    let tbytes = |nfs: &mut TcpStream, xid| {
        let r = rpc_call(nfs, xid, 100003, 3, 18, &xdr_opaque(&fh));
        assert_eq!(&r[..4], &[0, 0, 0, 0], "NFS3_OK");
        // post_op_attr: TRUE + 84-byte fattr3, or FALSE.
        let at = if r[7] == 1 { 8 + 84 } else { 8 };
        u64::from_be_bytes(r[at..at + 8].try_into().unwrap())
    };
    assert_eq!(tbytes(&mut nfs, 2), 4 << 20);
    let r = send(d.admin, "PATCH", "/api/v1/volumes/pvc-a", Some(TOKEN), &json!({"capacityBytes": 16 << 20}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(tbytes(&mut nfs, 3), 16 << 20);
    // An unknown export is refused (MNT3ERR_NOENT = 2 or MNT3ERR_ACCES = 13).
    let bad = rpc_call(&mut nfs, 4, 100005, 3, 1, &xdr_opaque(b"/elsewhere"));
    assert_ne!(&bad[..4], &[0, 0, 0, 0]);
    // The portmapper answers on the NFS port too (NULL).
    assert_eq!(rpc_call_raw(&mut nfs, 5, 100000, 2, 0, &[]).0, 0);
    drop(nfs);
    // Those calls are counted per program and operation.
    let m = get(d.metrics, "/metrics", None).text();
    assert!(m.lines().any(|l| l == "chimera_rpc_ops_total{program=\"nfs3\",op=\"fsstat\"} 2"), "{m}");
    assert!(m.lines().any(|l| l == "chimera_rpc_ops_total{program=\"mount3\",op=\"mnt\"} 2"), "{m}");

    // A request in progress when SIGTERM arrives still gets its answer: hold
    // a connection open mid-request, signal, then finish the request.
    let mut slow = TcpStream::connect(d.admin).unwrap();
    use std::io::{Read, Write};
    slow.set_read_timeout(Some(common::TIMEOUT)).unwrap();
    slow.write_all(format!("GET /api/v1/volumes/pvc-a HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    signal(&d, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    slow.write_all(b"Connection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    slow.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 "), "in-flight request answered: {out}");
    assert!(out.contains("\"pvc-a\""));

    let (status, msgs) = wait_exit(&mut d);
    assert_eq!(status.code(), Some(0), "exit status {status:?}; logged {msgs:?}");
    assert!(msgs.iter().any(|m| m == "stopping") && msgs.last().map(String::as_str) == Some("stopped"), "{msgs:?}");
    // Nothing listens any more.
    assert!(TcpStream::connect_timeout(&d.admin, Duration::from_secs(1)).is_err());
}

#[test]
fn sigint_stops_too() {
    let mut d = start("int");
    signal(&d, libc::SIGINT);
    let (status, msgs) = wait_exit(&mut d);
    assert_eq!(status.code(), Some(0), "{msgs:?}");
    assert!(msgs.contains(&"stopped".to_string()));
}

#[test]
fn invalid_config_exits_1_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("chimerad-daemon-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = config(&dir);
    cfg["server"]["nfs_prot"] = json!(2049);
    let f = dir.join("bad.json");
    std::fs::write(&f, cfg.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chimerad")).arg("--config").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.nfs_prot: unknown key"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_chimerad")).arg("--config").arg(dir.join("missing.json")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ds_role_serves_nfs3_only() {
    let mut d = start_with("ds", |v| {
        v["server"]["role"] = json!("ds");
        v.as_object_mut().unwrap().remove("admin");
    });
    assert_eq!(d.admin.port(), 0, "no admin API on a DS");
    let mut s = TcpStream::connect_timeout(&d.nfs, common::TIMEOUT).unwrap();
    // NFSv3 NULL answers; MOUNT and NFSv4 are not registered (PROG_UNAVAIL).
    assert_eq!(rpc_call_raw(&mut s, 1, 100003, 3, 0, &[]).0, 0);
    assert_eq!(rpc_call_raw(&mut s, 2, 100005, 3, 0, &[]).0, 1);
    assert_eq!(rpc_call_raw(&mut s, 4, 100000, 2, 0, &[]).0, 1);
    // NFSv4 shares program 100003: version 4 is a PROG_MISMATCH (2).
    assert_eq!(rpc_call_raw(&mut s, 3, 100003, 4, 0, &[]).0, 2);
    assert_eq!(get(d.metrics, "/healthz", None).status, 200);
    signal(&d, libc::SIGTERM);
    assert_eq!(wait_exit(&mut d).0.code(), Some(0));
}

/// `server.pin_cores: true`: each core loop's thread may run only on its
/// own CPU of the process's affinity (loop i on the i-th, wrapping), and
/// NFS still answers.
#[test]
fn pin_cores_pins_each_loop_to_its_cpu() {
    let mut d = start_with("pin", |v| {
        v["server"]["pin_cores"] = json!(true);
        v["server"].as_object_mut().unwrap().remove("threads");
        v["server"]["cores"] = json!(2);
    });
    let allowed = cpu_list(&std::fs::read_to_string(format!("/proc/{}/status", d.proc.child.id())).unwrap());
    // A thread names itself once it runs: look until both loops have.
    let deadline = Instant::now() + START_TIMEOUT;
    let loops = loop {
        let mut loops = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{}/task", d.proc.child.id())).unwrap() {
            let t = t.unwrap().path();
            let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
            if let Some(core) = comm.trim().strip_prefix("chimera-core-") {
                loops.push((core.parse::<usize>().unwrap(), cpu_list(&std::fs::read_to_string(t.join("status")).unwrap())));
            }
        }
        loops.sort();
        if loops.len() == 2 || Instant::now() > deadline {
            break loops;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let want: Vec<(usize, Vec<usize>)> = (0..2).map(|i| (i, vec![allowed[i % allowed.len()]])).collect();
    assert_eq!(loops, want, "process may run on {allowed:?}");
    let mut s = TcpStream::connect_timeout(&d.nfs, common::TIMEOUT).unwrap();
    assert_eq!(rpc_call_raw(&mut s, 1, 100003, 3, 0, &[]).0, 0);
    signal(&d, libc::SIGTERM);
    assert_eq!(wait_exit(&mut d).0.code(), Some(0));
}

/// `Cpus_allowed_list:` of a /proc status file ("0-2,5") as CPU numbers.
fn cpu_list(status: &str) -> Vec<usize> {
    let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list");
    let mut v = Vec::new();
    for part in line.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => v.push(part.parse().unwrap()),
        }
    }
    v
}

/// Export access rules on the real binary: the config's rules refuse this
/// client (127.0.0.1) at MNT; `PUT /api/v1/access/<mount>` changes them
/// without a restart (read-only: MNT and GETATTR work, REMOVE is ROFS; then
/// nobody: the handle learned before is NFS3ERR_ACCES); bad rules are 400
/// naming the field, on the mount and on a volume.
#[test]
fn export_access_rules_from_config_and_admin_api() {
    let d = start_with("access", |v| {
        v["exports"]["/memfs"]["access"] = json!([{ "clients": ["10.0.0.0/8", "fd00::/8"], "access_type": "rw" }]);
    });
    let mut nfs = TcpStream::connect_timeout(&d.nfs, common::TIMEOUT).expect("NFS port accepts");
    let mnt = rpc_call(&mut nfs, 1, 100005, 3, 1, &xdr_opaque(b"/memfs"));
    assert_eq!(&mnt[..4], &13u32.to_be_bytes(), "MNT3ERR_ACCES for a client outside the rules");

    let g = get(d.admin, "/api/v1/access", Some(TOKEN));
    assert_eq!(g.status, 200, "{}", g.text());
    assert_eq!(g.json()["mounts"][0]["mount"], "memfs");
    assert_eq!(g.json()["mounts"][0]["access"][0]["clients"], json!(["10.0.0.0/8", "fd00::/8"]));
    assert_eq!(g.json()["mounts"][0]["access"][0]["squash"], "root_squash");

    let ro = json!({ "access": [{ "clients": "127.0.0.0/8", "access_type": "ro", "squash": "root_squash" }] });
    let r = send(d.admin, "PUT", "/api/v1/access/memfs", Some(TOKEN), &ro);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["access"][0]["access_type"], "ro");
    let mnt = rpc_call(&mut nfs, 2, 100005, 3, 1, &xdr_opaque(b"/memfs"));
    assert_eq!(&mnt[..4], &[0, 0, 0, 0], "MNT3_OK once the rules admit us");
    let fh_len = u32::from_be_bytes(mnt[4..8].try_into().unwrap()) as usize;
    let fh = mnt[8..8 + fh_len].to_vec();
    let getattr = |nfs: &mut TcpStream, xid| rpc_call(nfs, xid, 100003, 3, 1, &xdr_opaque(&fh))[..4].to_vec();
    assert_eq!(getattr(&mut nfs, 3), vec![0, 0, 0, 0], "GETATTR on ro");
    let mut remove = xdr_opaque(&fh);
    remove.extend_from_slice(&xdr_opaque(b"nothing"));
    let r = rpc_call(&mut nfs, 4, 100003, 3, 12, &remove);
    assert_eq!(&r[..4], &30u32.to_be_bytes(), "NFS3ERR_ROFS");

    let r = send(d.admin, "PUT", "/api/v1/access/memfs", Some(TOKEN), &json!({ "access": [] }));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(getattr(&mut nfs, 5), 13u32.to_be_bytes().to_vec(), "the handle learned before stops working");

    // Bad rules: 400 naming the field, nothing changed.
    for (body, needle) in [
        (json!({ "access": [{ "clients": "127.0.0.1/8" }] }), "access[0].clients"),
        (json!({ "access": [{ "clients": "*", "squash": "none" }] }), "access[0].squash"),
        (json!({ "access": "rw" }), "access:"),
        (json!({ "rules": [] }), "rules: unknown field"),
        (json!({}), "access: required"),
    ] {
        let r = send(d.admin, "PUT", "/api/v1/access/memfs", Some(TOKEN), &body);
        assert_eq!(r.status, 400, "{body}");
        assert!(r.error().contains(needle), "{body}: {}", r.error());
    }
    assert_eq!(get(d.admin, "/api/v1/access/memfs", Some(TOKEN)).json()["access"], json!([]));
    assert_eq!(send(d.admin, "PUT", "/api/v1/access/nope", Some(TOKEN), &ro).status, 404);
    assert_eq!(send(d.admin, "PUT", "/api/v1/access/memfs", None, &ro).status, 401);

    // Open again (null): the same handle works.
    let r = send(d.admin, "PUT", "/api/v1/access/memfs", Some(TOKEN), &json!({ "access": null }));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["access"], Value::Null);
    assert_eq!(getattr(&mut nfs, 6), vec![0, 0, 0, 0]);

    // Volumes: without `access` as before; with rules of their own
    // (tests/volume_access.rs enforces them); a bad list is 400 naming
    // the field and changes nothing.
    let r = send(d.admin, "POST", "/api/v1/volumes", Some(TOKEN), &json!({"name": "pvc-r", "capacityBytes": 1 << 20}));
    assert_eq!(r.status, 201, "{}", r.text());
    let r = send(d.admin, "POST", "/api/v1/volumes", Some(TOKEN), &json!({"name": "pvc-s", "capacityBytes": 1 << 20, "access": [{"clients": "*"}]}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["access"][0]["squash"], "root_squash");
    let r = send(d.admin, "PATCH", "/api/v1/volumes/pvc-r", Some(TOKEN), &json!({"capacityBytes": 2 << 20, "access": [{"clients": "300.0.0.1"}]}));
    assert_eq!(r.status, 400);
    assert!(r.error().starts_with("access[0].clients:"), "{}", r.error());
    assert_eq!(get(d.admin, "/api/v1/volumes/pvc-r", Some(TOKEN)).json()["capacityBytes"], 1 << 20, "a refused PATCH changes nothing");
}
