//! The pNFS MDS on diskfs through the real server: chimerad with role
//! `mds` and a diskfs mount (a file as its device), three in-process data
//! servers, the test NFSv4.1 client. Proves the whole wiring — the MDS's
//! router forwards the private blobs pNFS keeps placements in to diskfs.

mod pnfs_client;

use pnfs_client::*;
use chimerad::config::Config;
use chimerad::serve::{self, Running};
use serde_json::json;

const SHARE_BOTH: u32 = 3;
const RW: u32 = 2;
const SU: u64 = 64 * 1024;

fn start_mds(img: &std::path::Path, ds: &[Running], order: &[usize]) -> Running {
    let list: Vec<_> = order.iter().map(|&i| json!({ "name": format!("ds{i}"), "uaddr": ds_addr(&ds[i]).to_string() })).collect();
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "role": "mds", "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0,
                    "grace_time_s": 0,
                    "vfs": { "diskfs": { "config": { "initialize": true, "devices": [{ "type": "io_uring", "path": img.to_str().unwrap() }] } } },
                    "pnfs": { "enabled": true, "stripe_unit_bytes": "64K", "data_servers": list, "ds_timeout_ms": 1000 } },
        "mounts": { "m": { "module": "diskfs", "path": "/" } },
        "exports": { "/m": { "path": "/m" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": TOKEN, "tls": false },
        "metrics": { "enabled": false }
    });
    serve::start(&Config::parse(&v.to_string()).unwrap()).expect("start MDS")
}

fn data(len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (i * 7 + i / 4093) as u8).collect()
}

/// Proves a file striped over three DSes by writes through the MDS (and a
/// second one placed by LAYOUTGET and written on its DS) reads back through
/// the MDS after chimerad is stopped and started again on the same diskfs
/// device with its data-server list in another order; without durable
/// placements the MDS would answer zeros (or holes) for both.
#[test]
fn mds_on_diskfs_reads_placed_data_back_after_a_restart() {
    let dir = std::env::temp_dir().join(format!("chimera-pnfs-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("mds.img");
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    let ds: Vec<Running> = (0..3).map(|_| start_ds()).collect();
    let want = data((3 * SU + 1000) as usize);
    let on_ds = pattern(9, 0, 5000);
    {
        let mds = start_mds(&img, &ds, &[0, 1, 2]);
        let mut v = V4::connect(mds.nfs_addr.unwrap(), b"before");
        let (open, fh) = v.open(&["m"], "striped", SHARE_BOTH);
        for (k, chunk) in want.chunks(30_000).enumerate() {
            assert_eq!(v.write(&fh, &open, k as u64 * 30_000, chunk), Ok(chunk.len() as u32));
        }
        let (open2, fh2) = v.open(&["m"], "by-layout", SHARE_BOTH);
        let l = v.layoutget(&fh2, 4, RW, 0, u64::MAX, 0, &open2).expect("RW layout");
        let m = &l.mirrors[0];
        ds_client(v.ds_of(&m.deviceid), m.uid, m.gid).write(&m.fh, 0, &on_ds, 2).unwrap();
        assert_eq!(v.layoutcommit(&fh2, &l.stateid, on_ds.len() as u64 - 1), Ok(Some(on_ds.len() as u64)));
        assert_eq!(mds.pnfs.as_ref().unwrap().files_placed(), 2);
        mds.shutdown();
    }
    let mds = start_mds(&img, &ds, &[2, 0, 1]);
    let mut v = V4::connect(mds.nfs_addr.unwrap(), b"after");
    let (open, fh) = v.open(&["m"], "striped", SHARE_BOTH);
    assert_eq!(v.size(&fh), want.len() as u64);
    assert!(v.read(&fh, &open, 0, want.len() as u32).unwrap() == want, "the striped file reads back through the MDS");
    let (open2, fh2) = v.open(&["m"], "by-layout", SHARE_BOTH);
    assert!(v.read(&fh2, &open2, 0, 5000).unwrap() == on_ds, "the file written on its DS reads back through the MDS");
    assert_eq!(mds.pnfs.as_ref().unwrap().metrics.placements_restored.load(std::sync::atomic::Ordering::Relaxed), 2);
    mds.shutdown();
    for d in ds {
        d.shutdown();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
