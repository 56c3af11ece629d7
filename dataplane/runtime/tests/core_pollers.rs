//! Proves the hook another transport uses to run on the core loops
//! (`Config::on_core_start`, `rpc::poller::Poller::wake_fds` /
//! `before_sleep`): the hook runs once on every loop's thread, a poller it
//! registers there is told before each sleep, and a sleeping loop wakes
//! for its wake descriptor as soon as it becomes readable — not at the
//! loop's 100 ms idle recheck. The RDMA server's shards stand on this.

use rpc::poller::Poller;
use rpc::{Dispatcher, Limits};
use std::cell::RefCell;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One pipe per core: the test writes a byte, the core's poller reads it.
struct PipeWaker {
    rd: RawFd,
    core: usize,
    seen: Arc<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Nanoseconds since `epoch` at which a byte was taken, per core.
    taken_at: [AtomicU64; 2],
    taken: [AtomicUsize; 2],
    before_sleep: AtomicUsize,
    threads: Mutex<Vec<(usize, String)>>,
}

impl Poller for PipeWaker {
    fn poll(&mut self) -> usize {
        let mut b = [0u8; 16];
        let n = unsafe { libc::read(self.rd, b.as_mut_ptr() as *mut libc::c_void, b.len()) };
        if n > 0 {
            let now = START.get().unwrap().elapsed().as_nanos() as u64;
            self.seen.taken_at[self.core].store(now, SeqCst);
            self.seen.taken[self.core].fetch_add(n as usize, SeqCst);
            return 1;
        }
        0
    }
    fn busy(&self) -> bool {
        false
    }
    fn notify_fds(&self, _out: &mut Vec<RawFd>) {}
    fn wake_fds(&self, out: &mut Vec<RawFd>) {
        out.push(self.rd);
    }
    fn before_sleep(&mut self) -> bool {
        self.seen.before_sleep.fetch_add(1, SeqCst);
        false
    }
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

#[test]
fn a_poller_registered_by_the_core_hook_wakes_a_sleeping_loop_at_once() {
    let start = *START.get_or_init(Instant::now);
    let seen = Arc::new(Seen::default());
    let mut pipes = Vec::new();
    for _ in 0..2 {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) }, 0);
        pipes.push(fds);
    }
    let rds: Vec<RawFd> = pipes.iter().map(|p| p[0]).collect();
    let s2 = seen.clone();
    let hook = runtime::CoreHook(Arc::new(move |core: usize| {
        s2.threads.lock().unwrap().push((core, std::thread::current().name().unwrap_or("").to_string()));
        let p = PipeWaker { rd: rds[core], core, seen: s2.clone() };
        assert!(rpc::poller::register(Rc::new(RefCell::new(p))), "a core loop's thread takes pollers");
    }));
    let limits = Limits::default();
    let d = Dispatcher::new(limits);
    let cfg = runtime::Config {
        cores: 2,
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        limits,
        on_core_start: Some(hook),
        ..Default::default()
    };
    let s = runtime::Server::start(cfg, Arc::new(d)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut threads = seen.threads.lock().unwrap().clone();
    threads.sort();
    assert_eq!(
        threads,
        vec![(0, "chimera-core-0".to_string()), (1, "chimera-core-1".to_string())],
        "the hook runs once on each loop's own thread"
    );
    assert!(seen.before_sleep.load(SeqCst) >= 2, "idle loops tell their pollers before they sleep");
    // Each write lands while the loop sleeps (150 ms apart: past the poll
    // spin). Without a wake poll the loop would find the byte at its next
    // 100 ms idle recheck: a median latency of ~50 ms.
    let mut lat = Vec::new();
    for i in 0..18 {
        let core = i % 2;
        std::thread::sleep(Duration::from_millis(150));
        let before = seen.taken[core].load(SeqCst);
        let sent = start.elapsed().as_nanos() as u64;
        assert_eq!(unsafe { libc::write(pipes[core][1], b"x".as_ptr() as *const libc::c_void, 1) }, 1);
        let deadline = Instant::now() + Duration::from_secs(2);
        while seen.taken[core].load(SeqCst) == before {
            assert!(Instant::now() < deadline, "core {core} never polled its poller after the write");
            std::thread::sleep(Duration::from_micros(200));
        }
        lat.push(seen.taken_at[core].load(SeqCst).saturating_sub(sent));
    }
    lat.sort();
    let median = Duration::from_nanos(lat[lat.len() / 2]);
    println!("wake latency: median {median:?}, max {:?}", Duration::from_nanos(*lat.last().unwrap()));
    assert!(median < Duration::from_millis(15), "a sleeping loop wakes for its poller's descriptor (median {median:?})");
    s.shutdown();
    for p in pipes {
        unsafe {
            libc::close(p[0]);
            libc::close(p[1]);
        }
    }
}
