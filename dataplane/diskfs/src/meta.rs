//! Metadata: the in-memory state, the records that change it, and their
//! encoding. Every change — live or replayed from the log or a checkpoint —
//! goes through [`State::apply`], so recovery rebuilds exactly the state
//! the live server had built from the same records.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use vfs::{FileType, Ino, Time, VfsError, VfsResult};

/// A data block's address: device index in the top 16 bits, block below.
pub type Phys = u64;

pub fn phys(dev: u16, lba: u64) -> Phys {
    ((dev as u64) << 48) | lba
}
pub fn phys_dev(p: Phys) -> u16 {
    (p >> 48) as u16
}
pub fn phys_lba(p: Phys) -> u64 {
    p & ((1 << 48) - 1)
}

pub const ROOT_INO: Ino = 1;
pub const ROOT_GEN: u64 = 1;

/// An inode's attributes as logged (`Rec::InodePut`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeRec {
    pub ino: Ino,
    pub gen: u64,
    pub ftype: FileType,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub rdev: (u32, u32),
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub change: u64,
    /// The quota root (volume) this object belongs to; 0 for none.
    pub volume: Ino,
    /// Non-zero: this directory is a volume of this many bytes.
    pub quota: u64,
    /// A directory's parent (the root's is itself); 0 for other objects.
    pub parent: Ino,
    /// The top-level directory (a mount's root) this object lives under;
    /// 0 for the root and objects directly in it. Never changes: renames
    /// and links across top-level directories are refused.
    pub tree: Ino,
    /// Exclusive-create verifier of a regular file (zero: none).
    pub verf: [u8; 8],
    /// A symlink's target.
    pub target: Vec<u8>,
}

/// One change. The log and checkpoints are streams of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    /// Counters that must never go back (a checkpoint's first record).
    Counters { gen_next: u64, ino_next: u64 },
    /// Create an inode or replace its attributes.
    InodePut(InodeRec),
    /// Destroy an inode (its blocks are freed).
    InodeFree { ino: Ino },
    DirAdd { dir: Ino, cookie: u64, ino: Ino, name: Vec<u8> },
    DirDel { dir: Ino, name: Vec<u8> },
    /// File blocks `fblock..fblock+count` live at `phys..phys+count`.
    Map { ino: Ino, fblock: u64, phys: Phys, count: u32 },
    /// Unmap every block of the file at or after `from`.
    Trunc { ino: Ino, from: u64 },
    /// Unmap file blocks `[from, from + count)` (a punched hole).
    Punch { ino: Ino, from: u64, count: u64 },
    /// An NFSv4 client owner that may reclaim after a restart (`present`),
    /// or no longer (`Vfs::record_client`).
    Client { owner: Vec<u8>, present: bool },
    /// Replace an inode's server-private blob (`Vfs::private_set`);
    /// empty removes it.
    Private { ino: Ino, data: Vec<u8> },
}

/// A file block's place on a device. `logged`: a `Map` record holds it
/// (it survives a crash). Otherwise it was allocated for an unstable write
/// and lives only here until COMMIT (or a stable write) logs it; `tag` is
/// the flush count when its data write completed (`u64::MAX`: not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ext {
    pub phys: Phys,
    pub logged: bool,
    pub tag: u64,
}

#[derive(Debug, Default)]
pub struct DirData {
    pub by_name: HashMap<Vec<u8>, (Ino, u64)>,
    pub by_cookie: BTreeMap<u64, (Vec<u8>, Ino)>,
    pub cookie_next: u64,
}

#[derive(Debug)]
pub struct Inode {
    pub rec: InodeRec,
    pub dir: Option<DirData>,
    pub map: BTreeMap<u64, Ext>,
    /// The file blocks of `map` not yet logged (`!Ext::logged`), so a
    /// COMMIT looks at what it may log, not at the whole file's map.
    pub pending: BTreeSet<u64>,
    /// Open references (NFSv4 OPEN); not durable.
    pub pins: u32,
    /// Bumped whenever blocks leave the map: a read that raced it retries.
    pub unmaps: u64,
    /// Serialises writers of this file (read-modify-write of a block).
    pub wlock: Arc<crate::wlock::WLock>,
    /// Server-private blob (`Rec::Private`); empty: none.
    pub private: Vec<u8>,
}

#[derive(Debug, Default)]
pub struct State {
    pub inodes: HashMap<Ino, Inode>,
    pub gen_next: u64,
    pub ino_next: u64,
    /// Bytes of data blocks per volume root.
    pub vol_used: HashMap<Ino, u64>,
    /// Rough size of a checkpoint of this state, in bytes.
    pub ckpt_bytes: u64,
    /// NFSv4 client owners on stable storage.
    pub clients: std::collections::BTreeSet<Vec<u8>>,
}

/// Blocks an `apply` took out of a file's map.
pub type Freed = Vec<Phys>;

pub const BLOCK: u64 = 4096;
/// Longest NFSv4 client owner recorded (RFC 8881: co_ownerid is at most
/// NFS4_OPAQUE_LIMIT, 1024 bytes).
pub const CLIENT_OWNER_MAX: usize = 1024;
/// Checkpoint bytes a private blob costs beyond its data (tag, ino, length).
const PRIVATE_REC_BYTES: u64 = 11;

fn private_cost(data: &[u8]) -> u64 {
    if data.is_empty() {
        0
    } else {
        PRIVATE_REC_BYTES + data.len() as u64
    }
}

impl State {
    pub fn new() -> State {
        State { gen_next: ROOT_GEN + 1, ino_next: ROOT_INO + 1, ..Default::default() }
    }

    pub fn get(&self, ino: Ino, gen: u64) -> VfsResult<&Inode> {
        match self.inodes.get(&ino) {
            Some(i) if i.rec.gen == gen => Ok(i),
            _ => Err(VfsError::Stale),
        }
    }

    pub fn get_mut(&mut self, ino: Ino, gen: u64) -> VfsResult<&mut Inode> {
        match self.inodes.get_mut(&ino) {
            Some(i) if i.rec.gen == gen => Ok(i),
            _ => Err(VfsError::Stale),
        }
    }

    fn charge(&mut self, volume: Ino, blocks: i64) {
        if volume != 0 {
            let u = self.vol_used.entry(volume).or_insert(0);
            *u = (*u as i64 + blocks * BLOCK as i64).max(0) as u64;
        }
    }

    /// Insert a block into a file's map (live: a pending extent; replay: a
    /// logged one), charging its volume when the block is new to the file.
    pub fn map_insert(&mut self, ino: Ino, fblock: u64, ext: Ext) -> Option<Ext> {
        let i = self.inodes.get_mut(&ino)?;
        let vol = i.rec.volume;
        let old = i.map.insert(fblock, ext);
        if ext.logged {
            i.pending.remove(&fblock);
        } else {
            i.pending.insert(fblock);
        }
        if old.is_none() {
            self.charge(vol, 1);
        }
        old
    }

    /// Unmap blocks at or after `from`; returns their addresses.
    pub fn unmap_from(&mut self, ino: Ino, from: u64) -> Freed {
        let Some(i) = self.inodes.get_mut(&ino) else { return Vec::new() };
        let gone = i.map.split_off(&from);
        drop(i.pending.split_off(&from));
        if !gone.is_empty() {
            i.unmaps += 1;
        }
        let vol = i.rec.volume;
        let n = gone.len() as i64;
        self.charge(vol, -n);
        gone.into_values().map(|e| e.phys).collect()
    }

    /// Apply one record. Records come from this server's own log, so a
    /// record that does not fit the state is corruption: `Err` names it.
    pub fn apply(&mut self, r: &Rec, freed: &mut Freed) -> Result<(), String> {
        match r {
            Rec::Counters { gen_next, ino_next } => {
                self.gen_next = self.gen_next.max(*gen_next);
                self.ino_next = self.ino_next.max(*ino_next);
            }
            Rec::InodePut(rec) => {
                self.gen_next = self.gen_next.max(rec.gen + 1);
                self.ino_next = self.ino_next.max(rec.ino + 1);
                match self.inodes.get_mut(&rec.ino) {
                    Some(i) => {
                        if i.rec.gen != rec.gen || i.rec.ftype != rec.ftype {
                            return Err(format!("inode {} replaced without being freed", rec.ino));
                        }
                        i.rec = rec.clone();
                    }
                    None => {
                        let dir = (rec.ftype == FileType::Directory).then(DirData::default);
                        self.ckpt_bytes += 96 + rec.target.len() as u64;
                        self.inodes.insert(
                            rec.ino,
                            Inode {
                                rec: rec.clone(),
                                dir,
                                map: BTreeMap::new(),
                                pending: BTreeSet::new(),
                                pins: 0,
                                unmaps: 0,
                                wlock: Arc::default(),
                                private: Vec::new(),
                            },
                        );
                    }
                }
            }
            Rec::InodeFree { ino } => {
                freed.extend(self.unmap_from(*ino, 0));
                let i = self.inodes.remove(ino).ok_or_else(|| format!("free of unknown inode {ino}"))?;
                self.ckpt_bytes = self.ckpt_bytes.saturating_sub(96 + i.rec.target.len() as u64 + private_cost(&i.private));
                if i.dir.as_ref().is_some_and(|d| !d.by_name.is_empty()) {
                    return Err(format!("free of non-empty directory {ino}"));
                }
                self.vol_used.remove(ino);
            }
            Rec::DirAdd { dir, cookie, ino, name } => {
                let d = self.inodes.get_mut(dir).and_then(|i| i.dir.as_mut()).ok_or_else(|| format!("entry added to non-directory {dir}"))?;
                if d.by_name.insert(name.clone(), (*ino, *cookie)).is_some() {
                    return Err(format!("directory {dir}: entry added twice"));
                }
                d.by_cookie.insert(*cookie, (name.clone(), *ino));
                d.cookie_next = d.cookie_next.max(cookie + 1);
                self.ckpt_bytes += 32 + name.len() as u64;
            }
            Rec::DirDel { dir, name } => {
                let d = self.inodes.get_mut(dir).and_then(|i| i.dir.as_mut()).ok_or_else(|| format!("entry removed from non-directory {dir}"))?;
                let (_, cookie) = d.by_name.remove(name).ok_or_else(|| format!("directory {dir}: removal of a missing entry"))?;
                d.by_cookie.remove(&cookie);
                self.ckpt_bytes = self.ckpt_bytes.saturating_sub(32 + name.len() as u64);
            }
            Rec::Map { ino, fblock, phys, count } => {
                if !self.inodes.get(ino).is_some_and(|i| i.rec.ftype == FileType::Regular) {
                    return Err(format!("blocks mapped to inode {ino}, which is not a live regular file"));
                }
                for k in 0..*count as u64 {
                    let ext = Ext { phys: phys + k, logged: true, tag: 0 };
                    if let Some(old) = self.map_insert(*ino, fblock + k, ext) {
                        if old.phys != ext.phys {
                            freed.push(old.phys);
                        }
                    } else {
                        self.ckpt_bytes += 8;
                    }
                }
                self.ckpt_bytes += 32;
            }
            Rec::Trunc { ino, from } => {
                if !self.inodes.contains_key(ino) {
                    return Err(format!("truncate of unknown inode {ino}"));
                }
                freed.extend(self.unmap_from(*ino, *from));
            }
            Rec::Punch { ino, from, count } => {
                let i = self.inodes.get_mut(ino).ok_or_else(|| format!("hole punched in unknown inode {ino}"))?;
                let end = from.saturating_add(*count);
                let gone: Vec<u64> = i.map.range(*from..end).map(|(f, _)| *f).collect();
                if !gone.is_empty() {
                    i.unmaps += 1;
                }
                let vol = i.rec.volume;
                for f in &gone {
                    if let Some(e) = i.map.remove(f) {
                        freed.push(e.phys);
                    }
                    i.pending.remove(f);
                }
                self.charge(vol, -(gone.len() as i64));
            }
            Rec::Client { owner, present } => {
                if *present {
                    if self.clients.insert(owner.clone()) {
                        self.ckpt_bytes += 8 + owner.len() as u64;
                    }
                } else if self.clients.remove(owner) {
                    self.ckpt_bytes = self.ckpt_bytes.saturating_sub(8 + owner.len() as u64);
                }
            }
            Rec::Private { ino, data } => {
                if data.len() > vfs::PRIVATE_BYTES_MAX {
                    return Err(format!("private blob of inode {ino} is {} bytes", data.len()));
                }
                let i = self.inodes.get_mut(ino).ok_or_else(|| format!("private blob of unknown inode {ino}"))?;
                let old = std::mem::replace(&mut i.private, data.clone());
                self.ckpt_bytes = self.ckpt_bytes.saturating_sub(private_cost(&old)) + private_cost(data);
            }
        }
        Ok(())
    }

    /// The whole state as records (a checkpoint): logged extents only.
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        encode(&Rec::Counters { gen_next: self.gen_next, ino_next: self.ino_next }, out);
        for owner in &self.clients {
            encode(&Rec::Client { owner: owner.clone(), present: true }, out);
        }
        // Parents before children is not needed (entries only name inodes
        // by number), but directories' entries need their inodes first.
        let mut inos: Vec<&Ino> = self.inodes.keys().collect();
        inos.sort();
        for ino in &inos {
            let i = &self.inodes[ino];
            encode(&Rec::InodePut(i.rec.clone()), out);
            if !i.private.is_empty() {
                encode(&Rec::Private { ino: **ino, data: i.private.clone() }, out);
            }
        }
        for ino in inos {
            let i = &self.inodes[ino];
            if let Some(d) = &i.dir {
                for (cookie, (name, child)) in &d.by_cookie {
                    encode(&Rec::DirAdd { dir: *ino, cookie: *cookie, ino: *child, name: name.clone() }, out);
                }
            }
            for (fblock, phys, count) in runs(i.map.iter().filter(|(_, e)| e.logged).map(|(f, e)| (*f, e.phys))) {
                encode(&Rec::Map { ino: *ino, fblock, phys, count }, out);
            }
        }
    }
}

/// Coalesce (file block, phys) pairs in file order into runs contiguous in
/// both.
pub fn runs(it: impl Iterator<Item = (u64, Phys)>) -> Vec<(u64, Phys, u32)> {
    let mut out: Vec<(u64, Phys, u32)> = Vec::new();
    for (f, p) in it {
        if let Some(last) = out.last_mut() {
            if last.0 + last.2 as u64 == f && last.1 + last.2 as u64 == p && phys_dev(p) == phys_dev(last.1) && last.2 < u32::MAX {
                last.2 += 1;
                continue;
            }
        }
        out.push((f, p, 1));
    }
    out
}

fn ftype_code(t: FileType) -> u8 {
    match t {
        FileType::Regular => 1,
        FileType::Directory => 2,
        FileType::Symlink => 3,
        FileType::BlockDevice => 4,
        FileType::CharDevice => 5,
        FileType::Socket => 6,
        FileType::Fifo => 7,
    }
}

fn ftype_of(c: u8) -> Option<FileType> {
    Some(match c {
        1 => FileType::Regular,
        2 => FileType::Directory,
        3 => FileType::Symlink,
        4 => FileType::BlockDevice,
        5 => FileType::CharDevice,
        6 => FileType::Socket,
        7 => FileType::Fifo,
        _ => return None,
    })
}

fn put_time(out: &mut Vec<u8>, t: Time) {
    out.extend_from_slice(&t.sec.to_le_bytes());
    out.extend_from_slice(&t.nsec.to_le_bytes());
}

/// Append `r`'s encoding (a tag byte, then fixed little-endian fields).
pub fn encode(r: &Rec, out: &mut Vec<u8>) {
    match r {
        Rec::Counters { gen_next, ino_next } => {
            out.push(1);
            out.extend_from_slice(&gen_next.to_le_bytes());
            out.extend_from_slice(&ino_next.to_le_bytes());
        }
        Rec::InodePut(i) => {
            out.push(2);
            for v in [i.ino, i.gen] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.push(ftype_code(i.ftype));
            for v in [i.mode, i.nlink, i.uid, i.gid] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&i.size.to_le_bytes());
            out.extend_from_slice(&i.rdev.0.to_le_bytes());
            out.extend_from_slice(&i.rdev.1.to_le_bytes());
            for t in [i.atime, i.mtime, i.ctime] {
                put_time(out, t);
            }
            for v in [i.change, i.volume, i.quota, i.parent, i.tree] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&i.verf);
            out.extend_from_slice(&(i.target.len() as u16).to_le_bytes());
            out.extend_from_slice(&i.target);
        }
        Rec::InodeFree { ino } => {
            out.push(3);
            out.extend_from_slice(&ino.to_le_bytes());
        }
        Rec::DirAdd { dir, cookie, ino, name } => {
            out.push(4);
            for v in [*dir, *cookie, *ino] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.push(name.len() as u8);
            out.extend_from_slice(name);
        }
        Rec::DirDel { dir, name } => {
            out.push(5);
            out.extend_from_slice(&dir.to_le_bytes());
            out.push(name.len() as u8);
            out.extend_from_slice(name);
        }
        Rec::Map { ino, fblock, phys, count } => {
            out.push(6);
            for v in [*ino, *fblock, *phys] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&count.to_le_bytes());
        }
        Rec::Trunc { ino, from } => {
            out.push(7);
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&from.to_le_bytes());
        }
        Rec::Punch { ino, from, count } => {
            out.push(10);
            for v in [*ino, *from, *count] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Rec::Client { owner, present } => {
            out.push(8);
            out.push(*present as u8);
            out.extend_from_slice(&(owner.len() as u16).to_le_bytes());
            out.extend_from_slice(owner);
        }
        Rec::Private { ino, data } => {
            out.push(9);
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&(data.len() as u16).to_le_bytes());
            out.extend_from_slice(data);
        }
    }
}

struct Rd<'a> {
    b: &'a [u8],
    p: usize,
}

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let s = self.b.get(self.p..self.p + n).ok_or_else(|| format!("record truncated at byte {}", self.p))?;
        self.p += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn time(&mut self) -> Result<Time, String> {
        let sec = self.u64()? as i64;
        let nsec = self.u32()?;
        Ok(Time { sec, nsec })
    }
    fn name(&mut self) -> Result<Vec<u8>, String> {
        let n = self.u8()? as usize;
        let s = self.take(n)?.to_vec();
        if vfs::check_name(&s).is_err() {
            return Err("record holds an invalid name".into());
        }
        Ok(s)
    }
}

/// Decode every record of a stream; any malformed byte is an error.
pub fn decode_all(b: &[u8]) -> Result<Vec<Rec>, String> {
    let mut r = Rd { b, p: 0 };
    let mut out = Vec::new();
    while r.p < b.len() {
        let tag = r.u8()?;
        out.push(match tag {
            1 => Rec::Counters { gen_next: r.u64()?, ino_next: r.u64()? },
            2 => {
                let ino = r.u64()?;
                let gen = r.u64()?;
                let ftype = ftype_of(r.u8()?).ok_or("record holds an unknown file type")?;
                let (mode, nlink, uid, gid) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
                let size = r.u64()?;
                let rdev = (r.u32()?, r.u32()?);
                let (atime, mtime, ctime) = (r.time()?, r.time()?, r.time()?);
                let (change, volume, quota, parent, tree) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
                let verf: [u8; 8] = r.take(8)?.try_into().unwrap();
                let n = r.u16()? as usize;
                let target = r.take(n)?.to_vec();
                Rec::InodePut(InodeRec {
                    ino, gen, ftype, mode, nlink, uid, gid, size, rdev, atime, mtime, ctime, change, volume, quota, parent, tree, verf, target,
                })
            }
            3 => Rec::InodeFree { ino: r.u64()? },
            4 => {
                let (dir, cookie, ino) = (r.u64()?, r.u64()?, r.u64()?);
                Rec::DirAdd { dir, cookie, ino, name: r.name()? }
            }
            5 => {
                let dir = r.u64()?;
                Rec::DirDel { dir, name: r.name()? }
            }
            6 => Rec::Map { ino: r.u64()?, fblock: r.u64()?, phys: r.u64()?, count: r.u32()? },
            7 => Rec::Trunc { ino: r.u64()?, from: r.u64()? },
            10 => Rec::Punch { ino: r.u64()?, from: r.u64()?, count: r.u64()? },
            8 => {
                let present = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err("client record with a bad flag".into()),
                };
                let n = r.u16()? as usize;
                if n == 0 || n > CLIENT_OWNER_MAX {
                    return Err("client record with a bad owner length".into());
                }
                Rec::Client { owner: r.take(n)?.to_vec(), present }
            }
            9 => {
                let ino = r.u64()?;
                let n = r.u16()? as usize;
                if n > vfs::PRIVATE_BYTES_MAX {
                    return Err("private record with a bad length".into());
                }
                Rec::Private { ino, data: r.take(n)?.to_vec() }
            }
            t => return Err(format!("unknown record tag {t} at byte {}", r.p - 1)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(st: &mut State, ino: Ino) {
        let t = Time::default();
        let rec = InodeRec {
            ino,
            gen: 1,
            ftype: FileType::Regular,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 0,
            rdev: (0, 0),
            atime: t,
            mtime: t,
            ctime: t,
            change: 0,
            volume: 0,
            quota: 0,
            parent: 0,
            tree: 0,
            verf: [0; 8],
            target: Vec::new(),
        };
        st.apply(&Rec::InodePut(rec), &mut Vec::new()).unwrap();
    }

    fn pending(st: &State, ino: Ino) -> Vec<u64> {
        let i = &st.inodes[&ino];
        let scan: Vec<u64> = i.map.iter().filter(|(_, e)| !e.logged).map(|(f, _)| *f).collect();
        let kept: Vec<u64> = i.pending.iter().copied().collect();
        assert_eq!(kept, scan, "the pending set is the map's unlogged blocks");
        kept
    }

    /// `Inode::pending` follows the map through every change: pending
    /// extents in, logged ones out, truncation, punched holes, replay.
    #[test]
    fn pending_blocks_are_exactly_the_unlogged_ones() {
        let mut st = State::default();
        file(&mut st, 5);
        for f in [0, 1, 2, 10, 11, 20, 30] {
            st.map_insert(5, f, Ext { phys: 100 + f, logged: false, tag: u64::MAX });
        }
        assert_eq!(pending(&st, 5), vec![0, 1, 2, 10, 11, 20, 30]);
        let mut freed = Vec::new();
        st.apply(&Rec::Map { ino: 5, fblock: 1, phys: 101, count: 2 }, &mut freed).unwrap();
        assert_eq!(pending(&st, 5), vec![0, 10, 11, 20, 30], "logged by a Map record");
        st.apply(&Rec::Punch { ino: 5, from: 10, count: 2 }, &mut freed).unwrap();
        assert_eq!(pending(&st, 5), vec![0, 20, 30], "a punched hole");
        st.apply(&Rec::Trunc { ino: 5, from: 25 }, &mut freed).unwrap();
        assert_eq!(pending(&st, 5), vec![0, 20], "truncated");
        // A logged block rewritten as pending again (its map entry replaced).
        st.map_insert(5, 1, Ext { phys: 300, logged: false, tag: u64::MAX });
        assert_eq!(pending(&st, 5), vec![0, 1, 20]);
        st.apply(&Rec::Map { ino: 5, fblock: 0, phys: 100, count: 2 }, &mut freed).unwrap();
        assert_eq!(pending(&st, 5), vec![20]);
        st.apply(&Rec::InodeFree { ino: 5 }, &mut freed).unwrap();
        assert!(!st.inodes.contains_key(&5));
    }
}
