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

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

/// Jobs waiting for a worker.
pub const IO_QUEUE_MAX: usize = 1024;

pub type Job = Box<dyn FnOnce() + Send>;

/// The queue the workers share: a job wakes one idle worker (a condition
/// variable's `notify_one`), and only that one — no second hand-off as a
/// mutex-guarded receiver costs (the worker holding it wakes for the job,
/// then the next waiter wakes to take the receiver).
struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
}

struct Queue {
    jobs: VecDeque<Job>,
    /// The pool was dropped: workers finish what is queued, then stop.
    closed: bool,
}

pub struct IoPool {
    shared: Arc<Shared>,
}

impl IoPool {
    /// `threads` workers named `<name>-<i>`.
    pub fn start(name: &str, threads: usize) -> Result<IoPool, String> {
        let shared = Arc::new(Shared { q: Mutex::new(Queue { jobs: VecDeque::with_capacity(64), closed: false }), cv: Condvar::new() });
        for i in 0..threads.max(1) {
            let sh = shared.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || worker(&sh))
                .map_err(|e| format!("{name}: cannot start an I/O thread: {e}"))?;
        }
        Ok(IoPool { shared })
    }

    /// Queue `job` unless `IO_QUEUE_MAX` are waiting; gives it back if not.
    fn push(&self, job: Job) -> Result<(), Job> {
        let mut q = self.shared.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.jobs.len() >= IO_QUEUE_MAX {
            return Err(job);
        }
        q.jobs.push_back(job);
        drop(q);
        self.shared.cv.notify_one();
        Ok(())
    }

    /// Run `job` on a worker; when every worker is busy and the queue is
    /// full, on this thread.
    pub fn run(&self, job: Job) {
        if let Err(job) = self.push(job) {
            job()
        }
    }

    /// Queue `job` for a worker, or drop it and return false when the queue
    /// is full: for work whose caller must not wait.
    pub fn try_run(&self, job: Job) -> bool {
        self.push(job).is_ok()
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.shared.q.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.shared.cv.notify_all();
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

/// Workers stop when the pool is dropped, once the queue is empty.
fn worker(sh: &Shared) {
    loop {
        let job = {
            let mut q = sh.q.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    break job;
                }
                if q.closed {
                    return;
                }
                q = sh.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        job();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn jobs_run_on_the_workers_and_a_full_queue_runs_on_the_caller() {
        let pool = IoPool::start("t-io", 2).unwrap();
        let here = std::thread::current().id();
        // Both workers held until released.
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_rx = Arc::new(Mutex::new(go_rx));
        let (started_tx, started_rx) = mpsc::channel();
        for _ in 0..2 {
            let (g, s) = (go_rx.clone(), started_tx.clone());
            pool.run(Box::new(move || {
                s.send(std::thread::current().id()).unwrap();
                let _ = g.lock().unwrap().recv();
            }));
        }
        for _ in 0..2 {
            assert_ne!(started_rx.recv_timeout(Duration::from_secs(10)).unwrap(), here, "a worker runs it");
        }
        // The queue fills; the next job runs here, the one after is refused.
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..IO_QUEUE_MAX {
            let r = ran.clone();
            assert!(pool.try_run(Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            })));
        }
        let (tx, rx) = mpsc::channel();
        pool.run(Box::new(move || tx.send(std::thread::current().id()).unwrap()));
        assert_eq!(rx.try_recv().unwrap(), here, "a full queue runs the job on the caller");
        assert!(!pool.try_run(Box::new(|| {})), "try_run refuses when full");
        go_tx.send(()).unwrap();
        go_tx.send(()).unwrap();
        // Dropping the pool lets the workers finish what is queued.
        drop(pool);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while ran.load(Ordering::SeqCst) < IO_QUEUE_MAX {
            assert!(std::time::Instant::now() < until, "queued jobs ran: {}", ran.load(Ordering::SeqCst));
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
