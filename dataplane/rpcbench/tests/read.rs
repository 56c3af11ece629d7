//! The READ measurement: replies are read and checked right (fragments
//! joined, sizes bounded, short or failed READs refused with the reason), and
//! end to end against an in-test MOUNT3 + NFSv3 server on loopback the client
//! mounts, looks the file up, reads only aligned offsets inside it, and the
//! echo of the same bytes answers with the same sizes.

use rpcbench::nfs::*;
use rpcbench::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// Hands out its bytes `step` at a time, as a slow socket would.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn replies_are_joined_bounded_and_complete() {
    let mut one = words(&[0x8000_0008, 7, 8]);
    let mut buf = [0u8; 64];
    let (a, b) = read_reply(&mut Trickle { data: &one, step: 100 }, &mut buf).unwrap();
    assert_eq!(&buf[a..b], &words(&[7, 8])[..]);
    // Two fragments, arriving a byte at a time, are joined.
    let mut two = words(&[4, 1]);
    two.extend(words(&[0x8000_0008, 2, 3]));
    let (a, b) = read_reply(&mut Trickle { data: &two, step: 1 }, &mut buf).unwrap();
    assert_eq!(&buf[a..b], &words(&[1, 2, 3])[..]);
    // Longer than the buffer: refused before reading the body.
    let big = words(&[0x8000_1000]);
    let e = read_reply(&mut Trickle { data: &big, step: 4 }, &mut buf).unwrap_err();
    assert!(e.to_string().contains("exceeds the 64-byte limit"), "{e}");
    // Bytes nobody asked for after the reply.
    one.extend(words(&[9]));
    let e = read_reply(&mut Trickle { data: &one, step: 100 }, &mut buf).unwrap_err();
    assert!(e.to_string().contains("after the reply"), "{e}");
    // The server hangs up half way.
    let e = read_reply(&mut Trickle { data: &words(&[0x8000_0008, 7]), step: 100 }, &mut buf).unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");
}

fn read_results(status: u32, count: u32, data: u32) -> Vec<u8> {
    let mut r = words(&[status, 0, count, 0, data]);
    r.extend(vec![0xab; data as usize]);
    r
}

#[test]
fn read_results_are_checked() {
    assert_eq!(check_read_results(&read_results(0, 4096, 4096), 4096), Ok(()));
    let e = check_read_results(&read_results(0, 100, 100), 4096).unwrap_err();
    assert!(e.contains("100 bytes"), "{e}");
    assert_eq!(check_read_results(&words(&[70, 0]), 4096).unwrap_err(), "nfsstat3 70");
    let mut cut = read_results(0, 4096, 4096);
    cut.truncate(1000);
    assert!(check_read_results(&cut, 4096).unwrap_err().contains("truncated"));
    assert!(check_read_results(&words(&[0, 7]), 4096).unwrap_err().contains("post_op_attr"));
    // Results with attributes (84 bytes of fattr3) are skipped correctly.
    let mut with_attrs = words(&[0, 1]);
    with_attrs.extend(vec![0u8; 84]);
    with_attrs.extend(words(&[8, 0, 8, 1, 2]));
    assert_eq!(check_read_results(&with_attrs, 8), Ok(()));
}

const FILE_BYTES: u64 = 64 * 4096 + 100;
const ROOT_FH: &[u8] = b"root-handle-0001";
const FILE_FH: &[u8] = b"file-handle-0002xyz";

fn reply_record(xid: u32, results: &[u8]) -> Vec<u8> {
    let mut body = words(&[xid, 1, 0, 0, 0, 0]);
    body.extend_from_slice(results);
    let mut out = words(&[0x8000_0000 | body.len() as u32]);
    out.extend(body);
    out
}

fn opaque_at(b: &[u8], at: usize) -> (&[u8], usize) {
    let n = u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    (&b[at + 4..at + 4 + n], at + 4 + n.div_ceil(4) * 4)
}

/// MOUNT3 and NFSv3 on one listener each, serving one file; READ answers
/// `short` bytes when set. Checks what the client sends.
fn fake_nfs(short: Option<u32>) -> (SocketAddr, SocketAddr) {
    let ml = TcpListener::bind("127.0.0.1:0").unwrap();
    let nl = TcpListener::bind("127.0.0.1:0").unwrap();
    let (maddr, naddr) = (ml.local_addr().unwrap(), nl.local_addr().unwrap());
    std::thread::spawn(move || {
        let (mut s, _) = ml.accept().unwrap();
        let mut buf = vec![0u8; 4096];
        let n = read_record(&mut s, &mut buf).unwrap();
        let b = &buf[..n];
        let w = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!((w(12), w(16), w(20), w(24)), (100005, 3, 1, 1), "MOUNT3 MNT with AUTH_SYS");
        let (_, at) = opaque_at(b, 28); // credential
        let (export, _) = opaque_at(b, at + 8);
        assert_eq!(export, b"/exp");
        let mut r = words(&[0, ROOT_FH.len() as u32]);
        r.extend_from_slice(ROOT_FH);
        r.extend(words(&[1, 1])); // one auth flavor
        s.write_all(&reply_record(w(0), &r)).unwrap();
    });
    std::thread::spawn(move || {
        let (mut s, _) = nl.accept().unwrap();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = read_record(&mut s, &mut buf) {
            let b = &buf[..n];
            let w = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
            assert_eq!((w(12), w(16)), (100003, 3));
            let (_, at) = opaque_at(b, 28);
            let args = at + 8;
            let results = match w(20) {
                3 => {
                    let (dir, at) = opaque_at(b, args);
                    let (name, _) = opaque_at(b, at);
                    assert_eq!((dir, name), (ROOT_FH, &b"bench.0"[..]));
                    let mut r = words(&[0, FILE_FH.len() as u32]);
                    r.extend_from_slice(FILE_FH);
                    r.extend_from_slice(&[0]); // pad to 20
                    r.extend(words(&[1, 1, 0o644, 1, 0, 0]));
                    r.extend_from_slice(&FILE_BYTES.to_be_bytes());
                    r.extend(vec![0u8; 84 - 28]);
                    r.extend(words(&[0])); // no dir attributes
                    r
                }
                6 => {
                    let (fh, at) = opaque_at(b, args);
                    assert_eq!(fh, FILE_FH);
                    let off = u64::from_be_bytes(b[at..at + 8].try_into().unwrap());
                    let count = w(at + 8);
                    assert_eq!(count, 4096);
                    assert!(off % 4096 == 0 && off + 4096 <= FILE_BYTES, "READ at {off} outside the file");
                    let n = short.unwrap_or(count);
                    read_results(0, n, n)
                }
                p => panic!("unexpected procedure {p}"),
            };
            if s.write_all(&reply_record(w(0), &results)).is_err() {
                return;
            }
        }
    });
    (naddr, maddr)
}

#[test]
fn reads_are_measured_and_echoed_with_their_sizes() {
    let (naddr, maddr) = fake_nfs(None);
    let mut c = ReadClient::connect(naddr, maddr, "/exp", "bench.0", 4096).unwrap();
    let st = measure(&mut c, 5, 200, 0).unwrap();
    assert_eq!(st.calls, 200);
    let reply = c.last_reply_bytes;
    assert_eq!(reply, 4 + 24 + 20 + 4096);
    let call = c.call_bytes().to_vec();
    let srv = EchoServer::start_sized("127.0.0.1:0".parse().unwrap(), call.len(), reply).unwrap();
    let mut e = EchoClient::with_message(srv.addr(), call, reply).unwrap();
    assert_eq!(measure(&mut e, 5, 100, 0).unwrap().calls, 100);
}

#[test]
fn a_short_read_or_a_small_file_fails_the_measurement() {
    let (naddr, maddr) = fake_nfs(Some(512));
    let mut c = ReadClient::connect(naddr, maddr, "/exp", "bench.0", 4096).unwrap();
    let e = measure(&mut c, 0, 10, 0).unwrap_err();
    assert!(e.to_string().contains("512 bytes"), "{e}");
    let (naddr, maddr) = fake_nfs(None);
    let e = ReadClient::connect(naddr, maddr, "/exp", "bench.0", 1 << 20).err().expect("file smaller than one READ");
    assert!(e.to_string().contains("less than one"), "{e}");
    assert!(ReadClient::connect(naddr, maddr, "/exp", "bench.0", 0).is_err());
}
