//! Placements on stable storage: each placed file's `Placement` is kept in
//! its MDS object's server-private blob (`Vfs::private_set`), written when
//! the file is placed and whenever the placement changes (a copy goes
//! stale, the fencing epoch moves), and read back the first time the file
//! is used after a restart (a miss in `State::files`). The blob goes with
//! the object when the MDS's backend destroys it. A backend without blobs
//! (memfs: nothing survives its restart anyway) makes all of this a no-op.
//!
//! DS ids are positions in this run's registry, so the blob names DSes by
//! `DsSpec::name`; restoring maps names back to ids. A name no longer in
//! the DS list gets a registry record that is not present — exactly what a
//! DS that left the list is today: never active, its copy never in a
//! layout, reads and writes through the MDS fail over to other mirrors
//! (or fail with `Io` when it held the only copy), and the copy comes back
//! when a DS of that name is listed again.
//!
//! Encoding, version 1 (big-endian), at most `vfs::PRIVATE_BYTES_MAX`:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `CHPL` |
//! | 1 | version (1) |
//! | 1 | flags: bit 0 = data-file handles present |
//! | 1 | mirrors (1..=`MIRRORS_MAX`) |
//! | 1 | reserved (0) |
//! | 2 | width W (mirrors..=`DATA_SERVERS_MAX`) |
//! | 8 | stripe unit bytes (a power of two, 4 KiB..=64 MiB) |
//! | 4 | fencing epoch (< 1,000,000) |
//! | W × | DS name length (1) and name (1..=255 bytes, distinct), stale flag (1: 0 or 1), with flag bit 0: handle length (1) and handle (1..=64 bytes) |
//!
//! Nothing may follow. When the handles do not fit, they are left out and
//! found again at restore by LOOKUP of the data file's name on each DS.
//! Anything else is garbage: that file's I/O and layouts fail with `Io`
//! (NFS4ERR_IO), and the server keeps serving every other file.

use crate::{Placement, Pnfs, DATA_SERVERS_MAX, MIRRORS_MAX};
use std::sync::atomic::Ordering;
use vfs::{FileHandle, VfsError, VfsResult, PRIVATE_BYTES_MAX};

const MAGIC: [u8; 4] = *b"CHPL";
const VERSION: u8 = 1;
const FLAG_HANDLES: u8 = 1;
const HEADER_BYTES: usize = 22;
/// NFS3_FHSIZE: the largest NFSv3 handle a DS can give.
const DS_HANDLE_BYTES_MAX: usize = 64;
/// Fencing epochs wrap below this (`Pnfs::fence`).
pub(crate) const EPOCH_LIMIT: u32 = 1_000_000;

/// A placement as stored: DSes by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub names: Vec<String>,
    pub stale: Vec<bool>,
    /// `None`: not stored (they did not fit); look them up.
    pub handles: Option<Vec<Vec<u8>>>,
    pub mirrors: u32,
    pub stripe_unit_bytes: u64,
    pub epoch: u32,
}

/// Encode `s`, with its handles when they fit; `None` when even the names
/// do not fit in `PRIVATE_BYTES_MAX`.
pub(crate) fn encode(s: &Stored) -> Option<Vec<u8>> {
    let with = encode_form(s, true);
    if with.len() <= PRIVATE_BYTES_MAX {
        return Some(with);
    }
    let without = encode_form(s, false);
    (without.len() <= PRIVATE_BYTES_MAX).then_some(without)
}

pub(crate) fn encode_form(s: &Stored, handles: bool) -> Vec<u8> {
    let handles = handles.then_some(s.handles.as_ref()).flatten();
    let mut out = Vec::with_capacity(HEADER_BYTES + s.names.len() * 96);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(if handles.is_some() { FLAG_HANDLES } else { 0 });
    out.push(s.mirrors as u8);
    out.push(0);
    out.extend_from_slice(&(s.names.len() as u16).to_be_bytes());
    out.extend_from_slice(&s.stripe_unit_bytes.to_be_bytes());
    out.extend_from_slice(&s.epoch.to_be_bytes());
    for (i, name) in s.names.iter().enumerate() {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.push(s.stale[i] as u8);
        if let Some(h) = handles {
            out.push(h[i].len() as u8);
            out.extend_from_slice(&h[i]);
        }
    }
    out
}

struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let s = self.b.get(self.at..self.at + n).ok_or_else(|| format!("truncated at byte {}", self.at))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    /// A length byte and 1..=`max` bytes.
    fn bytes(&mut self, max: usize, what: &str) -> Result<Vec<u8>, String> {
        let n = self.u8()? as usize;
        if n == 0 || n > max {
            return Err(format!("{what} of {n} bytes"));
        }
        Ok(self.take(n)?.to_vec())
    }
}

/// Decode and check a stored placement; every violation is named.
pub(crate) fn decode(b: &[u8]) -> Result<Stored, String> {
    if b.len() > PRIVATE_BYTES_MAX {
        return Err(format!("{} bytes, more than {PRIVATE_BYTES_MAX}", b.len()));
    }
    let mut r = Rd { b, at: 0 };
    if r.take(4)? != MAGIC {
        return Err("bad magic".into());
    }
    let version = r.u8()?;
    if version != VERSION {
        return Err(format!("unknown version {version}"));
    }
    let flags = r.u8()?;
    if flags & !FLAG_HANDLES != 0 {
        return Err(format!("unknown flags {flags:#x}"));
    }
    let mirrors = r.u8()? as u32;
    if r.u8()? != 0 {
        return Err("reserved byte set".into());
    }
    let width = u16::from_be_bytes(r.take(2)?.try_into().unwrap()) as usize;
    let stripe_unit_bytes = u64::from_be_bytes(r.take(8)?.try_into().unwrap());
    let epoch = u32::from_be_bytes(r.take(4)?.try_into().unwrap());
    if !(1..=MIRRORS_MAX).contains(&mirrors) || width < mirrors as usize || width > DATA_SERVERS_MAX {
        return Err(format!("{mirrors} mirrors over {width} data servers"));
    }
    if !stripe_unit_bytes.is_power_of_two() || !(4096..=64 << 20).contains(&stripe_unit_bytes) {
        return Err(format!("stripe unit of {stripe_unit_bytes} bytes"));
    }
    if epoch >= EPOCH_LIMIT {
        return Err(format!("fencing epoch {epoch}"));
    }
    let mut s = Stored { names: Vec::with_capacity(width), stale: Vec::with_capacity(width), handles: None, mirrors, stripe_unit_bytes, epoch };
    let mut handles = Vec::new();
    for _ in 0..width {
        let name = String::from_utf8(r.bytes(255, "data server name")?).map_err(|_| "data server name not UTF-8".to_string())?;
        if s.names.contains(&name) {
            return Err(format!("data server {name:?} twice"));
        }
        s.names.push(name);
        s.stale.push(match r.u8()? {
            0 => false,
            1 => true,
            f => return Err(format!("stale flag {f}")),
        });
        if flags & FLAG_HANDLES != 0 {
            handles.push(r.bytes(DS_HANDLE_BYTES_MAX, "data file handle")?);
        }
    }
    if r.at != b.len() {
        return Err(format!("{} bytes after the end", b.len() - r.at));
    }
    if flags & FLAG_HANDLES != 0 {
        s.handles = Some(handles);
    }
    Ok(s)
}

/// What the backend's answer means for placements: `NotSupported` = it
/// keeps no blobs, `Stale` = the object is gone; both leave nothing to do.
fn nothing_kept(e: VfsError) -> bool {
    matches!(e, VfsError::NotSupported | VfsError::Stale | VfsError::BadHandle)
}

impl Pnfs {
    fn stored(&self, p: &Placement) -> Stored {
        let st = self.state();
        Stored {
            names: p.dses.iter().map(|id| st.ds.name_of(*id)).collect(),
            stale: p.stale.clone(),
            handles: Some(p.data_fh.clone()),
            mirrors: p.mirrors,
            stripe_unit_bytes: p.stripe_unit_bytes,
            epoch: p.epoch,
        }
    }

    /// Write `p` as `fh`'s placement, durably before returning. Callers
    /// hold `persist_lock`, so the blob ends as the last state written.
    fn write_placement(&self, fh: &FileHandle, p: &Placement) -> VfsResult<()> {
        let Some(blob) = encode(&self.stored(p)) else {
            eprintln!(
                "pnfs: the placement of a file over {} data servers does not fit in {PRIVATE_BYTES_MAX} bytes (shorter data server names or a smaller stripe_width fit)",
                p.dses.len()
            );
            return Err(VfsError::NoSpace);
        };
        match self.vfs.private_set(fh, Some(&blob)) {
            Err(e) if nothing_kept(e) => Ok(()),
            r => r,
        }
    }

    /// Make a new placement durable before anyone can use it.
    pub(crate) fn persist_new(&self, fh: &FileHandle, p: &Placement) -> VfsResult<()> {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.write_placement(fh, p)
    }

    /// Write `fh`'s current placement again (it changed). A failure is
    /// logged: the change holds in memory, and a copy marked stale here
    /// could be read again after a restart.
    pub(crate) fn persist(&self, fh: &FileHandle) {
        let _g = self.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = self.state().files.get(fh).cloned() else { return };
        if let Err(e) = self.write_placement(fh, &p) {
            self.metrics.placements_unsaved.fetch_add(1, Ordering::Relaxed);
            eprintln!("pnfs: a changed placement did not reach stable storage: {e}");
        }
    }

    /// The placement of `fh`: in memory, or restored from its blob (the
    /// first use after a restart). `Ok(None)`: not placed. A blob that
    /// does not decode, or whose handles cannot be found again, is `Io`
    /// for this file (retried at its next use).
    pub(crate) fn placement(&self, fh: &FileHandle) -> VfsResult<Option<Placement>> {
        if let Some(p) = self.state().files.get(fh) {
            return Ok(Some(p.clone()));
        }
        let blob = match self.vfs.private_get(fh) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(None),
            Err(e) if nothing_kept(e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let s = decode(&blob).map_err(|e| {
            self.metrics.placements_unreadable.fetch_add(1, Ordering::Relaxed);
            eprintln!("pnfs: the stored placement of {} is unreadable ({e}): its I/O fails with NFS4ERR_IO", crate::data_file_name(fh));
            VfsError::Io
        })?;
        let ids = {
            let mut st = self.state();
            let ids: Option<Vec<u64>> = s.names.iter().map(|n| st.ds.id_for_name(n)).collect();
            ids.ok_or_else(|| {
                eprintln!("pnfs: no room for the data servers a stored placement names ({} known)", crate::DS_RECORDS_MAX);
                VfsError::Io
            })?
        };
        let data_fh = match s.handles {
            Some(h) => h,
            None => self.find_handles(fh, &ids)?,
        };
        let p = Placement { dses: ids, mirrors: s.mirrors, stripe_unit_bytes: s.stripe_unit_bytes, epoch: s.epoch, data_fh, stale: s.stale };
        let mut st = self.state();
        // A racing restore of the same file got there first: use its copy.
        if let Some(p) = st.files.get(fh) {
            return Ok(Some(p.clone()));
        }
        for id in &p.dses {
            st.ds.file_count(*id, 1);
        }
        if p.stale.iter().any(|s| *s) {
            st.stale_files.insert(*fh);
        }
        st.files.insert(*fh, p.clone());
        self.metrics.placements_restored.fetch_add(1, Ordering::Relaxed);
        Ok(Some(p))
    }

    /// Data-file handles of a placement stored without them: LOOKUP of the
    /// file's data-file name on each DS. One that cannot be found now is
    /// `Io` (nothing is cached, so the next use tries again).
    fn find_handles(&self, fh: &FileHandle, ids: &[u64]) -> VfsResult<Vec<Vec<u8>>> {
        let name = crate::data_file_name(fh);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let conn = self.state().ds.conn(*id).ok_or(VfsError::Io)?;
            let mut c = conn.lock().unwrap_or_else(|e| e.into_inner());
            let h = c.root().and_then(|root| c.client.lookup(&root, name.as_bytes()));
            drop(c);
            match h {
                Ok(h) => out.push(h),
                Err(e) => {
                    if matches!(e, crate::client3::CtlError::Unreachable(_)) {
                        self.ds_failed(*id);
                    }
                    return Err(VfsError::Io);
                }
            }
        }
        Ok(out)
    }
}
