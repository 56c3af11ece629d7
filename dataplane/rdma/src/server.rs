//! The RPC-over-RDMA v1 server, sharded: one shard per core. A shard owns
//! its connections, a connection manager event channel, and per RDMA device
//! a protection domain, a completion queue and large buffers; nothing on
//! the data path is shared between shards. In chimerad the shards run in
//! the TCP core loops (`Server::start_on_cores`: each is an
//! `rpc::poller::Poller` the core's loop polls beside its sockets, and a
//! sleeping loop wakes for the shard's epoll descriptor). `Server::start`
//! runs them on threads of their own instead ("chimera-rdma"), each
//! polling while busy and sleeping in epoll when idle.
//!
//! Shard 0 also holds the listener: a connection request it takes is
//! reserved against `conns_max` and goes to the shard with the fewest
//! connections — migrated to that shard's event channel
//! (`rdma_migrate_id`) and accepted there, so its queue pair, buffers and
//! later events belong to the shard that serves it. A connection's id
//! carries its shard in its low byte; back-channel records find their
//! shard by it.
//!
//! Memory is registered once per device or connection, never per call:
//! - per device, `large_buffers` buffers of the record limit (+64 KiB),
//!   registered at the device's first connection: a call's reply is built
//!   in one (READ data goes out of it with RDMA Writes), and a call whose
//!   payload arrives in a Read chunk is assembled in another (the payload
//!   lands there with RDMA Reads, already in place);
//! - per connection, `credits + BACKCHANNEL_RECVS` receive buffers and
//!   `2 * credits + BACKCHANNEL_RECVS` send buffers of the inline threshold.
//! A call that finds no free buffer waits in its connection's queue (the
//! receive buffer stays taken, so the client runs out of credits rather
//! than the server out of memory).
//!
//! A call whose backend must wait (a device read, a log flush, a remote
//! server) parks (`rpc::park`): its record and resume state are copied out
//! of the registered buffers, which go back at once, and the loop serves
//! other calls. The call keeps its credit. Its completion comes back
//! through the loop's eventfd; the call runs again (`Dispatcher::
//! resume`) with fresh buffers and its reply is sent as any other
//! (READ data still by RDMA Write into the call's Write chunk). Parked
//! calls are bounded by the dispatcher's per-core limits
//! (`parked_per_core_max`, `parked_bytes_per_core_max`): at the bound, a
//! received call waits in its connection's queue like one short of buffers.

use crate::mem::Region;
use crate::verbs::{self, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc, rdma_cm_event, rdma_cm_id, rdma_conn_param};
use crate::wire::{self, Header, Layout, Message, Private, Refused, Segment};
use rpc::backchannel::{CallSender, SendError};
use rpc::lend::Lender;
use rpc::park::{ParkSlot, Payload, Ticket};
use rpc::{ConnInfo, Dispatcher, Outcome};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connection ids of RDMA connections carry this bit (TCP ones never do),
/// so a back-channel record finds its transport.
pub const CONN_ID_BIT: u64 = 1 << 62;
/// Receives posted beyond the credits granted: NFSv4.1 back-channel
/// replies arrive on them.
pub const BACKCHANNEL_RECVS: u32 = 4;
/// Back-channel records waiting for the loop.
pub const OUTBOX_MAX: usize = 1024;
/// Completion queue entries per device (clamped to what the device allows).
const CQ_ENTRIES: i32 = 32767;

#[derive(Debug, Clone)]
pub struct Config {
    /// Where the connection manager listens (port 0: any; see `local_addr`).
    pub addr: SocketAddr,
    /// IP type of service of the connections (`common.rdmacm_tos`).
    pub tos: Option<u8>,
    /// Credits granted per connection (calls a client may have in flight).
    pub credits: u32,
    /// Inline threshold both ways (RFC 8797): receive buffer size, and the
    /// largest inline reply (also capped by what the client can receive).
    pub inline_bytes: u32,
    /// Open RDMA connections; more are rejected.
    pub conns_max: usize,
    /// Large (record-sized) registered buffers per device.
    pub large_buffers: usize,
    /// The metrics shard this loop records into (`rpc::metrics::set_core`).
    pub metrics_core: usize,
    /// How long the loop keeps polling after its last event before sleeping.
    pub poll_spin_us: u64,
    /// Shards `Server::start` runs on threads of their own
    /// (`start_on_cores` runs one per core instead).
    pub shards: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: "0.0.0.0:20049".parse().unwrap(),
            tos: None,
            credits: 32,
            inline_bytes: 4096,
            conns_max: 64,
            large_buffers: 16,
            metrics_core: 0,
            poll_spin_us: 20,
            shards: 1,
        }
    }
}

/// Transport counters (process-wide; `/metrics` renders them).
#[derive(Default)]
pub struct Stats {
    pub conns_accepted: AtomicU64,
    pub conns_rejected: AtomicU64,
    pub conns_closed: AtomicU64,
    pub calls: AtomicU64,
    pub recv_bytes: AtomicU64,
    pub send_bytes: AtomicU64,
    pub rdma_reads: AtomicU64,
    pub rdma_read_bytes: AtomicU64,
    pub rdma_writes: AtomicU64,
    pub rdma_write_bytes: AtomicU64,
    pub reply_chunks: AtomicU64,
    pub errors_sent: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub completion_errors: AtomicU64,
    pub backchannel_calls: AtomicU64,
    pub calls_parked: AtomicU64,
    pub sends_with_invalidate: AtomicU64,
    pub replies_not_invalidated: AtomicU64,
}

pub static STATS: Stats = Stats {
    conns_accepted: AtomicU64::new(0),
    conns_rejected: AtomicU64::new(0),
    conns_closed: AtomicU64::new(0),
    calls: AtomicU64::new(0),
    recv_bytes: AtomicU64::new(0),
    send_bytes: AtomicU64::new(0),
    rdma_reads: AtomicU64::new(0),
    rdma_read_bytes: AtomicU64::new(0),
    rdma_writes: AtomicU64::new(0),
    rdma_write_bytes: AtomicU64::new(0),
    reply_chunks: AtomicU64::new(0),
    errors_sent: AtomicU64::new(0),
    protocol_errors: AtomicU64::new(0),
    completion_errors: AtomicU64::new(0),
    backchannel_calls: AtomicU64::new(0),
    calls_parked: AtomicU64::new(0),
    sends_with_invalidate: AtomicU64::new(0),
    replies_not_invalidated: AtomicU64::new(0),
};

impl Stats {
    /// (metric suffix, help, value) for every counter.
    pub fn rows(&self) -> Vec<(&'static str, &'static str, u64)> {
        let v = |a: &AtomicU64| a.load(Relaxed);
        vec![
            ("connections_accepted_total", "RDMA connections accepted", v(&self.conns_accepted)),
            ("connections_rejected_total", "RDMA connection requests rejected (limit or no resources)", v(&self.conns_rejected)),
            ("connections_closed_total", "RDMA connections closed", v(&self.conns_closed)),
            ("calls_total", "RPC calls received over RDMA", v(&self.calls)),
            ("receive_bytes_total", "bytes received in RDMA Sends (headers and inline messages)", v(&self.recv_bytes)),
            ("send_bytes_total", "bytes sent in RDMA Sends (headers and inline replies)", v(&self.send_bytes)),
            ("rdma_reads_total", "RDMA Reads issued (Read chunk segments pulled)", v(&self.rdma_reads)),
            ("rdma_read_bytes_total", "bytes pulled with RDMA Read", v(&self.rdma_read_bytes)),
            ("rdma_writes_total", "RDMA Writes issued (Write and Reply chunk segments)", v(&self.rdma_writes)),
            ("rdma_write_bytes_total", "bytes pushed with RDMA Write", v(&self.rdma_write_bytes)),
            ("reply_chunks_total", "replies sent through the client's Reply chunk (RDMA_NOMSG)", v(&self.reply_chunks)),
            ("errors_sent_total", "RDMA_ERROR replies sent (ERR_VERS, ERR_CHUNK)", v(&self.errors_sent)),
            ("protocol_errors_total", "connections closed for a protocol violation", v(&self.protocol_errors)),
            ("completion_errors_total", "work completions with an error status", v(&self.completion_errors)),
            ("backchannel_calls_total", "server-initiated calls sent over RDMA", v(&self.backchannel_calls)),
            ("calls_parked_total", "RPC calls over RDMA that parked while their backend waited (the loop served others meanwhile)", v(&self.calls_parked)),
            ("sends_with_invalidate_total", "replies sent with Send With Invalidate (the client's registration for the call invalidated by the reply)", v(&self.sends_with_invalidate)),
            ("replies_not_invalidated_total", "replies to calls with chunks that could not invalidate the client's registration (its chunks name several handles)", v(&self.replies_not_invalidated)),
        ]
    }
}

/// Set once a server has started (`/metrics` renders the counters then).
pub static STARTED: AtomicBool = AtomicBool::new(false);

/// Open RDMA connections now (with those handed to a shard and not yet
/// accepted there: the reservation against `conns_max`).
pub static CONNS_OPEN: AtomicU64 = AtomicU64::new(0);

/// Per shard: connections open or on their way to it, connections it
/// accepted, and calls it received (`/metrics` renders the shards started).
pub static SHARD_OPEN: [AtomicU64; SHARDS_MAX] = [const { AtomicU64::new(0) }; SHARDS_MAX];
pub static SHARD_ACCEPTED: [AtomicU64; SHARDS_MAX] = [const { AtomicU64::new(0) }; SHARDS_MAX];
pub static SHARD_CALLS: [AtomicU64; SHARDS_MAX] = [const { AtomicU64::new(0) }; SHARDS_MAX];
/// Shards started (the first `SHARDS` entries of the arrays above).
pub static SHARDS: AtomicU64 = AtomicU64::new(0);
/// Shards at most (one per core loop; a connection id's low byte).
pub const SHARDS_MAX: usize = rpc::metrics::CORES_MAX;
/// How often a busy shard looks at its connection manager channel (a
/// sleeping one wakes for it at once).
const CM_POLL: Duration = Duration::from_millis(1);

/// One RDMA device's protection domain, completion queue and large buffers.
struct Device {
    verbs: *mut c_void,
    pd: *mut c_void,
    channel: *mut c_void,
    cq: *mut c_void,
    large: Region,
    large_free: Vec<u32>,
}

/// A call whose Read chunk is being pulled.
struct Pending {
    h: Header,
    input: u32,
    out: u32,
    send: u32,
    len: usize,
}

struct Conn {
    id: *mut rdma_cm_id,
    qp: *mut c_void,
    dev: usize,
    gen: u16,
    info: ConnInfo,
    small: Region,
    buf_bytes: usize,
    send_free: Vec<u32>,
    /// Per send buffer: the large buffer its RDMA Writes read from.
    send_hold: Vec<Option<u32>>,
    credits: u32,
    send_inline_max: usize,
    /// The client accepts Send With Invalidate (its private data said so).
    remote_invalidate: bool,
    /// Received messages waiting for buffers: (receive buffer, length).
    waiting: VecDeque<(u32, u32)>,
    reading: Vec<Pending>,
    /// Calls received whose replies are not posted yet.
    outstanding: u32,
    closing: bool,
}

const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_READ: u64 = 3;

fn wr_id(gen: u16, slot: usize, kind: u64, idx: u32) -> u64 {
    (gen as u64) << 48 | (slot as u64 & 0xffff) << 32 | kind << 24 | (idx as u64 & 0xff_ffff)
}

fn wr_parts(id: u64) -> (u16, usize, u64, u32) {
    ((id >> 48) as u16, (id >> 32 & 0xffff) as usize, id >> 24 & 0xff, (id & 0xff_ffff) as u32)
}

/// A call parked on a slow backend: what it needs to run again.
struct Parked {
    /// Its connection's slot and generation (it may close meanwhile).
    slot: usize,
    gen: u16,
    /// Who called: a call whose connection closed still runs to its reply
    /// (for the duplicate-request cache and NFSv4's session slot).
    info: ConnInfo,
    /// Its transport header (the chunks its reply uses).
    h: Header,
    record: Vec<u8>,
    state: Vec<u8>,
    started: Instant,
    /// The completion, once it arrived (outer `Some`).
    payload: Option<Option<Payload>>,
}

/// A completion for parked entry (index, generation).
type Completed = (usize, u32, Option<Payload>);

/// `rpc::park::ParkSlot` for one call of one RDMA connection.
struct Parker<'a> {
    table: &'a RefCell<rpc::park::Table<Parked>>,
    outbox: &'a Arc<Outbox>,
    slot: usize,
    gen: u16,
    info: ConnInfo,
    h: Header,
    /// A resumed call parking again: when it first arrived (its latency
    /// counts every wait).
    again: Option<Instant>,
}

impl ParkSlot for Parker<'_> {
    fn park(&self, record: &[u8], state: &[u8]) -> Option<Ticket> {
        let bytes = record.len() + state.len();
        let mut t = self.table.borrow_mut();
        if !t.has_room(bytes) {
            return None;
        }
        let p = Parked {
            slot: self.slot,
            gen: self.gen,
            info: self.info,
            h: self.h,
            record: record.to_vec(),
            state: state.to_vec(),
            started: self.again.unwrap_or_else(Instant::now),
            payload: None,
        };
        let (i, g) = t.insert(p, bytes);
        STATS.calls_parked.fetch_add(1, Relaxed);
        let ob = self.outbox.clone();
        Some(Ticket::new(move |payload| ob.complete((i, g, payload))))
    }
}

/// One shard's mail: back-channel records, completions of its parked
/// calls, connections handed to it, and the eventfd that wakes it.
struct Outbox {
    queue: Mutex<VecDeque<(u64, Vec<u8>)>>,
    /// Completions of parked calls (from any thread).
    done: Mutex<Vec<Completed>>,
    /// Connection requests migrated to this shard's event channel.
    handoff: Mutex<VecDeque<Handoff>>,
    /// This shard's connection manager event channel (a pointer).
    ch: usize,
    efd: libc::c_int,
    stop: AtomicBool,
    record_max: usize,
}

/// What a connection request asked for (copied out of its CM event, which
/// is acknowledged before the id moves to another shard).
#[derive(Clone, Copy)]
struct Request {
    private: [u8; 256],
    private_len: u8,
    responder_resources: u8,
    initiator_depth: u8,
}

impl Request {
    fn of(p: &rdma_conn_param) -> Request {
        let mut r = Request { private: [0; 256], private_len: 0, responder_resources: p.responder_resources, initiator_depth: p.initiator_depth };
        if !p.private_data.is_null() {
            let n = p.private_data_len as usize;
            r.private[..n].copy_from_slice(unsafe { std::slice::from_raw_parts(p.private_data as *const u8, n) });
            r.private_len = p.private_data_len;
        }
        r
    }

    fn private(&self) -> Option<&[u8]> {
        (self.private_len > 0).then(|| &self.private[..self.private_len as usize])
    }
}

struct Handoff {
    id: *mut rdma_cm_id,
    req: Request,
}
// The id is used by one shard at a time: the listener's until it is
// migrated and queued, the target's after.
unsafe impl Send for Handoff {}

impl Outbox {
    fn complete(&self, c: Completed) {
        self.done.lock().unwrap_or_else(|e| e.into_inner()).push(c);
        self.wake();
    }

    fn wake(&self) {
        // Fails only when the counter would overflow: a wake-up is pending.
        let one: u64 = 1;
        unsafe { libc::write(self.efd, &one as *const u64 as *const c_void, 8) };
    }
}

impl CallSender for Outbox {
    fn send(&self, conn_id: u64, record: Vec<u8>) -> Result<(), SendError> {
        if self.stop.load(Relaxed) {
            return Err(SendError::Stopped);
        }
        if conn_id & CONN_ID_BIT == 0 {
            return Err(SendError::NoConnection);
        }
        if record.len() > self.record_max {
            return Err(SendError::TooLarge);
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= OUTBOX_MAX {
            return Err(SendError::QueueFull);
        }
        q.push_back((conn_id, record));
        drop(q);
        self.wake();
        Ok(())
    }
}

/// Back-channel records to the shard a connection id names.
struct Router(Arc<[Arc<Outbox>]>);

impl CallSender for Router {
    fn send(&self, conn_id: u64, record: Vec<u8>) -> Result<(), SendError> {
        match self.0.get((conn_id & 0xff) as usize) {
            Some(o) => o.send(conn_id, record),
            None if self.0[0].stop.load(Relaxed) => Err(SendError::Stopped),
            None => Err(SendError::NoConnection),
        }
    }
}

/// A running RDMA server.
pub struct Server {
    threads: Vec<std::thread::JoinHandle<()>>,
    addr: SocketAddr,
    shards: Arc<[Arc<Outbox>]>,
    /// Shards running as core-loop pollers, and how many have torn down.
    attached: usize,
    finished: Arc<AtomicUsize>,
}

/// Registers shard `core` with the calling core loop (`Server::start_on_cores`).
pub type CoreAttach = Arc<dyn Fn(usize) + Send + Sync>;

/// Everything a shard's loop is built from, until its thread builds it.
struct Seed {
    cfg: Config,
    d: Arc<Dispatcher>,
    ch: *mut verbs::rdma_event_channel,
    listen_id: Option<*mut rdma_cm_id>,
    shard: usize,
    peers: Arc<[Arc<Outbox>]>,
    large_size: usize,
}
unsafe impl Send for Seed {}

impl Seed {
    /// The body of a shard's thread of its own: build the loop, run it.
    fn run_here(self) {
        rpc::metrics::set_core(self.cfg.metrics_core);
        let shard = self.shard;
        match Loop::new(self) {
            Ok(mut lp) => lp.run(),
            Err(e) => eprintln!("chimera-rdma: shard {shard}: {e}"),
        }
    }
}


impl Server {
    /// Open the connection manager, bind and listen on `cfg.addr`, and start
    /// `cfg.shards` shards on threads of their own. Errors name what is
    /// missing (rdma-core, an RDMA device on the address).
    pub fn start(cfg: Config, dispatcher: Arc<Dispatcher>) -> Result<Server, String> {
        let shards = cfg.shards;
        let (mut server, seeds) = Self::listen(cfg, dispatcher, shards)?;
        for seed in seeds {
            let name = if shards == 1 { "chimera-rdma".to_string() } else { format!("chimera-rdma-{}", seed.shard) };
            let t = std::thread::Builder::new()
                .name(name)
                .spawn(move || seed.run_here())
                .map_err(|e| format!("cannot start the RDMA loop: {e}"));
            match t {
                Ok(t) => server.threads.push(t),
                Err(e) => {
                    server.stop_and_join();
                    return Err(e);
                }
            }
        }
        Ok(server)
    }

    /// As `start`, with one shard per core loop: the returned hook, called
    /// on each core loop's thread with its index (`runtime::Config::
    /// on_core_start`), builds that core's shard there and registers it
    /// as the loop's poller. A thread that takes no pollers runs its shard
    /// on a thread of its own instead (logged).
    pub fn start_on_cores(cfg: Config, dispatcher: Arc<Dispatcher>, cores: usize) -> Result<(Server, CoreAttach), String> {
        let (mut server, seeds) = Self::listen(cfg, dispatcher, cores)?;
        server.attached = cores;
        let seeds: Mutex<Vec<Option<Seed>>> = Mutex::new(seeds.into_iter().map(Some).collect());
        let finished = server.finished.clone();
        let attach: CoreAttach = Arc::new(move |core| {
            let Some(seed) = seeds.lock().unwrap_or_else(|e| e.into_inner()).get_mut(core).and_then(|s| s.take()) else { return };
            if !rpc::poller::available() {
                eprintln!("chimera-rdma: shard {core}: not called on a core loop; it runs on a thread of its own");
                let finished = finished.clone();
                let _ = std::thread::Builder::new().name(format!("chimera-rdma-{core}")).spawn(move || {
                    seed.run_here();
                    finished.fetch_add(1, Relaxed);
                });
                return;
            }
            let lp = match Loop::new(seed) {
                Ok(lp) => lp,
                Err(e) => {
                    eprintln!("chimera-rdma: shard {core}: {e}");
                    finished.fetch_add(1, Relaxed);
                    return;
                }
            };
            let p = std::rc::Rc::new(RefCell::new(ShardPoller { lp, done: false, finished: finished.clone() }));
            if !rpc::poller::register(p.clone()) {
                eprintln!(
                    "chimera-rdma: shard {core}: its core loop holds {} pollers already; the shard is not served",
                    rpc::poller::POLLERS_PER_THREAD_MAX
                );
                p.borrow_mut().lp.teardown();
                finished.fetch_add(1, Relaxed);
            }
        });
        Ok((server, attach))
    }

    /// Bind and listen, and make one seed per shard (shard 0's holds the
    /// listener).
    fn listen(cfg: Config, dispatcher: Arc<Dispatcher>, shards: usize) -> Result<(Server, Vec<Seed>), String> {
        let l = verbs::lib()?;
        if cfg.credits == 0 || cfg.credits > 1024 || cfg.inline_bytes < 1024 || cfg.large_buffers == 0 || cfg.conns_max == 0 {
            return Err("rdma: credits must be 1..=1024, inline_bytes >= 1024, large_buffers and conns_max >= 1".into());
        }
        if shards == 0 || shards > SHARDS_MAX {
            return Err(format!("rdma: shards must be 1..={SHARDS_MAX}, got {shards}"));
        }
        let mut chans = Vec::new();
        let close_chans = |chans: &mut Vec<*mut verbs::rdma_event_channel>| {
            for ch in chans.drain(..) {
                unsafe { (l.destroy_event_channel)(ch) };
            }
        };
        for _ in 0..shards {
            let ch = unsafe { (l.create_event_channel)() };
            if ch.is_null() {
                let e = std::io::Error::last_os_error();
                close_chans(&mut chans);
                return Err(format!("cannot open the RDMA connection manager: {e} (load rdma_ucm and give the pod /dev/infiniband)"));
            }
            chans.push(ch);
        }
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        let ch0 = chans[0];
        let mut fail = |what: &str, id: *mut rdma_cm_id| {
            let e = std::io::Error::last_os_error();
            if !id.is_null() {
                unsafe { (l.destroy_id)(id) };
            }
            close_chans(&mut chans);
            format!("{what} {}: {e}", cfg.addr)
        };
        if unsafe { (l.create_id)(ch0, &mut id, std::ptr::null_mut(), verbs::RDMA_PS_TCP) } != 0 {
            return Err(fail("cannot create an RDMA CM id for", std::ptr::null_mut()));
        }
        if let Some(tos) = cfg.tos {
            let mut t = tos;
            if unsafe { (l.set_option)(id, verbs::RDMA_OPTION_ID, verbs::RDMA_OPTION_ID_TOS, &mut t as *mut u8 as *mut c_void, 1) } != 0 {
                return Err(fail("cannot set the type of service on", id));
            }
        }
        let (sa, _) = verbs::sockaddr(&cfg.addr);
        if unsafe { (l.bind_addr)(id, &sa as *const _ as *const libc::sockaddr) } != 0 {
            return Err(fail("cannot bind RDMA (is an RDMA device configured on this address?)", id));
        }
        if unsafe { (l.listen)(id, 128) } != 0 {
            return Err(fail("cannot listen for RDMA connections on", id));
        }
        let port = u16::from_be(unsafe { (l.get_src_port)(id) });
        let addr = SocketAddr::new(cfg.addr.ip(), port);
        STARTED.store(true, Relaxed);
        SHARDS.store(shards as u64, Relaxed);
        let limits = dispatcher.limits;
        let peers: Arc<[Arc<Outbox>]> = chans
            .iter()
            .map(|&ch| {
                Arc::new(Outbox {
                    queue: Mutex::new(VecDeque::new()),
                    done: Mutex::new(Vec::new()),
                    handoff: Mutex::new(VecDeque::new()),
                    ch: ch as usize,
                    efd: unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) },
                    stop: AtomicBool::new(false),
                    record_max: limits.reply_bytes_max,
                })
            })
            .collect();
        let large_size = (limits.record_bytes_max.max(limits.reply_bytes_max) + (64 << 10) + 4095) & !4095;
        // The large buffers of a device are split between the shards.
        let mut per_shard = cfg.clone();
        per_shard.large_buffers = cfg.large_buffers.div_ceil(shards);
        let seeds = chans
            .iter()
            .enumerate()
            .map(|(shard, &ch)| Seed {
                cfg: per_shard.clone(),
                d: dispatcher.clone(),
                ch,
                listen_id: (shard == 0).then_some(id),
                shard,
                peers: peers.clone(),
                large_size,
            })
            .collect();
        let server = Server { threads: Vec::new(), addr, shards: peers, attached: 0, finished: Arc::new(AtomicUsize::new(0)) };
        Ok((server, seeds))
    }

    /// The address actually listened on (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Back-channel calls on RDMA connections (conn ids with `CONN_ID_BIT`).
    pub fn sender(&self) -> Arc<dyn CallSender> {
        Arc::new(Router(self.shards.clone()))
    }

    /// Close every connection and join the loop.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        for o in self.shards.iter() {
            o.stop.store(true, Relaxed);
            o.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Shards in core loops tear down on their loops' threads.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.finished.load(Relaxed) < self.attached && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.attached = 0;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

struct Loop {
    cfg: Config,
    d: Arc<Dispatcher>,
    lender: Lender,
    /// This shard's event channel; shard 0's also carries the listener.
    ch: *mut verbs::rdma_event_channel,
    listen_id: Option<*mut rdma_cm_id>,
    shard: usize,
    /// The metrics shard and `ConnInfo::core` of this shard's calls.
    core: usize,
    outbox: Arc<Outbox>,
    peers: Arc<[Arc<Outbox>]>,
    /// Completion notifications are requested and the epoll descriptor
    /// may be readable: drain it at the next turn.
    armed: bool,
    /// The shard slept and woke: look at the event channel now.
    woke: bool,
    cm_check_at: Instant,
    next_shard: usize,
    epfd: libc::c_int,
    devices: Vec<Device>,
    conns: Vec<Option<Conn>>,
    gens: Vec<u16>,
    by_id: HashMap<usize, usize>,
    by_conn_id: HashMap<u64, usize>,
    next_conn: u64,
    large_size: usize,
    wc: Vec<ibv_wc>,
    log_budget: u32,
    /// Calls parked on slow backends, and those whose completion came back
    /// waiting for buffers to reply from (in arrival order).
    parks: RefCell<rpc::park::Table<Parked>>,
    ready: VecDeque<usize>,
    /// Where the replies of calls whose connection closed go (allocated at
    /// the first such reply).
    scratch: Vec<u8>,
}

fn nonblock(fd: libc::c_int) {
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

fn epoll_add(epfd: libc::c_int, fd: libc::c_int) {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
}

impl Loop {
    fn new(seed: Seed) -> Result<Loop, String> {
        let Seed { cfg, d, ch, listen_id, shard, peers, large_size } = seed;
        let outbox = peers[shard].clone();
        // On a core loop the core's own metrics shard; on a thread of its
        // own, the configured one.
        let core = if rpc::poller::available() { shard } else { cfg.metrics_core };
        let parks = RefCell::new(rpc::park::Table::new(d.limits.parked_per_core_max, d.limits.parked_bytes_per_core_max));
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(format!("epoll: {}", std::io::Error::last_os_error()));
        }
        let cm_fd = unsafe { (*ch).fd };
        nonblock(cm_fd);
        epoll_add(epfd, cm_fd);
        epoll_add(epfd, outbox.efd);
        Ok(Loop {
            cfg,
            d,
            lender: Lender::new(),
            ch,
            listen_id,
            shard,
            core,
            outbox,
            peers,
            armed: false,
            woke: true,
            cm_check_at: Instant::now(),
            next_shard: 0,
            epfd,
            devices: Vec::new(),
            conns: Vec::new(),
            gens: Vec::new(),
            by_id: HashMap::new(),
            by_conn_id: HashMap::new(),
            next_conn: 1,
            large_size,
            wc: vec![ibv_wc::default(); 64],
            log_budget: 100,
            parks,
            ready: VecDeque::new(),
            scratch: Vec::new(),
        })
    }

    fn log(&mut self, msg: String) {
        if self.log_budget > 0 {
            self.log_budget -= 1;
            eprintln!("chimera-rdma: {msg}");
        }
    }

    /// One pass over everything the shard serves; whether anything was done.
    fn turn(&mut self) -> bool {
        let now = Instant::now();
        let mut did = false;
        if self.woke || now >= self.cm_check_at {
            self.woke = false;
            self.cm_check_at = now + CM_POLL;
            did |= self.cm_events();
        }
        did |= self.take_handoffs();
        did |= self.poll_cqs();
        did |= self.drain_outbox();
        did |= self.take_done();
        did |= self.resume_ready();
        did |= self.retry_waiting();
        did
    }

    /// Ask every completion queue to signal its channel at the next
    /// completion: the shard may sleep after this (and a turn).
    fn arm(&mut self) {
        for dv in &self.devices {
            unsafe { verbs::req_notify_cq(dv.cq) };
        }
        self.armed = true;
    }

    /// After a sleep: take the completion-channel events and the eventfd's
    /// count, so the epoll descriptor is quiet until new work arrives.
    fn disarm(&mut self) {
        let l = verbs::lib().expect("loaded at start");
        for dv in &self.devices {
            let mut n = 0;
            loop {
                let mut cq = std::ptr::null_mut();
                let mut ctx = std::ptr::null_mut();
                if unsafe { (l.get_cq_event)(dv.channel, &mut cq, &mut ctx) } != 0 {
                    break;
                }
                n += 1;
            }
            if n > 0 {
                unsafe { (l.ack_cq_events)(dv.cq, n) };
            }
        }
        let mut v = 0u64;
        unsafe { libc::read(self.outbox.efd, &mut v as *mut u64 as *mut c_void, 8) };
        self.armed = false;
        self.woke = true;
    }

    /// A shard on a thread of its own: turns while busy, epoll when idle.
    fn run(&mut self) {
        let spin = Duration::from_micros(self.cfg.poll_spin_us);
        let mut busy_at = Instant::now();
        loop {
            if self.outbox.stop.load(Relaxed) {
                break;
            }
            if self.armed {
                self.disarm();
            }
            if self.turn() {
                busy_at = Instant::now();
                continue;
            }
            if busy_at.elapsed() < spin {
                continue;
            }
            self.arm();
            if self.turn() {
                busy_at = Instant::now();
                continue;
            }
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
            unsafe { libc::epoll_wait(self.epfd, evs.as_mut_ptr(), 8, 100) };
            busy_at = Instant::now();
        }
        self.teardown();
    }

    fn teardown(&mut self) {
        let l = verbs::lib().expect("loaded");
        for s in 0..self.conns.len() {
            if self.conns[s].is_some() {
                unsafe { (l.disconnect)(self.conns[s].as_ref().unwrap().id) };
                self.close(s);
            }
        }
        let handed: Vec<Handoff> = self.outbox.handoff.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
        for h in handed {
            self.unreserve();
            unsafe {
                (l.reject)(h.id, std::ptr::null(), 0);
                (l.destroy_id)(h.id);
            }
        }
        // Completion-channel events must be acknowledged before their
        // queues go.
        self.disarm();
        unsafe {
            if let Some(id) = self.listen_id.take() {
                (l.destroy_id)(id);
            }
            (l.destroy_event_channel)(self.ch);
        }
        for dv in self.devices.drain(..) {
            let Device { pd, channel, cq, large, .. } = dv;
            drop(large);
            unsafe {
                (l.destroy_cq)(cq);
                (l.destroy_comp_channel)(channel);
                (l.dealloc_pd)(pd);
            }
        }
        unsafe {
            libc::close(self.epfd);
        }
    }

    // ---- connection management ----

    fn cm_events(&mut self) -> bool {
        let l = verbs::lib().expect("loaded");
        let mut did = false;
        loop {
            let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
            if unsafe { (l.get_cm_event)(self.ch, &mut ev) } != 0 {
                return did;
            }
            did = true;
            let (kind, id) = unsafe { ((*ev).event, (*ev).id) };
            match kind {
                verbs::CM_CONNECT_REQUEST => {
                    let req = Request::of(unsafe { &(*ev).conn });
                    unsafe { (l.ack_cm_event)(ev) };
                    self.route(id, req);
                }
                verbs::CM_ESTABLISHED => {
                    unsafe { (l.ack_cm_event)(ev) };
                    // A connection refused before the connection manager saw
                    // it established (its first message can beat the RTU):
                    // the disconnect request could not go out then; now it can.
                    if let Some(&s) = self.by_id.get(&(id as usize)) {
                        if self.conns[s].as_ref().is_some_and(|c| c.closing) {
                            unsafe { (l.disconnect)(id) };
                        }
                    }
                }
                _ => {
                    // DISCONNECTED, errors, device removal, time-wait exit.
                    unsafe { (l.ack_cm_event)(ev) };
                    if let Some(&s) = self.by_id.get(&(id as usize)) {
                        self.close(s);
                    }
                }
            }
        }
    }

    fn device(&mut self, v: *mut c_void) -> Result<usize, String> {
        if let Some(i) = self.devices.iter().position(|d| d.verbs == v) {
            return Ok(i);
        }
        let l = verbs::lib()?;
        let pd = unsafe { (l.alloc_pd)(v) };
        if pd.is_null() {
            return Err(format!("cannot allocate a protection domain: {}", std::io::Error::last_os_error()));
        }
        let channel = unsafe { (l.create_comp_channel)(v) };
        if channel.is_null() {
            unsafe { (l.dealloc_pd)(pd) };
            return Err(format!("cannot create a completion channel: {}", std::io::Error::last_os_error()));
        }
        let mut cq = std::ptr::null_mut();
        for n in [CQ_ENTRIES, 8191, 2047] {
            cq = unsafe { (l.create_cq)(v, n, std::ptr::null_mut(), channel, 0) };
            if !cq.is_null() {
                break;
            }
        }
        if cq.is_null() {
            unsafe {
                (l.destroy_comp_channel)(channel);
                (l.dealloc_pd)(pd);
            }
            return Err(format!("cannot create a completion queue: {}", std::io::Error::last_os_error()));
        }
        let large = match Region::new(pd, self.large_size * self.cfg.large_buffers, verbs::IBV_ACCESS_LOCAL_WRITE) {
            Ok(r) => r,
            Err(e) => {
                unsafe {
                    (l.destroy_cq)(cq);
                    (l.destroy_comp_channel)(channel);
                    (l.dealloc_pd)(pd);
                }
                return Err(e);
            }
        };
        let fd = unsafe { verbs::comp_channel_fd(channel) };
        nonblock(fd);
        epoll_add(self.epfd, fd);
        self.devices.push(Device {
            verbs: v,
            pd,
            channel,
            cq,
            large,
            large_free: (0..self.cfg.large_buffers as u32).rev().collect(),
        });
        Ok(self.devices.len() - 1)
    }

    /// A connection request on the listener (shard 0): reserve it against
    /// `conns_max` and give it to the shard with the fewest connections.
    fn route(&mut self, id: *mut rdma_cm_id, req: Request) {
        let l = verbs::lib().expect("loaded");
        let open = CONNS_OPEN.fetch_add(1, Relaxed);
        if open >= self.cfg.conns_max as u64 {
            CONNS_OPEN.fetch_sub(1, Relaxed);
            STATS.conns_rejected.fetch_add(1, Relaxed);
            self.log(format!("connection refused: {open} RDMA connections open (the limit)"));
            unsafe {
                (l.reject)(id, std::ptr::null(), 0);
                (l.destroy_id)(id);
            }
            return;
        }
        let n = self.peers.len();
        let start = self.next_shard;
        self.next_shard = (start + 1) % n;
        let target = (0..n).map(|i| (start + i) % n).min_by_key(|&t| SHARD_OPEN[t].load(Relaxed)).unwrap_or(0);
        SHARD_OPEN[target].fetch_add(1, Relaxed);
        if target == self.shard {
            self.accept_reserved(id, req);
            return;
        }
        let to = &self.peers[target];
        if unsafe { (l.migrate_id)(id, to.ch as *mut verbs::rdma_event_channel) } != 0 {
            let e = std::io::Error::last_os_error();
            SHARD_OPEN[target].fetch_sub(1, Relaxed);
            self.accept_reserved(id, req);
            self.log(format!("cannot move a connection to shard {target}: {e}; shard {} serves it", self.shard));
            return;
        }
        to.handoff.lock().unwrap_or_else(|e| e.into_inner()).push_back(Handoff { id, req });
        to.wake();
    }

    /// Give back a reservation of `route` (the connection never opened).
    fn unreserve(&self) {
        CONNS_OPEN.fetch_sub(1, Relaxed);
        SHARD_OPEN[self.shard].fetch_sub(1, Relaxed);
    }

    /// Accept a request reserved for this shard, or refuse it and give the
    /// reservation back.
    fn accept_reserved(&mut self, id: *mut rdma_cm_id, req: Request) {
        if let Err(e) = self.accept(id, &req) {
            self.unreserve();
            STATS.conns_rejected.fetch_add(1, Relaxed);
            self.log(format!("connection refused: {e}"));
            unsafe { (verbs::lib().expect("loaded").destroy_id)(id) };
        }
    }

    /// Connections the listener handed to this shard.
    fn take_handoffs(&mut self) -> bool {
        let mut did = false;
        loop {
            let h = self.outbox.handoff.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            let Some(h) = h else { return did };
            did = true;
            self.accept_reserved(h.id, h.req);
        }
    }

    fn accept(&mut self, id: *mut rdma_cm_id, req: &Request) -> Result<(), String> {
        let l = verbs::lib()?;
        let dev = self.device(unsafe { (*id).verbs })?;
        let theirs = req.private().and_then(Private::decode);
        let inline = self.cfg.inline_bytes as usize;
        let client_recv = theirs.map_or(wire::INLINE_DEFAULT, |p| p.recv) as usize;
        let credits = self.cfg.credits;
        let nrecv = credits + BACKCHANNEL_RECVS;
        let nsend = 2 * credits + BACKCHANNEL_RECVS;
        let small = Region::new(self.devices[dev].pd, (nrecv + nsend) as usize * inline, verbs::IBV_ACCESS_LOCAL_WRITE)?;
        let cq = self.devices[dev].cq;
        let mut attr = verbs::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            max_send_wr: nsend * (1 + wire::SEGMENTS_MAX as u32) + credits * wire::SEGMENTS_MAX as u32,
            max_recv_wr: nrecv,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            qp_type: verbs::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        if let Some(tos) = self.cfg.tos {
            let mut t = tos;
            unsafe { (l.set_option)(id, verbs::RDMA_OPTION_ID, verbs::RDMA_OPTION_ID_TOS, &mut t as *mut u8 as *mut c_void, 1) };
        }
        if unsafe { (l.create_qp)(id, self.devices[dev].pd, &mut attr) } != 0 {
            unsafe { (l.reject)(id, std::ptr::null(), 0) };
            return Err(format!("cannot create a queue pair: {}", std::io::Error::last_os_error()));
        }
        let qp = unsafe { (*id).qp };
        let slot = match self.conns.iter().position(|c| c.is_none()) {
            Some(s) => s,
            None => {
                self.conns.push(None);
                self.gens.push(0);
                self.conns.len() - 1
            }
        };
        self.gens[slot] = self.gens[slot].wrapping_add(1);
        let gen = self.gens[slot];
        let conn_id = CONN_ID_BIT | self.next_conn << 8 | self.shard as u64;
        self.next_conn += 1;
        let peer = verbs::from_sockaddr(unsafe { &(*id).dst_addr });
        let c = Conn {
            id,
            qp,
            dev,
            gen,
            info: ConnInfo { conn_id, peer, core: self.core },
            small,
            buf_bytes: inline,
            send_free: (nrecv..nrecv + nsend).rev().collect(),
            send_hold: vec![None; (nrecv + nsend) as usize],
            credits,
            send_inline_max: client_recv.min(inline),
            remote_invalidate: theirs.is_some_and(|p| p.remote_invalidate),
            waiting: VecDeque::new(),
            reading: Vec::new(),
            outstanding: 0,
            closing: false,
        };
        self.conns[slot] = Some(c);
        self.by_id.insert(id as usize, slot);
        self.by_conn_id.insert(conn_id, slot);
        for b in 0..nrecv {
            if let Err(e) = self.post_recv(slot, b) {
                self.detach(slot);
                return Err(e);
            }
        }
        let ours = Private { send: inline as u32, recv: inline as u32, remote_invalidate: false }.encode();
        let mut p = rdma_conn_param {
            private_data: ours.as_ptr() as *const c_void,
            private_data_len: ours.len() as u8,
            // The request's fields are from our side already: how many
            // RDMA Reads we may have in flight to the client (we pull Read
            // chunks) and how many it may have to us (none: it never reads).
            responder_resources: req.responder_resources.min(16),
            initiator_depth: req.initiator_depth.min(16),
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        if unsafe { (l.accept)(id, &mut p) } != 0 {
            let e = std::io::Error::last_os_error();
            self.detach(slot);
            return Err(format!("accept: {e}"));
        }
        STATS.conns_accepted.fetch_add(1, Relaxed);
        SHARD_ACCEPTED[self.shard].fetch_add(1, Relaxed);
        Ok(())
    }

    /// Free a connection's resources (its queue pair first: nothing more
    /// lands in its buffers) and tell the dispatcher.
    fn close(&mut self, s: usize) {
        if self.conns[s].is_none() {
            return;
        }
        self.close_quiet(s);
        self.unreserve();
        STATS.conns_closed.fetch_add(1, Relaxed);
    }

    fn close_quiet(&mut self, s: usize) {
        if let Some(id) = self.detach(s) {
            let l = verbs::lib().expect("loaded");
            unsafe { (l.destroy_id)(id) };
        }
    }

    /// Everything of `close_quiet` but destroying the CM id (returned).
    fn detach(&mut self, s: usize) -> Option<*mut rdma_cm_id> {
        let c = self.conns[s].take()?;
        let l = verbs::lib().expect("loaded");
        unsafe { (l.destroy_qp)(c.id) };
        self.d.conn_closed(&c.info);
        let dv = &mut self.devices[c.dev];
        for b in c.send_hold.iter().flatten() {
            dv.large_free.push(*b);
        }
        for p in &c.reading {
            dv.large_free.push(p.input);
            dv.large_free.push(p.out);
        }
        self.by_id.remove(&(c.id as usize));
        self.by_conn_id.remove(&c.info.conn_id);
        drop(c.small);
        Some(c.id)
    }

    /// Ask the peer to go; the DISCONNECTED event frees the connection.
    fn disconnect(&mut self, s: usize, why: &str) {
        let Some(c) = self.conns[s].as_mut() else { return };
        if c.closing {
            return;
        }
        c.closing = true;
        let (id, peer) = (c.id, c.info.peer);
        STATS.protocol_errors.fetch_add(1, Relaxed);
        self.log(format!("closing the RDMA connection from {peer}: {why}"));
        let l = verbs::lib().expect("loaded");
        unsafe { (l.disconnect)(id) };
    }

    // ---- completions ----

    fn poll_cqs(&mut self) -> bool {
        let mut did = false;
        for dv in 0..self.devices.len() {
            loop {
                let cq = self.devices[dv].cq;
                let n = unsafe { verbs::poll_cq(cq, &mut self.wc) };
                if n <= 0 {
                    break;
                }
                did = true;
                for i in 0..n as usize {
                    let wc = self.wc[i];
                    self.completion(&wc);
                }
            }
        }
        did
    }

    fn completion(&mut self, wc: &ibv_wc) {
        let (gen, s, kind, idx) = wr_parts(wc.wr_id);
        let live = self.conns.get(s).and_then(|c| c.as_ref()).is_some_and(|c| c.gen == gen);
        if !live {
            return;
        }
        if wc.status != verbs::IBV_WC_SUCCESS {
            if wc.status != verbs::IBV_WC_WR_FLUSH_ERR {
                STATS.completion_errors.fetch_add(1, Relaxed);
                let why = format!("work completion failed: {} (vendor error {})", verbs::wc_status(wc.status), wc.vendor_err);
                if kind == KIND_SEND {
                    self.send_done(s, idx);
                }
                self.disconnect(s, &why);
            } else if kind == KIND_SEND {
                self.send_done(s, idx);
            }
            return;
        }
        match kind {
            KIND_RECV => {
                STATS.recv_bytes.fetch_add(wc.byte_len as u64, Relaxed);
                self.on_recv(s, idx, wc.byte_len);
            }
            KIND_SEND => self.send_done(s, idx),
            KIND_READ => self.read_done(s, idx),
            _ => {}
        }
    }

    fn send_done(&mut self, s: usize, b: u32) {
        let Some(c) = self.conns[s].as_mut() else { return };
        if let Some(big) = c.send_hold[b as usize].take() {
            self.devices[c.dev].large_free.push(big);
        }
        c.send_free.push(b);
    }

    fn post_recv(&mut self, s: usize, b: u32) -> Result<(), String> {
        let c = self.conns[s].as_ref().expect("live");
        let mut sge = ibv_sge { addr: c.small.addr(b as usize * c.buf_bytes), length: c.buf_bytes as u32, lkey: c.small.lkey };
        let mut wr = ibv_recv_wr { wr_id: wr_id(c.gen, s, KIND_RECV, b), next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let rc = unsafe { verbs::post_recv(c.qp, &mut wr) };
        if rc != 0 {
            return Err(format!("cannot post a receive: {}", std::io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    }

    fn repost(&mut self, s: usize, b: u32) {
        if let Err(e) = self.post_recv(s, b) {
            self.disconnect(s, &e);
        }
    }

    // ---- calls ----

    fn on_recv(&mut self, s: usize, b: u32, len: u32) {
        let c = self.conns[s].as_mut().expect("live");
        if c.closing {
            return;
        }
        // A call holds one of the client's credits from its arrival until
        // its reply (or RDMA_ERROR) is posted, waiting for buffers or not.
        let msg = c.small.slice(b as usize * c.buf_bytes, len as usize);
        let parsed = wire::parse(msg);
        if counts_as_call(msg, &parsed) {
            c.outstanding += 1;
            if c.outstanding > c.credits {
                let (credits, n) = (c.credits, c.outstanding);
                self.disconnect(s, &format!("{n} calls in flight, more than the {credits} credits granted"));
                return;
            }
        }
        if !c.waiting.is_empty() || !self.try_message(s, b, len, parsed) {
            self.conns[s].as_mut().expect("live").waiting.push_back((b, len));
        }
    }

    fn retry_waiting(&mut self) -> bool {
        let mut did = false;
        for s in 0..self.conns.len() {
            while let Some(&(b, len)) = self.conns[s].as_ref().and_then(|c| c.waiting.front()) {
                let c = self.conns[s].as_ref().expect("live");
                let parsed = wire::parse(c.small.slice(b as usize * c.buf_bytes, len as usize));
                if !self.try_message(s, b, len, parsed) {
                    break;
                }
                self.conns[s].as_mut().expect("live").waiting.pop_front();
                did = true;
            }
        }
        did
    }

    /// Handle one received message; false when buffers are short (retry).
    fn try_message(&mut self, s: usize, b: u32, len: u32, parsed: Result<Message, Refused>) -> bool {
        let c = self.conns[s].as_ref().expect("live");
        if c.closing {
            return true;
        }
        let dev = c.dev;
        let msg = c.small.slice(b as usize * c.buf_bytes, len as usize);
        let h = match parsed {
            Ok(Message::Call(h)) => h,
            Ok(Message::Done) => {
                self.repost(s, b);
                return true;
            }
            Err(Refused::Garbage) => {
                self.disconnect(s, "a message too short for an RPC-over-RDMA header");
                return true;
            }
            Err(Refused::PeerError { xid }) => {
                self.disconnect(s, &format!("the client sent RDMA_ERROR (xid {xid:#x})"));
                return true;
            }
            Err(Refused::Version { xid }) => return self.send_error(s, b, xid, wire::ERR_VERS, "RPC-over-RDMA version is not 1"),
            Err(Refused::Chunk { xid, why }) => return self.send_error(s, b, xid, wire::ERR_CHUNK, why),
        };
        let inline = &msg[h.len..];
        let layout = match wire::layout(&h, inline.len(), self.d.limits.record_bytes_max) {
            Ok(l) => l,
            Err(why) => return self.send_error(s, b, h.xid, wire::ERR_CHUNK, why),
        };
        // A REPLY (to a back-channel call) is not a call: no credit, no reply.
        let is_reply = layout == Layout::Inline && inline.len() >= 8 && inline[4..8] == [0, 0, 0, 1];
        let need_large = if matches!(layout, Layout::Inline) { 1 } else { 2 };
        let c = self.conns[s].as_ref().expect("live");
        if c.send_free.is_empty() || self.devices[dev].large_free.len() < need_large {
            return false;
        }
        // A call may park, keeping its record: wait while parked calls are
        // at their bound (their completions free room).
        let record_len = match layout {
            Layout::Inline => inline.len(),
            Layout::Whole { len } => len,
            Layout::Spliced { total, .. } => total,
        };
        if !is_reply && !self.parks.borrow().has_room(record_len) {
            return false;
        }
        if !is_reply {
            STATS.calls.fetch_add(1, Relaxed);
            SHARD_CALLS[self.shard].fetch_add(1, Relaxed);
        }
        let c = self.conns[s].as_mut().expect("live");
        let send = c.send_free.pop().expect("checked");
        let out = self.devices[dev].large_free.pop().expect("checked");
        match layout {
            Layout::Inline => {
                // Run from the receive buffer, then give it back.
                let record: &[u8] = unsafe { std::slice::from_raw_parts(inline.as_ptr(), inline.len()) };
                self.run_call(s, &h, record, out, send, is_reply);
                if self.conns[s].is_some() {
                    self.repost(s, b);
                }
            }
            Layout::Whole { len } | Layout::Spliced { len, .. } => {
                let input = self.devices[dev].large_free.pop().expect("checked");
                let dv = &self.devices[dev];
                let base = input as usize * self.large_size;
                let (at, total) = match layout {
                    Layout::Spliced { position, total, .. } => {
                        let buf = dv.large.slice(base, total);
                        buf[..position].copy_from_slice(&inline[..position]);
                        let after = position + len + wire::pad(len);
                        buf[position + len..after].fill(0);
                        buf[after..].copy_from_slice(&inline[position..]);
                        (position, total)
                    }
                    _ => (0, len),
                };
                // Pull the chunk into place; only the last Read is signaled
                // (an RC queue completes in order).
                let c = self.conns[s].as_ref().expect("live");
                let segs = h.reads.as_slice();
                let mut batch = Batch::new();
                let mut off = at;
                for (i, sg) in segs.iter().enumerate() {
                    let local = ibv_sge { addr: dv.large.addr(base + off), length: sg.length, lkey: dv.large.lkey };
                    let flags = if i + 1 == segs.len() { verbs::IBV_SEND_SIGNALED } else { 0 };
                    batch.push(wr_id(c.gen, s, KIND_READ, input), local, verbs::IBV_WR_RDMA_READ, flags, sg);
                    off += sg.length as usize;
                }
                let rc = batch.post(c.qp);
                STATS.rdma_reads.fetch_add(segs.len() as u64, Relaxed);
                STATS.rdma_read_bytes.fetch_add(len as u64, Relaxed);
                let c = self.conns[s].as_mut().expect("live");
                c.reading.push(Pending { h, input, out, send, len: total });
                self.repost(s, b);
                if rc != 0 {
                    self.disconnect(s, &format!("cannot post RDMA Reads: {}", std::io::Error::from_raw_os_error(rc)));
                }
            }
        }
        true
    }

    fn read_done(&mut self, s: usize, input: u32) {
        let c = self.conns[s].as_mut().expect("live");
        let Some(i) = c.reading.iter().position(|p| p.input == input) else { return };
        let p = c.reading.swap_remove(i);
        let dv = &self.devices[c.dev];
        let record: &[u8] = dv.large.slice(input as usize * self.large_size, p.len);
        let record: &[u8] = unsafe { std::slice::from_raw_parts(record.as_ptr(), record.len()) };
        self.run_call(s, &p.h, record, p.out, p.send, false);
        if let Some(c) = self.conns[s].as_ref() {
            self.devices[c.dev].large_free.push(input);
        } else {
            // Closed during the call: close() already freed nothing of this
            // call (it was no longer in `reading`).
        }
    }

    /// A call's reply is on its way (or there is none): its credit is back.
    fn call_over(&mut self, s: usize, is_reply: bool) {
        if let (Some(c), false) = (self.conns[s].as_mut(), is_reply) {
            c.outstanding = c.outstanding.saturating_sub(1);
        }
    }

    fn release(&mut self, s: usize, out: u32, send: u32) {
        if let Some(c) = self.conns[s].as_mut() {
            self.devices[c.dev].large_free.push(out);
            c.send_free.push(send);
        }
    }

    /// Dispatch one RPC message and send its reply.
    fn run_call(&mut self, s: usize, h: &Header, record: &[u8], out: u32, send: u32, is_reply: bool) {
        let c = self.conns[s].as_ref().expect("live");
        let info = c.info;
        let dv = &self.devices[c.dev];
        let obuf = dv.large.slice(out as usize * self.large_size, self.large_size);
        let parker = Parker { table: &self.parks, outbox: &self.outbox, slot: s, gen: c.gen, info, h: *h, again: None };
        // The dispatcher writes a TCP record mark first; it is dropped here.
        let outcome = self.d.handle_parking(&info, record, obuf, Some(&self.lender), &parker);
        match outcome {
            Outcome::Reply(n) => {
                self.call_over(s, is_reply);
                self.reply(s, h, obuf, n, out, send);
            }
            Outcome::Nothing => {
                let _ = self.lender.take_ddp();
                self.release(s, out, send);
                self.call_over(s, is_reply);
            }
            Outcome::Parked => {
                // Its reply comes with its completion (`resume_ready`); the
                // credit stays taken until then, the buffers go back now.
                let _ = self.lender.take_ddp();
                self.release(s, out, send);
            }
            Outcome::Close => {
                let _ = self.lender.take_ddp();
                self.call_over(s, is_reply);
                self.release(s, out, send);
                self.disconnect(s, "an RPC message that cannot be answered");
            }
        }
    }

    // ---- parked calls ----

    /// Completions of parked calls arrived: queue those whose connection
    /// is still open; run the others to their end at once.
    fn take_done(&mut self) -> bool {
        let done = std::mem::take(&mut *self.outbox.done.lock().unwrap_or_else(|e| e.into_inner()));
        if done.is_empty() {
            return false;
        }
        for (i, g, payload) in done {
            let (s, gen) = {
                let mut t = self.parks.borrow_mut();
                let Some(p) = t.get_mut(i, g) else { continue };
                debug_assert!(p.payload.is_none(), "a ticket completes once");
                p.payload = Some(payload);
                (p.slot, p.gen)
            };
            if self.open(s, gen) {
                self.ready.push_back(i);
            } else {
                self.finish_orphan(i);
            }
        }
        true
    }

    /// Whether connection `s` is still the one of generation `gen`, and open.
    fn open(&self, s: usize, gen: u16) -> bool {
        self.conns.get(s).and_then(|c| c.as_ref()).is_some_and(|c| c.gen == gen && !c.closing)
    }

    /// A parked call whose connection has gone: it still runs to its reply
    /// (the duplicate-request cache keeps it for a retransmission on a new
    /// connection; an NFSv4 COMPOUND gives its session slot back).
    fn finish_orphan(&mut self, i: usize) {
        let p = self.parks.borrow_mut().remove(i);
        if self.scratch.is_empty() {
            self.scratch = vec![0u8; self.large_size];
        }
        let payload = p.payload.expect("completed");
        // It may park again (a later operation of its COMPOUND waits); its
        // completion then finds the connection gone and comes back here.
        let parker = Parker { table: &self.parks, outbox: &self.outbox, slot: p.slot, gen: p.gen, info: p.info, h: p.h, again: Some(p.started) };
        let _ = self.d.resume(&p.info, &p.record, &p.state, payload.as_deref(), &mut self.scratch, p.started, None, Some(&parker));
    }

    /// Reply to completed parked calls that have buffers to reply from; a
    /// connection short of send buffers keeps its calls queued (in order)
    /// without holding up the others.
    fn resume_ready(&mut self) -> bool {
        let mut did = false;
        let mut blocked: Vec<usize> = Vec::new();
        let mut n = self.ready.len();
        while n > 0 {
            n -= 1;
            let Some(i) = self.ready.pop_front() else { break };
            let (s, gen) = {
                let t = self.parks.borrow();
                let p = t.get(i).expect("ready calls are kept");
                (p.slot, p.gen)
            };
            if !self.open(s, gen) {
                self.finish_orphan(i);
                did = true;
                continue;
            }
            let dev = self.conns[s].as_ref().expect("open").dev;
            let short = self.conns[s].as_ref().expect("open").send_free.is_empty() || self.devices[dev].large_free.is_empty();
            if short || blocked.contains(&s) {
                blocked.push(s);
                self.ready.push_back(i);
                continue;
            }
            did = true;
            let p = self.parks.borrow_mut().remove(i);
            let c = self.conns[s].as_mut().expect("open");
            let send = c.send_free.pop().expect("checked");
            let out = self.devices[dev].large_free.pop().expect("checked");
            let obuf = self.devices[dev].large.slice(out as usize * self.large_size, self.large_size);
            let payload = p.payload.expect("ready calls have completed");
            let gen = c.gen;
            let parker = Parker { table: &self.parks, outbox: &self.outbox, slot: s, gen, info: p.info, h: p.h, again: Some(p.started) };
            let o = self.d.resume(&p.info, &p.record, &p.state, payload.as_deref(), obuf, p.started, Some(&self.lender), Some(&parker));
            if o == Outcome::Parked {
                // Waits again (a later operation of its COMPOUND): its
                // credit stays taken, the buffers go back.
                let _ = self.lender.take_ddp();
                self.release(s, out, send);
                continue;
            }
            self.call_over(s, false);
            match o {
                Outcome::Reply(n) => self.reply(s, &p.h, obuf, n, out, send),
                Outcome::Nothing => {
                    let _ = self.lender.take_ddp();
                    self.release(s, out, send);
                }
                Outcome::Parked => unreachable!("handled above"),
                Outcome::Close => {
                    let _ = self.lender.take_ddp();
                    self.release(s, out, send);
                    self.disconnect(s, "an RPC message that cannot be answered");
                }
            }
        }
        did
    }

    fn reply(&mut self, s: usize, h: &Header, obuf: &mut [u8], mut n: usize, out: u32, send: u32) {
        let mut ddp = self.lender.take_ddp();
        if let Some(lent) = self.lender.take() {
            // Put the lent pieces back in line (they are written from here).
            if n + lent.len > obuf.len() {
                self.lender.recycle(lent.pieces);
                self.release(s, out, send);
                self.disconnect(s, "a reply larger than its buffer");
                return;
            }
            obuf.copy_within(lent.pos..n, lent.pos + lent.len);
            let mut at = lent.pos;
            for p in &lent.pieces {
                obuf[at..at + p.len].copy_from_slice(&p.buf[p.at..p.at + p.len]);
                at += p.len;
            }
            n += lent.len;
            ddp = Some((lent.pos, lent.len));
            self.lender.recycle(lent.pieces);
        }
        let c = self.conns[s].as_ref().expect("live");
        let dv = &self.devices[c.dev];
        let base = out as usize * self.large_size;
        // The data item moves by RDMA Write when the client gave a Write
        // chunk that holds it; its XDR pad is not conveyed (RFC 8166 §3.5.3).
        let write_chunk = (h.write_chunks > 0).then(|| h.write.as_slice());
        let moved = match (ddp, write_chunk) {
            (Some((pos, len)), Some(w)) if len > 0 && pos >= 4 && pos + len + wire::pad(len) <= n && w.iter().map(|s| s.length as u64).sum::<u64>() >= len as u64 => {
                Some((pos, len))
            }
            _ => None,
        };
        let inline_len = match moved {
            Some((pos, len)) => (pos - 4) + (n - pos - len - wire::pad(len)),
            None => n - 4,
        };
        let hdr_len = wire::reply_header_len(write_chunk, None);
        // RDMA Writes of the data item or the whole reply, then the Send.
        let mut batch = Batch::new();
        let lkey = dv.large.lkey;
        let nomsg;
        let sbuf = c.small.slice(send as usize * c.buf_bytes, c.buf_bytes);
        let sent;
        if hdr_len + inline_len <= c.send_inline_max {
            nomsg = false;
            let hl = wire::encode_reply(sbuf, h.xid, c.credits, false, write_chunk.map(|w| (w, moved.map_or(0, |m| m.1 as u64))), None);
            match moved {
                Some((pos, len)) => {
                    let tail = pos + len + wire::pad(len);
                    sbuf[hl..hl + pos - 4].copy_from_slice(&obuf[4..pos]);
                    sbuf[hl + pos - 4..hl + inline_len].copy_from_slice(&obuf[tail..n]);
                    for (addr, n, seg) in spread(dv.large.addr(base + pos), len, write_chunk.unwrap()) {
                        batch.push(0, ibv_sge { addr, length: n, lkey }, verbs::IBV_WR_RDMA_WRITE, 0, &seg);
                    }
                }
                None => sbuf[hl..hl + inline_len].copy_from_slice(&obuf[4..n]),
            }
            sent = hl + inline_len;
        } else if let Some(rc) = h.reply.filter(|r| moved.is_none() && r.capacity() >= (n - 4) as u64) {
            nomsg = true;
            let hl = wire::encode_reply(sbuf, h.xid, c.credits, true, write_chunk.map(|w| (w, 0)), Some((rc.as_slice(), (n - 4) as u64)));
            for (addr, n, seg) in spread(dv.large.addr(base + 4), n - 4, rc.as_slice()) {
                batch.push(0, ibv_sge { addr, length: n, lkey }, verbs::IBV_WR_RDMA_WRITE, 0, &seg);
            }
            sent = hl;
        } else {
            let xid = h.xid;
            self.release(s, out, send);
            self.count_error(s, xid, wire::ERR_CHUNK, "the reply does not fit inline and the call gave no chunk to hold it");
            return;
        }
        let hold = batch.n > 0;
        STATS.rdma_writes.fetch_add(batch.n as u64, Relaxed);
        STATS.rdma_write_bytes.fetch_add(batch.sge[..batch.n].iter().map(|g| g.length as u64).sum::<u64>(), Relaxed);
        let local = ibv_sge { addr: c.small.addr(send as usize * c.buf_bytes), length: sent as u32, lkey: c.small.lkey };
        // The client's registration for this call is done with once the
        // reply lands: invalidate it with the Send (the Writes before it
        // on the queue pair complete first), sparing the client its own
        // Local Invalidate.
        match h.invalidate_rkey().filter(|_| c.remote_invalidate) {
            Some(rkey) => {
                batch.push(wr_id(c.gen, s, KIND_SEND, send), local, verbs::IBV_WR_SEND_WITH_INV, verbs::IBV_SEND_SIGNALED, &Segment::default());
                batch.wr[batch.n - 1].imm_data = rkey;
                STATS.sends_with_invalidate.fetch_add(1, Relaxed);
            }
            None => {
                let chunked = h.reads.n > 0 || h.write_chunks > 0 || h.reply.is_some();
                if chunked && c.remote_invalidate {
                    STATS.replies_not_invalidated.fetch_add(1, Relaxed);
                }
                batch.push(wr_id(c.gen, s, KIND_SEND, send), local, verbs::IBV_WR_SEND, verbs::IBV_SEND_SIGNALED, &Segment::default())
            }
        }
        if nomsg {
            STATS.reply_chunks.fetch_add(1, Relaxed);
        }
        STATS.send_bytes.fetch_add(sent as u64, Relaxed);
        let qp = c.qp;
        let c = self.conns[s].as_mut().expect("live");
        if hold {
            c.send_hold[send as usize] = Some(out);
        } else {
            self.devices[c.dev].large_free.push(out);
        }
        let rc = batch.post(qp);
        if rc != 0 {
            self.send_done(s, send);
            self.disconnect(s, &format!("cannot post a reply: {}", std::io::Error::from_raw_os_error(rc)));
        }
    }

    /// Answer a refused message with RDMA_ERROR (its receive buffer goes
    /// back first). False when no send buffer is free (retry).
    fn send_error(&mut self, s: usize, b: u32, xid: u32, err: u32, why: &str) -> bool {
        if self.conns[s].as_ref().expect("live").send_free.is_empty() {
            return false;
        }
        self.repost(s, b);
        self.count_error(s, xid, err, why);
        self.call_over(s, false);
        true
    }

    fn count_error(&mut self, s: usize, xid: u32, err: u32, why: &str) {
        let Some(c) = self.conns[s].as_mut() else { return };
        let Some(send) = c.send_free.pop() else {
            self.disconnect(s, why);
            return;
        };
        STATS.errors_sent.fetch_add(1, Relaxed);
        let mut e = [0u8; 28];
        let n = wire::encode_error(&mut e, xid, c.credits, err);
        let sbuf = c.small.slice(send as usize * c.buf_bytes, c.buf_bytes);
        sbuf[..n].copy_from_slice(&e[..n]);
        let mut sge = ibv_sge { addr: c.small.addr(send as usize * c.buf_bytes), length: n as u32, lkey: c.small.lkey };
        let mut wr = ibv_send_wr::new(wr_id(c.gen, s, KIND_SEND, send), &mut sge, verbs::IBV_WR_SEND, verbs::IBV_SEND_SIGNALED, 0, 0);
        let (qp, peer) = (c.qp, c.info.peer);
        let rc = unsafe { verbs::post_send(qp, &mut wr) };
        let name = if err == wire::ERR_VERS { "ERR_VERS" } else { "ERR_CHUNK" };
        self.log(format!("RDMA_ERROR {name} to {peer} (xid {xid:#x}): {why}"));
        if rc != 0 {
            self.send_done(s, send);
            self.disconnect(s, "cannot post RDMA_ERROR");
        }
    }

    // ---- back channel ----

    fn drain_outbox(&mut self) -> bool {
        let mut q = self.outbox.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_empty() {
            return false;
        }
        let mut later = VecDeque::new();
        let items: Vec<_> = q.drain(..).collect();
        drop(q);
        for (conn_id, record) in items {
            let Some(&s) = self.by_conn_id.get(&conn_id) else { continue };
            let c = self.conns[s].as_mut().expect("live");
            // Without the TCP record mark: xid first.
            let msg = record.get(4..).unwrap_or(&[]);
            if msg.len() < 4 || wire::HEADER_MIN + msg.len() > c.send_inline_max {
                continue;
            }
            let Some(send) = c.send_free.pop() else {
                later.push_back((conn_id, record));
                continue;
            };
            let xid = u32::from_be_bytes([msg[0], msg[1], msg[2], msg[3]]);
            let sbuf = c.small.slice(send as usize * c.buf_bytes, c.buf_bytes);
            let hl = wire::encode_reply(sbuf, xid, c.credits, false, None, None);
            sbuf[hl..hl + msg.len()].copy_from_slice(msg);
            let mut sge = ibv_sge { addr: c.small.addr(send as usize * c.buf_bytes), length: (hl + msg.len()) as u32, lkey: c.small.lkey };
            let mut wr = ibv_send_wr::new(wr_id(c.gen, s, KIND_SEND, send), &mut sge, verbs::IBV_WR_SEND, verbs::IBV_SEND_SIGNALED, 0, 0);
            let rc = unsafe { verbs::post_send(c.qp, &mut wr) };
            STATS.backchannel_calls.fetch_add(1, Relaxed);
            if rc != 0 {
                self.send_done(s, send);
                self.disconnect(s, "cannot post a back-channel call");
            }
        }
        if !later.is_empty() {
            let mut q = self.outbox.queue.lock().unwrap_or_else(|e| e.into_inner());
            for x in later.into_iter().rev() {
                q.push_front(x);
            }
        }
        true
    }
}

/// A shard in a core loop (`Server::start_on_cores`).
struct ShardPoller {
    lp: Loop,
    done: bool,
    finished: Arc<AtomicUsize>,
}

impl rpc::poller::Poller for ShardPoller {
    fn poll(&mut self) -> usize {
        if self.done {
            return 0;
        }
        if self.lp.outbox.stop.load(Relaxed) {
            self.lp.teardown();
            self.done = true;
            self.finished.fetch_add(1, Relaxed);
            return 0;
        }
        if self.lp.armed {
            self.lp.disarm();
        }
        self.lp.turn() as usize
    }
    /// Work in flight (RDMA Reads, parked calls) wakes the loop through
    /// the shard's epoll descriptor: the loop need not spin for it.
    fn busy(&self) -> bool {
        false
    }
    fn notify_fds(&self, _out: &mut Vec<std::os::fd::RawFd>) {}
    fn wake_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        if !self.done {
            out.push(self.lp.epfd);
        }
    }
    fn before_sleep(&mut self) -> bool {
        if self.done {
            return false;
        }
        if self.lp.outbox.stop.load(Relaxed) {
            return true;
        }
        self.lp.arm();
        self.lp.turn()
    }
    fn gone(&self) -> bool {
        self.done
    }
}

/// Whether a received message is a call that takes a credit: anything but
/// a back-channel REPLY carried inline, RDMA_DONE and RDMA_ERROR (an
/// unusable header is answered, so it counts).
fn counts_as_call(msg: &[u8], parsed: &Result<Message, Refused>) -> bool {
    match parsed {
        Ok(Message::Call(h)) => {
            let body = &msg[h.len..];
            !(h.reads.n == 0 && body.len() >= 8 && body[4..8] == [0, 0, 0, 1])
        }
        Ok(Message::Done) | Err(Refused::PeerError { .. }) | Err(Refused::Garbage) => false,
        Err(_) => true,
    }
}

/// `len` bytes from `addr` spread over the remote segments, in order:
/// (local address, bytes, segment) per RDMA Write.
fn spread(addr: u64, len: usize, segs: &[Segment]) -> impl Iterator<Item = (u64, u32, Segment)> + '_ {
    let mut left = len as u64;
    let mut at = addr;
    segs.iter().map_while(move |sg| {
        if left == 0 {
            return None;
        }
        let n = left.min(sg.length as u64);
        let w = (at, n as u32, *sg);
        at += n;
        left -= n;
        Some(w)
    })
}

/// Most work requests posted at once: a chunk's segments and the Send.
const BATCH_MAX: usize = wire::SEGMENTS_MAX + 1;

/// Work requests posted together, built on the stack (no allocation per
/// call); linked and pointed at their scatter entries only when posted.
struct Batch {
    n: usize,
    sge: [ibv_sge; BATCH_MAX],
    wr: [ibv_send_wr; BATCH_MAX],
}

impl Batch {
    fn new() -> Batch {
        Batch {
            n: 0,
            sge: [ibv_sge::default(); BATCH_MAX],
            wr: std::array::from_fn(|_| ibv_send_wr::new(0, std::ptr::null_mut(), 0, 0, 0, 0)),
        }
    }

    /// One request moving `local` (RDMA Read / Write to or from `remote`, or
    /// a Send, which ignores `remote`).
    fn push(&mut self, wr_id: u64, local: ibv_sge, opcode: u32, flags: u32, remote: &Segment) {
        assert!(self.n < BATCH_MAX, "more work requests than a chunk holds");
        self.sge[self.n] = local;
        self.wr[self.n] = ibv_send_wr::new(wr_id, std::ptr::null_mut(), opcode, flags, remote.offset, remote.handle);
        self.n += 1;
    }

    /// `ibv_post_send` of the whole batch; its return code.
    fn post(&mut self, qp: *mut c_void) -> libc::c_int {
        if self.n == 0 {
            return 0;
        }
        for i in 0..self.n {
            self.wr[i].sg_list = &mut self.sge[i];
            self.wr[i].next = if i + 1 < self.n { &mut self.wr[i + 1] } else { std::ptr::null_mut() };
        }
        unsafe { verbs::post_send(qp, &mut self.wr[0]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip() {
        let id = wr_id(0xbeef, 513, KIND_READ, 0x12_3456);
        assert_eq!(wr_parts(id), (0xbeef, 513, KIND_READ, 0x12_3456));
    }

    #[test]
    fn spread_over_segments() {
        let segs = [Segment { handle: 1, length: 4096, offset: 100 }, Segment { handle: 2, length: 8192, offset: 200 }];
        let w: Vec<_> = spread(1000, 5000, &segs).collect();
        assert_eq!(w, vec![(1000, 4096, segs[0]), (5096, 904, segs[1])]);
        assert_eq!(spread(1000, 0, &segs).count(), 0);
    }
}
