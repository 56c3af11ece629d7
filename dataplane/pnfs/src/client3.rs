//! A small blocking NFSv3 client (RFC 1813 over ONC RPC, RFC 5531) the MDS
//! uses to manage data files on a DS and to proxy I/O through the MDS.
//!
//! Why NFSv3 rather than a control protocol of our own: the DS already
//! serves exactly these procedures to clients, so the DS needs no second
//! service, no second port and no second parser to harden; ownership
//! (fencing) is an NFSv3 SETATTR like any other. The cost is one round trip
//! per data file per operation, paid on the MDS's control path only.
//!
//! One TCP connection per DS, one call at a time, every call bounded by a
//! connect and a reply timeout; any transport or framing error drops the
//! connection (the next call reconnects). Calls use AUTH_SYS uid 0: the
//! DS lets root (the MDS) past the synthetic owner of data files.

use proto::xdr::{Decoder, Encoder};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

pub const NFS_PROGRAM: u32 = 100003;
pub const NFS_V3: u32 = 3;
/// Largest reply accepted (READ payload up to 1 MiB plus headers).
pub const REPLY_BYTES_MAX: usize = (1 << 20) + 4096;
/// Largest call we build (WRITE payload up to 1 MiB plus headers).
pub const CALL_BYTES_MAX: usize = (1 << 20) + 4096;

const PROC_NULL: u32 = 0;
const PROC_GETATTR: u32 = 1;
const PROC_SETATTR: u32 = 2;
const PROC_LOOKUP: u32 = 3;
const PROC_READ: u32 = 6;
const PROC_WRITE: u32 = 7;
const PROC_CREATE: u32 = 8;
const PROC_REMOVE: u32 = 12;
const PROC_READDIR: u32 = 16;
const PROC_COMMIT: u32 = 21;
/// fattr3 on the wire: 13 fields, 84 bytes.
const FATTR3_BYTES: usize = 84;

/// Why a control call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtlError {
    /// Could not connect, send or receive in time: the DS is unreachable.
    Unreachable(String),
    /// The DS answered, but not with a valid RPC reply.
    Protocol(String),
    /// The DS answered with this nfsstat3.
    Status(u32),
}

impl std::fmt::Display for CtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CtlError::Unreachable(m) => write!(f, "unreachable: {m}"),
            CtlError::Protocol(m) => write!(f, "bad reply: {m}"),
            CtlError::Status(s) => write!(f, "nfsstat3 {s}"),
        }
    }
}

pub type CtlResult<T> = Result<T, CtlError>;

fn xdr(e: proto::xdr::XdrError) -> CtlError {
    CtlError::Protocol(format!("xdr: {e:?}"))
}

/// Attributes the MDS needs from a data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fattr {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
}

fn fattr(d: &mut Decoder<'_>) -> CtlResult<Fattr> {
    let _type = d.u32().map_err(xdr)?;
    let mode = d.u32().map_err(xdr)?;
    let _nlink = d.u32().map_err(xdr)?;
    let uid = d.u32().map_err(xdr)?;
    let gid = d.u32().map_err(xdr)?;
    let size = d.u64().map_err(xdr)?;
    d.skip(FATTR3_BYTES - 28).map_err(xdr)?;
    Ok(Fattr { mode, uid, gid, size })
}

fn skip_post_op_attr(d: &mut Decoder<'_>) -> CtlResult<Option<Fattr>> {
    if d.bool().map_err(xdr)? {
        return fattr(d).map(Some);
    }
    Ok(None)
}

fn skip_wcc(d: &mut Decoder<'_>) -> CtlResult<()> {
    if d.bool().map_err(xdr)? {
        d.skip(24).map_err(xdr)?; // wcc_attr: size, mtime, ctime
    }
    skip_post_op_attr(d)?;
    Ok(())
}

/// sattr3 with only the fields we set.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sattr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
}

fn enc_sattr(e: &mut Encoder<'_>, s: &Sattr) -> proto::xdr::Result<()> {
    for v in [s.mode, s.uid, s.gid] {
        match v {
            Some(x) => {
                e.bool(true)?;
                e.u32(x)?;
            }
            None => e.bool(false)?,
        }
    }
    match s.size {
        Some(x) => {
            e.bool(true)?;
            e.u64(x)?;
        }
        None => e.bool(false)?,
    }
    e.u32(0)?; // atime DONT_CHANGE
    e.u32(0) // mtime DONT_CHANGE
}

/// One connection to one DS.
pub struct Client3 {
    addr: String,
    timeout: Duration,
    stream: Option<TcpStream>,
    xid: u32,
    uid: u32,
    gid: u32,
    buf: Vec<u8>,
}

impl Client3 {
    /// `addr` is "host:port"; nothing connects until the first call.
    pub fn new(addr: &str, timeout: Duration) -> Client3 {
        Client3 { addr: addr.to_string(), timeout, stream: None, xid: 1, uid: 0, gid: 0, buf: Vec::new() }
    }

    /// Identity for AUTH_SYS (root by default; tests act as a client).
    pub fn with_cred(mut self, uid: u32, gid: u32) -> Client3 {
        self.uid = uid;
        self.gid = gid;
        self
    }

    fn connect(&mut self) -> CtlResult<&mut TcpStream> {
        if self.stream.is_none() {
            let addrs: Vec<SocketAddr> = self
                .addr
                .to_socket_addrs()
                .map_err(|e| CtlError::Unreachable(format!("{}: {e}", self.addr)))?
                .collect();
            let a = addrs.first().ok_or_else(|| CtlError::Unreachable(format!("{}: no address", self.addr)))?;
            let s = TcpStream::connect_timeout(a, self.timeout).map_err(|e| CtlError::Unreachable(format!("{a}: {e}")))?;
            s.set_read_timeout(Some(self.timeout)).ok();
            s.set_write_timeout(Some(self.timeout)).ok();
            s.set_nodelay(true).ok();
            self.stream = Some(s);
        }
        Ok(self.stream.as_mut().expect("connected"))
    }

    /// One RPC call: `args` writes the procedure arguments; returns the
    /// result bytes (after accept_stat SUCCESS).
    pub fn call(&mut self, prog: u32, vers: u32, proc_num: u32, args: &dyn Fn(&mut Encoder<'_>) -> proto::xdr::Result<()>) -> CtlResult<Vec<u8>> {
        let r = self.call_once(prog, vers, proc_num, args);
        if matches!(r, Err(CtlError::Unreachable(_)) | Err(CtlError::Protocol(_))) {
            self.stream = None;
        }
        r
    }

    fn call_once(&mut self, prog: u32, vers: u32, proc_num: u32, args: &dyn Fn(&mut Encoder<'_>) -> proto::xdr::Result<()>) -> CtlResult<Vec<u8>> {
        self.xid = self.xid.wrapping_add(1);
        let xid = self.xid;
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(CALL_BYTES_MAX, 0);
        let n = {
            let mut e = Encoder::new(&mut buf);
            (|| -> proto::xdr::Result<()> {
                e.u32(0)?; // record mark, patched below
                for w in [xid, 0, 2, prog, vers, proc_num] {
                    e.u32(w)?;
                }
                // AUTH_SYS (flavor 1): stamp, machine name, uid, gid, no gids.
                e.u32(1)?;
                let len_at = e.reserve(4)?;
                let start = e.position();
                e.u32(0)?;
                e.opaque_var(b"chimera-mds")?;
                e.u32(self.uid)?;
                e.u32(self.gid)?;
                e.u32(0)?;
                let l = e.position() - start;
                e.patch_u32(len_at, l as u32);
                e.u32(0)?; // verifier AUTH_NONE
                e.u32(0)?;
                args(&mut e)
            })()
            .map_err(xdr)?;
            let n = e.position();
            e.patch_u32(0, 0x8000_0000 | (n as u32 - 4));
            n
        };
        let s = self.connect()?;
        let sent = s.write_all(&buf[..n]);
        self.buf = buf;
        sent.map_err(|e| CtlError::Unreachable(format!("send: {e}")))?;
        let reply = self.read_record()?;
        let mut d = Decoder::new(&reply);
        let rxid = d.u32().map_err(xdr)?;
        if rxid != xid {
            return Err(CtlError::Protocol(format!("xid {rxid}, expected {xid}")));
        }
        let (mtype, stat) = (d.u32().map_err(xdr)?, d.u32().map_err(xdr)?);
        if mtype != 1 || stat != 0 {
            return Err(CtlError::Protocol(format!("reply type {mtype}, reply_stat {stat} (denied)")));
        }
        let _flavor = d.u32().map_err(xdr)?;
        d.opaque_var(400).map_err(xdr)?;
        let accept = d.u32().map_err(xdr)?;
        if accept != 0 {
            return Err(CtlError::Protocol(format!("accept_stat {accept}")));
        }
        Ok(d.rest().to_vec())
    }

    fn read_record(&mut self) -> CtlResult<Vec<u8>> {
        let s = self.stream.as_mut().ok_or_else(|| CtlError::Unreachable("not connected".into()))?;
        let mut out = Vec::new();
        loop {
            let mut mark = [0u8; 4];
            s.read_exact(&mut mark).map_err(|e| CtlError::Unreachable(format!("receive: {e}")))?;
            let m = u32::from_be_bytes(mark);
            let len = (m & 0x7fff_ffff) as usize;
            if out.len() + len > REPLY_BYTES_MAX {
                return Err(CtlError::Protocol(format!("reply over {REPLY_BYTES_MAX} bytes")));
            }
            let at = out.len();
            out.resize(at + len, 0);
            s.read_exact(&mut out[at..]).map_err(|e| CtlError::Unreachable(format!("receive: {e}")))?;
            if m & 0x8000_0000 != 0 {
                return Ok(out);
            }
        }
    }

    fn nfs(&mut self, proc_num: u32, args: &dyn Fn(&mut Encoder<'_>) -> proto::xdr::Result<()>) -> CtlResult<Vec<u8>> {
        self.call(NFS_PROGRAM, NFS_V3, proc_num, args)
    }

    pub fn null(&mut self) -> CtlResult<()> {
        self.nfs(PROC_NULL, &|_| Ok(())).map(|_| ())
    }

    pub fn getattr(&mut self, fh: &[u8]) -> CtlResult<Fattr> {
        let r = self.nfs(PROC_GETATTR, &|e| e.opaque_var(fh))?;
        let mut d = Decoder::new(&r);
        status(&mut d)?;
        fattr(&mut d)
    }

    pub fn setattr(&mut self, fh: &[u8], s: &Sattr) -> CtlResult<()> {
        let r = self.nfs(PROC_SETATTR, &|e| {
            e.opaque_var(fh)?;
            enc_sattr(e, s)?;
            e.bool(false)
        })?;
        status(&mut Decoder::new(&r))
    }

    pub fn lookup(&mut self, dir: &[u8], name: &[u8]) -> CtlResult<Vec<u8>> {
        let r = self.nfs(PROC_LOOKUP, &|e| {
            e.opaque_var(dir)?;
            e.opaque_var(name)
        })?;
        let mut d = Decoder::new(&r);
        status(&mut d)?;
        Ok(d.opaque_var(64).map_err(xdr)?.to_vec())
    }

    /// CREATE UNCHECKED with mode/uid/gid: an existing file is reused.
    pub fn create(&mut self, dir: &[u8], name: &[u8], attrs: &Sattr) -> CtlResult<Vec<u8>> {
        let r = self.nfs(PROC_CREATE, &|e| {
            e.opaque_var(dir)?;
            e.opaque_var(name)?;
            e.u32(0)?; // UNCHECKED
            enc_sattr(e, attrs)
        })?;
        let mut d = Decoder::new(&r);
        status(&mut d)?;
        if !d.bool().map_err(xdr)? {
            return Err(CtlError::Protocol("CREATE without a handle".into()));
        }
        Ok(d.opaque_var(64).map_err(xdr)?.to_vec())
    }

    pub fn remove(&mut self, dir: &[u8], name: &[u8]) -> CtlResult<()> {
        let r = self.nfs(PROC_REMOVE, &|e| {
            e.opaque_var(dir)?;
            e.opaque_var(name)
        })?;
        status(&mut Decoder::new(&r))
    }

    /// READ into `out` (cleared first); returns eof.
    pub fn read(&mut self, fh: &[u8], offset: u64, count: u32, out: &mut Vec<u8>) -> CtlResult<bool> {
        let r = self.nfs(PROC_READ, &|e| {
            e.opaque_var(fh)?;
            e.u64(offset)?;
            e.u32(count)
        })?;
        let mut d = Decoder::new(&r);
        status_attr(&mut d)?;
        let _count = d.u32().map_err(xdr)?;
        let eof = d.bool().map_err(xdr)?;
        let data = d.opaque_var(count.max(1)).map_err(xdr)?;
        out.clear();
        out.extend_from_slice(data);
        Ok(eof)
    }

    /// WRITE; returns (count, committed stable_how).
    pub fn write(&mut self, fh: &[u8], offset: u64, data: &[u8], stable: u32) -> CtlResult<(u32, u32)> {
        let r = self.nfs(PROC_WRITE, &|e| {
            e.opaque_var(fh)?;
            e.u64(offset)?;
            e.u32(data.len() as u32)?;
            e.u32(stable)?;
            e.opaque_var(data)
        })?;
        let mut d = Decoder::new(&r);
        let st = d.u32().map_err(xdr)?;
        skip_wcc(&mut d)?;
        if st != 0 {
            return Err(CtlError::Status(st));
        }
        let count = d.u32().map_err(xdr)?;
        let committed = d.u32().map_err(xdr)?;
        Ok((count, committed))
    }

    pub fn commit(&mut self, fh: &[u8]) -> CtlResult<()> {
        let r = self.nfs(PROC_COMMIT, &|e| {
            e.opaque_var(fh)?;
            e.u64(0)?;
            e.u32(0)
        })?;
        let mut d = Decoder::new(&r);
        let st = d.u32().map_err(xdr)?;
        if st != 0 {
            return Err(CtlError::Status(st));
        }
        Ok(())
    }

    /// One READDIR page of `dir` from `cookie`: the names in it (without
    /// "." and ".."), the cookie to go on from, and whether the listing
    /// ended. `verf` is the cookie verifier: zeros at the start, then what
    /// the first page returned (kept by the caller between pages).
    pub fn readdir_page(&mut self, dir: &[u8], cookie: u64, verf: &mut [u8; 8]) -> CtlResult<(Vec<Vec<u8>>, u64, bool)> {
        let v = *verf;
        let r = self.nfs(PROC_READDIR, &|e| {
            e.opaque_var(dir)?;
            e.u64(cookie)?;
            e.opaque_fixed(&v)?;
            e.u32(32 * 1024)
        })?;
        let mut d = Decoder::new(&r);
        status_attr(&mut d)?;
        *verf = d.opaque_fixed::<8>().map_err(xdr)?;
        let (mut names, mut next) = (Vec::new(), cookie);
        while d.bool().map_err(xdr)? {
            let _fileid = d.u64().map_err(xdr)?;
            let name = d.opaque_var(255).map_err(xdr)?;
            next = d.u64().map_err(xdr)?;
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        let eof = d.bool().map_err(xdr)?;
        if !eof && next == cookie {
            return Err(CtlError::Protocol("READDIR page without entries and not at its end".into()));
        }
        Ok((names, next, eof))
    }

    /// The first entry of a directory other than "." and ".." (the DS's
    /// first mount under its pseudo-root).
    pub fn first_entry(&mut self, dir: &[u8]) -> CtlResult<Option<Vec<u8>>> {
        let r = self.nfs(PROC_READDIR, &|e| {
            e.opaque_var(dir)?;
            e.u64(0)?;
            e.opaque_fixed(&[0u8; 8])?;
            e.u32(8192)
        })?;
        let mut d = Decoder::new(&r);
        status_attr(&mut d)?;
        d.opaque_fixed::<8>().map_err(xdr)?;
        while d.bool().map_err(xdr)? {
            let _fileid = d.u64().map_err(xdr)?;
            let name = d.opaque_var(255).map_err(xdr)?;
            let _cookie = d.u64().map_err(xdr)?;
            if name != b"." && name != b".." {
                return Ok(Some(name.to_vec()));
            }
        }
        Ok(None)
    }
}

/// nfsstat3 of a result whose failure arm carries nothing we need.
fn status(d: &mut Decoder<'_>) -> CtlResult<()> {
    let st = d.u32().map_err(xdr)?;
    if st != 0 {
        return Err(CtlError::Status(st));
    }
    Ok(())
}

/// nfsstat3 then post_op_attr (READ, READDIR).
fn status_attr(d: &mut Decoder<'_>) -> CtlResult<()> {
    let st = d.u32().map_err(xdr)?;
    skip_post_op_attr(d)?;
    if st != 0 {
        return Err(CtlError::Status(st));
    }
    Ok(())
}

/// NFS3ERR_ACCES: a data file whose owner is not the caller (fenced).
pub const NFS3ERR_ACCES: u32 = 13;
pub const NFS3ERR_NOENT: u32 = 2;
