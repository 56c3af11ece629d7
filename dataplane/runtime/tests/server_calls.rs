//! Proves the transport half of the back channel, with no NFS in the way: a
//! control thread queues a server-initiated record for a connection (named
//! by the conn_id the program saw), the record arrives on that connection
//! between the replies to the client's own pipelined calls; REPLY records the
//! client sends go to the dispatcher's reply sink (never answered); a record
//! for a closed or unknown connection is dropped; the sink hears about every
//! close; oversize records are refused up front.

use proto::xdr::Encoder;
use rpc::backchannel::{ReplySink, SendError};
use rpc::{CallContext, CallError, ConnInfo, Dispatcher, Limits, Program};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Remembers the connection of the last call; NULL and an echo-less proc 1.
struct Who(AtomicU64);
impl Program for Who {
    fn program(&self) -> u32 {
        400_200
    }
    fn version(&self) -> u32 {
        1
    }
    fn call(&self, ctx: &CallContext<'_>, _args: &[u8], reply: &mut Encoder<'_>) -> Result<(), CallError> {
        self.0.store(ctx.conn_id, Ordering::SeqCst);
        reply.u64(ctx.conn_id).map_err(|_| CallError::SystemErr)
    }
}

#[derive(Default)]
struct Sink {
    replies: Mutex<Vec<(u64, u32, Vec<u8>)>>,
    closed: Mutex<Vec<u64>>,
}
impl ReplySink for Sink {
    fn reply(&self, conn: &ConnInfo, xid: u32, msg: &[u8]) {
        self.replies.lock().unwrap().push((conn.conn_id, xid, msg.to_vec()));
    }
    fn conn_closed(&self, conn_id: u64) {
        self.closed.lock().unwrap().push(conn_id);
    }
}

fn rec(words: &[u32]) -> Vec<u8> {
    let body: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    let mut r = rpc::record::header(body.len()).to_vec();
    r.extend_from_slice(&body);
    r
}

fn read_record(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; 4];
    s.read_exact(&mut h).unwrap();
    let mut b = vec![0u8; (u32::from_be_bytes(h) & 0x7fff_ffff) as usize];
    s.read_exact(&mut b).unwrap();
    b
}

fn word(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
}

fn until(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn server_initiated_records_and_replies() {
    let limits = Limits { record_bytes_max: 4096, reply_bytes_max: 4096, ..Limits::default() };
    let who = Arc::new(Who(AtomicU64::new(0)));
    let sink = Arc::new(Sink::default());
    let mut d = Dispatcher::new(limits);
    d.register(who.clone(), "who", &["null"]);
    d.set_reply_sink(sink.clone());
    let cfg = runtime::Config { cores: 2, listen: vec!["127.0.0.1:0".parse().unwrap()], limits, ..Default::default() };
    let server = runtime::Server::start(cfg, Arc::new(d)).unwrap();
    let sender = server.sender();
    let mut c = TcpStream::connect(server.local_addrs()[0]).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();

    // Learn our conn_id from a call.
    c.write_all(&rec(&[1, 0, 2, 400_200, 1, 0, 0, 0, 0, 0])).unwrap();
    let r = read_record(&mut c);
    let conn_id = who.0.load(Ordering::SeqCst);
    assert_eq!(((word(&r, 6) as u64) << 32) | word(&r, 7) as u64, conn_id);

    // Server -> client CALL while the client pipelines its own calls: the
    // client sees its three replies and the server's call, each whole.
    let mut pipelined = Vec::new();
    for xid in 10..13 {
        pipelined.extend(rec(&[xid, 0, 2, 400_200, 1, 0, 0, 0, 0, 0]));
    }
    c.write_all(&pipelined).unwrap();
    sender.send(conn_id, rec(&[0x5eed, 0, 2, 0x4000_0000, 1, 1, 0, 0, 0, 0, 77])).unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = read_record(&mut c);
        seen.push((word(&r, 0), word(&r, 1)));
    }
    seen.sort();
    assert_eq!(seen, vec![(10, 1), (11, 1), (12, 1), (0x5eed, 0)], "three REPLYs to us, one CALL from the server");

    // The client's REPLY goes to the sink, with its connection, unanswered.
    c.write_all(&rec(&[0x5eed, 1, 0, 0, 0, 0, 99])).unwrap();
    until("the reply in the sink", || !sink.replies.lock().unwrap().is_empty());
    let (got_conn, got_xid, msg) = sink.replies.lock().unwrap()[0].clone();
    assert_eq!((got_conn, got_xid, word(&msg, 6)), (conn_id, 0x5eed, 99));
    c.write_all(&rec(&[2, 0, 2, 400_200, 1, 0, 0, 0, 0, 0])).unwrap();
    assert_eq!(word(&read_record(&mut c), 0), 2, "next record read is the answer to xid 2: nothing was sent for the REPLY");

    // Refused up front: larger than a reply buffer may hold.
    assert_eq!(sender.send(conn_id, vec![0; 4097]), Err(SendError::TooLarge));
    // Unknown connection (right core bits, never issued): dropped, no harm.
    sender.send(conn_id + (1 << 20), rec(&[1, 0])).unwrap();

    // Close: the sink hears it; later records for it are dropped.
    drop(c);
    until("the close in the sink", || sink.closed.lock().unwrap().contains(&conn_id));
    sender.send(conn_id, rec(&[3, 0])).unwrap();
    let mut c2 = TcpStream::connect(server.local_addrs()[0]).unwrap();
    c2.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c2.write_all(&rec(&[4, 0, 2, 400_200, 1, 0, 0, 0, 0, 0])).unwrap();
    let r = read_record(&mut c2);
    assert_eq!(word(&r, 0), 4, "a new connection gets its own replies only");
    assert_ne!(who.0.load(Ordering::SeqCst), conn_id, "conn_ids are not reused");
    server.shutdown();
    assert_eq!(sender.send(conn_id, rec(&[5, 0])), Err(SendError::Stopped));
}
