//! Layouts (RFC 8881 §12, RFC 8435 §5): placement of a file's data files,
//! layout state and stateids, the ff_layout4 and ff_device_addr4 bodies,
//! and the LAYOUTGET/RETURN/COMMIT/ERROR/STATS semantics.
//!
//! Segment shape: the Linux flex-files client accepts exactly one data
//! server per mirror (it refuses ffm_data_servers of any other length), so
//! striping is expressed with layout ranges: a file striped over W > 1 DSes
//! gets one segment per stripe unit, [k·su, (k+1)·su), whose mirror m is on
//! DS (k + m) mod W; with W = 1 one segment covers the whole file. Data
//! files are sparse: DS offset = file offset.
//!
//! Mirrored files (mirrors ≥ 2) get one whole-file segment with mirror m on
//! their m-th DS, no striping: the Linux client (seen on 6.1) flushes the
//! page lists of its mirrors at different times and its segment test only
//! checks a page's *end* against the segment, so with per-unit segments a
//! mirror's pages of unit k ride along with unit k+1's I/O to unit k+1's DS
//! (wrong data read back, found by e2e/pnfs). Files still spread over DSes.

use crate::client3::{CtlError, Sattr};
use crate::{data_file_name, run_remove, LayoutState, Placement, Pnfs, State, DATA_FILE_MODE, LAYOUT4_FLEX_FILES};
use nfs4::layout::{Commit, DeviceError, DeviceId, IoMode, Layout, LayoutGetArgs, LayoutServer, Return, LENGTH_TO_EOF};
use nfs4::state::Stateid;
use proto::nfs4 as p;
use proto::xdr::{Encoder, Xdr};
use std::sync::atomic::Ordering;
use vfs::{FileHandle, SetAttr, SetTime};

/// First 4 bytes of a layout stateid's `other`: never a boot epoch of the
/// NFSv4 state (those are Unix seconds, far below 0xff000000 until 2105).
pub const LAYOUT_STATEID_MAGIC: [u8; 4] = [0xff, b'L', b'Y', b'T'];
/// Largest ff_layout4 body we build (3 mirrors × one DS): well below this.
const LAYOUT_BODY_BYTES_MAX: usize = 4096;

/// Drop every layout state of a file (fencing, removal).
pub(crate) fn forget_file(st: &mut State, fh: &FileHandle) {
    let keys: Vec<u32> = st.layouts.iter().filter(|(_, l)| l.fh == *fh).map(|(k, _)| *k).collect();
    for k in keys {
        drop_layout(st, k);
    }
}

/// Forget one layout state (returned, or the client holds none of it).
pub(crate) fn forget_layout(st: &mut State, key: u32) {
    drop_layout(st, key);
}

fn drop_layout(st: &mut State, key: u32) {
    if let Some(l) = st.layouts.remove(&key) {
        st.by_client_file.remove(&(l.clientid, l.fh));
        if let Some(n) = st.per_client.get_mut(&l.clientid) {
            *n -= 1;
            if *n == 0 {
                st.per_client.remove(&l.clientid);
            }
        }
    }
}

fn owner(e: &mut Encoder<'_>, id: u32) -> proto::xdr::Result<()> {
    e.opaque_var(id.to_string().as_bytes())
}

impl Pnfs {
    /// The placement of `fh` (restored from stable storage after a
    /// restart), creating its data files on first use. The new placement
    /// is stored before anyone can use it; a stored one that is
    /// unreadable is NFS4ERR_IO and never replaced by a new one (its data
    /// is on the DSes).
    pub(crate) fn ensure_placed(&self, fh: &FileHandle) -> Result<Placement, i32> {
        match self.placement(fh) {
            Ok(Some(p)) => return Ok(p),
            Ok(None) => {}
            Err(e) => return Err(nfs4::error::vfs_status(e)),
        }
        let _g = self.place_lock.lock().unwrap_or_else(|e| e.into_inner());
        // Two attempts: a DS that fails its create is marked unhealthy and
        // the second placement avoids it.
        let mut last = p::NFS4ERR_LAYOUTUNAVAILABLE;
        for _ in 0..2 {
            let (ids, conns) = {
                let mut st = self.state();
                if let Some(p) = st.files.get(fh) {
                    return Ok(p.clone());
                }
                let active = st.ds.active_ids();
                let w = match (self.cfg.mirrors, self.cfg.stripe_width) {
                    // Mirrored files are not striped: see `Placement::segmented`.
                    (m, _) if m > 1 => m as usize,
                    (_, 0) => active.len(),
                    (_, w) => (w as usize).min(active.len()),
                };
                if w == 0 || w < self.cfg.mirrors as usize {
                    return Err(p::NFS4ERR_LAYOUTUNAVAILABLE);
                }
                let first = st.next_first as usize;
                st.next_first = st.next_first.wrapping_add(1);
                let ids: Vec<u64> = (0..w).map(|i| active[(first + i) % active.len()]).collect();
                let conns: Vec<_> = ids.iter().map(|id| st.ds.conn(*id).expect("active DS has a connection")).collect();
                (ids, conns)
            };
            let name = data_file_name(fh);
            // Size 0: a data file by that name already there belongs to no
            // placement (its MDS file is gone — a backend that did not keep
            // its namespace and hands the same handle out again, or a
            // removal that never reached the DS); a new file must not show
            // its bytes.
            let attrs = Sattr { mode: Some(DATA_FILE_MODE), uid: Some(self.cfg.synthetic_uid), gid: Some(self.cfg.synthetic_gid), size: Some(0) };
            let mut fhs = Vec::with_capacity(ids.len());
            let mut failed = None;
            for (id, c) in ids.iter().zip(&conns) {
                let mut c = c.lock().unwrap_or_else(|e| e.into_inner());
                match c.root().and_then(|root| c.client.create(&root, name.as_bytes(), &attrs)) {
                    Ok(h) => fhs.push(h),
                    Err(e) => {
                        failed = Some((*id, e));
                        break;
                    }
                }
            }
            if let Some((id, e)) = failed {
                if matches!(e, CtlError::Unreachable(_) | CtlError::Protocol(_)) {
                    self.ds_failed(id);
                    last = p::NFS4ERR_LAYOUTTRYLATER;
                    continue;
                }
                return Err(p::NFS4ERR_LAYOUTUNAVAILABLE);
            }
            let p = Placement {
                stale: vec![false; ids.len()],
                dses: ids,
                mirrors: self.cfg.mirrors,
                stripe_unit_bytes: self.cfg.stripe_unit_bytes,
                epoch: 0,
                data_fh: fhs,
            };
            if let Err(e) = self.persist_new(fh, &p) {
                // Unrecorded data files would be orphans after a restart.
                run_remove(&crate::RemoveJob { conns, name });
                return Err(nfs4::error::vfs_status(e));
            }
            let mut st = self.state();
            // Stored now, so a racing first use may have restored it already.
            if let Some(p) = st.files.get(fh) {
                return Ok(p.clone());
            }
            for id in &p.dses {
                st.ds.file_count(*id, 1);
            }
            st.files.insert(*fh, p.clone());
            return Ok(p);
        }
        Err(last)
    }

    /// Look up a layout stateid of `clientid` on `fh` (§8.2.2 seqid rules).
    fn layout_key(&self, st: &State, clientid: u64, fh: &FileHandle, sid: &Stateid) -> Result<u32, i32> {
        if sid.other[..4] != LAYOUT_STATEID_MAGIC {
            return Err(p::NFS4ERR_BAD_STATEID);
        }
        if sid.other[4..8] != self.boot.to_be_bytes() {
            return Err(p::NFS4ERR_STALE_STATEID);
        }
        let key = u32::from_be_bytes(sid.other[8..].try_into().unwrap());
        let l = st.layouts.get(&key).ok_or(p::NFS4ERR_BAD_STATEID)?;
        if l.clientid != clientid || l.fh != *fh {
            return Err(p::NFS4ERR_BAD_STATEID);
        }
        if sid.seqid > l.seqid {
            return Err(p::NFS4ERR_BAD_STATEID);
        }
        Ok(key)
    }

    /// ff_layout4 of one segment: one ff_mirror4 per usable mirror, each
    /// with exactly one data server.
    fn layout_body(&self, p: &Placement, slots: &[usize]) -> Vec<u8> {
        let st = self.state();
        let mut buf = vec![0u8; LAYOUT_BODY_BYTES_MAX];
        let n = {
            let mut e = Encoder::new(&mut buf);
            (|| -> proto::xdr::Result<()> {
                e.u64(0)?; // ffl_stripe_unit: one DS per mirror, no striping inside a segment
                e.u32(slots.len() as u32)?;
                for &i in slots {
                    e.u32(1)?;
                    e.opaque_fixed(&st.ds.get(p.dses[i]).map_or_else(|| crate::registry::device_id(p.dses[i]), |r| r.device()))?;
                    e.u32(1)?; // ffds_efficiency
                    e.u32(0)?; // ffds_stateid: anonymous (loosely coupled, RFC 8435 §5.1)
                    e.opaque_fixed(&[0u8; 12])?;
                    e.u32(1)?; // ffds_fh_vers: one handle
                    e.opaque_var(&p.data_fh[i])?;
                    owner(&mut e, self.cfg.synthetic_uid + p.epoch)?;
                    owner(&mut e, self.cfg.synthetic_gid + p.epoch)?;
                }
                e.u32(0)?; // ffl_flags: I/O through the MDS allowed, LAYOUTCOMMIT wanted
                e.u32(0) // ffl_stats_collect_hint
            })()
            .expect("layout body fits");
            e.position()
        };
        drop(st);
        buf.truncate(n);
        buf
    }

    /// Usable mirror slots of stripe unit `unit` for `iomode`; an RW layout
    /// that must leave a mirror out marks that copy stale for good.
    fn usable_slots(&self, fh: &FileHandle, unit: u64, iomode: IoMode) -> Vec<usize> {
        let mut st = self.state();
        let Some(p) = st.files.get(fh).cloned() else { return Vec::new() };
        let mut slots = Vec::new();
        let mut newly_stale = Vec::new();
        for m in 0..p.mirrors {
            let i = p.slot(unit, m);
            let ok = st.ds.get(p.dses[i]).is_some_and(|r| r.active()) && !p.stale[i];
            if ok {
                slots.push(i);
            } else if iomode == IoMode::Rw && !p.stale[i] {
                newly_stale.push(i);
            }
        }
        let changed = !slots.is_empty() && !newly_stale.is_empty();
        if changed {
            if let Some(f) = st.files.get_mut(fh) {
                for i in newly_stale {
                    f.stale[i] = true;
                }
                st.stale_files.insert(*fh);
            }
        }
        drop(st);
        if changed {
            self.persist(fh);
        }
        slots
    }

    /// Mark the copy on DS `id` of `fh` stale (a failed write reached the
    /// other mirrors only; a client reported the DS failing). A copy that
    /// is the last good one of a stripe unit stays (`Placement::others_cover`):
    /// with one copy, a DS restarting made the data unreachable for good.
    pub(crate) fn mark_stale(&self, fh: &FileHandle, id: u64) {
        let mut newly = false;
        let mut st = self.state();
        if let Some(p) = st.files.get_mut(fh) {
            let slots: Vec<usize> = (0..p.dses.len()).filter(|&i| p.dses[i] == id && !p.stale[i] && p.others_cover(i, id)).collect();
            for i in slots {
                p.stale[i] = true;
                newly = true;
            }
        }
        if newly {
            st.stale_files.insert(*fh);
        }
        drop(st);
        if newly {
            self.persist(fh);
            // Layouts naming the stale copy (READ layouts of other clients)
            // must not be used to read it.
            let target = *fh;
            self.recall_where(|l| l.fh == target && l.dses.contains(&id), false);
        }
    }

    fn layoutget_inner(&self, a: &LayoutGetArgs) -> Result<Layout, i32> {
        // The stateid first: a forged or stale one fails before any work.
        let existing = {
            let st = self.state();
            if a.layout_stateid {
                Some(self.layout_key(&st, a.clientid, &a.fh, &a.stateid)?)
            } else {
                st.by_client_file.get(&(a.clientid, a.fh)).copied()
            }
        };
        if existing.is_none() {
            let st = self.state();
            if st.layouts.len() >= self.cfg.layouts_max
                || st.per_client.get(&a.clientid).copied().unwrap_or(0) >= self.cfg.layouts_per_client_max
            {
                return Err(p::NFS4ERR_LAYOUTTRYLATER);
            }
        }
        let pl = self.ensure_placed(&a.fh)?;
        let su = pl.stripe_unit_bytes;
        let unit = a.offset / su;
        let (offset, length) = if pl.segmented() { (unit * su, su) } else { (0, LENGTH_TO_EOF) };
        // §18.43.3: the segment must cover [offset, offset + minlength).
        let end = if length == LENGTH_TO_EOF { u64::MAX } else { offset + length };
        if a.minlength > 0 && a.offset.saturating_add(a.minlength) > end {
            return Err(p::NFS4ERR_LAYOUTTRYLATER);
        }
        let slots = self.usable_slots(&a.fh, unit, a.iomode);
        if slots.is_empty() {
            return Err(p::NFS4ERR_LAYOUTUNAVAILABLE);
        }
        let pl = self.state().files.get(&a.fh).cloned().ok_or(p::NFS4ERR_LAYOUTUNAVAILABLE)?;
        let body = self.layout_body(&pl, &slots);
        if body.len() + 64 > a.maxcount as usize {
            return Err(p::NFS4ERR_TOOSMALL);
        }
        let mut st = self.state();
        if st.resyncing.is_some_and(|(f, _)| f == a.fh) {
            // A stale copy of this file is being brought back: clients do
            // their I/O through the MDS until it is (`resync`).
            return Err(p::NFS4ERR_LAYOUTUNAVAILABLE);
        }
        let key = match existing.filter(|k| st.layouts.contains_key(k)) {
            Some(k) => k,
            None => {
                let k = st.next_layout_key;
                st.next_layout_key = st.next_layout_key.wrapping_add(1).max(1);
                st.layouts.insert(k, LayoutState { clientid: a.clientid, fh: a.fh, fsid: a.fsid, seqid: 0, dses: Vec::new(), recalled_ms: None, revoke_now: false, peer: None, rw: false });
                st.by_client_file.insert((a.clientid, a.fh), k);
                *st.per_client.entry(a.clientid).or_insert(0) += 1;
                k
            }
        };
        let ids: Vec<u64> = slots.iter().map(|&i| pl.dses[i]).collect();
        for id in &ids {
            if let Some(r) = st.ds.get_mut(*id) {
                r.layouts_granted += 1;
            }
        }
        let l = st.layouts.get_mut(&key).expect("layout state just ensured");
        l.seqid = if l.seqid == u32::MAX { 1 } else { l.seqid + 1 };
        if a.peer.is_some() {
            l.peer = a.peer;
        }
        l.rw |= a.iomode == IoMode::Rw;
        for id in ids {
            if !l.dses.contains(&id) {
                l.dses.push(id);
            }
        }
        let seqid = l.seqid;
        drop(st);
        match a.iomode {
            IoMode::Read => self.metrics.layouts_granted_read.fetch_add(1, Ordering::Relaxed),
            IoMode::Rw => self.metrics.layouts_granted_rw.fetch_add(1, Ordering::Relaxed),
        };
        Ok(Layout { stateid: self.layout_stateid(key, seqid), return_on_close: false, offset, length, iomode: a.iomode, body })
    }

    /// ff_layoutreturn4 (RFC 8435 §9.3): error reports mark DSes
    /// unhealthy and their copies of the file stale; stats are counted.
    fn apply_return_body(&self, fh: &FileHandle, body: &[u8]) {
        if body.is_empty() {
            return;
        }
        let Ok(r) = proto::flexfiles::ff_layoutreturn4::decode(&mut proto::xdr::Decoder::new(body)) else { return };
        let mut errs = Vec::new();
        for ioerr in &r.fflr_ioerr_report {
            for de in &ioerr.ffie_errors {
                errs.push(DeviceError { deviceid: de.de_deviceid, status: de.de_status as i32, opnum: de.de_opnum as i32 });
            }
        }
        self.report_errors(fh, &errs);
        self.metrics.layoutstats.fetch_add(r.fflr_iostats_report.len() as u64, Ordering::Relaxed);
    }

    fn report_errors(&self, fh: &FileHandle, errors: &[DeviceError]) {
        for de in errors {
            // Space and permission errors are not the DS being unreachable.
            if [p::NFS4_OK, p::NFS4ERR_NOSPC, p::NFS4ERR_DQUOT, p::NFS4ERR_ACCESS].contains(&de.status) {
                continue;
            }
            self.metrics.layouterrors.fetch_add(1, Ordering::Relaxed);
            if let Some((id, gen)) = crate::registry::id_and_gen(&de.deviceid) {
                // An error reported against the address a DS had before it
                // moved says nothing of where it is now.
                if self.state().ds.get(id).is_some_and(|r| r.gen != gen) {
                    continue;
                }
                self.ds_failed(id);
                self.mark_stale(fh, id);
            }
        }
    }
}

impl LayoutServer for Pnfs {
    fn layout_type(&self) -> u32 {
        LAYOUT4_FLEX_FILES
    }

    fn blksize(&self) -> u32 {
        self.cfg.stripe_unit_bytes.min(u32::MAX as u64) as u32
    }

    fn is_layout_stateid(&self, sid: &Stateid) -> bool {
        sid.other[..4] == LAYOUT_STATEID_MAGIC
    }

    fn layoutget(&self, a: &LayoutGetArgs) -> Result<Layout, i32> {
        let r = self.layoutget_inner(a);
        if let Err(e) = r {
            let c = match e {
                p::NFS4ERR_LAYOUTTRYLATER => &self.metrics.layoutget_trylater,
                p::NFS4ERR_LAYOUTUNAVAILABLE => &self.metrics.layoutget_unavailable,
                _ => &self.metrics.layoutget_bad_stateid,
            };
            c.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn getdeviceinfo(&self, id: &DeviceId) -> Result<Vec<u8>, i32> {
        let ds = crate::registry::id_of_device(id).ok_or(p::NFS4ERR_NOENT)?;
        let addrs = self.state().ds.netaddrs(ds).ok_or(p::NFS4ERR_NOENT)?;
        let mut buf = vec![0u8; 2048];
        let mut e = Encoder::new(&mut buf);
        (|| -> proto::xdr::Result<()> {
            e.u32(addrs.len() as u32)?;
            for (netid, uaddr) in &addrs {
                e.opaque_var(netid.as_bytes())?;
                e.opaque_var(uaddr.as_bytes())?;
            }
            e.u32(1)?; // ffda_versions: NFSv3 only
            e.u32(3)?;
            e.u32(0)?;
            e.u32(self.cfg.ds_io_bytes_max)?;
            e.u32(self.cfg.ds_io_bytes_max)?;
            e.bool(false) // loosely coupled
        })()
        .map_err(|_| p::NFS4ERR_SERVERFAULT)?;
        let n = e.position();
        buf.truncate(n);
        Ok(buf)
    }

    fn getdevicelist(&self) -> Vec<DeviceId> {
        let st = self.state();
        st.ds.recs.iter().filter(|r| r.present).map(|r| r.device()).collect()
    }

    fn layoutreturn(&self, clientid: u64, _iomode: Option<IoMode>, r: &Return<'_>) -> Result<Option<Stateid>, i32> {
        match r {
            Return::File { fh, offset, length, stateid, body } => {
                let key = {
                    let st = self.state();
                    self.layout_key(&st, clientid, fh, stateid)?
                };
                self.apply_return_body(fh, body);
                self.metrics.layouts_returned.fetch_add(1, Ordering::Relaxed);
                let mut st = self.state();
                if *offset == 0 && *length == LENGTH_TO_EOF {
                    drop_layout(&mut st, key);
                    return Ok(None);
                }
                let Some(l) = st.layouts.get_mut(&key) else { return Ok(None) };
                l.seqid = if l.seqid == u32::MAX { 1 } else { l.seqid + 1 };
                let seqid = l.seqid;
                drop(st);
                Ok(Some(self.layout_stateid(key, seqid)))
            }
            Return::Fsid { fsid } => {
                let mut st = self.state();
                let keys: Vec<u32> = st.layouts.iter().filter(|(_, l)| l.clientid == clientid && l.fsid == *fsid).map(|(k, _)| *k).collect();
                self.metrics.layouts_returned.fetch_add(keys.len() as u64, Ordering::Relaxed);
                for k in keys {
                    drop_layout(&mut st, k);
                }
                Ok(None)
            }
            Return::All => {
                let mut st = self.state();
                let keys: Vec<u32> = st.layouts.iter().filter(|(_, l)| l.clientid == clientid).map(|(k, _)| *k).collect();
                self.metrics.layouts_returned.fetch_add(keys.len() as u64, Ordering::Relaxed);
                for k in keys {
                    drop_layout(&mut st, k);
                }
                Ok(None)
            }
        }
    }

    fn layoutcommit(&self, c: &Commit<'_>) -> Result<Option<u64>, i32> {
        {
            let st = self.state();
            self.layout_key(&st, c.clientid, &c.fh, &c.stateid)?;
        }
        self.metrics.layoutcommits.fetch_add(1, Ordering::Relaxed);
        let _grow = self.size_lock(&c.fh);
        let cur = self.vfs.getattr(&c.fh).map_err(nfs4::error::vfs_status)?;
        let mut set = SetAttr::default();
        let mut new_size = None;
        if let Some(last) = c.last_write_offset {
            let size = last.checked_add(1).ok_or(p::NFS4ERR_INVAL)?;
            if size > cur.size {
                // The volume's quota sees the growth (pNFS data lives on DSes).
                if let Ok(Some(q)) = self.vfs.quota(&c.fh) {
                    if q.used_bytes.saturating_add(size - cur.size) > q.capacity_bytes {
                        return Err(p::NFS4ERR_DQUOT);
                    }
                }
                set.size = Some(size);
                new_size = Some(size);
            }
        }
        set.mtime = match c.mtime {
            Some(t) => SetTime::Client(t),
            None if new_size.is_some() || c.last_write_offset.is_some() => SetTime::ServerNow,
            None => SetTime::DontChange,
        };
        if set != SetAttr::default() {
            self.vfs.setattr(&c.fh, &set, None).map_err(nfs4::error::vfs_status)?;
        }
        Ok(new_size)
    }

    fn layouterror(&self, clientid: u64, fh: &FileHandle, stateid: &Stateid, errors: &[DeviceError]) -> Result<(), i32> {
        {
            let st = self.state();
            self.layout_key(&st, clientid, fh, stateid)?;
        }
        self.report_errors(fh, errors);
        Ok(())
    }

    fn layoutstats(&self, clientid: u64, fh: &FileHandle, stateid: &Stateid, _deviceid: &DeviceId, _body: &[u8]) -> Result<(), i32> {
        {
            let st = self.state();
            self.layout_key(&st, clientid, fh, stateid)?;
        }
        self.metrics.layoutstats.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
