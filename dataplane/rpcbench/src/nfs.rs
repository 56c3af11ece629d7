//! NFSv3 READ round trips (RFC 1813 §3.3.6), built by hand like the NULL
//! call: MOUNT3 MNT for the export's root handle, LOOKUP for the file, then
//! READs of `count` bytes at random aligned offsets inside the file, one in
//! flight. Next to it the echo moves exactly the bytes of one such call and
//! one such reply, so READ over echo is the server's whole cost for a small
//! read (record marking, decode, backend, encode, event loop) over the
//! physical path.

use crate::{connect, timeout_context, RoundTrip, LAST_FRAGMENT, MSG_ACCEPTED, MSG_CALL, MSG_REPLY, RECORD_MARK_BYTES, RPC_VERSION};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

pub const MOUNT_PROGRAM: u32 = 100005;
pub const MOUNT_V3: u32 = 3;
const MOUNTPROC3_MNT: u32 = 1;
const NFSPROC3_LOOKUP: u32 = 3;
const NFSPROC3_READ: u32 = 6;
const AUTH_SYS: u32 = 1;
/// NFSv3 handles are at most 64 bytes (RFC 1813 §2.5).
pub const FHSIZE3: usize = 64;
/// Largest READ this tool asks for.
pub const READ_COUNT_MAX: u32 = 1 << 20;
/// Largest reply the set-up calls accept.
const SETUP_REPLY_MAX: usize = 64 << 10;

fn be32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// An ONC RPC call with AUTH_SYS (uid 0, gid 0, machine "rpcbench") as the
/// clients fio runs send it; the record mark is patched by `finish`.
struct CallBuf(Vec<u8>);

impl CallBuf {
    fn new(xid: u32, prog: u32, vers: u32, proc_num: u32) -> Self {
        let mut c = CallBuf(Vec::with_capacity(256));
        c.u32(0); // record mark, set in finish
        for w in [xid, MSG_CALL, RPC_VERSION, prog, vers, proc_num, AUTH_SYS] {
            c.u32(w);
        }
        let mut cred = CallBuf(Vec::new());
        cred.u32(0); // stamp
        cred.opaque(b"rpcbench");
        cred.u32(0); // uid
        cred.u32(0); // gid
        cred.u32(0); // no auxiliary gids
        c.opaque(&cred.0);
        c.u32(0); // verifier AUTH_NONE
        c.u32(0);
        c
    }

    fn u32(&mut self, w: u32) {
        self.0.extend_from_slice(&w.to_be_bytes());
    }

    fn u64(&mut self, w: u64) {
        self.0.extend_from_slice(&w.to_be_bytes());
    }

    fn opaque(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self.0.resize(self.0.len() + (4 - b.len() % 4) % 4, 0);
    }

    fn finish(mut self) -> Vec<u8> {
        let body = (self.0.len() - RECORD_MARK_BYTES) as u32;
        self.0[..4].copy_from_slice(&(LAST_FRAGMENT | body).to_be_bytes());
        self.0
    }
}

/// Where the results of an accepted, successful reply start, after checking
/// xid, message type, acceptance and the verifier.
pub fn results_at(body: &[u8], xid: u32) -> Result<usize, String> {
    let word = |at: usize| be32(body, at).ok_or_else(|| format!("reply of {} bytes is truncated", body.len()));
    if word(0)? != xid {
        return Err(format!("reply xid {:#x} does not match call xid {xid:#x}", word(0)?));
    }
    if word(4)? != MSG_REPLY {
        return Err(format!("message type {} is not REPLY", word(4)?));
    }
    if word(8)? != MSG_ACCEPTED {
        return Err(format!("call denied (reject_stat {})", be32(body, 12).unwrap_or(u32::MAX)));
    }
    let verf = word(16)? as usize;
    let at = 20usize.checked_add(verf.div_ceil(4) * 4).ok_or("verifier length overflows")?;
    let stat = word(at)?;
    if stat != 0 {
        return Err(format!("call not executed (accept_stat {stat})"));
    }
    Ok(at + 4)
}

/// Read one reply record from `s` into `buf`; returns the range of its body
/// (fragments joined). One `read` usually brings the whole reply, as for the
/// echo, and a single-fragment reply is not moved.
pub fn read_reply(s: &mut impl Read, buf: &mut [u8]) -> io::Result<(usize, usize)> {
    let mut have = 0;
    // Bytes of the body joined so far, at the start of `buf`; the unparsed
    // rest (starting with a record mark) follows at `buf[body..have]`.
    let mut body = 0;
    loop {
        while have - body >= RECORD_MARK_BYTES {
            let m = be32(buf, body).expect("four bytes present");
            let frag = (m & !LAST_FRAGMENT) as usize;
            if body + RECORD_MARK_BYTES + frag > buf.len() {
                return Err(bad(format!("reply of at least {} bytes exceeds the {}-byte limit", body + frag, buf.len())));
            }
            if have - body - RECORD_MARK_BYTES < frag {
                break;
            }
            let last = m & LAST_FRAGMENT != 0;
            let end = body + RECORD_MARK_BYTES + frag;
            if last && end != have {
                return Err(bad(format!("{} bytes after the reply, none asked for", have - end)));
            }
            if last && body == 0 {
                return Ok((RECORD_MARK_BYTES, end));
            }
            // Drop the mark: the fragment joins the body.
            buf.copy_within(body + RECORD_MARK_BYTES..have, body);
            have -= RECORD_MARK_BYTES;
            body += frag;
            if last {
                return Ok((0, body));
            }
        }
        let n = s.read(&mut buf[have..])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "server closed the connection"));
        }
        have += n;
    }
}

/// One blocking call of the set-up: send `call`, return the reply's results.
fn setup_call(s: &mut TcpStream, addr: SocketAddr, call: Vec<u8>, xid: u32, what: &str) -> io::Result<Vec<u8>> {
    s.write_all(&call).map_err(|e| timeout_context(e, addr, "write"))?;
    let mut buf = vec![0u8; SETUP_REPLY_MAX];
    let (from, to) = read_reply(s, &mut buf).map_err(|e| timeout_context(e, addr, what))?;
    let body = &buf[from..to];
    let at = results_at(body, xid).map_err(|e| bad(format!("{addr}: {what}: {e}")))?;
    Ok(body[at..].to_vec())
}

/// A file handle (opaque<FHSIZE3>) at `at` of `r`, and the offset after it.
fn fh_at(r: &[u8], at: usize, what: &str) -> io::Result<(Vec<u8>, usize)> {
    let len = be32(r, at).ok_or_else(|| bad(format!("{what}: truncated before the file handle")))? as usize;
    if len == 0 || len > FHSIZE3 {
        return Err(bad(format!("{what}: file handle of {len} bytes (1..={FHSIZE3})")));
    }
    let fh = r.get(at + 4..at + 4 + len).ok_or_else(|| bad(format!("{what}: truncated file handle")))?;
    Ok((fh.to_vec(), at + 4 + len.div_ceil(4) * 4))
}

/// MOUNT3 MNT of `export` at `mount_addr`: the export's root handle.
pub fn mount(mount_addr: SocketAddr, export: &str) -> io::Result<Vec<u8>> {
    let mut s = connect(mount_addr)?;
    let xid = 0x6d6e_7400;
    let mut c = CallBuf::new(xid, MOUNT_PROGRAM, MOUNT_V3, MOUNTPROC3_MNT);
    c.opaque(export.as_bytes());
    let r = setup_call(&mut s, mount_addr, c.finish(), xid, "MNT reply")?;
    let stat = be32(&r, 0).ok_or_else(|| bad("MNT reply truncated".into()))?;
    if stat != 0 {
        return Err(bad(format!("{mount_addr}: MNT {export} failed with mountstat3 {stat}")));
    }
    Ok(fh_at(&r, 4, "MNT reply")?.0)
}

/// NFSv3 LOOKUP of `name` in `dir` over `s`: the file's handle and size.
pub fn lookup(s: &mut TcpStream, addr: SocketAddr, dir: &[u8], name: &str) -> io::Result<(Vec<u8>, u64)> {
    let xid = 0x6c6b_7000;
    let mut c = CallBuf::new(xid, crate::NFS_PROGRAM, crate::NFS_V3, NFSPROC3_LOOKUP);
    c.opaque(dir);
    c.opaque(name.as_bytes());
    let r = setup_call(s, addr, c.finish(), xid, "LOOKUP reply")?;
    let stat = be32(&r, 0).ok_or_else(|| bad("LOOKUP reply truncated".into()))?;
    if stat != 0 {
        return Err(bad(format!("{addr}: LOOKUP {name:?} failed with nfsstat3 {stat}")));
    }
    let (fh, at) = fh_at(&r, 4, "LOOKUP reply")?;
    // obj_attributes: post_op_attr; fattr3 puts size after type, mode,
    // nlink, uid, gid (RFC 1813 §2.6).
    if be32(&r, at) != Some(1) {
        return Err(bad(format!("{addr}: LOOKUP {name:?} returned no attributes: cannot size the reads")));
    }
    let hi = be32(&r, at + 24).ok_or_else(|| bad("LOOKUP attributes truncated".into()))?;
    let lo = be32(&r, at + 28).ok_or_else(|| bad("LOOKUP attributes truncated".into()))?;
    Ok((fh, (hi as u64) << 32 | lo as u64))
}

/// READs of `count` bytes at random `count`-aligned offsets of one file.
pub struct ReadClient {
    stream: TcpStream,
    addr: SocketAddr,
    call: Vec<u8>,
    /// Where the xid and the offset sit in `call`.
    xid_at: usize,
    offset_at: usize,
    count: u32,
    blocks: u64,
    rng: u64,
    reply: Vec<u8>,
    /// Bytes of the last reply (record mark included).
    pub last_reply_bytes: usize,
}

impl ReadClient {
    /// Mount `export` through `mount_addr`, look `file` up over a connection
    /// to `nfs_addr`, and prepare READs of `count` bytes on that connection.
    pub fn connect(nfs_addr: SocketAddr, mount_addr: SocketAddr, export: &str, file: &str, count: u32) -> io::Result<Self> {
        if count == 0 || count > READ_COUNT_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("READ count {count} outside 1..={READ_COUNT_MAX}")));
        }
        let root = mount(mount_addr, export)?;
        let mut stream = connect(nfs_addr)?;
        let (fh, size) = lookup(&mut stream, nfs_addr, &root, file)?;
        let blocks = size / count as u64;
        if blocks == 0 {
            return Err(bad(format!("{nfs_addr}: {export}/{file} holds {size} bytes, less than one {count}-byte READ")));
        }
        let mut c = CallBuf::new(0, crate::NFS_PROGRAM, crate::NFS_V3, NFSPROC3_READ);
        c.opaque(&fh);
        let offset_at = c.0.len();
        c.u64(0);
        c.u32(count);
        let call = c.finish();
        Ok(ReadClient {
            stream,
            addr: nfs_addr,
            call,
            xid_at: RECORD_MARK_BYTES,
            offset_at,
            count,
            blocks,
            rng: 0x2545_f491_4f6c_dd1d,
            reply: vec![0u8; count as usize + 4096],
            last_reply_bytes: 0,
        })
    }

    /// The bytes of the call last sent (any xid and offset): what the echo sends.
    pub fn call_bytes(&self) -> &[u8] {
        &self.call
    }

    fn next_offset(&mut self) -> u64 {
        // xorshift64*: cheap, no allocation, same sequence every run.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % self.blocks) * self.count as u64
    }
}

impl RoundTrip for ReadClient {
    fn round_trip(&mut self, xid: u32) -> io::Result<()> {
        let off = self.next_offset();
        self.call[self.xid_at..self.xid_at + 4].copy_from_slice(&xid.to_be_bytes());
        self.call[self.offset_at..self.offset_at + 8].copy_from_slice(&off.to_be_bytes());
        self.stream.write_all(&self.call).map_err(|e| timeout_context(e, self.addr, "write"))?;
        let (from, to) = read_reply(&mut self.stream, &mut self.reply).map_err(|e| timeout_context(e, self.addr, "READ reply"))?;
        self.last_reply_bytes = to - from + RECORD_MARK_BYTES;
        let body = &self.reply[from..to];
        let at = results_at(body, xid).map_err(|e| bad(format!("{}: READ: {e}", self.addr)))?;
        check_read_results(&body[at..], self.count).map_err(|e| bad(format!("{}: READ at {off}: {e}", self.addr)))
    }
}

/// READ3res: NFS3_OK, file attributes, then `count` bytes of data.
pub fn check_read_results(r: &[u8], want: u32) -> Result<(), String> {
    let stat = be32(r, 0).ok_or("READ results truncated")?;
    if stat != 0 {
        return Err(format!("nfsstat3 {stat}"));
    }
    // post_op_attr: present flag, then a fattr3 of 84 bytes.
    let at = match be32(r, 4).ok_or("READ results truncated")? {
        1 => 8 + 84,
        0 => 8,
        b => return Err(format!("post_op_attr flag {b}")),
    };
    let count = be32(r, at).ok_or("READ results truncated before count")?;
    let len = be32(r, at + 8).ok_or("READ results truncated before data")?;
    if count != want || len != want {
        return Err(format!("{count} bytes (data {len}) returned for a {want}-byte READ inside the file"));
    }
    if r.len() < at + 12 + want as usize {
        return Err(format!("READ data truncated: {} of {want} bytes", r.len().saturating_sub(at + 12)));
    }
    Ok(())
}
