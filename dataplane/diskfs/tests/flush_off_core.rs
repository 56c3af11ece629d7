//! Proves metadata calls wait for their log flush off the core (see
//! `vfs::durable`), over real TCP on 127.0.0.1 with one core: a device
//! whose flushes take hundreds of milliseconds holds up only the calls that
//! wait for them — another client's GETATTR on the same core is answered
//! at once, for NFSv3 procedures, for an NFSv4.1 OPEN that creates and for
//! a COMPOUND that parks twice (WRITE on the device, then SETATTR's flush) —
//! yet no reply leaves before its change is on the device (the device's
//! image, opened as a new file system, holds it); calls that wait together
//! share flushes (group commit: fewer flushes than calls); a flush that
//! fails answers NFS3ERR_IO / SYSTEM_ERR and the server keeps serving.

use block::fault::{FaultControl, FaultDevice};
use block::mem::MemDevice;
use block::Device;
use client::nfs3::Nfs3;
use client::{Auth, Error, Limits};
use diskfs::{DiskFs, Options};
use rpc::Dispatcher;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vfs::Vfs;

const EXPORT: u32 = 0;
const BLOCKS: u64 = 16384;
const SLOW: Duration = Duration::from_millis(600);

struct Up {
    server: Option<runtime::Server>,
    addr: String,
    root: Vec<u8>,
    mem: Arc<MemDevice>,
    ctl: FaultControl,
}

impl Drop for Up {
    fn drop(&mut self) {
        self.ctl.clear();
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// One core serving NFSv3 and NFSv4.1 over diskfs on a fault device.
fn start() -> Up {
    let mem = Arc::new(MemDevice::new("mem0", BLOCKS));
    let fault = Arc::new(FaultDevice::new(mem.clone()));
    let ctl = fault.control();
    let dev: Device = fault;
    let fs: Arc<dyn Vfs> = Arc::new(DiskFs::open(vec![dev], &Options::new(EXPORT, true)).unwrap());
    let root = fs.root(EXPORT).unwrap().to_bytes().to_vec();
    let limits = rpc::Limits::default();
    let mut d = Dispatcher::new(limits);
    d.register(Arc::new(nfs3::Nfs3Program::new(fs.clone())), "nfs3", &nfs3::PROC_NAMES);
    let c4 = nfs4::Config { grace_time_s: 0, ..Default::default() };
    d.register(Arc::new(nfs4::Nfs4Program::new(fs, c4)), "nfs4", &["null", "compound"]);
    let cfg = runtime::Config { cores: 1, listen: vec!["127.0.0.1:0".parse().unwrap()], limits, ..Default::default() };
    let server = runtime::Server::start(cfg, Arc::new(d)).unwrap();
    let addr = server.local_addrs()[0].to_string();
    Up { server: Some(server), addr, root, mem, ctl }
}

fn root_auth() -> Auth {
    Auth::Sys { machine: "flush-test".into(), uid: 0, gid: 0, gids: vec![] }
}

fn v3(up: &Up) -> Nfs3 {
    Nfs3::connect(&up.addr, &root_auth(), Limits::default()).unwrap()
}

/// The names in the root of the file system the device's image holds now
/// (opened as another server would after a crash).
fn names_on_the_device(up: &Up) -> Vec<String> {
    let dev: Device = Arc::new(MemDevice::from_image("copy", up.mem.snapshot()));
    let fs = DiskFs::open(vec![dev], &Options::new(EXPORT, false)).unwrap();
    let root = fs.root(EXPORT).unwrap();
    let mut names = Vec::new();
    fs.readdir(&root, 0, &mut |e| {
        names.push(String::from_utf8_lossy(e.name).into_owned());
        true
    })
    .unwrap();
    names
}

/// Runs `slow` on a thread while the device flushes slowly, and checks
/// another client's GETATTR on the same core answers long before the flush
/// ends; returns `slow`'s result and how long it took.
fn while_slow<T: Send>(up: &Up, slow: impl FnOnce() -> T + Send) -> (T, Duration) {
    let mut other = v3(up);
    other.getattr(&up.root).unwrap();
    up.ctl.set_flush_delay(Some(SLOW));
    let out = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let t = Instant::now();
            let r = slow();
            (r, t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(150));
        let t = Instant::now();
        other.getattr(&up.root).expect("GETATTR while a flush is slow");
        let took = t.elapsed();
        assert!(took < Duration::from_millis(300), "GETATTR took {took:?} on the core a metadata call waits on");
        assert!(!h.is_finished(), "the metadata call waits for its flush");
        h.join().unwrap()
    });
    up.ctl.set_flush_delay(None);
    assert!(out.1 >= SLOW - Duration::from_millis(50), "the reply left after the flush ({:?})", out.1);
    out
}

#[test]
fn nfs3_metadata_calls_wait_for_the_flush_off_the_core_and_reply_durable() {
    let up = start();
    let mut c = v3(&up);
    let (fh, _) = while_slow(&up, || c.create(&up.root, b"a", 0o644, true));
    fh.expect("CREATE");
    assert!(names_on_the_device(&up).contains(&"a".to_string()), "CREATE answered before it was on the device");
    let (r, _) = while_slow(&up, || c.mkdir(&up.root, b"d", 0o755));
    r.expect("MKDIR");
    let (r, _) = while_slow(&up, || c.rename(&up.root, b"a", &up.root, b"b"));
    r.expect("RENAME");
    let names = names_on_the_device(&up);
    assert!(names.contains(&"b".to_string()) && !names.contains(&"a".to_string()), "RENAME on the device: {names:?}");
    let (r, _) = while_slow(&up, || c.remove(&up.root, b"b"));
    r.expect("REMOVE");
    let (r, _) = while_slow(&up, || c.rmdir(&up.root, b"d"));
    r.expect("RMDIR");
    assert!(names_on_the_device(&up).is_empty(), "REMOVE and RMDIR on the device");
    // Errors found before anything changes answer at once (nothing to flush).
    up.ctl.set_flush_delay(Some(SLOW));
    let t = Instant::now();
    match c.remove(&up.root, b"nothing-here") {
        Err(Error::Nfs3 { code: 2, .. }) => {}
        other => panic!("REMOVE of a missing name: {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_millis(300), "an error that changed nothing waited for a flush");
}

#[test]
fn nfs4_open_create_waits_for_the_flush_off_the_core() {
    let up = start();
    let mut c = client::nfs4::Nfs41::connect(&up.addr, &root_auth(), Limits::default(), b"flush-test-v4").unwrap();
    let (o, _) = while_slow(&up, || c.open("", "v4file", 2, Some(0o644)));
    let o = o.expect("OPEN with create");
    assert!(names_on_the_device(&up).contains(&"v4file".to_string()), "OPEN answered before its create was on the device");
    c.write(&o, 0, b"hello", true).expect("WRITE");
    c.close(&o).expect("CLOSE");
}

/// A COMPOUND that parks twice: its WRITE waits for the device on the core
/// (`coreio`), and once it resumes, the SETATTR after it logs a change
/// whose flush must not run on the core either — the COMPOUND parks again
/// with its reply, and the reply leaves once the mode is on the device.
#[test]
fn nfs4_compound_resumed_after_a_write_parks_again_for_its_flush() {
    use proto::nfs4 as p;
    let up = start();
    let mut c = client::nfs4::Nfs41::connect(&up.addr, &root_auth(), Limits::default(), b"flush-test-rw").unwrap();
    let o = c.open("", "v4rw", 3, Some(0o644)).expect("OPEN with create");
    let data = vec![0x5au8; 8192];
    let mode = 0o600u32.to_be_bytes();
    let ops = [
        p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: &o.fh }),
        p::nfs_argop4::OP_WRITE(p::WRITE4args { stateid: o.stateid.clone(), offset: 0, stable: p::stable_how4::UNSTABLE4, data: &data }),
        p::nfs_argop4::OP_SETATTR(p::SETATTR4args {
            stateid: o.stateid.clone(),
            obj_attributes: p::fattr4 { attrmask: vec![0, 1 << (33 - 32)], attr_vals: &mode },
        }),
    ];
    let (r, _) = while_slow(&up, || {
        c.compound(&ops, |r| match r {
            [_, p::nfs_resop4::OP_WRITE(p::WRITE4res::NFS4_OK(w)), p::nfs_resop4::OP_SETATTR(s)] if s.status == p::nfsstat4::NFS4_OK => Ok(w.count),
            other => Err(Error::Malformed(format!("WRITE + SETATTR results: {other:?}"))),
        })
    });
    assert_eq!(r.expect("WRITE + SETATTR"), 8192);
    let dev: Device = Arc::new(MemDevice::from_image("copy", up.mem.snapshot()));
    let fs = DiskFs::open(vec![dev], &Options::new(EXPORT, false)).unwrap();
    let (fh, _) = fs.lookup(&fs.root(EXPORT).unwrap(), b"v4rw").unwrap();
    assert_eq!(fs.getattr(&fh).unwrap().mode & 0o7777, 0o600, "the COMPOUND answered before its SETATTR was on the device");
    c.close(&o).expect("CLOSE");
}

#[test]
fn calls_that_wait_together_share_flushes() {
    let up = start();
    up.ctl.set_flush_delay(Some(Duration::from_millis(40)));
    const CLIENTS: usize = 16;
    const EACH: usize = 4;
    let before = up.ctl.flushes();
    let t = Instant::now();
    std::thread::scope(|s| {
        for k in 0..CLIENTS {
            let up = &up;
            s.spawn(move || {
                let mut c = v3(up);
                for i in 0..EACH {
                    c.create(&up.root, format!("f{k}-{i}").as_bytes(), 0o644, true).expect("CREATE");
                }
            });
        }
    });
    let (flushes, took) = (up.ctl.flushes() - before, t.elapsed());
    up.ctl.set_flush_delay(None);
    let calls = (CLIENTS * EACH) as u64;
    println!("{calls} CREATEs from {CLIENTS} clients on one core: {flushes} flushes, {took:?}");
    // Waiting inline, the one core would flush once per CREATE, one after
    // the other (at least 64 x 40 ms).
    assert!(flushes * 2 <= calls, "{flushes} flushes for {calls} CREATEs: no group commit");
    assert!(took < Duration::from_millis(40) * calls as u32 / 2, "{took:?}");
    let names = names_on_the_device(&up);
    assert_eq!(names.len(), CLIENTS * EACH, "every CREATE answered is on the device");
}

#[test]
fn a_failed_flush_answers_an_io_error_and_the_server_goes_on() {
    let up = start();
    let mut c = v3(&up);
    c.create(&up.root, b"before", 0o644, true).unwrap();
    up.ctl.set_read_only(true);
    match c.create(&up.root, b"lost", 0o644, true) {
        Err(Error::Nfs3 { code: 5, .. }) => {}
        other => panic!("CREATE whose log write fails: {other:?}"),
    }
    // NFSv4.1: the COMPOUND is answered SYSTEM_ERR (its reply may not
    // claim a change a crash could lose).
    let mut c4 = client::nfs4::Nfs41::connect(&up.addr, &root_auth(), Limits::default(), b"flush-fail-v4");
    if let Ok(c4) = c4.as_mut() {
        assert!(c4.open("", "lost4", 2, Some(0o644)).is_err(), "OPEN whose log write fails");
    }
    // Reads keep working on the same core.
    let mut other = v3(&up);
    other.getattr(&up.root).expect("GETATTR after a failed flush");
    c.lookup(&up.root, b"before").expect("LOOKUP after a failed flush");
}
