//! READs on a core loop (`coreio`): submitted on the calling thread's own
//! device queues and completed when that thread polls (`rpc::poller`), the
//! way a chimerad core runs them. Each test plays the core: it declares
//! itself a polling loop, parks READs and polls until they are answered.

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use block::mem::MemDevice;
use block::uring::{UringDevice, UringOptions};
use block::Device;
use diskfs::{DiskFs, Options};
use vfs::{CreateMode, Cred, Done, FileHandle, IoDone, NodeKind, Stability, Vfs, VfsError, VfsResult};

const EXPORT: u32 = 7;

type Answer = Arc<Mutex<Option<(ThreadId, VfsResult<IoDone>)>>>;

/// A caller that can wait: parks, and keeps the answer (and the thread
/// that gave it).
struct Park(Answer);

impl vfs::Later for Park {
    fn park(&mut self) -> Option<Done> {
        let a = self.0.clone();
        Some(Box::new(move |r| *a.lock().unwrap() = Some((std::thread::current().id(), r))))
    }
}

/// READ through `read_start` as a core does; polls this thread's pollers
/// until it is answered. Returns the bytes, end of file, and whether the
/// call was parked.
fn core_read(fs: &DiskFs, fh: &FileHandle, offset: u64, len: usize) -> (VfsResult<(Vec<u8>, bool)>, bool) {
    let answer: Answer = Arc::new(Mutex::new(None));
    let mut buf = vec![0u8; len];
    match fs.read_start(fh, offset, &mut buf, &mut Park(answer.clone())) {
        Err(e) => return (Err(e), false),
        Ok(Some((n, eof))) => {
            buf.truncate(n);
            return (Ok((buf, eof)), false);
        }
        Ok(None) => {}
    }
    let mut fds = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        rpc::poller::poll_all(&mut fds);
        if let Some((tid, r)) = answer.lock().unwrap().take() {
            assert_eq!(tid, std::thread::current().id(), "the READ is answered on the core that parked it");
            let r = r.map(|d| match d {
                IoDone::Read { data, eof } => (data, eof),
                other => panic!("a READ answered {other:?}"),
            });
            return (r, true);
        }
        assert!(std::time::Instant::now() < deadline, "a parked READ was never answered");
        std::thread::yield_now();
    }
}

fn create(fs: &DiskFs, name: &str) -> FileHandle {
    let root = fs.root(EXPORT).unwrap();
    fs.create(&root, name.as_bytes(), NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
}

/// Reads of every shape against what a worker-thread read returns.
fn reads_match(fs: &DiskFs) {
    let f = create(fs, "f");
    let data = pattern((1 << 20) + 3, 1);
    fs.write(&f, 5000, &data, Stability::FileSync).unwrap();
    // A hole between 5000 + len and the last block.
    let end = 5000 + data.len() as u64;
    fs.write(&f, end + 300_000, b"tail", Stability::Unstable).unwrap();
    let size = fs.getattr(&f).unwrap().size;
    let before = fs.core_reads().0;
    let mut parked = 0;
    for (offset, len) in [(0u64, 4096usize), (5000, 4096), (4095, 1 << 20), (0, (1 << 20) + 8192), (end - 10, 200_000), (end + 8192, 4096), (size - 2, 100), (size, 10), (size + 4096, 10)] {
        let (r, was_parked) = core_read(fs, &f, offset, len);
        let (got, eof) = r.unwrap();
        let mut want = vec![0u8; len];
        let (n, weof) = fs.read(&f, offset, &mut want).unwrap();
        want.truncate(n);
        assert_eq!(got.len(), want.len(), "read of {len} at {offset}: length");
        assert!(got == want, "read of {len} at {offset}: bytes differ from the worker's read");
        assert_eq!(eof, weof, "read of {len} at {offset}: eof");
        parked += was_parked as u64;
    }
    // Reads of device blocks park; holes (block 0, the gap before "tail")
    // and end of file answer at once.
    assert_eq!(parked, 5, "the reads of device blocks park (5 of the 9)");
    assert_eq!(fs.core_reads().0 - before, parked, "every parked read ran on the core's queues");
    // Errors answer at once, never park.
    let root = fs.root(EXPORT).unwrap();
    assert!(matches!(core_read(fs, &root, 0, 10), (Err(VfsError::IsDir), false)));
    let forged = FileHandle { generation: f.generation + 1, ..f };
    assert!(matches!(core_read(fs, &forged, 0, 10), (Err(VfsError::Stale), false)));
}

#[test]
fn reads_on_a_core_match_the_workers_on_a_memory_device() {
    std::thread::spawn(|| {
        rpc::poller::serve_on_this_thread();
        let dev: Device = Arc::new(MemDevice::new("mem0", 16384));
        let fs = DiskFs::open(vec![dev], &Options::new(EXPORT, true)).unwrap();
        reads_match(&fs);
    })
    .join()
    .unwrap();
}

#[test]
fn reads_on_a_core_match_the_workers_on_io_uring_and_wake_a_sleeping_loop() {
    std::thread::spawn(|| {
        rpc::poller::serve_on_this_thread();
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("diskfs-coreio");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dev0");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(64 << 20).unwrap();
        drop(f);
        let dev: Device = Arc::new(UringDevice::open(&UringOptions::new(&path)).unwrap());
        let fs = DiskFs::open(vec![dev], &Options::new(EXPORT, true)).unwrap();
        reads_match(&fs);
        // While a read is on the device, the poller names a descriptor the
        // loop can sleep on, and it becomes readable when the read is done.
        let fh = fs.lookup(&fs.root(EXPORT).unwrap(), b"f").unwrap().0;
        let answer: Answer = Arc::new(Mutex::new(None));
        let mut buf = vec![0u8; 1 << 20];
        assert!(fs.read_start(&fh, 0, &mut buf, &mut Park(answer.clone())).unwrap().is_none());
        let mut fds = Vec::new();
        let t = rpc::poller::poll_all(&mut fds);
        if t.busy {
            assert!(!t.spin, "an io_uring queue has a notify descriptor");
            assert!(!fds.is_empty());
            let mut p: Vec<libc::pollfd> = fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
            let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, 10_000) };
            assert!(n >= 1, "the notify descriptor did not become readable");
        }
        while answer.lock().unwrap().is_none() {
            rpc::poller::poll_all(&mut fds);
        }
        let (_, r) = answer.lock().unwrap().take().unwrap();
        assert!(matches!(r, Ok(IoDone::Read { ref data, .. }) if data.len() == 1 << 20));
        let _ = std::fs::remove_file(&path);
    })
    .join()
    .unwrap();
}

/// A file removed while a core's read of it is on the device: the removal
/// neither waits for that read (the core that must poll it is the one
/// removing — waiting would never end) nor hands its blocks to anyone
/// before the read is back; afterwards the space returns.
#[test]
fn a_removal_under_a_core_read_neither_waits_nor_reuses_the_blocks_early() {
    std::thread::spawn(|| {
        rpc::poller::serve_on_this_thread();
        // Small enough that the removed file's blocks are needed again.
        let dev: Device = Arc::new(MemDevice::new("mem0", 4096));
        let fs = DiskFs::open(vec![dev.clone()], &Options::new(EXPORT, true)).unwrap();
        let root = fs.root(EXPORT).unwrap();
        let f = create(&fs, "victim");
        let data = pattern(8 << 20, 2);
        fs.write(&f, 0, &data, Stability::FileSync).unwrap();
        let free_before = fs.fsstat(&root).unwrap().free_bytes;
        // The memory device completes only when polled: the read stays on
        // the device until this thread polls.
        let answer: Answer = Arc::new(Mutex::new(None));
        let mut buf = vec![0u8; 1 << 20];
        assert!(fs.read_start(&f, 0, &mut buf, &mut Park(answer.clone())).unwrap().is_none());
        fs.remove(&root, b"victim").unwrap();
        let free_during = fs.fsstat(&root).unwrap().free_bytes;
        assert!(free_during < free_before + (8 << 20), "the blocks came back while a read of them was on the device");
        // Another file may not get them either.
        let g = create(&fs, "next");
        let big = pattern(12 << 20, 3);
        let r = fs.write(&g, 0, &big, Stability::FileSync);
        assert!(matches!(r, Err(VfsError::NoSpace)), "a write took blocks still under a read: {r:?}");
        let mut fds = Vec::new();
        while answer.lock().unwrap().is_none() {
            rpc::poller::poll_all(&mut fds);
        }
        let (_, r) = answer.lock().unwrap().take().unwrap();
        // The file is gone: the read says so, or returns what the file held.
        match r {
            Err(VfsError::Stale) => {}
            Ok(IoDone::Read { data: got, .. }) => assert!(got == data[..1 << 20], "the read returned bytes the file never held"),
            other => panic!("unexpected answer {other:?}"),
        }
        // Once the read is back its blocks are free: the same write fits.
        let free_after = fs.fsstat(&root).unwrap().free_bytes;
        assert!(free_after >= free_before + (8 << 20), "the space did not come back: {free_before} -> {free_after}");
        fs.write(&g, 0, &big, Stability::FileSync).unwrap();
        assert!(fs.read(&g, 0, &mut vec![0u8; 12 << 20]).unwrap().0 == 12 << 20);
        drop(fs);
        let report = diskfs::fsck::check(vec![dev]).unwrap();
        assert!(report.clean(), "fsck: {:?}", report.violations);
    })
    .join()
    .unwrap();
}
