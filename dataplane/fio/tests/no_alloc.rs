//! The engine allocates nothing per I/O once warm (issue: "no allocation
//! per I/O"): 4 KiB random reads and writes at depth 32 over two
//! connections, driven through the C ABI exactly as engine.c calls it
//! (queue, commit, reap), against an in-process chimerad. A counting
//! allocator counts this thread's allocations only (the server's run on
//! its own threads). Once warm, what may still allocate is a reply buffer
//! when more replies than ever before are out at once on a connection (a
//! new high-water mark, kept for reuse afterwards: `client::rpc`'s spare
//! buffers, bounded by the calls in flight and 16 MiB): a handful in tens
//! of thousands of I/Os, never one per I/O. Before this test the engine
//! allocated once per I/O (an error message built for every call) and the
//! spare buffers (16) were fewer than a depth of 32 returns at once.

use chimera_fio::capi::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::CString;
mod common;

struct Counting;
thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|a| a.get())
}

const DEPTH: usize = 32;
const BS: usize = 4096;
const BLOCKS: u64 = 1024;

/// Keep `DEPTH` I/Os in flight until `total` are done: (op 0 read / 1
/// write) alternating by a fixed pseudo-random walk over the file's blocks.
/// Every result must be BS bytes.
unsafe fn run(h: *mut ChimeraFio, file: i32, bufs: &mut [Vec<u8>], total: usize, seed: &mut u64, free: &mut Vec<usize>) {
    let mut err = [0 as std::ffi::c_char; 256];
    let mut tags = [0u64; DEPTH];
    let mut results = [0i64; DEPTH];
    free.clear();
    free.extend(0..DEPTH);
    let (mut queued, mut done) = (0, 0);
    while done < total {
        while queued < total && !free.is_empty() {
            let slot = free.pop().unwrap();
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let block = (*seed >> 33) % BLOCKS;
            let op = ((*seed >> 20) & 1) as i32;
            let rc = chimera_fio_queue(h, file, op, block * BS as u64, bufs[slot].as_mut_ptr().cast(), BS as u64, slot as u64, err.as_mut_ptr(), err.len());
            assert_eq!(rc, 0, "queue: {:?}", std::ffi::CStr::from_ptr(err.as_ptr()));
            queued += 1;
        }
        assert_eq!(chimera_fio_commit(h), 0);
        let n = chimera_fio_reap(h, 1, DEPTH as u32, 10_000_000_000, tags.as_mut_ptr(), results.as_mut_ptr());
        assert!(n > 0, "no completion within 10 s");
        for k in 0..n as usize {
            assert_eq!(results[k], BS as i64, "I/O {} answered {}", tags[k], results[k]);
            free.push(tags[k] as usize);
        }
        done += n as usize;
    }
}

#[test]
fn reads_and_writes_at_depth_allocate_nothing_per_io() {
    let s = common::start_memfs();
    let server = CString::new(s.nfs_addr.unwrap().to_string()).unwrap();
    let export = CString::new("/m").unwrap();
    let cfg = ChimeraFioConfig {
        server: server.as_ptr(),
        export: export.as_ptr(),
        mount_port: 0,
        conns: 2,
        iodepth: DEPTH as u32,
        uid: 0,
        gid: 0,
        pnfs: 0,
        busy_poll_us: 0,
        retry_s: 60,
        hold_mib: chimera_fio::HOLD_MIB_DEFAULT,
        transport: c"tcp".as_ptr(),
    };
    let mut err = [0 as std::ffi::c_char; 256];
    unsafe {
        let h = chimera_fio_connect(&cfg, err.as_mut_ptr(), err.len());
        assert!(!h.is_null(), "connect: {:?}", std::ffi::CStr::from_ptr(err.as_ptr()));
        let path = CString::new("noalloc.0").unwrap();
        let file = chimera_fio_open(h, path.as_ptr(), 1, err.as_mut_ptr(), err.len());
        assert!(file >= 0, "open: {:?}", std::ffi::CStr::from_ptr(err.as_ptr()));
        let mut bufs: Vec<Vec<u8>> = (0..DEPTH).map(|k| vec![k as u8; BS]).collect();
        let mut seed = 7u64;
        // Lay the file out (every block written once), then warm up: the
        // connections' buffers, maps and spare reply buffers reach their
        // working size.
        for b in 0..BLOCKS {
            let rc = chimera_fio_queue(h, file, 1, b * BS as u64, bufs[0].as_mut_ptr().cast(), BS as u64, 0, err.as_mut_ptr(), err.len());
            assert_eq!(rc, 0);
            assert_eq!(chimera_fio_commit(h), 0);
            let (mut t, mut r) = (0u64, 0i64);
            assert_eq!(chimera_fio_reap(h, 1, 1, 10_000_000_000, &mut t, &mut r), 1);
            assert_eq!(r, BS as i64);
        }
        let mut free = Vec::with_capacity(DEPTH);
        run(h, file, &mut bufs, 20_000, &mut seed, &mut free);
        let before = allocs();
        const MEASURED: usize = 40_000;
        run(h, file, &mut bufs, MEASURED, &mut seed, &mut free);
        let n = allocs() - before;
        println!("{MEASURED} I/Os at depth {DEPTH}: {n} allocations on the engine's thread");
        assert!(n * 1000 < MEASURED as u64, "{n} allocations in {MEASURED} I/Os: the engine's I/O path allocates per I/O");
        assert_eq!(chimera_fio_close(h, file, err.as_mut_ptr(), err.len()), 0);
        chimera_fio_free(h);
    }
    drop(s);
}
