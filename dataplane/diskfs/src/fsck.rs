//! `chimera-fsck`'s checker: every invariant of FORMAT.md, on the devices
//! as they are (before recovery frees orphans). Read-only.

use std::collections::HashMap;

use block::Device;
use vfs::{FileType, Ino};

use crate::dev::Devs;
use crate::journal::{self, LoadError};
use crate::meta::{self, BLOCK, ROOT_GEN, ROOT_INO};

#[derive(Debug, Default)]
pub struct Report {
    /// Each violation: where (device and byte offset when it has one) and what.
    pub violations: Vec<String>,
    pub inodes: u64,
    pub orphans: u64,
    pub data_blocks_used: u64,
    pub log_units: u64,
}

impl Report {
    pub fn clean(&self) -> bool {
        self.violations.is_empty()
    }
}

pub fn check(devices: Vec<Device>) -> Result<Report, String> {
    let devs = Devs::new(devices, crate::dev::TOOL_BUFS)?;
    let mut rep = Report::default();
    let supers = match journal::read_supers(&devs).and_then(|s| journal::check_supers(&devs, &s)) {
        Ok(s) => s,
        Err(LoadError::Blank) => {
            rep.violations.push(format!("device {}, byte offset 0: no diskfs superblock", devs.name(0)));
            return Ok(rep);
        }
        Err(e) => {
            rep.violations.push(e.to_string());
            return Ok(rep);
        }
    };
    let s0 = supers[0];
    if s0.log_start + s0.log_blocks > s0.ckpt_start[0]
        || s0.ckpt_start[0] + s0.ckpt_blocks > s0.ckpt_start[1]
        || s0.ckpt_start[1] + s0.ckpt_blocks > s0.data_start
        || s0.data_start > s0.device_blocks
    {
        rep.violations.push(format!("device {}, byte offset 0: superblock areas overlap or exceed the device", devs.name(0)));
        return Ok(rep);
    }
    let loaded = match journal::load(&devs, &s0) {
        Ok(l) => l,
        Err(e) => {
            rep.violations.push(e.to_string());
            return Ok(rep);
        }
    };
    rep.log_units = loaded.units;
    let st = &loaded.st;
    rep.inodes = st.inodes.len() as u64;
    let v = &mut rep.violations;
    match st.inodes.get(&ROOT_INO) {
        Some(r) if r.rec.gen == ROOT_GEN && r.rec.ftype == FileType::Directory && r.rec.parent == ROOT_INO => {}
        _ => v.push("inode 1: the root directory is missing or not a directory".into()),
    }
    // Links seen per inode, and subdirectories per directory.
    let mut links: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    for (ino, i) in &st.inodes {
        if i.rec.ino != *ino {
            v.push(format!("inode {ino}: record names inode {}", i.rec.ino));
        }
        if i.rec.gen >= st.gen_next || *ino >= st.ino_next {
            v.push(format!("inode {ino}: generation or number not below the counters"));
        }
        if let Some(d) = &i.dir {
            if d.by_name.len() != d.by_cookie.len() {
                v.push(format!("directory {ino}: name and cookie indexes differ"));
            }
            for (cookie, (name, child)) in &d.by_cookie {
                if d.by_name.get(name) != Some(&(*child, *cookie)) {
                    v.push(format!("directory {ino}: entry {:?} indexed inconsistently", String::from_utf8_lossy(name)));
                }
                let Some(c) = st.inodes.get(child) else {
                    v.push(format!("directory {ino}: entry {:?} names missing inode {child}", String::from_utf8_lossy(name)));
                    continue;
                };
                *links.entry(*child).or_default() += 1;
                if c.rec.ftype == FileType::Directory {
                    *subdirs.entry(*ino).or_default() += 1;
                    if c.rec.parent != *ino {
                        v.push(format!("directory {child}: parent is {} but it is listed in {ino}", c.rec.parent));
                    }
                }
                // A mount's root (a top-level directory) is its own tree.
                let mount_root = *ino == ROOT_INO && c.rec.ftype == FileType::Directory && c.rec.tree == *child;
                let tree = if mount_root { *child } else { i.rec.tree };
                if c.rec.tree != tree {
                    v.push(format!("inode {child}: tree {} but {tree} expected under directory {ino}", c.rec.tree));
                }
                let outer = if c.rec.quota > 0 { 0 } else { c.rec.volume };
                if outer != i.rec.volume {
                    v.push(format!("inode {child}: volume {} differs from its directory {ino}'s {}", c.rec.volume, i.rec.volume));
                }
            }
        }
        if i.rec.ftype != FileType::Regular && !i.map.is_empty() {
            v.push(format!("inode {ino}: a {:?} maps data blocks", i.rec.ftype));
        }
        if let Some((last, _)) = i.map.iter().next_back() {
            if *last >= i.rec.size.div_ceil(BLOCK) {
                v.push(format!("inode {ino}: maps file block {last} beyond its size {}", i.rec.size));
            }
        }
        if i.rec.quota > 0 && i.rec.volume != *ino {
            v.push(format!("inode {ino}: a volume root whose volume is {}", i.rec.volume));
        }
    }
    for (ino, i) in &st.inodes {
        let seen = links.get(ino).copied().unwrap_or(0);
        if i.rec.ftype == FileType::Directory {
            let want = 2 + subdirs.get(ino).copied().unwrap_or(0);
            if i.rec.nlink != want {
                v.push(format!("directory {ino}: nlink {} but {} expected", i.rec.nlink, want));
            }
            if *ino != ROOT_INO && seen != 1 {
                v.push(format!("directory {ino}: listed {seen} times"));
            }
        } else {
            if i.rec.nlink != seen {
                v.push(format!("inode {ino}: nlink {} but listed {seen} times", i.rec.nlink));
            }
            if seen == 0 {
                rep.orphans += 1;
            }
        }
    }
    // Blocks: inside a data area, mapped once; volume usage adds up.
    let mut owner: HashMap<u64, Ino> = HashMap::new();
    let mut vol: HashMap<Ino, u64> = HashMap::new();
    for (ino, i) in &st.inodes {
        for (f, e) in &i.map {
            let (d, lba) = (meta::phys_dev(e.phys) as usize, meta::phys_lba(e.phys));
            let inside = supers.get(d).is_some_and(|s| lba >= s.data_start && lba < s.device_blocks);
            if !inside {
                v.push(format!("inode {ino}: file block {f} at device {d} block {lba}, outside the data area"));
            } else if let Some(o) = owner.insert(e.phys, *ino) {
                v.push(format!(
                    "device {}, byte offset {}: mapped by inode {o} and inode {ino}",
                    devs.name(d),
                    lba * BLOCK
                ));
            }
        }
        if i.rec.volume != 0 {
            *vol.entry(i.rec.volume).or_default() += i.map.len() as u64 * BLOCK;
        }
    }
    rep.data_blocks_used = owner.len() as u64;
    for (root, used) in vol {
        match st.inodes.get(&root) {
            Some(r) if r.rec.quota > 0 => {
                if used > r.rec.quota {
                    v.push(format!("volume {root}: {used} bytes used over its capacity {}", r.rec.quota));
                }
            }
            _ => v.push(format!("volume {root}: objects belong to it but it is not a volume root")),
        }
    }
    Ok(rep)
}
