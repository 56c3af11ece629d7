//! A connection storm: many connections that each keep a few NULL calls in
//! flight, from one thread polling them all, while a well-behaved client on
//! its own connection measures NULL round trips one at a time. It shows
//! whether a server stays responsive (the good client's p99) and what the
//! storm costs it (the caller samples the server's memory meanwhile).
//!
//! Connections the server refuses (over its connection limit) are counted,
//! not retried. Every reply is counted by size: a successful NULL reply is
//! 28 bytes with its record mark.

use crate::{encode_null_call, NullClient, RoundTrip, NULL_REPLY_BYTES, RECORD_MARK_BYTES};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections one storm opens at most (each is a file descriptor here).
pub const STORM_CONNS_MAX: usize = 16_384;
/// Calls kept in flight per storm connection at most.
pub const STORM_DEPTH_MAX: usize = 64;
const REPLY_BYTES: usize = RECORD_MARK_BYTES + NULL_REPLY_BYTES;

#[derive(Debug, Clone, Copy)]
pub struct StormConfig {
    pub addr: SocketAddr,
    pub conns: usize,
    pub depth: usize,
    pub duration: Duration,
    pub prog: u32,
    pub vers: u32,
}

#[derive(Debug, Default, Clone)]
pub struct StormResult {
    /// Connections that were answered at least once.
    pub served: usize,
    /// Connections the server closed without answering (over its limit).
    pub refused: usize,
    /// NULL calls answered across the storm connections.
    pub calls: u64,
    /// The good client's round trips, in microseconds.
    pub good_calls: u64,
    pub good_us_p50: f64,
    pub good_us_p99: f64,
    pub good_us_max: f64,
}

impl StormResult {
    pub fn to_json(&self) -> String {
        format!(
            "{{\"served\":{},\"refused\":{},\"calls\":{},\"good\":{{\"calls\":{},\"p50_us\":{:.1},\"p99_us\":{:.1},\"max_us\":{:.1}}}}}",
            self.served, self.refused, self.calls, self.good_calls, self.good_us_p50, self.good_us_p99, self.good_us_max
        )
    }
}

struct Conn {
    s: TcpStream,
    inflight: usize,
    /// Bytes of a reply split across reads.
    partial: usize,
    answered: bool,
    closed: bool,
    /// Call bytes not yet written (the socket was full).
    out: Vec<u8>,
}

/// Run the storm for `cfg.duration` with the good client alongside; the
/// good client connects first, so it holds its place under a limit.
pub fn storm(cfg: &StormConfig) -> io::Result<StormResult> {
    if cfg.conns == 0 || cfg.conns > STORM_CONNS_MAX || cfg.depth == 0 || cfg.depth > STORM_DEPTH_MAX {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "storm: conns 1..=16384 and depth 1..=64"));
    }
    raise_nofile(cfg.conns + 64)?;
    let mut good = NullClient::connect(cfg.addr, cfg.prog, cfg.vers)?;
    good.round_trip(1)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_good = stop.clone();
    let good_thread = std::thread::spawn(move || -> io::Result<Vec<u32>> {
        let mut samples = Vec::new();
        let mut xid = 2u32;
        while !stop_good.load(Ordering::Relaxed) && samples.len() < 1_000_000 {
            let t = Instant::now();
            good.round_trip(xid)?;
            samples.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            xid = xid.wrapping_add(1);
            // A well-behaved client: one call at a time, a little apart.
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(samples)
    });
    let result = hammer(cfg);
    stop.store(true, Ordering::Relaxed);
    let mut samples = good_thread.join().map_err(|_| io::Error::other("good client panicked"))??;
    let mut r = result?;
    samples.sort_unstable();
    let pct = |p: f64| samples.get(((samples.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0) as f64;
    r.good_calls = samples.len() as u64;
    r.good_us_p50 = pct(0.50);
    r.good_us_p99 = pct(0.99);
    r.good_us_max = samples.last().copied().unwrap_or(0) as f64;
    Ok(r)
}

/// Nice value of the storm's own thread where SCHED_IDLE is refused.
const STORM_NICE: i32 = 10;

/// The storm's own thread runs under SCHED_IDLE: on a machine with few
/// CPUs the generator shares them with the server and the measured client,
/// and the figure should be the server's, not the scheduler's. At nice 10
/// (before) the scheduler still let the generator run 11.5 ms at a stretch
/// while a server loop waited on the same CPU (perf sched); an idle-policy
/// thread is preempted by any normal one as soon as that one wakes, and
/// still keeps the storm real (it runs whenever a CPU would idle: ~600k
/// calls in 4 s on 2 CPUs, as at nice 10). The good client keeps its
/// normal priority. Returns whether SCHED_IDLE took.
fn lower_own_priority() -> bool {
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a valid
    // param; gettid has no preconditions; setpriority on our own thread id
    // (Linux applies PRIO_PROCESS to a single thread).
    unsafe {
        let p = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) == 0 {
            return true;
        }
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, STORM_NICE);
    }
    false
}

fn hammer(cfg: &StormConfig) -> io::Result<StormResult> {
    if !lower_own_priority() {
        eprintln!("storm: SCHED_IDLE refused ({}); the generator runs at nice {STORM_NICE}", io::Error::last_os_error());
    }
    let mut conns = Vec::with_capacity(cfg.conns);
    let mut r = StormResult::default();
    for _ in 0..cfg.conns {
        match TcpStream::connect(cfg.addr) {
            Ok(s) => {
                s.set_nonblocking(true)?;
                let _ = s.set_nodelay(true);
                conns.push(Conn { s, inflight: 0, partial: 0, answered: false, closed: false, out: Vec::new() });
            }
            // A full accept queue refuses outright: counted as refused.
            Err(_) => r.refused += 1,
        }
    }
    let deadline = Instant::now() + cfg.duration;
    let mut call = [0u8; RECORD_MARK_BYTES + crate::NULL_CALL_BYTES];
    let mut buf = vec![0u8; 64 << 10];
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(conns.len());
    let mut xid = 0x5000_0000u32;
    while Instant::now() < deadline {
        for c in conns.iter_mut().filter(|c| !c.closed && c.out.is_empty()) {
            while c.inflight < cfg.depth {
                encode_null_call(&mut call, xid, cfg.prog, cfg.vers);
                xid = xid.wrapping_add(1);
                c.out.extend_from_slice(&call);
                c.inflight += 1;
            }
        }
        fds.clear();
        for c in &conns {
            let events = if c.closed { 0 } else { libc::POLLIN | if c.out.is_empty() { 0 } else { libc::POLLOUT } };
            fds.push(libc::pollfd { fd: if c.closed { -1 } else { c.s.as_raw_fd() }, events, revents: 0 });
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for (c, fd) in conns.iter_mut().zip(&fds) {
            if fd.revents == 0 || c.closed {
                continue;
            }
            if fd.revents & libc::POLLOUT != 0 {
                match c.s.write(&c.out) {
                    Ok(w) => {
                        c.out.drain(..w);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => c.closed = true,
                }
            }
            if fd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                match c.s.read(&mut buf) {
                    Ok(0) => c.closed = true,
                    Ok(got) => {
                        let total = c.partial + got;
                        let replies = total / REPLY_BYTES;
                        c.partial = total % REPLY_BYTES;
                        c.inflight = c.inflight.saturating_sub(replies);
                        r.calls += replies as u64;
                        c.answered |= replies > 0;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => c.closed = true,
                }
            }
        }
    }
    for c in &conns {
        if c.answered {
            r.served += 1;
        } else if c.closed {
            r.refused += 1;
        }
    }
    Ok(r)
}

/// Lift the soft open-file limit to what the storm needs (up to the hard
/// limit), or say why not.
fn raise_nofile(want: usize) -> io::Result<()> {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return Err(io::Error::last_os_error());
        }
        if l.rlim_cur as usize >= want {
            return Ok(());
        }
        if (l.rlim_max as usize) < want {
            return Err(io::Error::other(format!("storm: needs {want} open files, hard limit is {}", l.rlim_max)));
        }
        l.rlim_cur = want as libc::rlim_t;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
