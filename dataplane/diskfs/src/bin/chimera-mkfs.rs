//! chimera-mkfs: format devices (files or block devices) as one diskfs.
//!
//!     chimera-mkfs [--force] [--export-id N] DEVICE...
//!
//! Refuses a device that already holds a diskfs file system unless
//! `--force` (which destroys it). Devices are listed in the order the
//! server's `devices` list will name them.

use std::process::ExitCode;
use std::sync::Arc;

fn usage() -> ExitCode {
    eprintln!("usage: chimera-mkfs [--force] [--export-id N] DEVICE...");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut force = false;
    let mut export_id = 1u32;
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--force" => force = true,
            "--export-id" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) => export_id = v,
                None => return usage(),
            },
            "-h" | "--help" => return usage(),
            s if s.starts_with('-') => {
                eprintln!("chimera-mkfs: unknown option {s}");
                return usage();
            }
            _ => paths.push(a),
        }
    }
    if paths.is_empty() {
        return usage();
    }
    let mut devs: Vec<block::Device> = Vec::new();
    for p in &paths {
        match block::uring::UringDevice::open(&block::uring::UringOptions::new(p)) {
            Ok(d) => devs.push(Arc::new(d)),
            Err(e) => {
                eprintln!("chimera-mkfs: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    match diskfs::format(devs, export_id, force) {
        Ok(cluster) => {
            println!("chimera-mkfs: formatted {} device(s) as cluster {cluster}", paths.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chimera-mkfs: {e}");
            ExitCode::FAILURE
        }
    }
}
