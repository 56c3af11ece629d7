//! NFSv3 (RFC 1813) and MOUNT v3 over one `RpcConn`.
//!
//! Blocking calls for the simple paths, plus `submit_read` / `submit_write`
//! and `finish_read` / `finish_write` over the connection's non-blocking
//! core for callers that keep many I/Os in flight.
//!
//! Unstable writes are tracked per file: each keeps its range, the verifier
//! the server answered and (within `held_bytes_max`) a copy of its data.
//! COMMIT compares the commit verifier with every write's; a change means
//! the server restarted and may have lost them, reported as
//! `Error::VerifierChanged` with the ranges, and `resend_uncommitted`
//! writes the held data again.

use crate::error::{xdr, Error, Result};
use crate::rpc::{Auth, Limits, Reply, RpcConn};
use proto::mount3 as m;
use proto::nfs3 as p;
use proto::xdr::{Decoder, Xdr};
use crate::writes::Uncommitted;

pub use crate::writes::HELD_BYTES_MAX_DEFAULT;

pub use p::fattr3 as Fattr;

fn nfs_err(code: i32) -> Error {
    let stat = p::nfsstat3::from_i32(code).map_or_else(|| format!("nfsstat3 {code}"), |s| format!("{s:?}"));
    Error::Nfs3 { stat, code: code as u32 }
}

fn decode<'a, T: Xdr<'a>>(body: &'a [u8]) -> Result<T> {
    let mut d = Decoder::new(body);
    T::decode(&mut d).map_err(xdr)
}

fn fh3(fh: &[u8]) -> p::nfs_fh3<'_> {
    p::nfs_fh3 { data: fh }
}

fn sattr_mode(mode: Option<u32>) -> p::sattr3 {
    p::sattr3 {
        mode: mode.map_or(p::set_mode3::FALSE, p::set_mode3::TRUE),
        uid: p::set_uid3::FALSE,
        gid: p::set_gid3::FALSE,
        size: p::set_size3::FALSE,
        atime: p::set_atime::DONT_CHANGE,
        mtime: p::set_mtime::DONT_CHANGE,
    }
}

/// How a WRITE asks the server to store data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stable {
    Unstable,
    FileSync,
}

/// Result of a WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub count: u32,
    /// The server stored it FILE_SYNC / DATA_SYNC (nothing to commit).
    pub stable: bool,
    pub verf: [u8; 8],
}

/// One directory entry of READDIRPLUS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub fileid: u64,
    pub cookie: u64,
    pub fh: Option<Vec<u8>>,
    pub attr: Option<Fattr>,
}

/// An NFSv3 client on one connection.
pub struct Nfs3 {
    rpc: RpcConn,
    /// Unstable writes not yet committed, per file handle.
    uncommitted: Uncommitted,
}

impl Nfs3 {
    pub fn connect(addr: &str, auth: &Auth, limits: Limits) -> Result<Nfs3> {
        Ok(Nfs3::over(RpcConn::connect(addr, auth, limits)?))
    }

    pub fn over(rpc: RpcConn) -> Nfs3 {
        Nfs3 { rpc, uncommitted: Uncommitted::new() }
    }

    /// Bound the copies of unstable data kept for resends.
    pub fn set_held_bytes_max(&mut self, max: usize) {
        self.uncommitted.held_bytes_max = max;
    }

    pub fn rpc(&mut self) -> &mut RpcConn {
        &mut self.rpc
    }

    /// Replace the connection (after a reconnect), keeping the uncommitted
    /// writes so a COMMIT on the new one can detect a new verifier.
    pub fn replace_conn(&mut self, rpc: RpcConn) -> RpcConn {
        std::mem::replace(&mut self.rpc, rpc)
    }

    fn call<'x, A: Xdr<'x>>(&mut self, proc_num: u32, args: &A) -> Result<Reply> {
        self.rpc.call(p::NFS_PROGRAM, p::NFS_V3, proc_num, &|e| args.encode(e))
    }

    pub fn null(&mut self) -> Result<()> {
        self.rpc.call(p::NFS_PROGRAM, p::NFS_V3, 0, &|_| Ok(())).map(|_| ())
    }

    /// MOUNT MNT of `path` on this connection (chimerad serves MOUNT on
    /// its NFS port): the export's root handle.
    pub fn mount(&mut self, path: &str) -> Result<Vec<u8>> {
        mount_on(&mut self.rpc, path)
    }

    pub fn getattr(&mut self, fh: &[u8]) -> Result<Fattr> {
        let r = self.call(1, &p::GETATTR3args { object: fh3(fh) })?;
        match decode::<p::GETATTR3res>(r.body())? {
            p::GETATTR3res::NFS3_OK(ok) => Ok(ok.obj_attributes),
            p::GETATTR3res::default(c) => Err(nfs_err(c)),
        }
    }

    pub fn lookup(&mut self, dir: &[u8], name: &[u8]) -> Result<(Vec<u8>, Option<Fattr>)> {
        let r = self.call(3, &p::LOOKUP3args { what: p::diropargs3 { dir: fh3(dir), name } })?;
        match decode::<p::LOOKUP3res>(r.body())? {
            p::LOOKUP3res::NFS3_OK(ok) => {
                let attr = match ok.obj_attributes {
                    p::post_op_attr::TRUE(a) => Some(a),
                    p::post_op_attr::FALSE => None,
                };
                Ok((ok.object.data.to_vec(), attr))
            }
            p::LOOKUP3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// LOOKUP each component of `path` ("a/b/c"; empty parts skipped) from `root`.
    pub fn walk(&mut self, root: &[u8], path: &str) -> Result<Vec<u8>> {
        let mut fh = root.to_vec();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            fh = self.lookup(&fh, c.as_bytes())?.0;
        }
        Ok(fh)
    }

    fn created(obj: p::post_op_fh3<'_>) -> Result<Vec<u8>> {
        match obj {
            p::post_op_fh3::TRUE(h) => Ok(h.data.to_vec()),
            p::post_op_fh3::FALSE => Err(Error::Malformed("CREATE/MKDIR answered OK without a handle".into())),
        }
    }

    /// CREATE: `exclusive_guard` uses GUARDED (EEXIST if it exists),
    /// otherwise UNCHECKED (an existing file is reused).
    pub fn create(&mut self, dir: &[u8], name: &[u8], mode: u32, guarded: bool) -> Result<Vec<u8>> {
        let how = if guarded {
            p::createhow3::GUARDED(sattr_mode(Some(mode)))
        } else {
            p::createhow3::UNCHECKED(sattr_mode(Some(mode)))
        };
        let r = self.call(8, &p::CREATE3args { r#where: p::diropargs3 { dir: fh3(dir), name }, how })?;
        match decode::<p::CREATE3res>(r.body())? {
            p::CREATE3res::NFS3_OK(ok) => Self::created(ok.obj),
            p::CREATE3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// CREATE EXCLUSIVE (RFC 1813 §3.3.8): exactly once per `verf`; a
    /// retry with the same verifier returns the file the first attempt
    /// made, a different one gets NFS3ERR_EXIST. The server keeps the
    /// verifier in the file's times, so set the mode afterwards.
    pub fn create_exclusive(&mut self, dir: &[u8], name: &[u8], verf: [u8; 8]) -> Result<Vec<u8>> {
        let how = p::createhow3::EXCLUSIVE(verf);
        let r = self.call(8, &p::CREATE3args { r#where: p::diropargs3 { dir: fh3(dir), name }, how })?;
        match decode::<p::CREATE3res>(r.body())? {
            p::CREATE3res::NFS3_OK(ok) => Self::created(ok.obj),
            p::CREATE3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    pub fn mkdir(&mut self, dir: &[u8], name: &[u8], mode: u32) -> Result<Vec<u8>> {
        let r = self.call(9, &p::MKDIR3args { r#where: p::diropargs3 { dir: fh3(dir), name }, attributes: sattr_mode(Some(mode)) })?;
        match decode::<p::MKDIR3res>(r.body())? {
            p::MKDIR3res::NFS3_OK(ok) => Self::created(ok.obj),
            p::MKDIR3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    pub fn remove(&mut self, dir: &[u8], name: &[u8]) -> Result<()> {
        let r = self.call(12, &p::REMOVE3args { object: p::diropargs3 { dir: fh3(dir), name } })?;
        match decode::<p::REMOVE3res>(r.body())? {
            p::REMOVE3res::NFS3_OK(_) => Ok(()),
            p::REMOVE3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// Queue a READ; complete it with `finish_read` on its reply.
    pub fn submit_read(&mut self, fh: &[u8], offset: u64, count: u32) -> Result<u32> {
        let a = p::READ3args { file: fh3(fh), offset, count };
        self.rpc.submit(p::NFS_PROGRAM, p::NFS_V3, 6, &|e| a.encode(e))
    }

    /// As `submit_read`, and the reply's data may be received straight into
    /// `buf` (a large READ over TCP: `RpcConn::set_sink`), saving a copy;
    /// finish with `read_into` on the same buffer.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `count` bytes, and not read or
    /// written by anything else, until the call's completion is handed out.
    pub unsafe fn submit_read_into(&mut self, fh: &[u8], offset: u64, count: u32, buf: *mut u8) -> Result<u32> {
        let xid = self.submit_read(fh, offset, count)?;
        // SAFETY: the caller's contract is `set_sink`'s.
        unsafe { self.rpc.set_sink(xid, buf, count as usize, read3_data) };
        Ok(xid)
    }

    /// Copy a READ reply's data into `out` (cleared first); returns eof.
    pub fn finish_read(reply: &Reply, out: &mut Vec<u8>) -> Result<bool> {
        match decode::<p::READ3res>(reply.body())? {
            p::READ3res::NFS3_OK(ok) => {
                if ok.data.len() != ok.count as usize {
                    return Err(Error::Malformed(format!("READ count {} with {} data bytes", ok.count, ok.data.len())));
                }
                out.clear();
                out.extend_from_slice(ok.data);
                Ok(ok.eof)
            }
            p::READ3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// Copy a READ reply's data into `buf` without allocating: (bytes, eof).
    /// More data than `buf` holds is a malformed reply.
    pub fn read_into(reply: &Reply, buf: &mut [u8]) -> Result<(usize, bool)> {
        if let Some(n) = reply.placed() {
            // The data went straight into the sink `submit_read_into` set:
            // `buf`, which must be that buffer. The body ends where it began.
            return match read3_header(reply.body()) {
                Some((at, len, eof)) if reply.body().len() == at + (4 - n % 4) % 4 && len == n && n <= buf.len() => Ok((n, eof)),
                _ => Err(Error::Malformed(format!("READ reply of {n} bytes received into the buffer does not decode"))),
            };
        }
        match decode::<p::READ3res>(reply.body())? {
            p::READ3res::NFS3_OK(ok) => {
                if ok.data.len() != ok.count as usize || ok.data.len() > buf.len() {
                    return Err(Error::Malformed(format!(
                        "READ count {} with {} data bytes for a {}-byte buffer",
                        ok.count,
                        ok.data.len(),
                        buf.len()
                    )));
                }
                buf[..ok.data.len()].copy_from_slice(ok.data);
                Ok((ok.data.len(), ok.eof))
            }
            p::READ3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// Decode a WRITE reply of `sent` bytes without remembering anything
    /// for COMMIT (the caller tracks verifiers itself, e.g. an engine whose
    /// buffers are reused and so cannot be resent).
    pub fn written(reply: &Reply, sent: usize) -> Result<Written> {
        let ok = match decode::<p::WRITE3res>(reply.body())? {
            p::WRITE3res::NFS3_OK(ok) => ok,
            p::WRITE3res::default(c, _) => return Err(nfs_err(c)),
        };
        if ok.count as usize > sent {
            return Err(Error::Malformed(format!("WRITE count {} over the {sent} bytes sent", ok.count)));
        }
        Ok(Written { count: ok.count, stable: ok.committed != p::stable_how::UNSTABLE, verf: ok.verf })
    }

    /// `written`, with the attributes after the write when the server
    /// sent them (a backend that answers with them saves a GETATTR).
    pub fn written_attr(reply: &Reply, sent: usize) -> Result<(Written, Option<Fattr>)> {
        let ok = match decode::<p::WRITE3res>(reply.body())? {
            p::WRITE3res::NFS3_OK(ok) => ok,
            p::WRITE3res::default(c, _) => return Err(nfs_err(c)),
        };
        if ok.count as usize > sent {
            return Err(Error::Malformed(format!("WRITE count {} over the {sent} bytes sent", ok.count)));
        }
        let w = Written { count: ok.count, stable: ok.committed != p::stable_how::UNSTABLE, verf: ok.verf };
        Ok((w, post_attr(ok.file_wcc.after)))
    }

    /// Queue a COMMIT of the whole file; its verifier from `committed`.
    /// Unlike `commit`, the writes tracked here are not consulted.
    pub fn submit_commit(&mut self, fh: &[u8]) -> Result<u32> {
        let a = p::COMMIT3args { file: fh3(fh), offset: 0, count: 0 };
        self.rpc.submit(p::NFS_PROGRAM, p::NFS_V3, 21, &|e| a.encode(e))
    }

    /// The verifier of a COMMIT reply.
    pub fn committed(reply: &Reply) -> Result<[u8; 8]> {
        match decode::<p::COMMIT3res>(reply.body())? {
            p::COMMIT3res::NFS3_OK(ok) => Ok(ok.verf),
            p::COMMIT3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// READ into `out`; returns eof.
    pub fn read(&mut self, fh: &[u8], offset: u64, count: u32, out: &mut Vec<u8>) -> Result<bool> {
        let xid = self.submit_read(fh, offset, count)?;
        let r = self.rpc.wait(xid)?;
        let eof = Self::finish_read(&r, out)?;
        if out.len() > count as usize {
            return Err(Error::Malformed(format!("READ of {count} bytes answered with {}", out.len())));
        }
        Ok(eof)
    }

    /// Queue a WRITE; complete it with `finish_write`.
    pub fn submit_write(&mut self, fh: &[u8], offset: u64, data: &[u8], stable: Stable) -> Result<u32> {
        let stable = match stable {
            Stable::Unstable => p::stable_how::UNSTABLE,
            Stable::FileSync => p::stable_how::FILE_SYNC,
        };
        // WRITE3args with its data last: the data goes into the send queue
        // once (`submit_payload`), not through the encoder.
        let file = fh3(fh);
        let count = data.len() as u32;
        self.rpc.submit_payload(
            p::NFS_PROGRAM,
            p::NFS_V3,
            7,
            &|e| {
                file.encode(e)?;
                e.u64(offset)?;
                e.u32(count)?;
                stable.encode(e)
            },
            data,
        )
    }

    /// Decode a WRITE reply and, when the server did not store it stably,
    /// remember the range (and data, within the bound) for COMMIT.
    pub fn finish_write(&mut self, reply: &Reply, fh: &[u8], offset: u64, data: &[u8]) -> Result<Written> {
        let ok = match decode::<p::WRITE3res>(reply.body())? {
            p::WRITE3res::NFS3_OK(ok) => ok,
            p::WRITE3res::default(c, _) => return Err(nfs_err(c)),
        };
        if ok.count as usize > data.len() {
            return Err(Error::Malformed(format!("WRITE count {} over the {} bytes sent", ok.count, data.len())));
        }
        let stable = ok.committed != p::stable_how::UNSTABLE;
        self.uncommitted.written(fh, offset, data, ok.count, stable, ok.verf);
        Ok(Written { count: ok.count, stable, verf: ok.verf })
    }

    pub fn write(&mut self, fh: &[u8], offset: u64, data: &[u8], stable: Stable) -> Result<Written> {
        let xid = self.submit_write(fh, offset, data, stable)?;
        let r = self.rpc.wait(xid)?;
        self.finish_write(&r, fh, offset, data)
    }

    /// Ranges of `fh` written UNSTABLE and not yet committed.
    pub fn uncommitted(&self, fh: &[u8]) -> Vec<(u64, u32)> {
        self.uncommitted.ranges(fh)
    }

    /// Hand the uncommitted writes of `old` over to `new` (the file got a
    /// new handle, e.g. re-created after a server restart).
    pub fn rebind(&mut self, old: &[u8], new: &[u8]) {
        self.uncommitted.rebind(old, new)
    }

    /// COMMIT the whole file. Ok(verifier) when every uncommitted write
    /// carried it; `Error::VerifierChanged` with the ranges otherwise (they
    /// stay tracked for `resend_uncommitted`).
    pub fn commit(&mut self, fh: &[u8]) -> Result<[u8; 8]> {
        let xid = self.submit_commit(fh)?;
        let verf = Self::committed(&self.rpc.wait(xid)?)?;
        self.uncommitted.committed(fh, verf)
    }

    /// Write again (UNSTABLE) every uncommitted write of `fh` whose data is
    /// held; returns the ranges sent. Follow with `commit`. Ranges whose
    /// data is not held are left for the caller (`uncommitted`).
    pub fn resend_uncommitted(&mut self, fh: &[u8]) -> Result<Vec<(u64, u32)>> {
        let mut held = self.uncommitted.take_held(fh);
        let mut sent = Vec::new();
        while !held.is_empty() {
            let u = held.remove(0);
            let data = u.data.as_ref().expect("held");
            if let Err(e) = self.write(fh, u.offset, data, Stable::Unstable) {
                // Keep what was not sent so a later resend can finish it.
                held.insert(0, u);
                self.uncommitted.give_back(fh, held);
                return Err(e);
            }
            sent.push((u.offset, u.len));
        }
        Ok(sent)
    }

    /// READDIRPLUS from `cookie` (0: the start): entries and eof.
    pub fn readdirplus(&mut self, dir: &[u8], cookie: u64, cookieverf: [u8; 8], maxcount: u32) -> Result<(Vec<DirEntry>, [u8; 8], bool)> {
        let r = self.call(17, &p::READDIRPLUS3args { dir: fh3(dir), cookie, cookieverf, dircount: maxcount, maxcount })?;
        match decode::<p::READDIRPLUS3res>(r.body())? {
            p::READDIRPLUS3res::NFS3_OK(ok) => {
                let mut out = Vec::new();
                let mut next = ok.reply.entries.as_deref();
                while let Some(e) = next {
                    out.push(DirEntry {
                        name: e.name.to_vec(),
                        fileid: e.fileid,
                        cookie: e.cookie,
                        fh: match &e.name_handle {
                            p::post_op_fh3::TRUE(h) => Some(h.data.to_vec()),
                            p::post_op_fh3::FALSE => None,
                        },
                        attr: match &e.name_attributes {
                            p::post_op_attr::TRUE(a) => Some(a.clone()),
                            p::post_op_attr::FALSE => None,
                        },
                    });
                    next = e.nextentry.as_deref();
                }
                Ok((out, ok.cookieverf, ok.reply.eof))
            }
            p::READDIRPLUS3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// Every entry of a directory (READDIRPLUS until eof, at most
    /// `entries_max` entries so a hostile server cannot grow it forever).
    pub fn readdir_all(&mut self, dir: &[u8], entries_max: usize) -> Result<Vec<DirEntry>> {
        let (mut cookie, mut verf, mut all) = (0u64, [0u8; 8], Vec::new());
        loop {
            let (es, v, eof) = self.readdirplus(dir, cookie, verf, 64 << 10)?;
            verf = v;
            if let Some(l) = es.last() {
                cookie = l.cookie;
            }
            let empty = es.is_empty();
            all.extend(es);
            if all.len() > entries_max {
                return Err(Error::Invalid(format!("directory has over {entries_max} entries")));
            }
            if eof || empty {
                return Ok(all);
            }
        }
    }
}

/// MOUNT MNT on any connection (the NFS port, or a separate mount port).
pub fn mount_on(rpc: &mut RpcConn, path: &str) -> Result<Vec<u8>> {
    let r = rpc.call(m::MOUNT_PROGRAM, m::MOUNT_V3, m::MOUNTPROC3_MNT, &|e| m::encode_dirpath(&path.as_bytes(), e))?;
    match decode::<m::mountres3>(r.body())? {
        m::mountres3::MNT3_OK(ok) => Ok(ok.fhandle.to_vec()),
        m::mountres3::default(c) => {
            let stat = m::mountstat3::from_i32(c).map_or_else(|| format!("mountstat3 {c}"), |s| format!("{s:?}"));
            Err(Error::Mount { stat, code: c as u32 })
        }
    }
}

/// MOUNT MNT through a mount service of its own at `addr` (a server whose
/// MOUNT is not on its NFS port): a connection just for the call.
pub fn mount_at(addr: &str, path: &str, auth: &Auth, limits: Limits) -> Result<Vec<u8>> {
    let mut rpc = RpcConn::connect(addr, auth, limits)?;
    mount_on(&mut rpc, path)
}

/// PMAPPROC_GETPORT (RFC 1833 §3.2) at the portmapper `addr`: the TCP port
/// of program `prog` version `vers` there, 0 when it has none registered.
pub fn portmap_getport(addr: &str, prog: u32, vers: u32, auth: &Auth, limits: Limits) -> Result<u16> {
    use proto::portmap as pm;
    let mut rpc = RpcConn::connect(addr, auth, limits)?;
    let want = pm::mapping { prog, vers, prot: 6, port: 0 };
    let r = rpc.call(pm::PMAP_PROG, pm::PMAP_VERS, pm::PMAPPROC_GETPORT, &|e| want.encode(e))?;
    let port = Decoder::new(r.body()).u32().map_err(xdr)?;
    u16::try_from(port).map_err(|_| Error::Malformed(format!("the portmapper at {addr} answered port {port}")))
}

/// What SETATTR changes (None: leave it); times are (seconds, nanoseconds)
/// or the server's clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// A time SETATTR sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Client(u32, u32),
    Server,
}

/// FSSTAT: sizes in bytes, counts in files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    pub tbytes: u64,
    pub fbytes: u64,
    pub abytes: u64,
    pub tfiles: u64,
    pub ffiles: u64,
    pub afiles: u64,
}

fn post_attr(a: p::post_op_attr) -> Option<Fattr> {
    match a {
        p::post_op_attr::TRUE(a) => Some(a),
        p::post_op_attr::FALSE => None,
    }
}

/// The procedures `chimera-fuse` needs beyond the I/O path: SETATTR,
/// ACCESS, READLINK, SYMLINK, RMDIR, RENAME, LINK, FSSTAT.
impl Nfs3 {
    /// SETATTR (unguarded): the attributes after, when the server sent them.
    pub fn setattr(&mut self, fh: &[u8], s: &SetAttr) -> Result<Option<Fattr>> {
        self.setattr_guarded(fh, s, None)
    }

    /// SETATTR, with `guard_ctime` (seconds, nanoseconds) applied only if
    /// the object's ctime still equals it (NFS3ERR_NOT_SYNC otherwise).
    pub fn setattr_guarded(&mut self, fh: &[u8], s: &SetAttr, guard_ctime: Option<(u32, u32)>) -> Result<Option<Fattr>> {
        let time = |t: Option<SetTime>| match t {
            None => (p::set_atime::DONT_CHANGE, p::set_mtime::DONT_CHANGE),
            Some(SetTime::Server) => (p::set_atime::SET_TO_SERVER_TIME, p::set_mtime::SET_TO_SERVER_TIME),
            Some(SetTime::Client(seconds, nseconds)) => (
                p::set_atime::SET_TO_CLIENT_TIME(p::nfstime3 { seconds, nseconds }),
                p::set_mtime::SET_TO_CLIENT_TIME(p::nfstime3 { seconds, nseconds }),
            ),
        };
        let attrs = p::sattr3 {
            mode: s.mode.map_or(p::set_mode3::FALSE, p::set_mode3::TRUE),
            uid: s.uid.map_or(p::set_uid3::FALSE, p::set_uid3::TRUE),
            gid: s.gid.map_or(p::set_gid3::FALSE, p::set_gid3::TRUE),
            size: s.size.map_or(p::set_size3::FALSE, p::set_size3::TRUE),
            atime: time(s.atime).0,
            mtime: time(s.mtime).1,
        };
        let guard = match guard_ctime {
            Some((seconds, nseconds)) => p::sattrguard3::TRUE(p::nfstime3 { seconds, nseconds }),
            None => p::sattrguard3::FALSE,
        };
        let r = self.call(2, &p::SETATTR3args { object: fh3(fh), new_attributes: attrs, guard })?;
        match decode::<p::SETATTR3res>(r.body())? {
            p::SETATTR3res::NFS3_OK(ok) => Ok(post_attr(ok.obj_wcc.after)),
            p::SETATTR3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// ACCESS: the bits of `mask` (ACCESS3_READ 0x1 ... EXECUTE 0x20) granted.
    pub fn access(&mut self, fh: &[u8], mask: u32) -> Result<u32> {
        let r = self.call(4, &p::ACCESS3args { object: fh3(fh), access: mask })?;
        match decode::<p::ACCESS3res>(r.body())? {
            p::ACCESS3res::NFS3_OK(ok) => Ok(ok.access),
            p::ACCESS3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    pub fn readlink(&mut self, fh: &[u8]) -> Result<Vec<u8>> {
        let r = self.call(5, &p::READLINK3args { symlink: fh3(fh) })?;
        match decode::<p::READLINK3res>(r.body())? {
            p::READLINK3res::NFS3_OK(ok) => Ok(ok.data.to_vec()),
            p::READLINK3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// SYMLINK `name` in `dir` pointing at `target`: the new handle.
    pub fn symlink(&mut self, dir: &[u8], name: &[u8], target: &[u8]) -> Result<Vec<u8>> {
        let a = p::SYMLINK3args {
            r#where: p::diropargs3 { dir: fh3(dir), name },
            symlink: p::symlinkdata3 { symlink_attributes: sattr_mode(None), symlink_data: target },
        };
        let r = self.call(10, &a)?;
        match decode::<p::SYMLINK3res>(r.body())? {
            p::SYMLINK3res::NFS3_OK(ok) => match ok.obj {
                p::post_op_fh3::TRUE(h) => Ok(h.data.to_vec()),
                // No handle in the reply: look the new name up.
                p::post_op_fh3::FALSE => Ok(self.lookup(dir, name)?.0),
            },
            p::SYMLINK3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    pub fn rmdir(&mut self, dir: &[u8], name: &[u8]) -> Result<()> {
        let r = self.call(13, &p::RMDIR3args { object: p::diropargs3 { dir: fh3(dir), name } })?;
        match decode::<p::RMDIR3res>(r.body())? {
            p::RMDIR3res::NFS3_OK(_) => Ok(()),
            p::RMDIR3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    pub fn rename(&mut self, from_dir: &[u8], from: &[u8], to_dir: &[u8], to: &[u8]) -> Result<()> {
        let a = p::RENAME3args {
            from: p::diropargs3 { dir: fh3(from_dir), name: from },
            to: p::diropargs3 { dir: fh3(to_dir), name: to },
        };
        let r = self.call(14, &a)?;
        match decode::<p::RENAME3res>(r.body())? {
            p::RENAME3res::NFS3_OK(_) => Ok(()),
            p::RENAME3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    /// LINK `file` as `name` in `dir`: the file's attributes after, if sent.
    pub fn link(&mut self, file: &[u8], dir: &[u8], name: &[u8]) -> Result<Option<Fattr>> {
        let r = self.call(15, &p::LINK3args { file: fh3(file), link: p::diropargs3 { dir: fh3(dir), name } })?;
        match decode::<p::LINK3res>(r.body())? {
            p::LINK3res::NFS3_OK(ok) => Ok(post_attr(ok.file_attributes)),
            p::LINK3res::default(c, _) => Err(nfs_err(c)),
        }
    }

    pub fn fsstat(&mut self, fh: &[u8]) -> Result<FsStat> {
        let r = self.call(18, &p::FSSTAT3args { fsroot: fh3(fh) })?;
        match decode::<p::FSSTAT3res>(r.body())? {
            p::FSSTAT3res::NFS3_OK(ok) => Ok(FsStat {
                tbytes: ok.tbytes,
                fbytes: ok.fbytes,
                abytes: ok.abytes,
                tfiles: ok.tfiles,
                ffiles: ok.ffiles,
                afiles: ok.afiles,
            }),
            p::FSSTAT3res::default(c, _) => Err(nfs_err(c)),
        }
    }
}

/// A READ3 result's fixed part, from the start of `body`: where its data
/// starts, how long it is, eof. None for an error status, a count that is
/// not the data's length, or a body that ends before the data.
fn read3_header(body: &[u8]) -> Option<(usize, usize, bool)> {
    let word = |at: usize| body.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    if word(0)? != 0 {
        return None; // not NFS3_OK
    }
    let mut at = 4;
    match word(at)? {
        0 => at += 4,
        1 => at += 4 + FATTR3_BYTES,
        _ => return None,
    }
    let count = word(at)?;
    let eof = match word(at + 4)? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let len = word(at + 8)?;
    if len != count {
        return None;
    }
    Some((at + 12, len as usize, eof))
}

/// `RpcConn::set_sink`'s `locate` for READ3 replies.
fn read3_data(body: &[u8]) -> Option<(usize, usize)> {
    read3_header(body).map(|(at, len, _)| (at, len))
}

/// XDR size of fattr3 (RFC 1813: type, mode, nlink, uid, gid, size, used,
/// rdev, fsid, fileid, atime, mtime, ctime).
const FATTR3_BYTES: usize = 84;
