//! `--sidecar-dir DIR`: the container CSI `mountMode: sidecar` injects into
//! a pod. The CSI node plugin opens `/dev/fuse`, mounts it on the volume's
//! target path and listens on `DIR/<name>/socket` (DIR is an emptyDir the
//! pod shares with the node plugin). We poll DIR, connect to each new socket
//! once and receive one message: a JSON document (`VolumeMsg`) and, as
//! SCM_RIGHTS, the mounted descriptor, which we then serve exactly like
//! `--fuse-fd` (`open_fs` + `session_on_fd`), each volume on its own
//! thread. No mount(2) here, so no privileges. The node plugin owns the
//! mounts: on SIGTERM/SIGINT/SIGHUP we commit what is unstable (bounded)
//! and exit 0 without unmounting.

use super::{open_fs, session_on_fd, Opts, State};
use serde::Deserialize;
use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often DIR is scanned for new sockets.
const SCAN_INTERVAL: Duration = Duration::from_millis(100);
/// Largest volume message accepted.
const MSG_BYTES_MAX: usize = 64 << 10;
/// How long one hand-over may take once connected.
const RECV_TIMEOUT: Duration = Duration::from_secs(10);
/// Connects refused before a socket is given up (the node plugin binds
/// before it listens: a connect can fall between the two).
const CONNECT_TRIES_MAX: u32 = 20;
/// Descriptors one message may carry; more than one is refused.
const FDS_MAX: usize = 4;
/// Volumes served at once by one sidecar.
const VOLUMES_MAX: usize = 256;
/// How long a stop may spend committing unstable data before exit.
const STOP_COMMIT_MAX: Duration = Duration::from_secs(3);
/// Longest path a Unix socket address holds (sun_path, NUL included).
const SUN_PATH_MAX: usize = 108;
/// /dev/fuse is the misc character device 10:229.
const FUSE_DEV: (u32, u32) = (10, 229);

/// What the node plugin sends with the descriptor (camelCase JSON).
/// Unknown fields are ignored, so an older sidecar keeps working with a
/// newer node plugin.
#[derive(Deserialize, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMsg {
    /// The NFS server, "host:port".
    pub server: String,
    /// The export to MOUNT.
    pub export: String,
    #[serde(default)]
    pub mount_port: Option<u16>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    #[serde(default)]
    pub attr_timeout_ms: Option<u64>,
    #[serde(default)]
    pub entry_timeout_ms: Option<u64>,
    #[serde(default)]
    pub writeback: bool,
    /// The node plugin mounted read-only (the kernel refuses writes); we
    /// then never ask for the writeback cache.
    #[serde(default)]
    pub read_only: bool,
    /// For the logs.
    #[serde(default)]
    pub volume_id: String,
}

/// Longest attribute / entry cache a message may ask for.
const TIMEOUT_MS_MAX: u64 = 3_600_000;

/// The options of one volume: the sidecar's own (timeouts, bounds) with
/// the message's server, export, identity and caching.
pub fn volume_opts(msg: &[u8], defaults: &Opts) -> Result<Opts, String> {
    let m: VolumeMsg = serde_json::from_slice(msg).map_err(|e| format!("bad volume message: {e}"))?;
    match m.server.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) => {}
        _ => return Err(format!("bad volume message: server {:?} is not host:port", m.server)),
    }
    if !m.export.starts_with('/') {
        return Err(format!("bad volume message: export {:?} is not an absolute path", m.export));
    }
    for (name, v) in [("attrTimeoutMs", m.attr_timeout_ms), ("entryTimeoutMs", m.entry_timeout_ms)] {
        if v.is_some_and(|v| v > TIMEOUT_MS_MAX) {
            return Err(format!("bad volume message: {name} above {TIMEOUT_MS_MAX}"));
        }
    }
    let mut o = defaults.clone();
    o.sidecar_dir = None;
    o.server = m.server;
    o.export = m.export;
    o.mount_port = m.mount_port.or(defaults.mount_port);
    o.uid = m.uid.unwrap_or(defaults.uid);
    o.gid = m.gid.unwrap_or(defaults.gid);
    if let Some(ms) = m.attr_timeout_ms {
        o.attr_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = m.entry_timeout_ms {
        o.entry_timeout = Duration::from_millis(ms);
    }
    o.writeback = m.writeback && !m.read_only;
    // The node plugin mounts with allow_other: the pod's users are any uid.
    o.allow_other = true;
    o.foreground = true;
    Ok(o)
}

/// Connect to `path` and take one message: its bytes (to EOF) and the one
/// descriptor that came with them.
pub fn receive(path: &Path) -> Result<(Vec<u8>, OwnedFd), String> {
    // A socket address holds 107 bytes of path; a longer one (a deep DIR)
    // is reached through /proc/self/fd/<its directory>.
    let mut _dir_fd = None;
    let mut target = path.to_path_buf();
    if path.as_os_str().len() >= SUN_PATH_MAX {
        let dir = path.parent().ok_or("socket path has no directory")?;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| "socket path has a NUL byte")?;
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!("open {}: {}", dir.display(), std::io::Error::last_os_error()));
        }
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        target = PathBuf::from(format!("/proc/self/fd/{}/socket", fd.as_raw_fd()));
        _dir_fd = Some(fd);
    }
    let mut tries = 0;
    let mut s = loop {
        match UnixStream::connect(&target) {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && tries < CONNECT_TRIES_MAX => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("connect: {e}")),
        }
    };
    s.set_read_timeout(Some(RECV_TIMEOUT)).map_err(|e| format!("set timeout: {e}"))?;
    let mut buf = vec![0u8; MSG_BYTES_MAX];
    let (n, fds) = recv_with_fds(s.as_raw_fd(), &mut buf)?;
    if fds.len() != 1 {
        return Err(format!("the message carried {} file descriptors, not 1", fds.len()));
    }
    let mut msg = buf[..n].to_vec();
    // The rest of the document (a stream may split it); EOF ends it.
    let mut rest = Vec::new();
    (&mut s)
        .take((MSG_BYTES_MAX - msg.len()) as u64 + 1)
        .read_to_end(&mut rest)
        .map_err(|e| format!("read: {e}"))?;
    msg.extend_from_slice(&rest);
    if msg.len() > MSG_BYTES_MAX {
        return Err(format!("message longer than {MSG_BYTES_MAX} bytes"));
    }
    Ok((msg, fds.into_iter().next().unwrap()))
}

/// One recvmsg: bytes into `buf`, descriptors (close-on-exec) out.
fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>), String> {
    let space = unsafe { libc::CMSG_SPACE((FDS_MAX * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = space as _;
    let n = unsafe { libc::recvmsg(sock, &mut mh, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(format!("recvmsg: {}", std::io::Error::last_os_error()));
    }
    let mut fds = Vec::new();
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(format!("more than {FDS_MAX} file descriptors in the message"));
    }
    if n == 0 && fds.is_empty() {
        return Err("connection closed before a message".into());
    }
    Ok((n as usize, fds))
}

/// The descriptor must be the FUSE device (anything else would make the
/// session read garbage or block).
pub fn check_fuse_fd(fd: &OwnedFd) -> Result<(), String> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!("fstat of the descriptor: {}", std::io::Error::last_os_error()));
    }
    let dev = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
    if st.st_mode & libc::S_IFMT != libc::S_IFCHR || dev != FUSE_DEV {
        return Err(format!("the descriptor is not /dev/fuse (mode {:o}, device {}:{})", st.st_mode, dev.0, dev.1));
    }
    Ok(())
}

/// Volumes being served: their file system state, for the commit at stop.
type Registry = Arc<Mutex<Vec<(PathBuf, Arc<Mutex<State>>)>>>;

/// Take one volume from `sock` and serve it until it is unmounted. Every
/// failure is logged naming the socket; nothing here ends the process.
fn serve_volume(sock: PathBuf, defaults: Opts, reg: Registry) {
    let name = sock.display().to_string();
    let fail = |e: String| log!("chimera-fuse: {name}: {e}; volume skipped");
    let (msg, fd) = match receive(&sock) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    if let Err(e) = check_fuse_fd(&fd) {
        return fail(e);
    }
    let opts = match volume_opts(&msg, &defaults) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    // The server may still be starting: retry the first connect for as
    // long as an operation would retry a lost one.
    let deadline = Instant::now() + opts.reconnect_timeout;
    let fs = loop {
        match open_fs(&opts) {
            Ok(fs) => break fs,
            Err(e) if Instant::now() >= deadline => return fail(e),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    let st = fs.st.clone();
    let session = match session_on_fd(fs, fd, &opts) {
        Ok(s) => s,
        Err(e) => return fail(format!("FUSE session: {e}")),
    };
    log!("chimera-fuse: {name}: {}:{} served", opts.server, opts.export);
    reg.lock().unwrap_or_else(|p| p.into_inner()).push((sock.clone(), st));
    let r = session.run();
    reg.lock().unwrap_or_else(|p| p.into_inner()).retain(|(p, _)| p != &sock);
    log!("chimera-fuse: {name}: session ended ({})", r.map_or_else(|e| e.to_string(), |_| "unmounted".into()));
}

/// Sockets in `dir/*/socket` with their inode numbers.
pub fn scan(dir: &Path) -> std::io::Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path().join("socket");
        if let Ok(m) = std::fs::symlink_metadata(&p) {
            if m.file_type().is_socket() {
                out.push((p, m.ino()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Watch `dir` until a termination signal; then commit (bounded) and exit 0.
pub fn run(dir: &Path, defaults: &Opts, sigs: &libc::sigset_t) -> ! {
    if !dir.is_dir() {
        log!("chimera-fuse: --sidecar-dir {}: not a directory", dir.display());
        std::process::exit(1);
    }
    log!("chimera-fuse: sidecar: watching {} for volumes", dir.display());
    let reg: Registry = Arc::default();
    // Sockets already taken (path → inode): each is connected to once; a
    // new socket at the same path (a new publish) has a new inode.
    let mut seen: HashMap<PathBuf, u64> = HashMap::new();
    let mut scan_failed = false;
    loop {
        let ts = libc::timespec { tv_sec: 0, tv_nsec: SCAN_INTERVAL.as_nanos() as i64 };
        let s = unsafe { libc::sigtimedwait(sigs, std::ptr::null_mut(), &ts) };
        if s > 0 {
            stop(s, &reg);
        }
        let found = match scan(dir) {
            Ok(f) => {
                scan_failed = false;
                f
            }
            Err(e) => {
                if !scan_failed {
                    log!("chimera-fuse: sidecar: reading {}: {e}", dir.display());
                }
                scan_failed = true;
                continue;
            }
        };
        seen.retain(|p, ino| found.iter().any(|(q, i)| q == p && i == ino));
        for (p, ino) in found {
            if seen.contains_key(&p) {
                continue;
            }
            seen.insert(p.clone(), ino);
            if reg.lock().unwrap_or_else(|p| p.into_inner()).len() >= VOLUMES_MAX {
                log!("chimera-fuse: {}: already serving {VOLUMES_MAX} volumes; volume skipped", p.display());
                continue;
            }
            let (d, r) = (defaults.clone(), reg.clone());
            let spawned = std::thread::Builder::new().name("volume".into()).spawn(move || serve_volume(p, d, r));
            if let Err(e) = spawned {
                log!("chimera-fuse: sidecar: volume thread: {e}");
            }
        }
    }
}

/// Commit what the volumes hold unstable, for at most STOP_COMMIT_MAX, and
/// exit 0. The mounts stay: the node plugin unmounts them.
fn stop(sig: i32, reg: &Registry) -> ! {
    log!("chimera-fuse: sidecar: signal {sig}: exiting (the node plugin unmounts the volumes)");
    let states: Vec<Arc<Mutex<State>>> = reg.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(_, s)| s.clone()).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let _ = std::thread::Builder::new().name("stop-commit".into()).spawn(move || {
        for st in states {
            st.lock().unwrap_or_else(|p| p.into_inner()).commit_all();
        }
        let _ = tx.send(());
    });
    if rx.recv_timeout(STOP_COMMIT_MAX).is_err() {
        log!("chimera-fuse: sidecar: commit at stop did not finish within {STOP_COMMIT_MAX:?}");
    }
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn defaults() -> Opts {
        crate::parse_args(["--sidecar-dir".to_string(), "/d".to_string()]).unwrap()
    }

    #[test]
    fn volume_messages() {
        let o = volume_opts(
            br#"{"server":"10.0.0.1:2049","export":"/vol/a","mountPort":20048,"uid":7,"gid":8,
                "attrTimeoutMs":5,"entryTimeoutMs":6,"writeback":true,"volumeId":"v","future":1}"#,
            &defaults(),
        )
        .unwrap();
        assert_eq!((o.server.as_str(), o.export.as_str(), o.mount_port, o.uid, o.gid), ("10.0.0.1:2049", "/vol/a", Some(20048), 7, 8));
        assert_eq!((o.attr_timeout, o.entry_timeout), (Duration::from_millis(5), Duration::from_millis(6)));
        assert!(o.writeback && o.allow_other && o.sidecar_dir.is_none());
        let o = volume_opts(br#"{"server":"h:1","export":"/e","writeback":true,"readOnly":true}"#, &defaults()).unwrap();
        assert!(!o.writeback, "no writeback cache on a read-only mount");
        assert_eq!(o.attr_timeout, defaults().attr_timeout);
        for (bad, says) in [
            (&b"not json"[..], "bad volume message"),
            (br#"{"export":"/e"}"#, "missing field `server`"),
            (br#"{"server":"h:1"}"#, "missing field `export`"),
            (br#"{"server":"h","export":"/e"}"#, "not host:port"),
            (br#"{"server":"h:0","export":"/e"}"#, "not host:port"),
            (br#"{"server":":1","export":"/e"}"#, "not host:port"),
            (br#"{"server":"h:1","export":"e"}"#, "not an absolute path"),
            (br#"{"server":"h:1","export":"/e","uid":-1}"#, "bad volume message"),
            (br#"{"server":"h:1","export":"/e","attrTimeoutMs":3600001}"#, "attrTimeoutMs above"),
        ] {
            let e = volume_opts(bad, &defaults()).unwrap_err();
            assert!(e.contains(says), "{}: {e}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn sidecar_options() {
        assert_eq!(defaults().sidecar_dir.as_deref(), Some("/d"));
        for bad in ["--sidecar-dir /d --server h:1", "--sidecar-dir /d --export /e", "--sidecar-dir /d /mnt", "--sidecar-dir"] {
            assert!(crate::parse_args(bad.split_whitespace().map(String::from)).is_err(), "{bad}");
        }
    }

    /// A listener hands over bytes and descriptors in one sendmsg, as the
    /// node plugin does; `receive` gets both, and refuses a message without
    /// a descriptor; a non-FUSE descriptor fails `check_fuse_fd`.
    #[test]
    fn hand_over() {
        // Deeper than a socket address holds: binding and connecting go
        // through /proc/self/fd, as the node plugin and receive() do.
        let dir = std::env::temp_dir().join(format!("chimera-fuse-test-{}", std::process::id())).join("d".repeat(120));
        std::fs::create_dir_all(dir.join("v1")).unwrap();
        std::fs::create_dir_all(dir.join("v2")).unwrap();
        std::fs::create_dir_all(dir.join("not-a-socket")).unwrap();
        std::fs::write(dir.join("not-a-socket/socket"), b"").unwrap();
        let send = |name: &str, body: &'static [u8], with_fd: bool| {
            let path = dir.join(name).join("socket");
            let _ = std::fs::remove_file(&path);
            let d = std::fs::File::open(dir.join(name)).unwrap();
            let l = UnixListener::bind(format!("/proc/self/fd/{}/socket", d.as_raw_fd())).unwrap();
            std::thread::spawn(move || {
                let (c, _) = l.accept().unwrap();
                let f = std::fs::File::open("/dev/null").unwrap();
                let fd = f.as_raw_fd();
                send_with_fd(c.as_raw_fd(), body, if with_fd { Some(fd) } else { None });
            });
            path
        };
        let p1 = send("v1", br#"{"server":"h:1","export":"/e"}"#, true);
        let p2 = send("v2", b"{}", false);
        let found: Vec<PathBuf> = scan(&dir).unwrap().into_iter().map(|(p, _)| p).collect();
        assert_eq!(found, vec![p1.clone(), p2.clone()]);
        let (msg, fd) = receive(&p1).unwrap();
        assert_eq!(msg, br#"{"server":"h:1","export":"/e"}"#);
        let e = check_fuse_fd(&fd).unwrap_err();
        assert!(e.contains("not /dev/fuse"), "{e}");
        let e = receive(&p2).unwrap_err();
        assert!(e.contains("carried 0 file descriptors"), "{e}");
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    fn send_with_fd(sock: RawFd, body: &[u8], fd: Option<RawFd>) {
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        let mut iov = libc::iovec { iov_base: body.as_ptr() as *mut _, iov_len: body.len() };
        let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        if let Some(fd) = fd {
            mh.msg_control = cbuf.as_mut_ptr().cast();
            mh.msg_controllen = space as _;
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&mh);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
            }
        }
        assert_eq!(unsafe { libc::sendmsg(sock, &mh, 0) }, body.len() as isize);
    }
}
