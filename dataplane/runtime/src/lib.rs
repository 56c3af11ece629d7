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

mod conn;
mod sys;

use rpc::Dispatcher;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

#[derive(Debug, Clone)]
pub struct Config {
    /// Event loops (threads), each pinned to its own connections.
    pub cores: usize,
    /// Addresses to listen on; every registered program is served on each.
    pub listen: Vec<SocketAddr>,
    pub limits: rpc::Limits,
    /// How long a loop keeps polling after its last event before sleeping.
    pub poll_spin_us: u64,
    /// Submission queue entries per ring.
    pub ring_entries: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cores: 1,
            listen: vec![],
            limits: rpc::Limits::default(),
            poll_spin_us: 20,
            ring_entries: 1024,
        }
    }
}

/// A running server; dropping it without `shutdown` leaves the loops running.
pub struct Server {
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    addrs: Vec<SocketAddr>,
}

pub(crate) struct Shared {
    pub dispatcher: Arc<Dispatcher>,
    pub stop: Arc<AtomicBool>,
    pub conns_open: AtomicUsize,
    pub next_conn_id: std::sync::atomic::AtomicU64,
    pub cfg: Config,
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
        let shared = Arc::new(Shared {
            dispatcher,
            stop: stop.clone(),
            conns_open: AtomicUsize::new(0),
            next_conn_id: std::sync::atomic::AtomicU64::new(1),
            cfg: cfg.clone(),
        });
        let mut threads = Vec::new();
        for (core, listeners) in per_core.into_iter().enumerate() {
            let shared = shared.clone();
            let ring = io_uring::IoUring::builder().build(cfg.ring_entries)?;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("chimera-core-{core}"))
                    .spawn(move || conn::Loop::new(core, ring, listeners, shared).run())?,
            );
        }
        Ok(Server { threads, stop, addrs })
    }

    /// The addresses actually bound (port 0 resolved), in `listen` order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Stop accepting, close connections and join the loops.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}
