//! RPC-over-RDMA version 1 (RFC 8166) transport headers and the connection
//! private data of RFC 8797, decoded and encoded without allocation. Pure
//! functions over byte slices: the transport (`server`) and the tests both
//! use them.
//!
//! A header is `xid, vers, credit, proc`, then for RDMA_MSG / RDMA_NOMSG the
//! three chunk lists: the Read list (segments with an XDR position; the
//! segments of one position form one chunk), the Write list (chunks of
//! segments) and the optional Reply chunk. Every list is bounded here
//! (`SEGMENTS_MAX`, `WRITE_CHUNKS_MAX`): a header over a bound is an
//! ERR_CHUNK, never an allocation.

/// The one version spoken.
pub const VERSION: u32 = 1;
pub const RDMA_MSG: u32 = 0;
pub const RDMA_NOMSG: u32 = 1;
pub const RDMA_MSGP: u32 = 2;
pub const RDMA_DONE: u32 = 3;
pub const RDMA_ERROR: u32 = 4;
pub const ERR_VERS: u32 = 1;
pub const ERR_CHUNK: u32 = 2;

/// Most segments in the Read list, in one Write chunk, or in the Reply
/// chunk. The Linux client registers a 1 MiB payload as one segment (FRWR)
/// and never sends more than a handful.
pub const SEGMENTS_MAX: usize = 16;
/// Most Write chunks in one call (only the first carries a data item).
pub const WRITE_CHUNKS_MAX: usize = 4;
/// Bytes of a header with empty chunk lists (xid, vers, credit, proc, three
/// absent lists).
pub const HEADER_MIN: usize = 28;

/// One RDMA segment: a registered region of the requester's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Segment {
    pub handle: u32,
    pub length: u32,
    pub offset: u64,
}

/// A fixed-capacity list of segments.
#[derive(Debug, Clone, Copy, Default)]
pub struct Segments {
    pub n: usize,
    pub seg: [Segment; SEGMENTS_MAX],
}

impl Segments {
    pub fn as_slice(&self) -> &[Segment] {
        &self.seg[..self.n]
    }
    /// Bytes the segments can hold (saturating).
    pub fn capacity(&self) -> u64 {
        self.as_slice().iter().map(|s| s.length as u64).sum()
    }
    fn push(&mut self, s: Segment) -> Result<(), ()> {
        if self.n == SEGMENTS_MAX {
            return Err(());
        }
        self.seg[self.n] = s;
        self.n += 1;
        Ok(())
    }
}

/// A decoded RDMA_MSG or RDMA_NOMSG header.
#[derive(Debug, Clone, Copy, Default)]
pub struct Header {
    pub xid: u32,
    pub credit: u32,
    pub proc_: u32,
    /// Read list: the (one) position its segments share and the segments.
    pub read_position: u32,
    pub reads: Segments,
    /// The first Write chunk (the one a reply's data item may use) and how
    /// many Write chunks the call carried in all.
    pub write: Segments,
    pub write_chunks: usize,
    pub reply: Option<Segments>,
    /// Header bytes; an RDMA_MSG's RPC message follows.
    pub len: usize,
}

impl Header {
    /// The registration a reply may invalidate for the client with Send
    /// With Invalidate (RFC 8797 §4.2, when the client said it accepts it):
    /// the handle every segment of every chunk of the call names, when they
    /// all name one. `None` for a call without chunks, with segments of
    /// several handles, or with Write chunks past the first (their handles
    /// are not kept).
    pub fn invalidate_rkey(&self) -> Option<u32> {
        if self.write_chunks > 1 {
            return None;
        }
        let reply = self.reply.as_ref().map_or(&[][..], |r| r.as_slice());
        let mut handles = self.reads.as_slice().iter().chain(self.write.as_slice()).chain(reply).map(|s| s.handle);
        let first = handles.next()?;
        handles.all(|h| h == first).then_some(first)
    }
}

/// What a received transport message is.
#[derive(Debug, Clone, Copy)]
pub enum Message {
    Call(Header),
    /// RDMA_DONE (deprecated; nothing to do).
    Done,
}

/// Why a transport header is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Too short to hold an xid and version: close the connection.
    Garbage,
    /// Not version 1: answer RDMA_ERROR / ERR_VERS.
    Version { xid: u32 },
    /// A malformed or over-limit chunk list, a deprecated or unknown
    /// procedure: answer RDMA_ERROR / ERR_CHUNK.
    Chunk { xid: u32, why: &'static str },
    /// The peer sent RDMA_ERROR: it gave up on us; close.
    PeerError { xid: u32 },
}

struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl Rd<'_> {
    fn u32(&mut self) -> Option<u32> {
        let v = self.b.get(self.at..self.at + 4)?;
        self.at += 4;
        Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let hi = self.u32()? as u64;
        Some(hi << 32 | self.u32()? as u64)
    }
    fn segment(&mut self) -> Option<Segment> {
        Some(Segment { handle: self.u32()?, length: self.u32()?, offset: self.u64()? })
    }
    /// An XDR optional-data discriminator: 0 or 1, anything else refused.
    fn present(&mut self) -> Option<Option<bool>> {
        match self.u32()? {
            0 => Some(Some(false)),
            1 => Some(Some(true)),
            _ => Some(None),
        }
    }
}

/// Decode a received message's transport header.
pub fn parse(b: &[u8]) -> Result<Message, Refused> {
    let mut r = Rd { b, at: 0 };
    let (Some(xid), Some(vers)) = (r.u32(), r.u32()) else { return Err(Refused::Garbage) };
    if vers != VERSION {
        return Err(Refused::Version { xid });
    }
    let chunk = |why| Refused::Chunk { xid, why };
    let (Some(credit), Some(proc_)) = (r.u32(), r.u32()) else { return Err(chunk("header shorter than 16 bytes")) };
    match proc_ {
        RDMA_MSG | RDMA_NOMSG => {}
        RDMA_DONE => return Ok(Message::Done),
        RDMA_ERROR => return Err(Refused::PeerError { xid }),
        RDMA_MSGP => return Err(chunk("RDMA_MSGP is deprecated (RFC 8166 section 4.5)")),
        _ => return Err(chunk("unknown procedure")),
    }
    let mut h = Header { xid, credit, proc_, ..Default::default() };
    let short = chunk("chunk lists run past the message");
    // Read list.
    loop {
        match r.present().ok_or(short)? {
            None => return Err(chunk("read list discriminator is not 0 or 1")),
            Some(false) => break,
            Some(true) => {}
        }
        let position = r.u32().ok_or(short)?;
        let seg = r.segment().ok_or(short)?;
        if h.reads.n > 0 && position != h.read_position {
            return Err(chunk("read segments at more than one position"));
        }
        h.read_position = position;
        h.reads.push(seg).map_err(|_| chunk("more read segments than SEGMENTS_MAX"))?;
    }
    // Write list.
    loop {
        match r.present().ok_or(short)? {
            None => return Err(chunk("write list discriminator is not 0 or 1")),
            Some(false) => break,
            Some(true) => {}
        }
        let n = r.u32().ok_or(short)? as usize;
        if n > SEGMENTS_MAX {
            return Err(chunk("a write chunk with more segments than SEGMENTS_MAX"));
        }
        if h.write_chunks == WRITE_CHUNKS_MAX {
            return Err(chunk("more write chunks than WRITE_CHUNKS_MAX"));
        }
        for _ in 0..n {
            let s = r.segment().ok_or(short)?;
            if h.write_chunks == 0 {
                let _ = h.write.push(s);
            }
        }
        h.write_chunks += 1;
    }
    // Reply chunk.
    match r.present().ok_or(short)? {
        None => return Err(chunk("reply chunk discriminator is not 0 or 1")),
        Some(false) => {}
        Some(true) => {
            let n = r.u32().ok_or(short)? as usize;
            if n > SEGMENTS_MAX {
                return Err(chunk("a reply chunk with more segments than SEGMENTS_MAX"));
            }
            let mut s = Segments::default();
            for _ in 0..n {
                let _ = s.push(r.segment().ok_or(short)?);
            }
            h.reply = Some(s);
        }
    }
    h.len = r.at;
    Ok(Message::Call(h))
}

/// XDR round-up of `n` bytes.
pub fn pad(n: usize) -> usize {
    (4 - n % 4) % 4
}

/// Where a call's RPC message comes from once its Read chunk is pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The message is the inline body (no Read chunk).
    Inline,
    /// A position-zero Read chunk of `len` bytes is the whole message
    /// (RDMA_NOMSG; no inline body).
    Whole { len: usize },
    /// Inline bytes up to `position`, then the chunk's `len` bytes and their
    /// XDR round-up (zeros; never transmitted), then the rest of the inline
    /// body: `total` bytes in all.
    Spliced { position: usize, len: usize, total: usize },
}

/// Check a call's Read list against its inline body and the record limit.
pub fn layout(h: &Header, inline_len: usize, record_max: usize) -> Result<Layout, &'static str> {
    if h.reads.n == 0 {
        if h.proc_ == RDMA_NOMSG {
            return Err("RDMA_NOMSG without a position-zero read chunk");
        }
        return Ok(Layout::Inline);
    }
    let len = h.reads.capacity();
    if len > record_max as u64 {
        return Err("read chunk larger than the record limit");
    }
    let len = len as usize;
    let position = h.read_position as usize;
    if position == 0 {
        if h.proc_ != RDMA_NOMSG || inline_len != 0 {
            return Err("a position-zero read chunk needs RDMA_NOMSG and no inline body");
        }
        return Ok(Layout::Whole { len });
    }
    if h.proc_ != RDMA_MSG {
        return Err("RDMA_NOMSG with a read chunk not at position zero");
    }
    if position % 4 != 0 || position > inline_len {
        return Err("read chunk position outside the inline body or not XDR-aligned");
    }
    let total = inline_len + len + pad(len);
    if total > record_max {
        return Err("call larger than the record limit once its read chunk is pulled");
    }
    Ok(Layout::Spliced { position, len, total })
}

struct Wr<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl Wr<'_> {
    fn u32(&mut self, v: u32) {
        self.b[self.at..self.at + 4].copy_from_slice(&v.to_be_bytes());
        self.at += 4;
    }
    fn segment(&mut self, s: &Segment, len: u32) {
        self.u32(s.handle);
        self.u32(len);
        self.u32((s.offset >> 32) as u32);
        self.u32(s.offset as u32);
    }
    /// A chunk's segments with `written` bytes spread over them in order.
    fn chunk(&mut self, segs: &[Segment], mut written: u64) {
        self.u32(segs.len() as u32);
        for s in segs {
            let n = written.min(s.length as u64);
            written -= n;
            self.segment(s, n as u32);
        }
    }
}

/// Bytes a reply header takes (see `encode_reply`).
pub fn reply_header_len(write: Option<&[Segment]>, reply: Option<&[Segment]>) -> usize {
    HEADER_MIN + write.map_or(0, |w| 8 + 16 * w.len()) + reply.map_or(0, |r| 4 + 16 * r.len())
}

/// Encode a reply's transport header into `out` (at least
/// `reply_header_len` bytes): RDMA_MSG (the message follows inline) or
/// RDMA_NOMSG (it went into the Reply chunk), the Write chunk with the
/// bytes written into it, the Reply chunk with the bytes written. Returns
/// the header length.
pub fn encode_reply(
    out: &mut [u8],
    xid: u32,
    credit: u32,
    nomsg: bool,
    write: Option<(&[Segment], u64)>,
    reply: Option<(&[Segment], u64)>,
) -> usize {
    let mut w = Wr { b: out, at: 0 };
    w.u32(xid);
    w.u32(VERSION);
    w.u32(credit);
    w.u32(if nomsg { RDMA_NOMSG } else { RDMA_MSG });
    w.u32(0); // no read list
    if let Some((segs, n)) = write {
        w.u32(1);
        w.chunk(segs, n);
    }
    w.u32(0); // end of the write list
    match reply {
        Some((segs, n)) => {
            w.u32(1);
            w.chunk(segs, n);
        }
        None => w.u32(0),
    }
    w.at
}

/// Encode a call's transport header into `out` (requester side): RDMA_MSG
/// (the RPC message follows inline), or RDMA_NOMSG with `pzrc`, a
/// position-zero Read chunk of one segment holding the whole message; no
/// Write chunk; `reply`, one segment offered as the Reply chunk. Returns
/// the header length (at most `HEADER_MIN + 44`).
pub fn encode_call(out: &mut [u8], xid: u32, credit: u32, pzrc: Option<Segment>, reply: Option<Segment>) -> usize {
    let mut w = Wr { b: out, at: 0 };
    w.u32(xid);
    w.u32(VERSION);
    w.u32(credit);
    w.u32(if pzrc.is_some() { RDMA_NOMSG } else { RDMA_MSG });
    if let Some(s) = pzrc {
        w.u32(1);
        w.u32(0); // position zero
        w.segment(&s, s.length);
    }
    w.u32(0); // end of the read list
    w.u32(0); // no write list
    match reply {
        Some(s) => {
            w.u32(1);
            w.chunk(&[s], s.length as u64);
        }
        None => w.u32(0),
    }
    w.at
}

/// Encode an RDMA_ERROR (ERR_VERS carries the version range: 1..1).
pub fn encode_error(out: &mut [u8; 28], xid: u32, credit: u32, err: u32) -> usize {
    let mut w = Wr { b: out, at: 0 };
    w.u32(xid);
    w.u32(VERSION);
    w.u32(credit);
    w.u32(RDMA_ERROR);
    w.u32(err);
    if err == ERR_VERS {
        w.u32(VERSION);
        w.u32(VERSION);
    }
    w.at
}

/// RFC 8797 connection private data.
pub const PRIVATE_MAGIC: u32 = 0xf6ab_0e18;
/// Inline threshold when the peer sends no private data (RFC 8166 §3.3.3).
pub const INLINE_DEFAULT: u32 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Private {
    /// Largest message the sender will send inline (its send threshold).
    pub send: u32,
    /// Largest message the sender can receive inline.
    pub recv: u32,
    /// The sender accepts Send With Invalidate.
    pub remote_invalidate: bool,
}

impl Private {
    /// Decode a peer's private data; `None` (use `INLINE_DEFAULT`) when it
    /// is absent or not ours.
    pub fn decode(b: &[u8]) -> Option<Private> {
        if b.len() < 8 || u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != PRIVATE_MAGIC || b[4] != 1 {
            return None;
        }
        Some(Private { remote_invalidate: b[5] & 1 != 0, send: (b[6] as u32 + 1) * 1024, recv: (b[7] as u32 + 1) * 1024 })
    }

    /// Encode (sizes round down to KiB, 1..=256 KiB).
    pub fn encode(&self) -> [u8; 8] {
        let kib = |n: u32| ((n / 1024).clamp(1, 256) - 1) as u8;
        let m = PRIVATE_MAGIC.to_be_bytes();
        [m[0], m[1], m[2], m[3], 1, self.remote_invalidate as u8, kib(self.send), kib(self.recv)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_header_encodes_as_the_server_parses_it() {
        let body = Segment { handle: 7, length: 65536, offset: 0x1_0000_2000 };
        let mut b = [0u8; 128];
        let n = encode_call(&mut b, 0x55, 32, None, Some(body));
        assert_eq!(n, HEADER_MIN + 20);
        let Ok(Message::Call(h)) = parse(&b[..n]) else { panic!("inline call refused") };
        assert_eq!((h.xid, h.credit, h.proc_, h.reads.n, h.write_chunks, h.len), (0x55, 32, RDMA_MSG, 0, 0, n));
        assert_eq!(h.reply.unwrap().as_slice(), &[body]);
        assert_eq!(layout(&h, 100, 1 << 20), Ok(Layout::Inline));
        // The whole message in a position-zero Read chunk.
        let n = encode_call(&mut b, 0x56, 32, Some(Segment { length: 5000, ..body }), Some(body));
        assert_eq!(n, HEADER_MIN + 44);
        let Ok(Message::Call(h)) = parse(&b[..n]) else { panic!("RDMA_NOMSG call refused") };
        assert_eq!((h.proc_, h.read_position, h.reads.as_slice()), (RDMA_NOMSG, 0, &[Segment { length: 5000, ..body }][..]));
        assert_eq!(layout(&h, 0, 1 << 20), Ok(Layout::Whole { len: 5000 }));
        assert_eq!(layout(&h, 0, 4096), Err("read chunk larger than the record limit"));
        // A back-channel reply: no chunks at all.
        let n = encode_call(&mut b, 0x57, 1, None, None);
        let Ok(Message::Call(h)) = parse(&b[..n]) else { panic!("reply header refused") };
        assert_eq!((n, h.reply.is_none(), h.reads.n), (HEADER_MIN, true, 0));
    }

    #[test]
    fn the_rkey_a_reply_may_invalidate_is_the_one_all_chunks_share() {
        let seg = |handle| Segment { handle, length: 4096, offset: 0 };
        let list = |hs: &[u32]| {
            let mut l = Segments::default();
            for &h in hs {
                l.seg[l.n] = seg(h);
                l.n += 1;
            }
            l
        };
        let mut h = Header { xid: 1, credit: 1, proc_: 0, read_position: 0, reads: Segments::default(), write: Segments::default(), write_chunks: 0, reply: None, len: 28 };
        assert_eq!(h.invalidate_rkey(), None, "no chunks, nothing to invalidate");
        h.write = list(&[7, 7]);
        h.write_chunks = 1;
        assert_eq!(h.invalidate_rkey(), Some(7));
        h.reply = Some(list(&[7]));
        assert_eq!(h.invalidate_rkey(), Some(7));
        h.reply = Some(list(&[8]));
        assert_eq!(h.invalidate_rkey(), None, "two registrations: neither is invalidated");
        h.reply = None;
        h.write_chunks = 2;
        assert_eq!(h.invalidate_rkey(), None, "a second Write chunk's handles are unknown");
        h.write_chunks = 0;
        h.write = Segments::default();
        h.reads = list(&[9]);
        assert_eq!(h.invalidate_rkey(), Some(9));
    }

    fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|v| v.to_be_bytes()).collect()
    }

    fn call(h: &[u32]) -> Header {
        match parse(&words(h)).unwrap() {
            Message::Call(h) => h,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn plain_message() {
        let h = call(&[7, 1, 32, RDMA_MSG, 0, 0, 0]);
        assert_eq!((h.xid, h.credit, h.len, h.reads.n, h.write_chunks), (7, 32, 28, 0, 0));
        assert!(h.reply.is_none());
        assert_eq!(layout(&h, 100, 4096), Ok(Layout::Inline));
    }

    #[test]
    fn read_write_and_reply_chunks() {
        // A WRITE-like call: one read chunk of two segments at position 120.
        let h = call(&[9, 1, 8, RDMA_MSG, 1, 120, 5, 4000, 0, 64, 1, 120, 6, 100, 1, 0, 0, 0, 0]);
        assert_eq!((h.read_position, h.reads.n, h.reads.capacity()), (120, 2, 4100));
        assert_eq!(h.reads.seg[1], Segment { handle: 6, length: 100, offset: (1u64 << 32) });
        assert_eq!(layout(&h, 160, 1 << 20), Ok(Layout::Spliced { position: 120, len: 4100, total: 160 + 4100 }));
        // A READ-like call: one write chunk of one segment, and a reply chunk.
        let h = call(&[9, 1, 8, RDMA_MSG, 0, 1, 1, 11, 65536, 0, 4096, 0, 1, 1, 12, 1024, 0, 0]);
        assert_eq!((h.write_chunks, h.write.n, h.write.capacity()), (1, 1, 65536));
        assert_eq!(h.reply.unwrap().capacity(), 1024);
        assert_eq!(h.len, 18 * 4);
    }

    #[test]
    fn position_zero_chunk_carries_the_whole_call() {
        let h = call(&[3, 1, 1, RDMA_NOMSG, 1, 0, 5, 9000, 0, 0, 0, 0, 0]);
        assert_eq!(layout(&h, 0, 1 << 20), Ok(Layout::Whole { len: 9000 }));
        assert!(layout(&h, 4, 1 << 20).is_err(), "inline bytes beside a position-zero chunk");
        let h = call(&[3, 1, 1, RDMA_MSG, 1, 0, 5, 9000, 0, 0, 0, 0, 0]);
        assert!(layout(&h, 0, 1 << 20).is_err(), "position zero needs RDMA_NOMSG");
    }

    #[test]
    fn refusals() {
        assert_eq!(parse(&[0, 0, 0]).unwrap_err(), Refused::Garbage);
        assert_eq!(parse(&words(&[5, 2, 1, 0])).unwrap_err(), Refused::Version { xid: 5 });
        let chunk = |w: &[u32]| matches!(parse(&words(w)), Err(Refused::Chunk { xid: 5, .. }));
        assert!(chunk(&[5, 1, 1, RDMA_MSGP, 0, 0, 0]));
        assert!(chunk(&[5, 1, 1, 77]));
        assert!(chunk(&[5, 1, 1, RDMA_MSG, 2]), "discriminator 2");
        assert!(chunk(&[5, 1, 1, RDMA_MSG, 1, 0, 1]), "truncated read segment");
        assert!(chunk(&[5, 1, 1, RDMA_MSG, 1, 4, 1, 1, 0, 0, 1, 8, 1, 1, 0, 0, 0, 0, 0]), "two positions");
        let mut many = vec![5, 1, 1, RDMA_MSG];
        for _ in 0..=SEGMENTS_MAX {
            many.extend([1, 4, 1, 1, 0, 0]);
        }
        many.extend([0, 0, 0]);
        assert!(chunk(&many), "too many read segments");
        assert!(chunk(&[5, 1, 1, RDMA_MSG, 0, 1, 0xffff_ffff]), "write chunk segment count");
        assert!(chunk(&[5, 1, 1, RDMA_MSG, 0, 0, 1, 1000]), "reply chunk segment count");
        assert_eq!(parse(&words(&[5, 1, 1, RDMA_ERROR, 2])).unwrap_err(), Refused::PeerError { xid: 5 });
        assert!(matches!(parse(&words(&[5, 1, 1, RDMA_DONE])), Ok(Message::Done)));
        // A read chunk over the record limit, or positioned past the body.
        let h = call(&[5, 1, 1, RDMA_MSG, 1, 8, 1, 2 << 20, 0, 0, 0, 0, 0]);
        assert!(layout(&h, 16, 1 << 20).is_err());
        let h = call(&[5, 1, 1, RDMA_MSG, 1, 64, 1, 16, 0, 0, 0, 0, 0]);
        assert!(layout(&h, 16, 1 << 20).is_err());
        let h = call(&[5, 1, 1, RDMA_MSG, 1, 6, 1, 16, 0, 0, 0, 0, 0]);
        assert!(layout(&h, 16, 1 << 20).is_err(), "unaligned position");
    }

    #[test]
    fn reply_header_round_trip() {
        let w = [Segment { handle: 1, length: 4096, offset: 10 }, Segment { handle: 2, length: 4096, offset: 20 }];
        let mut out = [0u8; 128];
        let n = encode_reply(&mut out, 44, 32, false, Some((&w, 5000)), None);
        assert_eq!(n, reply_header_len(Some(&w), None));
        let got: Vec<u32> = out[..n].chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, vec![44, 1, 32, RDMA_MSG, 0, 1, 2, 1, 4096, 0, 10, 2, 904, 0, 20, 0, 0]);
        let r = [Segment { handle: 3, length: 8192, offset: 0 }];
        let n = encode_reply(&mut out, 45, 32, true, None, Some((&r, 6000)));
        assert_eq!(n, reply_header_len(None, Some(&r)));
        match parse(&out[..n]).unwrap() {
            Message::Call(h) => assert_eq!((h.proc_, h.reply.unwrap().seg[0].length), (RDMA_NOMSG, 6000)),
            m => panic!("{m:?}"),
        }
        let mut e = [0u8; 28];
        assert_eq!(encode_error(&mut e, 9, 1, ERR_VERS), 28);
        assert_eq!(encode_error(&mut e, 9, 1, ERR_CHUNK), 20);
    }

    #[test]
    fn private_data() {
        let p = Private { send: 4096, recv: 4096, remote_invalidate: false };
        assert_eq!(Private::decode(&p.encode()), Some(p));
        // The kernel's CM pads private data with zeros beyond ours.
        let mut long = p.encode().to_vec();
        long.extend([0u8; 48]);
        assert_eq!(Private::decode(&long), Some(p));
        assert_eq!(Private::decode(&[0u8; 8]), None);
        assert_eq!(Private { send: 1 << 30, recv: 10, remote_invalidate: true }.encode()[5..], [1, 255, 0]);
    }
}
