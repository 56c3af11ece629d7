//! chimera-fuse: a FUSE file system over the userspace NFSv3 client
//! (README.md). One connection behind a Mutex; reconnect + re-MOUNT + retry
//! on a connection error; unstable writes committed on flush / fsync and
//! every `COMMIT_EVERY` bytes, resent when the commit verifier changed.

use client::nfs3::{Fattr, Nfs3, SetAttr, SetTime, Stable};
use client::{Auth, Error, Limits, RpcConn};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};
use proto::nfs3::ftype3;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A line on stderr, ignoring a closed one (a detached daemon outlives the
/// terminal or pipe it was started from; `eprintln!` would panic there).
macro_rules! log {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

mod sidecar;

/// Unstable bytes written to one file before a COMMIT is sent without
/// waiting for flush: bounds what a server restart can make us resend.
const COMMIT_EVERY: u64 = 32 << 20;
/// Copies of uncommitted data the client keeps for resends (all files).
const HELD_BYTES_MAX: usize = 256 << 20;
/// Entries of one directory read at opendir.
const DIR_ENTRIES_MAX: usize = 1 << 20;
/// Largest READ / WRITE sent (the kernel's max_write is set to it).
const IO_MAX: u32 = 1 << 20;

#[derive(Debug, Clone)]
struct Opts {
    server: String,
    export: String,
    mount_port: Option<u16>,
    uid: u32,
    gid: u32,
    attr_timeout: Duration,
    entry_timeout: Duration,
    writeback: bool,
    foreground: bool,
    allow_other: bool,
    fuse_fd: Option<i32>,
    reconnect_timeout: Duration,
    call_timeout: Duration,
    max_inodes: usize,
    mountpoint: Option<String>,
    /// Sidecar mode: volumes arrive as sockets in this directory.
    sidecar_dir: Option<String>,
    /// RPC-over-RDMA to the server (`--transport rdma`).
    rdma: bool,
}

const USAGE: &str = "usage: chimera-fuse --server HOST:PORT --export PATH [options] MOUNTPOINT
       chimera-fuse --server HOST:PORT --export PATH --fuse-fd N [options]
       chimera-fuse --sidecar-dir DIR [options]
options:
  --transport tcp|rdma     rdma: RPC-over-RDMA v1 to the server's RDMA port (default tcp)
  --mount-port N           MOUNT service port (default: MOUNT on the NFS port)
  --uid N / --gid N        AUTH_SYS credentials (default: the caller's)
  --attr-timeout-ms N      kernel attribute cache (default 1000)
  --entry-timeout-ms N     kernel name cache (default 1000)
  --writeback              kernel writeback cache
  --foreground             do not detach; log to stderr
  --allow-other            let other users than the mounter use the mount
  --fuse-fd N              serve an already-mounted /dev/fuse descriptor
  --sidecar-dir DIR        serve the descriptors handed over DIR/<name>/socket
                           (CSI mountMode: sidecar; server and export come with each)
  --reconnect-timeout-ms N how long an operation retries a lost server (default 60000)
  --call-timeout-ms N      one RPC's timeout (default 30000)
  --max-inodes N           bound of the inode table (default 1048576)";

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Opts, String> {
    let mut o = Opts {
        server: String::new(),
        export: String::new(),
        mount_port: None,
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        attr_timeout: Duration::from_millis(1000),
        entry_timeout: Duration::from_millis(1000),
        writeback: false,
        foreground: false,
        allow_other: false,
        fuse_fd: None,
        reconnect_timeout: Duration::from_millis(60_000),
        call_timeout: Duration::from_millis(30_000),
        max_inodes: 1 << 20,
        mountpoint: None,
        sidecar_dir: None,
        rdma: false,
    };
    let mut it = args.into_iter();
    fn num<T: std::str::FromStr>(it: &mut impl Iterator<Item = String>, name: &str) -> Result<T, String> {
        let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
        v.parse().map_err(|_| format!("{name}: not a number: {v}"))
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--server" => o.server = it.next().ok_or("--server needs HOST:PORT")?,
            "--export" => o.export = it.next().ok_or("--export needs a path")?,
            "--mount-port" => o.mount_port = Some(num(&mut it, &a)?),
            "--transport" => {
                o.rdma = match it.next().as_deref() {
                    Some("tcp") => false,
                    Some("rdma") => true,
                    Some(t) => return Err(format!("--transport {t}: neither tcp nor rdma")),
                    None => return Err("--transport needs tcp or rdma".into()),
                }
            }
            "--uid" => o.uid = num(&mut it, &a)?,
            "--gid" => o.gid = num(&mut it, &a)?,
            "--attr-timeout-ms" => o.attr_timeout = Duration::from_millis(num(&mut it, &a)?),
            "--entry-timeout-ms" => o.entry_timeout = Duration::from_millis(num(&mut it, &a)?),
            "--reconnect-timeout-ms" => o.reconnect_timeout = Duration::from_millis(num(&mut it, &a)?),
            "--call-timeout-ms" => o.call_timeout = Duration::from_millis(num(&mut it, &a)?),
            "--max-inodes" => o.max_inodes = num(&mut it, &a)?,
            "--fuse-fd" => o.fuse_fd = Some(num(&mut it, &a)?),
            "--sidecar-dir" => o.sidecar_dir = Some(it.next().ok_or("--sidecar-dir needs a directory")?),
            "--writeback" => o.writeback = true,
            "--foreground" | "-f" => o.foreground = true,
            "--allow-other" => o.allow_other = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            _ if o.mountpoint.is_none() => o.mountpoint = Some(a),
            _ => return Err(format!("unexpected argument {a}")),
        }
    }
    if o.sidecar_dir.is_some() {
        // Each volume brings its own server, export and identity.
        if !o.server.is_empty() || !o.export.is_empty() || o.mountpoint.is_some() || o.fuse_fd.is_some() {
            return Err("--sidecar-dir takes no --server, --export, --fuse-fd or MOUNTPOINT".into());
        }
        return Ok(o);
    }
    if o.server.is_empty() || o.export.is_empty() {
        return Err("--server and --export are required".into());
    }
    if o.mountpoint.is_none() == o.fuse_fd.is_none() {
        return Err("give a MOUNTPOINT or --fuse-fd N (one of them)".into());
    }
    Ok(o)
}

/// The connection and what rebuilding it needs.
struct Conn {
    nfs: Nfs3,
    root: Vec<u8>,
    opts: Opts,
    /// Unstable bytes per file handle since its last COMMIT.
    dirty: HashMap<Vec<u8>, u64>,
    /// A reconnect ran out of time: until one succeeds, each operation
    /// tries to connect once and fails with EIO at once (no wait per call).
    down: bool,
}

fn limits(o: &Opts) -> Limits {
    Limits { timeout: o.call_timeout, connect_timeout: Duration::from_secs(5).min(o.call_timeout), ..Limits::default() }
}

fn auth(o: &Opts) -> Auth {
    Auth::sys(o.uid, o.gid)
}

fn mount_root(o: &Opts, rpc: &mut RpcConn) -> client::Result<Vec<u8>> {
    match o.mount_port {
        None => client::nfs3::mount_on(rpc, &o.export),
        Some(p) => {
            let host = o.server.rsplit_once(':').map_or(o.server.as_str(), |(h, _)| h);
            client::nfs3::mount_at(&format!("{host}:{p}"), &o.export, &auth(o), limits(o))
        }
    }
}

/// A connection to the server over the transport asked for.
fn dial(o: &Opts) -> client::Result<RpcConn> {
    if o.rdma {
        RpcConn::connect_rdma(&o.server, &auth(o), limits(o))
    } else {
        RpcConn::connect(&o.server, &auth(o), limits(o))
    }
}

/// Worth a reconnect: the connection is gone or the server did not answer.
fn retryable(e: &Error) -> bool {
    e.is_connection() || matches!(e, Error::Timeout { .. })
}

fn errno_of(e: &Error) -> Errno {
    if retryable(e) {
        return Errno::EIO;
    }
    Errno::from_i32(e.errno())
}

impl Conn {
    fn open(opts: Opts) -> client::Result<Conn> {
        let mut rpc = dial(&opts)?;
        let root = mount_root(&opts, &mut rpc)?;
        let mut nfs = Nfs3::over(rpc);
        nfs.set_held_bytes_max(HELD_BYTES_MAX);
        Ok(Conn { nfs, root, opts, dirty: HashMap::new(), down: false })
    }

    /// New connection + MOUNT, retried until `deadline`.
    fn reconnect(&mut self, deadline: Instant) -> client::Result<()> {
        loop {
            let r = dial(&self.opts).and_then(|mut rpc| {
                let root = mount_root(&self.opts, &mut rpc)?;
                Ok((rpc, root))
            });
            match r {
                Ok((rpc, root)) => {
                    self.nfs.replace_conn(rpc);
                    if root != self.root {
                        log!("chimera-fuse: the export's root handle changed across the reconnect");
                        self.root = root;
                    }
                    log!("chimera-fuse: reconnected to {}", self.opts.server);
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Run `f`; on a lost connection reconnect and run it again, until the
    /// reconnect timeout. (A retried non-idempotent call may report EEXIST
    /// or ENOENT for work its first attempt did.)
    fn run<T>(&mut self, mut f: impl FnMut(&mut Nfs3) -> client::Result<T>) -> Result<T, Errno> {
        let mut deadline: Option<Instant> = None;
        loop {
            match f(&mut self.nfs) {
                Ok(v) => return Ok(v),
                Err(e) if retryable(&e) => {
                    let wait = if self.down { Duration::ZERO } else { self.opts.reconnect_timeout };
                    let d = *deadline.get_or_insert_with(|| Instant::now() + wait);
                    if !self.down {
                        log!("chimera-fuse: {e}; reconnecting");
                    }
                    if self.down && Instant::now() > d {
                        return Err(Errno::EIO);
                    }
                    if let Err(e) = self.reconnect(d) {
                        if !self.down {
                            log!("chimera-fuse: reconnect to {} failed: {e}; operations fail with EIO until it answers", self.opts.server);
                        }
                        self.down = true;
                        return Err(Errno::EIO);
                    }
                    self.down = false;
                }
                Err(e) => return Err(errno_of(&e)),
            }
        }
    }

    /// COMMIT `fh`; when the verifier changed (server restart), write the
    /// held data again and commit again.
    fn commit(&mut self, fh: &[u8]) -> Result<(), Errno> {
        for _ in 0..4 {
            match self.run(|n| match n.commit(fh) {
                Ok(_) => Ok(None),
                Err(Error::VerifierChanged { ranges, resendable }) => Ok(Some((ranges, resendable))),
                Err(e) => Err(e),
            })? {
                None => {
                    self.dirty.remove(fh);
                    return Ok(());
                }
                Some((ranges, resendable)) => {
                    log!("chimera-fuse: commit verifier changed: resending {} ranges", ranges.len());
                    if !resendable {
                        log!("chimera-fuse: uncommitted data beyond the held bound was lost");
                        return Err(Errno::EIO);
                    }
                    self.run(|n| n.resend_uncommitted(fh))?;
                }
            }
        }
        Err(Errno::EIO)
    }
}

struct Node {
    fh: Vec<u8>,
    nlookup: u64,
}

/// Inode numbers are the server's fileids (root and fileid 1 swapped, FUSE's
/// root is 1), so readdir and stat agree; the table maps the ones the
/// kernel holds to their file handles and drops them on forget.
struct State {
    conn: Conn,
    nodes: HashMap<u64, Node>,
    root_fileid: u64,
    dirs: HashMap<u64, Vec<(u64, FileType, Vec<u8>)>>,
    next_dir: u64,
}

struct ChimeraFs {
    /// Shared with the sidecar's registry, which commits what is still
    /// unstable when it is told to stop.
    st: Arc<Mutex<State>>,
    attr_ttl: Duration,
    entry_ttl: Duration,
    writeback: bool,
    max_inodes: usize,
}

fn kind(t: ftype3) -> FileType {
    match t {
        ftype3::NF3REG => FileType::RegularFile,
        ftype3::NF3DIR => FileType::Directory,
        ftype3::NF3BLK => FileType::BlockDevice,
        ftype3::NF3CHR => FileType::CharDevice,
        ftype3::NF3LNK => FileType::Symlink,
        ftype3::NF3SOCK => FileType::Socket,
        ftype3::NF3FIFO => FileType::NamedPipe,
    }
}

fn time(t: &proto::nfs3::nfstime3) -> SystemTime {
    UNIX_EPOCH + Duration::new(t.seconds as u64, t.nseconds.min(999_999_999))
}

fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Server,
        TimeOrNow::SpecificTime(s) => {
            let d = s.duration_since(UNIX_EPOCH).unwrap_or_default();
            SetTime::Client(d.as_secs() as u32, d.subsec_nanos())
        }
    })
}

/// FUSE inode number of a fileid: the root's is 1, and a file whose fileid
/// is 1 takes the root's fileid (a swap: still one number per file).
fn ino_of(root_fileid: u64, fileid: u64) -> u64 {
    if fileid == root_fileid {
        1
    } else if fileid == 1 {
        root_fileid
    } else {
        fileid
    }
}

impl State {
    fn ino(&self, fileid: u64) -> u64 {
        ino_of(self.root_fileid, fileid)
    }

    fn attr(&self, a: &Fattr) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.ino(a.fileid)),
            size: a.size,
            blocks: a.used.div_ceil(512),
            atime: time(&a.atime),
            mtime: time(&a.mtime),
            ctime: time(&a.ctime),
            crtime: time(&a.ctime),
            kind: kind(a.r#type),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: (a.rdev.specdata1 << 8) | (a.rdev.specdata2 & 0xff),
            blksize: 128 << 10,
            flags: 0,
        }
    }

    fn fh(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        if ino.0 == 1 {
            return Ok(self.conn.root.clone());
        }
        self.nodes.get(&ino.0).map(|n| n.fh.clone()).ok_or(Errno::ESTALE)
    }

    /// The kernel learned `fh` (lookup count + 1): its attributes.
    fn remember(&mut self, fh: Vec<u8>, attr: Option<Fattr>, max: usize) -> Result<FileAttr, Errno> {
        let a = match attr {
            Some(a) => a,
            None => self.conn.run(|n| n.getattr(&fh))?,
        };
        let fa = self.attr(&a);
        if fa.ino.0 != 1 {
            if !self.nodes.contains_key(&fa.ino.0) && self.nodes.len() >= max {
                log!("chimera-fuse: inode table full ({max} entries the kernel holds)");
                return Err(Errno::ENFILE);
            }
            let n = self.nodes.entry(fa.ino.0).or_insert(Node { fh: fh.clone(), nlookup: 0 });
            n.fh = fh;
            n.nlookup += 1;
        }
        Ok(fa)
    }
}

impl ChimeraFs {
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, reply: ReplyEntry, r: Result<FileAttr, Errno>) {
        match r {
            Ok(a) => reply.entry_with_ttls(&self.attr_ttl, &self.entry_ttl, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

impl State {
    /// COMMIT every file with unstable data (destroy, and the sidecar's stop).
    fn commit_all(&mut self) {
        let fhs: Vec<Vec<u8>> = self.conn.dirty.keys().cloned().collect();
        for fh in fhs {
            let _ = self.conn.commit(&fh);
        }
    }
}

fn name_ok(name: &OsStr) -> Result<&[u8], Errno> {
    let b = name.as_bytes();
    if b.len() > 255 {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(b)
}

impl Filesystem for ChimeraFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(IO_MAX);
        let _ = config.set_max_readahead(IO_MAX);
        if self.writeback {
            if config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE).is_err() {
                log!("chimera-fuse: the kernel offers no writeback cache; running without");
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        // Commit whatever is still unstable before the session ends.
        self.st().commit_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.st();
        let r = (|| {
            let dir = st.fh(parent)?;
            let name = name_ok(name)?;
            let (fh, attr) = st.conn.run(|n| n.lookup(&dir, name))?;
            st.remember(fh, attr, self.max_inodes)
        })();
        self.entry(reply, r)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut st = self.st();
        if let Some(n) = st.nodes.get_mut(&ino.0) {
            n.nlookup = n.nlookup.saturating_sub(nlookup);
            if n.nlookup == 0 {
                st.nodes.remove(&ino.0);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut st = self.st();
        let r = (|| {
            let fh = st.fh(ino)?;
            let a = st.conn.run(|n| n.getattr(&fh))?;
            Ok(st.attr(&a))
        })();
        match r {
            Ok(a) => reply.attr(&self.attr_ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.st();
        let r = (|| {
            let fh = st.fh(ino)?;
            let s = SetAttr { mode: mode.map(|m| m & 0o7777), uid, gid, size, atime: set_time(atime), mtime: set_time(mtime) };
            let after = st.conn.run(|n| n.setattr(&fh, &s))?;
            let a = match after {
                Some(a) => a,
                None => st.conn.run(|n| n.getattr(&fh))?,
            };
            Ok(st.attr(&a))
        })();
        match r {
            Ok(a) => reply.attr(&self.attr_ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let mut st = self.st();
        let r = (|| {
            let fh = st.fh(ino)?;
            st.conn.run(|n| n.readlink(&fh))
        })();
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut st = self.st();
        let r = (|| {
            let dir = st.fh(parent)?;
            let name = name_ok(name)?;
            let fh = st.conn.run(|n| n.mkdir(&dir, name, mode & !umask & 0o7777))?;
            st.remember(fh, None, self.max_inodes)
        })();
        self.entry(reply, r)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st();
        let r = (|| {
            let dir = st.fh(parent)?;
            let name = name_ok(name)?;
            st.conn.run(|n| n.remove(&dir, name))
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st();
        let r = (|| {
            let dir = st.fh(parent)?;
            let name = name_ok(name)?;
            st.conn.run(|n| n.rmdir(&dir, name))
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, _req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let mut st = self.st();
        let r = (|| {
            let dir = st.fh(parent)?;
            let name = name_ok(link_name)?;
            let t = target.as_os_str().as_bytes();
            let fh = st.conn.run(|n| n.symlink(&dir, name, t))?;
            st.remember(fh, None, self.max_inodes)
        })();
        self.entry(reply, r)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            // RENAME_NOREPLACE / EXCHANGE / WHITEOUT: NFSv3 has no such thing.
            return reply.error(Errno::EINVAL);
        }
        let mut st = self.st();
        let r = (|| {
            let from = st.fh(parent)?;
            let to = st.fh(newparent)?;
            let (a, b) = (name_ok(name)?, name_ok(newname)?);
            st.conn.run(|n| n.rename(&from, a, &to, b))
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let mut st = self.st();
        let r = (|| {
            let fh = st.fh(ino)?;
            let dir = st.fh(newparent)?;
            let name = name_ok(newname)?;
            let after = st.conn.run(|n| n.link(&fh, &dir, name))?;
            st.remember(fh, after, self.max_inodes)
        })();
        self.entry(reply, r)
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.st().fh(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut st = self.st();
        let r = (|| {
            let fh = st.fh(ino)?;
            let mut got = Vec::with_capacity(size as usize);
            let mut out = Vec::new();
            while got.len() < size as usize {
                let want = (size as usize - got.len()).min(IO_MAX as usize) as u32;
                let off = offset + got.len() as u64;
                let eof = st.conn.run(|n| n.read(&fh, off, want, &mut out))?;
                got.extend_from_slice(&out);
                if eof || out.is_empty() {
                    break;
                }
            }
            Ok(got)
        })();
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.st();
        let r = (|| {
            let fh = st.fh(ino)?;
            let mut done = 0usize;
            while done < data.len() {
                let part = &data[done..];
                let off = offset + done as u64;
                let w = st.conn.run(|n| n.write(&fh, off, part, Stable::Unstable))?;
                if w.count == 0 {
                    return Err(Errno::EIO);
                }
                done += w.count as usize;
                if !w.stable {
                    let d = st.conn.dirty.entry(fh.clone()).or_insert(0);
                    *d += w.count as u64;
                    if *d >= COMMIT_EVERY {
                        st.conn.commit(&fh)?;
                    }
                }
            }
            Ok(done as u32)
        })();
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        self.sync(ino, reply)
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync(ino, reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.st();
        let r = (|| {
            let fh = st.fh(ino)?;
            let all = st.conn.run(|n| n.readdir_all(&fh, DIR_ENTRIES_MAX))?;
            let mut list = vec![(ino.0, FileType::Directory, b".".to_vec()), (ino.0, FileType::Directory, b"..".to_vec())];
            for e in all {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let k = e.attr.as_ref().map_or(FileType::RegularFile, |a| kind(a.r#type));
                list.push((st.ino(e.fileid), k, e.name));
            }
            st.next_dir += 1;
            let id = st.next_dir;
            st.dirs.insert(id, list);
            Ok(id)
        })();
        match r {
            Ok(id) => reply.opened(FileHandle(id), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let st = self.st();
        let Some(list) = st.dirs.get(&fh.0) else { return reply.error(Errno::EBADF) };
        for (i, (ino, k, name)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *k, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.st().dirs.remove(&fh.0);
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let mut st = self.st();
        let root = st.conn.root.clone();
        match st.conn.run(|n| n.fsstat(&root)) {
            Ok(s) => {
                let b = 4096u64;
                reply.statfs(s.tbytes / b, s.fbytes / b, s.abytes / b, s.tfiles, s.afiles, b as u32, 255, b as u32)
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let mut st = self.st();
        let r = (|| {
            let dir = st.fh(parent)?;
            let name = name_ok(name)?;
            let excl = flags & libc::O_EXCL != 0;
            let fh = st.conn.run(|n| n.create(&dir, name, mode & !umask & 0o7777, excl))?;
            let a = st.conn.run(|n| n.getattr(&fh))?;
            if flags & libc::O_TRUNC != 0 && a.size != 0 {
                st.conn.run(|n| n.setattr(&fh, &SetAttr { size: Some(0), ..Default::default() }))?;
                return st.remember(fh, None, self.max_inodes);
            }
            st.remember(fh, Some(a), self.max_inodes)
        })();
        match r {
            Ok(a) => reply.created(&self.entry_ttl, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }
}

impl ChimeraFs {
    /// flush / fsync: COMMIT what this file wrote unstably.
    fn sync(&self, ino: INodeNo, reply: ReplyEmpty) {
        let mut st = self.st();
        let r = (|| {
            let fh = st.fh(ino)?;
            if st.conn.dirty.contains_key(&fh) || !st.conn.nfs.uncommitted(&fh).is_empty() {
                st.conn.commit(&fh)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// Block the termination signals in every thread (the session threads
/// inherit the mask); the main thread takes them with sigtimedwait.
fn block_signals() -> libc::sigset_t {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Wait for a termination signal or the session's end (an external umount).
fn wait_signal(set: &libc::sigset_t, done: &dyn Fn() -> bool) -> Option<i32> {
    loop {
        if done() {
            return None;
        }
        let ts = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
        let s = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
        if s > 0 {
            return Some(s);
        }
    }
}

/// Without --foreground: fork; the parent exits 0 once the child reports
/// the mount ready over a pipe, or with the child's status if it fails.
fn detach() -> Option<i32> {
    let mut fds = [0i32; 2];
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        log!("chimera-fuse: pipe: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    match unsafe { libc::fork() } {
        -1 => {
            log!("chimera-fuse: fork: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
        0 => {
            unsafe {
                libc::close(fds[0]);
                libc::setsid();
            }
            Some(fds[1])
        }
        child => {
            unsafe { libc::close(fds[1]) };
            let mut b = [0u8; 1];
            let n = unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
            if n == 1 {
                std::process::exit(0);
            }
            let mut status = 0;
            unsafe { libc::waitpid(child, &mut status, 0) };
            std::process::exit(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status).max(1) } else { 1 });
        }
    }
}

/// The file system over one export: connect, MOUNT, the root's attributes.
/// Shared by the mounting mode, `--fuse-fd` and each sidecar volume.
fn open_fs(opts: &Opts) -> Result<ChimeraFs, String> {
    let mut conn = Conn::open(opts.clone()).map_err(|e| format!("cannot mount {}:{}: {e}", opts.server, opts.export))?;
    let root = conn.root.clone();
    let root_fileid = conn
        .run(|n| n.getattr(&root))
        .map_err(|e| format!("GETATTR of {}:{} root: {e:?}", opts.server, opts.export))?
        .fileid;
    Ok(ChimeraFs {
        st: Arc::new(Mutex::new(State {
            conn,
            nodes: HashMap::new(),
            root_fileid,
            dirs: HashMap::new(),
            next_dir: 0,
        })),
        attr_ttl: opts.attr_timeout,
        entry_ttl: opts.entry_timeout,
        writeback: opts.writeback,
        max_inodes: opts.max_inodes,
    })
}

fn fuse_config(opts: &Opts) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("{}:{}", opts.server, opts.export)),
        MountOption::Subtype("chimera".into()),
        MountOption::DefaultPermissions,
    ];
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    config
}

/// A session on a `/dev/fuse` descriptor someone else opened and mounted
/// (`--fuse-fd`, and every volume the sidecar is handed). The handshake
/// (the kernel's INIT) runs here.
fn session_on_fd(fs: ChimeraFs, fd: std::os::fd::OwnedFd, opts: &Opts) -> std::io::Result<fuser::Session<ChimeraFs>> {
    let config = fuse_config(opts);
    let acl = config.acl;
    fuser::Session::from_fd(fs, fd, acl, config)
}

fn main() {
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(m) => {
            log!("chimera-fuse: {m}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Some(dir) = opts.sidecar_dir.clone() {
        let sigs = block_signals();
        sidecar::run(Path::new(&dir), &opts, &sigs);
    }
    let ready_fd = if opts.foreground || opts.fuse_fd.is_some() { None } else { detach() };
    let sigs = block_signals();

    let fs = match open_fs(&opts) {
        Ok(fs) => fs,
        Err(e) => {
            log!("chimera-fuse: {e}");
            std::process::exit(1);
        }
    };

    let session = if let Some(fd) = opts.fuse_fd {
        use std::os::fd::{FromRawFd, OwnedFd};
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            log!("chimera-fuse: --fuse-fd {fd}: not an open descriptor");
            std::process::exit(1);
        }
        session_on_fd(fs, unsafe { OwnedFd::from_raw_fd(fd) }, &opts)
    } else {
        fuser::Session::new(fs, opts.mountpoint.as_deref().unwrap(), &fuse_config(&opts))
    };
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            let what = opts.mountpoint.clone().unwrap_or_else(|| format!("fd {}", opts.fuse_fd.unwrap_or(-1)));
            log!("chimera-fuse: FUSE session on {what}: {e}");
            std::process::exit(1);
        }
    };
    let bg = match session.spawn() {
        Ok(b) => b,
        Err(e) => {
            log!("chimera-fuse: session thread: {e}");
            std::process::exit(1);
        }
    };
    log!(
        "chimera-fuse: {}:{} served on {}",
        opts.server,
        opts.export,
        opts.mountpoint.clone().unwrap_or_else(|| format!("fd {}", opts.fuse_fd.unwrap_or(-1)))
    );
    if let Some(fd) = ready_fd {
        unsafe {
            libc::write(fd, b"1".as_ptr().cast(), 1);
            libc::close(fd);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                libc::dup2(null, 0);
            }
        }
    }
    match wait_signal(&sigs, &|| bg.guard.is_finished()) {
        Some(s) => {
            log!("chimera-fuse: signal {s}: unmounting");
            if opts.fuse_fd.is_some() {
                // Whoever mounted the descriptor unmounts it.
                std::process::exit(0);
            }
            if let Err(e) = bg.umount_and_join() {
                log!("chimera-fuse: unmount: {e}; detaching lazily");
                if let Some(m) = &opts.mountpoint {
                    let c = std::ffi::CString::new(m.as_bytes()).unwrap_or_default();
                    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                }
                std::process::exit(1);
            }
            std::process::exit(0);
        }
        None => {
            let r = bg.join();
            log!("chimera-fuse: session ended ({})", r.as_ref().map_or_else(|e| e.to_string(), |_| "unmounted".into()));
            std::process::exit(if r.is_ok() { 0 } else { 1 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Opts, String> {
        parse_args(s.split_whitespace().map(String::from))
    }

    #[test]
    fn options() {
        let o = args("--server h:2049 --export /m --mount-port 20048 --uid 7 --gid 8 --attr-timeout-ms 5 --entry-timeout-ms 6 --writeback --foreground /mnt").unwrap();
        assert_eq!((o.server.as_str(), o.export.as_str(), o.mount_port, o.uid, o.gid), ("h:2049", "/m", Some(20048), 7, 8));
        assert_eq!((o.attr_timeout, o.entry_timeout), (Duration::from_millis(5), Duration::from_millis(6)));
        assert!(o.writeback && o.foreground && o.fuse_fd.is_none());
        assert_eq!(o.mountpoint.as_deref(), Some("/mnt"));
        assert!(!o.rdma, "TCP unless asked");
        let o = args("--server h:1 --export /m --fuse-fd 3").unwrap();
        assert_eq!((o.fuse_fd, o.mountpoint), (Some(3), None));
        assert!(args("--server h:20049 --export /m --transport rdma /mnt").unwrap().rdma);
        assert!(!args("--server h:1 --export /m --transport tcp /mnt").unwrap().rdma);
        assert_eq!(args("--server h:1 --export /m --transport udp /mnt").unwrap_err(), "--transport udp: neither tcp nor rdma");
        for bad in [
            "--export /m /mnt",
            "--server h:1 /mnt",
            "--server h:1 --export /m",
            "--server h:1 --export /m --fuse-fd 3 /mnt",
            "--server h:1 --export /m --uid x /mnt",
            "--server h:1 --export /m --bogus /mnt",
            "--server h:1 --export /m /a /b",
            "--server h:1 --export /m --uid",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn inode_numbers() {
        assert_eq!(ino_of(5, 5), 1);
        assert_eq!(ino_of(5, 1), 5);
        assert_eq!(ino_of(5, 9), 9);
        assert_eq!(ino_of(1, 1), 1);
        assert_eq!(ino_of(1, 2), 2);
    }

    #[test]
    fn errnos_and_times() {
        assert_eq!(errno_of(&Error::Closed), Errno::EIO);
        assert_eq!(errno_of(&Error::ConnectionLost("x".into())), Errno::EIO);
        assert_eq!(errno_of(&Error::Nfs3 { stat: "NFS3ERR_NOENT".into(), code: 2 }), Errno::ENOENT);
        assert_eq!(errno_of(&Error::Nfs3 { stat: "NFS3ERR_NOTEMPTY".into(), code: 66 }), Errno::ENOTEMPTY);
        assert_eq!(errno_of(&Error::Nfs3 { stat: "NFS3ERR_STALE".into(), code: 70 }), Errno::ESTALE);
        assert_eq!(set_time(Some(TimeOrNow::Now)), Some(SetTime::Server));
        let t = UNIX_EPOCH + Duration::new(981_173_106, 42);
        assert_eq!(set_time(Some(TimeOrNow::SpecificTime(t))), Some(SetTime::Client(981_173_106, 42)));
        assert_eq!(time(&proto::nfs3::nfstime3 { seconds: 981_173_106, nseconds: 42 }), t);
        assert_eq!(kind(ftype3::NF3LNK), FileType::Symlink);
        assert_eq!(kind(ftype3::NF3DIR), FileType::Directory);
    }
}
