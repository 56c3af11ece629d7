//! Proves the admin API contract of DESIGN.md over real HTTP on 127.0.0.1,
//! against the in-process server (the same `Admin` + HTTP server the binary
//! runs) over a real memfs:
//! - no or wrong bearer token -> 401 on every /api route, and nothing changes;
//! - create is idempotent by name; same name, other capacity -> 409;
//! - malformed requests -> 400 (415/413) with a message naming the field;
//! - the quota is the VFS's: data written into a volume shows as usedBytes,
//!   writes past capacity fail, expand raises the limit, shrinking below use
//!   is refused; a volume larger than the whole backend is 507; delete is
//!   idempotent;
//! - the data-server list is stored and returned, bad entries rejected;
//! - /healthz, /readyz, /api/v1/cluster and /metrics answer.

mod common;

use chimerad::admin::{Admin, ClusterInfo};
use chimerad::http::{Server, ServerConfig};
use chimerad::volumes::{ensure_dirs, Volumes};
use common::{get, request, send};
use serde_json::json;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vfs::memfs::{MemFs, MemFsConfig};
use vfs::{CreateMode, Cred, NodeKind, Stability, Vfs, VfsError};

const TOKEN: &str = "test-token-0123456789";
const BODY_BYTES_MAX: usize = 4096;

struct Fixture {
    vfs: Arc<MemFs>,
    admin: Arc<Admin>,
    server: Option<Server>,
    metrics: Option<Server>,
    addr: SocketAddr,
    metrics_addr: SocketAddr,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.server.take().unwrap().shutdown();
        self.metrics.take().unwrap().shutdown();
    }
}

fn fixture() -> Fixture {
    // Keep request logs out of the test output (CHIMERA_LOG overrides).
    chimerad::log::init(chimerad::config::LogLevel::Warn, chimerad::config::LogFormat::Json);
    let vfs = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 256 << 20 }));
    let root = vfs.root(1).unwrap();
    let parent = ensure_dirs(vfs.as_ref(), root, &["volumes"]).unwrap();
    let dynvfs: Arc<dyn Vfs> = vfs.clone();
    let volumes = Volumes::new(dynvfs, parent, "/memfs/volumes");
    let cluster = ClusterInfo {
        name: "memfs".into(),
        role: "both",
        nfs_port: 2049,
        mount_port: 20048,
        exports: vec!["/memfs".into()],
        pnfs_enabled: false,
        stripe_unit_bytes: 1 << 20,
        mirrors: 1,
        capacity_bytes: 256 << 20,
    };
    let admin = Arc::new(Admin::new(TOKEN.into(), Some(volumes), Vec::new(), cluster));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(l, ServerConfig { name: "admin", conns_max: 8, body_bytes_max: BODY_BYTES_MAX, request_timeout: chimerad::http::IO_TIMEOUT, tls: None }, admin.handler()).unwrap();
    let ml = TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics = Server::start(ml, ServerConfig { name: "metrics", conns_max: 4, body_bytes_max: 1024, request_timeout: chimerad::http::IO_TIMEOUT, tls: None }, chimerad::metrics::handler(Some(admin.clone()))).unwrap();
    let (addr, metrics_addr) = (server.local_addr(), metrics.local_addr());
    Fixture { vfs, admin, server: Some(server), metrics: Some(metrics), addr, metrics_addr }
}

fn t() -> Option<&'static str> {
    Some(TOKEN)
}

#[test]
fn unauthenticated_requests_get_401_and_change_nothing() {
    let f = fixture();
    send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": "keep", "capacityBytes": 1 << 20}));
    for token in [None, Some("wrong-token"), Some(""), Some("test-token-012345678")] {
        let attempts = [
            send(f.addr, "POST", "/api/v1/volumes", token, &json!({"name": "evil", "capacityBytes": 1 << 20})),
            request(f.addr, "DELETE", "/api/v1/volumes/keep", token, None, &[]),
            send(f.addr, "PATCH", "/api/v1/volumes/keep", token, &json!({"capacityBytes": 1 << 30})),
            send(f.addr, "PUT", "/api/v1/dataservers", token, &json!({"dataServers": [{"name": "x", "address": "10.0.0.1"}]})),
            get(f.addr, "/api/v1/volumes", token),
            get(f.addr, "/api/v1/cluster", token),
            get(f.addr, "/api/v1/nonexistent", token),
        ];
        for r in attempts {
            assert_eq!(r.status, 401, "token {token:?}: {}", r.text());
            assert!(r.headers.to_ascii_lowercase().contains("www-authenticate: bearer"), "{}", r.headers);
            assert_eq!(r.error(), "missing or invalid bearer token");
        }
    }
    // A token in another scheme is not accepted either.
    let r = request(f.addr, "GET", "/api/v1/volumes", None, None, &[("Authorization", &format!("Basic {TOKEN}"))]);
    assert_eq!(r.status, 401);
    let list = get(f.addr, "/api/v1/volumes", t()).json();
    let vols = list["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 1);
    assert_eq!(vols[0]["id"], "keep");
    assert_eq!(vols[0]["capacityBytes"], 1 << 20);
    assert_eq!(get(f.addr, "/api/v1/dataservers", t()).json()["dataServers"], json!([]));
}

#[test]
fn create_is_idempotent_by_name_and_conflicts_on_other_capacity() {
    let f = fixture();
    let r = send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": "pvc-1", "capacityBytes": 10 << 20}));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = r.json();
    assert_eq!(v["id"], "pvc-1");
    assert_eq!(v["exportPath"], "/memfs/volumes/pvc-1");
    assert_eq!(v["capacityBytes"], 10 << 20);
    let again = send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": "pvc-1", "capacityBytes": 10 << 20, "sourceSnapshot": null}));
    assert_eq!(again.status, 200);
    assert_eq!(again.json(), v);
    let clash = send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": "pvc-1", "capacityBytes": 20 << 20}));
    assert_eq!(clash.status, 409);
    let msg = clash.error();
    assert!(msg.contains("pvc-1") && msg.contains(&(10u64 << 20).to_string()) && msg.contains(&(20u64 << 20).to_string()), "{msg}");
    // The conflicting request changed nothing.
    assert_eq!(get(f.addr, "/api/v1/volumes/pvc-1", t()).json()["capacityBytes"], 10 << 20);
    // The volume is a real directory with a quota in the VFS.
    let dir = f.vfs.lookup(&f.vfs.root(1).unwrap(), b"volumes").unwrap().0;
    let (vol, _) = f.vfs.lookup(&dir, b"pvc-1").unwrap();
    assert_eq!(f.vfs.quota(&vol).unwrap().unwrap().capacity_bytes, 10 << 20);
    assert_eq!(f.vfs.fsstat(&vol).unwrap().total_bytes, 10 << 20);
}

#[test]
fn a_volume_larger_than_the_backend_is_refused_with_507() {
    let f = fixture();
    // 256 MiB backend: volumes may overcommit it together, one may not exceed it.
    let big = send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": "huge", "capacityBytes": 1u64 << 40}));
    assert_eq!(big.status, 507, "{}", big.text());
    let msg = big.error();
    assert!(msg.contains(&(1u64 << 40).to_string()) && msg.contains(&(256u64 << 20).to_string()) && msg.contains("exceeds"), "{msg}");
    assert_eq!(get(f.addr, "/api/v1/volumes/huge", t()).status, 404, "a refused create left a volume behind");
    for name in ["a", "b"] {
        let r = send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": name, "capacityBytes": 200u64 << 20}));
        assert_eq!(r.status, 201, "thin provisioning: {}", r.text());
    }
    let grow = send(f.addr, "PATCH", "/api/v1/volumes/a", t(), &json!({"capacityBytes": 257u64 << 20}));
    assert_eq!(grow.status, 507, "{}", grow.text());
    assert_eq!(get(f.addr, "/api/v1/volumes/a", t()).json()["capacityBytes"], 200u64 << 20);
}

#[test]
fn bad_requests_name_the_field() {
    let f = fixture();
    let cases: Vec<(&[u8], u16, &str)> = vec![
        (b"{", 400, "invalid JSON"),
        (b"[]", 400, "expected a JSON object"),
        (br#"{"capacityBytes": 1048576}"#, 400, "name: required"),
        (br#"{"name": 7, "capacityBytes": 1048576}"#, 400, "name: expected a string"),
        (br#"{"name": "a/b", "capacityBytes": 1048576}"#, 400, "name: "),
        (br#"{"name": "..", "capacityBytes": 1048576}"#, 400, "name: "),
        (br#"{"name": "", "capacityBytes": 1048576}"#, 400, "name: must be 1..=128 bytes"),
        (br#"{"name": "v"}"#, 400, "capacityBytes: required"),
        (br#"{"name": "v", "capacityBytes": 0}"#, 400, "capacityBytes: must be in 1..="),
        (br#"{"name": "v", "capacityBytes": -5}"#, 400, "capacityBytes: expected a non-negative integer"),
        (br#"{"name": "v", "capacityBytes": "1Gi"}"#, 400, "capacityBytes: expected a non-negative integer"),
        (br#"{"name": "v", "capacityBytes": 1.5}"#, 400, "capacityBytes: expected a non-negative integer"),
        (br#"{"name": "v", "capacityBytes": 99999999999999999999}"#, 400, "capacityBytes: expected a non-negative integer"),
        (br#"{"name": "v", "capacityBytes": 9223372036854775808}"#, 400, "capacityBytes: must be in 1..="),
        (br#"{"name": "v", "capacityBytes": 100}"#, 400, "capacityBytes: 100 is too small"),
        (br#"{"name": "v", "capacityBytes": 1048576, "size": 1}"#, 400, "size: unknown field"),
        (br#"{"name": "v", "capacityBytes": 1048576, "sourceSnapshot": "snap-1"}"#, 400, "sourceSnapshot: snapshots are not supported"),
        (br#"{"name": "v", "capacityBytes": 1048576, "sourceSnapshot": 3}"#, 400, "sourceSnapshot: expected a string"),
    ];
    for (body, status, want) in cases {
        let r = request(f.addr, "POST", "/api/v1/volumes", t(), Some(body), &[]);
        assert_eq!(r.status, status, "{}: {}", String::from_utf8_lossy(body), r.text());
        assert!(r.error().contains(want), "{}: {:?} lacks {want:?}", String::from_utf8_lossy(body), r.error());
    }
    let mut big = br#"{"name": "v", "capacityBytes": 1048576, "pad": ""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', BODY_BYTES_MAX));
    big.extend_from_slice(b"\"}");
    let r = request(f.addr, "POST", "/api/v1/volumes", t(), Some(&big), &[]);
    assert_eq!(r.status, 413);
    assert!(r.error().contains("exceeds the limit"));
    let r = common::request(f.addr, "PATCH", "/api/v1/volumes/nope", t(), Some(br#"{"capacityBytes": 1048576}"#), &[]);
    assert_eq!(r.status, 404);
    let r = request(f.addr, "PATCH", "/api/v1/volumes/x", t(), Some(b"{}"), &[]);
    assert_eq!((r.status, r.error().as_str()), (400, "capacityBytes: required"));
    // Nothing above created a volume.
    assert_eq!(get(f.addr, "/api/v1/volumes", t()).json()["volumes"], json!([]));
    // Routing errors.
    assert_eq!(request(f.addr, "PUT", "/api/v1/volumes", t(), Some(b"{}"), &[]).status, 405);
    assert_eq!(request(f.addr, "POST", "/api/v1/cluster", t(), Some(b"{}"), &[]).status, 405);
    assert_eq!(get(f.addr, "/api/v2/volumes", t()).status, 404);
    assert_eq!(get(f.addr, "/api/v1/volumes/a/b", t()).status, 404);
    assert_eq!(get(f.addr, "/nothing", None).status, 404);
}

#[test]
fn content_type_other_than_json_is_refused() {
    let f = fixture();
    let body = br#"{"name": "v", "capacityBytes": 1048576}"#;
    let mut s = std::net::TcpStream::connect(f.addr).unwrap();
    use std::io::{Read, Write};
    s.set_read_timeout(Some(common::TIMEOUT)).unwrap();
    write!(s, "POST /api/v1/volumes HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).unwrap();
    s.write_all(body).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 415 "), "{out}");
    assert_eq!(get(f.addr, "/api/v1/volumes", t()).json()["volumes"], json!([]));
}

/// Write `bytes` into a new file `name` of volume `id` through the VFS.
fn fill(f: &Fixture, id: &str, name: &str, bytes: usize) -> Result<(), VfsError> {
    let dir = f.vfs.lookup(&f.vfs.root(1).unwrap(), b"volumes").unwrap().0;
    let (vol, _) = f.vfs.lookup(&dir, id.as_bytes()).unwrap();
    let (fh, _) = f.vfs.create(&vol, name.as_bytes(), NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap();
    let chunk = vec![0xabu8; 64 << 10];
    let mut off = 0;
    while off < bytes {
        let n = chunk.len().min(bytes - off);
        f.vfs.write(&fh, off as u64, &chunk[..n], Stability::FileSync)?;
        off += n;
    }
    Ok(())
}

#[test]
fn quota_usage_expand_shrink_and_delete() {
    let f = fixture();
    let r = send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": "q", "capacityBytes": 2 << 20}));
    assert_eq!(r.status, 201);
    let used0 = get(f.addr, "/api/v1/volumes/q", t()).json()["usedBytes"].as_u64().unwrap();
    fill(&f, "q", "a", 1 << 20).unwrap();
    let v = get(f.addr, "/api/v1/volumes/q", t()).json();
    let used1 = v["usedBytes"].as_u64().unwrap();
    assert!(used1 >= used0 + (1 << 20), "usedBytes {used1} reflects the 1 MiB written (was {used0})");
    // The quota is enforced by the VFS: 2 more MiB do not fit.
    assert_eq!(fill(&f, "q", "b", 2 << 20), Err(VfsError::QuotaExceeded));

    // Shrinking below what is used is refused and changes nothing.
    let r = send(f.addr, "PATCH", "/api/v1/volumes/q", t(), &json!({"capacityBytes": 1 << 20}));
    assert_eq!(r.status, 400);
    assert!(r.error().starts_with("capacityBytes: 1048576 is below"), "{}", r.error());
    assert_eq!(get(f.addr, "/api/v1/volumes/q", t()).json()["capacityBytes"], 2 << 20);

    // Expand, then the writes that failed fit.
    let r = send(f.addr, "PATCH", "/api/v1/volumes/q", t(), &json!({"capacityBytes": 8 << 20}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["capacityBytes"], 8 << 20);
    assert_eq!(get(f.addr, "/api/v1/volumes/q", t()).json()["capacityBytes"], 8 << 20);
    fill(&f, "q", "c", 2 << 20).unwrap();

    // Volume gauges on /metrics (scraped without a token, on its own port).
    let m = get(f.metrics_addr, "/metrics", None);
    assert_eq!(m.status, 200);
    let text = m.text();
    assert!(text.lines().any(|l| l == format!("chimera_volume_capacity_bytes{{volume=\"q\"}} {}", 8u64 << 20)), "{text}");
    let used_line = text.lines().find(|l| l.starts_with("chimera_volume_used_bytes{volume=\"q\"} ")).unwrap();
    assert!(used_line.rsplit(' ').next().unwrap().parse::<u64>().unwrap() >= 3 << 20);
    assert!(text.contains("# TYPE chimera_rpc_ops_total counter"));

    // Delete (idempotent) frees the space; the volume is gone.
    let r = request(f.addr, "DELETE", "/api/v1/volumes/q", t(), None, &[]);
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert_eq!(request(f.addr, "DELETE", "/api/v1/volumes/q", t(), None, &[]).status, 204);
    assert_eq!(request(f.addr, "DELETE", "/api/v1/volumes/never-existed", t(), None, &[]).status, 204);
    assert_eq!(request(f.addr, "DELETE", "/api/v1/volumes/..", t(), None, &[]).status, 204);
    let r = get(f.addr, "/api/v1/volumes/q", t());
    assert_eq!(r.status, 404);
    assert!(r.error().contains("\"q\" not found"));
    assert_eq!(get(f.addr, "/api/v1/volumes", t()).json()["volumes"], json!([]));
    // Re-creating the name gives a fresh, empty volume.
    let r = send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": "q", "capacityBytes": 2 << 20}));
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["usedBytes"].as_u64().unwrap(), used0);
}

#[test]
fn list_is_sorted_and_complete() {
    let f = fixture();
    for (i, n) in ["c", "a", "b"].iter().enumerate() {
        let r = send(f.addr, "POST", "/api/v1/volumes", t(), &json!({"name": n, "capacityBytes": (i as u64 + 1) << 20}));
        assert_eq!(r.status, 201);
    }
    let list = get(f.addr, "/api/v1/volumes", t()).json();
    let ids: Vec<&str> = list["volumes"].as_array().unwrap().iter().map(|v| v["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(list["volumes"][0]["capacityBytes"], 2 << 20);
    assert_eq!(list["volumes"][2]["exportPath"], "/memfs/volumes/c");
}

#[test]
fn data_servers_are_stored_and_validated() {
    let f = fixture();
    let ds = json!({"dataServers": [
        {"name": "ds-0", "address": "10.1.0.5", "transport": "tcp", "ready": true, "node": "n1"},
        {"name": "ds-1", "address": "10.1.0.6:20050", "transport": "rdma", "ready": false}
    ]});
    let r = send(f.addr, "PUT", "/api/v1/dataservers", t(), &ds);
    assert_eq!(r.status, 200, "{}", r.text());
    let got = get(f.addr, "/api/v1/dataservers", t()).json();
    assert_eq!(got["generation"], 2);
    assert_eq!(got["dataServers"][0]["address"], "10.1.0.5:2049");
    assert_eq!(got["dataServers"][0]["node"], "n1");
    assert_eq!(got["dataServers"][1]["address"], "10.1.0.6:20050");
    assert_eq!(got["dataServers"][1]["transport"], "rdma");
    assert_eq!(got["dataServers"][1]["ready"], false);
    // The same list again does not bump the generation.
    assert_eq!(send(f.addr, "PUT", "/api/v1/dataservers", t(), &ds).json()["generation"], 2);
    for (body, want) in [
        (json!({"dataServers": [{"name": "x"}]}), "dataServers[0].address: required"),
        (json!({"dataServers": [{"name": "x", "address": "10.0.0.1:99999"}]}), "dataServers[0].address:"),
        (json!({"dataServers": [{"name": "x", "address": "a"}, {"name": "x", "address": "b"}]}), "dataServers[1].name: duplicate"),
        (json!({"servers": []}), "servers: unknown field"),
        (json!({"dataServers": {}}), "dataServers: expected an array"),
        (json!("x"), "expected a JSON object"),
    ] {
        let r = send(f.addr, "PUT", "/api/v1/dataservers", t(), &body);
        assert_eq!(r.status, 400, "{body}");
        assert!(r.error().starts_with(want), "{body}: {:?}", r.error());
    }
    // Rejected updates left the list alone.
    assert_eq!(get(f.addr, "/api/v1/dataservers", t()).json(), got);
    // An empty list is a valid update.
    let r = send(f.addr, "PUT", "/api/v1/dataservers", t(), &json!([]));
    assert_eq!((r.status, r.json()["generation"].as_u64()), (200, Some(3)));
    let m = get(f.metrics_addr, "/metrics", None).text();
    assert!(m.lines().any(|l| l == "chimera_data_servers_generation 3"), "{m}");
}

#[test]
fn health_readiness_and_cluster() {
    let f = fixture();
    assert_eq!(get(f.addr, "/healthz", None).status, 200);
    assert_eq!(get(f.addr, "/readyz", None).status, 503);
    f.admin.ready.store(true, Ordering::SeqCst);
    assert_eq!(get(f.addr, "/readyz", None).status, 200);
    assert_eq!(request(f.addr, "POST", "/healthz", None, Some(b"{}"), &[]).status, 405);
    let c = get(f.addr, "/api/v1/cluster", t()).json();
    assert_eq!(c["role"], "both");
    assert_eq!(c["nfsPort"], 2049);
    assert_eq!(c["exports"], json!(["/memfs"]));
    assert_eq!(c["volumesPath"], "/memfs/volumes");
    assert_eq!(c["ready"], true);
    assert_eq!(c["capacityBytes"], 256 << 20);
    assert_eq!(get(f.metrics_addr, "/healthz", None).status, 200);
    assert_eq!(get(f.metrics_addr, "/other", None).status, 404);
}
