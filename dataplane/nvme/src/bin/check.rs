//! `chimera-nvme-check`: the driver on a real controller, for the guest test
//! and for an operator checking a node.
//!
//!   chimera-nvme-check open ADDR                 open, print the identity or the refusal
//!   chimera-nvme-check identify ADDR [--hold S]  identity as key=value lines (hold the device S seconds)
//!   chimera-nvme-check exercise ADDR [--ops N] [--threads T] [--seed X] [--data sgl|prp]
//!       N random reads and writes (1..16 blocks) with verification, T threads
//!       each on its own queue pair; then flush, write-zeroes, an out-of-range
//!       read that the controller must refuse, and the device counters
//!   chimera-nvme-check bench (--vfio ADDR | --uring PATH) [--qd Q] [--seconds S] [--span-mib M] [--wait poll|sleep]
//!     (--wait: spin on the queue's poll, as a core loop with I/O in flight
//!     does — the default for vfio; or the queue's blocking wait — the
//!     default for io_uring, as fio's io_uring engine waits in the kernel)
//!       4 KiB random reads at queue depth Q: IOPS and latency percentiles
//!
//! Exit status 0 on success, 1 when a check fails (with the reason), 2 on
//! bad usage. DESTRUCTIVE: `exercise` overwrites the namespace.

use std::collections::HashMap;
use std::process::exit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::conformance::{pattern, pattern_vec};
use block::rng::SeededRng;
use block::{BlockDevice, BufPool, Completion, Device, ErrorKind, Hugepages, Op, PoolConfig, Rejected, BLOCK_BYTES};

fn die(code: i32, msg: impl std::fmt::Display) -> ! {
    eprintln!("chimera-nvme-check: {msg}");
    exit(code)
}

fn flag<T: std::str::FromStr>(args: &HashMap<String, String>, k: &str, default: T) -> T {
    match args.get(k) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| die(2, format!("--{k}: cannot parse {v:?}"))),
    }
}

fn open(addr: &str, opts: &nvme::Options) -> nvme::NvmeDevice {
    nvme::open_pci(&nvme::sysfs_address(addr), opts).unwrap_or_else(|e| die(1, e))
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = argv.first().cloned() else { die(2, "usage: chimera-nvme-check open|identify|exercise|bench ... (see the source's header)") };
    let mut pos = Vec::new();
    let mut args = HashMap::new();
    let mut it = argv[1..].iter();
    while let Some(a) = it.next() {
        match a.strip_prefix("--") {
            Some(k) => {
                let v = it.next().unwrap_or_else(|| die(2, format!("--{k} needs a value")));
                args.insert(k.to_string(), v.clone());
            }
            None => pos.push(a.clone()),
        }
    }
    match (cmd.as_str(), pos.as_slice()) {
        ("open", [addr]) => {
            let d = open(addr, &nvme::Options::default());
            println!("opened {} ({}, serial {})", d.info().name, d.identity().model, d.identity().serial);
        }
        ("identify", [addr]) => {
            let d = open(addr, &nvme::Options::default());
            let id = d.identity();
            println!("serial={}", id.serial);
            println!("model={}", id.model);
            println!("firmware={}", id.firmware);
            println!("version={}.{}", id.version.0, id.version.1);
            println!("nsid={}", id.nsid);
            println!("lba_bytes={}", id.lba_bytes);
            println!("lbas={}", id.lbas);
            println!("bytes={}", id.lbas * id.lba_bytes as u64);
            println!("blocks_4k={}", d.info().blocks);
            println!("mdts_bytes={}", id.mdts_bytes.unwrap_or(0));
            println!("io_queues={}", id.io_queues);
            println!("queue_entries={}", id.queue_entries);
            println!("write_zeroes={}", id.write_zeroes);
            println!("volatile_write_cache={}", id.volatile_write_cache);
            println!("sgl={}", id.sgl);
            let hold: u64 = flag(&args, "hold", 0);
            std::thread::sleep(Duration::from_secs(hold));
        }
        ("exercise", [addr]) => exercise(addr, &args),
        ("bench", []) => bench(&args),
        _ => die(2, format!("unknown command or arguments: {argv:?}")),
    }
}

fn pool(bufs: usize) -> BufPool {
    BufPool::new(PoolConfig { buf_bytes: 16 * BLOCK_BYTES, bufs_max: bufs, hugepages: Hugepages::Try }).unwrap_or_else(|e| die(1, e))
}

/// One thread's share: random ops in its own block range, at most one op
/// in flight per block, every read of a written block checked.
fn worker(dev: Device, t: u64, first: u64, span: u64, ops: u64, seed: u64) -> Result<(u64, u64), String> {
    let p = pool(17);
    let mut q = dev.queue(t as usize, 16).map_err(|e| e.to_string())?;
    let mut rng = SeededRng::new(seed ^ (t + 1) * 0x9e37_79b9);
    let mut version: Vec<u64> = vec![0; span as usize];
    let mut busy = vec![false; span as usize];
    // token -> (op index, lba, blocks, is_write)
    let mut out: HashMap<u64, (u64, u64, bool)> = HashMap::new();
    let (mut issued, mut verified) = (0u64, 0u64);
    let mut done: Vec<Completion> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while issued < ops || !out.is_empty() {
        if Instant::now() > deadline {
            return Err(format!("thread {t}: {} operations not completed in 600 s", out.len()));
        }
        while issued < ops && out.len() < 16 {
            let blocks = 1 + rng.below(16);
            let at = rng.below(span - blocks);
            if busy[at as usize..(at + blocks) as usize].iter().any(|b| *b) {
                break;
            }
            let Some(mut buf) = p.get() else { break };
            let write = rng.coin();
            let token = issued;
            let lba = first + at;
            let op = if write {
                let v = (t << 48) | (issued + 1);
                pattern(v, lba, &mut buf[..blocks as usize * BLOCK_BYTES]);
                for b in at..at + blocks {
                    version[b as usize] = v;
                }
                Op::Write { lba, blocks: blocks as u32, buf }
            } else {
                Op::Read { lba, blocks: blocks as u32, buf }
            };
            match q.submit(op, token) {
                Ok(()) => {}
                Err(Rejected::Busy(_)) => break,
                Err(Rejected::Invalid(_, e)) => return Err(format!("thread {t}: refused: {e}")),
            }
            for b in at..at + blocks {
                busy[b as usize] = true;
            }
            out.insert(token, (at, blocks, write));
            issued += 1;
        }
        if q.poll(&mut done) == 0 && !out.is_empty() {
            q.wait(&mut done);
        }
        for c in done.drain(..) {
            let (at, blocks, write) = out.remove(&c.token).expect("a token we issued");
            c.result.map_err(|e| format!("thread {t}: {e}"))?;
            for b in at..at + blocks {
                busy[b as usize] = false;
            }
            if !write {
                let buf = c.buf.expect("a read returns its buffer");
                for b in at..at + blocks {
                    let v = version[b as usize];
                    if v == 0 {
                        continue;
                    }
                    let off = (b - at) as usize * BLOCK_BYTES;
                    if buf[off..off + BLOCK_BYTES] != pattern_vec(v, first + b, 1)[..] {
                        return Err(format!("thread {t}: block {} read back differently from version {v:#x}", first + b));
                    }
                    verified += 1;
                }
            }
        }
    }
    // Everything written reads back after a flush.
    block::sync::flush(&mut *q).map_err(|e| e.to_string())?;
    let mut got = vec![0u8; BLOCK_BYTES];
    for b in 0..span {
        let v = version[b as usize];
        if v == 0 {
            continue;
        }
        block::sync::read(&mut *q, &p, first + b, &mut got).map_err(|e| e.to_string())?;
        if got != pattern_vec(v, first + b, 1) {
            return Err(format!("thread {t}: block {} differs in the final read-back", first + b));
        }
        verified += 1;
    }
    Ok((issued, verified))
}

fn exercise(addr: &str, args: &HashMap<String, String>) {
    let ops: u64 = flag(args, "ops", 10_000);
    let threads: u64 = flag(args, "threads", 2);
    let seed: u64 = flag(args, "seed", 1);
    let sgl = match args.get("data").map(String::as_str) {
        None | Some("sgl") => true,
        Some("prp") => false,
        Some(o) => die(2, format!("--data: expected sgl or prp, got {o:?}")),
    };
    let opts = nvme::Options { pass_out_of_range: true, io_timeout: Duration::from_secs(30), sgl, ..nvme::Options::default() };
    let nd = open(addr, &opts);
    println!("data pointers: {}", if nd.uses_sgl() { "SGL data blocks" } else { "PRP lists" });
    let blocks = nd.info().blocks;
    let dev: Device = Arc::new(nd);
    let span = (blocks / threads).min(8192);
    if span < 64 {
        die(1, format!("{addr}: too small for {threads} threads ({blocks} blocks)"));
    }
    let t0 = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || worker(dev, t, t * span, span, ops / threads, seed))
        })
        .collect();
    let mut total = (0, 0);
    for h in hs {
        match h.join() {
            Ok(Ok((i, v))) => {
                total.0 += i;
                total.1 += v;
            }
            Ok(Err(e)) => die(1, format!("FAIL random read/write: {e}")),
            Err(_) => die(1, "FAIL random read/write: a worker panicked"),
        }
    }
    println!("ok random read/write: {} operations on {threads} queues, {} blocks verified, {:.1} s", total.0, total.1, t0.elapsed().as_secs_f64());

    let p = pool(2);
    let mut q = dev.queue(0, 4).unwrap_or_else(|e| die(1, e));
    // Write-zeroes over written blocks, then read zeros.
    let data = pattern_vec(77, 10, 16);
    block::sync::write(&mut *q, &p, 10, &data).unwrap_or_else(|e| die(1, format!("FAIL write: {e}")));
    block::sync::write_zeroes(&mut *q, 12, 8).unwrap_or_else(|e| die(1, format!("FAIL write-zeroes: {e}")));
    block::sync::flush(&mut *q).unwrap_or_else(|e| die(1, format!("FAIL flush: {e}")));
    let mut got = vec![0u8; 16 * BLOCK_BYTES];
    block::sync::read(&mut *q, &p, 10, &mut got).unwrap_or_else(|e| die(1, format!("FAIL read: {e}")));
    let z = 2 * BLOCK_BYTES..10 * BLOCK_BYTES;
    if got[..z.start] != data[..z.start] || got[z.end..] != data[z.end..] || got[z.clone()].iter().any(|&b| b != 0) {
        die(1, "FAIL write-zeroes: blocks 12..20 are not zero or their neighbours changed");
    }
    println!("ok flush and write-zeroes");
    // Past the namespace's end: the controller's own refusal, as an I/O error.
    let c = block::sync::run(&mut *q, Op::Read { lba: blocks + 7, blocks: 1, buf: p.get().expect("a buffer") });
    match c.result {
        Err(e) if matches!(e.kind, ErrorKind::DeviceStatus { .. }) && e.errno() == libc::EIO => {
            println!("ok out-of-range read refused by the controller: {e}")
        }
        other => die(1, format!("FAIL out-of-range read: {other:?}")),
    }
    let s = dev.stats().expect("the driver keeps stats");
    println!(
        "stats reads={} writes={} flushes={} zeroes={} bytes_read={} bytes_written={} errors={} commands={} resets={}",
        s.reads, s.writes, s.flushes, s.zeroes, s.bytes_read, s.bytes_written, s.errors, s.commands, s.resets
    );
    println!("PASS exercise {addr}");
}

fn bench(args: &HashMap<String, String>) {
    let qd: usize = flag(args, "qd", 1);
    let secs: f64 = flag(args, "seconds", 3.0);
    let span_mib: u64 = flag(args, "span-mib", 64);
    let (dev, what): (Device, String) = if let Some(a) = args.get("vfio") {
        (Arc::new(open(a, &nvme::Options::default())), format!("vfio {a}"))
    } else if let Some(p) = args.get("uring") {
        let d = block::uring::UringDevice::open(&block::uring::UringOptions::new(p)).unwrap_or_else(|e| die(1, e));
        (Arc::new(d), format!("io_uring {p}"))
    } else {
        die(2, "bench needs --vfio ADDR or --uring PATH")
    };
    let spin = match args.get("wait").map(String::as_str) {
        None => args.contains_key("vfio"),
        Some("poll") => true,
        Some("sleep") => false,
        Some(other) => die(2, format!("--wait {other}: expected poll or sleep")),
    };
    let span = (span_mib * 256).min(dev.info().blocks);
    let p = BufPool::new(PoolConfig { buf_bytes: BLOCK_BYTES, bufs_max: qd, hugepages: Hugepages::Try }).unwrap_or_else(|e| die(1, e));
    let mut q = dev.queue(0, qd).unwrap_or_else(|e| die(1, e));
    let mut rng = SeededRng::new(42);
    let mut lat: Vec<u32> = Vec::with_capacity(1 << 20);
    let mut started: Vec<Instant> = vec![Instant::now(); qd];
    let mut free: Vec<u64> = (0..qd as u64).collect();
    let mut done = Vec::new();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    loop {
        let now = Instant::now();
        if now < end {
            while let Some(slot) = free.pop() {
                let buf = p.get().expect("one buffer per slot");
                started[slot as usize] = Instant::now();
                if let Err(r) = q.submit(Op::Read { lba: rng.below(span), blocks: 1, buf }, slot) {
                    die(1, format!("submit: {r:?}"));
                }
            }
        } else if q.inflight() == 0 {
            break;
        }
        if q.poll(&mut done) == 0 && !spin {
            q.wait(&mut done);
        }
        for c in done.drain(..) {
            if let Err(e) = c.result {
                die(1, e);
            }
            lat.push(started[c.token as usize].elapsed().as_micros().min(u32::MAX as u128) as u32);
            free.push(c.token);
            n += 1;
        }
    }
    let el = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0);
    let how = if spin { "poll" } else { "sleep" };
    println!("bench {what} qd={qd} wait={how} ops={n} seconds={el:.2} iops={:.0} p50_us={} p99_us={}", n as f64 / el, pct(0.5), pct(0.99));
}
