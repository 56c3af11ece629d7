//! The driver against the simulated controller: the block layer's
//! conformance run, Identify, queues shared when the controller grants
//! fewer pairs, commands split at MDTS, device errors, and the timeout
//! paths (abort; reset failing commands back; a controller that never
//! comes back marks the device failed). The QEMU guest test
//! (e2e/guest/tests/nvme-vfio.sh) runs the same driver on QEMU's controller.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::conformance::{conformance, drain, pattern, pattern_vec, pool};
use block::{BlockDevice, ErrorKind, Op, BLOCK_BYTES};
use nvme::sim::{SimBus, SimConfig};
use nvme::{NvmeDevice, Options};

fn open(cfg: SimConfig, opts: Options) -> (Arc<SimBus>, NvmeDevice) {
    let bus = Arc::new(SimBus::new(cfg));
    let dev = NvmeDevice::open(bus.clone(), &opts).unwrap();
    (bus, dev)
}

fn quick() -> Options {
    Options { io_timeout: Duration::from_millis(300), admin_timeout: Duration::from_secs(2), ..Options::default() }
}

/// Both formats, with SGL data blocks and with PRP lists (a controller
/// without SGLs, and the option off).
#[test]
fn conformance_512_and_4k_formats_sgl_and_prp() {
    for (lba_bytes, ctrl_sgl, opt_sgl) in [(512u32, true, true), (4096, true, true), (512, false, true), (4096, true, false)] {
        let lbas = 1024 * 4096 / lba_bytes as u64;
        let mut cfg = SimConfig::new("sim-conf", lbas, lba_bytes);
        cfg.sgl = ctrl_sgl;
        let (bus, dev) = open(cfg, Options { sgl: opt_sgl, ..Options::default() });
        assert_eq!(dev.info().blocks, 1024);
        assert_eq!(dev.uses_sgl(), ctrl_sgl && opt_sgl);
        conformance(&dev, "sim-conf");
        let (sgl, prp) = (bus.faults().sgl_commands.load(Ordering::Relaxed), bus.faults().prp_commands.load(Ordering::Relaxed));
        if dev.uses_sgl() {
            assert!(sgl > 480 && prp == 0, "sgl {sgl} prp {prp}");
        } else {
            assert!(prp > 480 && sgl == 0, "sgl {sgl} prp {prp}");
        }
        let s = dev.stats();
        assert!(s.reads >= 240 && s.writes >= 240 && s.flushes >= 3 && s.zeroes >= 1, "{s:?}");
        assert_eq!(s.errors, 0);
        assert_eq!(s.latency_buckets.iter().sum::<u64>(), s.reads + s.writes + s.flushes + s.zeroes);
    }
}

#[test]
fn identify_reports_what_the_controller_says() {
    let mut cfg = SimConfig::new("sim-id", 8192, 512);
    cfg.serial = "SERIAL-42".into();
    cfg.model = "Model X".into();
    cfg.mdts = 3;
    cfg.queues_max = 3;
    let (_bus, dev) = open(cfg, Options::default());
    let id = dev.identity();
    assert_eq!(id.serial, "SERIAL-42");
    assert_eq!(id.model, "Model X");
    assert_eq!(id.nsid, 1);
    assert_eq!(id.lbas, 8192);
    assert_eq!(id.lba_bytes, 512);
    assert_eq!(id.mdts_bytes, Some(32768));
    assert_eq!(id.io_queues, 3);
    assert_eq!(id.queue_entries, 128);
    assert!(id.write_zeroes && id.volatile_write_cache);
    assert_eq!(dev.info().blocks, 1024);
}

/// Ops of 64 blocks with an 8-page MDTS are split into 8 commands each.
#[test]
fn large_ops_split_at_mdts() {
    let mut cfg = SimConfig::new("sim-mdts", 2048, 4096);
    cfg.mdts = 3;
    let (bus, dev) = open(cfg, Options::default());
    let p = pool(64 * BLOCK_BYTES, 4);
    let mut q = dev.queue(0, 4).unwrap();
    let data = pattern_vec(7, 100, 64);
    block::sync::write(&mut *q, &p, 100, &data).unwrap();
    assert_eq!(dev.stats().commands, 8);
    let mut got = vec![0u8; data.len()];
    block::sync::read(&mut *q, &p, 100, &mut got).unwrap();
    assert!(got == data);
    assert!(bus.read_store(100 * 4096, 64 * 4096) == data, "the bytes are on the namespace where they belong");
    // Write-zeroes over a range wider than one command's limit.
    block::sync::write_zeroes(&mut *q, 0, 2048).unwrap();
    block::sync::read(&mut *q, &p, 100, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0));
}

/// More queues than the controller grants pairs: they share pairs, and every
/// thread's data is right.
#[test]
fn queues_share_pairs_when_the_controller_grants_fewer() {
    let mut cfg = SimConfig::new("sim-share", 4096, 512);
    cfg.queues_max = 2;
    let (_bus, dev) = open(cfg, Options::default());
    let dev = Arc::new(dev);
    let threads: Vec<_> = (0..5u64)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let p = pool(BLOCK_BYTES, 16);
                let mut q = dev.queue(t as usize, 16).unwrap();
                let base = t * 100;
                let mut done = Vec::new();
                let mut completed = 0;
                let mut settle = |done: &mut Vec<block::Completion>| {
                    for c in done.drain(..) {
                        c.result.unwrap();
                        completed += 1;
                    }
                };
                for i in 0..64u64 {
                    let mut b = loop {
                        match p.get() {
                            Some(b) => break b,
                            None => {
                                q.wait(&mut done);
                                settle(&mut done);
                            }
                        }
                    };
                    pattern(t, base + i, &mut b);
                    while let Err(r) = q.submit(Op::Write { lba: base + i, blocks: 1, buf: b }, i) {
                        let block::Rejected::Busy(op) = r else { panic!("{r:?}") };
                        b = op.into_buf().unwrap();
                        q.wait(&mut done);
                        settle(&mut done);
                    }
                    q.poll(&mut done);
                    settle(&mut done);
                }
                drain(&mut *q, &mut done);
                settle(&mut done);
                assert_eq!(completed, 64);
                for i in 0..64u64 {
                    let mut got = vec![0u8; BLOCK_BYTES];
                    block::sync::read(&mut *q, &p, base + i, &mut got).unwrap();
                    assert!(got == pattern_vec(t, base + i, 1), "thread {t} block {i}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(dev.hw_queues(), 2);
}

#[test]
fn device_status_and_out_of_range_come_back_as_io_errors() {
    let opts = Options { pass_out_of_range: true, ..Options::default() };
    let (bus, dev) = open(SimConfig::new("sim-err", 1024, 4096), opts);
    let p = pool(BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 2).unwrap();
    let c = block::sync::run(&mut *q, Op::Read { lba: 5000, blocks: 1, buf: p.get().unwrap() });
    let e = c.result.unwrap_err();
    assert!(matches!(e.kind, ErrorKind::DeviceStatus { sct: 0, sc: 0x80, .. }), "{e}");
    assert_eq!(e.errno(), libc::EIO);
    let msg = e.to_string();
    assert!(msg.contains("sim-err") && msg.contains("LBA out of range") && msg.contains("byte offset 20480000"), "{msg}");
    assert!(c.buf.is_some(), "the buffer comes back");
    bus.faults().status_once.store(2 << 8 | 0x81, Ordering::Relaxed);
    let e = block::sync::flush(&mut *q).unwrap_err();
    assert!(e.to_string().contains("unrecovered read error"), "{e}");
    block::sync::flush(&mut *q).unwrap();
    assert_eq!(dev.stats().errors, 2);
}

/// A lost command is aborted after the timeout; the abort completes it
/// with an error, and the queue goes on.
#[test]
fn a_lost_command_is_aborted() {
    let (bus, dev) = open(SimConfig::new("sim-abort", 1024, 4096), quick());
    let p = pool(BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 2).unwrap();
    bus.faults().swallow.store(1, Ordering::Relaxed);
    let t0 = Instant::now();
    let e = block::sync::flush(&mut *q).unwrap_err();
    assert!(t0.elapsed() >= Duration::from_millis(300) && t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(e.to_string().contains("command abort requested"), "{e}");
    assert_eq!(dev.stats().aborts, 1);
    assert_eq!(dev.stats().resets, 0);
    block::sync::write(&mut *q, &p, 1, &pattern_vec(1, 1, 1)).unwrap();
}

/// An abort the controller ignores: after the abort deadline the controller
/// is reset, every command in flight on every queue fails back as an I/O
/// error, and I/O works again on the same queues.
#[test]
fn an_ignored_abort_resets_the_controller_and_fails_inflight_back() {
    let mut cfg = SimConfig::new("sim-reset", 1024, 4096);
    cfg.queues_max = 2;
    let (bus, dev) = open(cfg, quick());
    let p = pool(BLOCK_BYTES, 8);
    let mut q1 = dev.queue(0, 4).unwrap();
    let mut q2 = dev.queue(1, 4).unwrap();
    let f = bus.faults();
    f.ignore_aborts.store(true, Ordering::Relaxed);
    f.swallow.store(3, Ordering::Relaxed);
    for i in 0..2 {
        q1.submit(Op::Read { lba: i, blocks: 1, buf: p.get().unwrap() }, i).unwrap();
    }
    q1.poll(&mut Vec::new());
    q2.submit(Op::Read { lba: 9, blocks: 1, buf: p.get().unwrap() }, 9).unwrap();
    q2.poll(&mut Vec::new());
    let t0 = Instant::now();
    let mut done = Vec::new();
    drain(&mut *q1, &mut done);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(done.len(), 2);
    for c in &done {
        let e = c.result.as_ref().unwrap_err();
        assert!(matches!(e.kind, ErrorKind::TimedOut { ms: 300 }), "{e}");
        assert!(e.to_string().contains("sim-reset") && e.to_string().contains("I/O error"), "{e}");
        assert!(c.buf.is_some());
    }
    let mut done2 = Vec::new();
    drain(&mut *q2, &mut done2);
    assert!(done2[0].result.is_err(), "the other queue's command failed back too");
    assert_eq!(dev.stats().resets, 1);
    f.ignore_aborts.store(false, Ordering::Relaxed);
    // Both queues work after the reset.
    block::sync::write(&mut *q1, &p, 3, &pattern_vec(3, 3, 1)).unwrap();
    let mut got = vec![0u8; BLOCK_BYTES];
    block::sync::read(&mut *q2, &p, 3, &mut got).unwrap();
    assert!(got == pattern_vec(3, 3, 1));
}

/// A controller that does not come back from a reset: the device is
/// failed, and every request says why instead of hanging.
#[test]
fn a_controller_that_never_comes_back_fails_the_device() {
    let (bus, dev) = open(SimConfig::new("sim-dead", 1024, 4096), quick());
    let p = pool(BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 2).unwrap();
    let f = bus.faults();
    f.dead.store(true, Ordering::Relaxed);
    let e = dev.reset("a test").unwrap_err();
    assert!(e.to_string().contains("controller reset (after a test) failed"), "{e}");
    let e = block::sync::read(&mut *q, &p, 0, &mut vec![0u8; BLOCK_BYTES]).unwrap_err();
    assert!(e.to_string().contains("sim-dead") && e.to_string().contains("restart the server"), "{e}");
    assert!(dev.queue(1, 2).is_err());
}

#[test]
fn controllers_the_driver_cannot_use_are_refused_at_open() {
    let mut cfg = SimConfig::new("sim-empty", 1024, 4096);
    cfg.namespace = false;
    let e = NvmeDevice::open(Arc::new(SimBus::new(cfg)), &Options::default()).err().unwrap();
    assert!(e.to_string().contains("sim-empty") && e.to_string().contains("no active namespace"), "{e}");
    let mut cfg = SimConfig::new("sim-meta", 1024, 4096);
    cfg.metadata = 8;
    let e = NvmeDevice::open(Arc::new(SimBus::new(cfg)), &Options::default()).err().unwrap();
    assert!(e.to_string().contains("8 bytes of metadata"), "{e}");
    let cfg = SimConfig::new("sim-dead-at-start", 1024, 4096);
    let bus = Arc::new(SimBus::new(cfg));
    bus.faults().dead.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    let e = NvmeDevice::open(bus, &Options::default()).err().unwrap();
    assert!(e.to_string().contains("did not become ready within CAP.TO (1000 ms)"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
}

/// A queue dropped with commands in flight waits them out (its buffers are
/// the device's until then) and frees its pair for the next queue.
#[test]
fn a_dropped_queue_waits_for_its_commands_and_frees_its_pair() {
    let mut cfg = SimConfig::new("sim-drop", 1024, 4096);
    cfg.queues_max = 1;
    let (_bus, dev) = open(cfg, Options::default());
    let p = pool(BLOCK_BYTES, 8);
    {
        let mut q = dev.queue(0, 8).unwrap();
        for i in 0..8 {
            q.submit(Op::Read { lba: i, blocks: 1, buf: p.get().unwrap() }, i).unwrap();
        }
        q.poll(&mut Vec::new());
    }
    assert_eq!(p.bufs_free(), 8, "every buffer came back");
    for _ in 0..3 {
        let mut q = dev.queue(0, 2).unwrap();
        block::sync::flush(&mut *q).unwrap();
    }
    assert_eq!(dev.hw_queues(), 1);
}

/// Pools opened one after another (as a tool or fsck run does) do not use
/// up the device's registrations: one nobody holds any more is unmapped.
#[test]
fn pools_come_and_go_without_exhausting_registrations() {
    let (_bus, dev) = open(SimConfig::new("sim-pools", 1024, 4096), Options::default());
    let mut q = dev.queue(0, 2).unwrap();
    for i in 0..200u64 {
        let p = pool(BLOCK_BYTES, 1);
        block::sync::write(&mut *q, &p, i, &pattern_vec(i, i, 1)).unwrap();
    }
    let p = pool(BLOCK_BYTES, 1);
    let mut got = vec![0u8; BLOCK_BYTES];
    block::sync::read(&mut *q, &p, 199, &mut got).unwrap();
    assert!(got == pattern_vec(199, 199, 1));
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: one timespec of ours.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) }, 0);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `wait` on a queue with its own interrupt vector sleeps on the vector's
/// eventfd: a command the device holds for 150 ms costs the waiting thread
/// almost no CPU, and the wait ends as soon as the completion is signalled
/// (not at the end of a nap). Without a vector (a controller with no
/// MSI-X) the same wait still completes, polled.
#[test]
fn wait_sleeps_on_the_completion_interrupt() {
    const HOLD: Duration = Duration::from_millis(150);
    let mut cfg = SimConfig::new("sim-irq", 1024, 4096);
    cfg.irq_vectors = 5;
    let (bus, dev) = open(cfg, Options::default());
    assert!(dev.identity().irq_vectors >= 2, "{:?}", dev.identity());
    let p = pool(BLOCK_BYTES, 2);
    let mut q = dev.queue(0, 2).unwrap();
    assert!(q.notify_fd().is_some(), "a queue alone on its pair has its vector's eventfd");
    let faults = bus.faults();
    let (mut cpu, mut late) = (Vec::new(), Vec::new());
    for i in 0..5u64 {
        faults.hold.store(true, Ordering::Release);
        q.submit(Op::Read { lba: i, blocks: 1, buf: p.get().unwrap() }, i).unwrap();
        let f = faults.clone();
        let release = std::thread::spawn(move || {
            std::thread::sleep(HOLD);
            f.hold.store(false, Ordering::Release);
            Instant::now()
        });
        let c0 = thread_cpu();
        let mut done = Vec::new();
        while done.is_empty() {
            q.wait(&mut done);
        }
        let (c1, back) = (thread_cpu(), Instant::now());
        let released = release.join().unwrap();
        assert!(done[0].result.is_ok(), "{:?}", done[0].result);
        cpu.push(c1 - c0);
        late.push(back.saturating_duration_since(released));
    }
    cpu.sort();
    late.sort();
    eprintln!("wait over a held command: CPU {cpu:?}; returned after the release by {late:?}");
    assert!(cpu[2] < Duration::from_millis(3), "the waiting thread used {:?} of CPU (median) over {HOLD:?}: it polled instead of sleeping", cpu[2]);
    assert!(late[2] < Duration::from_millis(5), "wait returned {:?} (median) after the completion: the interrupt did not wake it", late[2]);
    let irqs = faults.irqs.load(Ordering::Relaxed);
    assert!(irqs >= 5, "{irqs} interrupts signalled for 5 completions");

    let (_bus, dev) = open(SimConfig::new("sim-noirq", 1024, 4096), Options::default());
    let mut q = dev.queue(0, 2).unwrap();
    assert!(q.notify_fd().is_none(), "no vectors: polled");
    block::sync::flush(&mut *q).unwrap();
}
