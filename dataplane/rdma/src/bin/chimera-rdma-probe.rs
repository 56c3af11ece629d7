//! chimera-rdma-probe: talks RPC-over-RDMA to a server with messages it
//! builds itself (`rdma::client`).
//!
//!   chimera-rdma-probe null ADDR:PORT [--count N] [--tcp ADDR:PORT]
//!       NFS NULL round trips over RDMA (and over TCP to --tcp), p50/p99
//!   chimera-rdma-probe hostile ADDR:PORT [--conns-max N]
//!       the hostile-input suite: wrong version, a Read chunk outside the
//!       client's registered memory, more segments than allowed, a Read
//!       chunk over the record limit, more calls than the credits, a client
//!       that disconnects in the middle of an RDMA Read, and (with
//!       --conns-max, the server's `rdma_conns_max`) more connections than
//!       the server takes; after each, a second (well-behaved) client's
//!       NULL must still succeed
//!
//! Exit status 0 when every check holds; each check prints one line.

use rdma::client::{classify, header, null_message, rpc_call, Client, Gone};
use rdma::wire;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::exit;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
/// How long a refused client waits for the server's answer or close: the
/// connection manager's disconnect request can take seconds to arrive on a
/// loaded machine (soft RoCE under emulation).
const CLOSE_WAIT: Duration = Duration::from_secs(45);

fn die(msg: String) -> ! {
    eprintln!("chimera-rdma-probe: {msg}");
    exit(2)
}

fn connect(addr: SocketAddr) -> Client {
    Client::connect(addr, T).unwrap_or_else(|e| die(format!("cannot connect to {addr}: {e}")))
}

fn null_ok(c: &mut Client, xid: u32) -> Result<(), String> {
    c.send(&null_message(xid))?;
    let m = c.recv(T).map_err(|g| format!("{g:?}"))?;
    match classify(&m) {
        (x, wire::RDMA_MSG, None, true) if x == xid => Ok(()),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn null_cmd(addr: SocketAddr, count: usize, tcp: Option<SocketAddr>) {
    let mut c = connect(addr);
    let mut rtt = Vec::with_capacity(count);
    for i in 0..count as u32 + 50 {
        let t = Instant::now();
        null_ok(&mut c, 1000 + i).unwrap_or_else(|e| die(format!("NULL over RDMA: {e}")));
        if i >= 50 {
            rtt.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    println!("NULL over rdma: p50 {:.1} us p99 {:.1} us ({count} calls)", pct(&mut rtt, 0.5), pct(&mut rtt, 0.99));
    if let Some(t) = tcp {
        let mut s = TcpStream::connect(t).unwrap_or_else(|e| die(format!("tcp {t}: {e}")));
        s.set_nodelay(true).ok();
        let mut rtt = Vec::with_capacity(count);
        let mut buf = [0u8; 256];
        for i in 0..count as u32 + 50 {
            let call = rpc_call(5000 + i, 100003, 3, 0, &[]);
            let mut rec = (0x8000_0000u32 | call.len() as u32).to_be_bytes().to_vec();
            rec.extend(call);
            let t0 = Instant::now();
            s.write_all(&rec).unwrap_or_else(|e| die(format!("tcp write: {e}")));
            s.read_exact(&mut buf[..4]).unwrap_or_else(|e| die(format!("tcp read: {e}")));
            let n = (u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) & 0x7fff_ffff) as usize;
            s.read_exact(&mut buf[..n.min(256)]).unwrap_or_else(|e| die(format!("tcp read: {e}")));
            if i >= 50 {
                rtt.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        println!("NULL over tcp: p50 {:.1} us p99 {:.1} us ({count} calls)", pct(&mut rtt, 0.5), pct(&mut rtt, 0.99));
    }
}

struct Suite {
    addr: SocketAddr,
    good: Client,
    xid: u32,
    failed: bool,
}

impl Suite {
    fn check(&mut self, name: &str, r: Result<String, String>) {
        match r {
            Ok(what) => println!("ok   {name}: {what}"),
            Err(e) => {
                println!("FAIL {name}: {e}");
                self.failed = true;
            }
        }
        self.xid += 1;
        let x = self.xid;
        match null_ok(&mut self.good, x) {
            Ok(()) => println!("ok   {name}: the well-behaved client's NULL still succeeds"),
            Err(e) => {
                println!("FAIL {name}: the well-behaved client's NULL failed afterwards: {e}");
                self.failed = true;
            }
        }
    }

    /// Send `msg` on a fresh connection; expect RDMA_ERROR `code` or a close.
    fn refused(&mut self, msg: &[u8], code: u32) -> Result<String, String> {
        let mut c = connect(self.addr);
        c.send(msg)?;
        match c.recv(CLOSE_WAIT) {
            Ok(m) => match classify(&m) {
                (_, wire::RDMA_ERROR, Some(e), _) if e == code => Ok(format!("RDMA_ERROR {}", if code == 1 { "ERR_VERS" } else { "ERR_CHUNK" })),
                other => Err(format!("expected RDMA_ERROR {code}, got {other:?}")),
            },
            Err(Gone::Closed(why)) => Ok(format!("connection closed ({why})")),
            Err(Gone::Timeout) => Err("no answer and no close within 45 s".into()),
        }
    }
}

fn hostile_cmd(addr: SocketAddr, conns_max: Option<usize>) {
    let good = connect(addr);
    let mut s = Suite { addr, good, xid: 1, failed: false };
    let nul = rpc_call(7, 100003, 3, 0, &[]);

    // 1. Version 2.
    let mut m = header(7, 2, 32, wire::RDMA_MSG, &[], None, None);
    m.extend(&nul);
    let r = s.refused(&m, wire::ERR_VERS);
    s.check("wrong-version", r);

    // 2. A Read chunk outside the memory the client registered.
    let r = {
        let mut c = connect(addr);
        let (_, base, rkey) = c.payload();
        let far = base + (1 << 30);
        let mut m = header(8, 1, 32, wire::RDMA_MSG, &[(nul.len() as u32, rkey, 4096, far)], None, None);
        m.extend(&nul);
        c.send(&m).and_then(|_| match c.recv(CLOSE_WAIT) {
            Ok(m) => match classify(&m) {
                (_, wire::RDMA_ERROR, Some(_), _) => Ok("RDMA_ERROR".to_string()),
                other => Err(format!("the server answered a call whose chunk it cannot have read: {other:?}")),
            },
            Err(Gone::Closed(why)) => Ok(format!("connection closed ({why})")),
            Err(Gone::Timeout) => Err("no answer and no close within 45 s".into()),
        })
    };
    s.check("chunk-outside-registration", r);

    // 3. More read segments than the server accepts.
    let segs: Vec<(u32, u32, u32, u64)> = (0..wire::SEGMENTS_MAX as u64 + 1).map(|i| (40, 1, 16, i * 16)).collect();
    let mut m = header(9, 1, 32, wire::RDMA_MSG, &segs, None, None);
    m.extend(&nul);
    let r = s.refused(&m, wire::ERR_CHUNK);
    s.check("too-many-segments", r);

    // 4. A Read chunk larger than the record limit.
    let mut m = header(10, 1, 32, wire::RDMA_MSG, &[(40, 1, 64 << 20, 0)], None, None);
    m.extend(&nul);
    let r = s.refused(&m, wire::ERR_CHUNK);
    s.check("read-chunk-over-record-limit", r);

    // 5. More calls than the credits granted (32): 40 calls whose chunks the
    // server must pull, sent without waiting.
    let r = {
        let mut c = connect(addr);
        let (_, base, rkey) = c.payload();
        let mut res = Ok(());
        for i in 0..40u32 {
            let mut m = header(100 + i, 1, 32, wire::RDMA_MSG, &[(nul.len() as u32, rkey, 64 << 10, base)], None, None);
            m.extend(&nul);
            if let Err(e) = c.send(&m) {
                res = Err(e);
                break;
            }
        }
        res.and_then(|_| {
            let mut answered = 0;
            loop {
                match c.recv(CLOSE_WAIT) {
                    Ok(_) => answered += 1,
                    Err(Gone::Closed(why)) => return Ok(format!("connection closed after {answered} replies ({why})")),
                    Err(Gone::Timeout) => return Err(format!("{answered} replies and no close: the server accepted calls beyond its credits")),
                }
            }
        })
    };
    s.check("calls-beyond-credits", r);

    // 6. A client that goes away while the server pulls its 1 MiB chunk.
    let r = {
        let c = connect(addr);
        let (_, base, rkey) = c.payload();
        let mut m = header(11, 1, 32, wire::RDMA_MSG, &[(nul.len() as u32, rkey, 1 << 20, base)], None, None);
        m.extend(&nul);
        let mut c = c;
        c.send(&m).map(|_| {
            c.abort();
            "client gone mid-Read".to_string()
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    s.check("disconnect-mid-read", r);

    // 7. Garbage shorter than a header.
    let r = s.refused(&[1, 2, 3], 0);
    s.check("short-garbage", r);

    // 8. More connections than the server takes: with the suite's own
    // (and any other client's) connections open, one of `conns_max` more
    // must be refused, and every one that was taken answers NULL; once they
    // are gone a new connection is taken again.
    if let Some(max) = conns_max {
        let r = (|| {
            let mut held = Vec::new();
            let mut refused = None;
            for i in 0..max {
                match Client::connect(addr, T) {
                    Ok(mut c) => {
                        null_ok(&mut c, 5000 + i as u32).map_err(|e| format!("connection {} was taken but NULL failed: {e}", i + 1))?;
                        held.push(c);
                    }
                    Err(e) => {
                        refused = Some(format!("connection {} refused ({e})", i + 1));
                        break;
                    }
                }
            }
            let Some(refused) = refused else { return Err(format!("{max} more connections were all taken: the limit of {max} did not hold")) };
            let n = held.len();
            drop(held);
            std::thread::sleep(Duration::from_millis(500));
            let mut again = Client::connect(addr, T).map_err(|e| format!("after closing {n} connections a new one was refused: {e}"))?;
            null_ok(&mut again, 6000)?;
            Ok(format!("{n} taken, then {refused}; taken again once they closed"))
        })();
        s.check("connections-beyond-limit", r);
    }

    if s.failed {
        println!("hostile: FAIL");
        exit(1);
    }
    println!("hostile: PASS");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = |i: usize| -> SocketAddr {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| die("usage: chimera-rdma-probe null|hostile ADDR:PORT".into()))
    };
    match args.get(1).map(String::as_str) {
        Some("null") => {
            let mut count = 2000;
            let mut tcp = None;
            let mut i = 3;
            while i < args.len() {
                match args[i].as_str() {
                    "--count" => count = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or_else(|| die("--count N".into())),
                    "--tcp" => tcp = Some(addr(i + 1)),
                    a => die(format!("unknown argument {a:?}")),
                }
                i += 2;
            }
            null_cmd(addr(2), count.max(1), tcp)
        }
        Some("hostile") => {
            let conns_max = match (args.get(3).map(String::as_str), args.get(4)) {
                (None, _) => None,
                (Some("--conns-max"), Some(n)) => Some(n.parse().unwrap_or_else(|_| die("--conns-max N".into()))),
                (Some(a), _) => die(format!("unknown argument {a:?}")),
            };
            hostile_cmd(addr(2), conns_max)
        }
        _ => die("usage: chimera-rdma-probe null ADDR:PORT [--count N] [--tcp ADDR:PORT] | hostile ADDR:PORT".into()),
    }
}
