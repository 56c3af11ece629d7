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
//! - `admin.tls`: HTTPS from PEM files or an explicit `false`; nothing said
//!   is an error; missing files, bad PEM and a key that is not the
//!   certificate's are errors naming the key and the file.

mod common;

use chimerad::config::{AdminTls, Config, HugePages, LogLevel, Module, Netid, Role};
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
    // The reference's `threads` is capped at the CPUs usable here (a warning
    // says so); `cores` would be taken as written.
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(cfg.server.cores, 4.min(cpus));
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
        "server.delegation_threads",
        "server.sync_delegation_threads",
        "server.async_delegation",
        "server.smb_encryption",
    ] {
        assert!(cfg.warnings.iter().any(|x| x.starts_with(&format!("{key}:"))), "no warning for {key} in:\n{w}");
    }
    // Implemented keys are not warned about (server.threads only when capped, above).
    for key in ["server.nfs_port", "server.pnfs", "mounts", "exports", "admin", "common.huge_pages", "common.slab_size"] {
        assert!(!cfg.warnings.iter().any(|x| x.starts_with(&format!("{key}:"))), "spurious warning for {key}");
    }
    let capped = cpus < 4;
    assert_eq!(cfg.warnings.iter().any(|x| x.starts_with("server.threads: 4 requested")), capped, "{w}");
    assert_eq!(cfg.warnings.len(), 6 + usize::from(capped), "{w}");
    assert_eq!(cfg.huge_pages, HugePages::On { page_bytes: 2 << 20, slab_bytes: 2 << 20, preallocate_slabs: 1 });
}

#[test]
fn array_forms_of_mounts_and_exports_are_accepted() {
    let cfg = parse(&json!({
        "server": { "role": "mds", "cores": 2, "bind": "127.0.0.1" },
        "mounts": [ { "name": "share", "module": "memfs", "path": "/", "capacity_bytes": "64M" } ],
        "exports": [ { "name": "/share", "path": "/share" } ],
        "volumes": { "path": "/share/vols" },
        "admin": { "token": "t0k3n", "bind": "127.0.0.1", "port": 0, "tls": false },
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
    // No token: accepted, one is generated at start (a note says so); an
    // empty one is a mistake, not a request for one.
    let mut v = reference_shaped();
    v["admin"] = json!({});
    let cfg = parse(&v).unwrap();
    assert!(cfg.admin.token_generate && cfg.admin.token.is_empty());
    assert!(cfg.notes.iter().any(|n| n.starts_with("admin.token: none set")), "{:?}", cfg.notes);
    v["admin"] = json!({ "token": "" });
    let (p, msg) = error_of(&v);
    assert_eq!(p, "admin.token");
    assert!(msg.contains("must not be empty"), "{msg}");
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
    // The operator's admin TLS Secret, as mounted (tls.crt, tls.key).
    let (cert, key) = common::certs::Ca::new("operator CA").server_files(&dir.join("admin-tls"), &["c-mds.ns.svc"]);
    let mds = json!({
        "common": { "log_level": "info", "log_format": "json", "huge_pages": true, "huge_page_size": "2M", "slab_size": 2097152 },
        "server": { "role": "mds", "bind": "0.0.0.0", "cores": 2, "nfs_port": 2049, "mount_port": 20048, "portmap_port": 0,
                    "rdma": true, "rdma_port": 2049,
                    "pnfs": { "enabled": true, "stripe_unit_bytes": 1048576, "mirrors": 2, "data_servers": [] } },
        "mounts": { "memfs": { "module": "memfs", "path": "/", "capacity_bytes": 1073741824 } },
        "exports": { "/memfs": { "path": "/memfs" } },
        "volumes": { "path": "/memfs/volumes" },
        "admin": { "bind": "0.0.0.0", "port": 8080, "token_file": token.to_str().unwrap(),
                   "tls": { "cert_file": cert.to_str().unwrap(), "key_file": key.to_str().unwrap() } },
        "metrics": { "bind": "0.0.0.0", "port": 9000 }
    });
    let cfg = parse(&mds).unwrap();
    assert!(matches!(cfg.admin.tls, chimerad::config::AdminTls::On { .. }));
    assert_eq!(cfg.server.role, Role::Mds);
    assert_eq!(cfg.admin.token, "b64+token/=");
    assert!(cfg.server.rdma);
    // huge_pages, huge_page_size, slab_size are ours now: no warnings.
    assert_eq!(cfg.warnings.len(), 0, "{:?}", cfg.warnings);
    assert_eq!(cfg.huge_pages, HugePages::On { page_bytes: 2 << 20, slab_bytes: 2 << 20, preallocate_slabs: 1 });
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
        "admin": { "bind": "127.0.0.1", "port": 40002, "token": "sanity-token-0123456789", "tls": false },
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

/// The reference's data-server form (`netid`, `tcp`, `rdma`, `backing_path`)
/// maps onto ours: the netid picks the advertised address, ports default to
/// 2049 (TCP) / 20049 (RDMA); what our model cannot carry is refused.
#[test]
fn reference_form_data_servers_map_onto_ours() {
    let ds = |list: Value| {
        let mut v = reference_shaped();
        v["server"]["pnfs"]["data_servers"] = list;
        v
    };
    let cfg = parse(&ds(json!([
        { "netid": "rdma", "tcp": "10.67.25.209", "rdma": "10.67.25.209", "backing_path": "/ds1" },
        { "netid": "tcp", "tcp": "10.67.25.211:2050", "rdma": "10.67.25.211" },
        { "tcp": "ds-2.ds.ns.svc" },
        { "netid": "rdma", "rdma": "[fd00::3]:20050" }
    ])))
    .unwrap();
    let d = &cfg.server.pnfs.data_servers;
    assert_eq!((d[0].netid, d[0].host.as_str(), d[0].port), (Netid::Rdma, "10.67.25.209", 20049));
    assert_eq!(d[0].backing_path.as_deref(), Some("/ds1"));
    assert_eq!((d[1].netid, d[1].host.as_str(), d[1].port), (Netid::Tcp, "10.67.25.211", 2050));
    assert_eq!((d[2].netid, d[2].host.as_str(), d[2].port), (Netid::Tcp, "ds-2.ds.ns.svc", 2049));
    assert_eq!((d[3].netid, d[3].host.as_str(), d[3].port), (Netid::Rdma, "fd00::3", 20050));

    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({ "netid": "rdma", "backing_path": "/ds1" }), "tcp", "required"),
        (json!({ "backing_path": "/ds1" }), "tcp", "in tcp (reference form) or uaddr"),
        (json!({ "uaddr": "10.0.0.2", "tcp": "10.0.0.2" }), "tcp", "not both"),
        (json!({ "uaddr": "10.0.0.2", "rdma": "10.0.0.2" }), "rdma", "not both"),
        (json!({ "netid": "tcp", "rdma": "10.0.0.2" }), "tcp", "required with netid tcp"),
        (json!({ "netid": "rdma", "tcp": "10.0.0.2" }), "rdma", "required with netid rdma"),
        // RDMA first, TCP fallback on the same host at 2049: nothing else fits.
        (json!({ "netid": "rdma", "tcp": "10.0.0.9", "rdma": "10.0.0.2" }), "tcp", "must be the rdma host"),
        (json!({ "netid": "rdma", "tcp": "10.0.0.2:2050", "rdma": "10.0.0.2" }), "tcp", "on port 2049"),
        (json!({ "netid": "tcp", "tcp": "10.0.0.2:0" }), "tcp", "port must be"),
        (json!({ "netid": "tcp", "tcp": "10.0.0.2", "rdma": "bad host!" }), "rdma", "invalid host"),
        (json!({ "netid": "rdma", "tcp": 5, "rdma": "10.0.0.2" }), "tcp", "expected a string"),
        (json!({ "tcp": "10.0.0.2", "backing_path": "ds1" }), "backing_path", "must be absolute"),
        (json!({ "tcp": "10.0.0.2", "weight": 1 }), "weight", "unknown key"),
    ];
    for (entry, key, want) in cases {
        let (p, msg) = error_of(&ds(json!([entry.clone()])));
        assert_eq!(p, format!("server.pnfs.data_servers[0].{key}"), "{entry}: {msg}");
        assert!(msg.contains(want), "{entry}: {msg:?} lacks {want:?}");
    }
}

fn with_diskfs(config: Value) -> Value {
    let mut v = reference_shaped();
    v["server"]["vfs"] = json!({ "diskfs": { "path": "./libchimera_vfs_diskfs.so", "config": config } });
    v["mounts"]["disk"] = json!({ "module": "diskfs", "path": "/" });
    v
}

#[test]
fn diskfs_config_is_parsed_into_its_struct() {
    use chimerad::config::{DiskfsDevice, PciAddress};
    let cfg = parse(&with_diskfs(json!({
        "initialize": true,
        "block_cache_blocks": 1048576,
        "inode_cache_inodes": 4096,
        "devices": [
            { "type": "vfio", "path": "01:00.0" },
            { "type": "vfio", "path": "0001:C1:1f.7" },
            { "type": "vfio", "path": "10000:02:00.0" },
            { "type": "io_uring", "path": "/dev/nvme0n1" },
            { "type": "io_uring", "path": "/var/lib/chimera/disk0.img" }
        ]
    })))
    .unwrap();
    let d = cfg.diskfs.as_ref().expect("diskfs config");
    assert!(d.initialize);
    assert_eq!((d.block_cache_blocks, d.inode_cache_inodes), (1 << 20, 4096));
    let pci = |s: &str| match d.devices.iter().find(|x| matches!(x, DiskfsDevice::Vfio { pci } if pci.to_string() == s)) {
        Some(DiskfsDevice::Vfio { pci }) => *pci,
        _ => panic!("no vfio device {s} in {:?}", d.devices),
    };
    // Printed in sysfs form, whatever form was written.
    assert_eq!(pci("0000:01:00.0"), PciAddress { domain: 0, bus: 1, device: 0, function: 0 });
    assert_eq!(pci("0001:c1:1f.7"), PciAddress { domain: 1, bus: 0xc1, device: 0x1f, function: 7 });
    assert_eq!(pci("10000:02:00.0").domain, 0x10000);
    assert_eq!(d.devices[3], DiskfsDevice::IoUring { path: "/dev/nvme0n1".into() });
    assert_eq!(cfg.mounts.iter().find(|m| m.name == "disk").unwrap().module, Module::Diskfs);
    // The plugin path is named in a warning, not used.
    assert!(cfg.warnings.iter().any(|w| w.starts_with("server.vfs.diskfs.path:")), "{:?}", cfg.warnings);
    // Defaults: no formatting unless asked, bounded caches.
    let cfg = parse(&with_diskfs(json!({ "devices": [ { "type": "io_uring", "path": "/tmp/d.img" } ] }))).unwrap();
    let d = cfg.diskfs.unwrap();
    assert!(!d.initialize);
    assert_eq!(d.block_cache_blocks, chimerad::config::BLOCK_CACHE_BLOCKS_DEFAULT);
    assert_eq!(d.inode_cache_inodes, chimerad::config::INODE_CACHE_INODES_DEFAULT);
    // Other reference plugin modules' settings are warnings.
    let mut v = reference_shaped();
    v["server"]["vfs"] = json!({ "memfs": { "path": "./libchimera_vfs_memfs.so" } });
    let cfg = parse(&v).unwrap();
    assert!(cfg.diskfs.is_none());
    assert!(cfg.warnings.iter().any(|w| w.starts_with("server.vfs.memfs:")), "{:?}", cfg.warnings);
}

#[test]
fn hostile_diskfs_configs_are_errors_naming_the_key() {
    const C: &str = "server.vfs.diskfs.config";
    let dev = |d: Value| json!({ "devices": [ d ] });
    let cases: Vec<(Value, String, &str)> = vec![
        (dev(json!({ "type": "vfio", "path": "01:00" })), format!("{C}.devices[0].path"), "expected a PCI address"),
        (dev(json!({ "type": "vfio", "path": "01:20.0" })), format!("{C}.devices[0].path"), "expected a PCI address"),
        (dev(json!({ "type": "vfio", "path": "01:00.8" })), format!("{C}.devices[0].path"), "expected a PCI address"),
        (dev(json!({ "type": "vfio", "path": "zz:00.0" })), format!("{C}.devices[0].path"), "expected a PCI address"),
        (dev(json!({ "type": "vfio", "path": "1:00.0" })), format!("{C}.devices[0].path"), "expected a PCI address"),
        (dev(json!({ "type": "vfio", "path": "000:01:00.0" })), format!("{C}.devices[0].path"), "expected a PCI address"),
        (dev(json!({ "type": "vfio", "path": "/dev/nvme0n1" })), format!("{C}.devices[0].path"), "expected a PCI address"),
        (dev(json!({ "type": "spdk", "path": "01:00.0" })), format!("{C}.devices[0].type"), "expected \"io_uring\" or \"vfio\""),
        (dev(json!({ "path": "01:00.0" })), format!("{C}.devices[0].type"), "required"),
        (dev(json!({ "type": "vfio" })), format!("{C}.devices[0].path"), "required"),
        (dev(json!({ "type": "io_uring", "path": "disk.img" })), format!("{C}.devices[0].path"), "absolute"),
        (dev(json!({ "type": "io_uring", "path": "/var/lib/" })), format!("{C}.devices[0].path"), "names a directory"),
        (dev(json!({ "type": "io_uring", "path": 7 })), format!("{C}.devices[0].path"), "expected a string"),
        (dev(json!({ "type": "vfio", "path": "01:00.0", "size": "1T" })), format!("{C}.devices[0].size"), "unknown key"),
        (dev(json!("01:00.0")), format!("{C}.devices[0]"), "expected an object"),
        (
            json!({ "devices": [ { "type": "vfio", "path": "01:00.0" }, { "type": "vfio", "path": "0000:01:00.0" } ] }),
            format!("{C}.devices[1].path"),
            "same device as",
        ),
        (json!({ "devices": [] }), format!("{C}.devices"), "1..="),
        (json!({ "devices": {} }), format!("{C}.devices"), "expected an array"),
        (json!({}), format!("{C}.devices"), "required"),
        (json!({ "block_cache_blocks": -1, "devices": [] }), format!("{C}.block_cache_blocks"), "expected a non-negative integer"),
        (json!({ "inode_cache_inodes": -5 }), format!("{C}.inode_cache_inodes"), "expected a non-negative integer"),
        (json!({ "block_cache_blocks": 0 }), format!("{C}.block_cache_blocks"), "out of range"),
        (json!({ "inode_cache_inodes": 1u64 << 40 }), format!("{C}.inode_cache_inodes"), "out of range"),
        (json!({ "block_cache_blocks": "1G" }), format!("{C}.block_cache_blocks"), "expected a non-negative integer"),
        (json!({ "initialize": "yes" }), format!("{C}.initialize"), "expected true or false"),
        (json!({ "intialize": true, "devices": [ { "type": "vfio", "path": "01:00.0" } ] }), format!("{C}.intialize"), "unknown key"),
        (json!([]), C.to_string(), "expected an object"),
    ];
    for (config, path, want) in cases {
        let (p, msg) = error_of(&with_diskfs(config.clone()));
        assert_eq!(p, path, "{config}: {msg}");
        assert!(msg.contains(want), "{config}: {msg:?} lacks {want:?}");
    }
    // Around the config: a diskfs mount needs it; keys beside it are checked.
    let mut v = reference_shaped();
    v["mounts"]["disk"] = json!({ "module": "diskfs", "path": "/" });
    let (p, msg) = error_of(&v);
    assert_eq!(p, C);
    assert!(msg.contains("mounts.disk uses module \"diskfs\""), "{msg}");
    let mut v = with_diskfs(dev(json!({ "type": "vfio", "path": "01:00.0" })));
    v["server"]["vfs"]["diskfs"]["threads"] = json!(4);
    assert_eq!(error_of(&v).0, "server.vfs.diskfs.threads");
    let mut v = with_diskfs(dev(json!({ "type": "vfio", "path": "01:00.0" })));
    v["server"]["vfs"]["diskfs"].as_object_mut().unwrap().remove("config");
    assert_eq!(error_of(&v).0, C);
    let mut v = reference_shaped();
    v["server"]["vfs"] = json!({ "memfs": "libchimera_vfs_memfs.so" });
    assert_eq!(error_of(&v).0, "server.vfs.memfs");
}

#[test]
fn diskfs_and_nfs_mounts_parse_and_are_checked() {
    let base = with_diskfs(json!({ "devices": [ { "type": "io_uring", "path": "/tmp/d.img" } ] }));
    let mut v = base.clone();
    v["mounts"]["mds"] = json!({ "module": "diskfs", "path": "/mds", "create": { "mode": "0777" } });
    v["mounts"]["ds1"] = json!({ "module": "nfs", "path": "10.67.25.209:/ds" });
    v["mounts"]["ds6"] = json!({ "module": "nfs", "path": "[fd00::1]:/ds" });
    let cfg = parse(&v).unwrap();
    let m = |n: &str| cfg.mounts.iter().find(|m| m.name == n).unwrap().clone();
    assert_eq!((m("mds").module, m("mds").path.as_str(), m("mds").capacity_bytes), (Module::Diskfs, "/mds", 0));
    assert_eq!((m("ds1").module, m("ds1").path.as_str()), (Module::Nfs, "10.67.25.209:/ds"));
    assert_eq!(m("ds6").path, "[fd00::1]:/ds");
    assert!(cfg.warnings.iter().any(|w| w.starts_with("mounts.mds.create:")), "{:?}", cfg.warnings);

    let cases: Vec<(&str, Value, &str, &str)> = vec![
        ("ds1", json!({ "module": "nfs" }), "path", "required"),
        ("ds1", json!({ "module": "nfs", "path": "10.67.25.209" }), "path", "host:/path"),
        ("ds1", json!({ "module": "nfs", "path": "10.67.25.209:ds" }), "path", "host:/path"),
        ("ds1", json!({ "module": "nfs", "path": "10.67.25.209:2049:/ds" }), "path", "host:/path"),
        ("ds1", json!({ "module": "nfs", "path": "bad host:/ds" }), "path", "invalid host"),
        ("ds1", json!({ "module": "nfs", "path": "h:/a/../b" }), "path", "component"),
        ("ds1", json!({ "module": "nfs", "path": "h:/ds", "capacity_bytes": "1G" }), "capacity_bytes", "only memfs"),
        ("mds", json!({ "module": "diskfs", "path": "mds" }), "path", "must be absolute"),
        ("mds", json!({ "module": "diskfs", "capacity_bytes": "1G" }), "capacity_bytes", "only memfs"),
        ("mds", json!({ "module": "cairn" }), "module", "not available in this build"),
    ];
    for (name, mount, key, want) in cases {
        let mut v = base.clone();
        v["mounts"][name] = mount.clone();
        let (p, msg) = error_of(&v);
        assert_eq!(p, format!("mounts.{name}.{key}"), "{mount}: {msg}");
        assert!(msg.contains(want), "{mount}: {msg:?} lacks {want:?}");
    }
}

/// The reference's tuning keys we do not implement are warnings, but their
/// values are still type-checked; `server.threads` beyond the CPUs is capped.
#[test]
fn reference_tuning_keys_are_warnings_with_checked_types() {
    let mut v = reference_shaped();
    v["common"]["rdmacm_tos"] = json!(104);
    v["common"]["preallocate_slabs"] = json!(8);
    v["common"]["preallocate_threads"] = json!(8);
    v["common"]["huge_page_size"] = json!("1G");
    v["common"]["slab_size"] = json!("1G");
    v["server"]["tcp_flavor"] = json!("plain");
    v["server"]["rdma_hostname"] = json!("0.0.0.0");
    v["server"]["nfs4_session_slots"] = json!(4096);
    v["server"]["threads"] = json!(80);
    let cfg = parse(&v).unwrap();
    assert_eq!((cfg.server.rdma_tos, cfg.server.rdma_addr), (Some(104), Some("0.0.0.0".parse().unwrap())));
    assert_eq!(cfg.huge_pages, HugePages::On { page_bytes: 1 << 30, slab_bytes: 1 << 30, preallocate_slabs: 8 });
    for key in [
        "common.preallocate_threads",
        "server.tcp_flavor",
        "server.nfs4_session_slots",
    ] {
        assert!(cfg.warnings.iter().any(|w| w.starts_with(&format!("{key}: key of the reference"))), "{key}: {:?}", cfg.warnings);
    }
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(cfg.server.cores, cpus.min(80).min(chimerad::config::CORES_MAX as usize));
    assert!(cfg.warnings.iter().any(|w| w.starts_with("server.threads: 80 requested")), "{:?}", cfg.warnings);
    // `cores` is ours and exact; both at once must agree.
    let mut exact = v.clone();
    exact["server"].as_object_mut().unwrap().remove("threads");
    exact["server"]["cores"] = json!(3);
    assert_eq!(parse(&exact).unwrap().server.cores, 3);

    let cases: Vec<(&str, Value, &str)> = vec![
        ("common.rdmacm_tos", json!(256), "out of range 0..=255"),
        ("server.rdma_hostname", json!("rdma-0.example"), "expected an IP address"),
        ("server.rdma_credits", json!(0), "out of range 1..=1024"),
        ("server.rdma_conns_max", json!(0), "out of range 1..=4096"),
        ("server.rdma_conns_max", json!(4097), "out of range 1..=4096"),
        ("server.rdma_large_buffers", json!(0), "out of range 1..=1024"),
        ("server.rdma_large_buffers", json!("many"), "expected a non-negative integer"),
        ("common.preallocate_slabs", json!(-1), "expected a non-negative integer"),
        ("common.huge_pages", json!("yes"), "expected true or false"),
        ("common.huge_page_size", json!("huge"), "expected a size"),
        ("common.huge_page_size", json!("4K"), "expected \"2M\" or \"1G\""),
        ("common.huge_page_size", json!("16G"), "expected \"2M\" or \"1G\""),
        ("common.slab_size", json!("3M"), "not a multiple of common.huge_page_size"),
        ("common.slab_size", json!(0), "out of range"),
        ("common.preallocate_slabs", json!(65), "out of range 0..=64"),
        ("server.tcp_flavor", json!(1), "expected a string"),
        ("server.nfs4_session_slots", json!("many"), "expected a non-negative integer"),
        ("server.threads", json!(0), "out of range"),
        ("server.threads", json!(5000), "out of range 1..=4096"),
    ];
    for (path, value, want) in cases {
        let (p, msg) = error_of(&with(path, value.clone()));
        assert_eq!(p, path, "{path}={value}: {msg}");
        assert!(msg.contains(want), "{path}={value}: {msg:?} lacks {want:?}");
    }
    // Preallocated slabs are bounded in bytes too (80 GiB here).
    let mut big = reference_shaped();
    big["common"] = json!({ "huge_pages": true, "huge_page_size": "1G", "slab_size": "2G", "preallocate_slabs": 40 });
    let (p, msg) = error_of(&big);
    assert_eq!(p, "common.preallocate_slabs", "{msg}");
    assert!(msg.contains("more than 68719476736 bytes"), "{msg}");
    // Off, and not given: what the pools do without an arena.
    big["common"] = json!({ "huge_pages": false, "huge_page_size": "1G" });
    assert_eq!(parse(&big).unwrap().huge_pages, HugePages::Off);
    big["common"] = json!({ "log_level": "info" });
    assert_eq!(parse(&big).unwrap().huge_pages, HugePages::Default);
}

/// An export naming no mount (the reference MDS has one) is left out with a
/// warning; the volumes directory goes where the exports are, on a local mount.
#[test]
fn unresolvable_exports_are_skipped_with_a_warning() {
    let mut v = reference_shaped();
    v["exports"]["/ds1"] = json!({ "path": "/ds" });
    let cfg = parse(&v).unwrap();
    assert_eq!(cfg.exports.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["/nfs1"]);
    assert!(
        cfg.warnings.iter().any(|w| w == "exports./ds1.path: \"/ds\" is not under a configured mount (mounts: memfs_dir); export \"/ds1\" is not served"),
        "{:?}",
        cfg.warnings
    );
    let mut v = with_diskfs(json!({ "devices": [ { "type": "io_uring", "path": "/tmp/d.img" } ] }));
    v["mounts"] = json!({
        "a": { "module": "nfs", "path": "h:/x" },
        "b": { "module": "memfs" },
        "disk": { "module": "diskfs", "path": "/" }
    });
    v["exports"] = json!({ "/e": { "path": "/disk" } });
    assert_eq!(parse(&v).unwrap().volumes_path, "/disk/volumes");
    v["exports"] = json!({ "/e": { "path": "/a" } });
    assert_eq!(parse(&v).unwrap().volumes_path, "/b/volumes");
}

/// Proves the buffer-pool and parked-call limits (CONFIG.md, server) are read
/// into the config with their defaults, and that out-of-range values and a
/// per-connection bound above the per-core one are errors naming the key.
#[test]
fn pool_and_parking_limits_are_checked() {
    let c = parse(&reference_shaped()).unwrap();
    assert_eq!((c.server.recv_buffers_per_core, c.server.reply_buffers_per_core), (32, 32));
    assert_eq!((c.server.parked_per_conn_max, c.server.parked_per_core_max), (64, 1024));
    let mut v = reference_shaped();
    for (k, n) in [("recv_buffers_per_core", 8), ("reply_buffers_per_core", 9), ("parked_per_conn_max", 4), ("parked_per_core_max", 16)] {
        v["server"][k] = json!(n);
    }
    let c = parse(&v).unwrap();
    assert_eq!((c.server.recv_buffers_per_core, c.server.reply_buffers_per_core), (8, 9));
    assert_eq!((c.server.parked_per_conn_max, c.server.parked_per_core_max), (4, 16));
    for (k, bad) in [("recv_buffers_per_core", json!(0)), ("reply_buffers_per_core", json!(5000)), ("parked_per_core_max", json!(0)), ("parked_per_conn_max", json!(-3))] {
        let (p, _) = error_of(&with(&format!("server.{k}"), bad));
        assert_eq!(p, format!("server.{k}"));
    }
    let mut v = reference_shaped();
    v["server"]["parked_per_conn_max"] = json!(100);
    v["server"]["parked_per_core_max"] = json!(50);
    let (p, msg) = error_of(&v);
    assert_eq!(p, "server.parked_per_conn_max");
    assert!(msg.contains("parked_per_core_max"), "{msg}");
}

/// NFSv4 delegations: on by default with the default bound;
/// `server.nfs4_delegations: false` (the reference format's key) turns them
/// off; `nfs4_delegations_max` sets the bound; bad values name the key.
#[test]
fn delegation_switch_and_bound() {
    let c = parse(&reference_shaped()).unwrap();
    assert_eq!(c.server.delegations_max as u64, chimerad::config::DELEGATIONS_DEFAULT);
    assert!(!c.warnings.iter().any(|w| w.contains("nfs4_delegations")), "implemented, not a warning: {:?}", c.warnings);
    let mut v = reference_shaped();
    v["server"]["nfs4_delegations"] = json!(false);
    v["server"]["nfs4_delegations_max"] = json!(100);
    assert_eq!(parse(&v).unwrap().server.delegations_max, 0, "switched off wins over a bound");
    v["server"]["nfs4_delegations"] = json!(true);
    assert_eq!(parse(&v).unwrap().server.delegations_max, 100);
    for (path, value, want) in [
        ("server.nfs4_delegations", json!("no"), "expected true or false"),
        ("server.nfs4_delegations_max", json!(0), "out of range 1..=16777216"),
        ("server.nfs4_delegations_max", json!(1u64 << 25), "out of range 1..=16777216"),
        ("server.nfs4_delegations_max", json!("lots"), "expected a non-negative integer"),
    ] {
        let (p, msg) = error_of(&with(path, value.clone()));
        assert_eq!(p, path, "{path}={value}: {msg}");
        assert!(msg.contains(want), "{path}={value}: {msg:?} lacks {want:?}");
    }
}

/// RDMA limits: `server.rdma_conns_max` and `server.rdma_large_buffers`
/// default to what the RDMA server used to fix (64 and 16) and take a value.
#[test]
fn rdma_limits_default_and_set() {
    let c = parse(&reference_shaped()).unwrap();
    assert_eq!((c.server.rdma_conns_max, c.server.rdma_large_buffers), (64, 16));
    let mut v = reference_shaped();
    v["server"]["rdma_conns_max"] = json!(8);
    v["server"]["rdma_large_buffers"] = json!(4);
    let c = parse(&v).unwrap();
    assert_eq!((c.server.rdma_conns_max, c.server.rdma_large_buffers), (8, 4));
}

/// `server.device_poll_us`: 0 (sleep at once) by default, a bound on how
/// long a core polls its device queues; bad values name the key.
#[test]
fn device_poll_us_default_and_bounds() {
    assert_eq!(parse(&reference_shaped()).unwrap().server.device_poll_us, 0);
    assert_eq!(parse(&with("server.device_poll_us", json!(200))).unwrap().server.device_poll_us, 200);
    for (value, want) in [(json!(10_001), "out of range 0..=10000"), (json!(-1), "expected a non-negative integer"), (json!("fast"), "expected a non-negative integer")] {
        let (p, msg) = error_of(&with("server.device_poll_us", value.clone()));
        assert_eq!(p, "server.device_poll_us", "{value}: {msg}");
        assert!(msg.contains(want), "{value}: {msg:?} lacks {want:?}");
    }
}

/// `server.pin_cores`: off by default (the scheduler places the loops),
/// a boolean; anything else names the key.
#[test]
fn pin_cores_default_and_type() {
    assert!(!parse(&reference_shaped()).unwrap().server.pin_cores);
    assert!(parse(&with("server.pin_cores", json!(true))).unwrap().server.pin_cores);
    let (p, msg) = error_of(&with("server.pin_cores", json!("yes")));
    assert_eq!(p, "server.pin_cores");
    assert!(msg.contains("expected true or false"), "{msg}");
}

/// `exports.<name>.access`: client rules parsed in order with their
/// defaults; bad CIDRs, unknown keys and options, out-of-range anonymous
/// ids and conflicting rules on one mount are errors naming the key path.
#[test]
fn export_access_rules_parse_and_errors_name_the_key() {
    use vfs::clients::{AccessType, Net, Squash};
    let rules = json!([
        { "clients": ["10.0.0.0/8", "fd00::/8"], "access_type": "rw", "squash": "no_root_squash" },
        { "clients": "192.168.1.7", "access_type": "ro", "squash": "all_squash", "anonymous_uid": 1000, "anonymous_gid": 0 },
        { "clients": "*", "access_type": "none" }
    ]);
    let c = parse(&with("exports./nfs1.access", rules.clone())).unwrap();
    let r = c.exports[0].access.as_ref().expect("rules");
    assert_eq!(r.len(), 3);
    assert_eq!(r[0].clients, vec![Net::parse("10.0.0.0/8").unwrap(), Net::parse("fd00::/8").unwrap()]);
    assert_eq!((r[0].access, r[0].squash), (AccessType::ReadWrite, Squash::NoRootSquash));
    assert_eq!((r[1].access, r[1].squash, r[1].anon_uid, r[1].anon_gid), (AccessType::ReadOnly, Squash::AllSquash, 1000, 0));
    // Defaults: root_squash, anonymous 65534.
    assert_eq!((r[2].access, r[2].squash, r[2].anon_uid, r[2].anon_gid), (AccessType::None, Squash::RootSquash, 65534, 65534));
    // The JSON form reads back to the same rules.
    let back = chimerad::config::access_json(r);
    assert_eq!(&chimerad::config::parse_access("x", &back).unwrap(), r);
    // No `access`: open (None); an empty list: nobody.
    assert!(parse(&reference_shaped()).unwrap().exports[0].access.is_none());
    assert_eq!(parse(&with("exports./nfs1.access", json!([]))).unwrap().exports[0].access, Some(vec![]));

    let p = "exports./nfs1.access";
    for (value, path, needle) in [
        (json!({}), p.to_string(), "expected an array"),
        (json!([{ "clients": "10.0.0.0/33" }]), format!("{p}[0].clients"), "out of range"),
        (json!([{ "clients": ["10.0.0.0/8", "10.0.0.1/8"] }]), format!("{p}[0].clients[1]"), "below its prefix"),
        (json!([{ "clients": ["host.example"] }]), format!("{p}[0].clients[0]"), "not an IP address"),
        (json!([{ "clients": [7] }]), format!("{p}[0].clients[0]"), "expected a string"),
        (json!([{ "clients": [] }]), format!("{p}[0].clients"), "empty"),
        (json!([{ "access_type": "rw" }]), format!("{p}[0].clients"), "required"),
        (json!([{ "clients": "*", "access_type": "RW" }]), format!("{p}[0].access_type"), "\"rw\""),
        (json!([{ "clients": "*", "squash": "squash_all" }]), format!("{p}[0].squash"), "root_squash"),
        (json!([{ "clients": "*", "anonymous_uid": 4294967295u64 }]), format!("{p}[0].anonymous_uid"), "out of range"),
        (json!([{ "clients": "*", "anonymous_gid": -1 }]), format!("{p}[0].anonymous_gid"), "non-negative"),
        (json!([{ "clients": "*", "Access_Type": "rw" }]), format!("{p}[0].Access_Type"), "unknown key"),
        (json!([{ "clients": "*" }, "rw"]), format!("{p}[1]"), "expected an object"),
    ] {
        let (ep, msg) = error_of(&with(p, value.clone()));
        assert_eq!(ep, path, "{value}: {msg}");
        assert!(msg.contains(needle), "{value}: {msg}");
    }
    // Two exports of one mount with different rules.
    let mut v = with("exports./nfs1.access", json!([{ "clients": "10.0.0.0/8" }]));
    v["exports"]["/nfs2"] = json!({ "path": "/memfs_dir/sub" });
    let (ep, msg) = error_of(&v);
    assert_eq!(ep, "exports./nfs2.access");
    assert!(msg.contains("same mount"), "{msg}");
    v["exports"]["/nfs2"]["access"] = json!([{ "clients": "10.0.0.0/8" }]);
    assert!(parse(&v).is_ok(), "the same rules are fine");
    // Hostile sizes.
    let many: Vec<Value> = (0..257).map(|_| json!({ "clients": "*" })).collect();
    assert!(error_of(&with(p, Value::Array(many))).1.contains("more than 256"));
    let clients: Vec<String> = (0..257).map(|i| format!("10.0.{}.{}", i / 256, i % 256)).collect();
    assert!(error_of(&with(p, json!([{ "clients": clients }]))).1.contains("more than 256"));
}

/// The smallest MDS config whose admin section is `admin`.
fn with_admin(admin: Value) -> Value {
    json!({
        "server": { "role": "mds" },
        "mounts": { "m": { "module": "memfs" } },
        "admin": admin
    })
}

#[test]
fn admin_tls_is_https_from_pem_files_or_an_explicit_false() {
    let dir = std::env::temp_dir().join(format!("chimerad-cfg-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = common::certs::Ca::new("config test CA");
    let (cert, key) = ca.server_files(&dir.join("a"), &["chimera-mds.ns.svc"]);
    let (_, other_key) = ca.server_files(&dir.join("b"), &["chimera-mds.ns.svc"]);
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());

    let cfg = parse(&with_admin(json!({ "token": "t", "tls": { "cert_file": c, "key_file": k } }))).unwrap();
    assert!(matches!(&cfg.admin.tls, AdminTls::On { cert_file, .. } if cert_file == &cert), "{:?}", cfg.admin.tls);
    assert!(cfg.admin.tls.server_config().unwrap().is_some());
    assert_eq!(parse(&with_admin(json!({ "token": "t", "tls": false }))).unwrap().admin.tls, AdminTls::Off);
    // Plain HTTP is never a default: an enabled admin API must say which.
    for admin in [json!({ "token": "t" }), json!({ "token": "t", "tls": null })] {
        let (p, msg) = error_of(&with_admin(admin));
        assert_eq!(p, "admin.tls");
        assert!(msg.starts_with("required when the admin API is enabled") && msg.contains("false for plain HTTP"), "{msg}");
    }
    // A disabled admin API (a data server) needs nothing.
    assert_eq!(parse(&json!({ "server": { "role": "ds" } })).unwrap().admin.tls, AdminTls::Off);

    let bad = |tls: Value| error_of(&with_admin(json!({ "token": "t", "tls": tls })));
    let (p, msg) = bad(json!(true));
    assert_eq!(p, "admin.tls");
    assert!(msg.contains("cert_file"), "{msg}");
    assert_eq!(bad(json!("yes")).0, "admin.tls");
    assert_eq!(bad(json!({ "cert_file": c })), ("admin.tls.key_file".to_string(), "required (a PEM file)".to_string()));
    assert_eq!(bad(json!({ "key_file": k })).0, "admin.tls.cert_file");
    assert_eq!(bad(json!({ "cert_file": c, "key_file": k, "ca_file": c })), ("admin.tls.ca_file".to_string(), "unknown key".to_string()));
    assert_eq!(bad(json!({ "cert_file": "", "key_file": k })).0, "admin.tls.cert_file");

    // Hostile files: each error names the key and the file.
    let missing = dir.join("missing.crt");
    let (p, msg) = bad(json!({ "cert_file": missing.to_str().unwrap(), "key_file": k }));
    assert_eq!(p, "admin.tls.cert_file");
    assert!(msg.contains("cannot read") && msg.contains("missing.crt"), "{msg}");
    let (p, msg) = bad(json!({ "cert_file": c, "key_file": dir.join("missing.key").to_str().unwrap() }));
    assert_eq!(p, "admin.tls.key_file");
    assert!(msg.contains("missing.key"), "{msg}");
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let (p, msg) = bad(json!({ "cert_file": junk.to_str().unwrap(), "key_file": k }));
    assert_eq!(p, "admin.tls.cert_file");
    assert!(msg.contains("junk.pem") && msg.contains("no PEM certificate"), "{msg}");
    let (p, msg) = bad(json!({ "cert_file": c, "key_file": junk.to_str().unwrap() }));
    assert_eq!(p, "admin.tls.key_file");
    assert!(msg.contains("junk.pem") && msg.contains("no PEM private key"), "{msg}");
    // A key file holding the certificate (swapped paths).
    let (p, msg) = bad(json!({ "cert_file": k, "key_file": c }));
    assert!(p.starts_with("admin.tls."), "{p}: {msg}");
    // A broken PEM body.
    let broken = dir.join("broken.crt");
    std::fs::write(&broken, "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n").unwrap();
    let (p, msg) = bad(json!({ "cert_file": broken.to_str().unwrap(), "key_file": k }));
    assert_eq!(p, "admin.tls.cert_file");
    assert!(msg.contains("broken.crt") && msg.contains("bad PEM"), "{msg}");
    let truncated = dir.join("truncated.crt");
    std::fs::write(&truncated, &std::fs::read_to_string(&cert).unwrap()[..60]).unwrap();
    let (p, msg) = bad(json!({ "cert_file": truncated.to_str().unwrap(), "key_file": k }));
    assert_eq!(p, "admin.tls.cert_file");
    assert!(msg.contains("truncated.crt"), "{msg}");
    // Another certificate's key.
    let (p, msg) = bad(json!({ "cert_file": c, "key_file": other_key.to_str().unwrap() }));
    assert_eq!(p, "admin.tls.key_file");
    assert!(msg.contains("is not the private key of the certificate") && msg.contains("tls.crt") && msg.contains("/b/tls.key"), "{msg}");
    // A directory is not a PEM file.
    let (p, msg) = bad(json!({ "cert_file": dir.to_str().unwrap(), "key_file": k }));
    assert_eq!(p, "admin.tls.cert_file");
    assert!(msg.contains("not a regular file"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reference_rest_keys_configure_admin_tls() {
    let dir = std::env::temp_dir().join(format!("chimerad-cfg-rest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = common::certs::Ca::new("config test CA");
    let (cert, key) = ca.server_files(&dir, &["mds"]);
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    // The reference's plain REST port says plain HTTP (its own shape).
    let cfg = parse(&reference_shaped()).unwrap();
    assert_eq!(cfg.admin.tls, AdminTls::Off);
    // Its TLS port and files say HTTPS, with errors on the reference's names.
    let mut v = reference_shaped();
    v["server"].as_object_mut().unwrap().remove("rest_http_port");
    v["server"]["rest_https_port"] = json!(18443);
    v["server"]["rest_ssl_cert"] = json!(c);
    v["server"]["rest_ssl_key"] = json!(k);
    let cfg = parse(&v).unwrap();
    assert_eq!(cfg.admin.port, 18443);
    assert!(matches!(cfg.admin.tls, AdminTls::On { key_key: "server.rest_ssl_key", .. }), "{:?}", cfg.admin.tls);
    assert!(!cfg.warnings.iter().any(|w| w.starts_with("server.rest_")), "{:?}", cfg.warnings);
    v["server"]["rest_ssl_key"] = json!(dir.join("nope").to_str().unwrap());
    assert_eq!(error_of(&v).0, "server.rest_ssl_key");
    v["server"].as_object_mut().unwrap().remove("rest_ssl_key");
    assert_eq!(error_of(&v).0, "server.rest_ssl_key");
    v["server"].as_object_mut().unwrap().remove("rest_ssl_cert");
    assert_eq!(error_of(&v).0, "server.rest_https_port");
    // Both REST ports, or the plain port with TLS files: one listener, said twice.
    let mut v = reference_shaped();
    v["server"]["rest_https_port"] = json!(18443);
    assert_eq!(error_of(&v).0, "server.rest_https_port");
    let mut v = reference_shaped();
    v["admin"]["tls"] = json!({ "cert_file": c, "key_file": k });
    assert_eq!(error_of(&v).0, "server.rest_http_port");
    std::fs::remove_dir_all(&dir).unwrap();
}
