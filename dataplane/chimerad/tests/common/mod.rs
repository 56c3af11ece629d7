//! A minimal HTTP/1.1 client for the tests (one request per connection, with
//! timeouts), so tests talk to the server over a real socket exactly as the
//! CSI controller and the operator do.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub mod certs;
pub mod held_port;

pub const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
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
    let mut s = connect(addr);
    exchange(&mut s, method, path, token, body, extra).expect("HTTP exchange")
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, TIMEOUT).expect("connect");
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    s
}

/// The same request over HTTPS: the server's certificate must chain to
/// `ca_pem` and name `server_name`. `Err` when TLS fails (an untrusted
/// server, a wrong name), with rustls's reason.
pub fn request_tls(
    addr: SocketAddr,
    server_name: &str,
    ca_pem: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
) -> Result<Reply, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(chimerad::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, connect(addr));
    exchange(&mut s, method, path, token, body, &[]).map_err(|e| e.to_string())
}

pub fn get_tls(addr: SocketAddr, server_name: &str, ca_pem: &str, path: &str, token: Option<&str>) -> Result<Reply, String> {
    request_tls(addr, server_name, ca_pem, "GET", path, token, None)
}

/// One request and its reply on an open connection (`Connection: close`).
pub fn exchange<S: Read + Write>(
    s: &mut S,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
    extra: &[(&str, &str)],
) -> std::io::Result<Reply> {
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
    s.write_all(&out)?;
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        Ok(_) => {}
        // A TLS peer that closes without close_notify after a full reply.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    if raw.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed without a reply"));
    }
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("reply has a head");
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = headers.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status code");
    let body = raw[split + 4..].to_vec();
    let len: Option<usize> = headers
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.trim().parse().unwrap()));
    if let Some(len) = len {
        assert_eq!(len, body.len(), "Content-Length matches the body");
    }
    Ok(Reply { status, headers, body })
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
