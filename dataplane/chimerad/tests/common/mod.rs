//! A minimal HTTP/1.1 client for the tests (one request per connection, with
//! timeouts), so tests talk to the server over a real socket exactly as the
//! CSI controller and the operator do.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub const TIMEOUT: Duration = Duration::from_secs(10);

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("status {} body not JSON ({e}): {}", self.status, self.text()))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The `error` message of an error reply.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_else(|| panic!("no error field: {}", self.text())).to_string()
    }
}

pub fn request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&[u8]>, extra: &[(&str, &str)]) -> Reply {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).expect("connect");
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if let Some(b) = body {
        out.extend_from_slice(b);
    }
    s.write_all(&out).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read reply");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("reply has a head");
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = headers.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status code");
    let body = raw[split + 4..].to_vec();
    let len: Option<usize> = headers
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: ").map(|v| v.trim().parse().unwrap()));
    if let Some(len) = len {
        assert_eq!(len, body.len(), "Content-Length matches the body");
    }
    Reply { status, headers, body }
}

pub fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Reply {
    request(addr, "GET", path, token, None, &[])
}

pub fn send(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &Value) -> Reply {
    request(addr, method, path, token, Some(body.to_string().as_bytes()), &[])
}

/// One ONC RPC call over TCP (RFC 5531, AUTH_NONE, single-fragment record);
/// returns the procedure's result bytes after checking the reply is
/// MSG_ACCEPTED / SUCCESS for our xid.
pub fn rpc_call(s: &mut TcpStream, xid: u32, prog: u32, vers: u32, proc_num: u32, args: &[u8]) -> Vec<u8> {
    let (accept_stat, res) = rpc_call_raw(s, xid, prog, vers, proc_num, args);
    assert_eq!(accept_stat, 0, "accept_stat SUCCESS");
    res
}

/// Like `rpc_call`, but returns (accept_stat, result bytes) for any
/// MSG_ACCEPTED reply (PROG_UNAVAIL = 1, PROC_UNAVAIL = 3, ...).
pub fn rpc_call_raw(s: &mut TcpStream, xid: u32, prog: u32, vers: u32, proc_num: u32, args: &[u8]) -> (u32, Vec<u8>) {
    let mut body = Vec::new();
    for w in [xid, 0, 2, prog, vers, proc_num, 0, 0, 0, 0] {
        body.extend_from_slice(&w.to_be_bytes());
    }
    body.extend_from_slice(args);
    let mut rec = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(&body);
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(&rec).unwrap();
    let mut mark = [0u8; 4];
    s.read_exact(&mut mark).unwrap();
    let m = u32::from_be_bytes(mark);
    assert!(m & 0x8000_0000 != 0, "single-fragment reply");
    let mut reply = vec![0u8; (m & 0x7fff_ffff) as usize];
    s.read_exact(&mut reply).unwrap();
    let w = |i: usize| u32::from_be_bytes(reply[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!(w(0), xid);
    assert_eq!((w(1), w(2)), (1, 0), "REPLY, MSG_ACCEPTED");
    let verf_len = w(4) as usize;
    let at = 20 + verf_len.div_ceil(4) * 4;
    (u32::from_be_bytes(reply[at..at + 4].try_into().unwrap()), reply[at + 4..].to_vec())
}

/// XDR variable-length opaque/string.
pub fn xdr_opaque(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v.resize(4 + b.len().div_ceil(4) * 4, 0);
    v
}
