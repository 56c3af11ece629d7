//! The `nfs` mount module (crate `nfsvfs`) through real binaries: chimerad
//! A serves a memfs (or diskfs) export; chimerad B mounts it with
//! `module: nfs` beside a memfs mount of its own; the userspace client
//! talks to B only, and to A directly to check what landed there.
//! - every namespace call through B: create (guarded, exclusive), 1 MiB + 1
//!   at an unaligned offset in unaligned pieces and 4 KiB pieces UNSTABLE + COMMIT read back
//!   through B and directly from A, a 500-entry READDIRPLUS, rename, link,
//!   symlink/readlink, remove, rmdir, truncate, FSSTAT; A's errors arrive
//!   as themselves (ENOENT, EEXIST, ENOTEMPTY);
//! - A killed: B's READ answers NFS3ERR_IO within the mount's timeout (no
//!   hang), B logs the outage and keeps serving its memfs mount; A back on
//!   its port: B serves the mount again (memfs: old handles are stale);
//! - A on diskfs restarted: a handle B gave out before still reads its data;
//! - a remote that accepts and never answers: EIO after the timeout;
//! - a stalled remote holds the calls on its mount, not B's core (NFSv3
//!   calls and NFSv4.1 COMPOUNDs);
//! - a remote whose MOUNT is on a port of its own (as the Linux server's
//!   and Ganesha's): found through its portmapper, or at `mount_port`; a
//!   portmapper that knows none: the mount is down and says why, EIO;
//! - config: remote paths with a port, ports on other modules, bad
//!   connection counts, mount_port with portmap_port, a relative
//!   handle_map or one on another module are refused naming the key; a
//!   handle map that cannot be opened stops the start naming the file.
//!
//! Every server binds 127.0.0.1 with kernel-chosen ports; a restarted A
//! reuses the port it had.

#[path = "common/held_port.rs"]
mod held_port;
mod process;
mod relay;

use chimerad::config::Config;
use client::nfs3::{Nfs3, SetAttr, Stable};
use client::{Auth, Error, Limits};
use process::{listening, spawn, until_started_or_exit, Proc};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// B's bound on every call to A.
const REMOTE_TIMEOUT_MS: u64 = 2000;
/// mountstat3 MNT3ERR_IO (RFC 1813 §5.1.5).
const MNT3ERR_IO: u32 = 5;

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nfsmod-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(20),
        ..Limits::default()
    }
}

fn code(e: &Error) -> u32 {
    match e {
        Error::Nfs3 { code, .. } => *code,
        other => panic!("expected an nfsstat3, got {other}"),
    }
}

fn pattern(seed: u8, offset: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((offset + i as u64)
                .wrapping_mul(31)
                .wrapping_add(seed as u64 * 7)
                % 251) as u8
        })
        .collect()
}

/// A's config: memfs, or diskfs over `img`, on `port` (0: any).
fn config_a(dir: &Path, port: u16, img: Option<&Path>) -> PathBuf {
    let mut v = json!({
        "common": { "log_level": "info" },
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": port, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
        "mounts": { "m": { "module": "memfs", "capacity_bytes": "256M" } },
        "exports": { "/m": { "path": "/m" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": "nfsmod-a", "tls": false },
        "metrics": { "enabled": false }
    });
    if let Some(img) = img {
        v["server"]["vfs"] = json!({ "diskfs": { "config": { "initialize": true, "devices": [{ "type": "io_uring", "path": img.to_str().unwrap() }] } } });
        v["mounts"] = json!({ "m": { "module": "diskfs", "path": "/" } });
    }
    let cfg = dir.join("a.json");
    std::fs::write(&cfg, v.to_string()).unwrap();
    cfg
}

/// B's config: `r` = A's /m over the nfs module, `local` = its own memfs.
fn config_b(dir: &Path, a_port: u16) -> PathBuf {
    config_b_on(dir, a_port, 2)
}

/// `config_b` with `threads` cores.
fn config_b_on(dir: &Path, a_port: u16, threads: u32) -> PathBuf {
    config_b_with(dir, a_port, threads, json!({ "enabled": false }))
}

/// `config_b_on` with the `metrics` section given.
fn config_b_with(dir: &Path, a_port: u16, threads: u32, metrics: Value) -> PathBuf {
    let v = json!({
        "common": { "log_level": "info" },
        "server": { "bind": "127.0.0.1", "threads": threads, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
        "mounts": {
            "r": { "module": "nfs", "path": "127.0.0.1:/m", "port": a_port, "connections": 2, "timeout_ms": REMOTE_TIMEOUT_MS },
            "local": { "module": "memfs", "capacity_bytes": "64M" }
        },
        "exports": { "/r": { "path": "/r" }, "/local": { "path": "/local" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": "nfsmod-b", "tls": false },
        "metrics": metrics
    });
    let cfg = dir.join("b.json");
    std::fs::write(&cfg, v.to_string()).unwrap();
    cfg
}

struct Up {
    proc: Proc,
    nfs: String,
    /// Lines logged up to "started".
    seen: Vec<Value>,
}

fn start(cfg: &Path) -> Up {
    let mut p = spawn(cfg);
    let lines = until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
    Up {
        nfs: listening(&lines, "nfs").to_string(),
        proc: p,
        seen: lines,
    }
}

fn port(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// The first log line of `up` (since it started, or logged before that)
/// whose msg is `msg`; panics when none comes within `within`.
fn logged(up: &mut Up, msg: &str, within: Duration) -> Value {
    if let Some(i) = up.seen.iter().position(|v| v["msg"] == msg) {
        return up.seen.remove(i);
    }
    let p = &up.proc;
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match p.lines.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(v) if v["msg"] == msg => return v,
            Ok(_) => {}
            Err(_) => panic!("no {msg:?} logged within {within:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "no {msg:?} logged within {within:?}"
        );
    }
}

fn connect(addr: &str, export: &str) -> (Nfs3, Vec<u8>) {
    let mut c = Nfs3::connect(addr, &Auth::sys(0, 0), limits()).unwrap();
    let root = c.mount(export).unwrap();
    (c, root)
}

fn read_all(c: &mut Nfs3, fh: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut piece = Vec::new();
    while out.len() < len {
        let eof = c
            .read(fh, out.len() as u64, (256 << 10) as u32, &mut piece)
            .unwrap();
        out.extend_from_slice(&piece);
        if eof || piece.is_empty() {
            break;
        }
    }
    out
}

#[test]
fn namespace_and_data_through_b_land_on_a_and_outages_answer_eio() {
    let dir = scratch("memfs");
    let a = start(&config_a(&dir, 0, None));
    let a_port = port(&a.nfs);
    let mut b = start(&config_b(&dir, a_port));
    logged(&mut b, "remote export connected", Duration::from_secs(10));
    let (mut c, root) = connect(&b.nfs, "/r");
    let (mut ca, root_a) = connect(&a.nfs, "/m");

    // Data: 1 MiB + 1 at an unaligned offset (FILE_SYNC), then 4 KiB
    // pieces UNSTABLE and a COMMIT whose verifier is the remote's.
    let f = c.create(&root, b"data", 0o644, true).unwrap();
    let big = pattern(1, 3, (1 << 20) + 1);
    // In unaligned pieces of 300,000 bytes (under B's largest WRITE).
    for (i, piece) in big.chunks(300_000).enumerate() {
        let w = c
            .write(&f, 3 + (i * 300_000) as u64, piece, Stable::FileSync)
            .unwrap();
        assert_eq!((w.count as usize, w.stable), (piece.len(), true));
    }
    let end = 3 + big.len() as u64;
    let mut verf = None;
    for i in 0..16u64 {
        let off = end + i * 4096;
        let w = c
            .write(&f, off, &pattern(2, off, 4096), Stable::Unstable)
            .unwrap();
        assert_eq!(w.count, 4096);
        assert!(
            verf.is_none() || verf == Some(w.verf),
            "one verifier while the remote runs"
        );
        verf = Some(w.verf);
    }
    assert_eq!(c.commit(&f).unwrap(), verf.unwrap());
    let total = end as usize + 16 * 4096;
    let mut want = vec![0u8; 3];
    want.extend_from_slice(&big);
    for i in 0..16u64 {
        want.extend_from_slice(&pattern(2, end + i * 4096, 4096));
    }
    assert_eq!(c.getattr(&f).unwrap().size as usize, total);
    assert!(read_all(&mut c, &f, total) == want, "read back through B");
    let fa = ca.lookup(&root_a, b"data").unwrap().0;
    assert!(read_all(&mut ca, &fa, total) == want, "the bytes are on A");

    // Errors are A's own.
    assert_eq!(
        code(&c.create(&root, b"data", 0o644, true).unwrap_err()),
        17,
        "EEXIST"
    );
    assert_eq!(code(&c.lookup(&root, b"missing").unwrap_err()), 2, "ENOENT");
    // Exclusive create: once per verifier.
    let x = c.create_exclusive(&root, b"excl", [7; 8]).unwrap();
    assert_eq!(c.create_exclusive(&root, b"excl", [7; 8]).unwrap(), x);
    assert_eq!(
        code(&c.create_exclusive(&root, b"excl", [8; 8]).unwrap_err()),
        17
    );

    // A directory of 500 entries, listed through B in several pages.
    let d = c.mkdir(&root, b"dir", 0o755).unwrap();
    let mut names: Vec<Vec<u8>> = (0..500)
        .map(|i| format!("entry-{i:04}").into_bytes())
        .collect();
    for n in &names {
        c.create(&d, n, 0o644, true).unwrap();
    }
    let mut listed: Vec<Vec<u8>> = c
        .readdir_all(&d, 10_000)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    listed.sort();
    names.sort();
    assert_eq!(listed, names);
    let on_a = ca.lookup(&root_a, b"dir").unwrap().0;
    assert_eq!(
        ca.readdir_all(&on_a, 10_000)
            .unwrap()
            .iter()
            .filter(|e| e.name.starts_with(b"entry-"))
            .count(),
        500
    );
    assert_eq!(code(&c.rmdir(&root, b"dir").unwrap_err()), 66, "ENOTEMPTY");
    for n in &names {
        c.remove(&d, n).unwrap();
    }
    c.rmdir(&root, b"dir").unwrap();
    assert_eq!(
        code(&ca.lookup(&root_a, b"dir").unwrap_err()),
        2,
        "gone on A too"
    );

    // rename, link, symlink, readlink, remove, truncate.
    c.rename(&root, b"data", &root, b"renamed").unwrap();
    assert_eq!(code(&c.lookup(&root, b"data").unwrap_err()), 2);
    let r = c.lookup(&root, b"renamed").unwrap().0;
    assert_eq!(r, f, "a rename keeps the handle");
    let l = c.link(&f, &root, b"hard").unwrap();
    assert_eq!(
        l.map(|a| a.nlink)
            .unwrap_or_else(|| c.getattr(&f).unwrap().nlink),
        2
    );
    let s = c.symlink(&root, b"sym", b"renamed").unwrap();
    assert_eq!(c.readlink(&s).unwrap(), b"renamed");
    c.remove(&root, b"hard").unwrap();
    assert_eq!(c.getattr(&f).unwrap().nlink, 1);
    c.setattr(
        &f,
        &SetAttr {
            size: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(c.getattr(&f).unwrap().size, 100);
    assert_eq!(read_all(&mut c, &f, 1000), want[..100]);
    assert_eq!(ca.getattr(&fa).unwrap().size, 100, "truncated on A");
    assert!(c.fsstat(&root).unwrap().tbytes > 0);

    // The parent of a directory is found through the remote's "..".
    let sub = c.mkdir(&root, b"sub", 0o755).unwrap();
    assert_eq!(c.lookup(&sub, b"..").unwrap().0, root);

    // A killed: B answers EIO within its timeout and serves its own mount.
    drop(a);
    let t = Instant::now();
    let e = c.read(&f, 0, 100, &mut Vec::new()).unwrap_err();
    assert_eq!(code(&e), 5, "NFS3ERR_IO");
    let bound = Duration::from_millis(2 * REMOTE_TIMEOUT_MS + 1000);
    assert!(
        t.elapsed() < bound,
        "EIO after {:?}, over {bound:?}",
        t.elapsed()
    );
    let t = Instant::now();
    assert_eq!(code(&c.getattr(&root).unwrap_err()), 5);
    assert!(t.elapsed() < bound, "metadata EIO after {:?}", t.elapsed());
    let lost = logged(&mut b, "remote export lost", Duration::from_secs(5));
    assert_eq!(lost["mount"], "r", "{lost}");
    let (mut cl, local) = connect(&b.nfs, "/local");
    let lf = cl.create(&local, b"still", 0o644, true).unwrap();
    cl.write(&lf, 0, b"served", Stable::FileSync).unwrap();
    assert_eq!(read_all(&mut cl, &lf, 6), b"served");

    // A back on its port: B serves the mount again. A memfs came back
    // empty, so a handle from before is stale there, and here.
    let a = start(&config_a(&dir, a_port, None));
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.getattr(&root).is_err() {
        assert!(Instant::now() < deadline, "B never served the mount again");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(code(&c.getattr(&f).unwrap_err()), 70, "NFS3ERR_STALE");
    let g = c.create(&root, b"after", 0o644, true).unwrap();
    c.write(&g, 0, b"again", Stable::FileSync).unwrap();
    assert_eq!(read_all(&mut c, &g, 5), b"again");
    drop(a);
    drop(b);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn handles_survive_a_diskfs_remote_restart() {
    let dir = scratch("diskfs");
    let img = dir.join("a.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(128 << 20)
        .unwrap();
    let a = start(&config_a(&dir, 0, Some(&img)));
    let a_port = port(&a.nfs);
    let b = start(&config_b(&dir, a_port));
    let (mut c, root) = connect(&b.nfs, "/r");
    let d = c.mkdir(&root, b"keep", 0o755).unwrap();
    let f = c.create(&d, b"f", 0o644, true).unwrap();
    let data = pattern(5, 0, 300_000);
    c.write(&f, 0, &data, Stable::FileSync).unwrap();
    drop(a);
    assert_eq!(code(&c.read(&f, 0, 10, &mut Vec::new()).unwrap_err()), 5);
    let a = start(&config_a(&dir, a_port, Some(&img)));
    let deadline = Instant::now() + Duration::from_secs(15);
    let got = loop {
        let mut out = Vec::new();
        match c.read(&f, 0, 300_000, &mut out) {
            Ok(_) => break out,
            Err(e) => {
                assert_eq!(code(&e), 5, "only EIO while A comes back");
                assert!(Instant::now() < deadline, "B never served the mount again");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert!(
        got == data,
        "the old handle reads what was written before the restart"
    );
    assert_eq!(
        c.lookup(&d, b"f").unwrap().0,
        f,
        "the same handle for the same file"
    );
    drop(a);
    drop(b);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn parse_mounts(mounts: Value) -> Result<Config, String> {
    let v = json!({
        "server": { "bind": "127.0.0.1", "nfs_port": 0, "mount_port": 0, "portmap_port": 0 },
        "mounts": mounts,
        "admin": { "bind": "127.0.0.1", "port": 0, "token": "t", "tls": false }
    });
    Config::parse(&v.to_string()).map_err(|e| e.to_string())
}

#[test]
fn nfs_mount_settings_are_checked_by_name() {
    let ok = parse_mounts(json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds" } })).unwrap();
    let n = ok.mounts[0].nfs.as_ref().unwrap();
    assert_eq!(
        (n.port, n.connections, n.timeout_ms),
        (2049, 2, 10_000),
        "defaults"
    );
    let ok = parse_mounts(json!({ "r": { "module": "nfs", "path": "[::1]:/ds", "port": 20490, "connections": 4, "timeout_ms": 500 } })).unwrap();
    let n = ok.mounts[0].nfs.as_ref().unwrap();
    assert_eq!((n.port, n.connections, n.timeout_ms), (20490, 4, 500));
    assert_eq!((n.mount_port, n.portmap_port), (None, 111), "MOUNT on the NFS port, else through the portmapper on 111");
    let ok = parse_mounts(json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "mount_port": 20048 } })).unwrap();
    assert_eq!(ok.mounts[0].nfs.as_ref().unwrap().mount_port, Some(20048));
    assert!(ok.mounts.iter().all(|m| m.name != "x"));
    assert_eq!(ok.mounts[0].nfs.as_ref().unwrap().handle_map, None, "no handle map unless asked");
    let ok = parse_mounts(json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "handle_map": "/var/lib/chimera/r.handles" } })).unwrap();
    assert_eq!(ok.mounts[0].nfs.as_ref().unwrap().handle_map.as_deref(), Some("/var/lib/chimera/r.handles"));
    // A handle map that cannot be opened stops the start, naming it.
    let dir = scratch("handle-map");
    let bad = dir.join("no-such-dir").join("r.handles");
    let cfg = parse_mounts(json!({ "r": { "module": "nfs", "path": "127.0.0.1:/ds", "handle_map": bad.to_str().unwrap() } })).unwrap();
    let e = chimerad::serve::start(&cfg).err().expect("a handle map in a missing directory refuses the start");
    assert!(e.contains(bad.to_str().unwrap()), "{e}");

    let cases = [
        (
            json!({ "r": { "module": "nfs", "path": "10.0.0.9:2049:/ds" } }),
            "mounts.r.path",
        ),
        (
            json!({ "r": { "module": "nfs", "path": "10.0.0.9" } }),
            "mounts.r.path",
        ),
        (
            json!({ "r": { "module": "nfs", "path": "10.0.0.9:ds" } }),
            "mounts.r.path",
        ),
        (json!({ "r": { "module": "nfs" } }), "mounts.r.path"),
        (
            json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "port": 0 } }),
            "mounts.r.port",
        ),
        (
            json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "connections": 0 } }),
            "mounts.r.connections",
        ),
        (
            json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "connections": 17 } }),
            "mounts.r.connections",
        ),
        (
            json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "timeout_ms": 5 } }),
            "mounts.r.timeout_ms",
        ),
        (
            json!({ "m": { "module": "memfs", "port": 2049 } }),
            "mounts.m.port",
        ),
        (json!({ "m": { "module": "memfs", "mount_port": 20048 } }), "mounts.m.mount_port"),
        (json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "mount_port": 0 } }), "mounts.r.mount_port"),
        (json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "portmap_port": 70000 } }), "mounts.r.portmap_port"),
        (json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "mount_port": 20048, "portmap_port": 111 } }), "mounts.r.portmap_port"),
        (json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "handle_map": "relative/r.handles" } }), "mounts.r.handle_map"),
        (json!({ "r": { "module": "nfs", "path": "10.0.0.9:/ds", "handle_map": 7 } }), "mounts.r.handle_map"),
        (json!({ "m": { "module": "memfs", "handle_map": "/x.handles" } }), "mounts.m.handle_map"),
    ];
    for (mounts, key) in cases {
        let e = parse_mounts(mounts.clone()).expect_err(&mounts.to_string());
        assert!(e.contains(key), "{mounts}: {e:?} does not name {key}");
    }
}

/// B starts while its remote is down, serves its other mount, logs why,
/// answers EIO for the nfs mount within its timeout, and serves it once the
/// remote comes up.
#[test]
fn remote_down_at_start_does_not_stop_the_server() {
    let dir = scratch("down");
    // A port nobody listens on, held (bound, never listening) for the
    // whole test so that no other process can take it: connections to it
    // are refused. SO_REUSEPORT lets server A bind it later.
    let (_held, free) = held_port::held_port();
    let mut b = start(&config_b(&dir, free));
    let v = logged(&mut b, "remote export unreachable", Duration::from_secs(10));
    assert_eq!(v["mount"], "r", "{v}");
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    let (mut cl, local) = connect(&b.nfs, "/local");
    cl.getattr(&local).unwrap();
    // MOUNT of the nfs mount's export: refused at once, not hung.
    let mut c = Nfs3::connect(&b.nfs, &Auth::sys(0, 0), limits()).unwrap();
    let t = Instant::now();
    let e = c.mount("/r").unwrap_err();
    assert!(matches!(e, Error::Mount { code: MNT3ERR_IO, .. }), "an I/O error, not a missing export: {e}");
    assert!(
        t.elapsed() < Duration::from_millis(2 * REMOTE_TIMEOUT_MS + 1000),
        "{:?}",
        t.elapsed()
    );
    cl.getattr(&local).unwrap();
    // The remote comes up (on the port B was told): B mounts it on use.
    let a = start(&config_a(&dir, free, None));
    let deadline = Instant::now() + Duration::from_secs(15);
    let root = loop {
        match c.mount("/r") {
            Ok(r) => break r,
            Err(e) => assert!(Instant::now() < deadline, "B never reached the remote: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let f = c.create(&root, b"late", 0o644, true).unwrap();
    c.write(&f, 0, b"late", Stable::FileSync).unwrap();
    assert_eq!(read_all(&mut c, &f, 4), b"late");
    drop(a);
    drop(b);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A remote that accepts connections and never answers (a hung server):
/// B's calls to it fail with EIO after the mount's timeout, not later, and
/// B's own mount keeps answering meanwhile.
#[test]
fn a_remote_that_never_answers_costs_at_most_the_timeout() {
    let dir = scratch("hung");
    // The kernel completes connections into the backlog; nobody reads.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut b = start(&config_b(&dir, hung.local_addr().unwrap().port()));
    let mut c = Nfs3::connect(&b.nfs, &Auth::sys(0, 0), limits()).unwrap();
    let t = Instant::now();
    let e = c.mount("/r").unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, Error::Mount { code: MNT3ERR_IO, .. }), "an I/O error, not a missing export: {e}");
    assert!(took < Duration::from_millis(2 * REMOTE_TIMEOUT_MS + 2000), "EIO after {took:?}");
    let v = logged(&mut b, "remote export unreachable", Duration::from_secs(10));
    assert!(v["error"].as_str().unwrap_or("").contains("timeout"), "the reason is the timeout: {v}");
    let (mut cl, local) = connect(&b.nfs, "/local");
    let f = cl.create(&local, b"f", 0o644, true).unwrap();
    cl.write(&f, 0, b"ok", Stable::FileSync).unwrap();
    assert_eq!(read_all(&mut cl, &f, 2), b"ok");
    drop(b);
    drop(hung);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Proves calls on the nfs mount run on the mount's workers, not on B's
/// core: with one core and A stalled (a relay holding what B sends it), an
/// NFSv3 GETATTR and then a CREATE on the mount wait, and so does a MOUNT
/// of it, while another client's GETATTR, CREATE and MOUNT on B's memfs
/// mount, on the same core, are answered at once; when A answers again,
/// all complete.
#[test]
fn a_stalled_remote_holds_its_calls_not_the_core() {
    use std::sync::atomic::Ordering;
    let dir = scratch("stalled");
    let a = start(&config_a(&dir, 0, None));
    let r = relay::relay(format!("127.0.0.1:{}", port(&a.nfs)).parse().unwrap());
    let b = start(&config_b_on(&dir, r.addr.port(), 1));
    let (mut c, root) = connect(&b.nfs, "/r");
    let f = c.create(&root, b"f", 0o644, true).unwrap();
    let (mut cl, local) = connect(&b.nfs, "/local");
    cl.getattr(&local).unwrap();
    r.paused.store(true, Ordering::SeqCst);
    std::thread::scope(|s| {
        let remote = s.spawn(|| {
            let t = Instant::now();
            let got = c.getattr(&f).map(|_| ()).and_then(|_| c.create(&root, b"g", 0o644, true).map(|_| ()));
            (got, t.elapsed())
        });
        // MOUNT of the nfs mount asks A for its root's attributes.
        let mounting = s.spawn(|| Nfs3::connect(&b.nfs, &Auth::sys(0, 0), limits()).unwrap().mount("/r").map(|_| ()));
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        cl.getattr(&local).expect("GETATTR on the local mount");
        cl.create(&local, b"x", 0o644, true).expect("CREATE on the local mount");
        connect(&b.nfs, "/local");
        let took = t.elapsed();
        assert!(took < Duration::from_millis(400), "the local mount's calls (and a MOUNT of it) took {took:?} while A stalled");
        assert!(!remote.is_finished(), "the calls on the nfs mount wait for A");
        assert!(!mounting.is_finished(), "the MOUNT of the nfs mount waits for A");
        std::thread::sleep(Duration::from_millis(700));
        r.paused.store(false, Ordering::SeqCst);
        let (got, waited) = remote.join().unwrap();
        assert_eq!(got, Ok(()), "GETATTR and CREATE through B once A answers");
        assert!(waited >= Duration::from_millis(900), "they waited for A ({waited:?})");
        assert_eq!(mounting.join().unwrap(), Ok(()), "the MOUNT once A answers");
    });
    let (mut direct, a_root) = connect(&a.nfs, "/m");
    direct.lookup(&a_root, b"g").expect("the CREATE landed on A");
    drop(b);
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The same over NFSv4.1: a COMPOUND that reaches the stalled mount (a
/// GETATTR, an OPEN that creates, a WRITE and a READ) moves to the mount's
/// workers at its first operation there, so another client's COMPOUNDs on
/// the memfs mount, decoded by the same single core, answer at once —
/// a LOOKUP from the pseudo-root into the memfs mount too — while the
/// first waits for A; when A answers it completes, and what it wrote
/// landed on A.
#[test]
fn a_stalled_remote_holds_its_nfs4_compounds_not_the_core() {
    use client::nfs4::Nfs41;
    use std::sync::atomic::Ordering;
    let dir = scratch("stalled4");
    let a = start(&config_a(&dir, 0, None));
    let r = relay::relay(format!("127.0.0.1:{}", port(&a.nfs)).parse().unwrap());
    let b = start(&config_b_on(&dir, r.addr.port(), 1));
    let mut x = Nfs41::connect(&b.nfs, &Auth::sys(0, 0), limits(), b"stalled4-x").unwrap();
    let f = x.open("/r", "f", 3, Some(0o644)).unwrap();
    let mut y = Nfs41::connect(&b.nfs, &Auth::sys(0, 0), limits(), b"stalled4-y").unwrap();
    let local = y.lookup_path("/local").unwrap();
    y.getattr(&local).unwrap();
    r.paused.store(true, Ordering::SeqCst);
    std::thread::scope(|s| {
        let remote = s.spawn(|| {
            let t = Instant::now();
            let got = (|| {
                x.getattr(&f.fh)?;
                let g = x.open("/r", "g", 3, Some(0o644))?;
                x.write(&g, 0, b"written while A stalled", true)?;
                let mut back = Vec::new();
                x.read(&g, 0, 64, &mut back)?;
                Ok::<_, Error>(back)
            })();
            (got, t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        y.getattr(&local).expect("GETATTR on the local mount");
        y.lookup_path("/local").expect("LOOKUP from the pseudo-root into the local mount");
        let o = y.open("/local", "x", 3, Some(0o644)).expect("OPEN (create) on the local mount");
        y.write(&o, 0, b"local", true).expect("WRITE on the local mount");
        let took = t.elapsed();
        assert!(took < Duration::from_millis(400), "the local mount's COMPOUNDs took {took:?} while A stalled");
        assert!(!remote.is_finished(), "the COMPOUNDs on the nfs mount wait for A");
        std::thread::sleep(Duration::from_millis(700));
        r.paused.store(false, Ordering::SeqCst);
        let (got, waited) = remote.join().unwrap();
        assert_eq!(got.as_deref(), Ok(&b"written while A stalled"[..]), "GETATTR, OPEN, WRITE and READ through B once A answers");
        assert!(waited >= Duration::from_millis(900), "they waited for A ({waited:?})");
    });
    let (mut direct, a_root) = connect(&a.nfs, "/m");
    let (g, _) = direct.lookup(&a_root, b"g").expect("the OPEN created the file on A");
    assert_eq!(read_all(&mut direct, &g, 64), b"written while A stalled");
    drop(b);
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// GET /metrics from `addr`: (the body, how long it took). Panics when the
/// scrape does not answer within 5 s.
fn scrape(addr: &str) -> (String, Duration) {
    use std::io::{Read, Write};
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap_or_else(|e| panic!("the scrape did not answer within 5 s: {e}"));
    (body, t.elapsed())
}

/// A remote that stops answering holds neither `/metrics` nor the mount's
/// space figures in it: the scrape answers at once with what the remote
/// last said (FSSTAT runs on the mount's workers, never on the scrape
/// thread), while the mount's own calls wait for the remote.
#[test]
fn a_stalled_remote_does_not_hold_a_scrape() {
    use std::sync::atomic::Ordering;
    let dir = scratch("scrape");
    let a = start(&config_a(&dir, 0, None));
    let r = relay::relay(format!("127.0.0.1:{}", port(&a.nfs)).parse().unwrap());
    let b = start(&config_b_with(&dir, r.addr.port(), 1, json!({ "bind": "127.0.0.1", "port": 0 })));
    let metrics = listening(&b.seen, "metrics").to_string();
    let capacity = |body: &str| body.lines().find(|l| l.starts_with("chimera_mount_capacity_bytes{mount=\"r\"}")).map(str::to_string);
    // The figures come once the mount has connected (asked at connect, and
    // again by a scrape that finds them older than a second).
    let deadline = Instant::now() + Duration::from_secs(10);
    let before = loop {
        if let Some(l) = capacity(&scrape(&metrics).0) {
            break l;
        }
        assert!(Instant::now() < deadline, "no capacity figure for the nfs mount within 10 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let clients: Vec<_> = (0..2).map(|_| connect(&b.nfs, "/r")).collect();
    r.paused.store(true, Ordering::SeqCst);
    std::thread::scope(|s| {
        // Both of the mount's connections wait for A.
        let waiting: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, (mut c, root))| s.spawn(move || c.create(&root, format!("w{i}").as_bytes(), 0o644, true).map(|_| ())))
            .collect();
        std::thread::sleep(Duration::from_millis(1300));
        for round in 0..3 {
            let (body, took) = scrape(&metrics);
            assert!(took < Duration::from_millis(500), "scrape {round} took {took:?} while the remote stalled");
            assert_eq!(capacity(&body).as_deref(), Some(before.as_str()), "the last figures stay in the scrape");
            assert!(body.contains("chimera_nfs_mount_up{mount=\"r\"}"), "{body}");
        }
        assert!(waiting.iter().all(|w| !w.is_finished()), "the mount's calls wait for A");
        r.paused.store(false, Ordering::SeqCst);
        for w in waiting {
            assert_eq!(w.join().unwrap(), Ok(()), "CREATE through B once A answers");
        }
    });
    drop(b);
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A remote laid out like the Linux server or Ganesha: NFS on one port
/// with no MOUNT there (PROG_UNAVAIL), MOUNT on a port of its own, and a
/// portmapper that names it. Built in-process from our own programs over
/// one memfs; every server on a kernel-chosen port.
struct SplitRemote {
    vfs: std::sync::Arc<dyn vfs::Vfs>,
    nfs: runtime::Server,
    mount: runtime::Server,
    portmap: runtime::Server,
}

impl SplitRemote {
    /// `registered`: whether the portmapper knows the MOUNT port.
    fn start(registered: bool) -> SplitRemote {
        use std::sync::Arc;
        let vfs: Arc<dyn vfs::Vfs> = Arc::new(vfs::memfs::MemFs::new(vfs::memfs::MemFsConfig { export_id: 1, capacity_bytes: 64 << 20 }));
        let serve = |d: rpc::Dispatcher| {
            let cfg = runtime::Config { cores: 1, listen: vec!["127.0.0.1:0".parse().unwrap()], ..Default::default() };
            runtime::Server::start(cfg, Arc::new(d)).unwrap()
        };
        let limits = rpc::Limits::default();
        let mut d = rpc::Dispatcher::new(limits);
        d.register(Arc::new(nfs3::Nfs3Program::new(vfs.clone())), "nfs3", &nfs3::PROC_NAMES);
        let nfs = serve(d);
        let v = vfs.clone();
        let resolve = Arc::new(move |_: &[u8]| v.root(1));
        let mut d = rpc::Dispatcher::new(limits);
        let exports = vec![nfs3::Export { name: b"/m".to_vec(), path: b"/".to_vec() }];
        d.register(Arc::new(nfs3::Mount3Program::new(exports, resolve)), "mount3", &nfs3::mount::PROC_NAMES);
        let mount = serve(d);
        let mport = mount.local_addrs()[0].port() as u32;
        let regs = if registered { vec![nfs3::portmap::Registration { prog: 100_005, vers: 3, prot: 6, port: mport }] } else { vec![] };
        let mut d = rpc::Dispatcher::new(limits);
        d.register(Arc::new(nfs3::PortmapProgram::new(regs)), "portmap", &nfs3::portmap::PROC_NAMES);
        let portmap = serve(d);
        SplitRemote { vfs, nfs, mount, portmap }
    }

    fn port(s: &runtime::Server) -> u16 {
        s.local_addrs()[0].port()
    }
}

fn config_split(dir: &Path, nfs_port: u16, mount_keys: Value) -> PathBuf {
    let mut r = json!({ "module": "nfs", "path": "127.0.0.1:/m", "port": nfs_port, "connections": 1, "timeout_ms": REMOTE_TIMEOUT_MS });
    for (k, v) in mount_keys.as_object().unwrap() {
        r[k] = v.clone();
    }
    let v = json!({
        "common": { "log_level": "info" },
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
        "mounts": { "r": r },
        "exports": { "/r": { "path": "/r" } },
        "admin": { "enabled": false },
        "metrics": { "enabled": false }
    });
    let cfg = dir.join("split.json");
    std::fs::write(&cfg, v.to_string()).unwrap();
    cfg
}

/// A remote whose MOUNT is not on its NFS port: B finds it through the
/// remote's portmapper (`portmap_port`), or at `mount_port` when given;
/// the file B creates lands in the remote's file system. A portmapper that
/// knows no MOUNT leaves the mount down with a log line that says so, and
/// its calls answer EIO, not a hang.
#[test]
fn mount_is_found_through_the_remote_portmapper_or_at_mount_port() {
    let dir = scratch("split");
    let remote = SplitRemote::start(true);
    let (np, mp, pp) = (SplitRemote::port(&remote.nfs), SplitRemote::port(&remote.mount), SplitRemote::port(&remote.portmap));
    // The remote really has no MOUNT on its NFS port.
    let mut direct = Nfs3::connect(&format!("127.0.0.1:{np}"), &Auth::sys(0, 0), limits()).unwrap();
    let e = direct.mount("/m").unwrap_err();
    assert!(matches!(e, Error::Accept { code: 1, .. }), "PROG_UNAVAIL on the NFS port: {e}");
    for (i, keys) in [json!({ "portmap_port": pp }), json!({ "mount_port": mp })].into_iter().enumerate() {
        let mut b = start(&config_split(&dir, np, keys.clone()));
        logged(&mut b, "remote export connected", Duration::from_secs(10));
        let (mut c, root) = connect(&b.nfs, "/r");
        let name = format!("split-{i}");
        let f = c.create(&root, name.as_bytes(), 0o644, true).unwrap();
        c.write(&f, 0, b"through the split remote", Stable::FileSync).unwrap();
        assert_eq!(read_all(&mut c, &f, 64), b"through the split remote", "{keys}");
        let rroot = remote.vfs.root(1).unwrap();
        let (fh, attr) = remote.vfs.lookup(&rroot, name.as_bytes()).unwrap_or_else(|e| panic!("{keys}: not on the remote: {e:?}"));
        assert_eq!(attr.size, 24, "{keys}: {fh:?}");
        drop(b);
    }
    // A portmapper without MOUNT: down, said so, EIO within the timeout.
    let bare = SplitRemote::start(false);
    let mut b = start(&config_split(&dir, SplitRemote::port(&bare.nfs), json!({ "portmap_port": SplitRemote::port(&bare.portmap) })));
    let mut c = Nfs3::connect(&b.nfs, &Auth::sys(0, 0), limits()).unwrap();
    let t = Instant::now();
    let e = c.mount("/r").unwrap_err();
    assert!(matches!(e, Error::Mount { code: MNT3ERR_IO, .. }), "{e}");
    assert!(t.elapsed() < Duration::from_millis(2 * REMOTE_TIMEOUT_MS + 1000), "{:?}", t.elapsed());
    let v = logged(&mut b, "remote has no MOUNT service we can reach (set the mount's mount_port)", Duration::from_secs(10));
    assert!(v["error"].as_str().is_some_and(|e| e.contains("portmapper") && e.contains("none registered")), "{v}");
    drop(b);
    for s in [remote, bare] {
        s.nfs.shutdown();
        s.mount.shutdown();
        s.portmap.shutdown();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

