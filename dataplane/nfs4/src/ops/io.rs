//! READ, WRITE, COMMIT (RFC 8881 §18.22, §18.32, §18.3): the data path.
//! Payloads never pass through generated types on the way out: READ data is
//! read by the backend straight into the reply buffer; WRITE data is a slice
//! of the request buffer handed to the backend.

use crate::compound::Compound;
use crate::error::{fail, OpResult};
use crate::ops::sid_in;
use crate::state::SHARE_WRITE;
use proto::nfs4 as p;
use proto::xdr::{pad, Decoder, Encoder, Xdr};
use crate::park::Park4;
use vfs::{FileHandle, FileType, IoDone, Stability};

/// READ4resok bytes besides the data: eof, length, up to 3 bytes of padding.
const READ_RESOK_OVERHEAD_BYTES: usize = 12;

impl Compound<'_> {
    /// Validate `sid` for I/O on `fh` and return the access its open allows.
    pub(super) fn io_access(&self, sid: &p::stateid4, fh: &FileHandle) -> OpResult<u32> {
        let sid = self.resolve_sid(sid_in(sid))?;
        let clientid = self.seq.map(|s| s.clientid);
        let v = self.prog.state().check_io(clientid, &sid, fh, self.now_ms)?;
        Ok(v.access)
    }

    /// The current filehandle, which must be a regular file (§18.22.4:
    /// NFS4ERR_ISDIR for a directory, NFS4ERR_INVAL otherwise).
    pub(super) fn cur_file(&self) -> OpResult<FileHandle> {
        let fh = self.cur_fh()?;
        let a = self.prog.vfs.getattr(&fh)?;
        match a.ftype {
            FileType::Regular => Ok(fh),
            FileType::Directory => fail(p::NFS4ERR_ISDIR),
            FileType::Symlink => fail(p::NFS4ERR_SYMLINK),
            _ => fail(p::NFS4ERR_INVAL),
        }
    }

    /// READ (RFC 8881 §18.22). Any open of the file allows reading (as
    /// Linux's server does: a write-only open may read back what it wrote).
    /// A backend that must wait parks the COMPOUND here (`crate::park`).
    pub(crate) fn op_read(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::READ4args::decode(d)?;
        let room = self.reply_room(e).saturating_sub(READ_RESOK_OVERHEAD_BYTES);
        let count = (a.count as usize).min(self.prog.cfg.read_bytes_max as usize).min(room);
        if let Some(r) = self.resumed.take() {
            let (head, n) = read_resumed(&r, count, e)?;
            self.mark_ddp(head + 8, n);
            return Ok(());
        }
        let fh = self.cur_file()?;
        self.io_access(&a.stateid, &fh)?;
        self.deleg_wait(&fh, false)?;
        let head = e.reserve(8)?;
        let (written, buf) = e.split();
        let mut later = Park4 { c: self, reply: &written[self.reply_start..] };
        let Some((n, eof)) = self.prog.vfs.read_start(&fh, a.offset, &mut buf[..count], &mut later)? else {
            return Ok(()); // parked
        };
        assert!(n <= count, "backend read more than asked");
        read_ok(e, head, n, eof);
        self.mark_ddp(head + 8, n);
        Ok(())
    }

    /// WRITE (RFC 8881 §18.32).
    pub(crate) fn op_write(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::WRITE4args::decode(d)?;
        if let Some(r) = self.resumed.take() {
            // Parked after every check passed; the write is done.
            return match vfs::io_done(r.payload)? {
                IoDone::Write { count, committed, .. } => self.write_ok(*count, *committed, e),
                _ => fail(p::NFS4ERR_IO),
            };
        }
        let fh = self.cur_file()?;
        if a.data.len() > self.prog.cfg.write_bytes_max as usize {
            return fail(p::NFS4ERR_INVAL);
        }
        if self.io_access(&a.stateid, &fh)? & SHARE_WRITE == 0 {
            return fail(p::NFS4ERR_OPENMODE);
        }
        self.deleg_wait(&fh, true)?;
        let stable = match a.stable {
            p::stable_how4::UNSTABLE4 => Stability::Unstable,
            p::stable_how4::DATA_SYNC4 => Stability::DataSync,
            p::stable_how4::FILE_SYNC4 => Stability::FileSync,
        };
        let mut later = Park4 { c: self, reply: &e.written()[self.reply_start..] };
        let Some((n, done, _)) = self.prog.vfs.write_start(&fh, a.offset, a.data, stable, &mut later)? else {
            return Ok(()); // parked
        };
        self.write_ok(n, done, e)
    }

    fn write_ok(&self, n: usize, done: Stability, e: &mut Encoder<'_>) -> OpResult {
        let committed = match done {
            Stability::Unstable => p::stable_how4::UNSTABLE4,
            Stability::DataSync => p::stable_how4::DATA_SYNC4,
            Stability::FileSync => p::stable_how4::FILE_SYNC4,
        };
        p::WRITE4resok { count: n as u32, committed, writeverf: self.prog.vfs.write_verifier() }.encode(e)?;
        Ok(())
    }

    /// COMMIT (RFC 8881 §18.3).
    pub(crate) fn op_commit(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::COMMIT4args::decode(d)?;
        let fh = self.cur_file()?;
        if a.count != 0 && a.offset.checked_add(a.count as u64).is_none() {
            return fail(p::NFS4ERR_INVAL);
        }
        if let Some(r) = self.resumed.take() {
            match vfs::io_done(r.payload)? {
                IoDone::Commit => {}
                _ => return fail(p::NFS4ERR_IO),
            }
        } else {
            let mut later = Park4 { c: self, reply: &e.written()[self.reply_start..] };
            if self.prog.vfs.commit_start(&fh, a.offset, a.count as u64, &mut later)?.is_none() {
                return Ok(()); // parked
            }
        }
        p::COMMIT4resok { writeverf: self.prog.vfs.write_verifier() }.encode(e)?;
        Ok(())
    }
}

/// A parked READ's data came back: answer it as an inline READ would.
/// Where its data lies: (the reserved words' position, data bytes).
fn read_resumed(r: &rpc::park::Resumed<'_>, count: usize, e: &mut Encoder<'_>) -> OpResult<(usize, usize)> {
    let (data, eof) = match vfs::io_done(r.payload)? {
        IoDone::Read { data, eof } if data.len() <= count => (data, *eof),
        _ => return fail(p::NFS4ERR_IO),
    };
    let head = e.reserve(8)?;
    let n = data.len();
    let padding = pad(n);
    let buf = e.spare();
    if buf.len() < n + padding {
        return fail(p::NFS4ERR_REP_TOO_BIG);
    }
    buf[..n].copy_from_slice(data);
    read_ok(e, head, n, eof);
    Ok((head, n))
}

/// A READ4resok whose `n` data bytes are already in place after the
/// reserved eof/length words at `head`: pad them and fill the words.
fn read_ok(e: &mut Encoder<'_>, head: usize, n: usize, eof: bool) {
    let padding = pad(n);
    e.spare()[n..n + padding].fill(0);
    e.advance(n + padding);
    e.patch_u32(head, eof as u32);
    e.patch_u32(head + 4, n as u32);
}
