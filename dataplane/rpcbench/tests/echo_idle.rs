//! Proves that an idle echo connection costs nothing while the server under
//! test is measured: `compare` keeps its echo connection open during the
//! server's rounds, and an echo thread that woke on a timer (it napped up to
//! 1 ms at a time) ran a thousand times a second on the two shared CPUs and
//! raised the server's measured p50 by ~20 %. Here the echo thread, once
//! idle, must not run at all; it must still answer the next call at once,
//! and it must end when its client hangs up.
//!
//! Its own test binary: it counts the context switches of the one echo
//! thread in this process.

use rpcbench::*;
use std::time::{Duration, Instant};

/// (tid, voluntary + involuntary context switches) of every "echo-conn" thread.
fn echo_threads() -> Vec<(String, u64)> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = e.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != "echo-conn" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let switches: u64 = status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        out.push((dir.file_name().unwrap().to_string_lossy().into_owned(), switches));
    }
    out
}

#[test]
fn an_idle_echo_connection_sleeps_until_the_next_call() {
    let srv = EchoServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut c = EchoClient::connect(srv.addr()).unwrap();
    assert_eq!(measure(&mut c, 10, 200, 0).unwrap().calls, 200);

    // Well past ECHO_SPIN: the thread has gone idle.
    std::thread::sleep(Duration::from_millis(100));
    let before = echo_threads();
    assert_eq!(before.len(), 1, "one echo connection thread expected, found {before:?}");
    std::thread::sleep(Duration::from_millis(300));
    let after = echo_threads();
    assert_eq!(after.len(), 1, "{after:?}");
    let woke = after[0].1 - before[0].1;
    assert!(woke <= 3, "the idle echo thread was switched in {woke} times in 300 ms; it must block until the next call");

    // Idle does not mean deaf: the next calls are answered.
    assert_eq!(measure(&mut c, 0, 50, 1 << 20).unwrap().calls, 50);

    // The client hangs up: the thread ends.
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !echo_threads().is_empty() {
        assert!(Instant::now() < deadline, "the echo thread outlived its connection");
        std::thread::sleep(Duration::from_millis(10));
    }
}
