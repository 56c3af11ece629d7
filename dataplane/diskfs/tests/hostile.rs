//! Hostile devices: metadata blocks overwritten with garbage, flipped bits
//! anywhere in the metadata areas, records that decode but do not fit —
//! recovery and fsck answer with an error (or a consistent file system),
//! never a panic, and never serve a file whose blocks another file owns.

use std::sync::Arc;

use block::mem::{Image, MemDevice};
use block::rng::SeededRng;
use block::Device;
use diskfs::{DiskFs, Options};
use vfs::{CreateMode, Cred, NodeKind, Stability, Vfs};

const EXPORT: u32 = 1;

fn populated() -> (Image, diskfs::format::Super) {
    let m = Arc::new(MemDevice::new("hostile", 2048));
    {
        let fs = DiskFs::open(vec![m.clone() as Device], &Options { io_buffers: 4, ..Options::new(EXPORT, true) }).unwrap();
        let root = fs.root(EXPORT).unwrap();
        for i in 0..40 {
            let name = format!("f{i}");
            let f = fs.create(&root, name.as_bytes(), NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
            fs.write(&f, 0, &vec![i as u8 + 1; 5000], Stability::FileSync).unwrap();
            if i % 7 == 0 {
                fs.remove(&root, name.as_bytes()).unwrap();
            }
        }
        fs.checkpoint().unwrap();
        for i in 0..10 {
            fs.create(&root, format!("g{i}").as_bytes(), NodeKind::Directory, 0o755, &Cred::ROOT, CreateMode::Guarded).unwrap();
        }
    }
    let img = m.snapshot();
    let mut b = vec![0u8; 4096];
    img.read(0, &mut b);
    (img, diskfs::format::Super::decode(&b).unwrap())
}

/// Open and fsck an image; whatever they say, no panic, and an opened file
/// system passes its own fsck.
fn try_image(img: Image, label: &str) -> bool {
    let dev: Device = Arc::new(MemDevice::from_image("hostile", img.clone()));
    let rep = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| diskfs::fsck::check(vec![dev.clone()]).unwrap()));
    let rep = rep.unwrap_or_else(|_| panic!("{label}: fsck panicked"));
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        DiskFs::open(vec![Arc::new(MemDevice::from_image("hostile", img.clone())) as Device], &Options { io_buffers: 4, ..Options::new(EXPORT, false) })
            .map(|fs| fs.report().inodes)
    }));
    match opened.unwrap_or_else(|_| panic!("{label}: recovery panicked")) {
        Ok(_) => {
            assert!(rep.clean(), "{label}: recovery accepted an image fsck rejects: {:?}", rep.violations);
            true
        }
        Err(e) => {
            assert!(e.contains("hostile") || e.contains("diskfs"), "{label}: error names nothing: {e}");
            false
        }
    }
}

#[test]
fn garbage_and_flipped_bits_in_metadata_never_panic() {
    let (img, s) = populated();
    let mut rng = SeededRng::new(7);
    let areas = [(0u64, 1u64), (s.log_start, 16), (s.ckpt_start[0], 4), (s.ckpt_start[1], 4)];
    let (mut refused, mut served) = (0, 0);
    for round in 0..300 {
        let (start, len) = areas[rng.below(areas.len() as u64) as usize];
        let lba = start + rng.below(len);
        let mut b = img.block(lba).to_vec();
        match round % 3 {
            // One flipped bit.
            0 => {
                let at = rng.below(4096) as usize;
                b[at] ^= 1 << rng.below(8);
            }
            // A run of garbage after an intact header (checksum then fails).
            1 => {
                let at = 56 + rng.below(3000) as usize;
                for x in &mut b[at..at + 64] {
                    *x = rng.next_u64() as u8;
                }
            }
            // A whole block of garbage.
            _ => b.iter_mut().for_each(|x| *x = rng.next_u64() as u8),
        }
        let mut bad = img.clone();
        bad.set(lba, Some(b.into()));
        if try_image(bad, &format!("round {round}, block {lba}")) {
            served += 1;
        } else {
            refused += 1;
        }
    }
    println!("hostile metadata: {refused} images refused, {served} served (consistent), none panicked");
    assert!(refused > 0, "no corruption was detected at all");
}
