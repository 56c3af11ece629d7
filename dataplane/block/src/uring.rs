//! The io_uring device: O_DIRECT on a regular file or a block device.
//!
//! One ring per queue (so per core), sized to the queue's `depth_max`: the
//! completion queue (twice the submission queue) can never overflow, and
//! no submission is ever refused by the ring itself. Where the kernel has
//! it the ring defers completion work to its one issuer thread
//! (`DEFER_TASKRUN`, as the runtime's socket rings): a polling core sees
//! pending work in shared memory and enters the kernel only then. Each
//! queue registers an eventfd with its ring, so a loop that sleeps in its
//! own ring can wait on it (`notify_fd`).
//!
//! What each operation is on the device:
//! - read / write: `IORING_OP_READ` / `IORING_OP_WRITE` at `lba * 4096`; a
//!   short transfer is an error, never resubmitted.
//! - flush: `IORING_OP_FSYNC` with `DATASYNC` — on a block device the
//!   kernel sends a cache flush; on a file it also commits the file
//!   system's metadata needed to read the data back (block allocation), but
//!   not timestamps, which we never read.
//! - write-zeroes: `IORING_OP_FALLOCATE`. On a file
//!   `PUNCH_HOLE | KEEP_SIZE`: the host file system frees the blocks
//!   (thin-provisioned files give space back) and guarantees zeros on
//!   read. On a block device `ZERO_RANGE | KEEP_SIZE`: the kernel sends
//!   WRITE ZEROES when the device has it and writes zero pages when not
//!   (what BLKZEROOUT does, minus unmapping), so it works on every device.
//!   Either way it is durable only after a flush, like a write.
//!
//! Buffered mode (`IoMode::BufferedForTests`) opens without O_DIRECT, for
//! test machines whose temporary directory cannot do direct I/O (tmpfs):
//! flushes are still real, but the page cache sits in between. The server
//! never uses it.

use crate::error::{BlockError, ErrorKind, OpKind};
use crate::{check_depth, BlockDevice, BlockQueue, Completion, DeviceInfo, Op, Rejected, BLOCK_BYTES};
use io_uring::{opcode, types, IoUring};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `_IOR(0x12, 114, u64)` in the asm-generic encoding (x86_64, aarch64):
/// a block device's size in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT: the page cache is bypassed (the server's only mode).
    Direct,
    /// No O_DIRECT; for tests on file systems without direct I/O only.
    BufferedForTests,
}

#[derive(Debug, Clone)]
pub struct UringOptions {
    pub path: PathBuf,
    /// Open read-only: writes and write-zeroes are refused at submit.
    pub read_only: bool,
    /// Refuse a device smaller than this.
    pub bytes_min: u64,
    pub io_mode: IoMode,
}

impl UringOptions {
    pub fn new(path: impl Into<PathBuf>) -> UringOptions {
        UringOptions { path: path.into(), read_only: false, bytes_min: BLOCK_BYTES as u64, io_mode: IoMode::Direct }
    }
}

pub struct UringDevice {
    info: DeviceInfo,
    fd: Arc<OwnedFd>,
    block_device: bool,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

impl UringDevice {
    /// Open and check a device: it exists, is a regular file or a block
    /// device, opens for writing (unless `read_only`), holds `bytes_min`,
    /// and takes direct I/O (a probe read of its first block).
    pub fn open(opts: &UringOptions) -> Result<UringDevice, BlockError> {
        let name: Arc<str> = opts.path.display().to_string().into();
        let fail = |kind| BlockError::new(&name, OpKind::Open, None, kind);
        // stat first: opening a FIFO would block, a directory would say EISDIR.
        let st = stat(&opts.path).map_err(|e| fail(if e == libc::ENOENT { ErrorKind::NotFound } else { ErrorKind::Io { errno: e } }))?;
        let fmt = st.st_mode & libc::S_IFMT;
        let block_device = match fmt {
            libc::S_IFREG => false,
            libc::S_IFBLK => true,
            _ => return Err(fail(ErrorKind::NotFileOrBlockDevice)),
        };
        let fd = open_fd(&opts.path, opts.read_only, opts.io_mode).map_err(|e| {
            fail(match e {
                libc::ENOENT => ErrorKind::NotFound,
                libc::EINVAL if opts.io_mode == IoMode::Direct => ErrorKind::DirectIoUnsupported { errno: e },
                libc::EROFS | libc::EACCES | libc::EPERM if !opts.read_only => ErrorKind::ReadOnly { errno: Some(e) },
                _ => ErrorKind::Io { errno: e },
            })
        })?;
        let bytes = if block_device { block_device_bytes(&fd).map_err(fail)? } else { file_bytes(&fd).map_err(|e| fail(ErrorKind::Io { errno: e }))? };
        if bytes < opts.bytes_min || bytes < BLOCK_BYTES as u64 {
            return Err(fail(ErrorKind::TooSmall { bytes, bytes_min: opts.bytes_min.max(BLOCK_BYTES as u64) }));
        }
        if opts.io_mode == IoMode::Direct {
            probe_direct(&fd).map_err(|e| {
                fail(if e == libc::EINVAL { ErrorKind::DirectIoUnsupported { errno: e } } else { ErrorKind::Io { errno: e } })
            })?;
        }
        // A file's tail shorter than a block is never used.
        let info = DeviceInfo { name, blocks: bytes / BLOCK_BYTES as u64, read_only: opts.read_only };
        Ok(UringDevice { info, fd: Arc::new(fd), block_device })
    }

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }
}

fn stat(path: &Path) -> Result<libc::stat, i32> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: an all-zero stat is valid; stat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::stat(c.as_ptr(), &mut st) } < 0 {
        return Err(errno());
    }
    Ok(st)
}

fn open_fd(path: &Path, read_only: bool, mode: IoMode) -> Result<OwnedFd, i32> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    let mut flags = libc::O_CLOEXEC | if read_only { libc::O_RDONLY } else { libc::O_RDWR };
    if mode == IoMode::Direct {
        flags |= libc::O_DIRECT;
    }
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn file_bytes(fd: &OwnedFd) -> Result<u64, i32> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(errno());
    }
    Ok(st.st_size as u64)
}

fn block_device_bytes(fd: &OwnedFd) -> Result<u64, ErrorKind> {
    let mut bytes: u64 = 0;
    if unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64 as _, &mut bytes) } < 0 {
        return Err(ErrorKind::Io { errno: errno() });
    }
    let mut logical: libc::c_int = 0;
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::BLKSSZGET as _, &mut logical) } < 0 {
        return Err(ErrorKind::Io { errno: errno() });
    }
    if logical <= 0 || BLOCK_BYTES % logical as usize != 0 {
        return Err(ErrorKind::BlockSizeUnsupported { logical_bytes: logical.max(0) as u32 });
    }
    Ok(bytes)
}

/// Read the first block with O_DIRECT: some file systems accept the open
/// flag and refuse the I/O (EINVAL).
fn probe_direct(fd: &OwnedFd) -> Result<(), i32> {
    let layout = std::alloc::Layout::from_size_align(BLOCK_BYTES, BLOCK_BYTES).expect("valid layout");
    // SAFETY: a non-zero layout; freed below.
    let p = unsafe { std::alloc::alloc(layout) };
    assert!(!p.is_null(), "probe buffer");
    let r = unsafe { libc::pread(fd.as_raw_fd(), p as *mut libc::c_void, BLOCK_BYTES, 0) };
    let e = errno();
    unsafe { std::alloc::dealloc(p, layout) };
    if r < 0 {
        return Err(e);
    }
    Ok(())
}

impl BlockDevice for UringDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn queue(&self, _core: usize, depth_max: usize) -> Result<Box<dyn BlockQueue>, BlockError> {
        check_depth(&self.info, depth_max)?;
        let io = |e: std::io::Error| BlockError::new(&self.info.name, OpKind::Open, None, ErrorKind::Io { errno: e.raw_os_error().unwrap_or(libc::EIO) });
        let entries = (depth_max as u32).next_power_of_two();
        let (ring, deferred) = new_ring(entries).map_err(io)?;
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        // SAFETY: a descriptor we just created and own.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        ring.submitter().register_eventfd(efd.as_raw_fd()).map_err(io)?;
        Ok(Box::new(UringQueue {
            info: self.info.clone(),
            fd: self.fd.clone(),
            block_device: self.block_device,
            ring,
            deferred,
            enabled: !deferred,
            efd,
            slots: (0..depth_max).map(|_| None).collect(),
            free: (0..depth_max as u32).rev().collect(),
            depth_max,
        }))
    }
}

/// A ring for one queue, deferring completion work to its issuer where the
/// kernel can (see the module comment); it starts disabled so that the
/// thread that first uses the queue becomes its issuer.
fn new_ring(entries: u32) -> std::io::Result<(IoUring, bool)> {
    let deferred = IoUring::builder().setup_single_issuer().setup_defer_taskrun().setup_taskrun_flag().setup_r_disabled().build(entries);
    match deferred {
        Ok(r) => Ok((r, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((IoUring::builder().build(entries)?, false)),
        Err(e) => Err(e),
    }
}

struct Slot {
    token: u64,
    op: Op,
}

pub struct UringQueue {
    info: DeviceInfo,
    fd: Arc<OwnedFd>,
    block_device: bool,
    ring: IoUring,
    deferred: bool,
    enabled: bool,
    efd: OwnedFd,
    /// In-flight operations by slot (the SQE's user_data); they own the
    /// buffers the kernel reads and writes until their CQE arrives.
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    depth_max: usize,
}

impl UringQueue {
    /// The first thread to use the queue becomes its ring's issuer.
    fn enable(&mut self) {
        if !self.enabled {
            if let Err(e) = self.ring.submitter().register_enable_rings() {
                panic!("device {}: cannot enable its io_uring: {e}", self.info.name);
            }
            self.enabled = true;
        }
    }

    /// Enter the kernel: submit what is queued, run deferred completion
    /// work, wait for `want` completions. Interrupted or momentarily busy
    /// enters are retried by the next poll; anything else means the ring
    /// itself is broken (a bug, or a queue used from a second thread).
    fn enter(&mut self, want: usize) {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) && want == 0 => return,
                Err(e) => panic!("device {}: io_uring_enter failed: {e}", self.info.name),
            }
        }
    }

    fn kernel_has_work(&mut self) -> bool {
        let mut sq = self.ring.submission();
        sq.sync();
        !sq.is_empty() || (self.deferred && (sq.taskrun() || sq.cq_overflow()))
    }

    fn drain(&mut self, done: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        let cq = self.ring.completion();
        for cqe in cq {
            let i = cqe.user_data() as usize;
            let Slot { token, op } = self.slots[i].take().expect("a completion for an operation in flight");
            self.free.push(i as u32);
            let result = result_of(&self.info, &op, cqe.result());
            done.push(Completion { token, result, buf: op.into_buf() });
            n += 1;
        }
        n
    }

    fn sqe(&self, op: &mut Op, slot: u32) -> io_uring::squeue::Entry {
        let fd = types::Fd(self.fd.as_raw_fd());
        let at = op.offset_bytes().unwrap_or(0);
        let e = match op {
            Op::Read { blocks, buf, .. } => opcode::Read::new(fd, buf.as_mut_ptr(), *blocks * BLOCK_BYTES as u32).offset(at).build(),
            Op::Write { blocks, buf, .. } => opcode::Write::new(fd, buf.as_ptr(), *blocks * BLOCK_BYTES as u32).offset(at).build(),
            Op::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            Op::WriteZeroes { blocks, .. } => {
                let mode = if self.block_device { libc::FALLOC_FL_ZERO_RANGE } else { libc::FALLOC_FL_PUNCH_HOLE };
                opcode::Fallocate::new(fd, *blocks * BLOCK_BYTES as u64).offset(at).mode(mode | libc::FALLOC_FL_KEEP_SIZE).build()
            }
        };
        e.user_data(slot as u64)
    }
}

fn result_of(info: &DeviceInfo, op: &Op, res: i32) -> Result<(), BlockError> {
    let err = |kind| Err(BlockError::new(&info.name, op.kind(), op.offset_bytes(), kind));
    if res < 0 {
        return err(ErrorKind::Io { errno: -res });
    }
    if let Op::Read { blocks, .. } | Op::Write { blocks, .. } = op {
        let asked = *blocks as u64 * BLOCK_BYTES as u64;
        if res as u64 != asked {
            return err(ErrorKind::Short { bytes: res as u64, bytes_asked: asked });
        }
    }
    Ok(())
}

impl BlockQueue for UringQueue {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn depth_max(&self) -> usize {
        self.depth_max
    }

    fn inflight(&self) -> usize {
        self.depth_max - self.free.len()
    }

    fn submit(&mut self, mut op: Op, token: u64) -> Result<(), Rejected> {
        if let Err(e) = self.info.check(&op) {
            return Err(Rejected::Invalid(op, e));
        }
        let Some(slot) = self.free.pop() else { return Err(Rejected::Busy(op)) };
        self.enable();
        let sqe = self.sqe(&mut op, slot);
        self.slots[slot as usize] = Some(Slot { token, op });
        // SAFETY: the SQE points into the slot's buffer (a pool mapping
        // that does not move), kept in `slots` until its CQE is drained.
        // The ring has at least depth_max entries and at most depth_max
        // operations are in flight, so the push cannot fail.
        unsafe { self.ring.submission().push(&sqe) }.expect("the ring holds depth_max entries");
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<Completion>) -> usize {
        if self.inflight() == 0 {
            return 0;
        }
        self.enable();
        if self.kernel_has_work() {
            self.enter(0);
        }
        self.drain(done)
    }

    fn wait(&mut self, done: &mut Vec<Completion>) -> usize {
        if self.inflight() == 0 {
            return 0;
        }
        self.enable();
        loop {
            let n = self.drain(done);
            if n > 0 {
                return n;
            }
            self.enter(1);
        }
    }

    fn notify_fd(&self) -> Option<RawFd> {
        Some(self.efd.as_raw_fd())
    }
}

impl Drop for UringQueue {
    /// The kernel may still write into the buffers of operations in flight:
    /// wait for them. If the ring cannot be entered (another thread), leak
    /// their buffers rather than hand memory the kernel may write back to
    /// the pool.
    fn drop(&mut self) {
        let mut sink = Vec::new();
        while self.inflight() > 0 {
            self.drain(&mut sink);
            if self.inflight() == 0 {
                break;
            }
            if self.ring.submit_and_wait(1).is_err() && self.ring.submit_and_wait(1).is_err() {
                for s in self.slots.iter_mut() {
                    if let Some(s) = s.take() {
                        std::mem::forget(s.op);
                    }
                }
                return;
            }
        }
    }
}

/// Whether files in `dir` take O_DIRECT I/O (false on file systems without
/// it, like tmpfs before Linux 6.6). Tests of this and later crates pick
/// their device files' directory, or buffered mode, with it; it creates and
/// removes one small probe file.
pub fn probe_direct_io(dir: &Path) -> std::io::Result<bool> {
    // Unique per call: tests probe from many threads at once.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!(".block-direct-probe-{}-{n}", std::process::id()));
    std::fs::write(&path, vec![0u8; BLOCK_BYTES])?;
    let r = open_fd(&path, false, IoMode::Direct).and_then(|fd| probe_direct(&fd));
    let _ = std::fs::remove_file(&path);
    match r {
        Ok(()) => Ok(true),
        Err(libc::EINVAL) => Ok(false),
        Err(e) => Err(std::io::Error::from_raw_os_error(e)),
    }
}
