//! The control path's HTTP/1.1 server (admin API, `/metrics`), optionally
//! over TLS: hyper 1.x on a current-thread tokio runtime, rustls (ring
//! provider) for TLS.
//!
//! Runs on its own threads, never on the data-path cores: one runtime thread
//! per listener drives accepts, TLS handshakes and HTTP framing; handlers are
//! synchronous and run on the runtime's blocking pool (at most `conns_max`
//! at once), so a slow handler never holds up another connection. Every
//! bound of the earlier hand-written server stays:
//! - the request head: at most `HEAD_BYTES_MAX` bytes and `HEADERS_MAX`
//!   headers (hyper answers 431);
//! - the body: `body_bytes_max` (413, checked on Content-Length before
//!   anything is read, and again while reading); chunked uploads get 411,
//!   since none of our clients send them;
//! - time: the whole head within `request_timeout` (also how long an idle
//!   keep-alive connection lives; the connection is then closed), the body
//!   within `request_timeout` of its head (408), the TLS handshake and every
//!   write within `IO_TIMEOUT`;
//! - `REQUESTS_PER_CONN_MAX` requests per connection (the last answer says
//!   `Connection: close`);
//! - `conns_max` connections at once; more are answered 503 and closed (over
//!   TLS after a handshake bounded by `REFUSE_TIMEOUT`; at most `conns_max`
//!   such refusals at once, beyond that the connection is just closed).

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;

/// Request line plus headers.
pub const HEAD_BYTES_MAX: usize = 16 << 10;
pub const HEADERS_MAX: usize = 64;
/// Per write (and TLS handshake) deadline; also how long the server waits
/// at shutdown for requests in progress.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
pub const REQUESTS_PER_CONN_MAX: usize = 1000;
/// A connection over `conns_max` gets this long to finish its TLS
/// handshake and receive its 503.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// Deadline for a request's head (from the moment the server waits for
    /// it, so also the idle keep-alive time) and, from then on, its body;
    /// so a client trickling bytes cannot hold a connection slot.
    pub request_timeout: Duration,
    /// Serve HTTPS with this certificate (`crate::tls::server_config`);
    /// `None`: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// A running listener. `shutdown` stops it and waits for requests in
/// progress; dropping it stops it too, without waiting.
pub struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(listener: TcpListener, cfg: ServerConfig, handler: Handler) -> io::Result<Server> {
        assert!(cfg.conns_max >= 1 && cfg.body_bytes_max >= 1);
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(cfg.conns_max + 1)
            .thread_name(format!("{}-http", cfg.name))
            .build()?;
        let (stop, stop_rx) = watch::channel(false);
        let thread = std::thread::Builder::new().name(format!("{}-http", cfg.name)).spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => accept_loop(l, Arc::new(Shared { cfg, handler }), stop_rx).await,
                    Err(e) => crate::log::error("http listener", &[("error", e.to_string().as_str().into())]),
                }
            });
            // Handlers still running past the shutdown deadline are left to
            // finish on their own; nothing waits for them.
            rt.shutdown_timeout(Duration::from_millis(100));
        })?;
        Ok(Server { addr, stop, thread: Some(thread) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting, close idle keep-alive connections, then wait (bounded
    /// by `IO_TIMEOUT` plus a margin) for requests in progress to finish.
    pub fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Shared {
    cfg: ServerConfig,
    handler: Handler,
}

/// One taken place in a counter, given back when dropped (also when the
/// task holding it is cancelled).
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        if count.fetch_add(1, Ordering::SeqCst) >= max {
            count.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let active = Arc::new(AtomicUsize::new(0));
    let refusing = Arc::new(AtomicUsize::new(0));
    let conns_max = shared.cfg.conns_max;
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stopped(&mut stop) => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => {
                    // Out of descriptors or a connection reset before accept:
                    // back off briefly rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        match Slot::take(&active, conns_max) {
            Some(slot) => {
                let (shared, stop) = (shared.clone(), stop.clone());
                tokio::spawn(async move {
                    serve_conn(tcp, peer, &shared, stop).await;
                    drop(slot);
                });
            }
            None => {
                if let Some(slot) = Slot::take(&refusing, conns_max) {
                    let tls = shared.cfg.tls.clone();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(REFUSE_TIMEOUT, refuse(tcp, tls)).await;
                        drop(slot);
                    });
                }
            }
        }
    }
    drop(listener);
    let deadline = tokio::time::Instant::now() + IO_TIMEOUT + Duration::from_secs(1);
    while active.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Resolves once the server is stopping (or its `Server` is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Answer 503 to a connection over `conns_max` and close it.
async fn refuse(tcp: tokio::net::TcpStream, tls: Option<Arc<rustls::ServerConfig>>) {
    let resp = Response::error(503, "too many connections");
    let mut raw = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        resp.content_type,
        resp.body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&resp.body);
    match tls {
        None => {
            let mut tcp = tcp;
            let _ = tcp.write_all(&raw).await;
            let _ = tcp.shutdown().await;
        }
        Some(cfg) => {
            if let Ok(mut s) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await {
                let _ = s.write_all(&raw).await;
                let _ = s.shutdown().await;
            }
        }
    }
}

async fn serve_conn(tcp: tokio::net::TcpStream, peer: SocketAddr, shared: &Arc<Shared>, stop: watch::Receiver<bool>) {
    let io = WriteDeadline::new(tcp, IO_TIMEOUT);
    match &shared.cfg.tls {
        None => serve_http(TokioIo::new(io), peer, shared, stop).await,
        Some(cfg) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(cfg.clone());
            match tokio::time::timeout(IO_TIMEOUT, acceptor.accept(io)).await {
                Ok(Ok(s)) => serve_http(TokioIo::new(s), peer, shared, stop).await,
                // A client that does not trust our certificate, speaks
                // plain HTTP or stalls: nothing to answer.
                _ => {}
            }
        }
    }
}

async fn serve_http<I>(io: I, peer: SocketAddr, shared: &Arc<Shared>, mut stop: watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let served = Arc::new(AtomicUsize::new(0));
    let (sh, st) = (shared.clone(), stop.clone());
    let svc = hyper::service::service_fn(move |req| {
        let (sh, st, served) = (sh.clone(), st.clone(), served.clone());
        async move { Ok::<_, Infallible>(handle(req, peer, &sh, &st, &served).await) }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(shared.cfg.request_timeout)
        .max_headers(HEADERS_MAX)
        .max_header_size(HEAD_BYTES_MAX)
        .keep_alive(true);
    let conn = b.serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stopped(&mut stop) => {
            // Idle: closes now; in a request: answers it, then closes.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

async fn handle(
    req: hyper::Request<Incoming>,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    stop: &watch::Receiver<bool>,
    served: &AtomicUsize,
) -> hyper::Response<Full<Bytes>> {
    let n = served.fetch_add(1, Ordering::SeqCst) + 1;
    let mut close = n >= REQUESTS_PER_CONN_MAX || *stop.borrow();
    let resp = match read_request(req, peer, &shared.cfg).await {
        Ok(r) => {
            let h = shared.handler.clone();
            tokio::task::spawn_blocking(move || h(&r))
                .await
                .unwrap_or_else(|_| Response::error(500, "the request handler failed"))
        }
        Err(r) => {
            close = true;
            r
        }
    };
    to_hyper(resp, close)
}

/// The request as handlers see it; an error answer (then the connection
/// closes) when it breaks a bound.
async fn read_request(req: hyper::Request<Incoming>, peer: SocketAddr, cfg: &ServerConfig) -> Result<Request, Response> {
    let (parts, body) = req.into_parts();
    let mut headers = Vec::with_capacity(parts.headers.len());
    for (k, v) in &parts.headers {
        let v = v.to_str().map_err(|_| Response::error(400, format!("header {k} is not ASCII text")))?;
        headers.push((k.as_str().to_string(), v.trim().to_string()));
    }
    if parts.headers.contains_key(hyper::header::TRANSFER_ENCODING) {
        return Err(Response::error(411, "chunked bodies are not accepted; send Content-Length"));
    }
    let max = cfg.body_bytes_max;
    if let Some(v) = parts.headers.get(hyper::header::CONTENT_LENGTH) {
        // hyper has checked it is one decimal number.
        let len: u64 = v.to_str().ok().and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
        if len > max as u64 {
            return Err(Response::error(413, format!("body of {len} bytes exceeds the limit of {max}")));
        }
    }
    let body = match tokio::time::timeout(cfg.request_timeout, Limited::new(body, max).collect()).await {
        Err(_) => return Err(Response::error(408, "request not received in time")),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(Response::error(413, format!("body exceeds the limit of {max} bytes")))
        }
        Ok(Err(e)) => return Err(Response::error(400, format!("body: {e}"))),
        Ok(Ok(c)) => c.to_bytes().to_vec(),
    };
    Ok(Request {
        method: parts.method.as_str().to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or("").to_string(),
        headers,
        body,
        peer,
    })
}

fn to_hyper(resp: Response, close: bool) -> hyper::Response<Full<Bytes>> {
    let mut b = hyper::Response::builder().status(resp.status);
    // 204 carries no body and no Content-Type (RFC 9110 §8.6, §15.3.5).
    let body = if resp.status == 204 {
        Bytes::new()
    } else {
        b = b.header(hyper::header::CONTENT_TYPE, resp.content_type);
        Bytes::from(resp.body)
    };
    for (k, v) in &resp.headers {
        b = b.header(*k, v.as_str());
    }
    if close {
        b = b.header(hyper::header::CONNECTION, "close");
    }
    b.body(Full::new(body)).unwrap_or_else(|_| {
        let mut r = hyper::Response::new(Full::new(Bytes::from_static(b"{\"error\":\"invalid response header\"}\n")));
        *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        r
    })
}

/// A socket whose writes (and flushes) fail with `TimedOut` when the peer
/// takes no bytes for `limit`: a client that stops reading cannot hold a
/// connection slot (reads are bounded by hyper's head timeout and the body
/// deadline).
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteDeadline { inner, limit, stalled: None }
    }

    /// The write did not progress: start (or check) the clock.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let sleep = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "peer took no bytes in time"))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, p: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match p {
            Poll::Pending => self.pending(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(p, cx)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let p = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(p, cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let p = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(p, cx)
    }
    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(p, cx)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    //! Proves the server's bounds over real sockets on 127.0.0.1: oversize
    //! heads and bodies are refused with the right status, malformed
    //! requests get 400, keep-alive serves several requests on one
    //! connection, and connections beyond `conns_max` get 503.
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn echo_server(conns_max: usize) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let h: Handler = Arc::new(|r: &Request| {
            if r.path == "/slow" {
                std::thread::sleep(Duration::from_millis(300));
            }
            Response::new(200, "text/plain", format!("{} {} {}", r.method, r.path, r.body.len()))
        });
        let cfg = ServerConfig { name: "test", conns_max, body_bytes_max: 100, request_timeout: Duration::from_millis(800), tls: None };
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
        // HTTP/1.x only (hyper's parser refuses any other version).
        let ver = roundtrip(a, b"GET / HTTP/2.0\r\n\r\n");
        assert!(ver.starts_with("HTTP/1.1 400 "), "{ver}");
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=HEADERS_MAX {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        let many = roundtrip(a, &many);
        assert!(many.starts_with("HTTP/1.1 431 "), "{many}");
        srv.shutdown();
    }

    #[test]
    fn trickling_client_is_cut_off_at_the_request_deadline() {
        let srv = echo_server(4);
        let mut c = TcpStream::connect(srv.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = std::time::Instant::now();
        // Each byte arrives well within any per-read timeout; the whole
        // head never completes, so the connection is closed unanswered.
        for b in b"GET /slowloris HTTP/1.1\r\nX: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if c.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        assert!(!out.contains("200 OK"), "{out}");
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
        srv.shutdown();
    }

    #[test]
    fn a_body_not_sent_in_time_gets_408() {
        let srv = echo_server(4);
        let mut c = TcpStream::connect(srv.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = std::time::Instant::now();
        c.write_all(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc").unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
        srv.shutdown();
    }

    #[test]
    fn requests_per_connection_are_bounded() {
        let srv = echo_server(4);
        let mut c = TcpStream::connect(srv.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let reqs = b"GET /a HTTP/1.1\r\n\r\n".repeat(REQUESTS_PER_CONN_MAX + 5);
        // Written from another thread: the server answers while we send.
        let mut w = c.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(&reqs);
        });
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        writer.join().unwrap();
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), REQUESTS_PER_CONN_MAX);
        assert_eq!(out.matches("connection: close").count(), 1, "only the last answer closes");
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
