//! Worker threads for backends whose operations wait (a remote data server,
//! a device), so that a parked READ, WRITE or COMMIT never blocks a core's
//! loop: the core parks the call (`Later`), a worker here does the waiting
//! and completes it, and the reply leaves from the core when the completion
//! comes back. Used by the pNFS MDS's proxied I/O and by diskfs.
//!
//! Bounded: a fixed number of workers and `IO_QUEUE_MAX` queued jobs. A job
//! that finds the queue full runs on the caller's thread (still completed
//! through its `Done`): back-pressure by slowing that core down, never by
//! growing.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Jobs waiting for a worker.
pub const IO_QUEUE_MAX: usize = 1024;

pub type Job = Box<dyn FnOnce() + Send>;

pub struct IoPool {
    tx: SyncSender<Job>,
}

impl IoPool {
    /// `threads` workers named `<name>-<i>`.
    pub fn start(name: &str, threads: usize) -> Result<IoPool, String> {
        let (tx, rx) = mpsc::sync_channel::<Job>(IO_QUEUE_MAX);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || worker(rx))
                .map_err(|e| format!("{name}: cannot start an I/O thread: {e}"))?;
        }
        Ok(IoPool { tx })
    }

    /// Run `job` on a worker; when every worker is busy and the queue is
    /// full (or the pool is gone), on this thread.
    pub fn run(&self, job: Job) {
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => job(),
        }
    }

    /// Queue `job` for a worker, or drop it and return false when the queue
    /// is full (or the pool is gone): for work whose caller must not wait.
    pub fn try_run(&self, job: Job) -> bool {
        self.tx.try_send(job).is_ok()
    }
}

/// The job of a parked READ: `read` fills a fresh buffer of `len` bytes on
/// the worker, and what it read (with end of file) completes `done` as
/// [`crate::IoDone::Read`].
pub fn read_job(
    len: usize,
    done: crate::Done,
    read: impl FnOnce(&mut [u8]) -> crate::VfsResult<(usize, bool)> + Send + 'static,
) -> Job {
    Box::new(move || {
        let mut data = vec![0u8; len];
        let r = read(&mut data).map(|(n, eof)| {
            data.truncate(n);
            crate::IoDone::Read { data, eof }
        });
        done(r)
    })
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
