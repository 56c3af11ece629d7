//! Shared by the engine's tests: an in-process chimerad on memfs, test
//! data and draining an engine.

#![allow(dead_code)]

use chimera_fio::Engine;
use chimerad::config::Config as ServerConfig;
use chimerad::serve::{self, Running};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Deterministic data for [offset, offset+len) of file `seed`.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((offset + i as u64).wrapping_mul(31).wrapping_add(seed * 7) % 251) as u8).collect()
}

/// Reap everything in flight (bounded in time); returns (tag, result)s.
pub fn drain(e: &mut Engine) -> Vec<(u64, i64)> {
    let mut all = Vec::new();
    let mut out = vec![(0u64, 0i64); 64];
    let until = Instant::now() + Duration::from_secs(30);
    while e.in_flight() > 0 {
        assert!(Instant::now() < until, "I/Os still in flight after 30 s");
        let n = e.reap(1, Some(Duration::from_millis(500)), &mut out);
        all.extend_from_slice(&out[..n]);
    }
    all
}

/// The engine's options for `server` (NFSv3 mode, or pNFS / NFSv4.1 with
/// `pnfs`): one connection, the defaults for the rest.
pub fn config(server: &Running, export: &str, iodepth: usize, pnfs: bool) -> chimera_fio::Config {
    chimera_fio::Config {
        server: server.nfs_addr.unwrap().to_string(),
        export: export.into(),
        mount_port: 0,
        conns: 1,
        iodepth,
        uid: 0,
        gid: 0,
        pnfs,
        busy_poll_us: 0,
        retry_s: chimera_fio::RETRY_S_DEFAULT,
        hold_mib: chimera_fio::HOLD_MIB_DEFAULT,
        rdma: false,
    }
}

/// chimerad on memfs (64 MiB) on 127.0.0.1, NFS at a port it picks, export `/m`.
pub fn start_memfs() -> Running {
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
        "mounts": { "m": { "module": "memfs", "capacity_bytes": "64M" } },
        "exports": { "/m": { "path": "/m" } },
        "admin": { "enabled": false },
        "metrics": { "enabled": false }
    });
    serve::start(&ServerConfig::parse(&v.to_string()).unwrap()).expect("start chimerad")
}

/// A 64 MiB zeroed image file in an empty scratch directory of its own
/// (`name` and this process).
pub fn device(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fio-engine-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let img = d.join("dev0.img");
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    img
}

/// chimerad on diskfs over `img` (formatted when `initialize`), NFS on
/// `port` (0: any), export `/d`, a grace period of `grace_s`.
pub fn start_diskfs(img: &Path, port: u16, initialize: bool, grace_s: u32) -> Running {
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": port, "mount_port": 0, "portmap_port": 0, "grace_time_s": grace_s,
                    "vfs": { "diskfs": { "config": { "initialize": initialize, "devices": [{ "type": "io_uring", "path": img.to_str().unwrap() }] } } } },
        "mounts": { "d": { "module": "diskfs", "path": "/" } },
        "exports": { "/d": { "path": "/d" } },
        "admin": { "enabled": false },
        "metrics": { "enabled": false }
    });
    serve::start(&ServerConfig::parse(&v.to_string()).unwrap()).expect("start chimerad on diskfs")
}
