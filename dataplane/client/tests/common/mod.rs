//! An in-process chimerad (memfs export `/m`) on 127.0.0.1, port 0.

#![allow(dead_code)]

use chimerad::config::Config;
use chimerad::serve::{self, Running};
use client::nfs3::Nfs3;
use client::{Auth, Error, Limits};
use serde_json::json;
use std::time::Duration;

pub fn start() -> Running {
    start_on(0)
}

/// Start on `port` (0: any) — a restart reuses the old port.
pub fn start_on(port: u16) -> Running {
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": port, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
        "mounts": { "m": { "module": "memfs", "capacity_bytes": "64M" } },
        "exports": { "/m": { "path": "/m" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": "client-test-token", "tls": false },
        "metrics": { "enabled": false }
    });
    serve::start(&Config::parse(&v.to_string()).unwrap()).expect("start chimerad")
}

pub fn addr(r: &Running) -> String {
    r.nfs_addr.expect("NFS listens").to_string()
}

pub fn limits() -> Limits {
    Limits { timeout: Duration::from_secs(10), ..Limits::default() }
}

pub fn root() -> Auth {
    Auth::sys(0, 0)
}

/// Deterministic data for [offset, offset+len) of file `seed`.
pub fn pattern(seed: u8, offset: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((offset + i as u64).wrapping_mul(31).wrapping_add(seed as u64 * 7) % 251) as u8).collect()
}

/// An NFSv3 client of `r` with export `/m` mounted: (client, root handle).
pub fn connect(r: &Running) -> (Nfs3, Vec<u8>) {
    let mut c = Nfs3::connect(&addr(r), &root(), limits()).unwrap();
    let root = c.mount("/m").unwrap();
    (c, root)
}

/// The nfsstat3 of an NFSv3 error (panics on any other error).
pub fn code(e: &Error) -> u32 {
    match e {
        Error::Nfs3 { code, .. } => *code,
        other => panic!("expected an nfsstat3, got {other}"),
    }
}
