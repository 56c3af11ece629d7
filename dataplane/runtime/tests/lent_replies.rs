//! Zero-copy replies over real TCP: a program lends pieces of shared buffers
//! to its replies (as NFS READ lends memfs chunks) instead of copying them.
//! Pipelined calls mixing copied and lent replies — lent replies of one
//! piece, of thousands (more iovecs than one sendmsg takes), and of a
//! megabyte (sent in several partial sends to a slow reader) — come back in
//! order with every byte right; the lent buffers are released once sent;
//! and a lending call that fails answers its error with nothing lent on the
//! wire.

use proto::xdr::{Decoder, Encoder};
use rpc::{CallContext, CallError, Dispatcher, Limits, Program};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const PROG: u32 = 400_200;
/// The shared buffer pieces are lent from.
const POOL_BYTES: usize = 64 << 10;
const TRAILER: u32 = 0x7e57_7e57;

struct Lending {
    pool: Arc<[u8]>,
}

fn pool_byte(i: usize) -> u8 {
    (i * 31 + i / 251) as u8
}

impl Program for Lending {
    fn program(&self) -> u32 {
        PROG
    }
    fn version(&self) -> u32 {
        1
    }
    /// proc 1 (pieces, piece_len, start, fail): opaque of `pieces` x
    /// `piece_len` bytes of the pool from `start` (wrapping), then TRAILER;
    /// lent when the transport offers it, copied otherwise. `fail` makes the
    /// call fail after lending.
    fn call(&self, ctx: &CallContext<'_>, args: &[u8], e: &mut Encoder<'_>) -> Result<(), CallError> {
        if ctx.proc_num != 1 {
            return Err(CallError::ProcUnavail);
        }
        let mut d = Decoder::new(args);
        let mut w = [0u32; 4];
        for x in &mut w {
            *x = d.u32().map_err(|_| CallError::GarbageArgs)?;
        }
        let [pieces, piece_len, start, fail] = w.map(|x| x as usize);
        if piece_len == 0 || piece_len > POOL_BYTES / 2 {
            return Err(CallError::GarbageArgs);
        }
        let total = pieces * piece_len;
        e.u32(total as u32).map_err(|_| CallError::SystemErr)?;
        let mut at = start % POOL_BYTES;
        match ctx.lend {
            Some(l) => {
                l.begin(e.position());
                for _ in 0..pieces {
                    let n = piece_len.min(POOL_BYTES - at);
                    l.push(&self.pool, at, n);
                    if n < piece_len {
                        l.push(&self.pool, 0, piece_len - n);
                    }
                    at = (at + piece_len) % POOL_BYTES;
                }
                if fail != 0 {
                    return Err(CallError::SystemErr);
                }
                e.reserve(proto::xdr::pad(total)).map_err(|_| CallError::SystemErr)?;
            }
            None => {
                let mut v = Vec::with_capacity(total);
                for _ in 0..pieces {
                    for k in 0..piece_len {
                        v.push(self.pool[(at + k) % POOL_BYTES]);
                    }
                    at = (at + piece_len) % POOL_BYTES;
                }
                e.opaque_fixed(&v).map_err(|_| CallError::SystemErr)?;
            }
        }
        e.u32(TRAILER).map_err(|_| CallError::SystemErr)
    }
}

fn start() -> (runtime::Server, SocketAddr, Arc<[u8]>) {
    let limits = Limits { record_bytes_max: 4096, reply_bytes_max: (1 << 20) + 4096, ..Limits::default() };
    let pool: Arc<[u8]> = (0..POOL_BYTES).map(pool_byte).collect::<Vec<u8>>().into();
    let mut d = Dispatcher::new(limits);
    d.register(Arc::new(Lending { pool: pool.clone() }), "lending", &["null", "lend"]);
    let cfg = runtime::Config { cores: 1, listen: vec!["127.0.0.1:0".parse().unwrap()], limits, ..Default::default() };
    let s = runtime::Server::start(cfg, Arc::new(d)).unwrap();
    let a = s.local_addrs()[0];
    (s, a, pool)
}

fn call(xid: u32, args: [u32; 4]) -> Vec<u8> {
    let mut body = Vec::new();
    for w in [xid, 0, 2, PROG, 1, 1, 0, 0, 0, 0] {
        body.extend_from_slice(&w.to_be_bytes());
    }
    for w in args {
        body.extend_from_slice(&w.to_be_bytes());
    }
    let mut rec = rpc::record::header(body.len()).to_vec();
    rec.extend(body);
    rec
}

fn read_reply(s: &mut impl Read) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let mut m = [0u8; 4];
        s.read_exact(&mut m).unwrap();
        let m = u32::from_be_bytes(m);
        let at = body.len();
        body.resize(at + (m & 0x7fff_ffff) as usize, 0);
        s.read_exact(&mut body[at..]).unwrap();
        if m & 0x8000_0000 != 0 {
            return body;
        }
    }
}

fn check(body: &[u8], xid: u32, args: [u32; 4]) {
    let w = |at: usize| u32::from_be_bytes(body[at..at + 4].try_into().unwrap());
    assert_eq!((w(0), w(4), w(8), w(20)), (xid, 1, 0, 0), "reply {xid} header");
    let [pieces, piece_len, start, _] = args.map(|x| x as usize);
    let total = pieces * piece_len;
    assert_eq!(w(24) as usize, total, "reply {xid} length");
    let data = &body[28..28 + total];
    let mut at = start % POOL_BYTES;
    for p in 0..pieces {
        for k in 0..piece_len {
            let want = pool_byte((at + k) % POOL_BYTES);
            assert_eq!(data[p * piece_len + k], want, "reply {xid} piece {p} byte {k}");
        }
        at = (at + piece_len) % POOL_BYTES;
    }
    let pad = (4 - total % 4) % 4;
    assert!(body[28 + total..28 + total + pad].iter().all(|&b| b == 0), "reply {xid} pad");
    assert_eq!(w(28 + total + pad), TRAILER, "reply {xid} trailer");
    assert_eq!(body.len(), 32 + total + pad, "reply {xid} size");
}

#[test]
fn lent_replies_arrive_whole_and_in_order() {
    let (server, addr, pool) = start();
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = s.try_clone().unwrap();
    // (pieces, piece_len): one piece, odd sizes (pads), more pieces than
    // one sendmsg carries, a megabyte, nothing at all.
    let shapes: [(u32, u32); 7] = [(1, 4096), (3, 1001), (2000, 7), (256, 4096), (0, 5), (1, 3), (1500, 513)];
    let plan: Vec<(u32, [u32; 4])> =
        (0..120u32).map(|i| (i, { let (p, l) = shapes[i as usize % shapes.len()]; [p, l, i * 977, 0] })).collect();
    let calls: Vec<u8> = plan.iter().flat_map(|(x, a)| call(*x, *a)).collect();
    let writer = std::thread::spawn(move || w.write_all(&calls).unwrap());
    let mut r = s;
    for (i, (xid, args)) in plan.iter().enumerate() {
        if i % 10 == 0 {
            // A slow reader: the server's sends of lent megabytes stop half way.
            std::thread::sleep(Duration::from_millis(20));
        }
        check(&read_reply(&mut r), *xid, *args);
    }
    writer.join().unwrap();
    // Every reply was sent: the loop handed every lent piece back.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&pool) != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(Arc::strong_count(&pool), 2, "lent pieces still held after their replies were sent");

    // A lending call that fails: SYSTEM_ERR, nothing lent on the wire, and
    // the connection goes on.
    r.write_all(&call(900, [4, 100, 0, 1])).unwrap();
    let body = read_reply(&mut r);
    let w = |at: usize| u32::from_be_bytes(body[at..at + 4].try_into().unwrap());
    assert_eq!((w(0), w(20), body.len()), (900, 5, 24), "failed lending call answers SYSTEM_ERR alone");
    r.write_all(&call(901, [2, 10, 5, 0])).unwrap();
    check(&read_reply(&mut r), 901, [2, 10, 5, 0]);
    drop(r);
    server.shutdown();
    assert_eq!(Arc::strong_count(&pool), 1, "the pool is released with the server");
}
