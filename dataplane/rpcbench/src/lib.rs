//! Transport microbenchmark: ONC RPC NULL round trips (RFC 5531) against a
//! server, next to a raw TCP echo exchanging messages of the same sizes on the
//! same loopback. The difference between the two is what the server's RPC path
//! (record marking, call-header decode, dispatch, reply encode, its event loop)
//! costs over the physical path.
//!
//! The NULL call is built by hand (40 bytes plus the 4-byte record mark): it
//! must not depend on the protocol crates it is measuring, and it is the
//! simplest message an RPC server answers.
//!
//! One connection, one call in flight (QD1): the figure is latency. Calls per
//! second at QD1 is 1 / mean round trip; `make bench` divides the calls by the
//! server's CPU-seconds to give calls per server CPU-second.

pub mod nfs;
pub mod storm;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// RPC message version (RFC 5531 §9).
pub const RPC_VERSION: u32 = 2;
pub const MSG_CALL: u32 = 0;
pub const MSG_REPLY: u32 = 1;
pub const MSG_ACCEPTED: u32 = 0;
pub const MSG_DENIED: u32 = 1;
pub const AUTH_NONE: u32 = 0;
/// NFS program and version the NULL call targets by default (RFC 1813).
pub const NFS_PROGRAM: u32 = 100003;
pub const NFS_V3: u32 = 3;

/// Bytes of a NULL call body: xid, mtype, rpcvers, prog, vers, proc, cred
/// (flavor, length), verf (flavor, length).
pub const NULL_CALL_BYTES: usize = 40;
/// Bytes of a successful NULL reply body with an AUTH_NONE verifier: xid,
/// mtype, reply_stat, verf (flavor, length), accept_stat.
pub const NULL_REPLY_BYTES: usize = 24;
/// Record mark (RFC 5531 §11): one 4-byte header per fragment.
pub const RECORD_MARK_BYTES: usize = 4;
pub(crate) const LAST_FRAGMENT: u32 = 0x8000_0000;
/// Largest reply fragment accepted: a NULL reply is 24 bytes (plus a verifier
/// of at most 400 bytes); anything far larger is not a NULL reply.
pub const REPLY_BYTES_MAX: usize = 4096;
/// Most calls one measurement may make: bounds the sample buffer (4 bytes
/// each, so at most 40 MB).
pub const CALLS_MAX: u64 = 10_000_000;
/// A reply slower than this means the server is not answering.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// The echo server serves this many connections at a time at most.
pub const ECHO_CONNS_MAX: usize = 8;
/// Largest echo message (a 1 MiB READ reply with its headers fits).
pub const ECHO_MESSAGE_MAX: usize = (1 << 20) + 4096;

/// Encode a NULL call with the given xid into `out` (record mark included).
pub fn encode_null_call(out: &mut [u8; RECORD_MARK_BYTES + NULL_CALL_BYTES], xid: u32, prog: u32, vers: u32) {
    let words: [u32; 11] = [
        LAST_FRAGMENT | NULL_CALL_BYTES as u32,
        xid,
        MSG_CALL,
        RPC_VERSION,
        prog,
        vers,
        0, // procedure 0: NULL
        AUTH_NONE,
        0, // credential body length
        AUTH_NONE,
        0, // verifier body length
    ];
    for (chunk, w) in out.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Why a reply is not a successful NULL reply; each names the problem.
#[derive(Debug, PartialEq, Eq)]
pub enum ReplyError {
    Truncated { len: usize },
    WrongXid { want: u32, got: u32 },
    NotAReply { mtype: u32 },
    Denied { reject_stat: u32 },
    NotAccepted { accept_stat: u32 },
    Trailing { extra: usize },
}

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyError::Truncated { len } => write!(f, "reply of {len} bytes is too short for an RPC reply"),
            ReplyError::WrongXid { want, got } => write!(f, "reply xid {got:#x} does not match call xid {want:#x}"),
            ReplyError::NotAReply { mtype } => write!(f, "message type {mtype} is not REPLY (1)"),
            ReplyError::Denied { reject_stat } => {
                let why = if *reject_stat == 0 { "RPC_MISMATCH" } else { "AUTH_ERROR" };
                write!(f, "call denied: {why} ({reject_stat})")
            }
            ReplyError::NotAccepted { accept_stat } => {
                let why = match accept_stat {
                    1 => "PROG_UNAVAIL",
                    2 => "PROG_MISMATCH",
                    3 => "PROC_UNAVAIL",
                    4 => "GARBAGE_ARGS",
                    5 => "SYSTEM_ERR",
                    _ => "unknown accept_stat",
                };
                write!(f, "call not executed: {why} ({accept_stat})")
            }
            ReplyError::Trailing { extra } => write!(f, "{extra} unexpected bytes after the NULL reply"),
        }
    }
}

/// Check that `body` (one complete record, mark removed) is a successful
/// reply to the NULL call `xid`.
pub fn check_null_reply(body: &[u8], xid: u32) -> Result<(), ReplyError> {
    if body.len() < 12 {
        return Err(ReplyError::Truncated { len: body.len() });
    }
    let got = be32(body, 0);
    if got != xid {
        return Err(ReplyError::WrongXid { want: xid, got });
    }
    let mtype = be32(body, 4);
    if mtype != MSG_REPLY {
        return Err(ReplyError::NotAReply { mtype });
    }
    if be32(body, 8) == MSG_DENIED {
        return Err(ReplyError::Denied { reject_stat: if body.len() >= 16 { be32(body, 12) } else { u32::MAX } });
    }
    // Accepted: verifier (flavor, opaque<400> padded to 4), then accept_stat.
    if body.len() < 20 {
        return Err(ReplyError::Truncated { len: body.len() });
    }
    let verf_len = be32(body, 16) as usize;
    let verf_padded = verf_len.checked_add(3).map(|n| n & !3).unwrap_or(usize::MAX);
    let at = 20usize.saturating_add(verf_padded);
    if body.len() < at.saturating_add(4) {
        return Err(ReplyError::Truncated { len: body.len() });
    }
    let accept_stat = be32(body, at);
    if accept_stat != 0 {
        return Err(ReplyError::NotAccepted { accept_stat });
    }
    // NULL returns void: nothing may follow accept_stat.
    let extra = body.len() - at - 4;
    if extra != 0 {
        return Err(ReplyError::Trailing { extra });
    }
    Ok(())
}

/// Read one record (all its fragments) into `buf`, returning its length.
/// Rejects records longer than `buf` before reading them.
pub fn read_record(s: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut len = 0usize;
    loop {
        let mut mark = [0u8; RECORD_MARK_BYTES];
        s.read_exact(&mut mark)?;
        let m = u32::from_be_bytes(mark);
        let frag = (m & !LAST_FRAGMENT) as usize;
        if len + frag > buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("record of at least {} bytes exceeds the {}-byte limit", len + frag, buf.len()),
            ));
        }
        s.read_exact(&mut buf[len..len + frag])?;
        len += frag;
        if m & LAST_FRAGMENT != 0 {
            return Ok(len);
        }
    }
}

/// Latency summary of one measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub calls: u64,
    pub elapsed_s: f64,
    pub calls_per_s: f64,
    pub rtt_us_mean: f64,
    pub rtt_us_p50: f64,
    pub rtt_us_p99: f64,
    pub rtt_us_p99_9: f64,
    pub rtt_us_max: f64,
}

/// Nearest-rank percentile (`p` in 0..=100) of sorted samples.
pub fn percentile(sorted_ns: &[u32], p: f64) -> u32 {
    assert!(!sorted_ns.is_empty(), "percentile of no samples");
    assert!((0.0..=100.0).contains(&p), "percentile {p} outside 0..=100");
    let rank = ((p / 100.0) * sorted_ns.len() as f64).ceil() as usize;
    sorted_ns[rank.clamp(1, sorted_ns.len()) - 1]
}

/// Summarise round-trip samples (nanoseconds) measured over `elapsed`.
pub fn summarize(samples_ns: &mut [u32], elapsed: Duration) -> Stats {
    assert!(!samples_ns.is_empty(), "no samples");
    samples_ns.sort_unstable();
    let sum: u64 = samples_ns.iter().map(|&n| n as u64).sum();
    let us = |ns: u32| ns as f64 / 1000.0;
    let calls = samples_ns.len() as u64;
    Stats {
        calls,
        elapsed_s: elapsed.as_secs_f64(),
        calls_per_s: calls as f64 / elapsed.as_secs_f64(),
        rtt_us_mean: sum as f64 / calls as f64 / 1000.0,
        rtt_us_p50: us(percentile(samples_ns, 50.0)),
        rtt_us_p99: us(percentile(samples_ns, 99.0)),
        rtt_us_p99_9: us(percentile(samples_ns, 99.9)),
        rtt_us_max: us(*samples_ns.last().unwrap()),
    }
}

impl Stats {
    pub fn to_json(&self) -> String {
        format!(
            "{{\"calls\":{},\"elapsed_s\":{:.6},\"calls_per_s\":{:.1},\"rtt_us_mean\":{:.3},\"rtt_us_p50\":{:.3},\
             \"rtt_us_p99\":{:.3},\"rtt_us_p99_9\":{:.3},\"rtt_us_max\":{:.3}}}",
            self.calls,
            self.elapsed_s,
            self.calls_per_s,
            self.rtt_us_mean,
            self.rtt_us_p50,
            self.rtt_us_p99,
            self.rtt_us_p99_9,
            self.rtt_us_max
        )
    }
}

pub(crate) fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, REPLY_TIMEOUT)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot connect to {addr}: {e}")))?;
    // One small message per round trip: Nagle would add delay, not batching.
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(REPLY_TIMEOUT))?;
    s.set_write_timeout(Some(REPLY_TIMEOUT))?;
    Ok(s)
}

pub(crate) fn timeout_context(e: io::Error, addr: SocketAddr, what: &str) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, format!("{addr}: no {what} within {REPLY_TIMEOUT:?}"))
        }
        io::ErrorKind::UnexpectedEof => io::Error::new(e.kind(), format!("{addr}: server closed the connection")),
        _ => io::Error::new(e.kind(), format!("{addr}: {e}")),
    }
}

/// A client connection measuring round trips of one kind.
pub trait RoundTrip {
    fn round_trip(&mut self, seq: u32) -> io::Result<()>;
}

/// NULL calls against an ONC RPC server.
pub struct NullClient {
    stream: TcpStream,
    addr: SocketAddr,
    prog: u32,
    vers: u32,
    call: [u8; RECORD_MARK_BYTES + NULL_CALL_BYTES],
    reply: Box<[u8; REPLY_BYTES_MAX]>,
}

impl NullClient {
    pub fn connect(addr: SocketAddr, prog: u32, vers: u32) -> io::Result<Self> {
        Ok(NullClient {
            stream: connect(addr)?,
            addr,
            prog,
            vers,
            call: [0; RECORD_MARK_BYTES + NULL_CALL_BYTES],
            reply: Box::new([0; REPLY_BYTES_MAX]),
        })
    }
}

impl RoundTrip for NullClient {
    fn round_trip(&mut self, xid: u32) -> io::Result<()> {
        encode_null_call(&mut self.call, xid, self.prog, self.vers);
        self.stream.write_all(&self.call).map_err(|e| timeout_context(e, self.addr, "write"))?;
        let n = read_record(&mut self.stream, &mut self.reply[..]).map_err(|e| timeout_context(e, self.addr, "reply"))?;
        check_null_reply(&self.reply[..n], xid)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", self.addr)))
    }
}

/// The raw TCP path: send the bytes of a call, receive the bytes of its
/// reply, with no RPC processing on either side. By default a NULL call and
/// reply; `with_message` sends any call (a READ's) and expects a reply of
/// the given size from an echo server started with the same sizes.
pub struct EchoClient {
    stream: TcpStream,
    addr: SocketAddr,
    call: Vec<u8>,
    reply: Vec<u8>,
}

impl EchoClient {
    pub fn connect(addr: SocketAddr) -> io::Result<Self> {
        let mut call = [0u8; RECORD_MARK_BYTES + NULL_CALL_BYTES];
        encode_null_call(&mut call, 0, NFS_PROGRAM, NFS_V3);
        Self::with_message(addr, call.to_vec(), RECORD_MARK_BYTES + NULL_REPLY_BYTES)
    }

    /// Send `call` (its bytes 4..8 replaced by the sequence number, where an
    /// RPC call has its xid) and read `reply_bytes` back.
    pub fn with_message(addr: SocketAddr, call: Vec<u8>, reply_bytes: usize) -> io::Result<Self> {
        assert!(call.len() >= 8 && reply_bytes >= 8, "echo messages carry a record mark and a sequence number");
        Ok(EchoClient { stream: connect(addr)?, addr, call, reply: vec![0u8; reply_bytes] })
    }
}

impl RoundTrip for EchoClient {
    fn round_trip(&mut self, seq: u32) -> io::Result<()> {
        // The same bytes the call carries, so the kernel path is identical.
        self.call[4..8].copy_from_slice(&seq.to_be_bytes());
        self.stream.write_all(&self.call).map_err(|e| timeout_context(e, self.addr, "write"))?;
        self.stream.read_exact(&mut self.reply).map_err(|e| timeout_context(e, self.addr, "echo"))?;
        // The echo server returns the call's xid first: proves the reply is ours.
        let got = be32(&self.reply, RECORD_MARK_BYTES);
        if got != seq {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("echo returned {got:#x}, sent {seq:#x}")));
        }
        Ok(())
    }
}

/// Round-trip samples (nanoseconds) of `calls` calls after `warmup`
/// unmeasured ones, and the wall time the measured calls took. Sequence
/// numbers (xids) start after `first_seq`.
pub fn sample(client: &mut dyn RoundTrip, warmup: u64, calls: u64, first_seq: u32) -> io::Result<(Vec<u32>, Duration)> {
    assert!((1..=CALLS_MAX).contains(&calls), "calls {calls} outside 1..={CALLS_MAX}");
    let mut seq = first_seq;
    for _ in 0..warmup {
        seq = seq.wrapping_add(1);
        client.round_trip(seq)?;
    }
    // Sized up front: no allocation inside the measured loop.
    let mut samples = Vec::with_capacity(calls as usize);
    let start = Instant::now();
    for _ in 0..calls {
        seq = seq.wrapping_add(1);
        let t0 = Instant::now();
        client.round_trip(seq)?;
        samples.push(u32::try_from(t0.elapsed().as_nanos()).unwrap_or(u32::MAX));
    }
    Ok((samples, start.elapsed()))
}

/// Measure `calls` round trips after `warmup` unmeasured ones.
pub fn measure(client: &mut dyn RoundTrip, warmup: u64, calls: u64, first_seq: u32) -> io::Result<Stats> {
    let (mut samples, elapsed) = sample(client, warmup, calls, first_seq)?;
    Ok(summarize(&mut samples, elapsed))
}

/// A minimal echo server: reads a call's worth of bytes, answers with a
/// reply's worth (a record mark, the call's xid, then zeros), one thread per
/// connection polling its socket while busy (`ECHO_SPIN`). The physical path
/// against which RPC is compared. `start` uses the sizes of a NULL call and
/// reply.
pub struct EchoServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    pub fn start(bind: SocketAddr) -> io::Result<Self> {
        Self::start_sized(bind, RECORD_MARK_BYTES + NULL_CALL_BYTES, RECORD_MARK_BYTES + NULL_REPLY_BYTES)
    }

    /// An echo server for calls of `call_bytes` and replies of
    /// `reply_bytes`, both counting the record mark.
    pub fn start_sized(bind: SocketAddr, call_bytes: usize, reply_bytes: usize) -> io::Result<Self> {
        if call_bytes < 8 || reply_bytes < 8 || call_bytes > ECHO_MESSAGE_MAX || reply_bytes > ECHO_MESSAGE_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("echo sizes {call_bytes}/{reply_bytes} outside 8..={ECHO_MESSAGE_MAX}"),
            ));
        }
        let listener = TcpListener::bind(bind)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new().name("echo-accept".into()).spawn(move || {
            let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for conn in listener.incoming() {
                if stop2.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                if active.load(Ordering::Acquire) >= ECHO_CONNS_MAX {
                    continue; // dropped: over the connection limit
                }
                active.fetch_add(1, Ordering::AcqRel);
                let active2 = active.clone();
                let _ = std::thread::Builder::new().name("echo-conn".into()).spawn(move || {
                    let _ = echo_conn(conn, call_bytes, reply_bytes);
                    active2.fetch_sub(1, Ordering::AcqRel);
                });
            }
        })?;
        Ok(EchoServer { addr, stop, thread: Some(thread) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long an echo connection polls for the next call before it blocks in
/// `read`: as the servers it is compared with do, it polls while busy, so the
/// echo pays no wake-up from an idle CPU (tens of microseconds on a quiet
/// virtual machine) that a busy-polling server would not pay either. Once
/// idle it blocks and costs nothing: `compare` keeps its echo connection open
/// while it measures the server, and an idle echo that woke up on a timer
/// (it once napped up to 1 ms at a time) put a thread on the two shared CPUs
/// a thousand times a second and added ~4 us (~20 %) to the server's p50.
pub const ECHO_SPIN: Duration = Duration::from_micros(50);

fn echo_conn(mut s: TcpStream, call_bytes: usize, reply_bytes: usize) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let mut call = vec![0u8; call_bytes];
    let mut reply = vec![0u8; reply_bytes];
    reply[..4].copy_from_slice(&(LAST_FRAGMENT | (reply_bytes - RECORD_MARK_BYTES) as u32).to_be_bytes());
    let mut last = Instant::now();
    // Set while the socket is in blocking mode (idle, waiting for a call).
    let mut blocking = false;
    loop {
        let mut got = 0;
        while got < call_bytes {
            match s.read(&mut call[got..]) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    got += n;
                    last = Instant::now();
                    if blocking {
                        s.set_nonblocking(true)?;
                        blocking = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if last.elapsed() < ECHO_SPIN {
                        std::hint::spin_loop();
                    } else {
                        // Idle: the next read blocks until bytes (or the close) come.
                        s.set_nonblocking(false)?;
                        blocking = true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        reply[4..8].copy_from_slice(&call[4..8]);
        let mut sent = 0;
        while sent < reply_bytes {
            match s.write(&reply[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                    std::hint::spin_loop()
                }
                Err(e) => return Err(e),
            }
        }
        last = Instant::now();
    }
}
