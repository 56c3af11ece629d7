//! Proves the TCP transport end to end: a real server on 127.0.0.1 answers
//! pipelined calls in order, joins multi-fragment records, answers RPC-level
//! errors (PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL, GARBAGE_ARGS, bad RPC
//! version, unknown auth flavor), closes connections that send oversize or
//! garbage records, enforces conns_max — while a well-behaved client on
//! another connection keeps getting answers throughout.

use proto::xdr::Encoder;
use rpc::{CallContext, CallError, Dispatcher, Limits, Program};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

struct Echo;
impl Program for Echo {
    fn program(&self) -> u32 {
        400_100
    }
    fn version(&self) -> u32 {
        1
    }
    fn call(&self, _ctx: &CallContext<'_>, args: &[u8], reply: &mut Encoder<'_>) -> Result<(), CallError> {
        match _ctx.proc_num {
            0 => Ok(()),
            1 => {
                // echo: opaque<64>
                let mut d = proto::xdr::Decoder::new(args);
                let v = d.opaque_var(3000).map_err(|_| CallError::GarbageArgs)?;
                reply.opaque_var(v).map_err(|_| CallError::SystemErr)
            }
            _ => Err(CallError::ProcUnavail),
        }
    }
}

fn start(conns_max: usize) -> (runtime::Server, SocketAddr) {
    let limits = Limits { record_bytes_max: 4096, reply_bytes_max: 4096, conns_max, ..Limits::default() };
    let mut d = Dispatcher::new(limits);
    d.register(Arc::new(Echo), "echo", &["null", "echo"]);
    let cfg = runtime::Config { cores: 2, listen: vec!["127.0.0.1:0".parse().unwrap()], limits, ..Default::default() };
    let s = runtime::Server::start(cfg, Arc::new(d)).unwrap();
    let a = s.local_addrs()[0];
    (s, a)
}

fn call(xid: u32, rpcvers: u32, prog: u32, vers: u32, proc_num: u32, flavor: u32, args: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 256 + args.len()];
    let mut e = Encoder::new(&mut b);
    for w in [xid, 0, rpcvers, prog, vers, proc_num, flavor, 0, 0, 0] {
        e.u32(w).unwrap();
    }
    e.opaque_fixed(args).unwrap();
    let n = e.position();
    let mut rec = rpc::record::header(n).to_vec();
    rec.extend_from_slice(&b[..n]);
    rec
}

fn read_reply(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut h = [0u8; 4];
    s.read_exact(&mut h)?;
    let len = (u32::from_be_bytes(h) & 0x7fff_ffff) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok(body)
}

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect()
}

fn connect(a: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn assert_alive(good: &mut TcpStream, xid: u32) {
    good.write_all(&call(xid, 2, 400_100, 1, 0, 0, &[])).unwrap();
    let r = words(&read_reply(good).unwrap());
    assert_eq!(r, vec![xid, 1, 0, 0, 0, 0], "well-behaved client still served");
}

#[test]
fn pipelined_calls_and_rpc_errors() {
    let (server, addr) = start(64);
    let mut good = connect(addr);
    let mut s = connect(addr);
    // Pipeline 50 echo calls in one write; replies come back in order.
    let mut batch = Vec::new();
    for i in 0..50u32 {
        let mut arg = vec![0u8; 8];
        Encoder::new(&mut arg).opaque_var(&i.to_be_bytes()[..]).unwrap();
        batch.extend(call(1000 + i, 2, 400_100, 1, 1, 0, &arg));
    }
    s.write_all(&batch).unwrap();
    for i in 0..50u32 {
        let r = read_reply(&mut s).unwrap();
        let w = words(&r);
        assert_eq!(&w[..6], &[1000 + i, 1, 0, 0, 0, 0]);
        assert_eq!(&r[24..], &[0, 0, 0, 4, 0, 0, (i >> 8) as u8, i as u8]);
    }
    // Errors at the RPC level.
    let cases: [(u32, u32, u32, u32, u32, &[u32]); 6] = [
        (2, 999, 1, 0, 0, &[1, 0, 0, 0, 1]),           // PROG_UNAVAIL
        (2, 400_100, 7, 0, 0, &[1, 0, 0, 0, 2, 1, 1]), // PROG_MISMATCH low=high=1
        (2, 400_100, 1, 9, 0, &[1, 0, 0, 0, 3]),       // PROC_UNAVAIL
        (2, 400_100, 1, 1, 0, &[1, 0, 0, 0, 4]),       // GARBAGE_ARGS (no echo arg)
        (3, 400_100, 1, 0, 0, &[1, 1, 0, 2, 2]),       // RPC_MISMATCH
        (2, 400_100, 1, 0, 6, &[1, 1, 1, 1]),          // AUTH_ERROR AUTH_BADCRED (RPCSEC_GSS)
    ];
    for (i, (rv, prog, vers, p, flavor, want)) in cases.iter().enumerate() {
        s.write_all(&call(i as u32, *rv, *prog, *vers, *p, *flavor, &[])).unwrap();
        let w = words(&read_reply(&mut s).unwrap());
        assert_eq!(&w[0..1], &[i as u32]);
        assert_eq!(&w[1..], *want, "case {i}");
    }
    // A multi-fragment record is joined.
    let full = call(77, 2, 400_100, 1, 0, 0, &[]);
    let body = &full[4..];
    let mut frags = ((12u32).to_be_bytes()).to_vec();
    frags.extend_from_slice(&body[..12]);
    frags.extend_from_slice(&(0x8000_0000u32 | (body.len() as u32 - 12)).to_be_bytes());
    frags.extend_from_slice(&body[12..]);
    s.write_all(&frags).unwrap();
    assert_eq!(words(&read_reply(&mut s).unwrap())[0], 77);
    assert_alive(&mut good, 1);
    server.shutdown();
}

#[test]
fn hostile_records_close_only_their_connection() {
    let (server, addr) = start(64);
    let mut good = connect(addr);
    assert_alive(&mut good, 1);
    // Fragment length 2^31-1: closed without reading it.
    let mut s = connect(addr);
    s.write_all(&0xffff_ffffu32.to_be_bytes()).unwrap();
    let mut buf = [0u8; 4];
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "oversize record closes the connection");
    assert_alive(&mut good, 2);
    // A record too short to hold an xid: closed.
    let mut s = connect(addr);
    s.write_all(&[0x80, 0, 0, 2, 1, 2]).unwrap();
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    // Garbage after a valid header: the xid is answered with GARBAGE_ARGS.
    let mut s = connect(addr);
    let mut rec = call(5, 2, 400_100, 1, 1, 0, &[]);
    rec.truncate(4 + 32); // cut inside the verifier
    let n = rec.len() as u32 - 4;
    rec[..4].copy_from_slice(&(0x8000_0000 | n).to_be_bytes());
    s.write_all(&rec).unwrap();
    let w = words(&read_reply(&mut s).unwrap());
    assert_eq!(w, vec![5, 1, 0, 0, 0, 4]);
    // Truncated record then close: server keeps going.
    let mut s = connect(addr);
    s.write_all(&call(6, 2, 400_100, 1, 0, 0, &[])[..10]).unwrap();
    drop(s);
    assert_alive(&mut good, 3);
    server.shutdown();
}

#[test]
fn conns_max_enforced() {
    let (server, addr) = start(2);
    let mut a = connect(addr);
    let mut b = connect(addr);
    assert_alive(&mut a, 1);
    assert_alive(&mut b, 2);
    let mut c = connect(addr);
    let _ = c.write_all(&call(3, 2, 400_100, 1, 0, 0, &[]));
    assert!(read_reply(&mut c).is_err(), "third connection refused");
    drop(a);
    std::thread::sleep(Duration::from_millis(200));
    let mut d = connect(addr);
    assert_alive(&mut d, 4);
    server.shutdown();
}

/// Regression: the receive buffer must never be compacted or reset while a
/// receive is landing in it. A client streams thousands of pipelined calls of
/// varied sizes in odd-sized chunks, reading replies concurrently, so records
/// straddle buffer ends while replies are being sent; every reply must come
/// back intact and in order.
#[test]
fn pipelined_stream_with_backpressure_stays_intact() {
    let (server, addr) = start(64);
    let s = connect(addr);
    let mut w = s.try_clone().unwrap();
    const CALLS: u32 = 3000;
    let writer = std::thread::spawn(move || {
        let mut stream = Vec::new();
        for i in 0..CALLS {
            let len = ((i * 7919) % 2900) as usize;
            let payload: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
            let mut arg = vec![0u8; 4 + len + 4];
            let n = {
                let mut e = Encoder::new(&mut arg);
                e.opaque_var(&payload).unwrap();
                e.position()
            };
            stream.extend(call(i, 2, 400_100, 1, 1, 0, &arg[..n]));
        }
        let mut off = 0;
        let mut k = 0usize;
        while off < stream.len() {
            let chunk = [1usize, 3, 4093, 17, 8191, 65536, 5][k % 7].min(stream.len() - off);
            w.write_all(&stream[off..off + chunk]).unwrap();
            off += chunk;
            k += 1;
        }
    });
    let mut r = s;
    r.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for i in 0..CALLS {
        let body = read_reply(&mut r).unwrap();
        let w = words(&body[..24]);
        assert_eq!(&w[..], &[i, 1, 0, 0, 0, 0], "reply {i} header");
        let len = ((i * 7919) % 2900) as usize;
        assert_eq!(u32::from_be_bytes(body[24..28].try_into().unwrap()) as usize, len);
        for j in 0..len {
            assert_eq!(body[28 + j], (i as usize + j) as u8, "reply {i} byte {j}");
        }
    }
    writer.join().unwrap();
    server.shutdown();
}
