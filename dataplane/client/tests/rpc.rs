//! The RPC core against scripted peers: record marking, xid matching,
//! RPC-level errors and hostile replies, each ending in a named error.

use client::rpc::{Auth, Limits, RpcConn};
use client::Error;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

/// Read one call record (single fragment, as we send): (xid, bytes).
fn read_call(s: &mut TcpStream) -> Option<(u32, Vec<u8>)> {
    let mut m = [0u8; 4];
    s.read_exact(&mut m).ok()?;
    let len = (u32::from_be_bytes(m) & 0x7fff_ffff) as usize;
    let mut b = vec![0u8; len];
    s.read_exact(&mut b).ok()?;
    Some((u32::from_be_bytes(b[..4].try_into().unwrap()), b))
}

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// An accepted SUCCESS reply header for `xid` followed by `body`.
fn ok_reply(xid: u32, body: &[u8]) -> Vec<u8> {
    let mut r = words(&[xid, 1, 0, 0, 0, 0]);
    r.extend_from_slice(body);
    r
}

fn record(frags: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, f) in frags.iter().enumerate() {
        let last = if i + 1 == frags.len() { 0x8000_0000 } else { 0 };
        out.extend_from_slice(&(last | f.len() as u32).to_be_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// A peer running `script` on its one connection; returns a client on it.
fn peer(limits: Limits, script: impl FnOnce(TcpStream) + Send + 'static) -> (RpcConn, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        script(s);
    });
    let c = RpcConn::connect(&a.to_string(), &Auth::sys(1000, 1000), limits).unwrap();
    (c, h)
}

fn short() -> Limits {
    Limits { timeout: Duration::from_millis(500), ..Limits::default() }
}

#[test]
fn multi_fragment_reply_is_reassembled() {
    let (mut c, h) = peer(short(), |mut s| {
        let (xid, call) = read_call(&mut s).unwrap();
        // The call carries AUTH_SYS uid 1000: cred flavor 1 after the 6 header words.
        assert_eq!(&call[24..28], &1u32.to_be_bytes());
        let body: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let r = ok_reply(xid, &body);
        // Three fragments, written a few bytes at a time.
        let rec = record(&[&r[..7], &r[7..5000], &r[5000..]]);
        for c in rec.chunks(333) {
            s.write_all(c).unwrap();
        }
        thread::sleep(Duration::from_millis(200));
    });
    let r = c.call(7, 1, 3, &|e| e.u32(42)).unwrap();
    assert_eq!(r.body().len(), 10_000);
    assert!(r.body().iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    h.join().unwrap();
}

#[test]
fn pipelined_replies_out_of_order_match_their_xids() {
    const N: usize = 64;
    let (mut c, h) = peer(short(), |mut s| {
        let mut calls = Vec::new();
        for _ in 0..N {
            calls.push(read_call(&mut s).unwrap());
        }
        // Answer in reverse order; the body echoes the argument word.
        for (xid, call) in calls.iter().rev() {
            let arg = &call[call.len() - 4..];
            s.write_all(&record(&[&ok_reply(*xid, arg)])).unwrap();
        }
        thread::sleep(Duration::from_millis(200));
    });
    let mut xids = Vec::new();
    for i in 0..N as u32 {
        xids.push((c.submit(7, 1, 3, &|e| e.u32(i * 3)).unwrap(), i * 3));
    }
    assert_eq!(c.in_flight(), N);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < N && Instant::now() < deadline {
        c.reap(&mut got, Duration::from_millis(100));
    }
    assert_eq!(got.len(), N);
    for done in &got {
        let want = xids.iter().find(|(x, _)| *x == done.xid).expect("a submitted xid").1;
        let body = done.result.as_ref().unwrap().body();
        assert_eq!(body, &want.to_be_bytes(), "reply of xid {:#x}", done.xid);
    }
    // The first reply to arrive was the last call's.
    assert_eq!(got[0].xid, xids[N - 1].0);
    h.join().unwrap();
}

/// Body of reply `i` (its length varies, 1 byte to ~9 KiB; every 50th
/// ~150 KB, longer than a receive chunk: read straight into its record).
fn body_of(i: u32) -> Vec<u8> {
    let len = if i % 50 == 3 { 150_000 + i as usize * 13 } else { 1 + (i as usize * 1237) % 9000 };
    (0..len).map(|k| (k as u32).wrapping_mul(31).wrapping_add(i * 7) as u8).collect()
}

#[test]
fn replies_split_anywhere_and_held_past_the_receive_chunks_read_back_intact() {
    // 600 replies (~4.5 MB) streamed in writes of every size from 1 byte
    // to 70 KB, every 7th in three fragments, 12 longer than a receive chunk; the client holds every reply
    // until all are in, so its receive chunks (8 x 64 KiB) run out and
    // later receives copy. Each body must be exactly what was sent.
    const N: u32 = 600;
    let limits = Limits { in_flight_max: 1024, timeout: Duration::from_secs(10), ..Limits::default() };
    let (mut c, h) = peer(limits, |mut s| {
        let mut calls = Vec::new();
        for _ in 0..N {
            calls.push(read_call(&mut s).unwrap());
        }
        let mut stream = Vec::new();
        for (xid, call) in &calls {
            let i = u32::from_be_bytes(call[call.len() - 4..].try_into().unwrap());
            let r = ok_reply(*xid, &body_of(i));
            if i % 7 == 0 && r.len() > 40 {
                stream.extend_from_slice(&record(&[&r[..10], &r[10..r.len() / 2], &r[r.len() / 2..]]));
            } else {
                stream.extend_from_slice(&record(&[&r]));
            }
        }
        let sizes = [1usize, 3, 4, 5, 4093, 65_536, 70_000, 17, 9000, 2];
        let (mut at, mut k) = (0, 0);
        while at < stream.len() {
            let n = sizes[k % sizes.len()].min(stream.len() - at);
            s.write_all(&stream[at..at + n]).unwrap();
            at += n;
            k += 1;
            if k % 5 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        thread::sleep(Duration::from_millis(300));
    });
    let mut xids = std::collections::HashMap::new();
    for i in 0..N {
        xids.insert(c.submit(7, 1, 3, &|e| e.u32(i)).unwrap(), i);
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < N as usize && Instant::now() < deadline {
        c.reap(&mut got, Duration::from_millis(100));
    }
    assert_eq!(got.len(), N as usize);
    for done in &got {
        let i = xids[&done.xid];
        assert!(done.result.as_ref().unwrap().body() == &body_of(i)[..], "body of reply {i}");
    }
    let in_place = c.in_place_records();
    assert!(in_place > 0 && in_place < N as u64, "{in_place} of {N} replies in place: both ways must have been taken");
    // Handing them back frees their chunks.
    for done in got {
        c.recycle(done.result.unwrap());
    }
    h.join().unwrap();
}

#[test]
fn rpc_level_errors_are_named() {
    let (mut c, h) = peer(short(), |mut s| {
        let replies: Vec<Box<dyn Fn(u32) -> Vec<u8>>> = vec![
            Box::new(|x| words(&[x, 1, 0, 0, 0, 1])),        // PROG_UNAVAIL
            Box::new(|x| words(&[x, 1, 0, 0, 0, 2, 2, 3])),  // PROG_MISMATCH 2..3
            Box::new(|x| words(&[x, 1, 0, 0, 0, 3])),        // PROC_UNAVAIL
            Box::new(|x| words(&[x, 1, 0, 0, 0, 4])),        // GARBAGE_ARGS
            Box::new(|x| words(&[x, 1, 0, 0, 0, 5])),        // SYSTEM_ERR
            Box::new(|x| words(&[x, 1, 1, 0, 2, 2])),        // RPC_MISMATCH 2..2
            Box::new(|x| words(&[x, 1, 1, 1, 5])),           // AUTH_TOOWEAK
        ];
        for f in replies {
            let (xid, _) = read_call(&mut s).unwrap();
            s.write_all(&record(&[&f(xid)])).unwrap();
        }
        thread::sleep(Duration::from_millis(200));
    });
    let mut errs = Vec::new();
    for _ in 0..7 {
        errs.push(c.call(7, 1, 3, &|_| Ok(())).unwrap_err());
    }
    let names: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert!(names[0].contains("PROG_UNAVAIL"), "{names:?}");
    assert_eq!(errs[1], Error::Accept { stat: "PROG_MISMATCH", code: 2, low: 2, high: 3 });
    assert!(names[2].contains("PROC_UNAVAIL"));
    assert!(names[3].contains("GARBAGE_ARGS"));
    assert!(names[4].contains("SYSTEM_ERR"));
    assert_eq!(errs[5], Error::RpcMismatch { low: 2, high: 2 });
    assert_eq!(errs[6], Error::AuthError { stat: "AUTH_TOOWEAK", code: 5 });
    // None of these broke the connection.
    assert!(c.broken().is_none());
    h.join().unwrap();
}

#[test]
fn huge_record_mark_fails_before_buffering() {
    let (mut c, h) = peer(short(), |mut s| {
        let (_xid, _) = read_call(&mut s).unwrap();
        s.write_all(&(0x8000_0000u32 | 0x7fff_0000).to_be_bytes()).unwrap();
        thread::sleep(Duration::from_millis(300));
    });
    let e = c.call(7, 1, 3, &|_| Ok(())).unwrap_err();
    assert!(matches!(e, Error::ReplyTooLarge { len: 0x7fff_0000, .. }), "{e}");
    // The connection is broken and says so on the next call.
    assert!(c.submit(7, 1, 3, &|_| Ok(())).unwrap_err().is_connection());
    h.join().unwrap();
}

#[test]
fn wrong_xid_breaks_the_connection() {
    let (mut c, h) = peer(short(), |mut s| {
        let (xid, _) = read_call(&mut s).unwrap();
        s.write_all(&record(&[&ok_reply(xid ^ 0x5555, b"")])).unwrap();
        thread::sleep(Duration::from_millis(300));
    });
    let e = c.call(7, 1, 3, &|_| Ok(())).unwrap_err();
    assert!(matches!(e, Error::UnexpectedXid(_)), "{e}");
    h.join().unwrap();
}

#[test]
fn truncated_record_then_close_is_a_closed_error() {
    let (mut c, h) = peer(short(), |mut s| {
        let (xid, _) = read_call(&mut s).unwrap();
        let r = record(&[&ok_reply(xid, &[9; 100])]);
        s.write_all(&r[..50]).unwrap();
        // drop: the connection closes mid-record
    });
    let e = c.call(7, 1, 3, &|_| Ok(())).unwrap_err();
    assert_eq!(e, Error::Closed, "{e}");
    h.join().unwrap();
}

#[test]
fn truncated_reply_body_is_malformed_not_a_panic() {
    let (mut c, h) = peer(short(), |mut s| {
        let (xid, _) = read_call(&mut s).unwrap();
        // xid, REPLY, MSG_ACCEPTED, then the record ends inside the verifier.
        s.write_all(&record(&[&words(&[xid, 1, 0, 0])])).unwrap();
        thread::sleep(Duration::from_millis(200));
    });
    let e = c.call(7, 1, 3, &|_| Ok(())).unwrap_err();
    assert!(matches!(e, Error::Malformed(_)), "{e}");
    h.join().unwrap();
}

#[test]
fn silent_server_times_out_naming_the_call() {
    let (mut c, h) = peer(short(), |mut s| {
        let _ = read_call(&mut s);
        thread::sleep(Duration::from_millis(1200));
    });
    let t = Instant::now();
    let xid = c.submit(7, 1, 9, &|_| Ok(())).unwrap();
    let e = c.wait(xid).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(450) && t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(e, Error::Timeout { xid, proc_num: 9, after: Duration::from_millis(500) });
    assert!(e.to_string().contains("procedure 9"), "{e}");
    assert_eq!(e.errno(), libc::ETIMEDOUT);
    h.join().unwrap();
}

#[test]
fn bounds_on_calls() {
    let lim = Limits { in_flight_max: 2, call_bytes_max: 1024, ..short() };
    let (mut c, h) = peer(lim, |mut s| {
        let _ = read_call(&mut s);
        thread::sleep(Duration::from_millis(300));
    });
    assert_eq!(c.submit(7, 1, 3, &|e| e.opaque_var(&[0; 2000])).unwrap_err(), Error::CallTooLarge { max: 1024 });
    c.submit(7, 1, 3, &|_| Ok(())).unwrap();
    c.submit(7, 1, 3, &|_| Ok(())).unwrap();
    assert_eq!(c.submit(7, 1, 3, &|_| Ok(())).unwrap_err(), Error::TooManyInFlight { max: 2 });
    drop(c);
    h.join().unwrap();
}

#[test]
fn send_queue_is_bounded_when_the_peer_does_not_read() {
    const CALL: usize = 512 << 10;
    let lim = Limits { send_queue_bytes_max: 1 << 20, ..short() };
    let (mut c, h) = peer(lim, |_s| thread::sleep(Duration::from_millis(800)));
    let payload = vec![7u8; CALL];
    let mut accepted = 0;
    let err = loop {
        match c.submit(7, 1, 3, &|e| e.opaque_var(&payload)) {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 200, "64+ MiB accepted: the queue is not bounded");
    };
    assert!(matches!(err, Error::SendQueueFull { max: 0x10_0000, .. }), "{err}");
    // The kernel took some; at most the bound (plus one call) waits with us.
    assert!(accepted >= 2, "{accepted}");
    drop(c);
    h.join().unwrap();
}

#[test]
fn nobody_listening_is_a_connect_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap().to_string();
    drop(l);
    let e = RpcConn::connect(&a, &Auth::None, short()).err().expect("no server");
    assert!(matches!(&e, Error::Connect { addr, .. } if *addr == a), "{e}");
}

#[test]
fn errno_of_each_kind() {
    let n3 = |code: u32| Error::Nfs3 { stat: String::new(), code }.errno();
    // Classic values pass through; the BSD-numbered ones are translated.
    assert_eq!(n3(2), libc::ENOENT);
    assert_eq!(n3(28), libc::ENOSPC);
    assert_eq!(n3(63), libc::ENAMETOOLONG);
    assert_eq!(n3(66), libc::ENOTEMPTY);
    assert_eq!(n3(69), libc::EDQUOT);
    assert_eq!(n3(70), libc::ESTALE);
    assert_eq!(n3(10001), libc::ESTALE);
    assert_eq!(n3(10008), libc::EAGAIN);
    assert_eq!(n3(10006), libc::EIO);
    assert_eq!(Error::Nfs4 { op: "OP_OPEN".into(), stat: String::new(), code: 10008 }.errno(), libc::EAGAIN);
    assert_eq!(Error::Closed.errno(), libc::ECONNRESET);
    assert_eq!(Error::UnexpectedXid(1).errno(), libc::EPROTO);
    assert_eq!(Error::AuthError { stat: "AUTH_TOOWEAK", code: 5 }.errno(), libc::EACCES);
    assert_eq!(Error::VerifierChanged { ranges: vec![], resendable: true }.errno(), libc::EIO);
}

/// Calls the server makes on the connection (a back channel) never fail
/// it: accepted, they are kept for `take_call` up to `CALLS_MAX` records of
/// at most `CALL_BYTES_MAX`, the rest dropped and counted; not accepted,
/// all are dropped. Replies around them complete as usual.
#[test]
fn server_calls_are_kept_bounded_or_dropped() {
    use client::rpc::{CALLS_MAX, CALL_BYTES_MAX};
    for accept in [true, false] {
        let (mut c, h) = peer(short(), |mut s| {
            let (xid, _) = read_call(&mut s).unwrap();
            let mut out = Vec::new();
            out.extend(record(&[&words(&[0x900, 0, 2, 0x4000_0000, 1, 0, 0, 0, 0, 0])]));
            let mut big = words(&[0x901, 0, 2, 0x4000_0000, 1, 0, 0, 0, 0, 0]);
            big.resize(CALL_BYTES_MAX + 4, 0);
            out.extend(record(&[&big]));
            for k in 0..20u32 {
                out.extend(record(&[&words(&[0x910 + k, 0, 2, 0x4000_0000, 1, 0, 0, 0, 0, 0])]));
            }
            out.extend(record(&[&ok_reply(xid, b"done")]));
            s.write_all(&out).unwrap();
            // The client's reply to one of them arrives as a record.
            let (x, b) = read_call(&mut s).unwrap();
            assert_eq!((x, &b[4..8]), (0x900, &[0, 0, 0, 1][..]));
        });
        c.accept_calls(accept);
        let r = c.call(100003, 3, 0, &|_| Ok(())).expect("the reply after the calls");
        assert_eq!(r.body(), b"done");
        assert!(c.broken().is_none(), "calls never break the connection");
        let kept: Vec<u32> = std::iter::from_fn(|| c.take_call()).map(|r| u32::from_be_bytes(r[..4].try_into().unwrap())).collect();
        if accept {
            assert_eq!(kept.len(), CALLS_MAX);
            assert_eq!(kept[0], 0x900);
            assert_eq!(kept[1], 0x910, "the oversized call was dropped");
            assert_eq!(c.calls_dropped(), 1 + (21 - CALLS_MAX as u64));
        } else {
            assert!(kept.is_empty());
            assert_eq!(c.calls_dropped(), 22);
        }
        c.send_reply(&words(&[0x900, 1, 0, 0, 0, 0])).unwrap();
        h.join().unwrap();
    }
}

/// No RDMA device reaches the address here (the guest suite runs the real
/// transport): the connect fails at once, saying it was RDMA that failed
/// (rdma-core missing, or no device for the address), and nothing hangs.
#[test]
fn rdma_without_a_device_fails_at_connect_naming_rdma() {
    let t0 = Instant::now();
    let limits = Limits { connect_timeout: Duration::from_secs(2), ..short() };
    let e = RpcConn::connect_rdma("127.0.0.1:20049", &Auth::None, limits).err().expect("this host has no RDMA device");
    let m = e.to_string();
    assert!(matches!(e, Error::Connect { .. }) && m.contains("127.0.0.1:20049") && m.contains("over RDMA:"), "{m}");
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
}

/// The test's reply shape for sinks: a length word, then that many data bytes.
fn len_prefixed(body: &[u8]) -> Option<(usize, usize)> {
    body.get(0..4).map(|w| (4, u32::from_be_bytes(w.try_into().unwrap()) as usize))
}

fn data_of(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k as u32).wrapping_mul(13).wrapping_add(i * 29) as u8).collect()
}

#[test]
fn replies_longer_than_a_chunk_land_in_their_sinks_and_nothing_else_does() {
    // Per call i: a sink of `cap` bytes (pre-filled with 0x5a) and a reply
    // of a length prefix + `len` data bytes (+ XDR padding), streamed in
    // uneven writes. Placed: large single-fragment replies that fit. Not
    // placed (body as usual, sink untouched): small ones, one larger than
    // its sink, one in two fragments, one with no sink.
    let cases: Vec<(usize, usize, bool, bool)> = vec![
        // (len, cap, fragments, sink set)
        (300_000, 300_000, false, true),
        (150_001, 160_000, false, true),
        (4_000, 4_096, false, true),
        (200_000, 100_000, false, true),
        (200_000, 200_000, true, true),
        (180_000, 180_000, false, false),
        (1 << 20, 1 << 20, false, true),
    ];
    let n = cases.len();
    let script_cases = cases.clone();
    let limits = Limits { timeout: Duration::from_secs(10), ..Limits::default() };
    let (mut c, h) = peer(limits, move |mut s| {
        let mut calls = Vec::new();
        for _ in 0..script_cases.len() {
            calls.push(read_call(&mut s).unwrap());
        }
        let mut stream = Vec::new();
        for (xid, call) in &calls {
            let i = u32::from_be_bytes(call[call.len() - 4..].try_into().unwrap());
            let (len, _, frags, _) = script_cases[i as usize];
            let mut body = (len as u32).to_be_bytes().to_vec();
            body.extend_from_slice(&data_of(i, len));
            body.resize(body.len().next_multiple_of(4), 0);
            let r = ok_reply(*xid, &body);
            if frags {
                stream.extend_from_slice(&record(&[&r[..r.len() / 3], &r[r.len() / 3..]]));
            } else {
                stream.extend_from_slice(&record(&[&r]));
            }
        }
        let sizes = [7usize, 100_000, 65_536, 3, 250_000, 4093, 70_000];
        let (mut at, mut k) = (0, 0);
        while at < stream.len() {
            let m = sizes[k % sizes.len()].min(stream.len() - at);
            s.write_all(&stream[at..at + m]).unwrap();
            at += m;
            k += 1;
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(300));
    });
    let mut sinks: Vec<Vec<u8>> = cases.iter().map(|&(_, cap, _, _)| vec![0x5a; cap]).collect();
    let mut xids = std::collections::HashMap::new();
    for i in 0..n as u32 {
        let x = c.submit(7, 1, 3, &|e| e.u32(i)).unwrap();
        let (_, cap, _, set) = cases[i as usize];
        if set {
            // SAFETY: the sink outlives the call and is not touched until reaped.
            unsafe { c.set_sink(x, sinks[i as usize].as_mut_ptr(), cap, len_prefixed) };
        }
        xids.insert(x, i);
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < n && Instant::now() < deadline {
        c.reap(&mut got, Duration::from_millis(100));
    }
    assert_eq!(got.len(), n);
    for done in &got {
        let i = xids[&done.xid];
        let (len, cap, _, _) = cases[i as usize];
        let r = done.result.as_ref().unwrap();
        let want = data_of(i, len);
        let placed = matches!(i, 0 | 1 | 6);
        if placed {
            assert_eq!(r.placed(), Some(len), "reply {i} placed");
            assert!(sinks[i as usize][..len] == want[..], "reply {i}'s data in its sink");
            assert!(sinks[i as usize][len..].iter().all(|&b| b == 0x5a), "nothing past reply {i}'s data");
            assert_eq!(r.body().len(), (4 + len).next_multiple_of(4) - len, "reply {i}'s body: the prefix and padding");
        } else {
            assert_eq!(r.placed(), None, "reply {i} not placed");
            assert!(r.body()[4..4 + len] == want[..], "reply {i}'s data in its body");
            assert!(sinks[i as usize][..cap].iter().all(|&b| b == 0x5a), "reply {i}'s sink untouched");
        }
    }
    assert_eq!(c.placed_records(), 3);
    h.join().unwrap();
}

#[test]
fn a_call_that_times_out_mid_reply_gets_no_more_bytes_in_its_sink() {
    const LEN: usize = 400_000;
    let (mut c, h) = peer(short(), |mut s| {
        let (xid, _) = read_call(&mut s).unwrap();
        let mut body = (LEN as u32).to_be_bytes().to_vec();
        body.extend_from_slice(&data_of(1, LEN));
        let rec = record(&[&ok_reply(xid, &body)]);
        // A third now, the rest after the call's 500 ms timeout.
        s.write_all(&rec[..rec.len() / 3]).unwrap();
        thread::sleep(Duration::from_millis(900));
        s.write_all(&rec[rec.len() / 3..]).unwrap();
        // Then a small reply to a second call: the stream stayed in step.
        let (xid2, _) = read_call(&mut s).unwrap();
        s.write_all(&record(&[&ok_reply(xid2, &[0, 0, 0, 7])])).unwrap();
        thread::sleep(Duration::from_millis(200));
    });
    let mut sink = vec![0u8; LEN];
    let x = c.submit(7, 1, 3, &|e| e.u32(1)).unwrap();
    // SAFETY: the sink outlives the connection's use of it.
    unsafe { c.set_sink(x, sink.as_mut_ptr(), LEN, len_prefixed) };
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.is_empty() && Instant::now() < deadline {
        c.reap(&mut got, Duration::from_millis(50));
    }
    assert!(matches!(got[0].result, Err(Error::Timeout { .. })), "{:?}", got[0].result.as_ref().err());
    // The buffer is the caller's again: whatever arrives late stays out.
    sink.fill(0xa5);
    let r = c.call(7, 1, 3, &|e| e.u32(2)).expect("the next call on the connection");
    assert_eq!(r.body(), &[0, 0, 0, 7]);
    assert!(sink.iter().all(|&b| b == 0xa5), "bytes of the late reply landed in the returned buffer");
    h.join().unwrap();
}
