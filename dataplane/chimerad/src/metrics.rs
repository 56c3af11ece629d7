//! Prometheus `/metrics` (text exposition format 0.0.4) on its own port.
//!
//! A scrape sums the per-core RPC counters (`rpc::metrics::snapshot`) and
//! adds gauges for mounts, volumes, readiness and data servers. Everything is
//! rendered on the scrape thread; the data path only bumps its own per-core
//! counters. The chart's alert rules and dashboard (charts/chimera) use these
//! names; `e2e/monitoring/test_metric_names.py` fails when one they use is gone.

use crate::admin::Admin;
use crate::http::{Handler, Request, Response};
use rpc::metrics::Snapshot;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use vfs::router::Router;

/// The block devices under this server's diskfs (set once at start).
static DEVICES: Mutex<Vec<block::Device>> = Mutex::new(Vec::new());

pub fn set_devices(devs: Vec<block::Device>) {
    *DEVICES.lock().unwrap_or_else(|e| e.into_inner()) = devs;
}

/// The server's diskfs (one per server; its mounts are views of it).
static DISKFS: Mutex<Option<diskfs::Counters>> = Mutex::new(None);

pub fn set_diskfs(c: diskfs::Counters) {
    *DISKFS.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
}

/// diskfs: where its READs and WRITEs ran, and device errors.
pub fn render_diskfs(out: &mut String, c: &diskfs::Counters) {
    let (core, retried) = c.core_reads();
    let (flushes, parked) = c.log_flushes();
    let rows: [(&str, &str, u64); 7] = [
        ("chimera_diskfs_core_reads_total", "READs read from the devices on the core that decoded them (no worker thread).", core),
        ("chimera_diskfs_core_reads_retried_total", "Core READs done again on a worker because their file lost blocks meanwhile.", retried),
        ("chimera_diskfs_core_writes_total", "WRITEs written to the devices on the core that decoded them.", c.core_writes()),
        ("chimera_diskfs_core_commits_total", "COMMITs and stable WRITEs whose device flushes ran on the core that decoded them (the log flush after them on a worker).", c.core_commits()),
        ("chimera_diskfs_io_errors_total", "Device operations of diskfs that failed.", c.io_errors()),
        ("chimera_diskfs_log_flushes_total", "Intent-log units written and flushed (each a group commit of every change logged before it).", flushes),
        ("chimera_diskfs_log_waits_parked_total", "Metadata calls that waited for their log flush parked on a worker, not on their core.", parked),
    ];
    for (n, help, v) in rows {
        header(out, n, "counter", help);
        let _ = writeln!(out, "{n} {v}");
    }
}

/// The `nfs` mounts (mount name, backend), registered as they start.
static NFS_MOUNTS: Mutex<Vec<(String, Arc<nfsvfs::NfsVfs>)>> = Mutex::new(Vec::new());

pub fn add_nfs_mount(name: &str, v: Arc<nfsvfs::NfsVfs>) {
    NFS_MOUNTS.lock().unwrap_or_else(|e| e.into_inner()).push((name.to_string(), v));
}

/// Per `nfs` mount: whether its remote answers, connects, outages.
pub fn render_nfs_mounts(out: &mut String, mounts: &[(String, Arc<nfsvfs::NfsVfs>)]) {
    if mounts.is_empty() {
        return;
    }
    let n = "chimera_nfs_mount_up";
    header(out, n, "gauge", "1 while the nfs mount's remote answered its last connect or call.");
    for (m, v) in mounts {
        let _ = writeln!(out, "{n}{{mount=\"{}\"}} {}", esc(m), v.is_up() as u8);
    }
    use std::sync::atomic::Ordering::Relaxed;
    let counters: [(&str, &str, fn(&nfsvfs::Stats) -> u64); 4] = [
        ("chimera_nfs_mount_connects_total", "Connections made (with MOUNT) to the remote.", |s| s.connects.load(Relaxed)),
        ("chimera_nfs_mount_connect_failures_total", "Connects or MOUNTs to the remote that failed.", |s| s.connect_failures.load(Relaxed)),
        ("chimera_nfs_mount_connections_lost_total", "Connections dropped: closed by the remote or a call timed out.", |s| {
            s.connections_lost.load(Relaxed)
        }),
        ("chimera_nfs_mount_calls_failed_total", "Remote calls that failed (NFS errors included).", |s| s.calls_failed.load(Relaxed)),
    ];
    for (n, help, get) in counters {
        header(out, n, "counter", help);
        for (m, v) in mounts {
            let _ = writeln!(out, "{n}{{mount=\"{}\"}} {}", esc(m), get(v.stats()));
        }
    }
}

/// Per-device I/O counters and the latency histogram of the devices that
/// keep them (the userspace NVMe driver).
pub fn render_devices(out: &mut String, devs: &[block::Device]) {
    let stats: Vec<(String, block::stats::Snapshot)> =
        devs.iter().filter_map(|d| Some((d.info().name.to_string(), d.stats()?))).collect();
    if stats.is_empty() {
        return;
    }
    let n = "chimera_device_ops_total";
    header(out, n, "counter", "Block-device operations completed, by operation.");
    for (d, s) in &stats {
        for (op, v) in [("read", s.reads), ("write", s.writes), ("flush", s.flushes), ("write_zeroes", s.zeroes)] {
            let _ = writeln!(out, "{n}{{device=\"{}\",op=\"{op}\"}} {v}", esc(d));
        }
    }
    let n = "chimera_device_bytes_total";
    header(out, n, "counter", "Bytes read and written on the device.");
    for (d, s) in &stats {
        let _ = writeln!(out, "{n}{{device=\"{}\",op=\"read\"}} {}", esc(d), s.bytes_read);
        let _ = writeln!(out, "{n}{{device=\"{}\",op=\"write\"}} {}", esc(d), s.bytes_written);
    }
    let per: [(&str, &str, fn(&block::stats::Snapshot) -> u64); 5] = [
        ("chimera_device_errors_total", "Operations that failed (device status, timeout).", |s| s.errors),
        ("chimera_device_timeouts_total", "Operations failed back after a command timeout.", |s| s.timeouts),
        ("chimera_device_aborts_total", "Commands aborted after the command timeout.", |s| s.aborts),
        ("chimera_device_resets_total", "Controller resets.", |s| s.resets),
        ("chimera_device_commands_total", "Device commands submitted (large operations take several).", |s| s.commands),
    ];
    for (n, help, get) in per {
        header(out, n, "counter", help);
        for (d, s) in &stats {
            let _ = writeln!(out, "{n}{{device=\"{}\"}} {}", esc(d), get(s));
        }
    }
    let n = "chimera_device_latency_seconds";
    header(out, n, "histogram", "Block-device operation latency, submission to completion.");
    for (d, s) in &stats {
        let mut cum = 0u64;
        for (i, c) in s.latency_buckets.iter().enumerate() {
            cum += c;
            let le = match block::stats::LATENCY_BOUNDS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".into(),
            };
            let _ = writeln!(out, "{n}_bucket{{device=\"{}\",le=\"{le}\"}} {cum}", esc(d));
        }
        let _ = writeln!(out, "{n}_sum{{device=\"{}\"}} {}", esc(d), s.latency_sum_s);
        let _ = writeln!(out, "{n}_count{{device=\"{}\"}} {cum}", esc(d));
    }
}

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label value escaping of the exposition format: backslash, quote, newline.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Histogram bucket bound in seconds from microseconds (`+Inf` for the last).
fn le_seconds(us: u64) -> String {
    if us == u64::MAX {
        "+Inf".to_string()
    } else {
        format!("{}", us as f64 / 1e6)
    }
}

pub fn render_rpc(out: &mut String, s: &Snapshot) {
    let per_op: [(&str, &str, fn(&rpc::metrics::OpSnapshot) -> u64); 4] = [
        ("chimera_rpc_ops_total", "RPC operations completed, by program and operation.", |o| o.count),
        ("chimera_rpc_errors_total", "RPC operations that completed with an error status.", |o| o.errors),
        ("chimera_rpc_received_bytes_total", "Bytes of RPC calls received, by operation.", |o| o.bytes_in),
        ("chimera_rpc_sent_bytes_total", "Bytes of RPC replies sent, by operation.", |o| o.bytes_out),
    ];
    for (name, help, get) in per_op {
        header(out, name, "counter", help);
        for o in &s.ops {
            let _ = writeln!(out, "{name}{{program=\"{}\",op=\"{}\"}} {}", esc(o.program), esc(o.op), get(o));
        }
    }
    let h = "chimera_rpc_latency_seconds";
    header(out, h, "histogram", "Time from a call's arrival to its reply being queued.");
    for o in &s.ops {
        let labels = format!("program=\"{}\",op=\"{}\"", esc(o.program), esc(o.op));
        for (le_us, cum) in &o.latency_buckets {
            let _ = writeln!(out, "{h}_bucket{{{labels},le=\"{}\"}} {cum}", le_seconds(*le_us));
        }
        let _ = writeln!(out, "{h}_sum{{{labels}}} {}", o.latency_ns_sum as f64 / 1e9);
        let _ = writeln!(out, "{h}_count{{{labels}}} {}", o.count);
    }
    let conns: [(&str, &str, u64); 4] = [
        ("chimera_connections_accepted_total", "Transport connections accepted.", s.conns_accepted),
        ("chimera_connections_closed_total", "Transport connections closed.", s.conns_closed),
        ("chimera_connections_rejected_total", "Connections refused because server.conns_max was reached.", s.conns_rejected),
        ("chimera_connections_protocol_errors_total", "Connections closed for malformed or oversize records.", s.conns_protocol_errors),
    ];
    for (name, help, v) in conns {
        header(out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
    }
    header(out, "chimera_connections_open", "gauge", "Transport connections currently open.");
    let _ = writeln!(out, "chimera_connections_open {}", s.conns_accepted.saturating_sub(s.conns_closed));
}

/// Space per mount (every role: a data server's data files fill its own
/// mounts, which no volume quota covers). A mount whose backend cannot
/// answer is left out of this scrape rather than failing it. The figures
/// come from `Vfs::fsstat_now` on the scrape thread, as for the admin API's
/// cluster document: an `nfs`-module mount answers what its remote last
/// said and asks again on its own workers, so a stalled remote never holds
/// a scrape.
pub fn render_mounts(out: &mut String, router: &Router) {
    let stats: Vec<(String, vfs::FsStat)> = router
        .mounts()
        .iter()
        .filter_map(|m| {
            let fh = m.backend.root(m.export_id).ok()?;
            let s = m.backend.fsstat_now(&fh)?;
            Some((String::from_utf8_lossy(&m.name).into_owned(), s))
        })
        .collect();
    let n = "chimera_mount_capacity_bytes";
    header(out, n, "gauge", "Size of the mount's backend.");
    for (name, s) in &stats {
        let _ = writeln!(out, "{n}{{mount=\"{}\"}} {}", esc(name), s.total_bytes);
    }
    let n = "chimera_mount_used_bytes";
    header(out, n, "gauge", "Bytes in use on the mount's backend (capacity minus free).");
    for (name, s) in &stats {
        let _ = writeln!(out, "{n}{{mount=\"{}\"}} {}", esc(name), s.total_bytes.saturating_sub(s.free_bytes));
    }
}

pub fn render_admin(out: &mut String, a: &Admin) {
    header(out, "chimera_ready", "gauge", "1 while /readyz answers ready (the admin API's process).");
    let _ = writeln!(out, "chimera_ready {}", a.ready.load(Ordering::SeqCst) as u8);
    if let Some(vols) = &a.volumes {
        // A failing listing drops the volume gauges from this scrape rather
        // than failing the whole scrape.
        if let Ok(list) = vols.list() {
            header(out, "chimera_volumes", "gauge", "Volumes served.");
            let _ = writeln!(out, "chimera_volumes {}", list.len());
            header(out, "chimera_volume_capacity_bytes", "gauge", "Volume capacity (quota).");
            for v in &list {
                let _ = writeln!(out, "chimera_volume_capacity_bytes{{volume=\"{}\"}} {}", esc(&v.id), v.capacity_bytes);
            }
            header(out, "chimera_volume_used_bytes", "gauge", "Bytes charged to the volume.");
            for v in &list {
                let _ = writeln!(out, "chimera_volume_used_bytes{{volume=\"{}\"}} {}", esc(&v.id), v.used_bytes);
            }
        }
    }
    let ds = a.data_servers.read().unwrap_or_else(|p| p.into_inner());
    header(out, "chimera_data_servers", "gauge", "Data servers known to the MDS, by readiness.");
    let ready = ds.list.iter().filter(|d| d.ready).count();
    let _ = writeln!(out, "chimera_data_servers{{state=\"ready\"}} {ready}");
    let _ = writeln!(out, "chimera_data_servers{{state=\"not_ready\"}} {}", ds.list.len() - ready);
    header(out, "chimera_data_servers_generation", "gauge", "Changes to the data-server list since start.");
    let _ = writeln!(out, "chimera_data_servers_generation {}", ds.generation);
    drop(ds);
    if let Some(p) = &a.pnfs {
        render_pnfs(out, p);
    }
}

/// The pNFS MDS's counters and per-DS state (names in README.md).
pub fn render_pnfs(out: &mut String, p: &pnfs::Pnfs) {
    let m = &p.metrics;
    let ld = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let n = "chimera_pnfs_layouts_granted_total";
    header(out, n, "counter", "Layout segments granted by LAYOUTGET, by iomode.");
    let _ = writeln!(out, "{n}{{iomode=\"read\"}} {}", ld(&m.layouts_granted_read));
    let _ = writeln!(out, "{n}{{iomode=\"rw\"}} {}", ld(&m.layouts_granted_rw));
    let n = "chimera_pnfs_layoutget_errors_total";
    header(out, n, "counter", "LAYOUTGETs refused, by error.");
    let _ = writeln!(out, "{n}{{error=\"LAYOUTTRYLATER\"}} {}", ld(&m.layoutget_trylater));
    let _ = writeln!(out, "{n}{{error=\"LAYOUTUNAVAILABLE\"}} {}", ld(&m.layoutget_unavailable));
    let _ = writeln!(out, "{n}{{error=\"other\"}} {}", ld(&m.layoutget_bad_stateid));
    let counters: [(&str, &str, u64); 13] = [
        ("chimera_pnfs_layouts_returned_total", "Layouts returned by LAYOUTRETURN.", ld(&m.layouts_returned)),
        ("chimera_pnfs_layouts_recalled_total", "Layouts recalled (DS drain or removal, truncate).", ld(&m.layouts_recalled)),
        ("chimera_pnfs_layoutcommits_total", "LAYOUTCOMMITs applied.", ld(&m.layoutcommits)),
        ("chimera_pnfs_layoutstats_total", "LAYOUTSTATS calls and ff_iostats4 reports received.", ld(&m.layoutstats)),
        ("chimera_pnfs_layouterrors_total", "DS errors reported by clients (LAYOUTERROR, LAYOUTRETURN ff_ioerr4).", ld(&m.layouterrors)),
        ("chimera_pnfs_fences_total", "Files fenced (data files moved to a new synthetic owner).", ld(&m.fences)),
        ("chimera_pnfs_layouts_revoked_total", "Recalled layouts not returned within recall_timeout_ms, revoked by fencing their file.", ld(&m.layouts_revoked)),
        ("chimera_pnfs_resyncs_total", "Stale mirror copies copied back in step with a good copy.", ld(&m.resyncs)),
        ("chimera_pnfs_resync_bytes_total", "Bytes written to stale mirror copies by resyncs.", ld(&m.resync_bytes)),
        ("chimera_pnfs_resync_failures_total", "Resyncs that stopped (the copy stays stale; tried again later).", ld(&m.resync_failures)),
        ("chimera_pnfs_data_file_removals_total", "Data-file removals queued (last link of a placed file removed).", ld(&m.removals_queued)),
        ("chimera_pnfs_orphan_data_files_removed_total", "Data files the orphan sweep removed from the data servers (their MDS file no longer existed).", ld(&m.orphans_removed)),
        ("chimera_pnfs_layouts_active", "Layout states held by clients.", p.layouts_active() as u64),
    ];
    for (name, help, v) in counters {
        header(out, name, if name.ends_with("_total") { "counter" } else { "gauge" }, help);
        let _ = writeln!(out, "{name} {v}");
    }
    let n = "chimera_pnfs_mds_io_bytes_total";
    header(out, n, "counter", "Bytes of I/O proxied through the MDS to data servers.");
    let _ = writeln!(out, "{n}{{op=\"read\"}} {}", ld(&m.mds_read_bytes));
    let _ = writeln!(out, "{n}{{op=\"write\"}} {}", ld(&m.mds_write_bytes));
    let n = "chimera_pnfs_mds_io_failures_total";
    header(out, n, "counter", "I/O through the MDS that reached no copy of its data (answered with an I/O error).");
    let _ = writeln!(out, "{n}{{op=\"read\"}} {}", ld(&m.mds_read_failures));
    let _ = writeln!(out, "{n}{{op=\"write\"}} {}", ld(&m.mds_write_failures));
    let ds = p.ds_states();
    let per: [(&str, &str, &str, fn(&pnfs::DsState) -> u64); 7] = [
        ("chimera_pnfs_ds_healthy", "gauge", "1 while the DS is considered reachable.", |d| d.healthy as u64),
        ("chimera_pnfs_ds_draining", "gauge", "1 while the DS is draining.", |d| d.draining as u64),
        ("chimera_pnfs_ds_errors_total", "counter", "Errors reported for the DS (clients, control calls).", |d| d.errors),
        ("chimera_pnfs_ds_layouts_granted_total", "counter", "Layout segments naming the DS.", |d| d.layouts_granted),
        ("chimera_pnfs_ds_layouts_held", "gauge", "Layout states held now that name the DS (0: drained).", |d| d.layouts_held),
        ("chimera_pnfs_ds_files", "gauge", "Data files placed on the DS.", |d| d.files),
        ("chimera_pnfs_ds_stale_copies", "gauge", "Copies on the DS that missed writes, not yet resynced (0: in step).", |d| d.stale_copies),
    ];
    for (name, kind, help, get) in per {
        header(out, name, kind, help);
        for d in &ds {
            let _ = writeln!(out, "{name}{{ds=\"{}\"}} {}", esc(&d.name), get(d));
        }
    }
}

pub fn render(s: &Snapshot, admin: Option<&Admin>) -> String {
    render_with(s, admin, None)
}

pub fn render_with(s: &Snapshot, admin: Option<&Admin>, router: Option<&Router>) -> String {
    let mut out = String::with_capacity(16 << 10);
    header(&mut out, "chimera_build_info", "gauge", "Always 1; labels carry the version.");
    let _ = writeln!(out, "chimera_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
    render_rpc(&mut out, s);
    if let Some(r) = router {
        render_mounts(&mut out, r);
    }
    if let Some(a) = admin {
        render_admin(&mut out, a);
    }
    render_devices(&mut out, &DEVICES.lock().unwrap_or_else(|e| e.into_inner()));
    if let Some(u) = block::huge::usage() {
        render_hugepages(&mut out, u);
    }
    render_nfs_mounts(&mut out, &NFS_MOUNTS.lock().unwrap_or_else(|e| e.into_inner()));
    if let Some(c) = DISKFS.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        render_diskfs(&mut out, c);
    }
    if rdma::server::STARTED.load(std::sync::atomic::Ordering::Relaxed) {
        render_rdma(&mut out);
    }
    out
}

/// The hugepage arena (`common.huge_pages`): slabs mapped, bytes mapped
/// and carved out for pools and queues.
pub fn render_hugepages(out: &mut String, u: block::huge::Usage) {
    header(out, "chimera_hugepage_slabs", "gauge", "Hugepage slabs mapped (common.slab_size each, or larger).");
    let _ = writeln!(out, "chimera_hugepage_slabs{{page_bytes=\"{}\"}} {}", u.page_bytes, u.slabs);
    header(out, "chimera_hugepage_bytes", "gauge", "Bytes of hugepage slabs: mapped, and carved out for DMA pools and queues.");
    let _ = writeln!(out, "chimera_hugepage_bytes{{state=\"mapped\"}} {}", u.mapped_bytes);
    let _ = writeln!(out, "chimera_hugepage_bytes{{state=\"carved\"}} {}", u.carved_bytes);
}

/// The RPC-over-RDMA transport's counters (`server.rdma`).
pub fn render_rdma(out: &mut String) {
    header(out, "chimera_rdma_registered_bytes", "gauge", "Memory registered with RDMA devices, by where it came from (hugepage slabs, or mappings of its own).");
    let _ = writeln!(out, "chimera_rdma_registered_bytes{{from=\"hugepages\"}} {}", rdma::mem::CARVED_BYTES.load(std::sync::atomic::Ordering::Relaxed));
    let _ = writeln!(out, "chimera_rdma_registered_bytes{{from=\"mapped\"}} {}", rdma::mem::MAPPED_BYTES.load(std::sync::atomic::Ordering::Relaxed));
    header(out, "chimera_rdma_connections_open", "gauge", "RDMA connections open");
    let _ = writeln!(out, "chimera_rdma_connections_open {}", rdma::server::CONNS_OPEN.load(std::sync::atomic::Ordering::Relaxed));
    let shards = (rdma::server::SHARDS.load(std::sync::atomic::Ordering::Relaxed) as usize).min(rdma::server::SHARDS_MAX);
    for (name, kind, help, a) in [
        ("chimera_rdma_shard_connections_open", "gauge", "RDMA connections open per shard (core loop)", &rdma::server::SHARD_OPEN),
        ("chimera_rdma_shard_connections_accepted_total", "counter", "RDMA connections each shard (core loop) accepted", &rdma::server::SHARD_ACCEPTED),
        ("chimera_rdma_shard_calls_total", "counter", "RPC-over-RDMA calls each shard (core loop) received", &rdma::server::SHARD_CALLS),
    ] {
        header(out, name, kind, help);
        for (core, v) in a.iter().take(shards).enumerate() {
            let _ = writeln!(out, "{name}{{core=\"{core}\"}} {}", v.load(std::sync::atomic::Ordering::Relaxed));
        }
    }
    for (name, help, v) in rdma::server::STATS.rows() {
        let n = format!("chimera_rdma_{name}");
        header(out, &n, "counter", help);
        let _ = writeln!(out, "{n} {v}");
    }
}

/// `GET /metrics` (and `/healthz` for probes of the metrics port), without
/// the per-mount gauges (see [`handler_with`]).
pub fn handler(admin: Option<Arc<Admin>>) -> Handler {
    handler_with(admin, None)
}

/// `GET /metrics` with the mounts of `router` too (what `serve` runs).
pub fn handler_with(admin: Option<Arc<Admin>>, router: Option<Arc<Router>>) -> Handler {
    Arc::new(move |req: &Request| match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/metrics") => {
            Response::new(200, CONTENT_TYPE, render_with(&rpc::metrics::snapshot(), admin.as_deref(), router.as_deref()))
        }
        ("GET", "/healthz") => Response::new(200, "text/plain", "ok\n"),
        (_, "/metrics") | (_, "/healthz") => Response::error(405, "method not allowed; allowed: GET"),
        _ => Response::error(404, format!("no route {}", req.path)),
    })
}

#[cfg(test)]
#[path = "../tests/common/held_port.rs"]
mod held_port;

#[cfg(test)]
mod tests {
    //! Proves the exposition text is well-formed for a known snapshot:
    //! cumulative buckets in seconds ending in +Inf, _sum/_count consistent,
    //! labels escaped, connections-open derived.
    use super::*;
    use rpc::metrics::OpSnapshot;

    /// Per-device metrics from the NVMe driver (on its simulated
    /// controller): counts, bytes and a cumulative latency histogram whose
    /// count is the operations completed; devices without stats are left out.
    #[test]
    fn renders_nfs_mount_metrics() {
        // A remote nobody listens on: the mount exists, is down, counts it.
        let (_held, port) = held_port::held_port();
        let opts = nfsvfs::Options {
            name: "r".into(),
            export_id: 1,
            addr: format!("127.0.0.1:{port}"),
            path: "/x".into(),
            connections: 1,
            timeout: std::time::Duration::from_secs(2),
            retry_after: std::time::Duration::from_millis(1),
            mount_at: Default::default(),
            handle_map: None,
        };
        let v = Arc::new(nfsvfs::NfsVfs::new(opts, Arc::new(|_, _| {})).unwrap());
        let root = vfs::Vfs::root(&*v, 1).unwrap();
        assert_eq!(vfs::Vfs::getattr(&*v, &root), Err(vfs::VfsError::Io));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while v.stats().connect_failures.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            assert!(std::time::Instant::now() < deadline, "no connect attempted");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut out = String::new();
        render_nfs_mounts(&mut out, &[("r\"x".to_string(), v)]);
        assert!(out.contains("chimera_nfs_mount_up{mount=\"r\\\"x\"} 0"), "{out}");
        assert!(out.contains("# TYPE chimera_nfs_mount_connect_failures_total counter"), "{out}");
        assert!(!out.contains("chimera_nfs_mount_connect_failures_total{mount=\"r\\\"x\"} 0"), "a failed connect is counted: {out}");
    }

    #[test]
    fn renders_device_metrics() {
        let bus = Arc::new(nvme::sim::SimBus::new(nvme::sim::SimConfig::new("0000:3b:00.0", 2048, 512)));
        let dev = nvme::NvmeDevice::open(bus, &nvme::Options::default()).unwrap();
        let pool = block::conformance::pool(4096, 2);
        let mut q = block::BlockDevice::queue(&dev, 0, 2).unwrap();
        block::sync::write(&mut *q, &pool, 3, &[7u8; 8192]).unwrap();
        block::sync::flush(&mut *q).unwrap();
        let mut got = [0u8; 4096];
        block::sync::read(&mut *q, &pool, 3, &mut got).unwrap();
        drop(q);
        let mem: block::Device = Arc::new(block::mem::MemDevice::new("mem0", 64));
        let mut out = String::new();
        render_devices(&mut out, &[Arc::new(dev), mem]);
        for want in [
            "chimera_device_ops_total{device=\"0000:3b:00.0\",op=\"write\"} 2",
            "chimera_device_ops_total{device=\"0000:3b:00.0\",op=\"read\"} 1",
            "chimera_device_ops_total{device=\"0000:3b:00.0\",op=\"flush\"} 1",
            "chimera_device_bytes_total{device=\"0000:3b:00.0\",op=\"write\"} 8192",
            "chimera_device_bytes_total{device=\"0000:3b:00.0\",op=\"read\"} 4096",
            "chimera_device_errors_total{device=\"0000:3b:00.0\"} 0",
            "chimera_device_resets_total{device=\"0000:3b:00.0\"} 0",
            "chimera_device_latency_seconds_bucket{device=\"0000:3b:00.0\",le=\"+Inf\"} 4",
            "chimera_device_latency_seconds_count{device=\"0000:3b:00.0\"} 4",
            "# TYPE chimera_device_latency_seconds histogram",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
        assert!(!out.contains("mem0"), "a device without stats is left out");
        let mut prev = 0u64;
        for l in out.lines().filter(|l| l.starts_with("chimera_device_latency_seconds_bucket")) {
            let v: u64 = l.rsplit(' ').next().unwrap().parse().unwrap();
            assert!(v >= prev, "buckets are cumulative: {l}");
            prev = v;
        }
    }

    #[test]
    fn renders_known_snapshot() {
        let s = Snapshot {
            ops: vec![OpSnapshot {
                program: "nfs3",
                op: "READ\"x",
                count: 3,
                errors: 1,
                bytes_in: 300,
                bytes_out: 12288,
                latency_ns_sum: 6_000,
                latency_buckets: vec![(1, 1), (2, 2), (4, 3), (u64::MAX, 3)],
            }],
            conns_accepted: 5,
            conns_closed: 2,
            conns_rejected: 1,
            conns_protocol_errors: 0,
        };
        let t = render(&s, None);
        for line in [
            "chimera_rpc_ops_total{program=\"nfs3\",op=\"READ\\\"x\"} 3",
            "chimera_rpc_errors_total{program=\"nfs3\",op=\"READ\\\"x\"} 1",
            "chimera_rpc_received_bytes_total{program=\"nfs3\",op=\"READ\\\"x\"} 300",
            "chimera_rpc_sent_bytes_total{program=\"nfs3\",op=\"READ\\\"x\"} 12288",
            "chimera_rpc_latency_seconds_bucket{program=\"nfs3\",op=\"READ\\\"x\",le=\"0.000001\"} 1",
            "chimera_rpc_latency_seconds_bucket{program=\"nfs3\",op=\"READ\\\"x\",le=\"0.000004\"} 3",
            "chimera_rpc_latency_seconds_bucket{program=\"nfs3\",op=\"READ\\\"x\",le=\"+Inf\"} 3",
            "chimera_rpc_latency_seconds_sum{program=\"nfs3\",op=\"READ\\\"x\"} 0.000006",
            "chimera_rpc_latency_seconds_count{program=\"nfs3\",op=\"READ\\\"x\"} 3",
            "chimera_connections_open 3",
            "chimera_connections_rejected_total 1",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        // Every sample line belongs to a declared family.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            let family = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
            assert!(t.contains(&format!("# TYPE {family} ")), "undeclared {name}");
        }
    }

    fn sample(t: &str, series: &str) -> Option<u64> {
        t.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Proves the per-mount gauges follow the backend: capacity is the
    /// configured size, used grows by what is written (and never exceeds
    /// capacity), the mount name is escaped; `chimera_ready` follows the
    /// admin API's flag both ways.
    #[test]
    fn renders_mount_space_and_readiness() {
        use vfs::memfs::{MemFs, MemFsConfig};
        use vfs::router::Mount;
        use vfs::{CreateMode, Cred, NodeKind, Stability, Vfs};
        let capacity = 64u64 << 20;
        let fs: Arc<dyn Vfs> = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: capacity }));
        let router = Router::new(vec![Mount { name: b"m\"1".to_vec(), export_id: 1, backend: fs.clone() }]).unwrap();
        let empty = Snapshot::default();
        let before = render_with(&empty, None, Some(&router));
        assert_eq!(sample(&before, "chimera_mount_capacity_bytes{mount=\"m\\\"1\"}"), Some(capacity), "{before}");
        let used_before = sample(&before, "chimera_mount_used_bytes{mount=\"m\\\"1\"}").expect("used gauge");

        let root = fs.root(1).unwrap();
        let (fh, _) = fs.create(&root, b"f", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap();
        let block = vec![7u8; 1 << 20];
        for i in 0..4u64 {
            fs.write(&fh, i << 20, &block, Stability::FileSync).unwrap();
        }
        let after = render_with(&empty, None, Some(&router));
        let used_after = sample(&after, "chimera_mount_used_bytes{mount=\"m\\\"1\"}").unwrap();
        assert!(used_after >= used_before + (4 << 20), "used {used_before} -> {used_after} after writing 4 MiB");
        assert!(used_after <= capacity, "used {used_after} above capacity {capacity}");
        // No router: no mount gauges at all (not zeros that would read as empty).
        assert!(!render_with(&empty, None, None).contains("chimera_mount_"));

        let cluster = crate::admin::ClusterInfo {
            name: "t".into(),
            role: "both",
            nfs_port: 2049,
            mount_port: 20048,
            exports: vec![],
            pnfs_enabled: false,
            stripe_unit_bytes: 1 << 20,
            mirrors: 1,
            capacity_bytes: capacity,
        };
        let admin = Admin::new("token".into(), None, Vec::new(), cluster);
        assert_eq!(sample(&render(&empty, Some(&admin)), "chimera_ready"), Some(0));
        admin.ready.store(true, Ordering::SeqCst);
        assert_eq!(sample(&render(&empty, Some(&admin)), "chimera_ready"), Some(1));
        admin.ready.store(false, Ordering::SeqCst);
        assert_eq!(sample(&render(&empty, Some(&admin)), "chimera_ready"), Some(0));
    }
}
