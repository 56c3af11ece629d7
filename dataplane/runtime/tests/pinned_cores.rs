//! Proves `Config::cpus`: loop `i` runs only on `cpus[i % len]` once
//! `Server::start` returns, an empty list leaves the loops the process's
//! whole affinity, and a CPU the process may not use (or one past
//! CPU_SETSIZE) fails the start with an error naming the core and the CPU.

use rpc::{Dispatcher, Limits};
use std::sync::{Arc, Mutex};

fn affinity(tid: libc::pid_t) -> Vec<usize> {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Start `cores` loops pinned to `cpus`; the thread id of each loop.
fn start(cores: usize, cpus: Vec<usize>) -> std::io::Result<(runtime::Server, Vec<(usize, libc::pid_t)>)> {
    let tids = Arc::new(Mutex::new(Vec::new()));
    let t2 = tids.clone();
    let hook = runtime::CoreHook(Arc::new(move |core: usize| {
        t2.lock().unwrap().push((core, unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t));
    }));
    let limits = Limits::default();
    let cfg = runtime::Config {
        cores,
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        limits,
        on_core_start: Some(hook),
        cpus,
        ..Default::default()
    };
    let s = runtime::Server::start(cfg, Arc::new(Dispatcher::new(limits)))?;
    for _ in 0..200 {
        if tids.lock().unwrap().len() == cores {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut t = tids.lock().unwrap().clone();
    t.sort();
    assert_eq!(t.len(), cores, "every loop started");
    Ok((s, t))
}

#[test]
fn loops_run_on_their_cpus_and_refused_cpus_fail_the_start() {
    let allowed = runtime::allowed_cpus().unwrap();
    assert!(!allowed.is_empty());
    // Unpinned: each loop may run wherever the process may.
    let (s, tids) = start(2, Vec::new()).unwrap();
    for &(_, tid) in &tids {
        assert_eq!(affinity(tid), allowed);
    }
    s.shutdown();
    // Three loops over the allowed CPUs taken in reverse: loop i on cpus[i % n].
    let cpus: Vec<usize> = allowed.iter().rev().copied().collect();
    let (s, tids) = start(3, cpus.clone()).unwrap();
    for &(core, tid) in &tids {
        assert_eq!(affinity(tid), vec![cpus[core % cpus.len()]], "core {core}");
    }
    s.shutdown();
    // A CPU this process may not use: the start fails and says which.
    let outside = (0..1000).find(|c| !allowed.contains(c)).unwrap();
    let e = start(2, vec![allowed[0], outside]).err().expect("a CPU outside the affinity mask is refused");
    assert!(e.to_string().contains(&format!("cannot pin core 1 to cpu {outside}")), "{e}");
    let e = start(1, vec![1 << 20]).err().expect("a CPU past CPU_SETSIZE is refused");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("cpu 1048576 out of range"), "{e}");
}
