//! Proves that metadata is charged honestly: filling a MemFs with empty
//! files, directories and symlinks (no data at all) until NoSpace keeps the
//! process's resident growth within the capacity (plus 10 % for allocator
//! slack), so a create-only load cannot grow memory past the configured
//! bound either. Then everything is removed and the same load fits again.
//!
//! Its own test binary (one test) so no other test's memory is counted.

// `is_multiple_of` is newer than the workspace's rust-version (1.85).
#![allow(clippy::manual_is_multiple_of)]

use vfs::memfs::{MemFs, MemFsConfig};
use vfs::{CreateMode, Cred, NodeKind, Vfs, VfsError};

const MIB: u64 = 1 << 20;
const CAPACITY_BYTES: u64 = 128 * MIB;
const ENTRIES_PER_DIR: u64 = 20_000;

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} missing"));
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().expect("number of kB")
}

/// Create objects until NoSpace; returns how many were created.
fn fill(fs: &MemFs, tag: &str) -> u64 {
    let root = fs.root(1).unwrap();
    let cred = Cred::ROOT;
    let mut created = 0u64;
    let mut dir = None;
    loop {
        if created % ENTRIES_PER_DIR == 0 {
            let name = format!("{tag}-dir-{created}");
            match fs.create(&root, name.as_bytes(), NodeKind::Directory, 0o755, &cred, CreateMode::Guarded) {
                Ok((fh, _)) => dir = Some(fh),
                Err(e) => {
                    assert_eq!(e, VfsError::NoSpace);
                    return created;
                }
            }
        }
        // Long names: the name bytes must be charged too.
        let name = format!("{created:0>200}");
        let kind = if created % 10 == 0 { NodeKind::Symlink { target: b"some/target/path" } } else { NodeKind::File };
        match fs.create(dir.as_ref().unwrap(), name.as_bytes(), kind, 0o644, &cred, CreateMode::Guarded) {
            Ok(_) => created += 1,
            Err(e) => {
                assert_eq!(e, VfsError::NoSpace, "only NoSpace may stop a create");
                return created;
            }
        }
    }
}

#[test]
fn filling_with_metadata_keeps_memory_within_capacity() {
    let fs = MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: CAPACITY_BYTES });
    let rss_start_kib = status_kib("VmRSS:");
    let created = fill(&fs, "a");
    let peak_kib = status_kib("VmHWM:");
    let growth_kib = peak_kib.saturating_sub(rss_start_kib);
    let bound_kib = CAPACITY_BYTES * 11 / 10 / 1024;
    println!(
        "created {created} objects, used {} MiB, rss growth {} MiB, bound {} MiB",
        fs.used_bytes() / MIB,
        growth_kib / 1024,
        bound_kib / 1024
    );
    assert!(created > 100_000, "only {created} objects fit in {CAPACITY_BYTES} bytes");
    assert!(growth_kib < bound_kib, "metadata grew RSS by {growth_kib} KiB, over {bound_kib} KiB");

    let root = fs.root(1).unwrap();
    let mut dirs = Vec::new();
    fs.readdir(&root, 0, &mut |e| {
        dirs.push(e.name.to_vec());
        true
    })
    .unwrap();
    for d in &dirs {
        fs.remove_tree(&root, d).unwrap();
    }
    assert_eq!(fs.used_bytes(), vfs::memfs::INODE_CHARGE_BYTES);
    assert_eq!(fs.inode_count(), 1);
    let again = fill(&fs, "b");
    assert!(again + 2 >= created, "space not reusable: {again} < {created}");
}
