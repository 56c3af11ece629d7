//! The NFSv4.2 data operations (RFC 7862): SEEK (§15.11), ALLOCATE
//! (§15.1), DEALLOCATE (§15.4), READ_PLUS (§15.10) and intra-server COPY
//! (§15.2). Holes, space and copies come from the backend (`Vfs::seek`,
//! `allocate`, `deallocate`, `copy_range`); a backend without them answers
//! NFS4ERR_NOTSUPP for SEEK, ALLOCATE, DEALLOCATE and COPY, and READ_PLUS
//! then returns the range as data, like READ.

use crate::compound::Compound;
use crate::error::{fail, Nfs4Error, OpResult};
use crate::park::Park4;
use crate::state::SHARE_WRITE;
use proto::nfs4 as p;
use proto::xdr::{pad, Decoder, Encoder, Xdr};
use vfs::{Content, FileHandle, IoDone, VfsError};

/// read_plus_res4 bytes besides the segments: eof and the segment count.
const READ_PLUS_HEAD_BYTES: usize = 8;
/// A data segment besides its bytes: content, offset, length, padding.
const DATA_SEGMENT_OVERHEAD_BYTES: usize = 4 + 8 + 4 + 3;
/// A hole segment: content, offset, length.
const HOLE_SEGMENT_BYTES: usize = 4 + 8 + 8;
/// Segments one READ_PLUS returns at most (a file alternating data and
/// holes page by page would otherwise cost a backend call per page); the
/// client asks again from where the reply stopped.
const SEGMENTS_MAX: u32 = 64;

/// A caller that cannot wait: the backend completes inline.
struct Inline;

impl vfs::Later for Inline {
    fn park(&mut self) -> Option<vfs::Done> {
        None
    }
}

impl Compound<'_> {
    /// The current regular file and the access its stateid grants, which
    /// must include writing when `write` (NFS4ERR_OPENMODE otherwise).
    fn data_file(&self, sid: &p::stateid4, write: bool) -> OpResult<FileHandle> {
        let fh = self.cur_file()?;
        let access = self.io_access(sid, &fh)?;
        if write && access & SHARE_WRITE == 0 {
            return fail(p::NFS4ERR_OPENMODE);
        }
        self.deleg_wait(&fh, write)?;
        Ok(fh)
    }

    /// SEEK (RFC 7862 §15.11): where the next data or hole starts at or
    /// after `sa_offset`. An offset at or past the end of file is
    /// NFS4ERR_NXIO; data not found before the end is NFS4_OK with sr_eof
    /// and the size; every file ends in a virtual hole.
    pub(crate) fn op_seek(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::SEEK4args::decode(d)?;
        let fh = self.data_file(&a.sa_stateid, false)?;
        let what = match a.sa_what {
            p::data_content4::NFS4_CONTENT_DATA => Content::Data,
            p::data_content4::NFS4_CONTENT_HOLE => Content::Hole,
        };
        match self.prog.vfs.seek(&fh, a.sa_offset, what)? {
            None => fail(p::NFS4ERR_NXIO),
            Some((eof, offset)) => {
                p::seek_res4 { sr_eof: eof, sr_offset: offset }.encode(e)?;
                Ok(())
            }
        }
    }

    /// ALLOCATE (RFC 7862 §15.1): reserve the range's space; the file grows
    /// when the range ends past it. All or nothing: NFS4ERR_NOSPC or
    /// NFS4ERR_DQUOT leave the file as it was.
    pub(crate) fn op_allocate(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::ALLOCATE4args::decode(d)?;
        let fh = self.data_file(&a.aa_stateid, true)?;
        check_range(a.aa_offset, a.aa_length)?;
        self.prog.vfs.allocate(&fh, a.aa_offset, a.aa_length)?;
        Ok(())
    }

    /// DEALLOCATE (RFC 7862 §15.4): the range reads as zeros from now on
    /// and its space is given back; the size does not change.
    pub(crate) fn op_deallocate(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::DEALLOCATE4args::decode(d)?;
        let fh = self.data_file(&a.da_stateid, true)?;
        check_range(a.da_offset, a.da_length)?;
        self.prog.vfs.deallocate(&fh, a.da_offset, a.da_length)?;
        Ok(())
    }

    /// READ_PLUS (RFC 7862 §15.10): READ, with holes as hole segments
    /// instead of zeros. The reply covers `[offset, offset + n)` in file
    /// order, data and holes alternating, and stops early (without eof)
    /// when the reply room or `SEGMENTS_MAX` runs out. A first data segment
    /// may park the COMPOUND like READ; the resumed reply is that one
    /// segment.
    pub(crate) fn op_read_plus(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::READ_PLUS4args::decode(d)?;
        let room = self.reply_room(e).saturating_sub(READ_PLUS_HEAD_BYTES + DATA_SEGMENT_OVERHEAD_BYTES);
        let count = (a.rpa_count as usize).min(self.prog.cfg.read_bytes_max as usize).min(room);
        if let Some(r) = self.resumed.take() {
            return read_plus_resumed(&r, a.rpa_offset, count, e);
        }
        let fh = self.data_file(&a.rpa_stateid, false)?;
        let head = e.reserve(READ_PLUS_HEAD_BYTES)?;
        let end = a.rpa_offset.saturating_add(count as u64);
        let mut pos = a.rpa_offset;
        let mut segments = 0u32;
        let mut eof = None;
        while pos < end && segments < SEGMENTS_MAX {
            let data_at = match self.prog.vfs.seek(&fh, pos, Content::Data) {
                // No holes known: the rest is data.
                Err(VfsError::NotSupported) => pos,
                Err(err) if segments == 0 => return Err(err.into()),
                Err(_) => break,
                // At or past the end of file.
                Ok(None) => break,
                Ok(Some((_, at))) => at,
            };
            if data_at > pos {
                let hole_end = data_at.min(end);
                if self.reply_room(e) < HOLE_SEGMENT_BYTES {
                    break;
                }
                e.u32(p::NFS4_CONTENT_HOLE as u32)?;
                e.u64(pos)?;
                e.u64(hole_end - pos)?;
                segments += 1;
                pos = hole_end;
                continue;
            }
            let data_end = match self.prog.vfs.seek(&fh, pos, Content::Hole) {
                Ok(Some((_, at))) if at > pos => at.min(end),
                _ => end,
            };
            let first = segments == 0;
            let Some((n, at_eof)) = self.data_segment(&fh, pos, data_end, first, e)? else {
                return Ok(()); // parked at the first segment
            };
            if n > 0 {
                segments += 1;
            }
            let short = (n as u64) < data_end - pos;
            pos += n as u64;
            if at_eof || short {
                eof = Some(at_eof);
                break;
            }
        }
        let eof = match eof {
            Some(eof) => eof,
            None => pos >= self.prog.vfs.getattr(&fh)?.size,
        };
        e.patch_u32(head, eof as u32);
        e.patch_u32(head + 4, segments);
        Ok(())
    }

    /// One data segment of `[pos, end)`, read by the backend straight into
    /// the reply (cut to the room left). `Ok(None)` when the backend parked
    /// the call (only the first segment may park).
    fn data_segment(&self, fh: &FileHandle, pos: u64, end: u64, first: bool, e: &mut Encoder<'_>) -> OpResult<Option<(usize, bool)>> {
        let room = self.reply_room(e).saturating_sub(DATA_SEGMENT_OVERHEAD_BYTES);
        let len = ((end - pos) as usize).min(room);
        if len == 0 {
            return Ok(Some((0, false)));
        }
        let seg = e.position();
        e.u32(p::NFS4_CONTENT_DATA as u32)?;
        e.u64(pos)?;
        let len_at = e.reserve(4)?;
        let (written, buf) = e.split();
        let got = if first {
            let mut later = Park4 { c: self, reply: &written[self.reply_start..] };
            self.prog.vfs.read_start(fh, pos, &mut buf[..len], &mut later)
        } else {
            self.prog.vfs.read_start(fh, pos, &mut buf[..len], &mut Inline)
        };
        let Some((n, eof)) = got? else { return Ok(None) };
        assert!(n <= len, "backend read more than asked");
        if n == 0 {
            e.truncate(seg);
            return Ok(Some((0, eof)));
        }
        let padding = pad(n);
        e.spare()[n..n + padding].fill(0);
        e.advance(n + padding);
        e.patch_u32(len_at, n as u32);
        Ok(Some((n, eof)))
    }
}

/// Bytes one COPY copies at most: it runs inline on the core, so a large
/// copy is answered short and the client (as RFC 7862 §15.2.3 allows, and
/// as Linux's copy_file_range does) asks again for the rest.
pub(crate) const COPY_BYTES_MAX: u64 = 8 << 20;

impl Compound<'_> {
    /// COPY (RFC 7862 §15.2), intra-server: the saved filehandle is the
    /// source (read stateid), the current one the destination (write
    /// stateid, NFS4ERR_OPENMODE otherwise). A copy from another server
    /// (ca_source_server) is NFS4ERR_NOTSUPP. Synchronous: one
    /// `COPY_BYTES_MAX` chunk, answered short. Asynchronous when the client
    /// allows it and has a back channel: the first chunk here, the rest on
    /// a worker (`crate::offload`), CB_OFFLOAD at the end. ca_count 0 copies
    /// to the source's end; a range past the source's end, or overlapping
    /// ranges of one file, is NFS4ERR_INVAL.
    pub(crate) fn op_copy(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::COPY4args::decode(d)?;
        if !a.ca_source_server.is_empty() {
            return fail(p::NFS4ERR_NOTSUPP);
        }
        let dst = self.data_file(&a.ca_dst_stateid, true)?;
        let (src, size) = self.copy_source(&a.ca_src_stateid)?;
        let (from, to) = (a.ca_src_offset, a.ca_dst_offset);
        let count = copy_count(from, a.ca_count, size)?;
        check_copy_ranges(&src, &dst, from, to, count)?;
        // The first chunk is copied here, so a backend without copy_range
        // says NFS4ERR_NOTSUPP now (the client then copies itself).
        let copied = if count == 0 { 0 } else { self.prog.vfs.copy_range(&src, from, &dst, to, count.min(COPY_BYTES_MAX))? };
        let mut callback_id = vec![];
        if !a.ca_synchronous && copied == COPY_BYTES_MAX && count > copied && self.cb_usable() {
            // The rest runs asynchronously; CB_OFFLOAD reports the total.
            let job = crate::offload::CopyJob {
                clientid: self.clientid()?,
                src,
                src_offset: from,
                dst,
                dst_offset: to,
                count: count.min(crate::offload::OFFLOAD_BYTES_MAX),
                chunk: COPY_BYTES_MAX,
                already: copied,
            };
            if let Some(sid) = self.prog.offloads.start(job, self.prog.vfs.clone(), self.prog.callbacks.clone()) {
                callback_id.push(crate::ops::sid_out(sid));
            }
        }
        let asynchronous = !callback_id.is_empty();
        p::COPY4resok {
            cr_response: p::write_response4 {
                wr_callback_id: callback_id,
                wr_count: if asynchronous { 0 } else { copied },
                wr_committed: p::stable_how4::FILE_SYNC4,
                wr_writeverf: self.prog.vfs.write_verifier(),
            },
            cr_requirements: p::copy_requirements4 { cr_consecutive: true, cr_synchronous: !asynchronous },
        }
        .encode(e)?;
        Ok(())
    }

    /// OFFLOAD_STATUS (RFC 7862 §15.9): bytes an asynchronous COPY into
    /// the current file has copied, and its status once it ended.
    pub(crate) fn op_offload_status(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let sid = crate::ops::sid_in(&p::stateid4::decode(d)?);
        let dst = self.cur_fh()?;
        let clientid = self.clientid()?;
        let pr = self.prog.offloads.status(clientid, &sid, &dst).ok_or(Nfs4Error(p::NFS4ERR_BAD_STATEID))?;
        e.u64(pr.copied)?;
        match pr.complete {
            Some(st) => {
                e.u32(1)?;
                e.i32(st)?;
            }
            None => e.u32(0)?,
        }
        Ok(())
    }

    /// OFFLOAD_CANCEL (RFC 7862 §15.8): stop an asynchronous COPY into the
    /// current file (between chunks; what was copied stays).
    pub(crate) fn op_offload_cancel(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let sid = crate::ops::sid_in(&p::stateid4::decode(d)?);
        let dst = self.cur_fh()?;
        let clientid = self.clientid()?;
        if !self.prog.offloads.cancel(clientid, &sid, &dst) {
            return fail(p::NFS4ERR_BAD_STATEID);
        }
        Ok(())
    }
}

impl Compound<'_> {
    /// CLONE (RFC 7862 §15.13): the destination range (current
    /// filehandle, write stateid) becomes a clone of the source's (saved
    /// filehandle, read stateid) — memfs shares the buffers, copy on
    /// write. All or nothing; offsets (and the count, unless it ends both
    /// files) aligned to clone_blksize, else NFS4ERR_INVAL, as are a range
    /// past the source's end and overlapping ranges of one file. cl_count 0
    /// clones to the source's end.
    pub(crate) fn op_clone(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::CLONE4args::decode(d)?;
        let dst = self.data_file(&a.cl_dst_stateid, true)?;
        let (src, size) = self.copy_source(&a.cl_src_stateid)?;
        let (from, to) = (a.cl_src_offset, a.cl_dst_offset);
        let count = copy_count(from, a.cl_count, size)?;
        check_copy_ranges(&src, &dst, from, to, count)?;
        if count > 0 {
            self.prog.vfs.clone_range(&src, from, &dst, to, count)?;
        }
        Ok(())
    }

    /// The saved filehandle as a COPY / CLONE source, its stateid checked
    /// (the current stateid stands for the saved one), and its size.
    fn copy_source(&self, sid: &p::stateid4) -> OpResult<(vfs::FileHandle, u64)> {
        let src = self.saved_fh()?;
        let a = self.prog.vfs.getattr(&src)?;
        match a.ftype {
            vfs::FileType::Regular => {}
            vfs::FileType::Directory => return fail(p::NFS4ERR_ISDIR),
            _ => return fail(p::NFS4ERR_INVAL),
        }
        let sid = match crate::ops::sid_in(sid) {
            s if s == crate::state::Stateid::CURRENT => self.saved_sid.ok_or(Nfs4Error(p::NFS4ERR_BAD_STATEID))?,
            s => s,
        };
        let clientid = self.seq.map(|s| s.clientid);
        self.prog.state().check_io(clientid, &sid, &src, self.now_ms)?;
        self.deleg_wait(&src, false)?;
        Ok((src, a.size))
    }
}

/// The bytes a COPY / CLONE of `count` from `from` covers in a source of
/// `size` bytes (0: to its end); NFS4ERR_INVAL past the end.
fn copy_count(from: u64, count: u64, size: u64) -> OpResult<u64> {
    match count {
        0 if from <= size => Ok(size - from),
        n if from.checked_add(n).is_some_and(|end| end <= size) => Ok(n),
        _ => fail(p::NFS4ERR_INVAL),
    }
}

/// Overlapping ranges of one file are NFS4ERR_INVAL; a destination range
/// past 2^63 NFS4ERR_FBIG.
fn check_copy_ranges(src: &vfs::FileHandle, dst: &vfs::FileHandle, from: u64, to: u64, count: u64) -> OpResult {
    if src == dst && from.max(to) < from.min(to).saturating_add(count) {
        return fail(p::NFS4ERR_INVAL);
    }
    if to.checked_add(count).is_none_or(|end| end > i64::MAX as u64) {
        return fail(p::NFS4ERR_FBIG);
    }
    Ok(())
}

/// offset + length must not wrap (RFC 7862 §15.1.3, §15.4.3: NFS4ERR_INVAL
/// for a zero length, NFS4ERR_FBIG past the largest offset).
fn check_range(offset: u64, length: u64) -> OpResult {
    if length == 0 {
        return fail(p::NFS4ERR_INVAL);
    }
    if offset.checked_add(length).is_none_or(|end| end > i64::MAX as u64) {
        return fail(p::NFS4ERR_FBIG);
    }
    Ok(())
}

/// A parked READ_PLUS's data came back: one data segment at `offset`.
fn read_plus_resumed(r: &rpc::park::Resumed<'_>, offset: u64, count: usize, e: &mut Encoder<'_>) -> OpResult {
    let (data, eof) = match vfs::io_done(r.payload)? {
        IoDone::Read { data, eof } if data.len() <= count => (data, *eof),
        _ => return fail(p::NFS4ERR_IO),
    };
    e.bool(eof)?;
    if data.is_empty() {
        e.u32(0)?;
        return Ok(());
    }
    e.u32(1)?;
    e.u32(p::NFS4_CONTENT_DATA as u32)?;
    e.u64(offset)?;
    e.opaque_var(data)?;
    Ok(())
}
