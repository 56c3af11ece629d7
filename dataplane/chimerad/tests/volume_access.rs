//! Per-volume client rules through the real binary, the admin API and the
//! userspace client's NFSv3 and NFSv4.1 (peer 127.0.0.1, uid 0):
//! - a volume made read-only (`PATCH ... {"access": [ro]}`) refuses WRITE,
//!   CREATE, MKDIR, SETATTR and REMOVE with NFS3ERR_ROFS, OPEN-create and
//!   an open file's WRITE with NFS4ERR_ROFS, on handles learned before the
//!   change, while reads
//!   work and another volume of the same export takes every change;
//! - `root_squash` on a volume makes files root creates there (NFSv3
//!   CREATE, NFSv4.1 OPEN) belong to the volume's anonymous uid/gid, while
//!   root keeps uid 0 in a volume without rules;
//! - rules admitting nobody: MNT of the volume is MNT3ERR_ACCES and a
//!   handle from before is NFS3ERR_ACCES; `null` restores the export's
//!   rules alone;
//! - the export's rules still apply on top (ro at the export wins over a
//!   volume's rw);
//! - `GET` shows the rules; bad bodies (and rules too large to store) are
//!   400 naming the key and change nothing; a create repeated with other
//!   rules is 409; a volume deleted and made again has none.

mod common;
mod process;

use client::nfs3::{Nfs3, SetAttr, Stable};
use client::nfs4::Nfs41;
use client::{Auth, Limits};
use common::{get, send};
use process::{listening, spawn, until_started_or_exit, Proc};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

const TOKEN: &str = "volume-access-token";
const ROFS: u32 = 30;
const ACCES: u32 = 13;

struct Up {
    _proc: Proc,
    nfs: String,
    admin: SocketAddr,
    dir: PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(name: &str) -> Up {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("volaccess-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let v = json!({
        "common": { "log_level": "info" },
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
        "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": "64M" } },
        "exports": { "/memfs": { "path": "/memfs" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": TOKEN, "tls": false },
        "metrics": { "enabled": false }
    });
    let cfg = dir.join("chimera.json");
    std::fs::write(&cfg, v.to_string()).unwrap();
    let mut p = spawn(&cfg);
    let lines = until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
    Up { nfs: listening(&lines, "nfs").to_string(), admin: listening(&lines, "admin"), _proc: p, dir }
}

fn limits() -> Limits {
    Limits { timeout: Duration::from_secs(5), ..Limits::default() }
}

fn nfs3_code(r: Result<impl std::fmt::Debug, client::Error>) -> u32 {
    match r {
        Err(client::Error::Nfs3 { code, .. }) => code,
        other => panic!("expected an NFSv3 error, got {other:?}"),
    }
}

fn create_volume(up: &Up, name: &str, access: Option<Value>) -> Value {
    let mut body = json!({ "name": name, "capacityBytes": 8 << 20 });
    if let Some(a) = access {
        body["access"] = a;
    }
    let r = send(up.admin, "POST", "/api/v1/volumes", Some(TOKEN), &body);
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()
}

fn patch(up: &Up, name: &str, body: Value) -> Value {
    let r = send(up.admin, "PATCH", &format!("/api/v1/volumes/{name}"), Some(TOKEN), &body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

#[test]
fn volume_rules_narrow_the_export_over_nfs3_and_nfs41() {
    let up = start("rules");
    let root = Auth::sys(0, 0);
    let ro = create_volume(&up, "vol-ro", None);
    assert_eq!(ro["access"], Value::Null, "no rules of its own");
    create_volume(&up, "vol-rw", None);
    let squash = json!([{ "clients": "*", "access_type": "rw", "squash": "root_squash", "anonymous_uid": 4242, "anonymous_gid": 4343 }]);
    let sq = create_volume(&up, "vol-sq", Some(squash.clone()));
    assert_eq!(sq["access"][0]["squash"], "root_squash");
    assert_eq!(sq["access"][0]["clients"], json!(["*"]));
    assert_eq!(get(up.admin, "/api/v1/volumes/vol-sq", Some(TOKEN)).json()["access"], sq["access"]);

    // Handles learned while every volume is open.
    let vro = client::nfs3::mount_at(&up.nfs, "/memfs/volumes/vol-ro", &root, limits()).unwrap();
    let vrw = client::nfs3::mount_at(&up.nfs, "/memfs/volumes/vol-rw", &root, limits()).unwrap();
    let mut c = Nfs3::connect(&up.nfs, &root, limits()).unwrap();
    let f_ro = c.create(&vro, b"f", 0o666, true).unwrap();
    c.write(&f_ro, 0, b"before", Stable::FileSync).unwrap();
    c.create(&vro, b"doomed", 0o666, true).unwrap();
    let f_rw = c.create(&vrw, b"f", 0o666, true).unwrap();
    c.create(&vrw, b"doomed", 0o666, true).unwrap();

    let r = patch(&up, "vol-ro", json!({ "access": [{ "clients": "*", "access_type": "ro", "squash": "no_root_squash" }] }));
    assert_eq!(r["access"][0]["access_type"], "ro");
    assert_eq!(r["capacityBytes"], 8 << 20, "the capacity stays");

    // Inside vol-ro every change is ROFS and changes nothing; reads work.
    let chmod = SetAttr { mode: Some(0o600), ..Default::default() };
    assert_eq!(nfs3_code(c.write(&f_ro, 0, b"after!", Stable::FileSync)), ROFS, "WRITE");
    assert_eq!(nfs3_code(c.create(&vro, b"new", 0o644, true)), ROFS, "CREATE");
    assert_eq!(nfs3_code(c.mkdir(&vro, b"d", 0o755)), ROFS, "MKDIR");
    assert_eq!(nfs3_code(c.setattr(&f_ro, &chmod)), ROFS, "SETATTR");
    assert_eq!(nfs3_code(c.remove(&vro, b"doomed")), ROFS, "REMOVE");
    let mut got = Vec::new();
    c.read(&f_ro, 0, 64, &mut got).unwrap();
    assert_eq!(got, b"before");
    assert_eq!(c.getattr(&f_ro).unwrap().mode & 0o777, 0o666);
    assert!(c.lookup(&vro, b"doomed").is_ok());
    // The same calls in vol-rw, same export, same client: all accepted.
    c.write(&f_rw, 0, b"after!", Stable::FileSync).unwrap();
    c.create(&vrw, b"new", 0o644, true).unwrap();
    c.mkdir(&vrw, b"d", 0o755).unwrap();
    c.setattr(&f_rw, &chmod).unwrap();
    c.remove(&vrw, b"doomed").unwrap();
    assert_eq!(c.getattr(&f_rw).unwrap().mode & 0o777, 0o600);

    // NFSv4.1: OPEN-create in vol-ro is ROFS, in vol-rw it works.
    let mut v4 = Nfs41::connect(&up.nfs, &root, limits(), b"volume-access-test").unwrap();
    match v4.open("memfs/volumes/vol-ro", "v4", 3, Some(0o644)) {
        Err(client::Error::Nfs4 { code, .. }) => assert_eq!(code, ROFS),
        other => panic!("OPEN create in a read-only volume: {other:?}"),
    }
    let o = v4.open("memfs/volumes/vol-rw", "v4", 3, Some(0o644)).unwrap();
    v4.write(&o, 0, b"v4 data", true).unwrap();
    // A rule change reaches the open file: WRITE on the stateid and handle
    // from before is ROFS while vol-rw is read-only, and works again after.
    patch(&up, "vol-rw", json!({ "access": [{ "clients": "*", "access_type": "ro", "squash": "no_root_squash" }] }));
    match v4.write(&o, 0, b"refused", true) {
        Err(client::Error::Nfs4 { code, .. }) => assert_eq!(code, ROFS),
        other => panic!("NFSv4.1 WRITE after the volume turned read-only: {other:?}"),
    }
    patch(&up, "vol-rw", json!({ "access": null }));
    v4.write(&o, 0, b"v4 data", true).unwrap();
    v4.close(&o).unwrap();

    // root_squash in vol-sq: root's files are the anonymous uid's, over
    // both versions; in vol-rw (no rules, open export) root stays root.
    let vsq = client::nfs3::mount_at(&up.nfs, "/memfs/volumes/vol-sq", &root, limits()).unwrap();
    let f = c.create(&vsq, b"by-root", 0o644, true).unwrap();
    let a = c.getattr(&f).unwrap();
    assert_eq!((a.uid, a.gid), (4242, 4343), "root squashed in vol-sq");
    let o = v4.open("memfs/volumes/vol-sq", "by-root-v4", 3, Some(0o644)).unwrap();
    v4.close(&o).unwrap();
    let (f4, _) = c.lookup(&vsq, b"by-root-v4").unwrap();
    let a = c.getattr(&f4).unwrap();
    assert_eq!((a.uid, a.gid), (4242, 4343), "root squashed over NFSv4.1 too");
    let (f4, _) = c.lookup(&vrw, b"v4").unwrap();
    assert_eq!(c.getattr(&f4).unwrap().uid, 0, "no squash outside vol-sq");
    assert_eq!(c.getattr(&f_rw).unwrap().uid, 0);

    // Nobody admitted: MNT refused, the old handle refused, other volumes fine.
    patch(&up, "vol-ro", json!({ "access": [{ "clients": "10.0.0.0/8" }] }));
    match client::nfs3::mount_at(&up.nfs, "/memfs/volumes/vol-ro", &root, limits()) {
        Err(client::Error::Mount { code, .. }) => assert_eq!(code, ACCES),
        other => panic!("MNT of a volume whose rules refuse us: {other:?}"),
    }
    assert_eq!(nfs3_code(c.getattr(&f_ro)), ACCES, "a handle from before the change");
    assert_eq!(nfs3_code(c.getattr(&vro)), ACCES, "the volume root too");
    c.getattr(&f_rw).unwrap();
    client::nfs3::mount_at(&up.nfs, "/memfs/volumes/vol-rw", &root, limits()).unwrap();

    // null: the export's rules alone again; the old handle writes.
    let r = patch(&up, "vol-ro", json!({ "access": null }));
    assert_eq!(r["access"], Value::Null);
    c.write(&f_ro, 0, b"after!", Stable::FileSync).unwrap();

    // The export's rules still bound every volume: ro there wins over the
    // volume's rw, and root_squash there meets the volume's.
    let r = send(up.admin, "PUT", "/api/v1/access/memfs", Some(TOKEN), &json!({ "access": [{ "clients": "*", "access_type": "ro" }] }));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(nfs3_code(c.create(&vsq, b"more", 0o644, true)), ROFS, "export ro, volume rw");
    let r = send(up.admin, "PUT", "/api/v1/access/memfs", Some(TOKEN), &json!({ "access": null }));
    assert_eq!(r.status, 200, "{}", r.text());
    c.create(&vsq, b"more", 0o644, true).unwrap();

    // Bad bodies: 400 naming the key; nothing made or changed.
    for (method, path, body, needle) in [
        ("POST", "/api/v1/volumes", json!({ "name": "vol-bad", "capacityBytes": 1 << 20, "access": [{ "clients": "300.0.0.1" }] }), "access[0].clients"),
        ("POST", "/api/v1/volumes", json!({ "name": "vol-bad", "capacityBytes": 1 << 20, "access": "ro" }), "access:"),
        ("POST", "/api/v1/volumes", json!({ "name": "vol-bad", "capacityBytes": 1 << 20, "access": [{ "clients": "*", "squash": "none" }] }), "access[0].squash"),
        ("PATCH", "/api/v1/volumes/vol-sq", json!({ "access": [{ "clients": "*", "access_type": "rx" }] }), "access[0].access_type"),
        ("PATCH", "/api/v1/volumes/vol-sq", json!({ "access": [{ "clients": "*", "anonymous_uid": -1 }] }), "access[0].anonymous_uid"),
        ("PATCH", "/api/v1/volumes/vol-sq", json!({ "access": [{ "clients": "*", "who": 1 }] }), "access[0].who"),
        ("PATCH", "/api/v1/volumes/vol-sq", json!({}), "capacityBytes: required"),
    ] {
        let r = send(up.admin, method, path, Some(TOKEN), &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.error().starts_with(needle), "{body}: {}", r.error());
    }
    // Rules that would not fit the volume's stored form (4096 bytes): 400,
    // and the capacity asked for in the same PATCH is not applied either.
    let many: Vec<Value> = (0..64).map(|i| json!({ "clients": format!("10.0.{i}.0/24"), "access_type": "ro" })).collect();
    let r = send(up.admin, "PATCH", "/api/v1/volumes/vol-sq", Some(TOKEN), &json!({ "capacityBytes": 16 << 20, "access": many }));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().starts_with("access: the rules take"), "{}", r.error());
    assert_eq!(get(up.admin, "/api/v1/volumes/vol-sq", Some(TOKEN)).json()["capacityBytes"], 8 << 20);
    assert_eq!(get(up.admin, "/api/v1/volumes/vol-bad", Some(TOKEN)).status, 404);
    assert_eq!(get(up.admin, "/api/v1/volumes/vol-sq", Some(TOKEN)).json()["access"], sq["access"], "unchanged");
    let list = get(up.admin, "/api/v1/volumes", Some(TOKEN)).json();
    let shown: Vec<&Value> = list["volumes"].as_array().unwrap().iter().map(|v| &v["access"]).collect();
    assert_eq!(shown, vec![&Value::Null, &Value::Null, &sq["access"]], "{list}");

    // Create is idempotent with the same rules, a conflict with others.
    let body = json!({ "name": "vol-sq", "capacityBytes": 8 << 20, "access": squash });
    assert_eq!(send(up.admin, "POST", "/api/v1/volumes", Some(TOKEN), &body).status, 200);
    let body = json!({ "name": "vol-sq", "capacityBytes": 8 << 20 });
    let r = send(up.admin, "POST", "/api/v1/volumes", Some(TOKEN), &body);
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.error().contains("access rules"), "{}", r.error());

    // Deleting a volume drops its rules: one made again under the name is open.
    let r = send(up.admin, "DELETE", "/api/v1/volumes/vol-sq", Some(TOKEN), &json!({}));
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(create_volume(&up, "vol-sq", None)["access"], Value::Null);
    let vsq = client::nfs3::mount_at(&up.nfs, "/memfs/volumes/vol-sq", &root, limits()).unwrap();
    let f = c.create(&vsq, b"by-root", 0o644, true).unwrap();
    assert_eq!(c.getattr(&f).unwrap().uid, 0);
}
