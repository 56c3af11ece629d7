//! Proves the data path allocates nothing per call: after warm-up, thousands
//! of NFSv3 READ and WRITE calls (to already-allocated file ranges) go through
//! the RPC dispatcher — header parsing, program dispatch, argument decoding,
//! the backend, reply encoding, metrics — with zero heap allocations on the
//! calling thread, counted by a global allocator wrapper.

use nfs3::Nfs3Program;
use proto::nfs3::*;
use proto::xdr::{to_vec, Encoder};
use rpc::{ConnInfo, Dispatcher, Limits, Outcome};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use vfs::memfs::{MemFs, MemFsConfig};
use vfs::{CreateMode, Cred, NodeKind, Vfs};

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

/// A complete RPC call record body (no record mark) with AUTH_SYS.
fn call(xid: u32, proc_num: u32, args: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [xid, 0, 2, NFS_PROGRAM, NFS_V3, proc_num, 1, 24, 0, 4, u32::from_be_bytes(*b"test"), 0, 0, 0, 0, 0] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v.extend_from_slice(args);
    v
}

#[test]
fn read_and_write_allocate_nothing_per_call() {
    run(|_, _| None);
}

/// The export access check (rules walked, the credential squashed) adds
/// no allocation either.
#[test]
fn read_and_write_under_access_rules_allocate_nothing_per_call() {
    use vfs::clients::{AccessTable, AccessType, Net, Rule, Squash};
    let t = AccessTable::new();
    let rule = |c: &str, access| Rule {
        clients: vec![Net::parse("fd00::/8").unwrap(), Net::parse(c).unwrap()],
        access,
        squash: Squash::RootSquash,
        anon_uid: 65534,
        anon_gid: 65534,
    };
    t.set(1, Some(vec![rule("10.0.0.0/8", AccessType::None), rule("127.0.0.0/8", AccessType::ReadWrite)]));
    t.set(2, Some(vec![rule("*", AccessType::None)]));
    let t = Arc::new(t);
    run(|_, _| Some(t));
}

/// Nor do a volume's own rules: the backend is asked which volume the
/// handle is in, and the volume's rules are walked, on every call.
#[test]
fn read_and_write_under_volume_rules_allocate_nothing_per_call() {
    use vfs::clients::{AccessTable, AccessType, Net, Rule, Squash};
    let rule = |c: &str, access| Rule {
        clients: vec![Net::parse("fd00::/8").unwrap(), Net::parse(c).unwrap()],
        access,
        squash: Squash::RootSquash,
        anon_uid: 65534,
        anon_gid: 65534,
    };
    run(|fs, vol| {
        let t = AccessTable::with_volumes(fs.clone());
        t.set(1, Some(vec![rule("127.0.0.0/8", AccessType::ReadWrite)]));
        t.set_volume(1, vol, Some(vec![rule("10.0.0.0/8", AccessType::None), rule("127.0.0.0/8", AccessType::ReadWrite)])).unwrap();
        t.set_volume(1, vol + 1000, Some(vec![rule("*", AccessType::None)])).unwrap();
        Some(Arc::new(t))
    });
}

/// The file READ and WRITE use lives in a volume (directory `vol`, a quota
/// root); `access` makes the rules from the backend and the volume's inode.
fn run(access: impl FnOnce(&Arc<MemFs>, vfs::Ino) -> Option<Arc<vfs::clients::AccessTable>>) {
    let fs = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 64 << 20 }));
    let root = fs.root(1).unwrap();
    let (vol, _) = fs.create(&root, b"vol", NodeKind::Directory, 0o777, &Cred::ROOT, CreateMode::Guarded).unwrap();
    fs.set_quota(&vol, 32 << 20).unwrap();
    let (fh, _) = fs.create(&vol, b"f", NodeKind::File, 0o666, &Cred::ROOT, CreateMode::Guarded).unwrap();
    assert_eq!(fs.volume_of(&fh).unwrap(), Some(vol.ino));
    let access = access(&fs, vol.ino);
    fs.write(&fh, 0, &vec![1u8; 1 << 20], vfs::Stability::FileSync).unwrap();
    let limits = Limits::default();
    let mut d = Dispatcher::new(limits);
    let mut p = Nfs3Program::new(fs.clone());
    if let Some(a) = access {
        p = p.with_access(a);
    }
    d.register(Arc::new(p), "nfs3", &nfs3::PROC_NAMES);
    let conn = ConnInfo { conn_id: 1, peer: "127.0.0.1:9".parse().unwrap(), core: 0 };
    let fhb = fh.to_bytes();
    let data = vec![7u8; 4096];
    let reads: Vec<Vec<u8>> = (0..64u32)
        .map(|i| call(i, NFSPROC3_READ, &to_vec(&READ3args { file: nfs_fh3 { data: &fhb }, offset: (i as u64) * 4096, count: 4096 }).unwrap()))
        .collect();
    let writes: Vec<Vec<u8>> = (0..64u32)
        .map(|i| {
            let a = WRITE3args { file: nfs_fh3 { data: &fhb }, offset: (i as u64) * 8192, count: 4096, stable: stable_how::UNSTABLE, data: &data };
            call(1000 + i, NFSPROC3_WRITE, &to_vec(&a).unwrap())
        })
        .collect();
    let mut out = vec![0u8; limits.reply_bytes_max];
    // Warm up (metrics registration, lazily initialised statics).
    for r in reads.iter().chain(writes.iter()) {
        assert!(matches!(d.handle(&conn, r, &mut out), Outcome::Reply(_)));
    }
    let before = allocs();
    let mut replies = 0;
    for _ in 0..50 {
        for (r, w) in reads.iter().zip(writes.iter()) {
            if let Outcome::Reply(n) = d.handle(&conn, r, &mut out) {
                // accept_stat SUCCESS, NFS3_OK
                assert_eq!(&out[24..32], &[0, 0, 0, 0, 0, 0, 0, 0]);
                assert!(n > 4096, "reply of {n} bytes: {:?}", &out[..n.min(120)]);
                replies += 1;
            }
            if let Outcome::Reply(_) = d.handle(&conn, w, &mut out) {
                assert_eq!(&out[24..32], &[0, 0, 0, 0, 0, 0, 0, 0]);
                replies += 1;
            }
        }
    }
    let after = allocs();
    assert_eq!(replies, 50 * 128);
    assert_eq!(after - before, 0, "{} heap allocations in {replies} READ/WRITE calls", after - before);
    // And the counter works: a control allocation is seen.
    let v: Vec<u8> = Vec::with_capacity(10);
    assert!(allocs() > after);
    drop(v);
    let _ = Encoder::new(&mut out);
}
