//! A small HTTP/1.1 server for the control path (admin API, `/metrics`).
//!
//! Runs on its own threads, never on the data-path cores: one acceptor thread
//! per listener and one thread per connection, at most `conns_max` at once
//! (more are answered 503 and closed). Everything a peer sends is bounded:
//! the request head (`HEAD_BYTES_MAX`, `HEADERS_MAX`), the body
//! (`body_bytes_max`, else 413), the time to send a request (`IO_TIMEOUT`),
//! and requests per connection (`REQUESTS_PER_CONN_MAX`). Only
//! `Content-Length` bodies are accepted; chunked uploads get 411, since none
//! of our clients send them.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Request line plus headers.
pub const HEAD_BYTES_MAX: usize = 16 << 10;
pub const HEADERS_MAX: usize = 64;
/// Per read/write deadline; also how long an idle keep-alive connection lives.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
pub const REQUESTS_PER_CONN_MAX: usize = 1000;
/// How often the acceptor checks the stop flag while idle.
const ACCEPT_POLL_MS: i32 = 100;

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// Path without the query string.
    pub path: String,
    pub query: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub peer: SocketAddr,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response { status, content_type, headers: Vec::new(), body: body.into() }
    }
    pub fn json(status: u16, v: &serde_json::Value) -> Response {
        let mut body = serde_json::to_vec(v).expect("serialising a Value cannot fail");
        body.push(b'\n');
        Response::new(status, "application/json", body)
    }
    /// `{"error": msg}` — the shape clients read error messages from.
    pub fn error(status: u16, msg: impl Into<String>) -> Response {
        Response::json(status, &serde_json::json!({ "error": msg.into() }))
    }
    pub fn empty(status: u16) -> Response {
        Response::new(status, "text/plain", Vec::new())
    }
}

pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

pub struct ServerConfig {
    pub name: &'static str,
    pub conns_max: usize,
    pub body_bytes_max: usize,
    /// Whole-request deadline (head and body), so a client trickling bytes
    /// cannot hold a connection slot indefinitely; 408 when exceeded.
    pub request_timeout: Duration,
}

/// A running listener. Dropping it does not stop it; call `shutdown`.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    active: Arc<AtomicUsize>,
}

impl Server {
    pub fn start(listener: TcpListener, cfg: ServerConfig, handler: Handler) -> io::Result<Server> {
        assert!(cfg.conns_max >= 1 && cfg.body_bytes_max >= 1);
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let (stop2, active2) = (stop.clone(), active.clone());
        let acceptor = std::thread::Builder::new()
            .name(format!("{}-accept", cfg.name))
            .spawn(move || accept_loop(listener, cfg, handler, stop2, active2))?;
        Ok(Server { addr, stop, acceptor: Some(acceptor), active })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting, then wait (bounded by `IO_TIMEOUT` plus a margin) for
    /// connections in progress to finish their current request.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        let deadline = std::time::Instant::now() + IO_TIMEOUT + Duration::from_secs(1);
        while self.active.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn accept_loop(listener: TcpListener, cfg: ServerConfig, handler: Handler, stop: Arc<AtomicBool>, active: Arc<AtomicUsize>) {
    let cfg = Arc::new(cfg);
    while !stop.load(Ordering::SeqCst) {
        // Wait for a connection with a timeout so the stop flag is honoured
        // without a self-connect trick.
        let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        if n <= 0 {
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(_) => continue,
        };
        if active.fetch_add(1, Ordering::SeqCst) >= cfg.conns_max {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let mut s = stream;
            let _ = write_response(&mut s, &Response::error(503, "too many connections"), false);
            continue;
        }
        let (cfg2, handler, stop2, active2) = (cfg.clone(), handler.clone(), stop.clone(), active.clone());
        let spawned = std::thread::Builder::new().name(format!("{}-conn", cfg.name)).spawn(move || {
            serve_conn(stream, peer, &cfg2, &*handler, &stop2);
            active2.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            // The closure was dropped without running: release its slot here.
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn serve_conn(stream: TcpStream, peer: SocketAddr, cfg: &ServerConfig, handler: &(dyn Fn(&Request) -> Response + Send + Sync), stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::with_capacity(8 << 10, stream);
    for served in 0..REQUESTS_PER_CONN_MAX {
        if reader.buffer().is_empty() && !wait_for_request(reader.get_ref(), stop) {
            return;
        }
        let deadline = std::time::Instant::now() + cfg.request_timeout;
        let (resp, keep_alive) = match read_request(&mut reader, peer, cfg.body_bytes_max, deadline) {
            Ok(None) => return,
            Ok(Some(req)) => {
                let keep = wants_keep_alive(&req) && served + 1 < REQUESTS_PER_CONN_MAX && !stop.load(Ordering::SeqCst);
                (handler(&req), keep)
            }
            Err(ReqError::Io) => return,
            Err(ReqError::Bad(status, msg)) => (Response::error(status, msg), false),
        };
        if write_response(&mut writer, &resp, keep_alive).is_err() || !keep_alive {
            let _ = writer.shutdown(std::net::Shutdown::Write);
            // Drain briefly so the peer sees our response rather than a reset.
            let _ = writer.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = io::copy(&mut reader.take(64 << 10), &mut io::sink());
            return;
        }
    }
}

/// Wait until the next request starts arriving. An idle keep-alive
/// connection is closed after `IO_TIMEOUT`, or at once when the server is
/// stopping, so shutdown never waits on clients that merely keep a
/// connection open.
fn wait_for_request(stream: &TcpStream, stop: &AtomicBool) -> bool {
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    while std::time::Instant::now() < deadline {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        let mut pfd = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        if n > 0 {
            return true;
        }
        if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
    false
}

fn wants_keep_alive(req: &Request) -> bool {
    !matches!(req.header("connection"), Some(v) if v.eq_ignore_ascii_case("close"))
}

enum ReqError {
    /// Connection closed or timed out: nothing to answer.
    Io,
    /// Answer with this status and message, then close.
    Bad(u16, String),
}

/// Read one request. `Ok(None)` on a clean end of stream before a request.
fn read_request(
    r: &mut BufReader<TcpStream>,
    peer: SocketAddr,
    body_bytes_max: usize,
    deadline: std::time::Instant,
) -> Result<Option<Request>, ReqError> {
    let mut head_bytes = 0usize;
    let mut line = Vec::with_capacity(256);
    let n = read_line(r, &mut line, HEAD_BYTES_MAX, deadline)?;
    if n == 0 {
        return Ok(None);
    }
    head_bytes += n;
    let request_line = String::from_utf8(line.clone()).map_err(|_| ReqError::Bad(400, "request line is not UTF-8".into()))?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) if !m.is_empty() && t.starts_with('/') => (m, t, v),
        _ => return Err(ReqError::Bad(400, "malformed request line".into())),
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(ReqError::Bad(505, format!("unsupported HTTP version {version:?}")));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.to_string(), String::new()),
    };
    let mut headers = Vec::new();
    loop {
        line.clear();
        let n = read_line(r, &mut line, HEAD_BYTES_MAX - head_bytes, deadline)?;
        if n == 0 {
            return Err(ReqError::Io);
        }
        head_bytes += n;
        if line.is_empty() {
            break;
        }
        if headers.len() == HEADERS_MAX {
            return Err(ReqError::Bad(431, format!("more than {HEADERS_MAX} headers")));
        }
        let text = std::str::from_utf8(&line).map_err(|_| ReqError::Bad(400, "header is not UTF-8".into()))?;
        let (k, v) = text.split_once(':').ok_or_else(|| ReqError::Bad(400, "header line without ':'".into()))?;
        if k.is_empty() || k.bytes().any(|c| c.is_ascii_whitespace()) {
            return Err(ReqError::Bad(400, "malformed header name".into()));
        }
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let find = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    if find("transfer-encoding").is_some() {
        return Err(ReqError::Bad(411, "chunked bodies are not accepted; send Content-Length".into()));
    }
    let len = match find("content-length") {
        None => 0,
        Some(v) => v.parse::<usize>().map_err(|_| ReqError::Bad(400, format!("invalid Content-Length {v:?}")))?,
    };
    if headers.iter().filter(|(k, _)| k == "content-length").count() > 1 {
        return Err(ReqError::Bad(400, "duplicate Content-Length".into()));
    }
    if len > body_bytes_max {
        return Err(ReqError::Bad(413, format!("body of {len} bytes exceeds the limit of {body_bytes_max}")));
    }
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        set_deadline(r.get_ref(), deadline)?;
        match r.read(&mut body[got..]) {
            Ok(0) => return Err(ReqError::Io),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(timed_out(deadline)),
        }
    }
    Ok(Some(Request { method: method.to_string(), path, query, headers, body, peer }))
}

/// Read one CRLF- (or LF-) terminated line of at most `max` bytes into `out`
/// without the terminator. Returns bytes consumed (0 = end of stream).
fn read_line(r: &mut BufReader<TcpStream>, out: &mut Vec<u8>, max: usize, deadline: std::time::Instant) -> Result<usize, ReqError> {
    let mut consumed = 0;
    loop {
        if r.buffer().is_empty() {
            set_deadline(r.get_ref(), deadline)?;
        }
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(_) if consumed == 0 && out.is_empty() => return Err(ReqError::Io),
            Err(_) => return Err(timed_out(deadline)),
        };
        if buf.is_empty() {
            return if consumed == 0 { Ok(0) } else { Err(ReqError::Io) };
        }
        let (take, done) = match buf.iter().position(|&c| c == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if consumed + take > max {
            return Err(ReqError::Bad(431, format!("request head larger than {HEAD_BYTES_MAX} bytes")));
        }
        out.extend_from_slice(&buf[..take]);
        r.consume(take);
        consumed += take;
        if done {
            out.pop();
            if out.last() == Some(&b'\r') {
                out.pop();
            }
            return Ok(consumed);
        }
    }
}

/// Bound the next read by what is left of the request's deadline.
fn set_deadline(s: &TcpStream, deadline: std::time::Instant) -> Result<(), ReqError> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return Err(ReqError::Bad(408, "request not received in time".into()));
    }
    s.set_read_timeout(Some(left)).map_err(|_| ReqError::Io)
}

/// A failed read mid-request: 408 if the deadline passed, else the peer went away.
fn timed_out(deadline: std::time::Instant) -> ReqError {
    if std::time::Instant::now() >= deadline {
        ReqError::Bad(408, "request not received in time".into())
    } else {
        ReqError::Io
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        408 => "Request Timeout",
        405 => "Method Not Allowed",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "Status",
    }
}

fn write_response(w: &mut TcpStream, resp: &Response, keep_alive: bool) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    // 204 carries no body and no Content-Length/Type (RFC 9110 §8.6).
    if resp.status != 204 {
        head.push_str(&format!("Content-Type: {}\r\nContent-Length: {}\r\n", resp.content_type, resp.body.len()));
    }
    for (k, v) in &resp.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(if keep_alive { "Connection: keep-alive\r\n\r\n" } else { "Connection: close\r\n\r\n" });
    let mut out = head.into_bytes();
    if resp.status != 204 {
        out.extend_from_slice(&resp.body);
    }
    w.write_all(&out)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    //! Proves the server's bounds over real sockets on 127.0.0.1: oversize
    //! heads and bodies are refused with the right status, malformed
    //! requests get 400, keep-alive serves several requests on one
    //! connection, and connections beyond `conns_max` get 503.
    use super::*;

    fn echo_server(conns_max: usize) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let h: Handler = Arc::new(|r: &Request| {
            if r.path == "/slow" {
                std::thread::sleep(Duration::from_millis(300));
            }
            Response::new(200, "text/plain", format!("{} {} {}", r.method, r.path, r.body.len()))
        });
        let cfg = ServerConfig { name: "test", conns_max, body_bytes_max: 100, request_timeout: Duration::from_millis(800) };
        Server::start(l, cfg, h).unwrap()
    }

    fn roundtrip(addr: SocketAddr, raw: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(raw).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn limits_and_errors() {
        let srv = echo_server(4);
        let a = srv.local_addr();
        let ok = roundtrip(a, b"POST /x HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("POST /x 3"), "{ok}");
        let big = roundtrip(a, b"POST /x HTTP/1.1\r\nContent-Length: 101\r\n\r\n");
        assert!(big.starts_with("HTTP/1.1 413 "), "{big}");
        assert!(big.contains("exceeds the limit of 100"));
        let chunked = roundtrip(a, b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
        assert!(chunked.starts_with("HTTP/1.1 411 "), "{chunked}");
        let junk = roundtrip(a, b"GARBAGE\r\n\r\n");
        assert!(junk.starts_with("HTTP/1.1 400 "), "{junk}");
        let badlen = roundtrip(a, b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n");
        assert!(badlen.starts_with("HTTP/1.1 400 "), "{badlen}");
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        head.extend(std::iter::repeat_n(b'a', HEAD_BYTES_MAX));
        let huge = roundtrip(a, &head);
        assert!(huge.starts_with("HTTP/1.1 431 "), "{huge}");
        let ver = roundtrip(a, b"GET / HTTP/2.0\r\n\r\n");
        assert!(ver.starts_with("HTTP/1.1 505 "), "{ver}");
        srv.shutdown();
    }

    #[test]
    fn trickling_client_gets_408_at_the_request_deadline() {
        let srv = echo_server(4);
        let mut c = TcpStream::connect(srv.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = std::time::Instant::now();
        // Each byte arrives well within the per-read timeout; the whole
        // head never completes.
        for b in b"GET /slowloris HTTP/1.1\r\nX: aaaaaaaaaaaaaaaa" {
            if c.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
        srv.shutdown();
    }

    #[test]
    fn keep_alive_serves_several_requests() {
        let srv = echo_server(4);
        let out = roundtrip(
            srv.local_addr(),
            b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
        assert!(out.contains("GET /a 0") && out.contains("GET /b 0"));
        srv.shutdown();
    }

    #[test]
    fn idle_keep_alive_connection_does_not_delay_shutdown() {
        let srv = echo_server(4);
        let mut c = TcpStream::connect(srv.local_addr()).unwrap();
        c.write_all(b"GET /a HTTP/1.1\r\n\r\n").unwrap();
        let mut buf = [0u8; 256];
        let n = c.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200 "));
        // The connection is now idle in keep-alive.
        let t0 = std::time::Instant::now();
        srv.shutdown();
        assert!(t0.elapsed() < Duration::from_secs(2), "shutdown took {:?}", t0.elapsed());
    }

    #[test]
    fn connections_beyond_max_get_503() {
        let srv = echo_server(1);
        let a = srv.local_addr();
        let mut first = TcpStream::connect(a).unwrap();
        first.write_all(b"GET /slow HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let second = roundtrip(a, b"GET / HTTP/1.1\r\n\r\n");
        assert!(second.starts_with("HTTP/1.1 503 "), "{second}");
        let mut out = String::new();
        first.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 "));
        srv.shutdown();
    }
}
