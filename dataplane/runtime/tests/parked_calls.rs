//! Proves calls that park on a slow backend (rpc::park) over real TCP on
//! 127.0.0.1: a parked call does not hold up the calls behind it on its own
//! connection (replies leave out of order, matched by xid) nor other
//! connections of the same core; the per-connection and per-core bounds on
//! parked calls hold exactly (the program counts how many are parked at
//! once) and the calls beyond them are answered once earlier ones finish;
//! a ticket dropped without completing answers the call as cancelled; a
//! connection that closes with calls parked frees their places; a
//! non-idempotent call retransmitted while parked runs once.
//!
//! The test program parks procedure 1 and completes it from a timer thread
//! after the delay the call asks for; procedure 2 answers inline.

use proto::xdr::{Decoder, Encoder};
use rpc::park::Ticket;
use rpc::{CallContext, CallError, Dispatcher, Limits, Program};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PROG: u32 = 400_200;
const PARK: u32 = 1;
const NOW: u32 = 2;
const PARK_AND_DROP: u32 = 3;
/// Parks like PARK, but is not idempotent (goes through the
/// duplicate-request cache).
const ONCE: u32 = 4;
const CANCELLED: u32 = 0xdead;

#[derive(Default)]
struct Slow {
    parked_now: AtomicUsize,
    parked_most: AtomicUsize,
    parked_total: AtomicUsize,
}

impl Slow {
    fn parked(&self) {
        let n = self.parked_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.parked_most.fetch_max(n, Ordering::SeqCst);
        self.parked_total.fetch_add(1, Ordering::SeqCst);
    }
}

fn sys<T>(r: proto::xdr::Result<T>) -> Result<T, CallError> {
    r.map_err(|_| CallError::SystemErr)
}

struct SlowProg(Arc<Slow>);

impl Program for SlowProg {
    fn program(&self) -> u32 {
        PROG
    }
    fn version(&self) -> u32 {
        1
    }
    fn idempotent(&self, proc_num: u32) -> bool {
        proc_num != ONCE
    }
    fn call(&self, ctx: &CallContext<'_>, args: &[u8], reply: &mut Encoder<'_>) -> Result<(), CallError> {
        let mut d = Decoder::new(args);
        let delay_ms = d.u32().map_err(|_| CallError::GarbageArgs)?;
        let tag = d.u32().map_err(|_| CallError::GarbageArgs)?;
        if let Some(r) = ctx.resumed {
            // The state is what we parked with; the payload what completed.
            assert_eq!(r.state, &tag.to_be_bytes()[..], "resumed with another call's state");
            sys(reply.u32(tag))?;
            return sys(reply.u32(r.get::<u32>().copied().unwrap_or(CANCELLED)));
        }
        match ctx.proc_num {
            0 => Ok(()),
            NOW => {
                sys(reply.u32(tag))?;
                sys(reply.u32(tag + 1000))
            }
            PARK | PARK_AND_DROP | ONCE => {
                let park = ctx.park.expect("the TCP transport parks");
                let ticket: Ticket = park.park(&tag.to_be_bytes()).expect("room to park");
                // Whatever was written now is discarded by the dispatcher.
                sys(reply.u32(0xbad))?;
                if ctx.proc_num == PARK_AND_DROP {
                    drop(ticket);
                    return Ok(());
                }
                self.0.parked();
                let me = self.0.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(delay_ms as u64));
                    me.parked_now.fetch_sub(1, Ordering::SeqCst);
                    ticket.complete(Box::new(tag + 1000));
                });
                Ok(())
            }
            _ => Err(CallError::ProcUnavail),
        }
    }
}

fn start(cores: usize, per_conn: usize, per_core: usize) -> (runtime::Server, SocketAddr, Arc<Slow>) {
    let limits = Limits {
        record_bytes_max: 4096,
        reply_bytes_max: 4096,
        parked_per_conn_max: per_conn,
        parked_per_core_max: per_core,
        ..Limits::default()
    };
    let slow = Arc::new(Slow::default());
    let mut d = Dispatcher::new(limits);
    d.register(Arc::new(SlowProg(slow.clone())), "slow", &["null", "park", "now", "drop", "once"]);
    let cfg = runtime::Config { cores, listen: vec!["127.0.0.1:0".parse().unwrap()], limits, ..Default::default() };
    let s = runtime::Server::start(cfg, Arc::new(d)).unwrap();
    let a = s.local_addrs()[0];
    (s, a, slow)
}

fn call(xid: u32, proc_num: u32, delay_ms: u32, tag: u32) -> Vec<u8> {
    let mut b = vec![0u8; 256];
    let mut e = Encoder::new(&mut b);
    for w in [xid, 0, 2, PROG, 1, proc_num, 0, 0, 0, 0, delay_ms, tag] {
        e.u32(w).unwrap();
    }
    let n = e.position();
    let mut rec = rpc::record::header(n).to_vec();
    rec.extend_from_slice(&b[..n]);
    rec
}

/// (xid, tag, value) of one successful reply.
fn reply(s: &mut TcpStream) -> (u32, u32, u32) {
    let mut h = [0u8; 4];
    s.read_exact(&mut h).expect("a reply");
    let len = (u32::from_be_bytes(h) & 0x7fff_ffff) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    let w: Vec<u32> = body.chunks_exact(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
    assert_eq!(w.len(), 8, "xid, REPLY, accepted, verifier (2), SUCCESS, tag, value: {w:?}");
    assert_eq!(&w[1..6], &[1, 0, 0, 0, 0], "an accepted, successful reply");
    (w[0], w[6], w[7])
}

fn connect(a: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn parked_call_does_not_hold_up_its_connection_or_core() {
    let (server, addr, _slow) = start(1, 8, 64);
    let mut a = connect(addr);
    let mut b = connect(addr);
    let t0 = Instant::now();
    // One slow call, then a quick one pipelined behind it.
    a.write_all(&[call(1, PARK, 1500, 7), call(2, NOW, 0, 8)].concat()).unwrap();
    assert_eq!(reply(&mut a), (2, 8, 1008), "the quick call is answered first");
    // The only core also serves another connection meanwhile.
    b.write_all(&call(3, NOW, 0, 9)).unwrap();
    assert_eq!(reply(&mut b), (3, 9, 1009));
    assert!(t0.elapsed() < Duration::from_millis(1500), "answered while the slow call was parked");
    assert_eq!(reply(&mut a), (1, 7, 1007), "the parked call completes with its own state");
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    server.shutdown();
}

/// A non-idempotent call retransmitted while it is parked runs once: the
/// retransmission is dropped (the first execution's reply answers), one
/// after the reply is answered from the duplicate-request cache, and a
/// call whose connection closed while it was parked still reaches the
/// cache — its retransmission on a new connection is answered at once.
#[test]
fn a_retransmitted_parked_call_runs_once() {
    let (server, addr, slow) = start(1, 8, 64);
    let total = || slow.parked_total.load(Ordering::SeqCst);
    let mut a = connect(addr);
    a.write_all(&[call(50, ONCE, 400, 5), call(50, ONCE, 400, 5)].concat()).unwrap();
    assert_eq!(reply(&mut a), (50, 5, 1005));
    a.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    let mut h = [0u8; 4];
    assert!(a.read_exact(&mut h).is_err(), "the retransmission got a reply of its own");
    assert_eq!(total(), 1, "the retransmission did not run again");
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    a.write_all(&call(50, ONCE, 400, 5)).unwrap();
    let t = Instant::now();
    assert_eq!(reply(&mut a), (50, 5, 1005));
    assert!(t.elapsed() < Duration::from_millis(300), "answered from the cache");
    assert_eq!(total(), 1);
    let mut b = connect(addr);
    b.write_all(&call(60, ONCE, 300, 6)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(b);
    std::thread::sleep(Duration::from_millis(600));
    let mut c = connect(addr);
    let t = Instant::now();
    c.write_all(&call(60, ONCE, 300, 6)).unwrap();
    assert_eq!(reply(&mut c), (60, 6, 1006), "the closed connection's call reached the cache");
    assert!(t.elapsed() < Duration::from_millis(250), "answered from the cache ({:?})", t.elapsed());
    assert_eq!(total(), 2, "it ran once");
    server.shutdown();
}

#[test]
fn parked_calls_are_bounded_per_connection() {
    let (server, addr, slow) = start(1, 4, 64);
    let mut a = connect(addr);
    let calls: Vec<u8> = (0..10).flat_map(|i| call(100 + i, PARK, 150, i)).collect();
    a.write_all(&calls).unwrap();
    let mut got: Vec<u32> = (0..10).map(|_| reply(&mut a)).map(|(xid, tag, v)| {
        assert_eq!((tag + 100, v), (xid, tag + 1000));
        xid
    }).collect();
    got.sort();
    assert_eq!(got, (100..110).collect::<Vec<_>>(), "every call answered once");
    assert_eq!(slow.parked_most.load(Ordering::SeqCst), 4, "never more than 4 parked on one connection, and 4 reached");
    assert_eq!(slow.parked_total.load(Ordering::SeqCst), 10);
    server.shutdown();
}

#[test]
fn parked_calls_are_bounded_per_core() {
    let (server, addr, slow) = start(1, 4, 5);
    let mut conns: Vec<TcpStream> = (0..3).map(|_| connect(addr)).collect();
    for (c, s) in conns.iter_mut().enumerate() {
        let calls: Vec<u8> = (0..4).flat_map(|i| call(10 * c as u32 + i, PARK, 150, 10 * c as u32 + i)).collect();
        s.write_all(&calls).unwrap();
    }
    for s in conns.iter_mut() {
        for _ in 0..4 {
            let (xid, tag, v) = reply(s);
            assert_eq!((xid, v), (tag, tag + 1000));
        }
    }
    assert_eq!(slow.parked_most.load(Ordering::SeqCst), 5, "the core keeps at most 5 parked, and reached it");
    assert_eq!(slow.parked_total.load(Ordering::SeqCst), 12);
    server.shutdown();
}

#[test]
fn dropped_ticket_answers_cancelled_and_closed_connections_free_their_places() {
    // One place per core: a leaked place would stall the core for good.
    let (server, addr, _slow) = start(1, 1, 1);
    let mut a = connect(addr);
    a.write_all(&call(1, PARK_AND_DROP, 0, 5)).unwrap();
    assert_eq!(reply(&mut a), (1, 5, CANCELLED), "a dropped ticket completes the call as cancelled");
    // A connection that goes away while its call is parked.
    let mut gone = connect(addr);
    gone.write_all(&call(2, PARK, 200, 6)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(gone);
    // Its place comes back when the completion arrives; the next call parks.
    a.write_all(&call(3, PARK, 10, 7)).unwrap();
    assert_eq!(reply(&mut a), (3, 7, 1007));
    a.write_all(&call(4, NOW, 0, 8)).unwrap();
    assert_eq!(reply(&mut a), (4, 8, 1008));
    server.shutdown();
}
