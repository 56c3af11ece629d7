//! Proves the config contract of CONFIG.md on whole files:
//! - a config written for the reference Chimera daemon (mounts/exports keyed
//!   by name, `server.threads`, pNFS data servers, SMB shares, S3 buckets)
//!   is accepted, and every key we do not implement is reported by name as a
//!   warning instead of being silently dropped;
//! - keys of no known format are errors naming the key path;
//! - values turning from valid to invalid (ranges, types, cross-key rules)
//!   are errors naming the field and the problem;
//! - the `chimerad --check-config` binary prints OK / the error and sets the
//!   exit code accordingly.

use chimerad::config::{Config, LogLevel, Module, Netid, Role};
use serde_json::{json, Value};
use std::process::Command;

/// Shaped like the reference daemon's shipped configs (keys as that daemon
/// reads them), with only our backend-specific edit: the token.
fn reference_shaped() -> Value {
    json!({
        "common": { "log_level": "debug", "huge_pages": true, "slab_size": "2M" },
        "server": {
            "threads": 4,
            "delegation_threads": 1,
            "sync_delegation_threads": 8,
            "async_delegation": false,
            "rest_http_port": 18080,
            "metrics_port": 19000,
            "nfs_port": 12049,
            "rdma": false,
            "nfs4_lease_time": 30,
            "smb_encryption": "off",
            "pnfs": {
                "enabled": true,
                "data_servers": [
                    { "netid": "tcp", "uaddr": "10.0.0.2", "backing_path": "/ds0" },
                    { "netid": "rdma", "uaddr": "10.0.0.3:20050", "backing_path": "/ds1", "version": "4.1" }
                ]
            }
        },
        "mounts": {
            "memfs_dir": { "module": "memfs", "path": "/" }
        },
        "exports": {
            "/nfs1": { "path": "/memfs_dir" }
        },
        "shares": { "smb1": { "path": "/memfs_dir" } },
        "buckets": { "b1": { "path": "/memfs_dir" } },
        "admin": { "token": "s3cr3t-token" }
    })
}

fn parse(v: &Value) -> Result<Config, chimerad::config::ConfigError> {
    Config::parse(&v.to_string())
}

fn error_of(v: &Value) -> (String, String) {
    let e = parse(v).expect_err("config must be rejected");
    (e.path, e.msg)
}

#[test]
fn reference_config_is_accepted_with_warnings_naming_foreign_keys() {
    let cfg = parse(&reference_shaped()).unwrap();
    assert_eq!(cfg.log_level, LogLevel::Debug);
    assert_eq!(cfg.server.cores, 4);
    assert_eq!(cfg.server.nfs_port, 12049);
    assert_eq!(cfg.server.lease_time_s, 30);
    // Grace defaults to one lease period.
    assert_eq!(cfg.server.grace_time_s, 30);
    assert_eq!(cfg.server.role, Role::Both);
    assert_eq!(cfg.admin.port, 18080);
    assert_eq!(cfg.metrics.port, 19000);
    assert_eq!(cfg.mounts.len(), 1);
    assert_eq!(cfg.mounts[0].name, "memfs_dir");
    assert_eq!(cfg.mounts[0].module, Module::Memfs);
    assert_eq!(cfg.exports[0].name, "/nfs1");
    assert_eq!(cfg.exports[0].path, "/memfs_dir");
    assert_eq!(cfg.volumes_path, "/memfs_dir/volumes");
    let ds = &cfg.server.pnfs.data_servers;
    assert!(cfg.server.pnfs.enabled);
    assert_eq!((ds[0].netid, ds[0].host.as_str(), ds[0].port, ds[0].version), (Netid::Tcp, "10.0.0.2", 2049, (3, 0)));
    assert_eq!((ds[1].netid, ds[1].port, ds[1].version), (Netid::Rdma, 20050, (4, 1)));

    let w = cfg.warnings.join("\n");
    for key in [
        "shares",
        "buckets",
        "common.huge_pages",
        "common.slab_size",
        "server.delegation_threads",
        "server.sync_delegation_threads",
        "server.async_delegation",
        "server.smb_encryption",
    ] {
        assert!(cfg.warnings.iter().any(|x| x.starts_with(&format!("{key}:"))), "no warning for {key} in:\n{w}");
    }
    // Implemented keys are not warned about.
    for key in ["server.threads", "server.nfs_port", "server.pnfs", "mounts", "exports", "admin"] {
        assert!(!cfg.warnings.iter().any(|x| x.starts_with(&format!("{key}:"))), "spurious warning for {key}");
    }
    assert_eq!(cfg.warnings.len(), 8, "{w}");
}

#[test]
fn array_forms_of_mounts_and_exports_are_accepted() {
    let cfg = parse(&json!({
        "server": { "role": "mds", "cores": 2, "bind": "127.0.0.1" },
        "mounts": [ { "name": "share", "module": "memfs", "path": "/", "capacity_bytes": "64M" } ],
        "exports": [ { "name": "/share", "path": "/share" } ],
        "volumes": { "path": "/share/vols" },
        "admin": { "token": "t0k3n", "bind": "127.0.0.1", "port": 0 },
        "metrics": { "bind": "127.0.0.1", "port": 0 }
    }))
    .unwrap();
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
    assert_eq!(cfg.mounts[0].capacity_bytes, 64 << 20);
    assert_eq!(cfg.volumes_path, "/share/vols");
    assert_eq!(cfg.server.role, Role::Mds);
    assert_eq!(cfg.server.bind.to_string(), "127.0.0.1");
}

/// Insert `value` at the dotted `path` of the reference config.
fn with(path: &str, value: Value) -> Value {
    let mut v = reference_shaped();
    let mut cur = &mut v;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        cur = cur.as_object_mut().unwrap().entry(p.to_string()).or_insert(json!({}));
    }
    cur.as_object_mut().unwrap().insert(parts[parts.len() - 1].to_string(), value);
    v
}

#[test]
fn unknown_keys_are_errors_naming_the_key_path() {
    for path in ["server.foo", "bogus", "common.colour", "admin.tokn", "metrics.prt", "server.pnfs.stripe", "mounts.memfs_dir.capacity"] {
        let (p, msg) = error_of(&with(path, json!(1)));
        assert_eq!(p, path);
        assert_eq!(msg, "unknown key");
    }
    let mut v = reference_shaped();
    v["server"]["pnfs"]["data_servers"][1]["weight"] = json!(3);
    assert_eq!(error_of(&v).0, "server.pnfs.data_servers[1].weight");
}

#[test]
fn invalid_values_name_the_field_and_problem() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("server.nfs_port", json!(70000), "out of range"),
        ("server.nfs_port", json!("2049"), "expected a non-negative integer"),
        ("server.cores", json!(0), "out of range"),
        ("server.cores", json!(3), "contradicts server.threads"),
        ("server.record_bytes_max", json!("64G"), "out of range"),
        ("server.record_bytes_max", json!("lots"), "expected a size"),
        ("server.inflight_per_conn_max", json!(-1), "expected a non-negative integer"),
        ("server.conns_max", json!(1_000_000), "out of range"),
        ("server.lease_time_s", json!(31), "contradicts server.nfs4_lease_time"),
        ("server.role", json!("client"), "expected \"mds\""),
        ("server.bind", json!("localhost:1"), "expected an IP address"),
        ("server.rdma", json!("yes"), "expected true or false"),
        ("server.pnfs.stripe_unit_bytes", json!(3000 * 1024), "not a power of two"),
        ("server.pnfs.mirrors", json!(3), "need at least as many data servers"),
        ("common.log_level", json!("loud"), "expected one of"),
        ("mounts.memfs_dir.module", json!("linux"), "not available in this build"),
        ("mounts.memfs_dir.path", json!("/srv"), "memfs has no backing path"),
        ("mounts.memfs_dir.capacity_bytes", json!(10), "out of range"),
        ("exports./nfs1.path", json!("/nope"), "not under a configured mount"),
        ("exports./nfs1.path", json!("relative"), "must be absolute"),
        ("volumes.path", json!("/memfs_dir"), "must be a directory inside a mount"),
        ("volumes.path", json!("/other/v"), "not under a configured mount"),
        ("admin.token", json!("has space"), "may contain only"),
        ("admin.port", json!(8080), "contradicts server.rest_http_port"),
    ];
    for (path, value, want) in cases {
        let (p, msg) = error_of(&with(path, value.clone()));
        assert_eq!(p, path, "{path}={value}: error names another key: {msg}");
        assert!(msg.contains(want), "{path}={value}: message {msg:?} lacks {want:?}");
    }
}

#[test]
fn port_collisions_name_both_keys() {
    // Set through the reference aliases; reported on our canonical keys.
    let (p, msg) = error_of(&with("server.rest_http_port", json!(12049)));
    assert_eq!((p.as_str(), msg.as_str()), ("admin.port", "port 12049 is also used by server.nfs_port"));
    let (p, msg) = error_of(&with("server.metrics_port", json!(18080)));
    assert_eq!((p.as_str(), msg.as_str()), ("metrics.port", "port 18080 is also used by admin.port"));
    // Distinct addresses may share a port; port 0 (kernel-chosen) never collides.
    let mut v = with("server.bind", json!("127.0.0.1"));
    v["admin"]["bind"] = json!("127.0.0.2");
    v["server"]["rest_http_port"] = json!(12049);
    assert!(parse(&v).is_ok());
    let mut v = with("server.rest_http_port", json!(0));
    v["server"]["metrics_port"] = json!(0);
    assert!(parse(&v).is_ok());
}

#[test]
fn structural_errors() {
    assert!(Config::parse("{").unwrap_err().msg.contains("invalid JSON at line 1"));
    assert_eq!(Config::parse("[]").unwrap_err().msg, "expected an object, got an array");
    let (p, msg) = error_of(&with("mounts", json!("memfs")));
    assert_eq!(p, "mounts");
    assert!(msg.contains("expected an object keyed by name or an array"));
    let (p, _) = error_of(&with("mounts", json!([{ "module": "memfs" }])));
    assert_eq!(p, "mounts[0].name");
    let (p, msg) = error_of(&with("mounts", json!({})));
    assert_eq!(p, "mounts");
    assert!(msg.contains("at least one mount"));
    let (p, msg) = error_of(&with("mounts", json!({ "a/b": { "module": "memfs" } })));
    assert_eq!(p, "mounts.a/b");
    assert!(msg.contains("must not"));
    let mut v = reference_shaped();
    v["admin"] = json!({});
    let (p, msg) = error_of(&v);
    assert_eq!(p, "admin.token");
    assert!(msg.contains("required"));
    v["server"]["pnfs"]["data_servers"] = json!([{ "uaddr": "10.0.0.2:0" }]);
    v["admin"] = json!({ "token": "x" });
    assert_eq!(error_of(&v).0, "server.pnfs.data_servers[0].uaddr");
}

#[test]
fn ds_role_needs_no_mounts_or_admin() {
    let cfg = parse(&json!({ "server": { "data_server": true, "nfs_port": 2050 } })).unwrap();
    assert_eq!(cfg.server.role, Role::Ds);
    assert!(!cfg.admin.enabled);
    assert_eq!(cfg.volumes_path, "");
    let (p, _) = error_of(&json!({ "server": { "data_server": true, "role": "mds" } }));
    assert_eq!(p, "server.data_server");
}

#[test]
fn token_file_is_read_and_trimmed() {
    let dir = std::env::temp_dir().join(format!("chimerad-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("token");
    std::fs::write(&f, "abc.DEF-123\n").unwrap();
    let mut v = reference_shaped();
    v["admin"] = json!({ "token_file": f.to_str().unwrap() });
    assert_eq!(parse(&v).unwrap().admin.token, "abc.DEF-123");
    std::fs::write(&f, "\n").unwrap();
    assert!(error_of(&v).1.contains("is empty"));
    v["admin"] = json!({ "token_file": dir.join("missing").to_str().unwrap() });
    assert_eq!(error_of(&v).0, "admin.token_file");
    v["admin"] = json!({ "token_file": f.to_str().unwrap(), "token": "x" });
    assert!(error_of(&v).1.contains("not both"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_config_cli_reports_ok_and_errors_with_exit_codes() {
    let bin = env!("CARGO_BIN_EXE_chimerad");
    let dir = std::env::temp_dir().join(format!("chimerad-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.json");
    std::fs::write(&good, reference_shaped().to_string()).unwrap();
    let out = Command::new(bin).args(["--check-config", "--config"]).arg(&good).output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning: shares:"));

    let bad = dir.join("bad.json");
    std::fs::write(&bad, with("server.foo", json!(1)).to_string()).unwrap();
    let out = Command::new(bin).args(["--check-config", "--config"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.foo: unknown key"));

    let out = Command::new(bin).arg("--frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(bin).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("chimerad "));
    let out = Command::new(bin).arg("--help").output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("--check-config"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The shapes the operator renders (operator/render/config.go) for the MDS
/// and for a DS, and the one the CSI tests start chimerad with, must be
/// accepted; the reference-format tuning keys the operator passes through
/// are warnings, not errors.
#[test]
fn operator_and_csi_rendered_configs_are_accepted() {
    let dir = std::env::temp_dir().join(format!("chimerad-op-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "b64+token/=\n").unwrap();
    let mds = json!({
        "common": { "log_level": "info", "log_format": "json", "huge_pages": true, "huge_page_size": "2M", "slab_size": 2097152 },
        "server": { "role": "mds", "bind": "0.0.0.0", "cores": 2, "nfs_port": 2049, "mount_port": 20048, "portmap_port": 0,
                    "rdma": true, "rdma_port": 2049,
                    "pnfs": { "enabled": true, "stripe_unit_bytes": 1048576, "mirrors": 2, "data_servers": [] } },
        "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": 1073741824 } },
        "exports": { "/memfs": { "path": "/memfs" } },
        "volumes": { "path": "/memfs/volumes" },
        "admin": { "bind": "0.0.0.0", "port": 8080, "token_file": token.to_str().unwrap() },
        "metrics": { "bind": "0.0.0.0", "port": 9000 }
    });
    let cfg = parse(&mds).unwrap();
    assert_eq!(cfg.server.role, Role::Mds);
    assert_eq!(cfg.admin.token, "b64+token/=");
    assert!(cfg.server.rdma);
    assert_eq!(cfg.warnings.len(), 3, "{:?}", cfg.warnings);
    let ds = json!({
        "common": { "log_level": "info", "log_format": "json" },
        "server": { "role": "ds", "bind": "0.0.0.0", "nfs_port": 2049, "mount_port": 20048, "portmap_port": 0, "rdma": false },
        "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": 1073741824 } },
        "exports": { "/memfs": { "path": "/memfs" } },
        "metrics": { "bind": "0.0.0.0", "port": 9000 }
    });
    let cfg = parse(&ds).unwrap();
    assert_eq!(cfg.server.role, Role::Ds);
    assert!(!cfg.admin.enabled && cfg.warnings.is_empty());
    let csi = json!({
        "common": { "log_level": "info" },
        "server": { "role": "both", "bind": "127.0.0.1", "cores": 1, "nfs_port": 40001, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
        "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": 268435456 } },
        "exports": { "/memfs": { "path": "/memfs" } },
        "admin": { "bind": "127.0.0.1", "port": 40002, "token": "sanity-token-0123456789" },
        "metrics": { "enabled": false }
    });
    assert!(parse(&csi).unwrap().warnings.is_empty());
    // The NVMe module the operator may render is refused with a clear message.
    let mut nvme = mds.clone();
    nvme["mounts"]["memfs"] = json!({ "module": "nvme", "path": "/" });
    let (p, msg) = error_of(&nvme);
    assert_eq!(p, "mounts.memfs.module");
    assert!(msg.contains("\"nvme\" is not available in this build"), "{msg}");
    // Too many cores for the runtime is caught here, naming the key.
    let mut many = csi.clone();
    many["server"]["cores"] = json!(65);
    assert_eq!(error_of(&many).0, "server.cores");
    std::fs::remove_dir_all(&dir).unwrap();
}
