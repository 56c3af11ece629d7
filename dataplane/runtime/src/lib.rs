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

thread_local! {
    /// The core whose loop runs on this thread (`Loop::run`).
    static OWN_CORE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    /// A completion was posted to this thread's own core's mailbox without
    /// a wake-up: the loop takes it before it sleeps (`take_own_mail`).
    static OWN_MAIL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Mark this thread as core `core`'s loop.
pub(crate) fn set_own_core(core: usize) {
    OWN_CORE.with(|c| c.set(Some(core)));
}

/// Whether a completion reached this thread's own mailbox unannounced
/// since the last call (and forget it).
pub(crate) fn take_own_mail() -> bool {
    OWN_MAIL.with(|m| m.replace(false))
}

impl Mailboxes {
    /// Hand a parked call's completion to its core (any thread). From the
    /// core's own loop (a device completion it reaped, a backend that
    /// answered inline) there is no eventfd write: the loop takes it in
    /// the same turn, without a wake-up and a second turn for it.
    pub(crate) fn complete(&self, core: usize, c: Completed) {
        let mut q = self.boxes[core].done.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = q.is_empty();
        q.push(c);
        drop(q);
        if OWN_CORE.with(|o| o.get()) == Some(core) {
            OWN_MAIL.with(|m| m.set(true));
        } else if was_empty {
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
    /// CPUs to pin the loops to: loop `i` runs only on `cpus[i % len]`.
    /// Empty: the loops float (the scheduler places them). A loop polls
    /// while busy, so two loops the scheduler stacks on one CPU take
    /// turns of whole time slices (milliseconds) while another CPU runs
    /// something else; pinned, each keeps its own CPU.
    pub cpus: Vec<usize>,
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
            cpus: Vec::new(),
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

/// Let a loop's thread run only on `cpu` (set from the spawning thread, so
/// a refusal, e.g. a CPU outside the process's cpuset, fails the start).
fn pin(t: &JoinHandle<()>, cpu: usize) -> io::Result<()> {
    use std::os::unix::thread::JoinHandleExt;
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET is given a CPU
    // below CPU_SETSIZE (checked by `Server::start`); the pthread is alive
    // (its JoinHandle is held and not joined).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::pthread_setaffinity_np(t.as_pthread_t(), std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    match rc {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// The CPUs this process may run on (its affinity mask), ascending: what a
/// caller pins loops to when it was not told which CPUs to use.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is valid; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
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
        if let Some(&cpu) = cfg.cpus.iter().find(|&&c| c >= libc::CPU_SETSIZE as usize) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpu {cpu} out of range (0..{})", libc::CPU_SETSIZE),
            ));
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
            let t = std::thread::Builder::new().name(format!("chimera-core-{core}")).spawn(move || {
                if deferred {
                    // The loop's thread becomes the ring's one issuer.
                    if let Err(e) = ring.submitter().register_enable_rings() {
                        eprintln!("chimera-core-{core}: cannot enable its io_uring: {e}");
                        return;
                    }
                }
                conn::Loop::new(core, ring, listeners, shared, deferred).run()
            })?;
            let pinned = match cfg.cpus.len() {
                0 => Ok(()),
                n => pin(&t, cfg.cpus[core % n]),
            };
            threads.push(t);
            if let Err(e) = pinned {
                let cpu = cfg.cpus[core % cfg.cpus.len()];
                Server { threads, stop, addrs, mail }.shutdown();
                return Err(io::Error::new(e.kind(), format!("cannot pin core {core} to cpu {cpu}: {e}")));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: &OwnedFd) -> bool {
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// A completion a core posts to its own mailbox (a device completion
    /// its loop reaped) is taken in the same turn: no eventfd write, the
    /// loop told through `take_own_mail`. Another thread's wakes the core.
    #[test]
    fn a_cores_own_completion_does_not_wake_it_another_threads_does() {
        let mail = Arc::new(Mailboxes {
            boxes: (0..2)
                .map(|_| Mailbox { queue: Mutex::new(VecDeque::new()), done: Mutex::new(Vec::new()), efd: sys::eventfd().unwrap() })
                .collect(),
            stop: Arc::new(AtomicBool::new(false)),
            record_bytes_max: 1 << 20,
        });
        let m = mail.clone();
        std::thread::spawn(move || {
            set_own_core(0);
            m.complete(0, (1, 1, None));
            assert!(!readable(&m.boxes[0].efd), "its own completion wrote no eventfd");
            assert!(take_own_mail(), "the loop is told to take it");
            assert!(!take_own_mail(), "once");
            assert_eq!(m.boxes[0].done.lock().unwrap().len(), 1);
            // Core 0's thread completing a call of core 1 wakes core 1.
            m.complete(1, (2, 1, None));
            assert!(readable(&m.boxes[1].efd));
            assert!(!take_own_mail());
        })
        .join()
        .unwrap();
        // A thread that is no core's loop (a worker): core 0 is woken now
        // that its mailbox was emptied.
        mail.boxes[0].done.lock().unwrap().clear();
        mail.complete(0, (3, 1, None));
        assert!(readable(&mail.boxes[0].efd), "a worker's completion wakes the core");
    }
}
