//! `PnfsVfs`: the MDS's namespace with the data of placed files on DSes.
//!
//! A client without a layout (it could not get one, or its DS failed and
//! it fell back) reads and writes through the MDS; this wrapper proxies
//! those calls to the file's data files over NFSv3, bounded by
//! `ds_timeout_ms` per DS call: on a `pnfs-io` worker while the calling
//! core's call is parked (`read_start` / `write_start`, see `vfs::iopool`), or
//! on the calling thread for callers that cannot park (control paths). Writes go to every non-stale
//! mirror FILE_SYNC; a mirror that fails is marked stale (never read again)
//! and its DS unhealthy; when no mirror takes the write the caller gets
//! `Io` (NFS4ERR_IO / NFS3ERR_IO) — never a silent partial write. Reads
//! come from the first usable mirror, holes read as zeros up to the size
//! the MDS holds. The MDS's own backend keeps attributes and the size
//! (set by LAYOUTCOMMIT or by writes here) and no file data.

use crate::client3::{Sattr, NFS3ERR_NOENT};
use crate::{Placement, Pnfs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vfs::*;

pub struct PnfsVfs {
    pub pnfs: Arc<Pnfs>,
}

impl PnfsVfs {
    pub fn new(pnfs: Arc<Pnfs>) -> PnfsVfs {
        PnfsVfs { pnfs }
    }

    fn inner(&self) -> &dyn Vfs {
        &*self.pnfs.vfs
    }

    /// The file's placement, restored from stable storage at its first
    /// use after a restart; an unreadable stored one is `Io`.
    fn placed(&self, fh: &FileHandle) -> VfsResult<Option<Placement>> {
        self.pnfs.placement(fh)
    }

    /// Pieces of [offset, offset+len) that stay inside one stripe unit.
    fn pieces(p: &Placement, offset: u64, len: usize) -> Vec<(u64, usize, usize)> {
        let su = p.stripe_unit_bytes;
        let mut out = Vec::new();
        let mut at = 0usize;
        while at < len {
            let off = offset + at as u64;
            let room = (su - off % su) as usize;
            let n = room.min(len - at);
            out.push((off, at, n));
            at += n;
        }
        out
    }

    fn read_placed(&self, fh: &FileHandle, p: &Placement, offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)> {
        let size = self.inner().getattr(fh)?.size;
        if offset >= size {
            return Ok((0, true));
        }
        let want = ((size - offset) as usize).min(buf.len());
        let mut tmp = Vec::new();
        for (off, at, n) in Self::pieces(p, offset, want) {
            let unit = off / p.stripe_unit_bytes;
            let mut done = false;
            for m in 0..p.mirrors {
                let i = p.slot(unit, m);
                if p.stale[i] {
                    continue;
                }
                let id = p.dses[i];
                let Some(conn) = self.pnfs.state().ds.conn(id) else { continue };
                let r = conn.lock().unwrap_or_else(|e| e.into_inner()).client.read(&p.data_fh[i], off, n as u32, &mut tmp);
                match r {
                    Ok(_) => {
                        let got = tmp.len().min(n);
                        buf[at..at + got].copy_from_slice(&tmp[..got]);
                        buf[at + got..at + n].fill(0); // a hole or the DS file's end
                        done = true;
                        break;
                    }
                    Err(crate::client3::CtlError::Status(_)) => {}
                    Err(_) => self.pnfs.ds_failed(id),
                }
            }
            if !done {
                self.pnfs.metrics.mds_read_failures.fetch_add(1, Ordering::Relaxed);
                if let Some(n) = self.pnfs.io_fail_log.admit() {
                    let more = crate::and_more(n);
                    eprintln!("pnfs: a read through the MDS of {} at {off} found no copy that answered (stale {:?}): EIO{more}", crate::data_file_name(fh), p.stale);
                }
                return Err(VfsError::Io);
            }
        }
        self.pnfs.metrics.mds_read_bytes.fetch_add(want as u64, Ordering::Relaxed);
        Ok((want, offset + want as u64 >= size))
    }

    fn write_placed(&self, fh: &FileHandle, p: &Placement, offset: u64, data: &[u8]) -> VfsResult<()> {
        // Shared with other writes; a resync's chunk copy excludes it.
        let _gate = self.pnfs.resync_gate.read().unwrap_or_else(|e| e.into_inner());
        for (off, at, n) in Self::pieces(p, offset, data.len()) {
            let unit = off / p.stripe_unit_bytes;
            let mut ok = 0;
            for m in 0..p.mirrors {
                let i = p.slot(unit, m);
                let id = p.dses[i];
                // Re-read staleness: an earlier piece may have marked it. A
                // stale copy being resynced takes the write too (not counted:
                // it is not a good copy yet), and one it misses stops the resync.
                let (skip, resyncing) = {
                    let st = self.pnfs.state();
                    let resyncing = st.resyncing == Some((*fh, i));
                    (st.files.get(fh).is_none_or(|f| f.stale[i]) && !resyncing, resyncing)
                };
                if skip {
                    continue;
                }
                let Some(conn) = self.pnfs.state().ds.conn(id) else {
                    if resyncing {
                        self.pnfs.state().resync_broken = true;
                    }
                    continue;
                };
                let r = conn.lock().unwrap_or_else(|e| e.into_inner()).client.write(&p.data_fh[i], off, &data[at..at + n], 2);
                if resyncing {
                    if !matches!(r, Ok((c, _)) if c as usize == n) {
                        self.pnfs.state().resync_broken = true;
                    }
                    continue;
                }
                match r {
                    Ok((c, _)) if c as usize == n => ok += 1,
                    Ok(_) | Err(crate::client3::CtlError::Status(_)) => self.pnfs.mark_stale(fh, id),
                    Err(_) => {
                        self.pnfs.ds_failed(id);
                        self.pnfs.mark_stale(fh, id);
                    }
                }
            }
            if ok == 0 {
                let stale = self.pnfs.state().files.get(fh).map(|f| f.stale.clone());
                self.pnfs.metrics.mds_write_failures.fetch_add(1, Ordering::Relaxed);
                if let Some(n) = self.pnfs.io_fail_log.admit() {
                    let more = crate::and_more(n);
                    eprintln!("pnfs: a write through the MDS of {} at {off} reached no good copy (stale {stale:?}): EIO{more}", crate::data_file_name(fh));
                }
                return Err(VfsError::Io);
            }
        }
        self.pnfs.metrics.mds_write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Resize every data file of a placed file (truncate/extend on the MDS).
    fn resize_placed(&self, p: &Placement, size: u64) {
        let _gate = self.pnfs.resync_gate.read().unwrap_or_else(|e| e.into_inner());
        for (id, h) in p.dses.iter().zip(&p.data_fh) {
            let Some(conn) = self.pnfs.state().ds.conn(*id) else { continue };
            let r = conn.lock().unwrap_or_else(|e| e.into_inner()).client.setattr(h, &Sattr { size: Some(size), ..Default::default() });
            match r {
                Ok(()) | Err(crate::client3::CtlError::Status(NFS3ERR_NOENT)) => {}
                Err(_) => self.pnfs.ds_failed(*id),
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn pieces_for_test(p: &Placement, offset: u64, len: usize) -> Vec<(u64, usize, usize)> {
        Self::pieces(p, offset, len)
    }

    /// A placed file that lost its last name: its data files on the DSes
    /// are queued for removal once the MDS's backend destroyed it. While
    /// it is still open (pinned: nameless but alive) they stay, with its
    /// layouts, so the opener keeps reading and writing its data through
    /// the MDS or the DSes; `unpin` comes back here after the last close.
    /// Racing callers (a REMOVE and the last CLOSE) may both get here:
    /// forgetting a placement twice is a no-op.
    fn forget_if_gone(&self, fh: &FileHandle) {
        if matches!(self.inner().getattr(fh), Err(VfsError::Stale)) {
            self.pnfs.forget_placement(fh);
        }
    }

    /// Restore the placement of every regular file under `top` that is not
    /// in memory (after a restart placements come back at first use), so
    /// deleting the tree finds them and removes their data files. A
    /// control-path walk (volume deletion); a stored placement that does
    /// not decode is skipped (its data files stay on the DSes).
    fn restore_tree(&self, top: &FileHandle) {
        let mut dirs = vec![*top];
        while let Some(d) = dirs.pop() {
            let mut files = Vec::new();
            let mut cookie = 0;
            loop {
                let mut last = None;
                let end = self.inner().readdir(&d, cookie, &mut |e| {
                    match e.attr.ftype {
                        FileType::Directory => dirs.push(e.fh),
                        FileType::Regular => files.push(e.fh),
                        _ => {}
                    }
                    last = Some(e.cookie);
                    true
                });
                match (end, last) {
                    (Ok(false), Some(c)) => cookie = c,
                    _ => break,
                }
            }
            for fh in files {
                let _ = self.pnfs.placement(&fh);
            }
        }
    }

    /// The regular file `name` in `dir` with one link: removing that name
    /// removes the file (or leaves it nameless while it is open).
    fn last_link(&self, dir: &FileHandle, name: &[u8]) -> Option<FileHandle> {
        let (fh, a) = self.inner().lookup(dir, name).ok()?;
        (a.ftype == FileType::Regular && a.nlink <= 1 && self.placed(&fh).ok().flatten().is_some()).then_some(fh)
    }
}

impl Vfs for PnfsVfs {
    fn root(&self, export_id: ExportId) -> VfsResult<FileHandle> {
        self.inner().root(export_id)
    }

    fn getattr(&self, fh: &FileHandle) -> VfsResult<Attr> {
        self.inner().getattr(fh)
    }

    fn setattr(&self, fh: &FileHandle, set: &SetAttr, guard_ctime: Option<Time>) -> VfsResult<Attr> {
        let placed = if set.size.is_some() { self.placed(fh)? } else { None };
        let a = self.inner().setattr(fh, set, guard_ctime)?;
        if let (Some(size), Some(p)) = (set.size, placed) {
            self.resize_placed(&p, size);
            // Clients holding layouts must see the new size before writing
            // again (RFC 8881 §12.5.5.2 leaves this to the server).
            let target = *fh;
            self.pnfs.recall_where(|l| l.fh == target, false);
        }
        Ok(a)
    }

    fn lookup(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<(FileHandle, Attr)> {
        self.inner().lookup(dir, name)
    }

    fn lookup_parent(&self, dir: &FileHandle) -> VfsResult<(FileHandle, Attr)> {
        self.inner().lookup_parent(dir)
    }

    fn read(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)> {
        match self.placed(fh)? {
            Some(p) => self.read_placed(fh, &p, offset, buf),
            None => self.inner().read(fh, offset, buf),
        }
    }

    fn read_lent(&self, fh: &FileHandle, offset: u64, count: usize, sink: &mut dyn vfs::LendSink) -> VfsResult<Option<(usize, bool)>> {
        // Data placed on the data servers is fetched, not lent.
        match self.placed(fh)? {
            Some(_) => Ok(None),
            None => self.inner().read_lent(fh, offset, count, sink),
        }
    }

    fn write(&self, fh: &FileHandle, offset: u64, data: &[u8], _stable: Stability) -> VfsResult<(usize, Stability, Attr)> {
        let a = self.inner().getattr(fh)?;
        if a.ftype != FileType::Regular {
            return self.inner().write(fh, offset, data, _stable);
        }
        let end = offset.checked_add(data.len() as u64).ok_or(VfsError::FileTooBig)?;
        if end > a.size {
            // The quota sees the growth before any DS is written.
            if let Ok(Some(q)) = self.inner().quota(fh) {
                if q.used_bytes.saturating_add(end - a.size) > q.capacity_bytes {
                    return Err(VfsError::QuotaExceeded);
                }
            }
        }
        let p = self.pnfs.ensure_placed(fh).map_err(|_| VfsError::Io)?;
        self.write_placed(fh, &p, offset, data)?;
        // Grow from the size as it is now: other writes finished meanwhile.
        let _grow = self.pnfs.size_lock(fh);
        let now = self.inner().getattr(fh)?.size;
        let set = SetAttr { size: (end > now).then_some(end), mtime: SetTime::ServerNow, ..Default::default() };
        let after = self.inner().setattr(fh, &set, None)?;
        Ok((data.len(), Stability::FileSync, after))
    }

    fn commit(&self, fh: &FileHandle, offset: u64, count: u64) -> VfsResult<()> {
        match self.placed(fh)? {
            // Writes through the MDS are FILE_SYNC on every mirror.
            Some(_) => Ok(()),
            None => self.inner().commit(fh, offset, count),
        }
    }

    /// A placed file's data comes from its data servers on a `pnfs-io`
    /// worker while the core serves other calls (the call parks).
    fn read_start(&self, fh: &FileHandle, offset: u64, buf: &mut [u8], later: &mut dyn Later) -> VfsResult<Option<(usize, bool)>> {
        let Some(p) = self.placed(fh)? else { return self.inner().read_start(fh, offset, buf, later) };
        let Some(done) = later.park() else { return self.read_placed(fh, &p, offset, buf).map(Some) };
        let (me, fh, count) = (PnfsVfs::new(self.pnfs.clone()), *fh, buf.len());
        self.pnfs.io.run(vfs::iopool::read_job(count, done, move |buf| me.read_placed(&fh, &p, offset, buf)));
        Ok(None)
    }

    /// Every write through the MDS goes to data servers (placing the file
    /// first): on a `pnfs-io` worker, the data copied out of the request.
    fn write_start(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stability,
        later: &mut dyn Later,
    ) -> VfsResult<Option<(usize, Stability, Attr)>> {
        if self.inner().getattr(fh)?.ftype != FileType::Regular {
            return self.inner().write_start(fh, offset, data, stable, later);
        }
        let Some(done) = later.park() else { return self.write(fh, offset, data, stable).map(Some) };
        let (me, fh, data) = (PnfsVfs::new(self.pnfs.clone()), *fh, data.to_vec());
        self.pnfs.io.run(Box::new(move || {
            let r = me.write(&fh, offset, &data, stable).map(|(count, committed, attr)| IoDone::Write { count, committed, attr });
            done(r)
        }));
        Ok(None)
    }

    fn write_verifier(&self) -> [u8; 8] {
        self.inner().write_verifier()
    }

    fn create(&self, dir: &FileHandle, name: &[u8], kind: NodeKind<'_>, mode: u32, cred: &Cred<'_>, how: CreateMode) -> VfsResult<(FileHandle, Attr)> {
        self.inner().create(dir, name, kind, mode, cred, how)
    }

    fn remove(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        let victim = self.last_link(dir, name);
        self.inner().remove(dir, name)?;
        if let Some(fh) = victim {
            self.forget_if_gone(&fh);
        }
        Ok(())
    }

    fn rmdir(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        self.inner().rmdir(dir, name)
    }

    fn rename(&self, from_dir: &FileHandle, from_name: &[u8], to_dir: &FileHandle, to_name: &[u8]) -> VfsResult<()> {
        let victim = self.last_link(to_dir, to_name);
        let moved = self.inner().lookup(from_dir, from_name).ok().map(|x| x.0);
        self.inner().rename(from_dir, from_name, to_dir, to_name)?;
        if let Some(fh) = victim.filter(|v| Some(*v) != moved) {
            self.forget_if_gone(&fh);
        }
        Ok(())
    }

    fn link(&self, fh: &FileHandle, dir: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        self.inner().link(fh, dir, name)
    }

    fn readlink(&self, fh: &FileHandle) -> VfsResult<Vec<u8>> {
        self.inner().readlink(fh)
    }

    fn readdir(&self, dir: &FileHandle, cookie: u64, visit: &mut dyn FnMut(DirEntry<'_>) -> bool) -> VfsResult<bool> {
        self.inner().readdir(dir, cookie, visit)
    }

    fn cookie_verifier(&self, dir: &FileHandle) -> VfsResult<[u8; 8]> {
        self.inner().cookie_verifier(dir)
    }

    fn fsstat(&self, fh: &FileHandle) -> VfsResult<FsStat> {
        self.inner().fsstat(fh)
    }

    fn set_quota(&self, dir: &FileHandle, capacity_bytes: u64) -> VfsResult<()> {
        self.inner().set_quota(dir, capacity_bytes)
    }

    fn quota(&self, fh: &FileHandle) -> VfsResult<Option<QuotaUsage>> {
        self.inner().quota(fh)
    }

    fn volume_of(&self, fh: &FileHandle) -> VfsResult<Option<vfs::Ino>> {
        self.inner().volume_of(fh)
    }

    fn offload_pool(&self, fh: &FileHandle) -> Option<&vfs::iopool::IoPool> {
        self.inner().offload_pool(fh)
    }

    fn offload_pool_at(&self, dir: &FileHandle, name: &[u8]) -> Option<&vfs::iopool::IoPool> {
        self.inner().offload_pool_at(dir, name)
    }

    fn fsstat_now(&self, fh: &FileHandle) -> Option<vfs::FsStat> {
        self.inner().fsstat_now(fh)
    }

    fn remove_tree(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        if let Ok((top, a)) = self.inner().lookup(dir, name) {
            if a.ftype == FileType::Directory {
                self.restore_tree(&top);
            }
        }
        self.inner().remove_tree(dir, name)?;
        // Deleting a volume removes a whole tree at once, so no REMOVE names
        // its files: every placed file of this export that the backend now
        // calls Stale lost its last link, and its data files are queued for
        // removal like a REMOVE's. A scan over this export's placements is
        // fine here: volume deletion is a rare control-path call, and a file
        // still linked elsewhere (a hard link outside the tree) stays placed.
        let export_id = dir.export_id;
        let candidates: Vec<FileHandle> =
            self.pnfs.state().files.keys().filter(|fh| fh.export_id == export_id).copied().collect();
        for fh in candidates {
            self.forget_if_gone(&fh);
        }
        Ok(())
    }

    fn pin(&self, fh: &FileHandle) -> VfsResult<()> {
        self.inner().pin(fh)
    }

    /// The last unpin of a file that lost its last name while open
    /// destroys it in the MDS's backend: its data files go now.
    fn unpin(&self, fh: &FileHandle) {
        self.inner().unpin(fh);
        if self.placed(fh).ok().flatten().is_some() {
            self.forget_if_gone(fh);
        }
    }

    fn client_records(&self) -> Option<Vec<Vec<u8>>> {
        self.inner().client_records()
    }

    fn record_client(&self, owner: &[u8], present: bool) {
        self.inner().record_client(owner, present)
    }

    // A file's data lives on the data servers (a file not placed yet has
    // none), which the MDS's backend knows nothing of: a placed file's
    // holes are not the MDS's to report, and no file's space is the MDS's
    // to reserve. Those answer NotSupported (NFS4ERR_NOTSUPP; READ_PLUS
    // then reads the file as data). A file not placed yet is all holes in
    // the backend, which answers SEEK and DEALLOCATE for it.
    fn seek(&self, fh: &FileHandle, offset: u64, what: vfs::Content) -> VfsResult<Option<(bool, u64)>> {
        match self.placed(fh)? {
            Some(_) => Err(VfsError::NotSupported),
            None => self.inner().seek(fh, offset, what),
        }
    }

    fn allocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        let _ = (fh, offset, len);
        Err(VfsError::NotSupported)
    }

    // Extended attributes are metadata: the MDS's backend keeps them.
    fn xattrs_supported(&self, fh: &FileHandle) -> bool {
        self.inner().xattrs_supported(fh)
    }

    fn getxattr(&self, fh: &FileHandle, name: &[u8]) -> VfsResult<Vec<u8>> {
        self.inner().getxattr(fh, name)
    }

    fn setxattr(&self, fh: &FileHandle, name: &[u8], value: &[u8], how: XattrSet) -> VfsResult<Attr> {
        self.inner().setxattr(fh, name, value, how)
    }

    fn listxattrs(&self, fh: &FileHandle, cookie: u64, visit: &mut dyn FnMut(&[u8]) -> bool) -> VfsResult<bool> {
        self.inner().listxattrs(fh, cookie, visit)
    }

    fn removexattr(&self, fh: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        self.inner().removexattr(fh, name)
    }

    fn deallocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        match self.placed(fh)? {
            Some(_) => Err(VfsError::NotSupported),
            None => self.inner().deallocate(fh, offset, len),
        }
    }

    fn private_get(&self, fh: &FileHandle) -> VfsResult<Option<Vec<u8>>> {
        self.inner().private_get(fh)
    }

    fn private_set(&self, fh: &FileHandle, data: Option<&[u8]>) -> VfsResult<()> {
        self.inner().private_set(fh, data)
    }
}
