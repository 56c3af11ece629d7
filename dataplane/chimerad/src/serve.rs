//! Start and stop a whole server from a validated `Config`:
//! mounts -> `vfs::router::Router` (one backend per mount, `backend_for`) -> NFS programs ->
//! `rpc::Dispatcher` -> `runtime::Server` (the data-path cores), plus the
//! admin API and `/metrics` on their own threads.
//!
//! Start-up order makes `/readyz` truthful: the namespace is built and the
//! volumes directory exists before any listener opens, and `ready` flips only
//! after the data path is accepting. Shutdown runs the other way: not ready,
//! stop the admin API (requests in progress finish), stop the data path
//! (the runtime closes connections after in-flight replies), metrics last so
//! a final scrape still sees the totals.

use crate::admin::{Admin, ClusterInfo, DsEntry};
use crate::config::{Config, DiskfsDevice, Module, MountConfig};
use crate::http;
use crate::log;
use crate::volumes::{ensure_dirs, Volumes};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vfs::memfs::{MemFs, MemFsConfig};
use vfs::router::{Mount, Router};
use vfs::Vfs;

/// RPC call/reply header room reserved inside `record_bytes_max` beyond the
/// NFS operation's own request/response budget.
pub const RPC_HEADER_BYTES: u32 = 1024;

pub struct Running {
    pub router: Arc<Router>,
    pub admin: Option<Arc<Admin>>,
    nfs: Option<runtime::Server>,
    rdma: Option<rdma::server::Server>,
    admin_http: Option<http::Server>,
    metrics_http: Option<http::Server>,
    /// Bound addresses (port 0 resolved), for logs and tests.
    pub nfs_addr: Option<SocketAddr>,
    /// The RPC-over-RDMA listener (`server.rdma`).
    pub rdma_addr: Option<SocketAddr>,
    pub admin_addr: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
    /// The pNFS MDS (role mds/both with `server.pnfs.enabled`).
    pub pnfs: Option<Arc<pnfs::Pnfs>>,
    /// Export access rules, per mount export id (NFSv3, MOUNT, NFSv4.1).
    pub access: Arc<vfs::clients::AccessTable>,
}

/// Capacity of the memfs a data server gets when its config has no mounts.
pub const DS_DEFAULT_MOUNT_BYTES: u64 = 1 << 30;

fn build_router(cfg: &Config) -> Result<Arc<Router>, String> {
    let mut mounts = Vec::with_capacity(cfg.mounts.len() + 1);
    if cfg.mounts.is_empty() && cfg.server.role == crate::config::Role::Ds {
        // A data server needs somewhere to keep data files (CONFIG.md).
        let backend: Arc<dyn Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: DS_DEFAULT_MOUNT_BYTES }));
        mounts.push(Mount { name: b"ds".to_vec(), export_id: 1, backend });
    }
    // Every mount that cannot start is named in the one error, so a config
    // with several (the reference MDS has three) is not fixed one restart
    // at a time.
    let mut unavailable = Vec::new();
    // One diskfs spans server.vfs.diskfs's devices; each diskfs mount is
    // a view of it ("/" or a top-level directory).
    let disk = match cfg.mounts.iter().find(|m| m.module == Module::Diskfs) {
        Some(first) => match open_diskfs(cfg, first) {
            Ok(d) => Some(d),
            Err(e) => return Err(e),
        },
        None => None,
    };
    for (i, m) in cfg.mounts.iter().enumerate() {
        // Export ids are positions in the config: stable across restarts as
        // long as the mount list is, which keeps file handles valid.
        let export_id = (i + 1) as u32;
        match backend_for(m, export_id, disk.as_ref()) {
            Ok(backend) => mounts.push(Mount { name: m.name.as_bytes().to_vec(), export_id, backend }),
            Err(e) => unavailable.push(e),
        }
    }
    if !unavailable.is_empty() {
        return Err(unavailable.join("; "));
    }
    Router::new(mounts).map(Arc::new).map_err(|e| format!("mounts: {e}"))
}

/// The one place a mount's module becomes a backend; a mount that cannot
/// start fails here, naming the mount. A diskfs mount is a view of the one
/// diskfs `build_router` opened.
fn backend_for(m: &MountConfig, export_id: u32, disk: Option<&diskfs::DiskFs>) -> Result<Arc<dyn Vfs>, String> {
    match m.module {
        Module::Memfs => {
            if m.capacity_bytes < vfs::memfs::CAPACITY_MIN_BYTES {
                return Err(format!("mounts.{}.capacity_bytes: below the memfs minimum", m.name));
            }
            Ok(Arc::new(MemFs::new(MemFsConfig { export_id, capacity_bytes: m.capacity_bytes })))
        }
        Module::Diskfs => {
            let disk = disk.ok_or_else(|| format!("mounts.{}: diskfs is not open", m.name))?;
            disk.view(&m.path, export_id).map(|v| Arc::new(v) as Arc<dyn Vfs>).map_err(|e| format!("mounts.{}: {e}", m.name))
        }
        Module::Nfs => nfs_backend(m, export_id),
    }
}

/// An `nfs` mount: the remote export through the userspace client. The
/// remote being down does not stop the start (its calls fail with EIO until
/// it answers); connects and outages are logged with the mount's name.
fn nfs_backend(m: &MountConfig, export_id: u32) -> Result<Arc<dyn Vfs>, String> {
    let nfs = m.nfs.as_ref().ok_or_else(|| format!("mounts.{}: nfs settings missing", m.name))?;
    let p = m.path.as_str();
    let split = if p.starts_with('[') { p.find("]:").map(|i| (&p[..=i], &p[i + 2..])) } else { p.split_once(':') };
    let (host, export) = split.ok_or_else(|| format!("mounts.{}.path: expected a remote export \"host:/path\", got {p:?}", m.name))?;
    let opts = nfsvfs::Options {
        name: m.name.clone(),
        export_id,
        addr: format!("{host}:{}", nfs.port),
        path: export.to_string(),
        connections: nfs.connections as usize,
        timeout: std::time::Duration::from_millis(nfs.timeout_ms),
        retry_after: std::time::Duration::from_millis(nfs.timeout_ms.min(1000)),
        mount_at: match nfs.mount_port {
            Some(p) => nfsvfs::MountAt::Port(p),
            None => nfsvfs::MountAt::Portmap(nfs.portmap_port),
        },
        handle_map: nfs.handle_map.as_ref().map(std::path::PathBuf::from),
    };
    if nfs.handle_map.is_none() {
        log::info(
            "mapped handles of this nfs mount do not survive a restart (set handle_map to keep them)",
            &[("mount", m.name.as_str().into())],
        );
    }
    let (name, remote) = (m.name.clone(), format!("{}:{}", opts.addr, opts.path));
    let notify: nfsvfs::Notify = Arc::new(move |msg: &str, error: Option<&str>| {
        let mut fields = vec![("mount", name.as_str().into()), ("remote", remote.as_str().into())];
        match error {
            Some(e) => {
                fields.push(("error", e.into()));
                log::warn(msg, &fields)
            }
            None => log::info(msg, &fields),
        }
    });
    let v = Arc::new(nfsvfs::NfsVfs::new(opts, notify).map_err(|e| format!("mounts.{e}"))?);
    crate::metrics::add_nfs_mount(&m.name, v.clone());
    Ok(v)
}

/// Open diskfs over `server.vfs.diskfs`'s devices (recovering or, with
/// `initialize`, formatting blank ones); every refusal names the device.
/// `m` is the first diskfs mount (named in errors).
fn open_diskfs(cfg: &Config, m: &MountConfig) -> Result<diskfs::DiskFs, String> {
    let dc = cfg.diskfs.as_ref().ok_or_else(|| format!("mounts.{}: module \"diskfs\" needs server.vfs.diskfs.config", m.name))?;
    let mut devices: Vec<block::Device> = Vec::with_capacity(dc.devices.len());
    for d in &dc.devices {
        match d {
            DiskfsDevice::IoUring { path } => {
                let dev = block::uring::UringDevice::open(&block::uring::UringOptions::new(path))
                    .map_err(|e| format!("mounts.{}: server.vfs.diskfs.config.devices: {e}", m.name))?;
                devices.push(Arc::new(dev));
            }
            DiskfsDevice::Vfio { pci } => {
                let opts = nvme::Options::default();
                let dev = nvme::open_pci(&pci.to_string(), &opts)
                    .map_err(|e| format!("mounts.{}: server.vfs.diskfs.config.devices: {e}", m.name))?;
                let id = dev.identity();
                log::info(
                    "nvme device",
                    &[
                        ("pci", pci.to_string().as_str().into()),
                        ("model", id.model.as_str().into()),
                        ("serial", id.serial.as_str().into()),
                        ("namespace", id.nsid.into()),
                        ("lba_bytes", id.lba_bytes.into()),
                        ("bytes", (id.lbas * id.lba_bytes as u64).into()),
                        ("io_queues", id.io_queues.into()),
                        ("irq_vectors", id.irq_vectors.into()),
                    ],
                );
                devices.push(Arc::new(dev));
            }
        }
    }
    crate::metrics::set_devices(devices.clone());
    // The whole file system's own view is not served; mounts get views.
    let fs = diskfs::DiskFs::open(devices, &diskfs::Options::new(u32::MAX, dc.initialize)).map_err(|e| format!("mounts.{}: {e}", m.name))?;
    crate::metrics::set_diskfs(fs.counters());
    let r = fs.report();
    log::info(
        "diskfs mounted",
        &[
            ("mount", m.name.as_str().into()),
            ("cluster", r.cluster_uuid.as_str().into()),
            ("formatted", r.formatted.into()),
            ("log_units_replayed", r.log_units_replayed.into()),
            ("orphans_freed", r.orphans_freed.into()),
            ("inodes", r.inodes.into()),
            ("data_blocks_used", r.data_blocks_used.into()),
            ("data_blocks_total", r.data_blocks_total.into()),
            ("recovery_ms", r.recovery_ms.into()),
        ],
    );
    Ok(fs)
}

/// mkdir -p a namespace path "/mount/a/b" (the mount must exist).
fn ensure_ns_path(router: &Router, path: &str) -> Result<vfs::FileHandle, String> {
    let comps: Vec<&str> = path.trim_start_matches('/').split('/').filter(|c| !c.is_empty()).collect();
    let (first, rest) = comps.split_first().ok_or_else(|| format!("{path:?}: not inside a mount"))?;
    let root = router.resolve_path(format!("/{first}").as_bytes()).map_err(|e| format!("{path:?}: mount {first:?}: {e}"))?;
    ensure_dirs(router, root, rest).map_err(|e| format!("{path:?}: {e}"))
}

fn limits(cfg: &Config) -> rpc::Limits {
    let s = &cfg.server;
    rpc::Limits {
        record_bytes_max: s.record_bytes_max as usize,
        reply_bytes_max: s.record_bytes_max as usize,
        inflight_per_conn_max: s.inflight_per_conn_max as usize,
        conns_max: s.conns_max as usize,
        recv_buffers_per_core: s.recv_buffers_per_core as usize,
        reply_buffers_per_core: s.reply_buffers_per_core as usize,
        parked_per_conn_max: s.parked_per_conn_max as usize,
        parked_per_core_max: s.parked_per_core_max as usize,
        // Room for calls parked on slow backends: at least a few records.
        parked_bytes_per_core_max: rpc::Limits::default().parked_bytes_per_core_max.max(4 * s.record_bytes_max as usize),
        ..rpc::Limits::default()
    }
}

/// READ/WRITE payload that fits one RPC record with room for headers.
fn io_bytes_max(cfg: &Config) -> u32 {
    ((cfg.server.record_bytes_max - 4 * RPC_HEADER_BYTES) & !4095).min(nfs3::IO_BYTES_MAX_DEFAULT)
}

/// MOUNT exports: the configured ones, plus the volumes directory under its
/// own namespace path unless an identity export already covers it, so that a
/// volume's `exportPath` is mountable over NFSv3 exactly as over NFSv4.
fn mount_exports(cfg: &Config) -> Vec<nfs3::Export> {
    let mut out: Vec<nfs3::Export> =
        cfg.exports.iter().map(|e| nfs3::Export { name: e.name.clone().into_bytes(), path: e.path.clone().into_bytes() }).collect();
    let v = &cfg.volumes_path;
    let covered = cfg.exports.iter().any(|e| e.name == e.path && (v == &e.path || v.starts_with(&format!("{}/", e.path))));
    if !v.is_empty() && !covered {
        out.push(nfs3::Export { name: v.clone().into_bytes(), path: v.clone().into_bytes() });
    }
    out
}

/// What the portmapper answers: every program on the port serving it.
fn portmap_registrations(cfg: &Config) -> Vec<nfs3::Registration> {
    let s = &cfg.server;
    let tcp = nfs3::portmap::IPPROTO_TCP;
    let nfs = s.nfs_port as u32;
    let mount = if s.mount_port != 0 { s.mount_port as u32 } else { nfs };
    vec![
        nfs3::Registration { prog: proto::nfs3::NFS_PROGRAM, vers: proto::nfs3::NFS_V3, prot: tcp, port: nfs },
        nfs3::Registration { prog: proto::nfs4::NFS4_PROGRAM, vers: proto::nfs4::NFS_V4, prot: tcp, port: nfs },
        nfs3::Registration { prog: proto::mount3::MOUNT_PROGRAM, vers: proto::mount3::MOUNT_V3, prot: tcp, port: mount },
        nfs3::Registration { prog: proto::portmap::PMAP_PROG, vers: proto::portmap::PMAP_VERS, prot: tcp, port: s.portmap_port as u32 },
    ]
}

/// The RPC programs of this role. Every listener serves every registered
/// program (the runtime does not split them by port), so MOUNT also answers
/// on the NFS port and clients may name either.
/// Also returns the NFSv4.1 back channel, to attach to the transport once
/// it runs.
/// The configured exports' rules, keyed by the export id of the mount each
/// export is in (a handle carries that id; config validation made the
/// exports of one mount agree). The router tells which volume a handle is
/// in, for the volumes' own rules (set through the admin API).
pub fn access_table(cfg: &Config, router: &Arc<Router>) -> Arc<vfs::clients::AccessTable> {
    let t = vfs::clients::AccessTable::with_volumes(router.clone());
    for e in &cfg.exports {
        let Some(rules) = &e.access else { continue };
        let name = crate::config::mount_of(&e.path);
        if let Some(m) = router.mounts().iter().find(|m| m.name == name.as_bytes()) {
            t.set(m.export_id, Some(rules.clone()));
        }
    }
    Arc::new(t)
}

fn dispatcher(
    cfg: &Config,
    router: &Arc<Router>,
    pnfs: Option<&Arc<pnfs::Pnfs>>,
    access: &Arc<vfs::clients::AccessTable>,
) -> (rpc::Dispatcher, Option<Arc<nfs4::callback::Callbacks>>, Option<GraceProbe>) {
    let mut d = rpc::Dispatcher::new(limits(cfg));
    // With pNFS, file data lives on the DSes: both NFS versions on the MDS
    // reach it through the wrapper (I/O through the MDS).
    let vfs: Arc<dyn Vfs> = match pnfs {
        Some(p) => Arc::new(pnfs::PnfsVfs::new(p.clone())),
        None => router.clone(),
    };
    let mut nfs3 = nfs3::Nfs3Program::new(vfs.clone()).io_bytes_max(io_bytes_max(cfg)).with_access(access.clone());
    let (mut callbacks, mut grace) = (None, None);
    if cfg.server.role.runs_mds() {
        let (cb, delegations, g) = register_nfs4(&mut d, &cfg.server, vfs, pnfs, access);
        callbacks = Some(cb);
        grace = Some(g);
        // NFSv3 calls recall NFSv4 delegations on the files they touch.
        nfs3 = nfs3.with_delegations(delegations);
        let r = router.clone();
        let resolve = Arc::new(move |p: &[u8]| r.resolve_path(p));
        d.register(
            Arc::new(nfs3::Mount3Program::new(mount_exports(cfg), resolve).with_access(access.clone()).with_offload(router.clone())),
            "mount3",
            &nfs3::mount::PROC_NAMES,
        );
        // Registered even without its own listener: it then answers on the
        // NFS port, which costs nothing and helps clients that ask there.
        d.register(Arc::new(nfs3::PortmapProgram::new(portmap_registrations(cfg))), "portmap", &nfs3::portmap::PROC_NAMES);
    }
    d.register(Arc::new(nfs3), "nfs3", &nfs3::PROC_NAMES);
    (d, callbacks, grace)
}

/// Milliseconds of the NFSv4 grace period left (`Nfs4Program::grace_probe`).
pub type GraceProbe = Arc<dyn Fn() -> u64 + Send + Sync>;

/// NFSv4.1 on the NFS port, its request/response budgets (and so
/// maxread/maxwrite) fitted inside one RPC record.
fn register_nfs4(
    d: &mut rpc::Dispatcher,
    s: &crate::config::ServerConfig,
    vfs: Arc<dyn Vfs>,
    pnfs: Option<&Arc<pnfs::Pnfs>>,
    access: &Arc<vfs::clients::AccessTable>,
) -> (Arc<nfs4::callback::Callbacks>, Arc<nfs4::delegations::Delegations>, GraceProbe) {
    let mut c4 = nfs4::Config {
        lease_time_s: s.lease_time_s,
        grace_time_s: s.grace_time_s,
        delegations_max: s.delegations_max as usize,
        ..Default::default()
    };
    let budget = s.record_bytes_max - RPC_HEADER_BYTES;
    if c4.request_bytes_max > budget || c4.response_bytes_max > budget {
        let io_bytes = ((budget - nfs4::REPLY_OVERHEAD_BYTES) & !4095).min(c4.read_bytes_max);
        c4.read_bytes_max = io_bytes;
        c4.write_bytes_max = io_bytes;
        c4.request_bytes_max = budget;
        c4.response_bytes_max = budget;
        c4.response_cached_bytes_max = c4.response_cached_bytes_max.min(budget);
    }
    let mut prog = nfs4::Nfs4Program::new(vfs, c4).with_access(access.clone());
    if let Some(p) = pnfs {
        prog = prog.with_layouts(p.clone());
        p.set_recaller(prog.callbacks());
    }
    // REPLY records on NFS connections answer our back-channel calls.
    let callbacks = prog.callbacks();
    let delegations = prog.delegations();
    let grace = prog.grace_probe();
    d.set_reply_sink(callbacks.clone());
    d.register(Arc::new(prog), "nfs4", &["null", "compound"]);
    (callbacks, delegations, grace)
}

/// The CPUs the core loops are pinned to (`server.pin_cores`): the
/// process's affinity, in order; loop `i` takes the `i`-th, wrapping when
/// there are more loops than CPUs (with a warning: those loops take turns).
fn core_cpus(cores: usize) -> Result<Vec<usize>, String> {
    let cpus = runtime::allowed_cpus().map_err(|e| format!("server.pin_cores: cannot read this process's CPU affinity: {e}"))?;
    if cpus.is_empty() {
        return Err("server.pin_cores: this process's CPU affinity is empty".into());
    }
    if cores > cpus.len() {
        log::warn(
            "server.pin_cores: more core loops than usable CPUs; some CPUs run two loops that take turns",
            &[("cores", (cores as u64).into()), ("cpus", (cpus.len() as u64).into())],
        );
    }
    let list: Vec<String> = (0..cores).map(|i| cpus[i % cpus.len()].to_string()).collect();
    log::info("core loops pinned (loop i on the i-th CPU listed)", &[("cpus", list.join(",").as_str().into())]);
    Ok(cpus)
}

/// Data-path listen addresses: NFS, then MOUNT and portmap when enabled
/// (role mds/both).
fn listen_addrs(cfg: &Config) -> Vec<SocketAddr> {
    let s = &cfg.server;
    let mut v = vec![SocketAddr::new(s.bind, s.nfs_port)];
    if s.role.runs_mds() {
        for p in [s.mount_port, s.portmap_port] {
            if p != 0 && p != s.nfs_port {
                v.push(SocketAddr::new(s.bind, p));
            }
        }
    }
    v
}

fn cluster_info(cfg: &Config) -> ClusterInfo {
    ClusterInfo {
        name: cfg.mounts.first().map(|m| m.name.clone()).unwrap_or_default(),
        role: cfg.server.role.as_str(),
        nfs_port: cfg.server.nfs_port,
        mount_port: cfg.server.mount_port,
        exports: cfg.exports.iter().map(|e| e.name.clone()).collect(),
        pnfs_enabled: cfg.server.pnfs.enabled,
        stripe_unit_bytes: cfg.server.pnfs.stripe_unit_bytes,
        mirrors: cfg.server.pnfs.mirrors,
        capacity_bytes: cfg.mounts.iter().map(|m| m.capacity_bytes).sum(),
    }
}

fn initial_data_servers(cfg: &Config) -> Vec<DsEntry> {
    cfg.server
        .pnfs
        .data_servers
        .iter()
        .enumerate()
        .map(|(i, d)| DsEntry {
            name: d.name.clone().unwrap_or_else(|| format!("config-{i}")),
            host: d.host.clone(),
            port: d.port,
            netid: d.netid,
            ready: true,
            node: String::new(),
            draining: false,
        })
        .collect()
}

/// The pNFS MDS of this config (role mds/both with `server.pnfs.enabled`).
fn start_pnfs(cfg: &Config, router: &Arc<Router>) -> Result<Option<Arc<pnfs::Pnfs>>, String> {
    let pc = &cfg.server.pnfs;
    if !(pc.enabled && cfg.server.role.runs_mds()) {
        return Ok(None);
    }
    let p = pnfs::PnfsConfig {
        stripe_unit_bytes: pc.stripe_unit_bytes,
        stripe_width: pc.stripe_width,
        mirrors: pc.mirrors,
        synthetic_uid: pc.synthetic_uid,
        synthetic_gid: pc.synthetic_gid,
        layouts_per_client_max: pc.layouts_per_client_max as usize,
        layouts_max: pc.layouts_max as usize,
        ds_timeout_ms: pc.ds_timeout_ms.into(),
        remove_queue_max: pc.remove_queue_max as usize,
        recall_timeout_ms: pc.recall_timeout_ms.into(),
        orphan_sweep_interval_ms: pc.orphan_sweep_interval_ms,
        ds_io_bytes_max: io_bytes_max(cfg),
        ..Default::default()
    };
    let dses = initial_data_servers(cfg).iter().zip(&pc.data_servers).map(|(e, d)| ds_spec(e, d.backing_path.clone())).collect();
    let vfs: Arc<dyn Vfs> = router.clone();
    pnfs::Pnfs::new(p, vfs, dses).map(Some).map_err(|e| format!("server.pnfs: {e}"))
}

/// A DS as pNFS sees it, from the admin API's entry.
pub fn ds_spec(e: &DsEntry, backing_path: Option<String>) -> pnfs::DsSpec {
    let rdma = matches!(e.netid, crate::config::Netid::Rdma | crate::config::Netid::Rdma6);
    pnfs::DsSpec {
        name: e.name.clone(),
        host: e.host.clone(),
        port: e.port,
        netid: if rdma { pnfs::Netid::Rdma } else { pnfs::Netid::Tcp },
        // An RDMA DS is reached for control (and as the TCP fallback) on 2049.
        tcp_port: if rdma { crate::config::Netid::Tcp.default_port() } else { e.port },
        backing_path,
        ready: e.ready,
        draining: e.draining,
    }
}

fn bind(what: &str, ip: std::net::IpAddr, port: u16) -> Result<TcpListener, String> {
    TcpListener::bind(SocketAddr::new(ip, port)).map_err(|e| format!("{what}: cannot listen on {ip}:{port}: {e}"))
}

/// Start everything; on error, whatever was started is stopped again.
/// `common.huge_pages`: the process's DMA memory (diskfs buffer pools,
/// NVMe queues), set before any device or pool exists. Slabs that cannot
/// be mapped at start are a warning naming what to reserve, and the server
/// runs on ordinary pages: a node without its hugepages still serves.
fn apply_huge_pages(h: crate::config::HugePages) {
    use crate::config::HugePages;
    let shape = match h {
        HugePages::Default => return,
        HugePages::Off => None,
        HugePages::On { page_bytes, slab_bytes, preallocate_slabs } => Some(block::huge::HugeConfig {
            page_bytes: page_bytes as usize,
            slab_bytes: slab_bytes as usize,
            preallocate: preallocate_slabs as usize,
            slabs_max: block::huge::SLABS_MAX,
        }),
    };
    match block::huge::configure(shape) {
        Ok(Some(u)) => {
            // RDMA registrations come from the same slabs (a mapping of
            // their own when the slabs have no room, with a warning).
            rdma::mem::set_allocator(Box::new(|len| match block::huge::carve(len)? {
                Ok(c) => Some(Ok(rdma::mem::Carved { ptr: c.as_ptr(), len: c.len(), keep: Box::new(c) })),
                Err(e) => {
                    log::warn("RDMA buffers on ordinary pages", &[("error", e.as_str().into())]);
                    None
                }
            }));
            log::info(
                "hugepages",
                &[("page_bytes", u.page_bytes.into()), ("slabs", u.slabs.into()), ("mapped_bytes", u.mapped_bytes.into())],
            )
        }
        Ok(None) => log::info("hugepages off: DMA memory on ordinary pages", &[]),
        // A second server in one process (tests): the first one's policy stands.
        Err(e) if block::huge::policy().is_some() => log::debug("hugepage policy already set in this process", &[("error", e.as_str().into())]),
        Err(e) => {
            log::warn("hugepages unavailable: DMA memory on ordinary pages", &[("error", e.as_str().into())]);
            let _ = block::huge::configure(None);
        }
    }
}

pub fn start(cfg: &Config) -> Result<Running, String> {
    // An admin API without a token would let anyone in: the token is
    // generated before start (`Config::provide_admin_token`), never skipped.
    if cfg.admin.enabled && cfg.admin.token.is_empty() {
        return Err("admin.token: none set and none generated (Config::provide_admin_token was not called)".into());
    }
    apply_huge_pages(cfg.huge_pages);
    let router = build_router(cfg)?;
    for e in &cfg.exports {
        // An nfs mount's remote may be down now: its exports are resolved
        // when a client MOUNTs them (MNT3ERR_IO while the remote is away),
        // and their directories must exist on the remote.
        let first = e.path.trim_start_matches('/').split('/').next().unwrap_or("");
        if cfg.mounts.iter().any(|m| m.name == first && m.module == Module::Nfs) {
            continue;
        }
        ensure_ns_path(&router, &e.path).map_err(|m| format!("exports.{}.path: {m}", e.name))?;
    }
    let pnfs = start_pnfs(cfg, &router)?;
    let access = access_table(cfg, &router);
    let mut run = Running {
        access: access.clone(),
        router: router.clone(),
        admin: None,
        nfs: None,
        rdma: None,
        admin_http: None,
        metrics_http: None,
        nfs_addr: None,
        rdma_addr: None,
        admin_addr: None,
        metrics_addr: None,
        pnfs: pnfs.clone(),
    };

    if cfg.admin.enabled {
        let volumes = if cfg.volumes_path.is_empty() {
            None
        } else {
            let parent = ensure_ns_path(&router, &cfg.volumes_path).map_err(|m| format!("volumes.path: {m}"))?;
            // Through the pNFS wrapper when layouts are served, so deleting a
            // volume also removes its files' data files on the DSes.
            let vfs: Arc<dyn Vfs> = match &pnfs {
                Some(p) => Arc::new(pnfs::PnfsVfs::new(p.clone())),
                None => router.clone(),
            };
            let v = Volumes::new(vfs, parent, &cfg.volumes_path).with_access(access.clone());
            // Before any listener opens: no call sees a volume without its rules.
            let n = v.load_access().map_err(|e| format!("volumes.path: cannot load the volumes' access rules: {e:?}"))?;
            if n > 0 {
                log::info("volume access rules loaded", &[("volumes", (n as u64).into())]);
            }
            Some(v)
        };
        let mut admin = Admin::new(cfg.admin.token.clone(), volumes, initial_data_servers(cfg), cluster_info(cfg));
        admin.pnfs = pnfs.clone();
        if cfg.server.role.runs_mds() {
            let mounts = router.mounts().iter().map(|m| (String::from_utf8_lossy(&m.name).into_owned(), m.export_id)).collect();
            admin.access = Some((access.clone(), mounts));
        }
        let r = router.clone();
        admin.space = Box::new(move || {
            r.mounts().iter().fold((0, 0), |(used, avail), m| match m.backend.root(m.export_id).ok().and_then(|fh| m.backend.fsstat_now(&fh)) {
                Some(s) => (used + s.total_bytes.saturating_sub(s.free_bytes), avail + s.avail_bytes),
                None => (used, avail),
            })
        });
        run.admin = Some(Arc::new(admin));
    }

    let result = (|| -> Result<(), String> {
        let (d, callbacks, grace) = dispatcher(cfg, &router, pnfs.as_ref(), &access);
        if let (Some(a), Some(g)) = (&run.admin, grace) {
            let _ = a.grace.set(g);
        }
        let d = Arc::new(d);
        let cpus = if cfg.server.pin_cores { core_cpus(cfg.server.cores)? } else { Vec::new() };
        // RDMA listens first: its shards join the core loops as they start.
        let (rdma, on_core_start) = if cfg.server.rdma {
            let addr = SocketAddr::new(cfg.server.rdma_addr.unwrap_or(cfg.server.bind), cfg.server.rdma_port);
            let rc = rdma::server::Config {
                addr,
                tos: cfg.server.rdma_tos,
                credits: cfg.server.rdma_credits,
                conns_max: cfg.server.rdma_conns_max as usize,
                large_buffers: cfg.server.rdma_large_buffers as usize,
                ..Default::default()
            };
            let (r, attach) = rdma::server::Server::start_on_cores(rc, d.clone(), cfg.server.cores).map_err(|e| format!("server.rdma: {e}"))?;
            log::info(
                "listening",
                &[("service", "nfs-rdma".into()), ("addr", r.local_addr().to_string().as_str().into()), ("shards", (cfg.server.cores as u64).into())],
            );
            run.rdma_addr = Some(r.local_addr());
            (Some(r), Some(runtime::CoreHook(attach)))
        } else {
            (None, None)
        };
        let rt = runtime::Config {
            cores: cfg.server.cores,
            listen: listen_addrs(cfg),
            limits: limits(cfg),
            device_poll_us: cfg.server.device_poll_us as u64,
            on_core_start,
            cpus,
            ..Default::default()
        };
        let nfs = match runtime::Server::start(rt, d.clone()) {
            Ok(n) => n,
            Err(e) => {
                if let Some(r) = rdma {
                    r.shutdown();
                }
                return Err(format!("server.nfs_port: cannot start the data path on {}:{}: {e}", cfg.server.bind, cfg.server.nfs_port));
            }
        };
        if let Some(cb) = callbacks {
            cb.attach(match &rdma {
                Some(r) => Arc::new(ByTransport { tcp: nfs.sender(), rdma: r.sender() }),
                None => nfs.sender(),
            });
        }
        run.rdma = rdma;
        run.nfs_addr = nfs.local_addrs().first().copied();
        for (i, a) in nfs.local_addrs().iter().enumerate() {
            let service = match (i, a.port()) {
                (0, _) => "nfs",
                (_, p) if p == cfg.server.mount_port => "mount",
                _ => "portmap",
            };
            log::info("listening", &[("service", service.into()), ("addr", a.to_string().as_str().into()), ("cores", cfg.server.cores.into())]);
        }
        run.nfs = Some(nfs);

        if let Some(admin) = &run.admin {
            let l = bind("admin.port", cfg.admin.bind, cfg.admin.port)?;
            let tls = cfg.admin.tls.server_config().map_err(|e| e.to_string())?;
            if tls.is_none() {
                log::warn("admin API over plain HTTP (admin.tls is false): the bearer token crosses the network in clear", &[]);
            }
            let hcfg = http::ServerConfig {
                name: "admin",
                conns_max: cfg.admin.conns_max as usize,
                body_bytes_max: cfg.admin.body_bytes_max as usize,
                request_timeout: http::IO_TIMEOUT,
                tls,
            };
            let s = http::Server::start(l, hcfg, admin.handler()).map_err(|e| format!("admin: {e}"))?;
            run.admin_addr = Some(s.local_addr());
            run.admin_http = Some(s);
            log::info("listening", &[("service", "admin".into()), ("addr", run.admin_addr.unwrap().to_string().as_str().into())]);
        }
        if cfg.metrics.enabled {
            let l = bind("metrics.port", cfg.metrics.bind, cfg.metrics.port)?;
            let hcfg = http::ServerConfig { name: "metrics", conns_max: 8, body_bytes_max: 1024, request_timeout: http::IO_TIMEOUT, tls: None };
            let s = http::Server::start(l, hcfg, crate::metrics::handler_with(run.admin.clone(), Some(router.clone()))).map_err(|e| format!("metrics: {e}"))?;
            run.metrics_addr = Some(s.local_addr());
            run.metrics_http = Some(s);
            log::info("listening", &[("service", "metrics".into()), ("addr", run.metrics_addr.unwrap().to_string().as_str().into())]);
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            if let Some(a) = &run.admin {
                a.ready.store(true, Ordering::SeqCst);
            }
            Ok(run)
        }
        Err(e) => {
            run.shutdown();
            Err(e)
        }
    }
}

/// Back-channel calls go out on the transport their connection uses.
struct ByTransport {
    tcp: Arc<dyn rpc::backchannel::CallSender>,
    rdma: Arc<dyn rpc::backchannel::CallSender>,
}

impl rpc::backchannel::CallSender for ByTransport {
    fn send(&self, conn_id: u64, record: Vec<u8>) -> Result<(), rpc::backchannel::SendError> {
        if conn_id & rdma::server::CONN_ID_BIT != 0 {
            self.rdma.send(conn_id, record)
        } else {
            self.tcp.send(conn_id, record)
        }
    }
}

impl Running {
    pub fn shutdown(mut self) {
        if let Some(a) = &self.admin {
            a.ready.store(false, Ordering::SeqCst);
        }
        if let Some(s) = self.admin_http.take() {
            s.shutdown();
        }
        if let Some(s) = self.rdma.take() {
            s.shutdown();
        }
        if let Some(s) = self.nfs.take() {
            s.shutdown();
        }
        if let Some(s) = self.metrics_http.take() {
            s.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    //! Proves the pure wiring decisions: which MOUNT exports and listeners a
    //! config yields, and that portmap registrations name the fixed ports.
    use super::*;

    fn cfg(exports: serde_json::Value, server: serde_json::Value) -> Config {
        Config::parse(
            &serde_json::json!({
                "server": server,
                "mounts": { "m": { "module": "memfs" } },
                "exports": exports,
                "admin": { "token": "t", "tls": false }
            })
            .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn volumes_get_an_export_unless_one_covers_them() {
        let names = |c: &Config| -> Vec<(String, String)> {
            mount_exports(c)
                .into_iter()
                .map(|e| (String::from_utf8(e.name).unwrap(), String::from_utf8(e.path).unwrap()))
                .collect()
        };
        let covered = cfg(serde_json::json!({ "/m": { "path": "/m" } }), serde_json::json!({}));
        assert_eq!(names(&covered), [("/m".to_string(), "/m".to_string())]);
        // An export whose client path differs from its namespace path does not
        // make /m/volumes/<id> mountable under that name: add the identity one.
        let renamed = cfg(serde_json::json!({ "/nfs1": { "path": "/m" } }), serde_json::json!({}));
        assert_eq!(
            names(&renamed),
            [("/nfs1".to_string(), "/m".to_string()), ("/m/volumes".to_string(), "/m/volumes".to_string())]
        );
    }

    #[test]
    fn admin_api_never_starts_without_a_token() {
        // Parsed without a file, a config lacking a token has nowhere to
        // keep a generated one: start refuses instead of serving open.
        let c = Config::parse(
            &serde_json::json!({
                "server": { "bind": "127.0.0.1", "nfs_port": 0, "mount_port": 0, "portmap_port": 0 },
                "mounts": { "m": { "module": "memfs" } },
                "admin": { "bind": "127.0.0.1", "port": 0, "tls": false },
                "metrics": { "enabled": false }
            })
            .to_string(),
        )
        .unwrap();
        assert!(c.admin.token_generate);
        let e = start(&c).err().expect("refused");
        assert!(e.starts_with("admin.token: none set and none generated"), "{e}");
        let mut c = c;
        let e = c.provide_admin_token().unwrap_err();
        assert_eq!(e.path, "admin.token");
    }

    #[test]
    fn listeners_and_registrations_follow_ports_and_role() {
        let c = cfg(serde_json::json!({}), serde_json::json!({ "bind": "127.0.0.1", "nfs_port": 2049, "mount_port": 20048, "portmap_port": 111 }));
        let ports: Vec<u16> = listen_addrs(&c).iter().map(|a| a.port()).collect();
        assert_eq!(ports, [2049, 20048, 111]);
        let regs = portmap_registrations(&c);
        assert!(regs.iter().any(|r| r.prog == 100005 && r.port == 20048));
        assert!(regs.iter().all(|r| r.prot == nfs3::portmap::IPPROTO_TCP));
        let c = cfg(serde_json::json!({}), serde_json::json!({ "nfs_port": 2049, "mount_port": 0, "portmap_port": 0 }));
        assert_eq!(listen_addrs(&c).len(), 1);
        assert!(portmap_registrations(&c).iter().any(|r| r.prog == 100005 && r.port == 2049));
        let ds = cfg(serde_json::json!({}), serde_json::json!({ "role": "ds", "nfs_port": 2050, "mount_port": 20048 }));
        assert_eq!(listen_addrs(&ds).iter().map(|a| a.port()).collect::<Vec<_>>(), [2050]);
    }
}
