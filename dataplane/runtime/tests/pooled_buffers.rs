//! Proves the per-core pools of large buffers (runtime/src/buf.rs) over
//! real TCP: with ONE large receive and ONE large reply buffer per core,
//! records and replies far larger than a connection's own buffers (16 KiB
//! receive, 8 KiB reply) are served byte-exact; a connection that used the
//! pool and then idles (still connected) gives both buffers back, so the
//! next connection's large call is served (a buffer kept by an idle
//! connection would leave it waiting forever); two connections streaming
//! pipelined large calls at once share the one buffer of each kind and
//! every reply comes back intact and in order.

use proto::xdr::{Decoder, Encoder};
use rpc::{CallContext, CallError, Dispatcher, Limits, Program};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const PROG: u32 = 400_300;
const PAYLOAD_MAX: u32 = 96 << 10;

struct BigEcho;

impl Program for BigEcho {
    fn program(&self) -> u32 {
        PROG
    }
    fn version(&self) -> u32 {
        1
    }
    fn call(&self, _ctx: &CallContext<'_>, args: &[u8], reply: &mut Encoder<'_>) -> Result<(), CallError> {
        let mut d = Decoder::new(args);
        let v = d.opaque_var(PAYLOAD_MAX).map_err(|_| CallError::GarbageArgs)?;
        reply.opaque_var(v).map_err(|_| CallError::SystemErr)
    }
}

fn start() -> (runtime::Server, SocketAddr) {
    let limits = Limits {
        record_bytes_max: 128 << 10,
        reply_bytes_max: 128 << 10,
        recv_buffers_per_core: 1,
        reply_buffers_per_core: 1,
        ..Limits::default()
    };
    let mut d = Dispatcher::new(limits);
    d.register(Arc::new(BigEcho), "bigecho", &["null", "echo"]);
    let cfg = runtime::Config { cores: 1, listen: vec!["127.0.0.1:0".parse().unwrap()], limits, ..Default::default() };
    let s = runtime::Server::start(cfg, Arc::new(d)).unwrap();
    let a = s.local_addrs()[0];
    (s, a)
}

fn payload(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed).to_be_bytes()[0]).collect()
}

fn call(xid: u32, data: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 64 + data.len()];
    let mut e = Encoder::new(&mut b);
    for w in [xid, 0, 2, PROG, 1, 1, 0, 0, 0, 0] {
        e.u32(w).unwrap();
    }
    e.opaque_var(data).unwrap();
    let n = e.position();
    let mut rec = rpc::record::header(n).to_vec();
    rec.extend_from_slice(&b[..n]);
    rec
}

/// The echoed bytes of the next reply, checking its xid.
fn reply(s: &mut TcpStream, xid: u32) -> Vec<u8> {
    let mut h = [0u8; 4];
    s.read_exact(&mut h).expect("a reply (a stuck pool buffer would time out here)");
    let len = (u32::from_be_bytes(h) & 0x7fff_ffff) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    let w = |i: usize| u32::from_be_bytes(body[i..i + 4].try_into().unwrap());
    assert_eq!((w(0), w(4), w(8), w(20)), (xid, 1, 0, 0), "accepted, successful reply to xid {xid}");
    let n = w(24) as usize;
    body[28..28 + n].to_vec()
}

fn connect(a: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn one_pool_buffer_each_serves_everyone_and_idle_connections_give_them_back() {
    let (server, addr) = start();
    let mut a = connect(addr);
    let data = payload(1, 64 << 10);
    a.write_all(&call(1, &data)).unwrap();
    assert!(reply(&mut a, 1) == data, "a 64 KiB call and reply through the pools");
    // `a` stays connected and idle; `b` needs both buffers now.
    let mut b = connect(addr);
    let data2 = payload(2, 80 << 10);
    b.write_all(&call(2, &data2)).unwrap();
    assert!(reply(&mut b, 2) == data2, "the idle connection gave its pool buffers back");
    // Both stream pipelined large calls at once and share the two buffers.
    let calls = 6u32;
    let send = |mut s: TcpStream, base: u32| {
        std::thread::spawn(move || {
            for i in 0..calls {
                s.write_all(&call(base + i, &payload(base + i, (40 << 10) + 997 * i as usize))).unwrap();
            }
        })
    };
    let (wa, wb) = (send(a.try_clone().unwrap(), 100), send(b.try_clone().unwrap(), 200));
    for i in 0..calls {
        assert!(reply(&mut a, 100 + i) == payload(100 + i, (40 << 10) + 997 * i as usize), "a: reply {i} intact, in order");
        assert!(reply(&mut b, 200 + i) == payload(200 + i, (40 << 10) + 997 * i as usize), "b: reply {i} intact, in order");
    }
    wa.join().unwrap();
    wb.join().unwrap();
    // Small calls never needed the pools and still work.
    a.write_all(&call(7, b"small")).unwrap();
    assert_eq!(reply(&mut a, 7), b"small");
    server.shutdown();
}
