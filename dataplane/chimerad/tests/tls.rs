//! Proves the admin API over TLS (issue 18, "Admin API over TLS"):
//! - a client that trusts the CA completes the handshake and is served;
//!   without the token, or with a wrong one, it still gets 401;
//! - a client that trusts another CA, or expects another server name,
//!   fails the handshake and never reaches a handler;
//! - a plain-HTTP client on the TLS port gets no HTTP answer;
//! - the HTTP bounds hold over TLS (413 body, 503 beyond conns_max);
//! - the real binary serves HTTPS from the PEM files its config names, and
//!   refuses to start on a key that is not the certificate's, naming the key
//!   and the file.
//! Certificates are made per run (rcgen), servers bind port 0.

mod common;
mod process;

use chimerad::admin::{Admin, ClusterInfo};
use chimerad::http::{Server, ServerConfig};
use common::certs::Ca;
use common::{get_tls, request_tls};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "tls-test-token-0123456789";
const NAME: &str = "chimera-mds.storage.svc";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("chimerad-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Fixture {
    server: Option<Server>,
    addr: SocketAddr,
    ca: Ca,
    dir: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.take().unwrap().shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(name: &str, conns_max: usize) -> Fixture {
    chimerad::log::init(chimerad::config::LogLevel::Warn, chimerad::config::LogFormat::Json);
    let dir = scratch(name);
    let ca = Ca::new("chimera test CA");
    let (cert, key) = ca.server_files(&dir, &[NAME, "127.0.0.1"]);
    let tls = chimerad::tls::server_config("admin.tls.cert_file", &cert, "admin.tls.key_file", &key).unwrap();
    let cluster = ClusterInfo {
        name: "tls".into(),
        role: "mds",
        nfs_port: 2049,
        mount_port: 20048,
        exports: Vec::new(),
        pnfs_enabled: false,
        stripe_unit_bytes: 1 << 20,
        mirrors: 1,
        capacity_bytes: 0,
    };
    let admin = Arc::new(Admin::new(TOKEN.into(), None, Vec::new(), cluster));
    let handler = admin.handler();
    // A slow route for the connection bound: every other path is the API.
    let h: chimerad::http::Handler = Arc::new(move |r: &chimerad::http::Request| {
        if r.path == "/slow" {
            std::thread::sleep(Duration::from_millis(400));
        }
        handler(r)
    });
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = ServerConfig { name: "admin", conns_max, body_bytes_max: 1024, request_timeout: chimerad::http::IO_TIMEOUT, tls: Some(tls) };
    let server = Server::start(l, cfg, h).unwrap();
    let addr = server.local_addr();
    Fixture { server: Some(server), addr, ca, dir }
}

#[test]
fn a_client_trusting_the_ca_is_served_and_the_token_still_decides() {
    let f = fixture("trusted", 4);
    let ca = f.ca.pem();
    let r = get_tls(f.addr, NAME, &ca, "/healthz", None).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"));
    // The IP address SAN works too (what a client dialling the pod IP checks).
    assert_eq!(get_tls(f.addr, "127.0.0.1", &ca, "/readyz", None).unwrap().status, 503);
    let r = get_tls(f.addr, NAME, &ca, "/api/v1/cluster", Some(TOKEN)).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["role"], "mds");
    for token in [None, Some("not-the-token"), Some("")] {
        let r = get_tls(f.addr, NAME, &ca, "/api/v1/dataservers", token).unwrap();
        assert_eq!(r.status, 401, "token {token:?}: {}", r.text());
        assert_eq!(r.error(), "missing or invalid bearer token");
    }
    // A refused write changes nothing.
    let body = json!({ "dataServers": [{ "name": "ds-0", "address": "10.0.0.1" }] }).to_string();
    let r = request_tls(f.addr, NAME, &ca, "PUT", "/api/v1/dataservers", Some("wrong"), Some(body.as_bytes())).unwrap();
    assert_eq!(r.status, 401);
    let r = get_tls(f.addr, NAME, &ca, "/api/v1/dataservers", Some(TOKEN)).unwrap();
    assert_eq!(r.json()["dataServers"], json!([]));
}

#[test]
fn a_client_trusting_another_ca_or_name_fails_the_handshake() {
    let f = fixture("untrusted", 4);
    let other = Ca::new("another CA");
    let e = get_tls(f.addr, NAME, &other.pem(), "/healthz", None).expect_err("another CA's client must not connect");
    assert!(e.contains("UnknownIssuer") || e.contains("unknown issuer"), "{e}");
    // The right CA, but a name the certificate does not carry.
    let e = get_tls(f.addr, "evil.example.com", &f.ca.pem(), "/healthz", None).expect_err("a wrong name must fail");
    assert!(e.contains("NotValidForName") || e.contains("not valid for name"), "{e}");
    // The server keeps serving clients that trust it.
    assert_eq!(get_tls(f.addr, NAME, &f.ca.pem(), "/healthz", None).unwrap().status, 200);
}

#[test]
fn plain_http_on_the_tls_port_gets_no_http_answer() {
    let f = fixture("plain", 4);
    let mut s = TcpStream::connect(f.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("GET /api/v1/cluster HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(!out.starts_with(b"HTTP/"), "{}", String::from_utf8_lossy(&out));
}

#[test]
fn bounds_hold_over_tls() {
    let f = fixture("bounds", 1);
    let ca = f.ca.pem();
    let big = vec![b'x'; 2048];
    let r = request_tls(f.addr, NAME, &ca, "PUT", "/api/v1/dataservers", Some(TOKEN), Some(&big)).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.error().contains("exceeds the limit of 1024"), "{}", r.text());
    // One connection busy: the next gets 503 over TLS, then the first is answered.
    let (addr, ca2) = (f.addr, ca.clone());
    let first = std::thread::spawn(move || get_tls(addr, NAME, &ca2, "/slow", None));
    std::thread::sleep(Duration::from_millis(150));
    let r = get_tls(f.addr, NAME, &ca, "/healthz", None).unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.error(), "too many connections");
    assert_eq!(first.join().unwrap().unwrap().status, 404);
}

/// The real binary with `admin.tls` from PEM files: served over HTTPS;
/// a key that is not the certificate's stops start-up naming key and file.
#[test]
fn chimerad_serves_https_from_its_config_and_refuses_a_mismatched_key() {
    let dir = scratch("daemon");
    let ca = Ca::new("chimera test CA");
    let (cert, key) = ca.server_files(&dir.join("tls"), &[NAME]);
    let config = |cert: &PathBuf, key: &PathBuf| {
        json!({
            "server": { "bind": "127.0.0.1", "cores": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0 },
            "mounts": { "memfs": { "module": "memfs", "capacity_bytes": "64M" } },
            "exports": { "/memfs": { "path": "/memfs" } },
            "admin": { "bind": "127.0.0.1", "port": 0, "token": TOKEN,
                       "tls": { "cert_file": cert.to_str().unwrap(), "key_file": key.to_str().unwrap() } },
            "metrics": { "bind": "127.0.0.1", "port": 0 }
        })
    };
    let cfg = dir.join("chimera.json");
    std::fs::write(&cfg, config(&cert, &key).to_string()).unwrap();
    let mut p = process::spawn(&cfg);
    let lines = process::until_started_or_exit(&mut p).unwrap_or_else(|(c, l)| panic!("exit {c:?}: {l:?}"));
    let admin = process::listening(&lines, "admin");
    let r = get_tls(admin, NAME, &ca.pem(), "/api/v1/volumes", Some(TOKEN)).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get_tls(admin, NAME, &ca.pem(), "/api/v1/volumes", Some("wrong")).unwrap().status, 401);
    assert!(get_tls(admin, NAME, &Ca::new("other").pem(), "/healthz", None).is_err());
    // /metrics stays plain HTTP.
    let m = process::listening(&lines, "metrics");
    assert_eq!(common::get(m, "/metrics", None).status, 200);
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(process::wait_exit(&mut p).code(), Some(0));

    // Another certificate's key: start-up fails before serving.
    let (_, other_key) = ca.server_files(&dir.join("other"), &[NAME]);
    std::fs::write(&cfg, config(&cert, &other_key).to_string()).unwrap();
    let mut p = process::spawn(&cfg);
    let (code, lines) = process::until_started_or_exit(&mut p).expect_err("a mismatched key is refused");
    assert_eq!(code, Some(1));
    let all = serde_json::to_string(&lines).unwrap();
    assert!(all.contains("admin.tls.key_file") && all.contains("is not the private key of the certificate"), "{all}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A renewed certificate (the operator rewrites the Secret, the kubelet
/// swaps the files) is served without a restart; a pair that does not load
/// (here: a key of another certificate) leaves the one in use serving.
#[test]
fn a_renewed_certificate_is_served_without_a_restart() {
    chimerad::log::init(chimerad::config::LogLevel::Warn, chimerad::config::LogFormat::Json);
    let dir = scratch("reload");
    let (old_ca, new_ca) = (Ca::new("old CA"), Ca::new("new CA"));
    let (cert, key) = old_ca.server_files(&dir, &[NAME]);
    let every = Duration::from_millis(100);
    let tls = chimerad::tls::server_config_checked_every("admin.tls.cert_file", &cert, "admin.tls.key_file", &key, every).unwrap();
    let h: chimerad::http::Handler = Arc::new(|_r: &chimerad::http::Request| chimerad::http::Response::new(200, "text/plain", "ok"));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = ServerConfig { name: "admin", conns_max: 4, body_bytes_max: 1024, request_timeout: chimerad::http::IO_TIMEOUT, tls: Some(tls) };
    let server = Server::start(l, cfg, h).unwrap();
    let addr = server.local_addr();
    assert_eq!(get_tls(addr, NAME, &old_ca.pem(), "/", None).unwrap().status, 200);

    // A broken pair: the old certificate keeps being served.
    let (_, stray_key) = new_ca.server(&[NAME]);
    std::fs::write(&key, stray_key).unwrap();
    std::thread::sleep(every * 2);
    assert_eq!(get_tls(addr, NAME, &old_ca.pem(), "/", None).unwrap().status, 200);

    // The renewed pair from the new CA: served at the next check.
    let (new_cert, new_key) = new_ca.server(&[NAME]);
    std::fs::write(&key, new_key).unwrap();
    std::fs::write(&cert, new_cert).unwrap();
    std::thread::sleep(every * 2);
    let r = get_tls(addr, NAME, &new_ca.pem(), "/", None);
    assert_eq!(r.map(|r| r.status), Ok(200));
    assert!(get_tls(addr, NAME, &old_ca.pem(), "/", None).is_err(), "the old CA's clients no longer match");
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
