//! pNFS operations (RFC 8881 §18.40–§18.44; LAYOUTERROR and LAYOUTSTATS
//! from RFC 7862 §15.6–15.7, accepted in minor version 1 because the
//! flex-files layout reports through them). The protocol rules live here:
//! argument decoding (by hand, so an unknown layout type is
//! NFS4ERR_UNKNOWN_LAYOUTTYPE rather than BADXDR), range checks, the open
//! stateid a first LAYOUTGET presents, and the encoding of results. What a
//! layout contains is the `LayoutServer`'s business (`crate::layout`).

use crate::compound::Compound;
use crate::error::{fail, Nfs4Error, OpResult};
use crate::layout::{Commit, DeviceError, DeviceId, IoMode, LayoutGetArgs, LayoutServer, Return, LENGTH_TO_EOF};
use crate::state::Stateid;
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder};
use std::sync::Arc;
use vfs::{FileType, Time};

/// Most device ids one GETDEVICELIST answer carries.
pub const DEVICES_PER_LIST_MAX: usize = 1024;
/// Most device_error4 entries one LAYOUTERROR may carry.
pub const DEVICE_ERRORS_MAX: u32 = 64;
/// Longest layout-type-specific body accepted (LAYOUTRETURN, LAYOUTCOMMIT,
/// LAYOUTSTATS): flex-files error and stats reports are a few KiB.
pub const LAYOUT_BODY_BYTES_MAX: u32 = 64 * 1024;

fn stateid(d: &mut Decoder<'_>) -> OpResult<Stateid> {
    let seqid = d.u32()?;
    let other = d.opaque_fixed::<12>()?;
    Ok(Stateid { seqid, other })
}

fn enc_stateid(e: &mut Encoder<'_>, s: &Stateid) -> OpResult {
    e.u32(s.seqid)?;
    e.opaque_fixed(&s.other)?;
    Ok(())
}

fn iomode(v: u32) -> OpResult<Option<IoMode>> {
    match v {
        1 => Ok(Some(IoMode::Read)),
        2 => Ok(Some(IoMode::Rw)),
        3 => Ok(None),
        _ => fail(p::NFS4ERR_BADIOMODE),
    }
}

/// A range that does not overflow (§18.43.3: NFS4ERR_INVAL).
fn check_range(offset: u64, length: u64) -> OpResult {
    if length == 0 || (length != LENGTH_TO_EOF && offset.checked_add(length).is_none()) {
        return fail(p::NFS4ERR_INVAL);
    }
    Ok(())
}

impl Compound<'_> {
    fn layouts(&self) -> OpResult<Arc<dyn LayoutServer>> {
        self.prog.layouts.clone().ok_or(Nfs4Error(p::NFS4ERR_LAYOUTUNAVAILABLE))
    }

    /// The layout type argument: ours, or NFS4ERR_UNKNOWN_LAYOUTTYPE.
    fn layout_type_arg(&self, l: &dyn LayoutServer, t: u32) -> OpResult {
        if t != l.layout_type() {
            return fail(p::NFS4ERR_UNKNOWN_LAYOUTTYPE);
        }
        Ok(())
    }

    /// LAYOUTGET (RFC 8881 §18.43).
    pub(crate) fn op_layoutget(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let _signal = d.bool()?;
        let ltype = d.u32()?;
        let mode = d.u32()?;
        let offset = d.u64()?;
        let length = d.u64()?;
        let minlength = d.u64()?;
        let sid = stateid(d)?;
        let maxcount = d.u32()?;
        let l = self.layouts()?;
        self.layout_type_arg(&*l, ltype)?;
        let iomode = iomode(mode)?.ok_or(Nfs4Error(p::NFS4ERR_BADIOMODE))?;
        let clientid = self.clientid()?;
        let fh = self.cur_fh()?;
        let a = self.prog.vfs.getattr(&fh)?;
        if a.ftype != FileType::Regular {
            // Layouts describe file data only (NFS4ERR_WRONG_TYPE, §15.1.2.9).
            return fail(p::NFS4ERR_WRONG_TYPE);
        }
        check_range(offset, length)?;
        if length != LENGTH_TO_EOF && length < minlength {
            return fail(p::NFS4ERR_INVAL);
        }
        let sid = self.resolve_sid(sid)?;
        let layout_stateid = l.is_layout_stateid(&sid);
        if !layout_stateid {
            // First layout of the file: an open, lock or delegation
            // stateid of this client for this file (§12.5.3).
            if sid.is_special() {
                return fail(p::NFS4ERR_BAD_STATEID);
            }
            let v = self.prog.state().check_io(Some(clientid), &sid, &fh, self.now_ms)?;
            if iomode == IoMode::Rw && v.access & crate::state::SHARE_WRITE == 0 {
                // An RW layout needs an open for writing.
                return fail(p::NFS4ERR_OPENMODE);
            }
        }
        let args = LayoutGetArgs { clientid, fh, fsid: a.fsid, iomode, offset, length, minlength, stateid: sid, layout_stateid, maxcount, peer: Some(self.peer) };
        let lay = l.layoutget(&args).map_err(|s| {
            if s == p::NFS4ERR_LAYOUTTRYLATER {
                // LAYOUTGET4res carries logr_will_signal_layout_avail.
                self.error_body_u32 = Some(0);
            }
            Nfs4Error(s)
        })?;
        // Reply: return_on_close, stateid, one layout4.
        let need = 4 + 16 + 4 + 8 + 8 + 4 + 4 + 4 + lay.body.len() + 3;
        if need > maxcount as usize {
            return fail(p::NFS4ERR_TOOSMALL);
        }
        e.bool(lay.return_on_close)?;
        enc_stateid(e, &lay.stateid)?;
        e.u32(1)?;
        e.u64(lay.offset)?;
        e.u64(lay.length)?;
        e.u32(lay.iomode.wire())?;
        e.u32(l.layout_type())?;
        e.opaque_var(&lay.body)?;
        self.cur_sid = Some(lay.stateid);
        Ok(())
    }

    /// GETDEVICEINFO (RFC 8881 §18.40).
    pub(crate) fn op_getdeviceinfo(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let id: DeviceId = d.opaque_fixed::<16>()?;
        let ltype = d.u32()?;
        let maxcount = d.u32()?;
        let (_notify, _) = crate::attrs::Bitmap::decode(d)?;
        let l = self.layouts()?;
        self.layout_type_arg(&*l, ltype)?;
        let body = l.getdeviceinfo(&id).map_err(Nfs4Error)?;
        // device_addr4 (type + opaque) and an empty notification bitmap.
        let need = (4 + 4 + body.len().div_ceil(4) * 4 + 4) as u32;
        if maxcount != 0 && need > maxcount {
            self.error_body_u32 = Some(need);
            return fail(p::NFS4ERR_TOOSMALL);
        }
        e.u32(l.layout_type())?;
        e.opaque_var(&body)?;
        e.u32(0)?; // gdir_notification: no notifications
        Ok(())
    }

    /// GETDEVICELIST (RFC 8881 §18.41): every device in one answer (cookie
    /// = index of the next device; the verifier never changes because ids
    /// are never reused).
    pub(crate) fn op_getdevicelist(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let ltype = d.u32()?;
        let maxdevices = d.u32()?;
        let cookie = d.u64()?;
        let _verf = d.opaque_fixed::<8>()?;
        let l = self.layouts()?;
        self.layout_type_arg(&*l, ltype)?;
        self.cur_fh()?;
        let all = l.getdevicelist();
        let start = (cookie as usize).min(all.len());
        let n = (all.len() - start).min(maxdevices as usize).min(DEVICES_PER_LIST_MAX);
        if n == 0 && start < all.len() {
            return fail(p::NFS4ERR_TOOSMALL);
        }
        e.u64((start + n) as u64)?;
        e.opaque_fixed(&[0u8; 8])?;
        e.u32(n as u32)?;
        for id in &all[start..start + n] {
            e.opaque_fixed(id)?;
        }
        e.bool(start + n == all.len())?;
        Ok(())
    }

    /// LAYOUTRETURN (RFC 8881 §18.44).
    pub(crate) fn op_layoutreturn(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let _reclaim = d.bool()?;
        let ltype = d.u32()?;
        let mode = d.u32()?;
        let rtype = d.u32()?;
        let l = self.layouts()?;
        let clientid = self.clientid()?;
        let r = match rtype {
            1 => {
                let offset = d.u64()?;
                let length = d.u64()?;
                let sid = stateid(d)?;
                let body = d.opaque_var(LAYOUT_BODY_BYTES_MAX)?;
                self.layout_type_arg(&*l, ltype)?;
                let iomode = iomode(mode)?;
                check_range(offset, length)?;
                let fh = self.cur_fh()?;
                let sid = self.resolve_sid(sid)?;
                if !l.is_layout_stateid(&sid) {
                    return fail(p::NFS4ERR_BAD_STATEID);
                }
                let left = l.layoutreturn(clientid, iomode, &Return::File { fh, offset, length, stateid: sid, body }).map_err(Nfs4Error)?;
                return self.enc_returned(left, e);
            }
            2 => {
                let fh = self.cur_fh()?;
                let fsid = self.prog.vfs.getattr(&fh)?.fsid;
                Return::Fsid { fsid }
            }
            3 => Return::All,
            _ => return fail(p::NFS4ERR_INVAL),
        };
        self.layout_type_arg(&*l, ltype)?;
        let iomode = iomode(mode)?;
        l.layoutreturn(clientid, iomode, &r).map_err(Nfs4Error)?;
        // §18.44.3: no stateid for FSID/ALL returns.
        e.bool(false)?;
        Ok(())
    }

    fn enc_returned(&mut self, left: Option<Stateid>, e: &mut Encoder<'_>) -> OpResult {
        match left {
            Some(s) => {
                e.bool(true)?;
                enc_stateid(e, &s)?;
                self.cur_sid = Some(s);
            }
            None => e.bool(false)?,
        }
        Ok(())
    }

    /// LAYOUTCOMMIT (RFC 8881 §18.42).
    pub(crate) fn op_layoutcommit(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let offset = d.u64()?;
        let length = d.u64()?;
        let reclaim = d.bool()?;
        let sid = stateid(d)?;
        let last_write_offset = if d.bool()? { Some(d.u64()?) } else { None };
        let mtime = if d.bool()? {
            let sec = d.i64()?;
            let nsec = d.u32()?;
            if nsec >= 1_000_000_000 {
                return fail(p::NFS4ERR_INVAL);
            }
            Some(Time { sec, nsec })
        } else {
            None
        };
        let ltype = d.u32()?;
        let body = d.opaque_var(LAYOUT_BODY_BYTES_MAX)?;
        let l = self.layouts()?;
        self.layout_type_arg(&*l, ltype)?;
        let clientid = self.clientid()?;
        let fh = self.cur_fh()?;
        check_range(offset, length)?;
        let sid = self.resolve_sid(sid)?;
        if !l.is_layout_stateid(&sid) {
            return fail(p::NFS4ERR_BAD_STATEID);
        }
        let c = Commit { clientid, fh, offset, length, reclaim, stateid: sid, last_write_offset, mtime, body };
        match l.layoutcommit(&c).map_err(Nfs4Error)? {
            Some(size) => {
                e.bool(true)?;
                e.u64(size)?;
            }
            None => e.bool(false)?,
        }
        Ok(())
    }

    /// LAYOUTERROR (RFC 7862 §15.6).
    pub(crate) fn op_layouterror(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let offset = d.u64()?;
        let length = d.u64()?;
        let sid = stateid(d)?;
        let n = d.array_len(DEVICE_ERRORS_MAX, 24)?;
        let mut errors = Vec::with_capacity(n);
        for _ in 0..n {
            let deviceid = d.opaque_fixed::<16>()?;
            let status = d.i32()?;
            let opnum = d.i32()?;
            errors.push(DeviceError { deviceid, status, opnum });
        }
        let l = self.layouts()?;
        let clientid = self.clientid()?;
        let fh = self.cur_fh()?;
        check_range(offset, length)?;
        let sid = self.resolve_sid(sid)?;
        if !l.is_layout_stateid(&sid) {
            return fail(p::NFS4ERR_BAD_STATEID);
        }
        l.layouterror(clientid, &fh, &sid, &errors).map_err(Nfs4Error)
    }

    /// LAYOUTSTATS (RFC 7862 §15.7).
    pub(crate) fn op_layoutstats(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let offset = d.u64()?;
        let length = d.u64()?;
        let sid = stateid(d)?;
        for _ in 0..4 {
            d.u64()?; // lsa_read, lsa_write (io_info4: count, bytes)
        }
        let deviceid = d.opaque_fixed::<16>()?;
        let ltype = d.u32()?;
        let body = d.opaque_var(LAYOUT_BODY_BYTES_MAX)?;
        let l = self.layouts()?;
        self.layout_type_arg(&*l, ltype)?;
        let clientid = self.clientid()?;
        let fh = self.cur_fh()?;
        check_range(offset, length)?;
        let sid = self.resolve_sid(sid)?;
        if !l.is_layout_stateid(&sid) {
            return fail(p::NFS4ERR_BAD_STATEID);
        }
        l.layoutstats(clientid, &fh, &sid, &deviceid, body).map_err(Nfs4Error)
    }
}
