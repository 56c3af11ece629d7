//! The io_uring device on a real file with O_DIRECT: the conformance run
//! (data read back through the device and through the file itself,
//! zeroes, range errors, depth bound, many in flight), the open errors a
//! deployment meets (missing, a directory, a FIFO, too small, tmpfs without
//! O_DIRECT, read-only), and the notify eventfd.

mod common;

use block::uring::{probe_direct_io, IoMode, UringDevice, UringOptions};
use block::{BlockDevice, ErrorKind, Op, OpKind, Rejected, BLOCK_BYTES};
use common::*;
use std::os::fd::AsRawFd;
use std::path::Path;

const BLOCKS: u64 = 1024;

#[test]
fn tests_use_direct_io() {
    // The machine's build directory is on a disk file system; if this
    // fails the other tests ran in buffered mode and said so.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    assert!(probe_direct_io(dir).unwrap(), "{} cannot do O_DIRECT", dir.display());
}

#[test]
fn conformance_on_a_file() {
    let f = TempFile::new("conformance", BLOCKS * BLOCK_BYTES as u64);
    let dev = UringDevice::open(&f.options()).unwrap();
    assert!(!dev.is_block_device());
    assert_eq!(dev.info().blocks, BLOCKS);
    conformance(&dev, &f.path.display().to_string());
}

#[test]
fn bytes_land_at_their_offsets_in_the_file() {
    // Read the backing file with ordinary I/O: the device wrote where it said.
    let f = TempFile::new("offsets", BLOCKS * BLOCK_BYTES as u64);
    let dev = UringDevice::open(&f.options()).unwrap();
    let pool = pool(8 * BLOCK_BYTES, 4);
    let mut q = dev.queue(1, 4).unwrap();
    let data = pattern_vec(7, 17, 8);
    block::sync::write(&mut *q, &pool, 17, &data).unwrap();
    block::sync::write_zeroes(&mut *q, 19, 3).unwrap();
    block::sync::flush(&mut *q).unwrap();
    let file = std::fs::read(&f.path).unwrap();
    assert_eq!(file.len() as u64, BLOCKS * BLOCK_BYTES as u64, "write-zeroes keeps the size");
    let at = 17 * BLOCK_BYTES;
    assert!(file[at..at + 2 * BLOCK_BYTES] == data[..2 * BLOCK_BYTES]);
    assert!(file[at + 2 * BLOCK_BYTES..at + 5 * BLOCK_BYTES].iter().all(|&b| b == 0));
    assert!(file[at + 5 * BLOCK_BYTES..at + 8 * BLOCK_BYTES] == data[5 * BLOCK_BYTES..]);
    assert!(file[..at].iter().all(|&b| b == 0) && file[at + 8 * BLOCK_BYTES..].iter().all(|&b| b == 0));
    // And a second open of the same file reads them back.
    drop(q);
    drop(dev);
    let dev = UringDevice::open(&f.options()).unwrap();
    let mut q = dev.queue(0, 4).unwrap();
    let mut got = vec![0u8; BLOCK_BYTES];
    block::sync::read(&mut *q, &pool, 24, &mut got).unwrap();
    assert!(got[..] == data[7 * BLOCK_BYTES..]);
}

#[test]
fn read_only_open_refuses_writes() {
    let f = TempFile::new("ro", 64 * BLOCK_BYTES as u64);
    let dev = UringDevice::open(&UringOptions { read_only: true, bytes_min: 0, ..f.options() }).unwrap();
    assert!(dev.info().read_only);
    let pool = pool(BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 2).unwrap();
    for op in [Op::Write { lba: 1, blocks: 1, buf: pool.get().unwrap() }, Op::WriteZeroes { lba: 1, blocks: 1 }] {
        match q.submit(op, 1) {
            Err(Rejected::Invalid(_, e)) => {
                assert_eq!(e.kind, ErrorKind::ReadOnly { errno: None });
                assert!(e.to_string().contains("byte offset 4096: device is read-only"), "{e}");
                assert_eq!(e.errno(), libc::EROFS);
            }
            other => panic!("write on a read-only device: {other:?}"),
        }
    }
    let mut got = vec![1u8; BLOCK_BYTES];
    block::sync::read(&mut *q, &pool, 1, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0));
}

fn open_err(opts: &UringOptions) -> block::BlockError {
    match UringDevice::open(opts) {
        Ok(_) => panic!("{} opened", opts.path.display()),
        Err(e) => {
            assert_eq!(e.op, OpKind::Open);
            assert!(e.to_string().contains(&opts.path.display().to_string()), "error names the device: {e}");
            e
        }
    }
}

#[test]
fn open_errors_are_clear() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("block-tests");
    std::fs::create_dir_all(&dir).unwrap();

    let missing = dir.join("no-such-device");
    assert_eq!(open_err(&UringOptions::new(&missing)).kind, ErrorKind::NotFound);

    assert_eq!(open_err(&UringOptions::new(&dir)).kind, ErrorKind::NotFileOrBlockDevice);

    let fifo = dir.join(format!("fifo-{}", std::process::id()));
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = open_err(&UringOptions::new(&fifo));
    std::fs::remove_file(&fifo).unwrap();
    assert_eq!(e.kind, ErrorKind::NotFileOrBlockDevice);
    assert!(e.to_string().contains("neither a regular file nor a block device"), "{e}");

    let small = TempFile::new("small", 8 * BLOCK_BYTES as u64);
    let e = open_err(&UringOptions { bytes_min: 1 << 20, ..small.options() });
    assert_eq!(e.kind, ErrorKind::TooSmall { bytes: 32768, bytes_min: 1 << 20 });
    assert!(e.to_string().contains("too small: 32768 bytes, at least 1048576 needed"), "{e}");
    let empty = TempFile::new("empty", 0);
    assert!(matches!(open_err(&UringOptions { bytes_min: 0, ..empty.options() }).kind, ErrorKind::TooSmall { bytes: 0, .. }));
    // Exactly the minimum opens.
    assert_eq!(UringDevice::open(&UringOptions { bytes_min: 32768, ..small.options() }).unwrap().info().blocks, 8);
}

#[test]
fn tmpfs_without_direct_io_is_refused_clearly() {
    // tmpfs takes O_DIRECT since Linux 6.6; older kernels refuse it.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() || probe_direct_io(shm).unwrap_or(true) {
        eprintln!("skipped: /dev/shm is missing or does O_DIRECT on this kernel");
        return;
    }
    let path = shm.join(format!("block-test-{}", std::process::id()));
    std::fs::File::create(&path).unwrap().set_len(256 * BLOCK_BYTES as u64).unwrap();
    let r = UringDevice::open(&UringOptions::new(&path));
    std::fs::remove_file(&path).unwrap();
    let e = r.err().expect("opened with O_DIRECT on tmpfs");
    assert!(matches!(e.kind, ErrorKind::DirectIoUnsupported { errno: libc::EINVAL }), "{e}");
    assert!(e.to_string().contains("O_DIRECT is not supported here"), "{e}");
}

#[test]
fn buffered_test_mode_behaves_like_a_device() {
    // The documented fallback for test machines without direct I/O.
    let f = TempFile::new("buffered", BLOCKS * BLOCK_BYTES as u64);
    let dev = UringDevice::open(&UringOptions { io_mode: IoMode::BufferedForTests, ..UringOptions::new(&f.path) }).unwrap();
    conformance(&dev, &f.path.display().to_string());
}

/// FS_IOC_GETFLAGS / FS_IOC_SETFLAGS and the immutable flag (linux/fs.h).
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
const FS_IMMUTABLE_FL: libc::c_long = 0x10;

fn set_immutable(path: &Path, on: bool) -> bool {
    let Ok(f) = std::fs::File::open(path) else { return false };
    let mut flags: libc::c_long = 0;
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS as _, &mut flags) } < 0 {
        return false;
    }
    flags = if on { flags | FS_IMMUTABLE_FL } else { flags & !FS_IMMUTABLE_FL };
    unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS as _, &flags) == 0 }
}

#[test]
fn a_file_that_cannot_be_written_is_named_read_only() {
    // Root ignores mode bits; an immutable file refuses even root (EPERM),
    // and a 0444 file refuses everyone else (EACCES).
    let f = TempFile::new("immutable", 64 * BLOCK_BYTES as u64);
    let immutable = set_immutable(&f.path, true);
    if !immutable {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    let r = UringDevice::open(&f.options());
    let ro = UringDevice::open(&UringOptions { read_only: true, ..f.options() });
    if immutable {
        set_immutable(&f.path, false);
    }
    match r {
        Ok(_) if unsafe { libc::geteuid() } == 0 && !immutable => eprintln!("skipped: root and no immutable flag here"),
        Ok(_) => panic!("an unwritable file opened read-write"),
        Err(e) => {
            assert!(matches!(e.kind, ErrorKind::ReadOnly { errno: Some(libc::EPERM) | Some(libc::EACCES) }), "{e}");
            assert!(e.to_string().contains("cannot be opened for writing"), "{e}");
        }
    }
    assert!(ro.is_ok(), "the same file opens read-only");
}

#[test]
fn notify_fd_wakes_a_sleeping_loop() {
    // A loop sleeping elsewhere learns of a completion through the eventfd.
    let f = TempFile::new("notify", 64 * BLOCK_BYTES as u64);
    let dev = UringDevice::open(&f.options()).unwrap();
    let pool = pool(BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 2).unwrap();
    let fd = q.notify_fd().expect("io_uring queues have one");
    let mut buf = pool.get().unwrap();
    pattern(1, 5, &mut buf);
    q.submit(Op::Write { lba: 5, blocks: 1, buf }, 42).unwrap();
    let mut done = Vec::new();
    q.poll(&mut done); // hands the write to the kernel
    if done.is_empty() {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert_eq!(n, 1, "the eventfd did not become readable within 10 s");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while done.is_empty() {
            assert!(std::time::Instant::now() < deadline);
            q.poll(&mut done);
        }
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].token, 42);
    done.pop().unwrap().result.unwrap();
}

#[test]
fn queues_on_two_threads() {
    // Per-core queues: each thread owns its own ring; both see one device.
    let f = TempFile::new("threads", 256 * BLOCK_BYTES as u64);
    let dev = std::sync::Arc::new(UringDevice::open(&f.options()).unwrap());
    let threads: Vec<_> = (0..2u64)
        .map(|core| {
            let q = dev.queue(core as usize, 8).unwrap(); // made here, used there
            std::thread::spawn(move || {
                let mut q = q;
                let pool = pool(BLOCK_BYTES * 4, 2);
                let data = pattern_vec(core, core * 100, 4);
                block::sync::write(&mut *q, &pool, core * 100, &data).unwrap();
                block::sync::flush(&mut *q).unwrap();
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let pool = pool(BLOCK_BYTES * 4, 2);
    let mut q = dev.queue(2, 2).unwrap();
    for core in 0..2u64 {
        let mut got = vec![0u8; 4 * BLOCK_BYTES];
        block::sync::read(&mut *q, &pool, core * 100, &mut got).unwrap();
        assert!(got == pattern_vec(core, core * 100, 4));
    }
}

#[test]
fn depth_limits_are_checked() {
    let f = TempFile::new("depth", 64 * BLOCK_BYTES as u64);
    let dev = UringDevice::open(&f.options()).unwrap();
    for bad in [0, block::DEPTH_MAX + 1] {
        let e = dev.queue(0, bad).err().expect("refused");
        assert!(e.to_string().contains("depth_max must be 1..=4096"), "{e}");
    }
    assert_eq!(dev.queue(0, block::DEPTH_MAX).unwrap().depth_max(), block::DEPTH_MAX);
}
