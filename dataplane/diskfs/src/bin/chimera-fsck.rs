//! chimera-fsck: check a diskfs file system (read-only).
//!
//!     chimera-fsck DEVICE...
//!
//! A DEVICE is a file or block device (read through io_uring), or
//! `vfio:ADDR` for an NVMe controller bound to vfio-pci (read through the
//! userspace driver; PCI address `0000:01:00.0` or `01:00.0`).
//!
//! Checks every invariant FORMAT.md lists and prints each violation with
//! its device and byte offset (or its inode). Exit 0: clean; 1: violations
//! found; 2: usage; 3: the devices could not be read.

use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() || paths.iter().any(|p| p.starts_with('-')) {
        eprintln!("usage: chimera-fsck DEVICE...");
        return ExitCode::from(2);
    }
    let mut devs: Vec<block::Device> = Vec::new();
    for p in &paths {
        if let Some(addr) = p.strip_prefix("vfio:") {
            match nvme::open_pci(&nvme::sysfs_address(addr), &nvme::Options::default()) {
                Ok(d) => devs.push(Arc::new(d)),
                Err(e) => {
                    eprintln!("chimera-fsck: {e}");
                    return ExitCode::from(3);
                }
            }
            continue;
        }
        let mut o = block::uring::UringOptions::new(p);
        o.read_only = true;
        match block::uring::UringDevice::open(&o) {
            Ok(d) => devs.push(Arc::new(d)),
            Err(e) => {
                eprintln!("chimera-fsck: {e}");
                return ExitCode::from(3);
            }
        }
    }
    let t0 = std::time::Instant::now();
    let rep = match diskfs::fsck::check(devs) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chimera-fsck: {e}");
            return ExitCode::from(3);
        }
    };
    for v in &rep.violations {
        println!("VIOLATION: {v}");
    }
    println!(
        "chimera-fsck: {} inodes ({} orphaned, freed at the next start), {} data blocks in use, {} log units; {} violation(s) in {} ms",
        rep.inodes,
        rep.orphans,
        rep.data_blocks_used,
        rep.log_units,
        rep.violations.len(),
        t0.elapsed().as_millis()
    );
    if rep.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
