//! Proves that MemFs memory is bounded by its configured capacity: writing
//! four times the capacity gets NoSpace once full, and the process's peak
//! resident set (VmHWM from /proc/self/status) stays under capacity +
//! 256 MiB. Then everything is removed and the capacity is written again,
//! proving the space is reusable and the peak does not grow.
//!
//! Its own test binary (one test) so no other test's memory is counted.

use vfs::memfs::{MemFs, MemFsConfig};
use vfs::{CreateMode, Cred, NodeKind, Stability, Vfs, VfsError};

const MIB: u64 = 1 << 20;
const CAPACITY_BYTES: u64 = 256 * MIB;
const HEADROOM_BYTES: u64 = 256 * MIB;
const WRITE_BYTES: usize = MIB as usize;
const FILE_BYTES: u64 = 32 * MIB;

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} missing"));
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().expect("number of kB")
}

/// Write `total_bytes` in 1 MiB writes over 32 MiB files named with
/// `prefix`; returns (bytes written, NoSpace failures).
fn fill(fs: &MemFs, prefix: &str, total_bytes: u64) -> (u64, u64) {
    let root = fs.root(1).unwrap();
    let block: Vec<u8> = (0..WRITE_BYTES).map(|i| (i % 251) as u8).collect();
    let (mut written, mut nospace) = (0u64, 0u64);
    let mut attempted = 0u64;
    let mut file = None;
    let mut index = 0u64;
    while attempted < total_bytes {
        let offset = attempted % FILE_BYTES;
        if offset == 0 || file.is_none() {
            let name = format!("{prefix}{index}");
            index += 1;
            match fs.create(&root, name.as_bytes(), NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded) {
                Ok((fh, _)) => file = Some(fh),
                Err(e) => {
                    assert_eq!(e, VfsError::NoSpace);
                    nospace += 1;
                    attempted += WRITE_BYTES as u64;
                    continue;
                }
            }
        }
        match fs.write(file.as_ref().unwrap(), offset, &block, Stability::Unstable) {
            Ok((n, _, _)) => written += n as u64,
            Err(e) => {
                assert_eq!(e, VfsError::NoSpace, "only NoSpace may stop a write");
                nospace += 1;
            }
        }
        attempted += WRITE_BYTES as u64;
    }
    (written, nospace)
}

#[test]
fn writing_four_times_capacity_keeps_memory_bounded() {
    let fs = MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: CAPACITY_BYTES });
    let rss_start_kib = status_kib("VmRSS:");
    let (written, nospace) = fill(&fs, "a", 4 * CAPACITY_BYTES);
    assert!(nospace > 0, "NoSpace never arrived");
    assert!(written < CAPACITY_BYTES, "wrote {written} bytes into {CAPACITY_BYTES}");
    // Full to within one write (plus the metadata charges).
    assert!(written + 2 * WRITE_BYTES as u64 > CAPACITY_BYTES * 4096 / (4096 + 64), "only {written} bytes fit");
    assert!(fs.used_bytes() <= CAPACITY_BYTES);
    let peak_kib = status_kib("VmHWM:");
    let bound_kib = (CAPACITY_BYTES + HEADROOM_BYTES) / 1024;
    println!(
        "written {} MiB, {nospace} NoSpace, rss at start {} MiB, peak {} MiB, bound {} MiB",
        written / MIB,
        rss_start_kib / 1024,
        peak_kib / 1024,
        bound_kib / 1024
    );
    assert!(peak_kib < bound_kib, "peak RSS {peak_kib} KiB over the bound {bound_kib} KiB");

    // Free everything: only the root is charged, and the capacity is
    // writable again without the peak growing past the bound.
    let root = fs.root(1).unwrap();
    let mut names = Vec::new();
    fs.readdir(&root, 0, &mut |e| {
        names.push(e.name.to_vec());
        true
    })
    .unwrap();
    for n in &names {
        fs.remove(&root, n).unwrap();
    }
    assert_eq!(fs.used_bytes(), vfs::memfs::INODE_CHARGE_BYTES);
    let (again, nospace_again) = fill(&fs, "b", 2 * CAPACITY_BYTES);
    assert!(nospace_again > 0);
    assert!(again + 2 * WRITE_BYTES as u64 >= written, "space not reusable: {again} < {written}");
    let peak_kib = status_kib("VmHWM:");
    println!("after reuse: written {} MiB, peak {} MiB", again / MIB, peak_kib / 1024);
    assert!(peak_kib < bound_kib, "peak RSS {peak_kib} KiB over the bound {bound_kib} KiB after reuse");
}
