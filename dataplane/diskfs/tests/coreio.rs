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

/// Poll this thread's pollers until `answer` is set (at most 20 s); the
/// answer and the thread that gave it.
fn answered(answer: &Answer, what: &str) -> (ThreadId, VfsResult<IoDone>) {
    let mut fds = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        rpc::poller::poll_all(&mut fds);
        if let Some(a) = answer.lock().unwrap().take() {
            return a;
        }
        assert!(std::time::Instant::now() < deadline, "{what} was never answered");
        std::thread::yield_now();
    }
}

/// Run `test` on a thread that is a polling loop, as a chimerad core.
fn on_a_core(test: impl FnOnce() + Send + 'static) {
    std::thread::spawn(|| {
        rpc::poller::serve_on_this_thread();
        test()
    })
    .join()
    .unwrap();
}

/// A fresh diskfs on a memory device of `blocks` blocks.
fn mem_fs(blocks: u64) -> (Device, DiskFs) {
    let dev: Device = Arc::new(MemDevice::new("mem0", blocks));
    let fs = DiskFs::open(vec![dev.clone()], &Options::new(EXPORT, true)).unwrap();
    (dev, fs)
}

fn fsck_clean(dev: Device) {
    let report = diskfs::fsck::check(vec![dev]).unwrap();
    assert!(report.clean(), "fsck: {:?}", report.violations);
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
    let (tid, r) = answered(&answer, "a parked READ");
    assert_eq!(tid, std::thread::current().id(), "the READ is answered on the core that parked it");
    let r = r.map(|d| match d {
        IoDone::Read { data, eof } => (data, eof),
        other => panic!("a READ answered {other:?}"),
    });
    (r, true)
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
    let before = fs.counters().core_reads().0;
    let mut parked = 0;
    // Every core buffer first holds file data (full 64 KiB reads), so a
    // read that copied more than its blocks would show stale bytes.
    for k in 0..64u64 {
        core_read(fs, &f, 8192 + k * 16384, 64 << 10).0.unwrap();
    }
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
    assert_eq!(fs.counters().core_reads().0 - before - 64, parked, "every parked read ran on the core's queues");
    // Errors answer at once, never park.
    let root = fs.root(EXPORT).unwrap();
    assert!(matches!(core_read(fs, &root, 0, 10), (Err(VfsError::IsDir), false)));
    let forged = FileHandle { generation: f.generation + 1, ..f };
    assert!(matches!(core_read(fs, &forged, 0, 10), (Err(VfsError::Stale), false)));
}

#[test]
fn reads_on_a_core_match_the_workers_on_a_memory_device() {
    on_a_core(|| {
        let (_, fs) = mem_fs(16384);
        reads_match(&fs);
    });
}

#[test]
fn reads_on_a_core_match_the_workers_on_io_uring_and_wake_a_sleeping_loop() {
    on_a_core(|| {
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
        let (_, r) = answered(&answer, "the READ");
        assert!(matches!(r, Ok(IoDone::Read { ref data, .. }) if data.len() == 1 << 20));
        let _ = std::fs::remove_file(&path);
    });
}

/// A file removed while a core's read of it is on the device: the removal
/// neither waits for that read (the core that must poll it is the one
/// removing — waiting would never end) nor hands its blocks to anyone
/// before the read is back; afterwards the space returns.
#[test]
fn a_removal_under_a_core_read_neither_waits_nor_reuses_the_blocks_early() {
    on_a_core(|| {
        // Small enough that the removed file's blocks are needed again.
        let (dev, fs) = mem_fs(4096);
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
        let (_, r) = answered(&answer, "the READ");
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
        fsck_clean(dev);
    });
}

/// WRITE through `write_start` as a core does (UNSTABLE); polls until it is
/// answered. Returns the answer and whether the call was parked.
fn core_write(fs: &DiskFs, fh: &FileHandle, offset: u64, data: &[u8]) -> (VfsResult<u64>, bool) {
    let answer: Answer = Arc::new(Mutex::new(None));
    match fs.write_start(fh, offset, data, Stability::Unstable, &mut Park(answer.clone())) {
        Err(e) => return (Err(e), false),
        Ok(Some((n, _, _))) => return (Ok(n as u64), false),
        Ok(None) => {}
    }
    let (_, r) = answered(&answer, "a parked WRITE");
    let r = r.map(|d| match d {
        IoDone::Write { count, committed, attr } => {
            assert_eq!(committed, Stability::Unstable);
            assert!(attr.size >= offset + data.len() as u64, "the answer's attributes hold the write");
            count as u64
        }
        other => panic!("a WRITE answered {other:?}"),
    });
    (r, true)
}

/// UNSTABLE writes of every shape on a core: what reads back is what a
/// model says, COMMIT makes them durable across a reopen, and fsck agrees.
#[test]
fn unstable_writes_on_a_core_read_back_and_survive_commit_and_reopen() {
    on_a_core(|| {
        let (dev, fs) = mem_fs(16384);
        let (f, model) = {
            let fs = fs;
            let f = create(&fs, "w");
            let mut model = vec![0u8; 0];
            let put = |model: &mut Vec<u8>, off: usize, d: &[u8]| {
                if model.len() < off + d.len() {
                    model.resize(off + d.len(), 0);
                }
                model[off..off + d.len()].copy_from_slice(d);
            };
            let before = fs.counters().core_writes();
            let mut on_core = 0;
            // (offset, length): aligned, unaligned into fresh blocks, a
            // partial overwrite of written blocks (read first: a worker),
            // 1 MiB + 1 across many buffers, past a hole.
            for (i, (off, len)) in [(0usize, 4096usize), (8192, 100), (4096 * 3 + 7, 20_000), (100, 50), (65_536, (1 << 20) + 1), (3 << 20, 4096)].into_iter().enumerate() {
                let d = pattern(len, 10 + i as u32);
                let (r, parked) = core_write(&fs, &f, off as u64, &d);
                assert_eq!(r.unwrap(), len as u64);
                assert!(parked, "a write of {len} at {off} was answered inline");
                put(&mut model, off, &d);
                let mut w = vec![0u8; model.len()];
                let (n, _) = fs.read(&f, 0, &mut w).unwrap();
                assert_eq!(n, model.len());
                let wfirst = w.iter().zip(&model).position(|(a, b)| a != b);
                assert!(w == model, "after writing {len} at {off}: a worker's read differs from the model (first at {wfirst:?})");
                let (got, _) = core_read(&fs, &f, 0, model.len()).0.unwrap();
                let first = got.iter().zip(&model).position(|(a, b)| a != b);
                assert!(got == model, "after writing {len} at {off}: the file differs from the model (first at {first:?}, {} vs {})", got.len(), model.len());
                on_core += 1;
            }
            // The partial overwrites of written blocks (100 at 8192 over
            // the first write's neighbour is fresh; 50 at 100 is not) go
            // to a worker; the others run on the core.
            let core = fs.counters().core_writes() - before;
            assert!(core >= on_core - 2 && core < on_core, "{core} of {on_core} writes ran on the core");
            fs.commit(&f, 0, 0).unwrap();
            (f, model)
        };
        let fs = DiskFs::open(vec![dev.clone()], &Options::new(EXPORT, false)).unwrap();
        let mut got = vec![0u8; model.len()];
        let (n, _) = fs.read(&f, 0, &mut got).unwrap();
        assert_eq!(n, model.len());
        assert!(got == model, "committed core writes did not survive a reopen");
        drop(fs);
        fsck_clean(dev);
    });
}

/// A core's write holds its blocks' range of its file's write lock while
/// they are on the device; a truncation of that file on the same core
/// waits for it by polling the core's own queues (anything else would wait
/// forever). Meanwhile a second write to other blocks of the file runs on
/// the core too, and a third to blocks of the first goes to a worker.
#[test]
fn a_truncation_under_a_core_write_of_the_same_core_does_not_deadlock() {
    on_a_core(|| {
        let (dev, fs) = mem_fs(8192);
        let f = create(&fs, "t");
        let data = pattern(256 << 10, 5);
        let answer: Answer = Arc::new(Mutex::new(None));
        // The memory device completes only when polled: the write is on
        // the device until this thread polls.
        assert!(fs.write_start(&f, 0, &data, Stability::Unstable, &mut Park(answer.clone())).unwrap().is_none());
        assert_eq!(fs.counters().core_writes(), 1);
        let disjoint: Answer = Arc::new(Mutex::new(None));
        assert!(fs.write_start(&f, 1 << 20, b"later", Stability::Unstable, &mut Park(disjoint.clone())).unwrap().is_none());
        assert_eq!(fs.counters().core_writes(), 2, "other blocks of the file: the second write is on the core too");
        assert!(disjoint.lock().unwrap().is_none(), "not polled yet: still on the device");
        let third: Answer = Arc::new(Mutex::new(None));
        assert!(fs.write_start(&f, 8192, b"third", Stability::Unstable, &mut Park(third.clone())).unwrap().is_none());
        assert_eq!(fs.counters().core_writes(), 2, "block 2 is the first write's: the third went to a worker");
        fs.setattr(&f, &vfs::SetAttr { size: Some(4096), ..Default::default() }, None).unwrap();
        assert!(answer.lock().unwrap().is_some(), "the truncation waited for the write");
        assert!(disjoint.lock().unwrap().is_some(), "the truncation waited for the second write");
        assert!(matches!(answer.lock().unwrap().take().unwrap().1, Ok(IoDone::Write { count, .. }) if count == 256 << 10));
        assert!(matches!(disjoint.lock().unwrap().take().unwrap().1, Ok(IoDone::Write { count: 5, .. })));
        let _ = answered(&third, "the worker's write");
        // The truncation and the worker's write ran in some order (the
        // worker's after the first write): the file holds the first 4 KiB
        // of the core's write either way, and nothing of the second.
        let size = fs.getattr(&f).unwrap().size;
        assert!(size == 4096 || size == 8192 + 5, "size {size}");
        let mut got = vec![0u8; size as usize];
        fs.read(&f, 0, &mut got).unwrap();
        assert!(got[..4096] == data[..4096]);
        if size > 4096 {
            assert!(got[4096..8192].iter().all(|&b| b == 0), "truncated then extended: zeros between");
            assert_eq!(&got[8192..], b"third");
        }
        fs.commit(&f, 0, 0).unwrap();
        drop(fs);
        fsck_clean(dev);
    });
}

/// Writes of disjoint blocks of one file are on the device together (a
/// queue depth of 32 on one file is 32 writes in flight, not one and 31
/// waiting), and writes sharing a block — each a read-modify-write of it,
/// on worker threads while the core's writes are in flight — never lose
/// each other's bytes.
#[test]
fn disjoint_writes_of_one_file_are_in_flight_together_and_shared_blocks_lose_nothing() {
    on_a_core(|| {
        let (dev, fs) = mem_fs(8192);
        let fs = Arc::new(fs);
        let f = create(&fs, "q");
        const BLOCKS: usize = 96;
        let mut model = pattern(BLOCKS * 4096, 9);
        fs.write(&f, 0, &model, Stability::FileSync).unwrap();
        // 32 whole-block writes, every third block from 0: each its own range.
        let before = fs.counters().core_writes();
        let mut parked = Vec::new();
        for k in 0..32usize {
            let b = k * 3;
            let data = pattern(4096, 100 + k as u32);
            model[b * 4096..(b + 1) * 4096].copy_from_slice(&data);
            let a: Answer = Arc::new(Mutex::new(None));
            assert!(fs.write_start(&f, (b * 4096) as u64, &data, Stability::Unstable, &mut Park(a.clone())).unwrap().is_none());
            parked.push(a);
        }
        assert_eq!(fs.counters().core_writes() - before, 32, "all 32 on the core, none waiting for another's lock");
        assert!(parked.iter().all(|a| a.lock().unwrap().is_none()), "not polled yet: all 32 on the device at once");
        // Meanwhile four workers write 512-byte slices into the blocks
        // between (1, 2, 4, 5, ...): each slice a read-modify-write of a
        // block that another worker is writing too.
        let mut slices = Vec::new();
        for b in (0..BLOCKS).filter(|b| b % 3 != 0) {
            for s in 0..8usize {
                slices.push((b * 4096 + s * 512, pattern(512, (b * 8 + s) as u32)));
            }
        }
        for (off, d) in &slices {
            model[*off..*off + 512].copy_from_slice(d);
        }
        let workers: Vec<_> = (0..4usize)
            .map(|t| {
                let (fs, mine): (Arc<DiskFs>, Vec<_>) = (fs.clone(), slices.iter().skip(t).step_by(4).cloned().collect());
                std::thread::spawn(move || {
                    for (off, d) in mine {
                        fs.write(&f, off as u64, &d, Stability::Unstable).unwrap();
                    }
                })
            })
            .collect();
        for (k, a) in parked.iter().enumerate() {
            let (_, r) = answered(a, "a core write");
            assert!(matches!(r, Ok(IoDone::Write { count: 4096, .. })), "write {k}: {r:?}");
        }
        for w in workers {
            w.join().unwrap();
        }
        let mut got = vec![0u8; model.len()];
        fs.read(&f, 0, &mut got).unwrap();
        let first = got.iter().zip(&model).position(|(a, b)| a != b);
        assert!(got == model, "a write was lost (first differing byte at {first:?})");
        fs.commit(&f, 0, 0).unwrap();
        drop(fs);
        let fs = DiskFs::open(vec![dev.clone()], &Options::new(EXPORT, false)).unwrap();
        let mut got = vec![0u8; model.len()];
        fs.read(&f, 0, &mut got).unwrap();
        assert!(got == model, "committed writes did not survive a reopen");
        drop(fs);
        fsck_clean(dev);
    });
}

/// The file as a server opening the device's image now would see it (a
/// crash: nothing that was not made durable is mapped).
fn after_a_crash(mem: &MemDevice, f: &FileHandle, len: usize) -> Vec<u8> {
    let dev: Device = Arc::new(MemDevice::from_image("copy", mem.snapshot()));
    let fs = DiskFs::open(vec![dev], &Options::new(EXPORT, false)).unwrap();
    let mut got = vec![0u8; len];
    let (n, _) = fs.read(f, 0, &mut got).unwrap();
    got.truncate(n);
    got
}

/// Park `start` (a WRITE or COMMIT through its `_start` call) and poll
/// until it is answered (by the worker that flushed the log, here; a
/// server's ticket takes the answer back to the core's mailbox).
fn parked_answer(what: &str, start: impl FnOnce(&mut Park) -> bool) -> VfsResult<IoDone> {
    let answer: Answer = Arc::new(Mutex::new(None));
    assert!(start(&mut Park(answer.clone())), "{what} was answered inline");
    answered(&answer, what).1
}

/// A FILE_SYNC WRITE and a COMMIT on a core: their blocks and the flush of
/// every device go through the core's own queues (the log flush after them
/// on a worker), and once answered the data survives a crash — an
/// UNSTABLE write's does not until its COMMIT. A device whose flush fails
/// answers the COMMIT with an I/O error; a directory is refused at once.
#[test]
fn stable_writes_and_commits_flush_on_the_core_and_survive_a_crash() {
    on_a_core(|| {
        let mem = Arc::new(MemDevice::new("mem0", 16384));
        let fault = Arc::new(block::fault::FaultDevice::new(mem.clone()));
        let ctl = fault.control();
        let dev: Device = fault;
        let fs = DiskFs::open(vec![dev.clone()], &Options::new(EXPORT, true)).unwrap();
        let f = create(&fs, "s");
        let c = fs.counters();

        let a = pattern(8192, 1);
        let flushes = ctl.flushes();
        let r = parked_answer("a FILE_SYNC WRITE", |p| fs.write_start(&f, 0, &a, Stability::FileSync, p).unwrap().is_none());
        match r {
            Ok(IoDone::Write { count: 8192, committed: Stability::FileSync, attr }) => assert_eq!(attr.size, 8192),
            other => panic!("a FILE_SYNC WRITE answered {other:?}"),
        }
        assert_eq!((c.core_writes(), c.core_commits()), (1, 1), "the write and its commit ran on the core");
        assert!(ctl.flushes() >= flushes + 2, "a device flush, then the log's");
        assert!(after_a_crash(&mem, &f, 1 << 20) == a, "a FILE_SYNC answer before its data was durable");

        let b = pattern(4096, 2);
        let (r, parked) = core_write(&fs, &f, 65536, &b);
        assert_eq!((r.unwrap(), parked), (4096, true));
        assert_eq!(after_a_crash(&mem, &f, 1 << 20).len(), 8192, "an UNSTABLE write is not durable before COMMIT");
        let r = parked_answer("a COMMIT", |p| fs.commit_start(&f, 0, 0, p).unwrap().is_none());
        assert!(matches!(r, Ok(IoDone::Commit)), "{r:?}");
        assert_eq!(c.core_commits(), 2);
        let got = after_a_crash(&mem, &f, 1 << 20);
        assert!(got.len() == 65536 + 4096 && got[..8192] == a[..] && got[65536..] == b[..], "the COMMIT answered before the write was durable");

        // A flush the device fails: the COMMIT says so.
        let (r, _) = core_write(&fs, &f, 0, &b);
        r.unwrap();
        ctl.fail_after_ops(0);
        let r = parked_answer("a COMMIT whose flush fails", |p| fs.commit_start(&f, 0, 0, p).unwrap().is_none());
        assert!(matches!(r, Err(VfsError::Io)), "{r:?}");
        ctl.clear();
        let r = parked_answer("a COMMIT after the device recovered", |p| fs.commit_start(&f, 0, 0, p).unwrap().is_none());
        assert!(matches!(r, Ok(IoDone::Commit)), "{r:?}");

        let root = fs.root(EXPORT).unwrap();
        let answer: Answer = Arc::new(Mutex::new(None));
        assert!(matches!(fs.commit_start(&root, 0, 0, &mut Park(answer)), Err(VfsError::IsDir)));
        drop(fs);
        fsck_clean(dev);
    });
}
