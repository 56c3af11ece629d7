//! A COMPOUND parked at one operation (see `rpc::park`): what it needs to
//! go on when the backend's completion comes back — its position (the
//! operation's index and where its op number sits in the arguments), the
//! current and saved filehandles and stateids, the SEQUENCE it holds (its
//! slot stays busy while parked: a retransmission gets NFS4ERR_DELAY), where
//! a READ before the park left its data (an RDMA reply places it by Write
//! chunk), and the reply written so far (header, tag and the earlier operations'
//! results). The COMPOUND resumes by re-decoding the parked operation,
//! which takes the completion instead of calling the backend, then
//! evaluates the remaining operations as usual.

use crate::compound::{Compound, Seq};
use crate::state::Stateid;
use vfs::FileHandle;

const MAGIC: u32 = 0x4e34_5031; // "N4P1"
/// Reply bytes a COMPOUND may carry into a park (the results before the
/// parked operation); a longer one completes inline instead.
pub(crate) const SAVED_REPLY_BYTES_MAX: usize = 64 << 10;

/// Where the parked operation is, besides what `Compound` holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpAt {
    pub index: u32,
    /// Offset in the COMPOUND arguments of the operation's number.
    pub args_pos: usize,
    /// Offset in the reply (from the COMPOUND4res start) of its result.
    pub reply_pos: usize,
    /// Offset (from the COMPOUND4res start) of the result count.
    pub count_pos: usize,
}

/// A decoded park state.
pub(crate) struct Saved<'s> {
    pub at: OpAt,
    pub cur: Option<FileHandle>,
    pub saved: Option<FileHandle>,
    pub cur_sid: Option<Stateid>,
    pub saved_sid: Option<Stateid>,
    pub seq: Option<Seq>,
    /// Where a READ before the park left its data (`Compound::ddp`).
    pub ddp: Option<(usize, usize)>,
    /// The reply from the COMPOUND4res start up to the parked operation.
    pub reply: &'s [u8],
}

struct W(Vec<u8>);

impl W {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    fn fh(&mut self, f: &Option<FileHandle>) {
        match f {
            Some(f) => {
                self.u32(1);
                self.bytes(&f.to_bytes());
            }
            None => self.u32(0),
        }
    }
    fn sid(&mut self, s: &Option<Stateid>) {
        match s {
            Some(s) => {
                self.u32(1);
                self.u32(s.seqid);
                self.bytes(&s.other);
            }
            None => self.u32(0),
        }
    }
}

/// The state `Parking::park` keeps for `c` parked at `at`; `reply` is the
/// reply from the COMPOUND4res start up to the operation.
pub(crate) fn pack(c: &Compound<'_>, at: OpAt, reply: &[u8]) -> Vec<u8> {
    debug_assert_eq!(reply.len(), at.reply_pos);
    let mut w = W(Vec::with_capacity(256 + reply.len()));
    w.u32(MAGIC);
    w.u32(at.index);
    w.u64(at.args_pos as u64);
    w.u64(at.reply_pos as u64);
    w.u64(at.count_pos as u64);
    w.fh(&c.cur);
    w.fh(&c.saved);
    w.sid(&c.cur_sid);
    w.sid(&c.saved_sid);
    match &c.seq {
        Some(s) => {
            w.u32(1);
            w.bytes(&s.session);
            w.u32(s.slot);
            w.u64(s.clientid);
            w.u32(s.cachethis as u32);
            w.u64(s.response_bytes_max as u64);
            w.u64(s.response_cached_bytes_max as u64);
        }
        None => w.u32(0),
    }
    match c.ddp {
        Some((pos, len)) => {
            w.u32(1);
            w.u64(pos as u64);
            w.u64(len as u64);
        }
        None => w.u32(0),
    }
    w.bytes(reply);
    w.0
}

/// The operation index of a COMPOUND parked after its last operation,
/// waiting only for its changes to be flushed (`compound::when_durable`);
/// no operation has this index (`i < numops <= u32::MAX`).
pub(crate) const DURABLE: u32 = u32::MAX;

/// The operation index of a COMPOUND that runs from one of its operations
/// to its end on a worker (`compound::offload`): its reply comes whole as
/// the completion. No operation has this index either: a COMPOUND's
/// operations take 4 bytes each of a record bounded far below 2^34.
pub(crate) const OFFLOADED: u32 = u32::MAX - 1;

/// The state of a finished COMPOUND (`reply`: all of it) parked until its
/// changes are durable.
pub(crate) fn pack_durable(c: &Compound<'_>, reply: &[u8]) -> Vec<u8> {
    pack(c, OpAt { index: DURABLE, args_pos: 0, reply_pos: reply.len(), count_pos: 0 }, reply)
}

struct R<'s> {
    b: &'s [u8],
    at: usize,
}

impl<'s> R<'s> {
    fn take(&mut self, n: usize) -> Option<&'s [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn present(&mut self) -> Option<bool> {
        match self.u32()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
    fn fh(&mut self) -> Option<Option<FileHandle>> {
        if !self.present()? {
            return Some(None);
        }
        FileHandle::from_bytes(self.take(vfs::HANDLE_LEN)?).ok().map(Some)
    }
    fn sid(&mut self) -> Option<Option<Stateid>> {
        if !self.present()? {
            return Some(None);
        }
        let seqid = self.u32()?;
        let other = self.take(12)?.try_into().ok()?;
        Some(Some(Stateid { seqid, other }))
    }
}

/// Decode what `pack` wrote (`None`: not a park state of ours).
pub(crate) fn unpack(b: &[u8]) -> Option<Saved<'_>> {
    let mut r = R { b, at: 0 };
    if r.u32()? != MAGIC {
        return None;
    }
    let index = r.u32()?;
    let args_pos = r.u64()? as usize;
    let reply_pos = r.u64()? as usize;
    let count_pos = r.u64()? as usize;
    let cur = r.fh()?;
    let saved = r.fh()?;
    let cur_sid = r.sid()?;
    let saved_sid = r.sid()?;
    let seq = if r.present()? {
        Some(Seq {
            session: r.take(16)?.try_into().ok()?,
            slot: r.u32()?,
            clientid: r.u64()?,
            cachethis: r.u32()? != 0,
            response_bytes_max: r.u64()? as usize,
            response_cached_bytes_max: r.u64()? as usize,
        })
    } else {
        None
    };
    let ddp = if r.present()? { Some((r.u64()? as usize, r.u64()? as usize)) } else { None };
    let reply = &b[r.at..];
    if reply.len() != reply_pos || count_pos + 4 > reply_pos {
        return None;
    }
    if ddp.is_some_and(|(pos, len)| pos.checked_add(len).is_none_or(|end| end > reply_pos)) {
        return None;
    }
    Some(Saved { at: OpAt { index, args_pos, reply_pos, count_pos }, cur, saved, cur_sid, saved_sid, seq, ddp, reply })
}

/// Parks the COMPOUND at its current operation when the backend must wait.
pub(crate) struct Park4<'c, 'p> {
    pub c: &'c Compound<'p>,
    /// The reply from the COMPOUND4res start on (at least up to the
    /// current operation's result).
    pub reply: &'c [u8],
}

impl vfs::Later for Park4<'_, '_> {
    fn park(&mut self) -> Option<vfs::Done> {
        let parking = self.c.park?;
        let at = self.c.op_at?;
        if at.reply_pos > SAVED_REPLY_BYTES_MAX || self.reply.len() < at.reply_pos {
            return None;
        }
        let state = pack(self.c, at, &self.reply[..at.reply_pos]);
        let ticket = parking.park(&state)?;
        Some(vfs::done_as_payload(move |p| ticket.complete(p)))
    }
}
