//! Threads for the MDS's proxied data-server I/O (`PnfsVfs`), so that a
//! READ or WRITE through the MDS never blocks a core's loop: the core parks
//! the call (`vfs::Later`), a worker here does the blocking NFSv3 round
//! trips (each bounded by `ds_timeout_ms`) and completes it, and the reply
//! leaves from the core when the completion comes back.
//!
//! Bounded: `IO_THREADS` workers and `IO_QUEUE_MAX` queued jobs. A job that
//! finds the queue full runs on the caller's thread (still completed through
//! its `Done`): back-pressure by slowing that core down, never by growing.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Workers: each waits on at most one data server at a time.
pub const IO_THREADS: usize = 4;
/// Jobs waiting for a worker.
pub const IO_QUEUE_MAX: usize = 1024;

pub(crate) type Job = Box<dyn FnOnce() + Send>;

pub(crate) struct IoPool {
    tx: SyncSender<Job>,
}

impl IoPool {
    pub(crate) fn start() -> Result<IoPool, String> {
        let (tx, rx) = mpsc::sync_channel::<Job>(IO_QUEUE_MAX);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..IO_THREADS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("pnfs-io-{i}"))
                .spawn(move || worker(rx))
                .map_err(|e| format!("pnfs: cannot start an I/O thread: {e}"))?;
        }
        Ok(IoPool { tx })
    }

    /// Run `job` on a worker; when every worker is busy and the queue is
    /// full (or the pool is gone), on this thread.
    pub(crate) fn run(&self, job: Job) {
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => job(),
        }
    }
}

/// Workers stop when the pool (its sender) is dropped.
fn worker(rx: Arc<Mutex<Receiver<Job>>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.recv()
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}
