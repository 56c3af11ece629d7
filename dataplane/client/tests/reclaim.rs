//! Recovery after a server restart on the durable backend (chimerad on
//! diskfs, in process): the client reclaims its open in the grace period
//! (OPEN CLAIM_PREVIOUS) because the server kept its record on stable
//! storage, while a client the server never knew is refused reclaim
//! (NFS4ERR_NO_GRACE); the COMMIT after the restart reports the unstable
//! writes the restart lost (new verifier), the client resends them, and the
//! data reads back. Also NFSv3: the file handle is valid after the restart.

mod common;

use chimerad::config::Config;
use chimerad::serve::{self, Running};
use client::nfs4::Nfs41;
use client::Error;
use common::{limits, pattern, root};
use serde_json::json;
use std::path::{Path, PathBuf};

fn device() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("client-reclaim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let img = d.join("dev0.img");
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    img
}

fn start_diskfs(img: &Path, port: u16) -> Running {
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "bind": "127.0.0.1", "threads": 1, "nfs_port": port, "mount_port": 0, "portmap_port": 0,
                    "grace_time_s": 60, "lease_time_s": 30,
                    "vfs": { "diskfs": { "config": { "initialize": true, "devices": [{ "type": "io_uring", "path": img.to_str().unwrap() }] } } } },
        "mounts": { "d": { "module": "diskfs", "path": "/" } },
        "exports": { "/d": { "path": "/d" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": "client-test-token", "tls": false },
        "metrics": { "enabled": false }
    });
    serve::start(&Config::parse(&v.to_string()).unwrap()).expect("start chimerad on diskfs")
}

#[test]
fn open_reclaimed_after_restart_and_lost_unstable_writes_resent() {
    let img = device();
    let s = start_diskfs(&img, 0);
    let addr = s.nfs_addr.unwrap().to_string();
    let port = s.nfs_addr.unwrap().port();
    let mut c = Nfs41::connect(&addr, &root(), limits(), b"reclaim-client").unwrap();
    let o = c.open("/d", "f", 3, Some(0o644)).unwrap();
    let durable = pattern(1, 0, 8192);
    c.write(&o, 0, &durable, true).unwrap();
    let lost = pattern(2, 8192, 8192);
    let (_, stable, verf_before) = c.write(&o, 8192, &lost, false).unwrap();
    assert!(!stable, "diskfs answers UNSTABLE writes as UNSTABLE");
    s.shutdown();
    assert!(c.renew().unwrap_err().is_connection());

    let s2 = start_diskfs(&img, port);
    // A client the server never knew (no record on stable storage) may
    // not reclaim, even in grace.
    let mut opens = vec![(o.clone(), 3u32)];
    let e = match Nfs41::connect_reclaiming(&addr, &root(), limits(), b"stranger", &mut opens) {
        Err(e) => e,
        Ok(_) => panic!("a client without a record reclaimed"),
    };
    assert!(matches!(&e, Error::Nfs4 { code: 10033, .. }), "stranger reclaim: {e}");
    let mut opens = vec![(o.clone(), 3u32)];
    c.reestablish_reclaiming(&addr, &root(), limits(), &mut opens).unwrap();
    let o2 = opens.pop().unwrap().0;
    assert_eq!(o2.fh, o.fh, "the file handle survives the restart");
    // The durable write is there; the reclaimed stateid works.
    let mut out = Vec::new();
    c.read(&o2, 0, 8192, &mut out).unwrap();
    assert!(out == durable);
    // COMMIT: the verifier changed, the unstable write must be resent.
    match c.commit(&o2.fh) {
        Err(Error::VerifierChanged { ranges, resendable }) => {
            assert_eq!(ranges, vec![(8192, 8192)]);
            assert!(resendable);
        }
        other => panic!("COMMIT after the restart: {other:?} (verifier before {verf_before:?})"),
    }
    assert_eq!(c.resend_uncommitted(&o2).unwrap(), vec![(8192, 8192)]);
    c.commit(&o2.fh).unwrap();
    let mut out = Vec::new();
    c.read(&o2, 8192, 8192, &mut out).unwrap();
    assert!(out == lost);
    c.close(&o2).unwrap();
    s2.shutdown();
    let _ = std::fs::remove_dir_all(img.parent().unwrap());
}
