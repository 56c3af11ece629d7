//! Thread-per-core event loops over io_uring.
//!
//! Each core runs one loop with its own ring, its own SO_REUSEPORT listening
//! socket per address (the kernel spreads connections across cores) and the
//! connections it accepted; nothing on the data path is shared between cores
//! except the backend. A loop drains a whole batch of completions before it
//! acts, then submits everything it queued with one syscall; it keeps polling
//! while busy and sleeps in the kernel when idle (an idle server burns no CPU).
//!
//! Memory per connection is fixed at accept time and bounded: one receive
//! buffer of `record_bytes_max` plus slack, and two reply buffers (one being
//! sent, one being filled) of twice `reply_bytes_max`. A connection stops
//! being read while its replies are not drained (`inflight_per_conn_max`, or
//! too little room for another reply), so a client that does not read its
//! replies cannot make the server grow.
//!
//! Server-initiated calls (the NFSv4.1 back channel) enter through
//! [`Server::sender`]: a control thread queues a record for a connection on
//! that connection's core (bounded, `OUTBOX_PER_CORE_MAX`) and wakes the
//! loop through an eventfd; the loop appends the record to the connection's
//! reply buffer between replies. REPLY records coming back are routed by the
//! dispatcher to its reply sink; every connection close is reported to it.

mod buf;
mod conn;
mod sys;

use rpc::backchannel::{CallSender, SendError};
use rpc::Dispatcher;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Server-initiated records waiting for their core, per core. A full
/// outbox refuses (`SendError::QueueFull`): callers retry or time out.
pub const OUTBOX_PER_CORE_MAX: usize = 1024;
/// Low bits of a conn_id name the core owning the connection, so a record
/// for it reaches the right loop without a shared table.
pub(crate) const CONN_CORE_BITS: u32 = 8;
const _: () = assert!(rpc::metrics::CORES_MAX <= 1 << CONN_CORE_BITS);

/// A parked call's completion on its way back to its core: the park table
/// index and generation, and the payload (`None`: cancelled).
pub(crate) type Completed = (usize, u32, Option<rpc::park::Payload>);

/// One core's incoming server-initiated records, the completions of its
/// parked calls, and its wake-up eventfd.
pub(crate) struct Mailbox {
    pub queue: Mutex<VecDeque<(u64, Vec<u8>)>>,
    /// Bounded by the core's park table (one entry per parked call).
    pub done: Mutex<Vec<Completed>>,
    pub efd: OwnedFd,
}

pub(crate) struct Mailboxes {
    pub boxes: Vec<Mailbox>,
    pub stop: Arc<AtomicBool>,
    pub record_bytes_max: usize,
}

impl Mailboxes {
    /// Hand a parked call's completion to its core (any thread).
    pub(crate) fn complete(&self, core: usize, c: Completed) {
        let mut q = self.boxes[core].done.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = q.is_empty();
        q.push(c);
        drop(q);
        if was_empty {
            self.wake(core);
        }
    }

    pub(crate) fn wake(&self, core: usize) {
        let one: u64 = 1;
        // An eventfd write only fails when the counter would overflow,
        // which means a wake-up is pending anyway.
        let _ = unsafe { libc::write(self.boxes[core].efd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }
}

/// The transport side of `rpc::backchannel::CallSender` (see `Server::sender`).
struct Outbox(Arc<Mailboxes>);

impl CallSender for Outbox {
    fn send(&self, conn_id: u64, record: Vec<u8>) -> Result<(), SendError> {
        let m = &self.0;
        if m.stop.load(Ordering::Relaxed) {
            return Err(SendError::Stopped);
        }
        if record.len() > m.record_bytes_max {
            return Err(SendError::TooLarge);
        }
        let core = (conn_id & ((1 << CONN_CORE_BITS) - 1)) as usize;
        let Some(b) = m.boxes.get(core) else { return Err(SendError::NoConnection) };
        let mut q = b.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= OUTBOX_PER_CORE_MAX {
            return Err(SendError::QueueFull);
        }
        let was_empty = q.is_empty();
        q.push_back((conn_id, record));
        drop(q);
        if was_empty {
            m.wake(core);
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Event loops (threads), each pinned to its own connections.
    pub cores: usize,
    /// Addresses to listen on; every registered program is served on each.
    pub listen: Vec<SocketAddr>,
    pub limits: rpc::Limits,
    /// How long a loop keeps polling after its last event before sleeping.
    pub poll_spin_us: u64,
    /// How long a loop keeps polling while a backend's device operations
    /// are in flight (`rpc::poller`) before it sleeps on their notify
    /// descriptors; 0: it sleeps at once. Polling takes a flash read's
    /// reply off the wake-up path (lower latency at low queue depth) and
    /// costs the CPU it spins.
    pub device_poll_us: u64,
    /// Submission queue entries per ring.
    pub ring_entries: u32,
    /// Run on each loop's thread (with its core index) before it serves:
    /// another transport registers its per-core share there as an
    /// `rpc::poller::Poller` (the RDMA server's shards).
    pub on_core_start: Option<CoreHook>,
}

/// See `Config::on_core_start`.
#[derive(Clone)]
pub struct CoreHook(pub Arc<dyn Fn(usize) + Send + Sync>);

impl std::fmt::Debug for CoreHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoreHook")
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cores: 1,
            listen: vec![],
            limits: rpc::Limits::default(),
            poll_spin_us: 20,
            device_poll_us: 0,
            ring_entries: 1024,
            on_core_start: None,
        }
    }
}

/// A ring for one event loop. Where the kernel has them (6.1 on), completion
/// work is deferred to the loop itself (`DEFER_TASKRUN`, one issuer, a flag
/// in the shared ring saying work is pending): no interrupt of the loop per
/// completion, the work runs in batches when the loop asks, and a polling
/// loop can see new work without a system call. The ring starts disabled
/// and the loop's thread enables it (the issuer is the enabling thread).
/// Older kernels get a plain ring. Returns the ring and whether it defers.
fn new_ring(entries: u32) -> std::io::Result<(io_uring::IoUring, bool)> {
    let deferred = io_uring::IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .setup_r_disabled()
        .build(entries);
    match deferred {
        Ok(r) => Ok((r, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((io_uring::IoUring::builder().build(entries)?, false)),
        Err(e) => Err(e),
    }
}

/// A running server; dropping it without `shutdown` leaves the loops running.
pub struct Server {
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    addrs: Vec<SocketAddr>,
    mail: Arc<Mailboxes>,
}

pub(crate) struct Shared {
    pub dispatcher: Arc<Dispatcher>,
    pub stop: Arc<AtomicBool>,
    pub conns_open: AtomicUsize,
    pub next_conn_id: std::sync::atomic::AtomicU64,
    pub cfg: Config,
    pub mail: Arc<Mailboxes>,
}

impl Server {
    /// Bind every address (once per core) and start the loops.
    pub fn start(cfg: Config, dispatcher: Arc<Dispatcher>) -> io::Result<Server> {
        if cfg.cores == 0 || cfg.cores > rpc::metrics::CORES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cores must be 1..={}, got {}", rpc::metrics::CORES_MAX, cfg.cores),
            ));
        }
        if cfg.listen.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no listen addresses"));
        }
        // Bind core 0's sockets first so that port 0 resolves once and every
        // other core joins the same port.
        let mut per_core: Vec<Vec<OwnedFd>> = (0..cfg.cores).map(|_| Vec::new()).collect();
        let mut addrs = Vec::new();
        for want in &cfg.listen {
            let first = sys::listen_reuseport(want)?;
            let actual = sys::local_addr(first.as_raw_fd())?;
            addrs.push(actual);
            per_core[0].push(first);
            for c in per_core.iter_mut().skip(1) {
                c.push(sys::listen_reuseport(&actual)?);
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut boxes = Vec::with_capacity(cfg.cores);
        for _ in 0..cfg.cores {
            boxes.push(Mailbox { queue: Mutex::new(VecDeque::new()), done: Mutex::new(Vec::new()), efd: sys::eventfd()? });
        }
        // A server-initiated record goes into a connection's reply buffer.
        let record_bytes_max = cfg.limits.reply_bytes_max;
        let mail = Arc::new(Mailboxes { boxes, stop: stop.clone(), record_bytes_max });
        let shared = Arc::new(Shared {
            dispatcher,
            stop: stop.clone(),
            conns_open: AtomicUsize::new(0),
            next_conn_id: std::sync::atomic::AtomicU64::new(1),
            cfg: cfg.clone(),
            mail: mail.clone(),
        });
        let mut threads = Vec::new();
        for (core, listeners) in per_core.into_iter().enumerate() {
            let shared = shared.clone();
            let (ring, deferred) = new_ring(cfg.ring_entries)?;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("chimera-core-{core}"))
                    .spawn(move || {
                        if deferred {
                            // The loop's thread becomes the ring's one issuer.
                            if let Err(e) = ring.submitter().register_enable_rings() {
                                eprintln!("chimera-core-{core}: cannot enable its io_uring: {e}");
                                return;
                            }
                        }
                        conn::Loop::new(core, ring, listeners, shared, deferred).run()
                    })?,
            );
        }
        Ok(Server { threads, stop, addrs, mail })
    }

    /// Queue server-initiated records (back-channel calls) on a connection
    /// named by its `rpc::ConnInfo::conn_id`. Never blocks.
    pub fn sender(&self) -> Arc<dyn CallSender> {
        Arc::new(Outbox(self.mail.clone()))
    }

    /// The addresses actually bound (port 0 resolved), in `listen` order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Stop accepting, close connections and join the loops.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        for core in 0..self.mail.boxes.len() {
            self.mail.wake(core);
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}
