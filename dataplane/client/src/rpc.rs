//! ONC RPC (RFC 5531) over TCP (record marking) or over RDMA
//! (RPC-over-RDMA v1, `connect_rdma`: `rdma::requester`): xid matching,
//! AUTH_NONE / AUTH_SYS, many calls in flight on one connection.
//!
//! The core is non-blocking: `submit` encodes a call and queues it (sending
//! what the socket takes at once), `reap` drives the socket with poll(2) and
//! hands back completed calls in the order their replies arrive. `wait` and
//! `call` are the blocking API built on the same two steps. The fio engine
//! keeps iodepth calls submitted and reaps; the simple clients call.
//!
//! Memory is bounded: one scratch buffer of `call_bytes_max`, at most
//! `in_flight_max` calls queued (so at most that many calls of unsent
//! bytes), one reply record of at most `reply_bytes_max` being reassembled,
//! and completed replies only until the caller takes them.

use crate::error::{xdr, Error, Result};
use proto::xdr::{Decoder, Encoder};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Credentials sent with every call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    /// AUTH_SYS (RFC 5531 appendix A): at most 16 supplementary groups.
    Sys { machine: String, uid: u32, gid: u32, gids: Vec<u32> },
}

impl Auth {
    pub fn sys(uid: u32, gid: u32) -> Auth {
        Auth::Sys { machine: "chimera-client".into(), uid, gid, gids: Vec::new() }
    }
}

/// Bounds of one connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest call encoded (a 1 MiB WRITE plus headers fits).
    pub call_bytes_max: usize,
    /// Largest reply record accepted, all fragments together (a 1 MiB READ
    /// plus headers fits); a bigger record mark drops the connection before
    /// any of it is buffered.
    pub reply_bytes_max: usize,
    /// Calls submitted and not yet completed.
    pub in_flight_max: usize,
    /// Time from submit to reply before the call fails with `Timeout`.
    pub timeout: Duration,
    /// Time for the TCP connect.
    pub connect_timeout: Duration,
    /// Encoded calls waiting for the socket (the peer reads slower than we
    /// submit); a submit beyond it is refused with `SendQueueFull` rather
    /// than growing the queue. One call is always accepted into an empty
    /// queue.
    pub send_queue_bytes_max: usize,
}

/// Headers around a 1 MiB payload: RPC + COMPOUND framing with room to spare.
const HEADROOM_BYTES: usize = 64 << 10;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            call_bytes_max: (1 << 20) + HEADROOM_BYTES,
            reply_bytes_max: (1 << 20) + HEADROOM_BYTES,
            in_flight_max: 256,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            // Four 1 MiB WRITEs: enough to keep a link busy while the kernel's
            // socket buffer drains, small next to iodepth x block size.
            send_queue_bytes_max: 4 << 20,
        }
    }
}

/// Replies to timed-out calls remembered so a late reply is dropped rather
/// than treated as a stray xid; older ones are forgotten.
const ABANDONED_MAX: usize = 1024;
/// Hashes an xid (or any u32 key) with one multiplication: xids are ours,
/// never attacker-chosen, so SipHash's protection buys nothing on a path
/// that looks one up per call.
#[derive(Default, Clone, Copy)]
pub struct XidHasher(u64);

impl std::hash::Hasher for XidHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.0 = (x as u64 ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by xid.
pub type XidMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<XidHasher>>;

/// Bytes read from the socket per read(2). Larger is slower on loopback:
/// measured with fio and 1 MiB READs, 256 KiB per read(2) halved the rate.
/// A fragment longer than this is read into its record directly, a chunk
/// per read(2) (`receive_into_record`): with recycled record buffers that
/// took ~10 % off the client CPU per 1 MiB READ and left the rate as it was
/// (the slowdown once noted for reading records directly was not seen);
/// or, when its call has a sink, its data into the caller's buffer.
const READ_CHUNK_BYTES: usize = 64 << 10;
/// Receive chunks a connection keeps. A record that arrives whole in one
/// read(2) is not copied: its reply shares the chunk (`Bytes::Chunk`), so
/// the chunk is read into again only once every such reply is dropped or
/// recycled. With all of them still held, receives copy (the old way).
/// Bounds a connection's receive memory at this many chunks.
const CHUNKS_MAX: usize = 8;
/// Calls from the server (an NFSv4.1 back channel on this connection)
/// kept until taken; more are dropped (the server times them out).
pub const CALLS_MAX: usize = 16;
/// Largest call record from the server kept (a CB_COMPOUND of a recall is
/// well under 1 KiB); larger ones are dropped, so the kept calls hold at
/// most `CALLS_MAX` x this.
pub const CALL_BYTES_MAX: usize = 16 << 10;
/// Reply buffers handed back with `recycle` and kept for the next replies,
/// so a caller that recycles allocates nothing per call once warm: as many
/// as calls may be in flight (every reply of a full window can be out at
/// once), up to `SPARE_BYTES_MAX` of capacity together (sixteen 1 MiB
/// READ buffers; 4 KiB ones are far below it).
const SPARE_BUFFERS_MAX: usize = 256;
const SPARE_BYTES_MAX: usize = 16 * ((1 << 20) + HEADROOM_BYTES);

/// Where a call's reply data may be received directly (`set_sink`).
#[derive(Debug)]
struct Sink {
    /// The caller's buffer (an address: `RpcConn` stays `Send`).
    at: usize,
    cap: usize,
    /// In the reply's body (after the accepted-reply header): where the
    /// data starts and how long it is, once enough of it is in; None when
    /// the reply is not one to place (an error status, another shape).
    locate: fn(&[u8]) -> Option<(usize, usize)>,
}

/// A reply being received into its call's sink.
#[derive(Debug)]
struct Placing {
    xid: u32,
    /// Where the next byte goes; 0: the call is gone (timed out), the rest
    /// of the data is read and dropped.
    at: usize,
    left: usize,
    done: usize,
}

/// Bytes of a record that must be in before it is looked at for a sink
/// (RPC reply header and the start of the results).
const PLACE_HEADER_BYTES: usize = 256;

/// A successful reply: the whole record, results from `body()`.
#[derive(Debug)]
pub struct Reply {
    buf: Bytes,
    at: usize,
    /// Data bytes received straight into the call's sink (`set_sink`):
    /// they are not in the record, which holds the rest.
    placed: Option<usize>,
}

/// Where a record's bytes are.
#[derive(Debug)]
enum Bytes {
    /// A buffer of its own (assembled across receives, or from RDMA).
    Own(Vec<u8>),
    /// Bytes `range` of a receive chunk the record came in whole, shared
    /// with the other records of that receive (no copy).
    Chunk(Arc<Vec<u8>>, std::ops::Range<usize>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Own(v) => v,
            Bytes::Chunk(c, r) => &c[r.clone()],
        }
    }
}

impl Reply {
    /// The procedure's result bytes (after accept_stat SUCCESS).
    pub fn body(&self) -> &[u8] {
        &self.buf.as_slice()[self.at..]
    }

    /// Some(n): the reply's data (`n` bytes, where the sink's `locate`
    /// found them) went straight into the call's sink and is missing from
    /// `body()`, which ends where the data began.
    pub fn placed(&self) -> Option<usize> {
        self.placed
    }
}

/// A finished call.
#[derive(Debug)]
pub struct Completion {
    pub xid: u32,
    pub result: Result<Reply>,
}

struct Pending {
    proc_num: u32,
    deadline: Instant,
}

/// What carries the records.
enum Link {
    Tcp(TcpStream),
    /// Calls posted as they are submitted (nothing waits in `out`), replies
    /// and server calls taken from its completions.
    Rdma(Box<rdma::requester::Requester>),
}

/// The NFS program, whose NULL opens an RDMA connection.
const NFS_PROGRAM: u32 = 100_003;

/// Most calls in flight on an RDMA connection (each holds a registered
/// slot of the larger of the call and reply bounds).
pub const RDMA_SLOTS: usize = 32;

/// One connection (TCP or RDMA) carrying RPC calls.
pub struct RpcConn {
    link: Link,
    peer: String,
    limits: Limits,
    cred: Vec<u8>,
    next_xid: u32,
    scratch: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    /// Receive chunks (at most `CHUNKS_MAX`); `chunk_at` is the one read
    /// into last. `copy_chunk` is read into when every chunk is still shared.
    chunks: Vec<Arc<Vec<u8>>>,
    chunk_at: usize,
    copy_chunk: Vec<u8>,
    /// Replies completed in place in a receive chunk (no copy).
    in_place: u64,
    /// Where replies' data may go directly (`set_sink`), by xid.
    sinks: XidMap<Sink>,
    /// The reply whose data is being received into its sink now.
    placing: Option<Placing>,
    /// Whether the record being assembled was looked at for a sink.
    place_checked: bool,
    /// Data bytes the record being assembled put in its sink.
    placed: Option<usize>,
    /// Replies whose data went straight into a sink.
    placed_records: u64,
    mark: [u8; 4],
    mark_have: usize,
    frag_left: usize,
    in_frag: bool,
    last_frag: bool,
    rec: Vec<u8>,
    spare: Vec<Vec<u8>>,
    /// Capacity of the buffers in `spare`.
    spare_bytes: usize,
    /// Calls wait in `out` for `send_queued` (or the next poll) instead of
    /// being sent by `submit`.
    corked: bool,
    pending: XidMap<Pending>,
    /// No call in flight has a deadline before this (a lower bound: calls
    /// only get later deadlines, and completions only raise the minimum);
    /// `expire` scans only once it has passed.
    oldest: Option<Instant>,
    abandoned: VecDeque<u32>,
    abandoned_set: HashSet<u32>,
    done: VecDeque<Completion>,
    broken: Option<Error>,
    /// Records of calls the server made on this connection (`accept_calls`).
    calls: VecDeque<Vec<u8>>,
    accept_calls: bool,
    calls_dropped: u64,
    /// Records an RDMA poll took, on their way to `complete`.
    recs: Vec<Vec<u8>>,
}

fn encode_cred(auth: &Auth) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; 512];
    let mut e = Encoder::new(&mut buf);
    (|| -> proto::xdr::Result<()> {
        match auth {
            Auth::None => {
                e.u32(0)?;
                e.u32(0)?;
            }
            Auth::Sys { machine, uid, gid, gids } => {
                e.u32(1)?;
                let len_at = e.reserve(4)?;
                let start = e.position();
                e.u32(0)?; // stamp
                e.opaque_var(machine.as_bytes())?;
                e.u32(*uid)?;
                e.u32(*gid)?;
                e.u32(gids.len() as u32)?;
                for g in gids {
                    e.u32(*g)?;
                }
                let l = e.position() - start;
                e.patch_u32(len_at, l as u32);
            }
        }
        e.u32(0)?; // verifier: AUTH_NONE
        e.u32(0)
    })()
    .map_err(xdr)?;
    if let Auth::Sys { machine, gids, .. } = auth {
        if machine.len() > 255 || gids.len() > 16 {
            return Err(Error::Invalid("AUTH_SYS: machine name over 255 bytes or over 16 groups".into()));
        }
    }
    let n = e.position();
    buf.truncate(n);
    Ok(buf)
}

fn accept_name(code: u32) -> &'static str {
    match code {
        1 => "PROG_UNAVAIL",
        2 => "PROG_MISMATCH",
        3 => "PROC_UNAVAIL",
        4 => "GARBAGE_ARGS",
        5 => "SYSTEM_ERR",
        _ => "accept_stat unknown",
    }
}

fn auth_name(code: u32) -> &'static str {
    match code {
        0 => "AUTH_OK",
        1 => "AUTH_BADCRED",
        2 => "AUTH_REJECTEDCRED",
        3 => "AUTH_BADVERF",
        4 => "AUTH_REJECTEDVERF",
        5 => "AUTH_TOOWEAK",
        6 => "AUTH_INVALIDRESP",
        7 => "AUTH_FAILED",
        _ => "auth_stat unknown",
    }
}

/// Decode the reply header of `rec` (xid already read): Ok(result offset)
/// or the RPC-level error it carries.
/// One recv(2) of at most `want` bytes into `to` on socket `fd`: the bytes
/// read, or None when none are there now (retried when interrupted); a
/// closed connection is `Closed`.
///
/// # Safety
/// `to` must be valid for writes of `want` bytes.
unsafe fn recv_at(fd: std::os::fd::RawFd, to: *mut u8, want: usize) -> Result<Option<usize>> {
    loop {
        // SAFETY: the caller's contract.
        let n = unsafe { libc::recv(fd, to.cast(), want, 0) };
        if n > 0 {
            return Ok(Some(n as usize));
        }
        if n == 0 {
            return Err(Error::Closed);
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            ErrorKind::WouldBlock => return Ok(None),
            ErrorKind::Interrupted => {}
            _ => return Err(Error::ConnectionLost(format!("receive: {e}"))),
        }
    }
}

fn reply_header(d: &mut Decoder<'_>) -> Result<()> {
    let mtype = d.u32().map_err(xdr)?;
    if mtype != 1 {
        return Err(Error::Malformed(format!("msg_type {mtype}, expected REPLY")));
    }
    match d.u32().map_err(xdr)? {
        0 => {
            let _flavor = d.u32().map_err(xdr)?;
            d.opaque_var(400).map_err(xdr)?;
            match d.u32().map_err(xdr)? {
                0 => Ok(()),
                2 => {
                    let low = d.u32().map_err(xdr)?;
                    let high = d.u32().map_err(xdr)?;
                    Err(Error::Accept { stat: accept_name(2), code: 2, low, high })
                }
                c => Err(Error::Accept { stat: accept_name(c), code: c, low: 0, high: 0 }),
            }
        }
        1 => match d.u32().map_err(xdr)? {
            0 => {
                let low = d.u32().map_err(xdr)?;
                let high = d.u32().map_err(xdr)?;
                Err(Error::RpcMismatch { low, high })
            }
            1 => {
                let c = d.u32().map_err(xdr)?;
                Err(Error::AuthError { stat: auth_name(c), code: c })
            }
            r => Err(Error::Malformed(format!("reject_stat {r}"))),
        },
        s => Err(Error::Malformed(format!("reply_stat {s}"))),
    }
}

/// send(2) with MSG_NOSIGNAL: a peer that closed must not raise SIGPIPE,
/// which kills a host program that did not ignore it (fio loads the engine
/// built on this crate; Rust binaries ignore SIGPIPE, C programs do not).
/// A recycled reply buffer (empty), if one is kept.
fn take_spare(spare: &mut Vec<Vec<u8>>, spare_bytes: &mut usize) -> Option<Vec<u8>> {
    let mut b = spare.pop()?;
    *spare_bytes -= b.capacity();
    b.clear();
    Some(b)
}

fn send_nosignal(sock: &TcpStream, buf: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes for the duration of the call.
    let n = unsafe { libc::send(sock.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

impl RpcConn {
    /// Connect to `addr` ("host:port").
    pub fn connect(addr: &str, auth: &Auth, limits: Limits) -> Result<RpcConn> {
        let conn_err = |reason: String| Error::Connect { addr: addr.to_string(), reason };
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs().map_err(|e| conn_err(e.to_string()))?.collect();
        let mut last = "no address".to_string();
        for a in &addrs {
            match TcpStream::connect_timeout(a, limits.connect_timeout) {
                Ok(s) => return RpcConn::from_stream(s, auth, limits),
                Err(e) => last = format!("{a}: {e}"),
            }
        }
        Err(conn_err(last))
    }

    /// Wrap a connected stream (tests hand in hostile peers this way).
    pub fn from_stream(sock: TcpStream, auth: &Auth, limits: Limits) -> Result<RpcConn> {
        let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        sock.set_nodelay(true).ok();
        sock.set_nonblocking(true).map_err(|e| Error::ConnectionLost(format!("nonblocking: {e}")))?;
        Ok(RpcConn::over(Link::Tcp(sock), peer, auth, limits)?)
    }

    /// Connect to `addr` ("host:port", an RPC-over-RDMA listener such as
    /// chimerad's `rdma_port`, 20049) over RDMA (rdma-core loaded at run
    /// time). At most `RDMA_SLOTS` calls in flight (fewer when the server
    /// grants fewer credits); registered memory of that many slots of the
    /// larger of `call_bytes_max` and `reply_bytes_max`. A call that times
    /// out fails the whole connection: its slot could still receive the
    /// late reply, so it is never reused.
    pub fn connect_rdma(addr: &str, auth: &Auth, limits: Limits) -> Result<RpcConn> {
        let conn_err = |reason: String| Error::Connect { addr: addr.to_string(), reason };
        let sa = addr.to_socket_addrs().map_err(|e| conn_err(e.to_string()))?.next().ok_or_else(|| conn_err("no address".into()))?;
        let slots = limits.in_flight_max.min(RDMA_SLOTS);
        let r = rdma::requester::Requester::connect(sa, limits.connect_timeout, slots, limits.call_bytes_max.max(limits.reply_bytes_max))
            .map_err(|e| conn_err(format!("over RDMA: {e}")))?;
        let mut c = RpcConn::over(Link::Rdma(Box::new(r)), format!("{sa} (rdma)"), auth, limits)?;
        // The server's credit grant comes with its first reply (until then
        // one call may be in flight): a NULL learns it, so callers that
        // queue several calls at once never meet the initial limit. Any
        // RPC-level answer (a server without NFSv3 answers PROG_MISMATCH)
        // carries the grant.
        match c.call(NFS_PROGRAM, 3, 0, &|_| Ok(())) {
            Ok(r) => c.recycle(r),
            Err(e @ (Error::ConnectionLost(_) | Error::Closed | Error::Timeout { .. })) => return Err(conn_err(format!("over RDMA: the first call (NULL): {e}"))),
            Err(_) => {}
        }
        Ok(c)
    }

    /// Whether the connection runs over RDMA.
    pub fn is_rdma(&self) -> bool {
        matches!(self.link, Link::Rdma(_))
    }

    /// An RDMA connection's counters (inline calls and replies, Read and
    /// Reply chunks, back-channel calls).
    pub fn rdma_counters(&self) -> Option<rdma::requester::Counters> {
        match &self.link {
            Link::Rdma(r) => Some(r.counters),
            Link::Tcp(_) => None,
        }
    }

    fn over(link: Link, peer: String, auth: &Auth, limits: Limits) -> Result<RpcConn> {
        // Start xids from the clock so two connections of one client, or one
        // after a reconnect, do not reuse each other's numbers.
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(1);
        Ok(RpcConn {
            link,
            peer,
            limits,
            cred: encode_cred(auth)?,
            next_xid: seed | 1,
            scratch: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            chunks: Vec::new(),
            chunk_at: 0,
            copy_chunk: Vec::new(),
            in_place: 0,
            sinks: XidMap::default(),
            placing: None,
            place_checked: false,
            placed: None,
            placed_records: 0,
            mark: [0; 4],
            mark_have: 0,
            frag_left: 0,
            in_frag: false,
            last_frag: false,
            rec: Vec::new(),
            spare: Vec::new(),
            spare_bytes: 0,
            corked: false,
            pending: XidMap::default(),
            oldest: None,
            abandoned: VecDeque::new(),
            abandoned_set: HashSet::new(),
            done: VecDeque::new(),
            broken: None,
            calls: VecDeque::new(),
            accept_calls: false,
            calls_dropped: 0,
            recs: Vec::new(),
        })
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Calls submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Whether a call carrying `payload` bytes would be taken now: fewer
    /// calls in flight than the bound and room in the send queue (counting
    /// a generous header), judged after sending what the socket takes. A
    /// caller that gets `false` reaps first instead of failing the call
    /// with `SendQueueFull` / `TooManyInFlight`.
    pub fn has_room(&mut self, payload: usize) -> bool {
        const HEADER_BYTES_MAX: usize = 1024;
        if self.pending.len() >= self.limits.in_flight_max {
            return false;
        }
        if let Link::Rdma(r) = &self.link {
            return r.has_room();
        }
        let fits = |c: &Self| {
            let queued = c.out.len() - c.out_pos;
            queued == 0 || queued + payload + HEADER_BYTES_MAX <= c.limits.send_queue_bytes_max
        };
        if fits(self) {
            return true;
        }
        self.send_queued();
        fits(self)
    }

    /// Let the reply to call `xid` put its data straight into `cap` bytes at
    /// `buf` instead of into its record, when it arrives over TCP as a
    /// fragment longer than a receive chunk and `locate` finds data that
    /// fits (`Reply::placed` then says how much; otherwise nothing is
    /// written there and the reply holds its data as usual). Dropped when
    /// the call completes, times out or fails.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `cap` bytes, and not read or
    /// written by anything else, until the call's completion is handed out.
    pub unsafe fn set_sink(&mut self, xid: u32, buf: *mut u8, cap: usize, locate: fn(&[u8]) -> Option<(usize, usize)>) {
        if matches!(self.link, Link::Tcp(_)) && self.pending.contains_key(&xid) && !buf.is_null() {
            self.sinks.insert(xid, Sink { at: buf as usize, cap, locate });
        }
    }

    /// Replies whose data went straight into a sink (`set_sink`).
    pub fn placed_records(&self) -> u64 {
        self.placed_records
    }

    /// Records (replies and server calls) taken from a receive chunk in
    /// place, not copied (the rest were assembled by copying).
    pub fn in_place_records(&self) -> u64 {
        self.in_place
    }

    /// Calls completed and not yet taken (`on_ready` / `reap` hand them
    /// out; a blocking `wait` leaves the others here).
    pub fn completed(&self) -> usize {
        self.done.len()
    }

    /// The error that broke this connection, if it is broken.
    pub fn broken(&self) -> Option<&Error> {
        self.broken.as_ref()
    }

    /// The socket and the poll(2) events it waits for, for a caller that
    /// polls many connections at once (then `on_ready` with what came back).
    pub fn poll_fd(&self) -> libc::pollfd {
        let sock = match &self.link {
            Link::Tcp(s) => s,
            Link::Rdma(r) => return libc::pollfd { fd: r.fd(), events: libc::POLLIN, revents: 0 },
        };
        let mut events = libc::POLLIN;
        if self.out_pos < self.out.len() {
            events |= libc::POLLOUT;
        }
        libc::pollfd { fd: sock.as_raw_fd(), events, revents: 0 }
    }

    /// The earliest deadline of a call in flight (a caller polling many
    /// connections wakes by then so `on_ready` can time it out).
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.pending.is_empty() {
            None
        } else {
            self.oldest
        }
    }

    /// Act on the `revents` poll(2) reported for `poll_fd` (0: only time
    /// calls out), then move completed calls into `out`; returns how many.
    pub fn on_ready(&mut self, revents: i16, out: &mut Vec<Completion>) -> usize {
        if self.broken.is_none() {
            self.service(revents);
        }
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }

    /// Keep the calls the server makes on this connection (an NFSv4.1
    /// back channel bound to it) for `take_call`, up to `CALLS_MAX`; off,
    /// they are dropped. Either way they never fail the connection.
    pub fn accept_calls(&mut self, on: bool) {
        self.accept_calls = on;
        if !on {
            self.calls.clear();
        }
    }

    /// The next call the server made (its whole record: xid, CALL, ...),
    /// oldest first. Received while waiting for replies, or by `on_ready`.
    pub fn take_call(&mut self) -> Option<Vec<u8>> {
        self.calls.pop_front()
    }

    /// Calls from the server dropped (not accepted, or over `CALLS_MAX`).
    pub fn calls_dropped(&self) -> u64 {
        self.calls_dropped
    }

    /// Queue the REPLY `msg` (xid first) to a call the server made, as one
    /// record, and send it now as far as the socket takes it.
    pub fn send_reply(&mut self, msg: &[u8]) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if let Link::Rdma(r) = &mut self.link {
            let xid = msg.get(..4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            return r.reply(xid, msg).map_err(Error::ConnectionLost);
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
        self.out.extend_from_slice(&(0x8000_0000 | msg.len() as u32).to_be_bytes());
        self.out.extend_from_slice(msg);
        if let Err(err) = self.flush() {
            self.fail(err.clone());
            return Err(err);
        }
        Ok(())
    }

    /// Corked, `submit` only queues: calls leave together at the next
    /// `send_queued`, `reap`, `wait` or `on_ready` — one send for a batch,
    /// which the server then reads with one receive.
    pub fn set_corked(&mut self, corked: bool) {
        self.corked = corked;
    }

    /// Send what is queued, as far as the socket takes it now (the rest
    /// goes when the socket polls writable).
    pub fn send_queued(&mut self) {
        if self.broken.is_none() && self.out_pos < self.out.len() {
            if let Err(err) = self.flush() {
                self.fail(err);
            }
        }
    }

    /// Give a reply's buffer back for the next replies (bounded: at most
    /// `SPARE_BUFFERS_MAX` kept and `SPARE_BYTES_MAX` of capacity, none
    /// larger than the reply bound).
    pub fn recycle(&mut self, reply: Reply) {
        // A reply in a receive chunk frees its share of the chunk.
        let Bytes::Own(buf) = reply.buf else { return };
        let cap = buf.capacity();
        if self.spare.len() < SPARE_BUFFERS_MAX.min(self.limits.in_flight_max.max(16))
            && cap <= self.limits.reply_bytes_max
            && self.spare_bytes + cap <= SPARE_BYTES_MAX
        {
            self.spare_bytes += cap;
            self.spare.push(buf);
        }
    }

    /// Replace the credentials of later calls.
    pub fn set_auth(&mut self, auth: &Auth) -> Result<()> {
        self.cred = encode_cred(auth)?;
        Ok(())
    }

    /// Encode and queue one call; returns its xid. `args` writes the
    /// procedure's arguments.
    pub fn submit(
        &mut self,
        prog: u32,
        vers: u32,
        proc_num: u32,
        args: &dyn Fn(&mut Encoder<'_>) -> proto::xdr::Result<()>,
    ) -> Result<u32> {
        self.submit_with(prog, vers, proc_num, args, None)
    }

    /// `submit` for a call whose last argument is a variable-length opaque
    /// (a WRITE's data): `args` writes the arguments before it, and
    /// `payload` goes (length, bytes, XDR pad) straight into the send queue
    /// — the data is copied once, not encoded and then copied again.
    pub fn submit_payload(
        &mut self,
        prog: u32,
        vers: u32,
        proc_num: u32,
        args: &dyn Fn(&mut Encoder<'_>) -> proto::xdr::Result<()>,
        payload: &[u8],
    ) -> Result<u32> {
        self.submit_with(prog, vers, proc_num, args, Some(payload))
    }

    fn submit_with(
        &mut self,
        prog: u32,
        vers: u32,
        proc_num: u32,
        args: &dyn Fn(&mut Encoder<'_>) -> proto::xdr::Result<()>,
        payload: Option<&[u8]>,
    ) -> Result<u32> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if self.pending.len() >= self.limits.in_flight_max {
            return Err(Error::TooManyInFlight { max: self.limits.in_flight_max });
        }
        if self.scratch.len() < self.limits.call_bytes_max {
            self.scratch.resize(self.limits.call_bytes_max, 0);
        }
        let mut xid = self.next_xid;
        while self.pending.contains_key(&xid) || self.abandoned_set.contains(&xid) {
            xid = xid.wrapping_add(1);
        }
        self.next_xid = xid.wrapping_add(1);
        let max = self.limits.call_bytes_max;
        let mut e = Encoder::new(&mut self.scratch[..max]);
        let cred = &self.cred;
        let r = (|| -> proto::xdr::Result<()> {
            e.u32(0)?; // record mark, patched below
            for w in [xid, 0, 2, prog, vers, proc_num] {
                e.u32(w)?;
            }
            e.opaque_fixed(cred)?;
            args(&mut e)
        })();
        if let Err(err) = r {
            return Err(match err {
                proto::xdr::XdrError::Overflow { .. } => Error::CallTooLarge { max },
                other => Error::Invalid(format!("encoding the call: {other:?}")),
            });
        }
        let head = e.position();
        let pad = payload.map_or(0, |p| (4 - p.len() % 4) % 4);
        let n = head + payload.map_or(0, |p| 4 + p.len() + pad);
        if n > max {
            return Err(Error::CallTooLarge { max });
        }
        e.patch_u32(0, 0x8000_0000 | (n as u32 - 4));
        if let Link::Rdma(r) = &mut self.link {
            if !r.has_room() {
                if let Some(why) = r.closed() {
                    let err = Error::ConnectionLost(why.to_string());
                    self.fail(err.clone());
                    return Err(err);
                }
                return Err(Error::TooManyInFlight { max: r.in_flight().1 });
            }
            let p = payload.unwrap_or(&[]);
            let len = (p.len() as u32).to_be_bytes();
            let parts: [&[u8]; 4] = if payload.is_some() { [&self.scratch[4..head], &len, p, &[0u8; 3][..pad]] } else { [&self.scratch[4..head], &[], &[], &[]] };
            if let Err(why) = r.call(xid, &parts) {
                let err = Error::ConnectionLost(why);
                self.fail(err.clone());
                return Err(err);
            }
            self.track(xid, proc_num);
            return Ok(xid);
        }
        let queued = self.out.len() - self.out_pos;
        if queued > 0 && queued + n > self.limits.send_queue_bytes_max {
            // Give the socket a chance first; refuse only if still full.
            if let Err(err) = self.flush() {
                self.fail(err.clone());
                return Err(err);
            }
            let queued = self.out.len() - self.out_pos;
            if queued > 0 && queued + n > self.limits.send_queue_bytes_max {
                return Err(Error::SendQueueFull { queued, max: self.limits.send_queue_bytes_max });
            }
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
        self.out.extend_from_slice(&self.scratch[..head]);
        if let Some(p) = payload {
            self.out.extend_from_slice(&(p.len() as u32).to_be_bytes());
            self.out.extend_from_slice(p);
            self.out.extend_from_slice(&[0u8; 3][..pad]);
        }
        self.track(xid, proc_num);
        // Send now if the socket takes it: a call waits for no reap (unless
        // corked: the caller sends a batch with `send_queued`).
        if !self.corked {
            if let Err(err) = self.flush() {
                self.fail(err);
            }
        }
        Ok(xid)
    }

    /// Call `xid` is on its way: keep it until its reply or its deadline.
    fn track(&mut self, xid: u32, proc_num: u32) {
        let deadline = Instant::now() + self.limits.timeout;
        self.pending.insert(xid, Pending { proc_num, deadline });
        if self.oldest.is_none() {
            self.oldest = Some(deadline);
        }
    }

    /// Drive the socket for up to `wait` (zero: only what is ready now) and
    /// move completed calls into `out`. Returns how many were added.
    pub fn reap(&mut self, out: &mut Vec<Completion>, wait: Duration) -> usize {
        if self.done.is_empty() {
            self.progress(Instant::now() + wait);
        }
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }

    /// Block until call `xid` completes (or its timeout passes). Other
    /// completions found meanwhile stay queued for `reap` / `wait`.
    pub fn wait(&mut self, xid: u32) -> Result<Reply> {
        loop {
            if let Some(i) = self.done.iter().position(|c| c.xid == xid) {
                return self.done.remove(i).expect("present").result;
            }
            let Some(p) = self.pending.get(&xid) else {
                return Err(Error::Invalid(format!("xid {xid:#x} is not in flight")));
            };
            let deadline = p.deadline;
            self.progress(deadline);
        }
    }

    /// Submit and wait: one blocking call.
    pub fn call(
        &mut self,
        prog: u32,
        vers: u32,
        proc_num: u32,
        args: &dyn Fn(&mut Encoder<'_>) -> proto::xdr::Result<()>,
    ) -> Result<Reply> {
        let xid = self.submit(prog, vers, proc_num, args)?;
        self.wait(xid)
    }

    fn flush(&mut self) -> Result<()> {
        let Link::Tcp(sock) = &self.link else { return Ok(()) };
        while self.out_pos < self.out.len() {
            match send_nosignal(sock, &self.out[self.out_pos..]) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::ConnectionLost(format!("send: {e}"))),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(())
    }

    /// Fail every call in flight with `err`; the connection is unusable.
    fn fail(&mut self, err: Error) {
        let mut xids: Vec<u32> = self.pending.keys().copied().collect();
        xids.sort_unstable();
        for xid in xids {
            self.pending.remove(&xid);
            self.done.push_back(Completion { xid, result: Err(err.clone()) });
        }
        self.out.clear();
        self.out_pos = 0;
        self.rec = Vec::new();
        self.sinks.clear();
        self.placing = None;
        self.place_checked = false;
        self.placed = None;
        if self.broken.is_none() {
            self.broken = Some(err);
        }
        match &mut self.link {
            Link::Tcp(sock) => {
                let _ = sock.shutdown(std::net::Shutdown::Both);
            }
            Link::Rdma(r) => r.close("the connection failed"),
        }
    }

    fn expire(&mut self, now: Instant) {
        match self.oldest {
            Some(o) if o <= now => {}
            _ => return,
        }
        self.oldest = self.pending.values().map(|p| p.deadline).filter(|d| *d > now).min();
        let mut late: Vec<(u32, u32)> =
            self.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(x, p)| (*x, p.proc_num)).collect();
        late.sort_unstable();
        if let (Link::Rdma(_), Some(&(xid, proc_num))) = (&self.link, late.first()) {
            // Its slot may still receive the reply: fail the connection.
            self.fail(Error::Timeout { xid, proc_num, after: self.limits.timeout });
            return;
        }
        for (xid, proc_num) in late {
            self.pending.remove(&xid);
            // Its buffer goes back to the caller with the error: nothing
            // more of a late reply may land in it.
            self.sinks.remove(&xid);
            if let Some(p) = self.placing.as_mut().filter(|p| p.xid == xid) {
                p.at = 0;
            }
            if self.abandoned.len() == ABANDONED_MAX {
                if let Some(old) = self.abandoned.pop_front() {
                    self.abandoned_set.remove(&old);
                }
            }
            self.abandoned.push_back(xid);
            self.abandoned_set.insert(xid);
            self.done.push_back(Completion { xid, result: Err(Error::Timeout { xid, proc_num, after: self.limits.timeout }) });
        }
    }

    /// One round of I/O: wait until the socket is ready, `until` passes or
    /// a call's deadline passes; send, receive, complete, expire.
    fn progress(&mut self, until: Instant) {
        if self.broken.is_some() {
            return;
        }
        if self.is_rdma() {
            // Take what completed already (and arm the completion channel).
            self.service(0);
            if !self.done.is_empty() || self.broken.is_some() {
                return;
            }
        }
        let now = Instant::now();
        let until = self.next_deadline().map_or(until, |d| d.min(until));
        let wait_ms = until.saturating_duration_since(now).as_millis().min(i32::MAX as u128) as i32;
        let mut pfd = self.poll_fd();
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                self.fail(Error::ConnectionLost(format!("poll: {e}")));
            }
            return;
        }
        self.service(if r > 0 { pfd.revents } else { 0 });
    }

    /// Send, receive and complete what `revents` allows; expire late calls.
    fn service(&mut self, revents: i16) {
        if let Link::Rdma(r) = &mut self.link {
            let mut recs = std::mem::take(&mut self.recs);
            let spare = &mut self.spare;
            let spare_bytes = &mut self.spare_bytes;
            let max = self.limits.reply_bytes_max;
            let mut too_large = None;
            r.poll(&mut |body: &[u8]| {
                if body.len() > max {
                    too_large = Some(body.len());
                    return;
                }
                let mut b = take_spare(spare, spare_bytes).unwrap_or_default();
                b.extend_from_slice(body);
                recs.push(b);
            });
            let why = r.closed().map(str::to_string);
            let mut failed = None;
            for rec in recs.drain(..) {
                if failed.is_none() {
                    failed = self.complete(Bytes::Own(rec)).err();
                }
            }
            self.recs = recs;
            if let Some(e) = failed {
                self.fail(e);
                return;
            }
            if let Some(len) = too_large {
                self.fail(Error::ReplyTooLarge { len, max });
            } else if let Some(why) = why {
                if self.pending.is_empty() {
                    self.broken = Some(Error::ConnectionLost(why));
                } else {
                    self.fail(Error::ConnectionLost(why));
                }
            }
            self.expire(Instant::now());
            return;
        }
        if revents & libc::POLLOUT != 0 {
            if let Err(e) = self.flush() {
                self.fail(e);
                return;
            }
        }
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            if let Err(e) = self.receive() {
                self.fail(e);
                return;
            }
        }
        self.expire(Instant::now());
    }

    /// The receive chunk to read into next: one no reply shares any more
    /// (made on first use, up to `CHUNKS_MAX`), or None when all are shared.
    fn free_chunk(&mut self) -> Option<usize> {
        let n = self.chunks.len();
        for k in 0..n {
            let i = (self.chunk_at + k) % n;
            if Arc::strong_count(&self.chunks[i]) == 1 {
                return Some(i);
            }
        }
        if n < CHUNKS_MAX {
            self.chunks.push(Arc::new(vec![0; READ_CHUNK_BYTES]));
            return Some(n);
        }
        None
    }

    fn receive(&mut self) -> Result<()> {
        let r = loop {
            if self.in_frag && (self.placing.is_some() || self.frag_left >= READ_CHUNK_BYTES) {
                // Inside a fragment longer than a chunk (a large READ's
                // reply): its bytes go straight into the record, not
                // through a chunk and a copy.
                match self.receive_into_record() {
                    Ok(true) => continue,
                    Ok(false) => break Ok(()),
                    Err(e) => break Err(e),
                }
            }
            let slot = self.free_chunk();
            let Link::Tcp(sock) = &self.link else { break Ok(()) };
            let mut sock: &TcpStream = sock;
            let got = match slot {
                Some(i) => {
                    self.chunk_at = i;
                    sock.read(Arc::get_mut(&mut self.chunks[i]).expect("no reply shares a free chunk"))
                }
                None => {
                    self.copy_chunk.resize(READ_CHUNK_BYTES, 0);
                    sock.read(&mut self.copy_chunk)
                }
            };
            match got {
                Ok(0) => break Err(Error::Closed),
                Ok(n) => {
                    let fed = match slot {
                        Some(i) => {
                            let chunk = self.chunks[i].clone();
                            self.on_bytes(&chunk, 0..n)
                        }
                        None => {
                            let buf = std::mem::take(&mut self.copy_chunk);
                            let r = self.on_bytes_copied(&buf[..n]);
                            self.copy_chunk = buf;
                            r
                        }
                    };
                    if let Err(e) = fed {
                        break Err(e);
                    }
                    if n < READ_CHUNK_BYTES {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => break Err(Error::ConnectionLost(format!("receive: {e}"))),
            }
        };
        // A closed connection with nothing in flight is not an error yet:
        // the next submit reports it.
        if let Err(Error::Closed) = &r {
            if self.pending.is_empty() {
                self.broken = Some(Error::Closed);
                return Ok(());
            }
        }
        r
    }

    /// One read(2) of up to a chunk of the current fragment into the spare
    /// capacity of the record being assembled (`reserve`d when its mark
    /// was read). True: it filled what it asked for (read on).
    fn receive_into_record(&mut self) -> Result<bool> {
        if self.placing.is_none() && !self.place_checked {
            self.start_placing();
        }
        if self.placing.is_some() {
            return self.receive_into_sink();
        }
        let Link::Tcp(sock) = &self.link else { return Ok(false) };
        let want = self.frag_left.min(READ_CHUNK_BYTES);
        self.rec.reserve(want);
        let spare = self.rec.spare_capacity_mut();
        // SAFETY: `spare` has room for `want` bytes; recv(2) writes at most
        // that many, and only the `n` it reports are taken as initialised.
        let Some(n) = (unsafe { recv_at(sock.as_raw_fd(), spare.as_mut_ptr().cast(), want)? }) else { return Ok(false) };
        // SAFETY: recv(2) initialised these `n` bytes of the spare capacity.
        unsafe { self.rec.set_len(self.rec.len() + n) };
        self.frag_left -= n;
        if self.frag_left == 0 {
            self.end_fragment()?;
        }
        Ok(n == want)
    }

    /// Look at the record being assembled (enough of its start is in, its
    /// fragment is its last) for a sink of its call: when its data lies in
    /// this fragment and fits, the data bytes already in the record move to
    /// the sink, and the rest will be received there (`receive_into_sink`).
    fn start_placing(&mut self) {
        if self.rec.len() < PLACE_HEADER_BYTES.min(self.rec.len() + self.frag_left) {
            return; // not conclusive yet
        }
        self.place_checked = true;
        if !self.last_frag || self.rec.len() < 8 {
            return;
        }
        let xid = u32::from_be_bytes([self.rec[0], self.rec[1], self.rec[2], self.rec[3]]);
        let Some(sink) = self.sinks.get(&xid) else { return };
        let mut d = Decoder::new(&self.rec);
        if d.u32().is_err() || reply_header(&mut d).is_err() {
            return;
        }
        let body = d.position();
        let Some((off, len)) = (sink.locate)(&self.rec[body..]) else { return };
        let start = body + off;
        if start > self.rec.len() {
            return;
        }
        let have = self.rec.len() - start;
        if len > sink.cap || have > len || len - have > self.frag_left {
            return;
        }
        // SAFETY: `set_sink`'s contract: `cap` bytes at `at` are the
        // caller's buffer, writable, until the call completes; have <= cap.
        unsafe { std::ptr::copy_nonoverlapping(self.rec[start..].as_ptr(), sink.at as *mut u8, have) };
        self.rec.truncate(start);
        if len == have {
            self.placed = Some(have);
            self.placed_records += 1;
        } else {
            self.placing = Some(Placing { xid, at: sink.at + have, left: len - have, done: have });
        }
    }

    /// One read(2) of the data being placed, into its sink (or dropped when
    /// the call timed out meanwhile). True: it filled what it asked for.
    fn receive_into_sink(&mut self) -> Result<bool> {
        let Link::Tcp(sock) = &self.link else { return Ok(false) };
        let fd = sock.as_raw_fd();
        let p = self.placing.as_mut().expect("placing");
        let want = p.left.min(READ_CHUNK_BYTES);
        let to = if p.at == 0 {
            self.copy_chunk.resize(READ_CHUNK_BYTES, 0);
            self.copy_chunk.as_mut_ptr()
        } else {
            p.at as *mut u8
        };
        // SAFETY: `to` is the sink's next `left` bytes (`set_sink`'s
        // contract) or the scratch chunk; want <= both.
        let Some(n) = (unsafe { recv_at(fd, to, want)? }) else { return Ok(false) };
        if p.at != 0 {
            p.at += n;
        }
        p.left -= n;
        p.done += n;
        self.frag_left -= n;
        if p.left == 0 {
            let done = p.done;
            self.placing = None;
            self.placed = Some(done);
            self.placed_records += 1;
        }
        if self.frag_left == 0 {
            self.end_fragment()?;
        }
        Ok(n == want)
    }

    /// The current fragment is complete; a last fragment completes its call.
    fn end_fragment(&mut self) -> Result<()> {
        self.in_frag = false;
        if self.last_frag {
            self.place_checked = false;
            let rec = std::mem::take(&mut self.rec);
            self.complete(Bytes::Own(rec))?;
        }
        Ok(())
    }

    /// Feed bytes `range` of receive chunk `chunk` through record marking:
    /// a record that starts and ends in them is completed in place (its
    /// reply shares the chunk); one begun in an earlier receive, or not
    /// all here, is assembled by copying (`on_bytes_copied`).
    fn on_bytes(&mut self, chunk: &Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Result<()> {
        let mut at = range.start;
        while at < range.end {
            let avail = range.end - at;
            if !self.rec.is_empty() || self.in_frag || self.mark_have > 0 {
                // Finish the record being assembled; a record of several
                // fragments is copied to its end.
                let take = if self.mark_have > 0 {
                    (4 - self.mark_have).min(avail)
                } else if self.in_frag && self.last_frag {
                    self.frag_left.clamp(1, avail)
                } else {
                    avail
                };
                self.on_bytes_copied(&chunk[at..at + take])?;
                at += take;
                continue;
            }
            if avail < 4 {
                break;
            }
            let m = u32::from_be_bytes([chunk[at], chunk[at + 1], chunk[at + 2], chunk[at + 3]]);
            let len = (m & 0x7fff_ffff) as usize;
            if m & 0x8000_0000 == 0 || len > avail - 4 {
                break; // not the last fragment, or not all here: copied
            }
            if len > self.limits.reply_bytes_max {
                return Err(Error::ReplyTooLarge { len, max: self.limits.reply_bytes_max });
            }
            self.in_place += 1;
            self.complete(Bytes::Chunk(chunk.clone(), at + 4..at + 4 + len))?;
            at += 4 + len;
        }
        self.on_bytes_copied(&chunk[at..range.end])
    }

    /// Feed received bytes through record marking (RFC 5531 section 11),
    /// copying them into the record being assembled.
    fn on_bytes_copied(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            if !self.in_frag {
                let take = (4 - self.mark_have).min(data.len());
                self.mark[self.mark_have..self.mark_have + take].copy_from_slice(&data[..take]);
                self.mark_have += take;
                data = &data[take..];
                if self.mark_have < 4 {
                    break;
                }
                self.mark_have = 0;
                let m = u32::from_be_bytes(self.mark);
                let len = (m & 0x7fff_ffff) as usize;
                self.last_frag = m & 0x8000_0000 != 0;
                if self.rec.len() + len > self.limits.reply_bytes_max {
                    return Err(Error::ReplyTooLarge { len: self.rec.len() + len, max: self.limits.reply_bytes_max });
                }
                if self.rec.capacity() == 0 {
                    if let Some(b) = take_spare(&mut self.spare, &mut self.spare_bytes) {
                        self.rec = b;
                    }
                }
                self.rec.reserve(len);
                self.frag_left = len;
                self.in_frag = true;
            }
            let take = self.frag_left.min(data.len());
            self.rec.extend_from_slice(&data[..take]);
            self.frag_left -= take;
            data = &data[take..];
            if self.frag_left == 0 {
                self.end_fragment()?;
            }
        }
        Ok(())
    }

    fn complete(&mut self, rec: Bytes) -> Result<()> {
        let bytes = rec.as_slice();
        let mut d = Decoder::new(bytes);
        let xid = d.u32().map_err(|_| Error::ConnectionLost(format!("reply record of {} bytes has no xid", bytes.len())))?;
        if bytes.len() >= 8 && bytes[4..8] == [0, 0, 0, 0] {
            // msg_type CALL: the server calling back on this connection.
            if self.accept_calls && self.calls.len() < CALLS_MAX && bytes.len() <= CALL_BYTES_MAX {
                let call = match rec {
                    Bytes::Own(v) => v,
                    Bytes::Chunk(c, r) => c[r].to_vec(),
                };
                self.calls.push_back(call);
            } else {
                self.calls_dropped += 1;
            }
            return Ok(());
        }
        let placed = self.placed.take();
        self.sinks.remove(&xid);
        if self.pending.remove(&xid).is_none() {
            if self.abandoned_set.contains(&xid) {
                return Ok(()); // the late reply of a call that timed out
            }
            return Err(Error::UnexpectedXid(xid));
        }
        let result = match reply_header(&mut d) {
            Ok(()) => {
                let at = d.position();
                Ok(Reply { buf: rec, at, placed })
            }
            Err(e) => Err(e),
        };
        self.done.push_back(Completion { xid, result });
        Ok(())
    }
}
