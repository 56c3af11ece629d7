//! Proves that rpcbench speaks ONC RPC correctly and refuses to report numbers
//! for a server that does not answer NULL properly: the call bytes match the
//! RFC 5531 layout word by word; replies turning from valid to invalid (wrong
//! xid, denied, PROG_UNAVAIL, truncated, trailing bytes, oversize records) are
//! rejected with an error naming the problem; and end to end against small
//! in-test servers on loopback, a measurement returns exactly the calls asked
//! for, while a misbehaving server makes it fail.

#[path = "../../chimerad/tests/common/held_port.rs"]
mod held_port;

use rpcbench::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

#[test]
fn null_call_matches_rfc5531_layout() {
    let mut buf = [0u8; RECORD_MARK_BYTES + NULL_CALL_BYTES];
    encode_null_call(&mut buf, 0xdead_beef, 100003, 3);
    let want = words(&[0x8000_0028, 0xdead_beef, 0, 2, 100003, 3, 0, 0, 0, 0, 0]);
    assert_eq!(buf.to_vec(), want);
    assert_eq!(buf.len(), 44);
}

fn ok_reply(xid: u32) -> Vec<u8> {
    words(&[xid, 1, 0, 0, 0, 0])
}

#[test]
fn reply_checks_from_valid_to_invalid() {
    assert_eq!(check_null_reply(&ok_reply(7), 7), Ok(()));
    assert_eq!(ok_reply(7).len(), NULL_REPLY_BYTES);
    // A verifier with a body (e.g. 5 bytes, padded to 8) is skipped correctly.
    let mut with_verf = words(&[7, 1, 0, 1, 5]);
    with_verf.extend_from_slice(&[1, 2, 3, 4, 5, 0, 0, 0]);
    with_verf.extend(words(&[0]));
    assert_eq!(check_null_reply(&with_verf, 7), Ok(()));

    assert_eq!(check_null_reply(&ok_reply(8), 7), Err(ReplyError::WrongXid { want: 7, got: 8 }));
    assert_eq!(check_null_reply(&words(&[7, 0, 0, 0, 0, 0]), 7), Err(ReplyError::NotAReply { mtype: 0 }));
    assert_eq!(check_null_reply(&words(&[7, 1, 1, 1]), 7), Err(ReplyError::Denied { reject_stat: 1 }));
    let unavail = words(&[7, 1, 0, 0, 0, 1]);
    let e = check_null_reply(&unavail, 7).unwrap_err();
    assert_eq!(e, ReplyError::NotAccepted { accept_stat: 1 });
    assert!(e.to_string().contains("PROG_UNAVAIL"), "{e}");
    assert!(matches!(check_null_reply(&ok_reply(7)[..20], 7), Err(ReplyError::Truncated { len: 20 })));
    assert!(matches!(check_null_reply(&[0u8; 3], 7), Err(ReplyError::Truncated { len: 3 })));
    let mut trailing = ok_reply(7);
    trailing.extend_from_slice(&[0; 4]);
    assert_eq!(check_null_reply(&trailing, 7), Err(ReplyError::Trailing { extra: 4 }));
    // A verifier length pointing past the end must not panic.
    assert!(matches!(check_null_reply(&words(&[7, 1, 0, 0, 0xffff_fff0, 0]), 7), Err(ReplyError::Truncated { .. })));
}

#[test]
fn read_record_joins_fragments_and_bounds_length() {
    let mut wire = words(&[4]); // not last
    wire.extend_from_slice(b"abcd");
    wire.extend(words(&[0x8000_0002]));
    wire.extend_from_slice(b"ef");
    let mut buf = [0u8; 16];
    let n = read_record(&mut &wire[..], &mut buf).unwrap();
    assert_eq!(&buf[..n], b"abcdef");

    let big = words(&[0x8000_0000 | 17]);
    let e = read_record(&mut &big[..], &mut buf).unwrap_err();
    assert!(e.to_string().contains("exceeds the 16-byte limit"), "{e}");
}

#[test]
fn percentile_is_nearest_rank() {
    let v: Vec<u32> = (1..=100).collect();
    assert_eq!(percentile(&v, 50.0), 50);
    assert_eq!(percentile(&v, 99.0), 99);
    assert_eq!(percentile(&v, 99.9), 100);
    assert_eq!(percentile(&v, 0.0), 1);
    assert_eq!(percentile(&[5], 99.0), 5);
}

/// A one-connection RPC server that answers every record with `reply(xid)`.
fn fake_rpc_server(reply: fn(u32) -> Vec<u8>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 1024];
        while let Ok(n) = read_record(&mut s, &mut buf) {
            assert_eq!(n, NULL_CALL_BYTES, "client sent a {n}-byte call");
            let xid = u32::from_be_bytes(buf[..4].try_into().unwrap());
            let body = reply(xid);
            let mut out = words(&[0x8000_0000 | body.len() as u32]);
            out.extend(body);
            if s.write_all(&out).is_err() {
                return;
            }
        }
    });
    addr
}

#[test]
fn null_measurement_counts_every_call() {
    let addr = fake_rpc_server(ok_reply);
    let mut c = NullClient::connect(addr, NFS_PROGRAM, NFS_V3).unwrap();
    let s = measure(&mut c, 10, 200, 0).unwrap();
    assert_eq!(s.calls, 200);
    assert!(s.rtt_us_p50 > 0.0 && s.rtt_us_p50 <= s.rtt_us_p99 && s.rtt_us_p99 <= s.rtt_us_max, "{s:?}");
    assert!(s.calls_per_s > 0.0);
    let j = s.to_json();
    assert!(j.starts_with("{\"calls\":200,") && j.contains("\"rtt_us_p50\":"), "{j}");
}

#[test]
fn null_measurement_fails_on_a_refusing_server() {
    let addr = fake_rpc_server(|xid| words(&[xid, 1, 0, 0, 0, 1]));
    let mut c = NullClient::connect(addr, NFS_PROGRAM, NFS_V3).unwrap();
    let e = measure(&mut c, 0, 10, 0).unwrap_err();
    assert!(e.to_string().contains("PROG_UNAVAIL"), "{e}");

    let addr = fake_rpc_server(|xid| ok_reply(xid ^ 1));
    let mut c = NullClient::connect(addr, NFS_PROGRAM, NFS_V3).unwrap();
    let e = measure(&mut c, 0, 10, 0).unwrap_err();
    assert!(e.to_string().contains("does not match call xid"), "{e}");
}

#[test]
fn null_measurement_fails_when_the_server_hangs_up() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 44];
        let _ = s.read_exact(&mut b);
        // Dropping the stream closes the connection without a reply.
    });
    let mut c = NullClient::connect(addr, NFS_PROGRAM, NFS_V3).unwrap();
    let e = measure(&mut c, 0, 5, 0).unwrap_err();
    assert!(e.to_string().contains("closed the connection"), "{e}");
}

#[test]
fn connecting_to_nothing_names_the_address() {
    let (_held, port) = held_port::held_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let e = NullClient::connect(addr, NFS_PROGRAM, NFS_V3).err().expect("connect should fail");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

#[test]
fn echo_has_the_rpc_message_sizes() {
    let srv = EchoServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    // Raw view: 44 bytes out, 28 bytes back starting with the call's xid.
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    let mut call = [0u8; RECORD_MARK_BYTES + NULL_CALL_BYTES];
    encode_null_call(&mut call, 42, NFS_PROGRAM, NFS_V3);
    s.write_all(&call).unwrap();
    let mut reply = [0u8; RECORD_MARK_BYTES + NULL_REPLY_BYTES];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..8], &words(&[0x8000_0018, 42])[..]);

    let mut c = EchoClient::connect(srv.addr()).unwrap();
    let st = measure(&mut c, 10, 300, 0).unwrap();
    assert_eq!(st.calls, 300);
    assert!(st.rtt_us_p50 > 0.0);
}
