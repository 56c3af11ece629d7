//! The admin API (DESIGN.md "Admin API"): HTTP/JSON on the MDS, the contract
//! the CSI controller and the operator use. README.md documents each route.
//!
//! Every `/api/` route needs `Authorization: Bearer <token>`; a request
//! without it (or with a wrong one) gets 401 before anything is parsed, so it
//! changes nothing. `/healthz` and `/readyz` are open (kubelet probes).
//! Request bodies are JSON objects; unknown fields, wrong types and values
//! out of range are 400 with a message naming the field.

use crate::config::{split_host_port, Netid};
use crate::http::{Handler, Request, Response};
use crate::log;
use crate::volumes::{AccessChange, VolError, Volume, Volumes};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Most data servers the operator may push.
pub const DATA_SERVERS_MAX: usize = 1024;
pub const DS_NAME_BYTES_MAX: usize = 253;

/// A data server as the operator reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsEntry {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub netid: Netid,
    pub ready: bool,
    pub node: String,
    /// Takes no new files or layouts; its layouts are recalled.
    pub draining: bool,
}

impl DsEntry {
    fn to_json(&self) -> Value {
        let address = if self.host.contains(':') { format!("[{}]:{}", self.host, self.port) } else { format!("{}:{}", self.host, self.port) };
        json!({
            "name": self.name,
            "address": address,
            "port": self.port,
            "transport": match self.netid { Netid::Tcp | Netid::Tcp6 => "tcp", Netid::Rdma | Netid::Rdma6 => "rdma" },
            "ready": self.ready,
            "node": self.node,
            "draining": self.draining,
        })
    }
}

/// The data-server list with a generation that increases on every change,
/// so pNFS can tell when to recall layouts.
#[derive(Debug, Clone, Default)]
pub struct DataServers {
    pub generation: u64,
    pub list: Vec<DsEntry>,
}

/// Static facts for `GET /api/v1/cluster`.
#[derive(Debug, Clone)]
pub struct ClusterInfo {
    pub name: String,
    pub role: &'static str,
    pub nfs_port: u16,
    pub mount_port: u16,
    pub exports: Vec<String>,
    pub pnfs_enabled: bool,
    pub stripe_unit_bytes: u64,
    pub mirrors: u32,
    pub capacity_bytes: u64,
}

pub struct Admin {
    token: String,
    pub volumes: Option<Volumes>,
    pub data_servers: RwLock<DataServers>,
    /// Set once the data path is serving.
    pub ready: AtomicBool,
    pub cluster: ClusterInfo,
    /// Backend space used and available, for the cluster document.
    pub space: Box<dyn Fn() -> (u64, u64) + Send + Sync>,
    /// The pNFS MDS: told of every DS list change; its state is shown.
    pub pnfs: Option<Arc<pnfs::Pnfs>>,
    /// Export access rules (`/api/v1/access`): the table the data path
    /// enforces, and the mounts (name, export id) they may be set on.
    pub access: Option<ExportAccess>,
    /// The NFSv4 grace period left, in ms (set once the data path exists;
    /// unset: no NFSv4 state on this server).
    pub grace: std::sync::OnceLock<crate::serve::GraceProbe>,
}

/// The access table and the mounts (name, export id) it is set on.
pub type ExportAccess = (Arc<vfs::clients::AccessTable>, Vec<(String, vfs::ExportId)>);

impl Admin {
    pub fn new(token: String, volumes: Option<Volumes>, data_servers: Vec<DsEntry>, cluster: ClusterInfo) -> Admin {
        assert!(!token.is_empty(), "the admin API must not run without a token");
        Admin {
            token,
            volumes,
            data_servers: RwLock::new(DataServers { generation: 1, list: data_servers }),
            ready: AtomicBool::new(false),
            cluster,
            space: Box::new(|| (0, 0)),
            pnfs: None,
            access: None,
            grace: std::sync::OnceLock::new(),
        }
    }

    pub fn handler(self: &Arc<Self>) -> Handler {
        let me = self.clone();
        Arc::new(move |req: &Request| {
            let resp = me.handle(req);
            let level = if req.method == "GET" { crate::config::LogLevel::Debug } else { crate::config::LogLevel::Info };
            log::event(
                level,
                "admin request",
                &[
                    ("method", req.method.as_str().into()),
                    ("path", req.path.as_str().into()),
                    ("status", (resp.status as u64).into()),
                    ("peer", req.peer.to_string().as_str().into()),
                ],
            );
            resp
        })
    }

    fn authorized(&self, req: &Request) -> bool {
        let given = match req.header("authorization").and_then(|v| v.strip_prefix("Bearer ")) {
            Some(t) => t.trim().as_bytes(),
            None => return false,
        };
        constant_time_eq(given, self.token.as_bytes())
    }

    pub fn handle(&self, req: &Request) -> Response {
        match req.path.as_str() {
            "/healthz" => return only(req, &["GET"]).unwrap_or_else(|| Response::new(200, "text/plain", "ok\n")),
            "/readyz" => {
                return only(req, &["GET"]).unwrap_or_else(|| {
                    if self.ready.load(Ordering::SeqCst) {
                        Response::new(200, "text/plain", "ready\n")
                    } else {
                        Response::new(503, "text/plain", "not ready\n")
                    }
                })
            }
            _ => {}
        }
        if !req.path.starts_with("/api/") {
            return Response::error(404, format!("no route {}", req.path));
        }
        if !self.authorized(req) {
            let mut r = Response::error(401, "missing or invalid bearer token");
            r.headers.push(("WWW-Authenticate", "Bearer".into()));
            return r;
        }
        let segs: Vec<&str> = req.path.trim_end_matches('/').split('/').skip(1).collect();
        match segs.as_slice() {
            ["api", "v1", "volumes"] => match req.method.as_str() {
                "GET" => self.list_volumes(),
                "POST" => self.create_volume(req),
                _ => method_not_allowed("GET, POST"),
            },
            ["api", "v1", "volumes", id] => match req.method.as_str() {
                "GET" => self.with_volumes(|v| v.get(id).map(|vol| Response::json(200, &volume_json(&vol)))),
                "DELETE" => self.with_volumes(|v| v.delete(id).map(|_| Response::empty(204))),
                "PATCH" => self.resize_volume(req, id),
                _ => method_not_allowed("GET, DELETE, PATCH"),
            },
            ["api", "v1", "dataservers"] => match req.method.as_str() {
                "GET" => self.get_data_servers(),
                "PUT" => self.put_data_servers(req),
                _ => method_not_allowed("GET, PUT"),
            },
            ["api", "v1", "access"] => match req.method.as_str() {
                "GET" => self.get_access(),
                _ => method_not_allowed("GET"),
            },
            ["api", "v1", "access", mount] => match req.method.as_str() {
                "GET" => self.with_access(mount, |doc| Response::json(200, &doc)),
                "PUT" => self.put_access(req, mount),
                _ => method_not_allowed("GET, PUT"),
            },
            ["api", "v1", "cluster"] => match req.method.as_str() {
                "GET" => self.get_cluster(),
                _ => method_not_allowed("GET"),
            },
            _ => Response::error(404, format!("no route {}", req.path)),
        }
    }

    fn access_doc(t: &vfs::clients::AccessTable, name: &str, id: vfs::ExportId) -> Value {
        let access = t.get(id).map_or(Value::Null, |r| crate::config::access_json(&r));
        json!({ "mount": name, "access": access })
    }

    /// `GET /api/v1/access`: every mount's rules (`null`: open to all).
    fn get_access(&self) -> Response {
        match &self.access {
            None => Response::error(501, "this server has no exports (role ds)"),
            Some((t, mounts)) => {
                let list: Vec<Value> = mounts.iter().map(|(n, id)| Self::access_doc(t, n, *id)).collect();
                Response::json(200, &json!({ "mounts": list }))
            }
        }
    }

    fn with_access(&self, mount: &str, f: impl FnOnce(Value) -> Response) -> Response {
        match &self.access {
            None => Response::error(501, "this server has no exports (role ds)"),
            Some((t, mounts)) => match mounts.iter().find(|(n, _)| n == mount) {
                None => Response::error(404, format!("no mount {mount:?}")),
                Some((n, id)) => f(Self::access_doc(t, n, *id)),
            },
        }
    }

    /// `PUT /api/v1/access/<mount>` with `{"access": [rules] | null}`: the
    /// mount's rules (every export and volume in it; a volume's own rules
    /// narrow them further), applied to the next
    /// call, handles learned before included. Not kept across restarts
    /// (the config's `exports.<name>.access` is what a restart starts from).
    fn put_access(&self, req: &Request, mount: &str) -> Response {
        let body = match parse_object(req, &["access"]) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let rules = match body.get("access") {
            None => return bad("access: required (an array of client rules, or null for open to all)"),
            Some(Value::Null) => None,
            Some(v) => match crate::config::parse_access("access", v) {
                Ok(r) => Some(r),
                Err(e) => return bad(format!("{}: {}", e.path, e.msg)),
            },
        };
        let Some((t, mounts)) = &self.access else {
            return Response::error(501, "this server has no exports (role ds)");
        };
        let Some((n, id)) = mounts.iter().find(|(n, _)| n == mount) else {
            return Response::error(404, format!("no mount {mount:?}"));
        };
        // The operator puts the rules it computes at every reconcile: only
        // a real change is logged.
        let changed = t.get(*id).as_deref() != rules.as_deref();
        t.set(*id, rules);
        if changed {
            log::info("export access rules changed", &[("mount", n.as_str().into())]);
            self.recall_narrowed_layouts("mount", n);
        }
        Response::json(200, &Self::access_doc(t, n, *id))
    }

    /// After a rule change: the pNFS layouts of clients it narrowed are
    /// recalled (and revoked if not returned) — the data servers do not
    /// see the rules, so a layout would otherwise keep working.
    fn recall_narrowed_layouts(&self, scope: &str, name: &str) {
        let (Some(p), Some((t, _))) = (&self.pnfs, &self.access) else { return };
        let n = p.recall_narrowed(|fh, ip| t.check_fh(fh, ip));
        if n > 0 {
            log::info("layouts recalled: the rule change narrowed their clients' access", &[(scope, name.into()), ("layouts", log::V::U(n as u64))]);
        }
    }

    fn with_volumes(&self, f: impl FnOnce(&Volumes) -> Result<Response, VolError>) -> Response {
        match &self.volumes {
            None => Response::error(501, "this server has no volumes (role ds)"),
            Some(v) => f(v).unwrap_or_else(vol_error),
        }
    }

    fn list_volumes(&self) -> Response {
        self.with_volumes(|v| {
            let list: Vec<Value> = v.list()?.iter().map(volume_json).collect();
            Ok(Response::json(200, &json!({ "volumes": list })))
        })
    }

    fn create_volume(&self, req: &Request) -> Response {
        let body = match parse_object(req, &["name", "capacityBytes", "sourceSnapshot", "access"]) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let access = match volume_access(&body) {
            Ok(AccessChange::Set(r)) => r,
            Ok(AccessChange::Keep) => None,
            Err(r) => return r,
        };
        let name = match body.get("name") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => return bad(format!("name: expected a string, got {}", kind(other))),
            None => return bad("name: required"),
        };
        let cap = match required_u64(&body, "capacityBytes") {
            Ok(c) => c,
            Err(r) => return r,
        };
        match body.get("sourceSnapshot") {
            None | Some(Value::Null) => {}
            Some(Value::String(_)) => return bad("sourceSnapshot: snapshots are not supported yet"),
            Some(other) => return bad(format!("sourceSnapshot: expected a string, got {}", kind(other))),
        }
        self.with_volumes(|v| {
            let (vol, created) = v.create(&name, cap, access)?;
            Ok(Response::json(if created { 201 } else { 200 }, &volume_json(&vol)))
        })
    }

    /// `PATCH /api/v1/volumes/<id>`: `capacityBytes` (expand or shrink)
    /// and/or `access` (the volume's rules; `null` removes them), at least
    /// one.
    fn resize_volume(&self, req: &Request, id: &str) -> Response {
        let body = match parse_object(req, &["capacityBytes", "access"]) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let access = match volume_access(&body) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let cap = match body.get("capacityBytes") {
            None | Some(Value::Null) if access != AccessChange::Keep => None,
            _ => match required_u64(&body, "capacityBytes") {
                Ok(c) => Some(c),
                Err(r) => return r,
            },
        };
        let changed = access != AccessChange::Keep;
        self.with_volumes(|v| {
            let vol = v.update(id, cap, access)?;
            if changed {
                log::info("volume access rules changed", &[("volume", vol.id.as_str().into())]);
                self.recall_narrowed_layouts("volume", &vol.id);
            }
            Ok(Response::json(200, &volume_json(&vol)))
        })
    }

    fn data_servers_json(&self) -> Value {
        let ds = self.data_servers.read().unwrap_or_else(|p| p.into_inner());
        let list: Vec<Value> = ds.list.iter().map(DsEntry::to_json).collect();
        json!({ "generation": ds.generation, "dataServers": list })
    }

    fn get_data_servers(&self) -> Response {
        Response::json(200, &self.data_servers_json())
    }

    fn put_data_servers(&self, req: &Request) -> Response {
        let v: Value = match serde_json::from_slice(&req.body) {
            Ok(v) => v,
            Err(e) => return bad(format!("invalid JSON: {e}")),
        };
        // `{"dataServers": [...]}` (canonical) or a bare array.
        let items = match &v {
            Value::Array(a) => a,
            Value::Object(m) => {
                if let Some(k) = m.keys().find(|k| *k != "dataServers") {
                    return bad(format!("{k}: unknown field"));
                }
                match m.get("dataServers") {
                    Some(Value::Array(a)) => a,
                    Some(other) => return bad(format!("dataServers: expected an array, got {}", kind(other))),
                    None => return bad("dataServers: required"),
                }
            }
            other => return bad(format!("expected a JSON object, got {}", kind(other))),
        };
        if items.len() > DATA_SERVERS_MAX {
            return bad(format!("dataServers: {} entries, more than {DATA_SERVERS_MAX}", items.len()));
        }
        let mut list = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match parse_ds(&format!("dataServers[{i}]"), item) {
                Ok(d) => {
                    if list.iter().any(|x: &DsEntry| x.name == d.name) {
                        return bad(format!("dataServers[{i}].name: duplicate {:?}", d.name));
                    }
                    list.push(d)
                }
                Err(msg) => return bad(msg),
            }
        }
        {
            let mut ds = self.data_servers.write().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = &self.pnfs {
                // pNFS first: a list it refuses changes nothing here either.
                // Entries keep the backing path the config gave a DS of that name.
                let specs = list.iter().map(|e| crate::serve::ds_spec(e, None)).collect();
                if let Err(e) = p.set_data_servers(specs) {
                    return bad(format!("dataServers: {e}"));
                }
            }
            if ds.list != list {
                ds.list = list;
                ds.generation += 1;
                log::info("data servers updated", &[("generation", ds.generation.into()), ("count", ds.list.len().into())]);
            }
        }
        Response::json(200, &self.data_servers_json())
    }

    fn get_cluster(&self) -> Response {
        let c = &self.cluster;
        let (used, avail) = (self.space)();
        let (ds_total, ds_ready, generation) = {
            let ds = self.data_servers.read().unwrap_or_else(|p| p.into_inner());
            (ds.list.len(), ds.list.iter().filter(|d| d.ready).count(), ds.generation)
        };
        Response::json(
            200,
            &json!({
                "name": c.name,
                "version": env!("CARGO_PKG_VERSION"),
                "role": c.role,
                "ready": self.ready.load(Ordering::SeqCst),
                "nfsPort": c.nfs_port,
                "mountPort": c.mount_port,
                "exports": c.exports,
                "volumesPath": self.volumes.as_ref().map(|v| v.parent_path()),
                "capacityBytes": c.capacity_bytes,
                "usedBytes": used,
                "availableBytes": avail,
                "pnfs": self.pnfs_json(),
                "dataServers": { "total": ds_total, "ready": ds_ready, "generation": generation },
                // null without NFSv4 state (a DS); 0 once the grace period is over.
                "graceRemainingMs": self.grace.get().map(|g| g()),
            }),
        )
    }
}

impl Admin {
    fn pnfs_json(&self) -> Value {
        let c = &self.cluster;
        let mut v = json!({ "enabled": c.pnfs_enabled, "stripeUnitBytes": c.stripe_unit_bytes, "mirrors": c.mirrors });
        if let Some(p) = &self.pnfs {
            let m = &p.metrics;
            let ld = std::sync::atomic::Ordering::Relaxed;
            let ds: Vec<Value> = p
                .ds_states()
                .iter()
                .map(|d| {
                    json!({ "name": d.name, "address": d.address, "deviceId": d.device_id, "ready": d.ready,
                            "draining": d.draining, "healthy": d.healthy, "errors": d.errors,
                            "layoutsGranted": d.layouts_granted, "layoutsHeld": d.layouts_held, "files": d.files, "staleCopies": d.stale_copies })
                })
                .collect();
            v["stripeWidth"] = json!(p.config().stripe_width);
            v["layoutsActive"] = json!(p.layouts_active());
            v["layoutsGrantedTotal"] = json!(m.layouts_granted_read.load(ld) + m.layouts_granted_rw.load(ld));
            v["filesPlaced"] = json!(p.files_placed());
            v["dataServers"] = json!(ds);
        }
        v
    }
}

fn parse_ds(path: &str, v: &Value) -> Result<DsEntry, String> {
    let m = match v {
        Value::Object(m) => m,
        other => return Err(format!("{path}: expected an object, got {}", kind(other))),
    };
    const FIELDS: &[&str] = &["name", "address", "port", "transport", "ready", "node", "draining"];
    if let Some(k) = m.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!("{path}.{k}: unknown field (known: {})", FIELDS.join(", ")));
    }
    let s = |k: &str| -> Result<Option<&str>, String> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(format!("{path}.{k}: expected a string, got {}", kind(other))),
        }
    };
    let name = s("name")?.ok_or_else(|| format!("{path}.name: required"))?;
    if name.is_empty() || name.len() > DS_NAME_BYTES_MAX || name.bytes().any(|c| c.is_ascii_control()) {
        return Err(format!("{path}.name: must be 1..={DS_NAME_BYTES_MAX} printable bytes"));
    }
    let netid = match s("transport")? {
        None | Some("tcp") => Netid::Tcp,
        Some("rdma") => Netid::Rdma,
        Some(t) => return Err(format!("{path}.transport: expected \"tcp\" or \"rdma\", got {t:?}")),
    };
    let address = s("address")?.ok_or_else(|| format!("{path}.address: required (\"host\" or \"host:port\")"))?;
    let (host, mut port) =
        split_host_port(&format!("{path}.address"), address, netid.default_port()).map_err(|e| e.to_string())?;
    match m.get("port") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_u64() {
            Some(p) if (1..=65535).contains(&p) => port = p as u16,
            _ => return Err(format!("{path}.port: expected an integer in 1..=65535, got {v}")),
        },
    }
    let ready = match m.get("ready") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("{path}.ready: expected true or false, got {}", kind(other))),
    };
    let node = s("node")?.unwrap_or("").to_string();
    let draining = match m.get("draining") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("{path}.draining: expected true or false, got {}", kind(other))),
    };
    Ok(DsEntry { name: name.to_string(), host, port, netid, ready, node, draining })
}

fn volume_json(v: &Volume) -> Value {
    json!({
        "id": v.id,
        "name": v.id,
        "exportPath": v.export_path,
        "capacityBytes": v.capacity_bytes,
        "usedBytes": v.used_bytes,
        "access": v.access.as_deref().map_or(Value::Null, crate::config::access_json),
    })
}

fn vol_error(e: VolError) -> Response {
    match e {
        VolError::Invalid(m) => Response::error(400, m),
        VolError::NotFound(m) => Response::error(404, m),
        VolError::Conflict(m) => Response::error(409, m),
        VolError::Full(m) => Response::error(507, m),
        VolError::Internal(m) => {
            log::error("admin: backend failure", &[("error", m.as_str().into())]);
            Response::error(500, m)
        }
    }
}

/// A volume body's `access`: absent keeps the rules, `null` removes them,
/// a list (the export rules' syntax) sets them; a bad list is 400 naming
/// the key (`access[0].clients`).
fn volume_access(body: &Map<String, Value>) -> Result<AccessChange, Response> {
    match body.get("access") {
        None => Ok(AccessChange::Keep),
        Some(Value::Null) => Ok(AccessChange::Set(None)),
        Some(v) => match crate::config::parse_access("access", v) {
            Ok(r) => Ok(AccessChange::Set(Some(r))),
            Err(e) => Err(bad(format!("{}: {}", e.path, e.msg))),
        },
    }
}

fn bad(msg: impl Into<String>) -> Response {
    Response::error(400, msg)
}

fn method_not_allowed(allow: &'static str) -> Response {
    let mut r = Response::error(405, format!("method not allowed; allowed: {allow}"));
    r.headers.push(("Allow", allow.into()));
    r
}

fn only(req: &Request, methods: &[&str]) -> Option<Response> {
    if methods.contains(&req.method.as_str()) {
        None
    } else {
        Some(method_not_allowed("GET"))
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The body as a JSON object with only `allowed` keys.
fn parse_object(req: &Request, allowed: &[&str]) -> Result<Map<String, Value>, Response> {
    if let Some(ct) = req.header("content-type") {
        let mime = ct.split(';').next().unwrap_or("").trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            return Err(Response::error(415, format!("Content-Type must be application/json, got {ct:?}")));
        }
    }
    let v: Value = serde_json::from_slice(&req.body).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let m = match v {
        Value::Object(m) => m,
        other => return Err(bad(format!("expected a JSON object, got {}", kind(&other)))),
    };
    if let Some(k) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(format!("{k}: unknown field (known: {})", allowed.join(", "))));
    }
    Ok(m)
}

fn required_u64(m: &Map<String, Value>, field: &str) -> Result<u64, Response> {
    match m.get(field) {
        None | Some(Value::Null) => Err(bad(format!("{field}: required"))),
        Some(v) => v.as_u64().ok_or_else(|| bad(format!("{field}: expected a non-negative integer, got {v}"))),
    }
}

/// Compare without an early exit, so response timing does not reveal how
/// much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0 && a.len() == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
        // Lengths differing by a multiple of 256 must still differ.
        assert!(!constant_time_eq(&[0u8; 256], b""));
    }

    #[test]
    fn ds_entries_turning_invalid() {
        let ok = parse_ds("d", &json!({"name": "ds-0", "address": "10.1.0.5", "transport": "rdma"})).unwrap();
        assert_eq!((ok.host.as_str(), ok.port, ok.netid, ok.ready), ("10.1.0.5", 20049, Netid::Rdma, true));
        let p = parse_ds("d", &json!({"name": "ds-0", "address": "10.1.0.5:2050", "port": 2051})).unwrap();
        assert_eq!(p.port, 2051);
        for (v, want) in [
            (json!({"address": "10.1.0.5"}), "d.name: required"),
            (json!({"name": "x"}), "d.address: required"),
            (json!({"name": "x", "address": "10.1.0.5:0"}), "d.address:"),
            (json!({"name": "x", "address": "h", "transport": "udp"}), "d.transport:"),
            (json!({"name": "x", "address": "h", "port": 70000}), "d.port:"),
            (json!({"name": "x", "address": "h", "ready": "yes"}), "d.ready:"),
            (json!({"name": "x", "address": "h", "weight": 1}), "d.weight: unknown field"),
            (json!(7), "d: expected an object"),
        ] {
            let e = parse_ds("d", &v).unwrap_err();
            assert!(e.starts_with(want), "{v}: {e}");
        }
    }
}
