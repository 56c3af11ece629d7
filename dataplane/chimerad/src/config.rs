//! The chimerad configuration file: JSON shaped like the reference Chimera
//! deployment's (`common`, `server`, `mounts`, `exports`, `server.pnfs`), plus
//! our own clearly named additions (limits, ports, `admin`, `metrics`,
//! `volumes`). CONFIG.md next to this crate documents every key.
//!
//! Three kinds of keys:
//! - implemented keys are parsed, range-checked and applied;
//! - keys of the reference format that we do not implement (SMB shares, S3
//!   buckets, delegation pools, plugin paths, ...) are accepted and produce a
//!   warning naming them, so a reference config needs only backend edits;
//! - anything else is an error naming the key path (`server.foo`), because a
//!   misspelt limit silently falling back to its default is worse than
//!   refusing to start.
//!
//! Parsing is a pure function of the text (plus reading `admin.token_file`
//! and the machine's CPU count, which caps the reference's `server.threads`),
//! so `chimerad --check-config` and the tests exercise exactly what the
//! server runs with. The one thing decided at start rather than at parse is
//! a generated admin token (`Config::provide_admin_token`): writing a file is
//! not something a check may do.

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;

/// Largest config file accepted: a config is a few KiB; anything near this is
/// not a config.
pub const CONFIG_FILE_BYTES_MAX: u64 = 4 << 20;

// Bounds of the tunables. Each is asserted at parse time so that a typo
// (an extra zero) is caught before it becomes a memory blow-up.
/// The runtime's per-core metric shards bound the number of event loops.
pub const CORES_MAX: u64 = rpc::metrics::CORES_MAX as u64;
/// Largest reference `server.threads` accepted. The reference sizes it for
/// its own machine (80 on a 128-thread server); we run at most one loop per
/// available CPU (and `CORES_MAX`), so this bound only catches typos.
pub const THREADS_REF_MAX: u64 = 4096;
/// Room for an NFSv4 COMPOUND with a 4 KiB READ/WRITE plus headers.
pub const RECORD_BYTES_MIN: u64 = 64 << 10;
pub const RECORD_BYTES_MAX: u64 = 16 << 20;
pub const RECORD_BYTES_DEFAULT: u64 = (1 << 20) + (64 << 10);
pub const INFLIGHT_PER_CONN_MAX: u64 = 4096;
pub const INFLIGHT_PER_CONN_DEFAULT: u64 = 128;
/// Large receive / reply buffers per core (runtime pools; see CONFIG.md).
pub const BUFFERS_PER_CORE_MAX: u64 = 4096;
pub const BUFFERS_PER_CORE_DEFAULT: u64 = 32;
/// Calls parked on slow backends, per connection and per core.
pub const PARKED_PER_CONN_DEFAULT: u64 = 64;
pub const PARKED_PER_CORE_MAX: u64 = 65_536;
pub const PARKED_PER_CORE_DEFAULT: u64 = 1024;
pub const CONNS_MAX: u64 = 65536;
pub const CONNS_DEFAULT: u64 = 1024;
pub const LEASE_TIME_S_MIN: u64 = 5;
pub const LEASE_TIME_S_MAX: u64 = 3600;
pub const LEASE_TIME_S_DEFAULT: u64 = 90;
/// NFSv4 read and write delegations held at once, all clients (`server.nfs4_delegations_max`).
pub const DELEGATIONS_DEFAULT: u64 = 65_536;
pub const DELEGATIONS_MAX: u64 = 1 << 24;
/// Longest a core polls for device completions before it sleeps (10 ms).
pub const DEVICE_POLL_US_MAX: u64 = 10_000;
pub const GRACE_TIME_S_MAX: u64 = 3600;
pub const MEMFS_CAPACITY_BYTES_MIN: u64 = 1 << 20;
pub const MEMFS_CAPACITY_BYTES_MAX: u64 = 1 << 44;
pub const MEMFS_CAPACITY_BYTES_DEFAULT: u64 = 1 << 30;
pub const ADMIN_BODY_BYTES_MIN: u64 = 1 << 10;
pub const ADMIN_BODY_BYTES_MAX: u64 = 1 << 20;
pub const ADMIN_BODY_BYTES_DEFAULT: u64 = 64 << 10;
pub const ADMIN_CONNS_MAX: u64 = 256;
pub const ADMIN_CONNS_DEFAULT: u64 = 16;
pub const TOKEN_BYTES_MAX: usize = 4096;
pub const STRIPE_UNIT_BYTES_MIN: u64 = 4 << 10;
pub const STRIPE_UNIT_BYTES_MAX: u64 = 64 << 20;
pub const STRIPE_UNIT_BYTES_DEFAULT: u64 = 1 << 20;
pub const MIRRORS_MAX: u64 = 3;
pub const DATA_SERVERS_MAX: usize = 1024;
pub const MOUNTS_MAX: usize = 64;
pub const EXPORTS_MAX: usize = 256;
/// Longest namespace path (`/mount/dir/...`) accepted in `exports` and `volumes`.
pub const NS_PATH_BYTES_MAX: usize = 1024;
/// Devices one diskfs spreads over (the reference runs 16 per server).
pub const DISKFS_DEVICES_MAX: usize = 256;
/// diskfs metadata block cache, in 4 KiB blocks: 1 MiB .. 1 TiB; default 256 MiB.
pub const BLOCK_CACHE_BLOCKS_MIN: u64 = 256;
pub const BLOCK_CACHE_BLOCKS_MAX: u64 = 1 << 28;
pub const BLOCK_CACHE_BLOCKS_DEFAULT: u64 = 1 << 16;
/// diskfs inode cache, in inodes; default 64 Ki.
pub const INODE_CACHE_INODES_MIN: u64 = 64;
pub const INODE_CACHE_INODES_MAX: u64 = 1 << 28;
pub const INODE_CACHE_INODES_DEFAULT: u64 = 1 << 16;
/// Longest device path (Linux PATH_MAX including the NUL).
pub const DEVICE_PATH_BYTES_MAX: usize = 4095;
/// Random bytes in a generated admin token (256 bits; hex-encoded).
pub const GENERATED_TOKEN_BYTES: usize = 32;
/// Name of the generated admin token file, appended to the config file's name
/// (`pnfs.json` -> `pnfs.json.admin-token`) so two configs in one directory
/// get two tokens.
pub const GENERATED_TOKEN_SUFFIX: &str = ".admin-token";

/// A configuration problem, naming the key path (`server.nfs_port`,
/// `mounts.memfs.module`, `server.pnfs.data_servers[2].uaddr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub msg: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.msg)
        } else {
            write!(f, "{}: {}", self.path, self.msg)
        }
    }
}
impl std::error::Error for ConfigError {}

fn err<T>(path: &str, msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError { path: path.to_string(), msg: msg.into() })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn parse(s: &str) -> Option<LogLevel> {
        Some(match s.to_ascii_lowercase().as_str() {
            "error" | "fatal" => LogLevel::Error,
            "warn" | "warning" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            "trace" => LogLevel::Trace,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    KeyValue,
}

/// Which services this process runs (DESIGN: one binary, roles by config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Metadata server: the namespace, NFSv4.1 + layouts, the admin API.
    Mds,
    /// Data server: NFSv3 on DS-side data files only.
    Ds,
    /// Both in one process (single-box deployments, tests).
    Both,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Mds => "mds",
            Role::Ds => "ds",
            Role::Both => "both",
        }
    }
    pub fn runs_mds(self) -> bool {
        matches!(self, Role::Mds | Role::Both)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Netid {
    Tcp,
    Tcp6,
    Rdma,
    Rdma6,
}

impl Netid {
    pub fn parse(s: &str) -> Option<Netid> {
        Some(match s {
            "tcp" => Netid::Tcp,
            "tcp6" => Netid::Tcp6,
            "rdma" => Netid::Rdma,
            "rdma6" => Netid::Rdma6,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Netid::Tcp => "tcp",
            Netid::Tcp6 => "tcp6",
            Netid::Rdma => "rdma",
            Netid::Rdma6 => "rdma6",
        }
    }
    /// IANA port when an address gives none: nfs 2049, nfsrdma 20049.
    pub fn default_port(self) -> u16 {
        match self {
            Netid::Tcp | Netid::Tcp6 => 2049,
            Netid::Rdma | Netid::Rdma6 => 20049,
        }
    }
}

/// A pNFS data server as configured (`server.pnfs.data_servers[]`) or pushed
/// by the operator (`PUT /api/v1/dataservers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataServer {
    /// Name in the admin API and metric labels (`config-<index>` by default).
    pub name: Option<String>,
    pub netid: Netid,
    /// Host (IP literal or DNS name) clients reach the DS at.
    pub host: String,
    pub port: u16,
    /// Directory on the DS (a namespace path there) holding this MDS's data
    /// files; `None`: the DS's first mount (CONFIG.md).
    pub backing_path: Option<String>,
    /// NFS version (major, minor) clients use towards the DS.
    pub version: (u32, u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PnfsConfig {
    pub enabled: bool,
    pub stripe_unit_bytes: u64,
    /// DSes one file stripes over (0: all active).
    pub stripe_width: u32,
    pub mirrors: u32,
    pub synthetic_uid: u32,
    pub synthetic_gid: u32,
    pub layouts_per_client_max: u32,
    pub layouts_max: u32,
    pub ds_timeout_ms: u32,
    pub remove_queue_max: u32,
    pub recall_timeout_ms: u32,
    /// 0: no orphan sweep.
    pub orphan_sweep_interval_ms: u64,
    pub data_servers: Vec<DataServer>,
}

pub const SYNTHETIC_ID_DEFAULT: u64 = 1_000_000;
pub const LAYOUTS_PER_CLIENT_MAX_DEFAULT: u64 = 4096;
pub const LAYOUTS_MAX_DEFAULT: u64 = 262_144;
pub const DS_TIMEOUT_MS_DEFAULT: u64 = 3000;
pub const REMOVE_QUEUE_MAX_DEFAULT: u64 = 65_536;
pub const RECALL_TIMEOUT_MS_DEFAULT: u64 = 60_000;
pub const ORPHAN_SWEEP_INTERVAL_MS_DEFAULT: u64 = 3_600_000;
pub const ORPHAN_SWEEP_INTERVAL_MS_MAX: u64 = 7 * 86_400_000;

impl PnfsConfig {
    fn defaults() -> PnfsConfig {
        PnfsConfig {
            enabled: false,
            stripe_unit_bytes: STRIPE_UNIT_BYTES_DEFAULT,
            stripe_width: 0,
            mirrors: 1,
            synthetic_uid: SYNTHETIC_ID_DEFAULT as u32,
            synthetic_gid: SYNTHETIC_ID_DEFAULT as u32,
            layouts_per_client_max: LAYOUTS_PER_CLIENT_MAX_DEFAULT as u32,
            layouts_max: LAYOUTS_MAX_DEFAULT as u32,
            ds_timeout_ms: DS_TIMEOUT_MS_DEFAULT as u32,
            remove_queue_max: REMOVE_QUEUE_MAX_DEFAULT as u32,
            recall_timeout_ms: RECALL_TIMEOUT_MS_DEFAULT as u32,
            orphan_sweep_interval_ms: ORPHAN_SWEEP_INTERVAL_MS_DEFAULT,
            data_servers: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub role: Role,
    pub bind: IpAddr,
    pub cores: usize,
    pub nfs_port: u16,
    /// 0 disables the MOUNT service.
    pub mount_port: u16,
    /// 0 disables the portmapper.
    pub portmap_port: u16,
    pub rdma: bool,
    pub rdma_port: u16,
    /// The RDMA listener's address (`server.rdma_hostname`, an IP; default
    /// `server.bind`).
    pub rdma_addr: Option<IpAddr>,
    /// IP type of service of RDMA connections (`common.rdmacm_tos`).
    pub rdma_tos: Option<u8>,
    /// Credits granted to each RDMA client (calls in flight).
    pub rdma_credits: u32,
    /// RDMA connections open at once; more are rejected.
    pub rdma_conns_max: u32,
    /// Record-sized registered buffers per RDMA device.
    pub rdma_large_buffers: u32,
    pub record_bytes_max: u32,
    pub inflight_per_conn_max: u32,
    pub conns_max: u32,
    pub recv_buffers_per_core: u32,
    pub reply_buffers_per_core: u32,
    pub parked_per_conn_max: u32,
    pub parked_per_core_max: u32,
    pub lease_time_s: u32,
    pub grace_time_s: u32,
    /// NFSv4 delegations held at once; 0: `nfs4_delegations: false`.
    pub delegations_max: u32,
    /// Microseconds a core keeps polling while device operations it
    /// submitted are in flight (`runtime::Config::device_poll_us`).
    pub device_poll_us: u32,
    /// Pin core loop `i` to the `i`-th CPU of the process's affinity
    /// (`runtime::Config::cpus`); false: the scheduler places them.
    pub pin_cores: bool,
    pub pnfs: PnfsConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Module {
    /// In-memory, bounded by `capacity_bytes`.
    Memfs,
    /// The durable block backend over `Config::diskfs` (backend not in this
    /// build yet: parsed and validated, refused at start).
    Diskfs,
    /// The userspace NFS client: a remote export mounted into the
    /// namespace (crate `nfsvfs`).
    Nfs,
}

impl Module {
    pub fn as_str(self) -> &'static str {
        match self {
            Module::Memfs => "memfs",
            Module::Diskfs => "diskfs",
            Module::Nfs => "nfs",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountConfig {
    /// Name of the mount: the first component of namespace paths (`/name/...`).
    pub name: String,
    pub module: Module,
    /// Backend path: memfs always "/"; diskfs an absolute path inside the
    /// file system ("/", "/mds"); nfs the remote export ("host:/path").
    pub path: String,
    /// memfs memory bound; 0 for the other modules (their capacity is the
    /// devices' or the remote server's).
    pub capacity_bytes: u64,
    /// How an `nfs` mount reaches its remote (None for the other modules).
    pub nfs: Option<NfsMount>,
}

/// An `nfs` mount's connection settings (keys of the mount object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsMount {
    /// The remote's NFS port (`port`, default 2049); MOUNT is asked there
    /// too, as chimerad serves it on its NFS port.
    pub port: u16,
    /// The remote's MOUNT port (`mount_port`): MOUNT is asked only there.
    /// Absent: on the NFS port, and where the remote has none there (the
    /// Linux server, Ganesha) at the port its portmapper names.
    pub mount_port: Option<u16>,
    /// The remote portmapper's port (`portmap_port`, default 111).
    pub portmap_port: u16,
    /// TCP connections to the remote (`connections`, 1..=16, default 2).
    pub connections: u32,
    /// Bound on every remote call, connecting included (`timeout_ms`,
    /// 100..=600000, default 10000): a call to a remote that is down fails
    /// with NFS3ERR_IO / NFS4ERR_IO within it.
    pub timeout_ms: u64,
    /// The file that keeps the mount's mapped handles across restarts
    /// (`handle_map`, an absolute path; `nfsvfs::Options::handle_map`).
    /// None: handles of remotes without chimerad's handle shape (the Linux
    /// server, Ganesha) are stale after a restart of this server.
    pub handle_map: Option<String>,
}

pub const NFS_MOUNT_CONNECTIONS_DEFAULT: u32 = 2;
pub const NFS_MOUNT_CONNECTIONS_MAX: u32 = 16;
pub const NFS_MOUNT_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// `server.vfs.diskfs.config`: the durable backend's devices and caches,
/// shaped as the reference deployment's. Parsed and validated here; the
/// backend consumes it as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskfsConfig {
    /// Format the devices at start (destroys what they hold). The reference
    /// writes `true`; the backend decides how that combines with a device
    /// already holding this cluster's format.
    pub initialize: bool,
    /// Metadata block cache bound, in 4 KiB blocks (data blocks are not cached).
    pub block_cache_blocks: u64,
    /// Inode cache bound, in inodes.
    pub inode_cache_inodes: u64,
    /// Data spreads over all of them; at least one, no duplicates.
    pub devices: Vec<DiskfsDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskfsDevice {
    /// A regular file or block device driven through io_uring with O_DIRECT.
    IoUring { path: std::path::PathBuf },
    /// An NVMe controller bound to vfio-pci, driven from userspace.
    Vfio { pci: PciAddress },
}

/// A PCI function address. Written `0000:01:00.0` (domain:bus:device.function,
/// hex) or, as the reference does, without the domain (`01:00.0`, domain 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    /// 0..=31
    pub device: u8,
    /// 0..=7
    pub function: u8,
}

impl PciAddress {
    /// Largest PCI domain: Linux prints domains as 4 hex digits but VMD
    /// domains start at 0x10000, so up to 8 digits are accepted.
    const DOMAIN_HEX_DIGITS_MAX: usize = 8;

    pub fn parse(s: &str) -> Option<PciAddress> {
        let (dbd, function) = s.split_once('.')?;
        let parts: Vec<&str> = dbd.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [b, d] => ("0", *b, *d),
            [dom, b, d] if (4..=Self::DOMAIN_HEX_DIGITS_MAX).contains(&dom.len()) => (*dom, *b, *d),
            _ => return None,
        };
        // `digits` 0: any length (the domain's was checked above).
        let hex = |x: &str, digits: usize| -> Option<u32> {
            let len_ok = if digits == 0 { !x.is_empty() } else { x.len() == digits };
            if !len_ok || !x.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            u32::from_str_radix(x, 16).ok()
        };
        let a = PciAddress {
            domain: hex(domain, 0)?,
            bus: hex(bus, 2)? as u8,
            device: hex(device, 2)? as u8,
            function: hex(function, 1)? as u8,
        };
        if a.device > 31 || a.function > 7 {
            return None;
        }
        Some(a)
    }
}

/// The sysfs name (`0000:01:00.0`), what `/sys/bus/pci/devices/` lists.
impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportConfig {
    /// Path clients mount (`/nfs1`).
    pub name: String,
    /// Namespace path it resolves to (`/memfs/dir`).
    pub path: String,
    /// Client rules (`access`); `None`: open to every client, read-write,
    /// no squashing.
    pub access: Option<Vec<vfs::clients::Rule>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub enabled: bool,
    pub bind: IpAddr,
    pub port: u16,
    /// Bearer token every request must carry (from `token` or `token_file`,
    /// or generated at start when neither is set; empty until then).
    pub token: String,
    /// Neither `token` nor `token_file` is set: `Config::provide_admin_token`
    /// generates one at start (or reuses the one generated before).
    pub token_generate: bool,
    /// Where that token is kept: beside the config file (`Config::load`
    /// sets it; `None` after `Config::parse`, which knows no file).
    pub generated_token_file: Option<std::path::PathBuf>,
    pub body_bytes_max: u32,
    pub conns_max: u32,
    /// HTTPS or plain HTTP; always said explicitly when the API is enabled.
    pub tls: AdminTls,
}

/// How the admin API is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminTls {
    /// Plain HTTP: `admin.tls: false`, or the reference format's
    /// `server.rest_http_port` without its TLS keys. Also the value when
    /// the admin API is disabled.
    Off,
    /// HTTPS with this certificate chain and key (PEM files), checked when
    /// the config is parsed and loaded again at start. `cert_key` /
    /// `key_key` are the config keys they came from, for error messages.
    On { cert_file: std::path::PathBuf, key_file: std::path::PathBuf, cert_key: &'static str, key_key: &'static str },
}

impl AdminTls {
    /// The rustls server config, or an error naming the key and the file.
    pub fn server_config(&self) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>, ConfigError> {
        match self {
            AdminTls::Off => Ok(None),
            AdminTls::On { cert_file, key_file, cert_key, key_key } => {
                crate::tls::server_config(cert_key, cert_file, key_key, key_file).map(Some)
            }
        }
    }
}

/// The reference format's REST keys under `server`, which configure our
/// `admin` section.
#[derive(Debug, Default)]
struct RestRef<'a> {
    http_port: Option<u16>,
    https_port: Option<u16>,
    ssl_cert: Option<&'a str>,
    ssl_key: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    pub enabled: bool,
    pub bind: IpAddr,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub log_level: LogLevel,
    pub log_format: LogFormat,
    /// `common.huge_pages`, `huge_page_size`, `slab_size`, `preallocate_slabs`.
    pub huge_pages: HugePages,
    pub server: ServerConfig,
    pub mounts: Vec<MountConfig>,
    pub exports: Vec<ExportConfig>,
    /// Namespace directory under which admin-API volumes are created.
    pub volumes_path: String,
    pub admin: AdminConfig,
    pub metrics: MetricsConfig,
    /// `server.vfs.diskfs.config`, when present (required by a diskfs mount).
    pub diskfs: Option<DiskfsConfig>,
    /// Accepted-but-ignored keys of the reference format, one message each.
    pub warnings: Vec<String>,
    /// What start-up will do that the file does not say (a generated admin
    /// token); `--check-config` prints them, they are not problems.
    pub notes: Vec<String>,
}

// Reference-format keys we accept but do not implement, per object. Anything
// not listed here and not parsed is an error.
const FOREIGN_TOP: &[&str] = &["shares", "buckets", "users", "s3_access_keys"];
const FOREIGN_COMMON: &[&str] = &[
    "tcp_flavor",
    "metrics_file",
    "sync_delegation",
    "sync_delegation_threads",
    "async_delegation",
    "async_delegation_threads",
    "preallocate_threads",
];
const FOREIGN_SERVER: &[&str] = &[
    "delegation_threads",
    "sync_delegation",
    "sync_delegation_threads",
    "async_delegation",
    "async_delegation_threads",
    "max_open_files",
    "smb_persistent_handles",
    "smb_named_streams",
    "smb_min_dialect",
    "smb_encryption",
    "smb_compression",
    "smb_acl_inherited_canonicalize",
    "smb_auth",
    "smb_multichannel",
    "nfs4_session_slots",
    "nfs4_courtesy_time",
    "external_portmap",
    "portmap_hostname",
    "kv_module",
    "lockmgr_port",
    "s3_port",
    "nfs_server_scope",
    "state_dir",
    "rest_debug_fsops",
    "soft_fail_bad_req",
    "tcp_flavor",
];
const FOREIGN_MOUNT: &[&str] = &["options", "create"];

/// Walks one JSON object, remembering which keys were consumed so that the
/// rest can be classified (foreign -> warning, unknown -> error).
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
    seen: BTreeSet<&'static str>,
}

impl<'a> Obj<'a> {
    fn new(path: &str, v: &'a Value) -> Result<Obj<'a>, ConfigError> {
        match v {
            Value::Object(map) => Ok(Obj { path: path.to_string(), map, seen: BTreeSet::new() }),
            other => err(path, format!("expected an object, got {}", kind(other))),
        }
    }

    fn key_path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    fn get(&mut self, key: &'static str) -> Option<&'a Value> {
        self.seen.insert(key);
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn u64_in(&mut self, key: &'static str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        let p = self.key_path(key);
        match self.get(key) {
            None => Ok(None),
            Some(v) => parse_u64_in(&p, v, min, max).map(Some),
        }
    }

    fn size_in(&mut self, key: &'static str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        let p = self.key_path(key);
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                let n = parse_size(&p, v)?;
                check_range(&p, n, min, max)?;
                Ok(Some(n))
            }
        }
    }

    fn port(&mut self, key: &'static str, allow_zero: bool) -> Result<Option<u16>, ConfigError> {
        Ok(self.u64_in(key, if allow_zero { 0 } else { 1 }, 65535)?.map(|p| p as u16))
    }

    fn bool(&mut self, key: &'static str) -> Result<Option<bool>, ConfigError> {
        let p = self.key_path(key);
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => err(&p, format!("expected true or false, got {}", kind(other))),
        }
    }

    fn str(&mut self, key: &'static str) -> Result<Option<&'a str>, ConfigError> {
        let p = self.key_path(key);
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => err(&p, format!("expected a string, got {}", kind(other))),
        }
    }

    fn ip(&mut self, key: &'static str) -> Result<Option<IpAddr>, ConfigError> {
        let p = self.key_path(key);
        match self.str(key)? {
            None => Ok(None),
            Some(s) => match s.parse::<IpAddr>() {
                Ok(ip) => Ok(Some(ip)),
                Err(_) => err(&p, format!("expected an IP address (e.g. 0.0.0.0 or ::), got {s:?}")),
            },
        }
    }

    /// Classify every key not consumed: a foreign one becomes a warning, any
    /// other is an error. Keys are visited in sorted order so the error for a
    /// file with several bad keys is deterministic.
    fn finish(self, foreign: &[&str], warnings: &mut Vec<String>) -> Result<(), ConfigError> {
        let mut keys: Vec<&String> = self.map.keys().collect();
        keys.sort();
        for k in keys {
            if self.seen.contains(k.as_str()) {
                continue;
            }
            let p = join(&self.path, k);
            if foreign.contains(&k.as_str()) {
                check_foreign(&p, k, &self.map[k.as_str()])?;
                warnings.push(format!(
                    "{p}: key of the reference Chimera format that this server does not implement; ignored"
                ));
            } else {
                return err(&p, "unknown key");
            }
        }
        Ok(())
    }
}

/// Reference keys we ignore still get their type checked: a value the
/// reference daemon would refuse ("huge_pages": "yes") is a typo here too,
/// and ignoring it would hide the typo until the key is implemented.
fn check_foreign(path: &str, key: &str, v: &Value) -> Result<(), ConfigError> {
    if v.is_null() {
        return Ok(());
    }
    match key {
        "sync_delegation" | "async_delegation" | "external_portmap" => match v {
            Value::Bool(_) => Ok(()),
            other => err(path, format!("expected true or false, got {}", kind(other))),
        },
        "preallocate_threads" | "nfs4_session_slots" | "delegation_threads"
        | "sync_delegation_threads" | "async_delegation_threads" | "max_open_files" => {
            parse_u64_in(path, v, 0, u32::MAX as u64).map(|_| ())
        }
        // An IP TOS byte.
        "tcp_flavor" | "portmap_hostname" | "nfs_server_scope" | "kv_module" | "metrics_file" => match v {
            Value::String(_) => Ok(()),
            other => err(path, format!("expected a string, got {}", kind(other))),
        },
        _ => Ok(()),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
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

fn check_range(path: &str, n: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if n < min || n > max {
        return err(path, format!("{n} is out of range {min}..={max}"));
    }
    Ok(())
}

fn parse_u64_in(path: &str, v: &Value, min: u64, max: u64) -> Result<u64, ConfigError> {
    let n = match v.as_u64() {
        Some(n) => n,
        None => return err(path, format!("expected a non-negative integer, got {}", display_short(v))),
    };
    check_range(path, n, min, max)?;
    Ok(n)
}

fn display_short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 64 {
        format!("{}...", &s[..s.char_indices().take(61).last().map(|(i, c)| i + c.len_utf8()).unwrap_or(0)])
    } else {
        s
    }
}

/// A size: an integer byte count, or a string with an optional binary suffix
/// ("512M", "2GiB", "1T"), as the reference format writes sizes.
pub fn parse_size(path: &str, v: &Value) -> Result<u64, ConfigError> {
    match v {
        Value::Number(_) => match v.as_u64() {
            Some(n) => Ok(n),
            None => err(path, format!("expected a non-negative integer byte count, got {v}")),
        },
        Value::String(s) => parse_size_str(s)
            .ok_or_else(|| ConfigError {
                path: path.to_string(),
                msg: format!("expected a size like 1048576, \"512M\" or \"2GiB\", got {s:?}"),
            }),
        other => err(path, format!("expected a size (integer or string), got {}", kind(other))),
    }
}

fn parse_size_str(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return None;
    }
    let n: u64 = s[..digits_end].parse().ok()?;
    let suffix = s[digits_end..].trim_start();
    let shift = match suffix {
        "" | "B" | "b" => 0,
        "K" | "k" | "KB" | "kB" | "KiB" | "kiB" => 10,
        "M" | "m" | "MB" | "MiB" => 20,
        "G" | "g" | "GB" | "GiB" => 30,
        "T" | "t" | "TB" | "TiB" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// A mount name becomes a path component of the namespace.
fn check_component(path: &str, name: &str, what: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > 255 {
        return err(path, format!("{what} must be 1..=255 bytes, got {} bytes", name.len()));
    }
    if name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return err(path, format!("{what} {name:?} must not be \".\", \"..\" or contain '/' or NUL"));
    }
    Ok(())
}

/// A namespace path: absolute, normalised (no empty, "." or ".." components).
/// Returns it without a trailing slash ("/" stays "/").
fn check_ns_path(path: &str, p: &str) -> Result<String, ConfigError> {
    if p.len() > NS_PATH_BYTES_MAX {
        return err(path, format!("path is {} bytes, longer than {NS_PATH_BYTES_MAX}", p.len()));
    }
    if !p.starts_with('/') {
        return err(path, format!("path {p:?} must be absolute (start with '/')"));
    }
    let trimmed = p.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok("/".to_string());
    }
    for c in trimmed[1..].split('/') {
        if c.is_empty() || c == "." || c == ".." || c.contains('\0') {
            return err(path, format!("path {p:?} has an empty, \".\" or \"..\" component"));
        }
    }
    Ok(trimmed.to_string())
}

impl Config {
    /// Read and parse a config file. `token_file` paths are read relative to
    /// the current directory.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let fname = file.display().to_string();
        let meta = std::fs::metadata(file)
            .map_err(|e| ConfigError { path: String::new(), msg: format!("cannot read {fname}: {e}") })?;
        if meta.len() > CONFIG_FILE_BYTES_MAX {
            return err("", format!("{fname} is {} bytes, larger than {CONFIG_FILE_BYTES_MAX}", meta.len()));
        }
        let text = std::fs::read_to_string(file)
            .map_err(|e| ConfigError { path: String::new(), msg: format!("cannot read {fname}: {e}") })?;
        let mut cfg = Config::parse(&text)?;
        if cfg.admin.token_generate {
            cfg.notes.retain(|n| !n.starts_with("admin.token:"));
            let f = generated_token_path(file);
            let how = if f.exists() { "reused from" } else { "generated at start and kept in" };
            cfg.notes.push(format!(
                "admin.token: none set (server.rest_http_port / admin API enabled); a random token is {how} {} (mode 0600)",
                f.display()
            ));
            cfg.admin.generated_token_file = Some(f);
        }
        Ok(cfg)
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let root: Value = serde_json::from_str(text).map_err(|e| ConfigError {
            path: String::new(),
            msg: format!("invalid JSON at line {} column {}: {e}", e.line(), e.column()),
        })?;
        let mut warnings = Vec::new();
        let mut top = Obj::new("", &root)?;

        let (log_level, log_format, rdma_tos, huge_pages) = match top.get("common") {
            Some(v) => parse_common(v, &mut warnings)?,
            None => (LogLevel::Info, LogFormat::Json, None, HugePages::Default),
        };
        let mounts = match top.get("mounts") {
            Some(v) => parse_mounts(v, &mut warnings)?,
            None => Vec::new(),
        };
        let mut server_obj = match top.get("server") {
            Some(v) => Some(Obj::new("server", v)?),
            None => None,
        };
        let mut server = parse_server(server_obj.as_mut(), &mut warnings)?;
        server.rdma_tos = rdma_tos;
        let diskfs = match server_obj.as_mut().and_then(|o| o.get("vfs")) {
            Some(v) => parse_vfs(v, &mut warnings)?,
            None => None,
        };
        // Reference-format aliases living under `server` for the services we
        // configure in our own sections.
        let rest = match server_obj.as_mut() {
            Some(o) => RestRef {
                http_port: o.port("rest_http_port", true)?,
                https_port: o.port("rest_https_port", true)?,
                ssl_cert: o.str("rest_ssl_cert")?,
                ssl_key: o.str("rest_ssl_key")?,
            },
            None => RestRef::default(),
        };
        let metrics_port_alias = match server_obj.as_mut() {
            Some(o) => o.port("metrics_port", true)?,
            None => None,
        };
        if let Some(o) = server_obj {
            o.finish(FOREIGN_SERVER, &mut warnings)?;
        }

        if server.role.runs_mds() && mounts.is_empty() {
            return err("mounts", "at least one mount is required for role mds/both");
        }
        if diskfs.is_none() {
            if let Some(m) = mounts.iter().find(|m| m.module == Module::Diskfs) {
                return err(
                    "server.vfs.diskfs.config",
                    format!("required: mounts.{} uses module \"diskfs\" (its devices and caches are configured here)", m.name),
                );
            }
        }
        let exports = match top.get("exports") {
            Some(v) => parse_exports(v, &mounts, &mut warnings)?,
            None => Vec::new(),
        };
        let volumes_path = parse_volumes(top.get("volumes"), &mounts, &exports)?;
        let admin = parse_admin(top.get("admin"), &rest, server.role)?;
        let metrics = parse_metrics(top.get("metrics"), metrics_port_alias)?;
        top.finish(FOREIGN_TOP, &mut warnings)?;

        let mut notes = Vec::new();
        if admin.token_generate {
            // `load` replaces this with one naming the file.
            notes.push("admin.token: none set; a random token is generated at start and kept beside the config".to_string());
        }
        let cfg =
            Config { log_level, log_format, huge_pages, server, mounts, exports, volumes_path, admin, metrics, diskfs, warnings, notes };
        cfg.check_ports()?;
        Ok(cfg)
    }

    /// Make sure the admin API has a token before it starts: when the config
    /// sets none, reuse the one generated by an earlier start (the file beside
    /// the config) or generate one and keep it there, readable by this user
    /// only. Returns the file and whether it was created now, for the log.
    /// Never called by `--check-config`: a check writes nothing.
    pub fn provide_admin_token(&mut self) -> Result<Option<(std::path::PathBuf, bool)>, ConfigError> {
        if !(self.admin.enabled && self.admin.token_generate) {
            return Ok(None);
        }
        let f = match &self.admin.generated_token_file {
            Some(f) => f.clone(),
            None => return err("admin.token", "required when the admin API is enabled (or set admin.token_file)"),
        };
        let (token, created) = generated_token(&f)?;
        self.admin.token = token;
        self.admin.token_generate = false;
        Ok(Some((f, created)))
    }

    /// Two services on one address and port would fail at bind time with a
    /// less helpful message; say which keys collide instead.
    fn check_ports(&self) -> Result<(), ConfigError> {
        let mut used: Vec<(&str, IpAddr, u16)> = vec![("server.nfs_port", self.server.bind, self.server.nfs_port)];
        if self.server.mount_port != 0 {
            used.push(("server.mount_port", self.server.bind, self.server.mount_port));
        }
        if self.server.portmap_port != 0 {
            used.push(("server.portmap_port", self.server.bind, self.server.portmap_port));
        }
        // server.rdma_port is not listed: RDMA CM has its own port space.
        if self.admin.enabled {
            used.push(("admin.port", self.admin.bind, self.admin.port));
        }
        if self.metrics.enabled {
            used.push(("metrics.port", self.metrics.bind, self.metrics.port));
        }
        // Portmap registrations name fixed ports: a kernel-chosen one cannot be
        // registered before it is bound.
        if self.server.portmap_port != 0 && self.server.nfs_port == 0 {
            return err("server.portmap_port", "needs a fixed server.nfs_port (not 0) to register; set portmap_port to 0");
        }
        for (i, a) in used.iter().enumerate() {
            for b in &used[..i] {
                let overlap = a.1 == b.1 || a.1.is_unspecified() || b.1.is_unspecified();
                // Port 0 asks the kernel for a free port: never a collision.
                if a.2 != 0 && a.2 == b.2 && overlap {
                    return err(a.0, format!("port {} is also used by {}", a.2, b.0));
                }
            }
        }
        Ok(())
    }
}

/// Where DMA memory (diskfs buffer pools, NVMe queues) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePages {
    /// `huge_pages` not given: each pool tries 2 MiB hugepages of its own,
    /// ordinary pages when there are none.
    Default,
    /// `huge_pages: false`: ordinary pages.
    Off,
    /// `huge_pages: true`: every pool carved from slabs of `slab_bytes` of
    /// `page_bytes` hugepages, `preallocate_slabs` of them mapped at start.
    On { page_bytes: u64, slab_bytes: u64, preallocate_slabs: u32 },
}

/// Hugepage sizes of x86-64 (`common.huge_page_size`).
pub const HUGE_PAGE_SIZES: [u64; 2] = [2 << 20, 1 << 30];
/// `common.slab_size` when not given: one 1 GiB page, or 32 pages of 2 MiB.
pub const SLAB_BYTES_DEFAULT_2M: u64 = 64 << 20;
/// Most bytes of slabs preallocated (`slab_size` x `preallocate_slabs`).
pub const SLABS_PREALLOCATED_BYTES_MAX: u64 = 64 << 30;

fn parse_huge_pages(o: &mut Obj<'_>) -> Result<HugePages, ConfigError> {
    let on = o.bool("huge_pages")?;
    let page = o.size_in("huge_page_size", 1, u64::MAX)?;
    let slab = o.size_in("slab_size", 1, u64::MAX)?;
    let pre = o.u64_in("preallocate_slabs", 0, block::huge::SLABS_MAX as u64)?;
    let page_bytes = page.unwrap_or(2 << 20);
    if !HUGE_PAGE_SIZES.contains(&page_bytes) {
        return err("common.huge_page_size", format!("expected \"2M\" or \"1G\" (the hugepage sizes of x86-64), got {page_bytes} bytes"));
    }
    let slab_bytes = slab.unwrap_or(if page_bytes == 1 << 30 { 1 << 30 } else { SLAB_BYTES_DEFAULT_2M });
    if slab_bytes % page_bytes != 0 {
        return err("common.slab_size", format!("{slab_bytes} bytes is not a multiple of common.huge_page_size ({page_bytes} bytes)"));
    }
    let preallocate_slabs = pre.unwrap_or(1) as u32;
    if slab_bytes.saturating_mul(u64::from(preallocate_slabs)) > SLABS_PREALLOCATED_BYTES_MAX {
        return err(
            "common.preallocate_slabs",
            format!("{preallocate_slabs} slabs of {slab_bytes} bytes is more than {SLABS_PREALLOCATED_BYTES_MAX} bytes"),
        );
    }
    Ok(match on {
        None => HugePages::Default,
        Some(false) => HugePages::Off,
        Some(true) => HugePages::On { page_bytes, slab_bytes, preallocate_slabs },
    })
}

fn parse_common(v: &Value, warnings: &mut Vec<String>) -> Result<(LogLevel, LogFormat, Option<u8>, HugePages), ConfigError> {
    let mut o = Obj::new("common", v)?;
    let level = match o.str("log_level")? {
        None => LogLevel::Info,
        Some(s) => LogLevel::parse(s).ok_or_else(|| ConfigError {
            path: "common.log_level".into(),
            msg: format!("expected one of error, warn, info, debug, trace; got {s:?}"),
        })?,
    };
    let format = match o.str("log_format")? {
        None | Some("json") => LogFormat::Json,
        Some("kv") | Some("text") => LogFormat::KeyValue,
        Some(s) => return err("common.log_format", format!("expected \"json\" or \"kv\", got {s:?}")),
    };
    // The reference's RoCE traffic class (an IP TOS byte), for RDMA connections.
    let tos = o.u64_in("rdmacm_tos", 0, 255)?.map(|t| t as u8);
    let huge = parse_huge_pages(&mut o)?;
    o.finish(FOREIGN_COMMON, warnings)?;
    Ok((level, format, tos, huge))
}

/// Credits per RDMA connection: the Linux client asks for 128; 32 calls in
/// flight keep one connection's pipe full at 1 MiB I/O.
pub const RDMA_CREDITS_DEFAULT: u32 = 32;
pub const RDMA_CREDITS_MAX: u32 = 1024;
/// RDMA connections open at once (`server.rdma_conns_max`); each holds
/// (3 x credits + 8) registered buffers of the inline threshold.
pub const RDMA_CONNS_DEFAULT: u32 = 64;
pub const RDMA_CONNS_MAX: u32 = 4096;
/// Record-sized registered buffers per RDMA device
/// (`server.rdma_large_buffers`): calls with chunks in flight at once.
pub const RDMA_LARGE_BUFFERS_DEFAULT: u32 = 16;
pub const RDMA_LARGE_BUFFERS_MAX: u32 = 1024;

fn default_cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(CORES_MAX as usize)
}

fn parse_server(o: Option<&mut Obj<'_>>, warnings: &mut Vec<String>) -> Result<ServerConfig, ConfigError> {
    let mut s = ServerConfig {
        role: Role::Both,
        bind: IpAddr::from([0, 0, 0, 0]),
        cores: default_cores(),
        nfs_port: 2049,
        mount_port: 20048,
        portmap_port: 111,
        rdma: false,
        rdma_port: 20049,
        rdma_addr: None,
        rdma_tos: None,
        rdma_credits: RDMA_CREDITS_DEFAULT,
        rdma_conns_max: RDMA_CONNS_DEFAULT,
        rdma_large_buffers: RDMA_LARGE_BUFFERS_DEFAULT,
        record_bytes_max: RECORD_BYTES_DEFAULT as u32,
        inflight_per_conn_max: INFLIGHT_PER_CONN_DEFAULT as u32,
        conns_max: CONNS_DEFAULT as u32,
        recv_buffers_per_core: BUFFERS_PER_CORE_DEFAULT as u32,
        reply_buffers_per_core: BUFFERS_PER_CORE_DEFAULT as u32,
        parked_per_conn_max: PARKED_PER_CONN_DEFAULT as u32,
        parked_per_core_max: PARKED_PER_CORE_DEFAULT as u32,
        lease_time_s: LEASE_TIME_S_DEFAULT as u32,
        grace_time_s: LEASE_TIME_S_DEFAULT as u32,
        delegations_max: DELEGATIONS_DEFAULT as u32,
        device_poll_us: 0,
        pin_cores: false,
        pnfs: PnfsConfig::defaults(),
    };
    let o = match o {
        Some(o) => o,
        None => return Ok(s),
    };

    let data_server = o.bool("data_server")?;
    s.role = match (o.str("role")?, data_server) {
        (None, Some(true)) => Role::Ds,
        (None, _) => Role::Both,
        (Some(r), ds) => {
            let role = match r {
                "mds" => Role::Mds,
                "ds" => Role::Ds,
                "both" => Role::Both,
                _ => return err("server.role", format!("expected \"mds\", \"ds\" or \"both\", got {r:?}")),
            };
            if ds == Some(true) && role != Role::Ds {
                return err("server.data_server", format!("true contradicts server.role {r:?}"));
            }
            role
        }
    };
    if let Some(ip) = o.ip("bind")? {
        s.bind = ip;
    }
    // `threads` is the reference name for the number of core threads. The
    // reference sizes it for its own machine (80), so it is capped at the
    // CPUs this process may use: every loop polls while busy, and loops
    // beyond the CPUs only take turns on them. `cores` (ours) is taken as
    // written, for whoever means it.
    let threads = o.u64_in("threads", 1, THREADS_REF_MAX)?;
    let cores = o.u64_in("cores", 1, CORES_MAX)?;
    match (threads, cores) {
        (Some(t), Some(c)) if t != c => {
            return err("server.cores", format!("{c} contradicts server.threads {t}; set one of them"))
        }
        (_, Some(n)) => s.cores = n as usize,
        (Some(t), None) => {
            let cpus = default_cores();
            s.cores = (t as usize).min(cpus);
            if s.cores < t as usize {
                warnings.push(format!(
                    "server.threads: {t} requested, {cpus} CPUs usable here (at most {CORES_MAX}); running {} event loops \
                     (set server.cores to choose exactly)",
                    s.cores
                ));
            }
        }
        (None, None) => {}
    }
    if let Some(p) = o.port("nfs_port", true)? {
        s.nfs_port = p;
    }
    if let Some(p) = o.port("mount_port", true)? {
        s.mount_port = p;
    }
    if let Some(p) = o.port("portmap_port", true)? {
        s.portmap_port = p;
    }
    if let Some(b) = o.bool("rdma")? {
        s.rdma = b;
    }
    if let Some(p) = o.port("rdma_port", true)? {
        s.rdma_port = p;
    }
    if let Some(h) = o.str("rdma_hostname")? {
        s.rdma_addr = Some(h.parse().map_err(|_| ConfigError {
            path: "server.rdma_hostname".into(),
            msg: format!("expected an IP address (the RDMA interface's), got {h:?}"),
        })?);
    }
    if let Some(n) = o.u64_in("rdma_credits", 1, RDMA_CREDITS_MAX as u64)? {
        s.rdma_credits = n as u32;
    }
    if let Some(n) = o.u64_in("rdma_conns_max", 1, RDMA_CONNS_MAX as u64)? {
        s.rdma_conns_max = n as u32;
    }
    if let Some(n) = o.u64_in("rdma_large_buffers", 1, RDMA_LARGE_BUFFERS_MAX as u64)? {
        s.rdma_large_buffers = n as u32;
    }
    if let Some(n) = o.size_in("record_bytes_max", RECORD_BYTES_MIN, RECORD_BYTES_MAX)? {
        s.record_bytes_max = n as u32;
    }
    if let Some(n) = o.u64_in("inflight_per_conn_max", 1, INFLIGHT_PER_CONN_MAX)? {
        s.inflight_per_conn_max = n as u32;
    }
    if let Some(n) = o.u64_in("conns_max", 1, CONNS_MAX)? {
        s.conns_max = n as u32;
    }
    if let Some(n) = o.u64_in("recv_buffers_per_core", 1, BUFFERS_PER_CORE_MAX)? {
        s.recv_buffers_per_core = n as u32;
    }
    if let Some(n) = o.u64_in("reply_buffers_per_core", 1, BUFFERS_PER_CORE_MAX)? {
        s.reply_buffers_per_core = n as u32;
    }
    if let Some(n) = o.u64_in("parked_per_core_max", 1, PARKED_PER_CORE_MAX)? {
        s.parked_per_core_max = n as u32;
    }
    if let Some(n) = o.u64_in("parked_per_conn_max", 1, INFLIGHT_PER_CONN_MAX)? {
        s.parked_per_conn_max = n as u32;
    }
    if s.parked_per_conn_max > s.parked_per_core_max {
        return err(
            "server.parked_per_conn_max",
            format!("{} is more than server.parked_per_core_max ({})", s.parked_per_conn_max, s.parked_per_core_max),
        );
    }
    let lease = o.u64_in("lease_time_s", LEASE_TIME_S_MIN, LEASE_TIME_S_MAX)?;
    let lease_ref = o.u64_in("nfs4_lease_time", LEASE_TIME_S_MIN, LEASE_TIME_S_MAX)?;
    if let Some(n) = pick_alias("server.lease_time_s", lease, "server.nfs4_lease_time", lease_ref)? {
        s.lease_time_s = n as u32;
    }
    let grace = o.u64_in("grace_time_s", 0, GRACE_TIME_S_MAX)?;
    let grace_ref = o.u64_in("nfs4_grace_time", 0, GRACE_TIME_S_MAX)?;
    s.grace_time_s = match pick_alias("server.grace_time_s", grace, "server.nfs4_grace_time", grace_ref)? {
        Some(n) => n as u32,
        // RFC 8881 §8.4.2: the grace period lasts at least one lease period.
        None => s.lease_time_s,
    };
    if let Some(n) = o.u64_in("device_poll_us", 0, DEVICE_POLL_US_MAX)? {
        s.device_poll_us = n as u32;
    }
    if let Some(b) = o.bool("pin_cores")? {
        s.pin_cores = b;
    }
    if let Some(n) = o.u64_in("nfs4_delegations_max", 1, DELEGATIONS_MAX)? {
        s.delegations_max = n as u32;
    }
    if o.bool("nfs4_delegations")? == Some(false) {
        s.delegations_max = 0;
    }
    if let Some(v) = o.get("pnfs") {
        s.pnfs = parse_pnfs(v)?;
    }
    Ok(s)
}

fn pick_alias(ours: &str, a: Option<u64>, theirs: &str, b: Option<u64>) -> Result<Option<u64>, ConfigError> {
    match (a, b) {
        (Some(x), Some(y)) if x != y => err(ours, format!("{x} contradicts {theirs} {y}; set one of them")),
        (Some(x), _) | (None, Some(x)) => Ok(Some(x)),
        (None, None) => Ok(None),
    }
}

fn parse_pnfs(v: &Value) -> Result<PnfsConfig, ConfigError> {
    let mut o = Obj::new("server.pnfs", v)?;
    let d = PnfsConfig::defaults();
    let mut p = PnfsConfig {
        enabled: o.bool("enabled")?.unwrap_or(false),
        stripe_unit_bytes: o
            .size_in("stripe_unit_bytes", STRIPE_UNIT_BYTES_MIN, STRIPE_UNIT_BYTES_MAX)?
            .unwrap_or(STRIPE_UNIT_BYTES_DEFAULT),
        stripe_width: o.u64_in("stripe_width", 0, DATA_SERVERS_MAX as u64)?.unwrap_or(0) as u32,
        mirrors: o.u64_in("mirrors", 1, MIRRORS_MAX)?.unwrap_or(1) as u32,
        synthetic_uid: o.u64_in("synthetic_uid", 1, i32::MAX as u64)?.map_or(d.synthetic_uid, |v| v as u32),
        synthetic_gid: o.u64_in("synthetic_gid", 1, i32::MAX as u64)?.map_or(d.synthetic_gid, |v| v as u32),
        layouts_per_client_max: o.u64_in("layouts_per_client_max", 1, 1 << 20)?.map_or(d.layouts_per_client_max, |v| v as u32),
        layouts_max: o.u64_in("layouts_max", 1, 1 << 24)?.map_or(d.layouts_max, |v| v as u32),
        ds_timeout_ms: o.u64_in("ds_timeout_ms", 100, 60_000)?.map_or(d.ds_timeout_ms, |v| v as u32),
        remove_queue_max: o.u64_in("remove_queue_max", 1, 1 << 20)?.map_or(d.remove_queue_max, |v| v as u32),
        recall_timeout_ms: o.u64_in("recall_timeout_ms", 1000, 600_000)?.map_or(d.recall_timeout_ms, |v| v as u32),
        orphan_sweep_interval_ms: match o.u64_in("orphan_sweep_interval_ms", 0, ORPHAN_SWEEP_INTERVAL_MS_MAX)? {
            Some(v) if v != 0 && v < 1000 => {
                return err("server.pnfs.orphan_sweep_interval_ms", format!("{v} ms: 0 turns the sweep off, otherwise at least 1000"))
            }
            v => v.unwrap_or(d.orphan_sweep_interval_ms),
        },
        data_servers: Vec::new(),
    };
    if !p.stripe_unit_bytes.is_power_of_two() {
        return err("server.pnfs.stripe_unit_bytes", format!("{} is not a power of two", p.stripe_unit_bytes));
    }
    if let Some(list) = o.get("data_servers") {
        let items = match list {
            Value::Array(items) => items,
            other => return err("server.pnfs.data_servers", format!("expected an array, got {}", kind(other))),
        };
        if items.len() > DATA_SERVERS_MAX {
            return err("server.pnfs.data_servers", format!("{} entries, more than {DATA_SERVERS_MAX}", items.len()));
        }
        for (i, item) in items.iter().enumerate() {
            p.data_servers.push(parse_data_server(&format!("server.pnfs.data_servers[{i}]"), item)?);
        }
    }
    if p.mirrors as usize > p.data_servers.len().max(1) && !p.data_servers.is_empty() {
        return err(
            "server.pnfs.mirrors",
            format!("{} mirrors need at least as many data servers, {} configured", p.mirrors, p.data_servers.len()),
        );
    }
    o.finish(&[], &mut Vec::new())?;
    Ok(p)
}

fn parse_data_server(path: &str, v: &Value) -> Result<DataServer, ConfigError> {
    let mut o = Obj::new(path, v)?;
    let name = match o.str("name")? {
        None => None,
        Some(n) if n.is_empty() || n.len() > 253 || n.bytes().any(|c| c.is_ascii_control()) => {
            return err(&join(path, "name"), "must be 1..=253 printable bytes")
        }
        Some(n) => Some(n.to_string()),
    };
    let netid = match o.str("netid")? {
        None => Netid::Tcp,
        Some(s) => Netid::parse(s).ok_or_else(|| ConfigError {
            path: join(path, "netid"),
            msg: format!("expected tcp, tcp6, rdma or rdma6, got {s:?}"),
        })?,
    };
    // Ours: one `uaddr` of the netid. The reference's: a `tcp` and an `rdma`
    // address; the netid picks the one clients are sent to first.
    let uaddr = o.str("uaddr")?;
    let tcp = o.str("tcp")?;
    let rdma = o.str("rdma")?;
    let rdma_first = matches!(netid, Netid::Rdma | Netid::Rdma6);
    let (host, port) = match (uaddr, tcp, rdma) {
        (Some(u), None, None) => split_host_port(&join(path, "uaddr"), u, netid.default_port())?,
        (Some(_), _, _) => {
            let other = if tcp.is_some() { "tcp" } else { "rdma" };
            return err(&join(path, other), "set either uaddr or the reference's tcp/rdma addresses, not both");
        }
        (None, None, None) => {
            return err(&join(path, "tcp"), "required: an address (\"host\" or \"host:port\") in tcp (reference form) or uaddr")
        }
        (None, Some(t), r) if !rdma_first => {
            let tcp_netid = if netid == Netid::Tcp6 { Netid::Tcp6 } else { Netid::Tcp };
            let a = split_host_port(&join(path, "tcp"), t, tcp_netid.default_port())?;
            if let Some(r) = r {
                split_host_port(&join(path, "rdma"), r, Netid::Rdma.default_port())?;
            }
            a
        }
        (None, None, Some(_)) if !rdma_first => {
            return err(&join(path, "tcp"), format!("required with netid {}: the rdma address is used only with netid rdma", netid.as_str()))
        }
        (None, t, Some(r)) => {
            let (host, port) = split_host_port(&join(path, "rdma"), r, Netid::Rdma.default_port())?;
            // Clients fall back to TCP, and the MDS's control calls use it, on
            // the RDMA host at the TCP default port: that is all an RDMA data
            // server can be told today, so a tcp address saying otherwise is
            // refused rather than silently not used.
            if let Some(t) = t {
                let tp = join(path, "tcp");
                let (th, tport) = split_host_port(&tp, t, Netid::Tcp.default_port())?;
                if th != host || tport != Netid::Tcp.default_port() {
                    return err(
                        &tp,
                        format!(
                            "with netid {} the TCP address must be the rdma host on port {} ({host}:{}), got {t:?}",
                            netid.as_str(),
                            Netid::Tcp.default_port(),
                            Netid::Tcp.default_port()
                        ),
                    );
                }
            }
            (host, port)
        }
        (None, Some(_), None) => return err(&join(path, "rdma"), format!("required with netid {}", netid.as_str())),
    };
    let backing_path = match o.str("backing_path")? {
        None => None,
        Some(b) => Some(check_ns_path(&join(path, "backing_path"), b)?),
    };
    let version = match o.get("version") {
        None => (3, 0),
        Some(v) => parse_nfs_version(&join(path, "version"), v)?,
    };
    o.finish(&[], &mut Vec::new())?;
    Ok(DataServer { name, netid, host, port, backing_path, version })
}

/// "host", "host:port", "[v6]:port" or a bare IPv6 literal.
pub fn split_host_port(path: &str, s: &str, default_port: u16) -> Result<(String, u16), ConfigError> {
    let bad = |why: &str| ConfigError { path: path.to_string(), msg: format!("{why} in address {s:?}") };
    if s.is_empty() || s.len() > 253 + 8 {
        return Err(bad("bad length"));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']').ok_or_else(|| bad("missing ']'"))?;
        let host = &rest[..end];
        host.parse::<std::net::Ipv6Addr>().map_err(|_| bad("invalid IPv6 literal"))?;
        match &rest[end + 1..] {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ']'"))?)),
        }
    } else if s.parse::<std::net::Ipv6Addr>().is_ok() {
        (s, None)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 => n,
            _ => return Err(bad("port must be 1..=65535")),
        },
    };
    let is_dns_name = host.split('.').all(|l| {
        !l.is_empty() && l.len() <= 63 && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
    });
    let host_ok = !host.is_empty() && (host.parse::<IpAddr>().is_ok() || is_dns_name);
    if !host_ok {
        return Err(bad("invalid host"));
    }
    Ok((host.to_string(), port))
}

fn parse_nfs_version(path: &str, v: &Value) -> Result<(u32, u32), ConfigError> {
    let ver = match v {
        Value::Number(n) => match n.as_u64() {
            Some(3) => (3, 0),
            Some(4) => (4, 1),
            _ => return err(path, format!("expected 3, 4, \"3\", \"4.1\" or \"4.2\", got {v}")),
        },
        Value::String(s) => match s.as_str() {
            "3" => (3, 0),
            "4" | "4.1" => (4, 1),
            "4.2" => (4, 2),
            _ => return err(path, format!("expected 3, 4, \"3\", \"4.1\" or \"4.2\", got {s:?}")),
        },
        other => return err(path, format!("expected a number or string, got {}", kind(other))),
    };
    Ok(ver)
}

/// `server.vfs`: per-module settings keyed by module name. The reference
/// loads modules from plugin paths (`path`, ignored with a warning: ours are
/// built in); diskfs's `config` is parsed, any other module's settings are
/// the reference's and ignored with a warning.
fn parse_vfs(v: &Value, warnings: &mut Vec<String>) -> Result<Option<DiskfsConfig>, ConfigError> {
    let mut o = Obj::new("server.vfs", v)?;
    let diskfs = match o.get("diskfs") {
        None => None,
        Some(d) => {
            let mut d = Obj::new("server.vfs.diskfs", d)?;
            let cfg = match d.get("config") {
                Some(c) => parse_diskfs(c)?,
                None => return err("server.vfs.diskfs.config", "required (initialize, block_cache_blocks, inode_cache_inodes, devices)"),
            };
            d.finish(&["path"], warnings)?;
            Some(cfg)
        }
    };
    let others: Vec<String> = o.map.keys().filter(|k| k.as_str() != "diskfs").cloned().collect();
    for k in others {
        match o.map.get(&k) {
            Some(Value::Object(_)) | Some(Value::Null) => warnings.push(format!(
                "server.vfs.{k}: settings of a reference plugin module this server does not load (built-in modules: memfs, diskfs); ignored"
            )),
            Some(other) => return err(&format!("server.vfs.{k}"), format!("expected an object, got {}", kind(other))),
            None => {}
        }
    }
    Ok(diskfs)
}

fn parse_diskfs(v: &Value) -> Result<DiskfsConfig, ConfigError> {
    const P: &str = "server.vfs.diskfs.config";
    let mut o = Obj::new(P, v)?;
    let initialize = o.bool("initialize")?.unwrap_or(false);
    let block_cache_blocks = o
        .u64_in("block_cache_blocks", BLOCK_CACHE_BLOCKS_MIN, BLOCK_CACHE_BLOCKS_MAX)?
        .unwrap_or(BLOCK_CACHE_BLOCKS_DEFAULT);
    let inode_cache_inodes = o
        .u64_in("inode_cache_inodes", INODE_CACHE_INODES_MIN, INODE_CACHE_INODES_MAX)?
        .unwrap_or(INODE_CACHE_INODES_DEFAULT);
    let dp = format!("{P}.devices");
    let items = match o.get("devices") {
        Some(Value::Array(items)) => items,
        Some(other) => return err(&dp, format!("expected an array of {{\"type\", \"path\"}}, got {}", kind(other))),
        None => return err(&dp, "required: at least one device ({\"type\": \"io_uring\" or \"vfio\", \"path\": ...})"),
    };
    if items.is_empty() || items.len() > DISKFS_DEVICES_MAX {
        return err(&dp, format!("{} devices; 1..={DISKFS_DEVICES_MAX} are accepted", items.len()));
    }
    let mut devices: Vec<DiskfsDevice> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let ip = format!("{dp}[{i}]");
        let mut d = Obj::new(&ip, item)?;
        let tp = join(&ip, "type");
        let pp = join(&ip, "path");
        let kind_s = d.str("type")?;
        let path = match d.str("path")? {
            Some(p) => p,
            None => return err(&pp, "required"),
        };
        let dev = match kind_s {
            Some("io_uring") => {
                // Absolute: a relative one would depend on the directory the
                // server happens to start in.
                if !path.starts_with('/') || path.len() > DEVICE_PATH_BYTES_MAX || path.contains('\0') {
                    return err(&pp, format!("expected an absolute file or block-device path (at most {DEVICE_PATH_BYTES_MAX} bytes), got {path:?}"));
                }
                if path.ends_with('/') {
                    return err(&pp, format!("{path:?} names a directory; expected a file or block device"));
                }
                DiskfsDevice::IoUring { path: std::path::PathBuf::from(path) }
            }
            Some("vfio") => match PciAddress::parse(path) {
                Some(pci) => DiskfsDevice::Vfio { pci },
                None => {
                    return err(&pp, format!("expected a PCI address \"0000:01:00.0\" or \"01:00.0\" (device 00-1f, function 0-7), got {path:?}"))
                }
            },
            Some(other) => return err(&tp, format!("expected \"io_uring\" or \"vfio\", got {other:?}")),
            None => return err(&tp, "required: \"io_uring\" or \"vfio\""),
        };
        d.finish(&[], &mut Vec::new())?;
        // One device listed twice would be formatted and written as two.
        if let Some(j) = devices.iter().position(|x| x == &dev) {
            return err(&pp, format!("same device as {dp}[{j}]"));
        }
        devices.push(dev);
    }
    o.finish(&[], &mut Vec::new())?;
    Ok(DiskfsConfig { initialize, block_cache_blocks, inode_cache_inodes, devices })
}

/// `mounts` is an object keyed by mount name in the reference format; an array
/// of `{name, module, path}` is accepted too.
fn parse_mounts(v: &Value, warnings: &mut Vec<String>) -> Result<Vec<MountConfig>, ConfigError> {
    let entries: Vec<(String, String, &Value)> = named_entries("mounts", v)?;
    if entries.len() > MOUNTS_MAX {
        return err("mounts", format!("{} mounts, more than {MOUNTS_MAX}", entries.len()));
    }
    let mut out: Vec<MountConfig> = Vec::new();
    for (path, name, body) in entries {
        check_component(&path, &name, "mount name")?;
        if out.iter().any(|m| m.name == name) {
            return err(&path, format!("duplicate mount name {name:?}"));
        }
        let mut o = Obj::new(&path, body)?;
        o.seen.insert("name");
        const KNOWN: &str = "memfs, diskfs, nfs";
        let module = match o.str("module")? {
            Some("memfs") => Module::Memfs,
            Some("diskfs") => Module::Diskfs,
            Some("nfs") => Module::Nfs,
            Some(other) => {
                return err(&join(&path, "module"), format!("module {other:?} is not available in this build (known: {KNOWN})"))
            }
            None => return err(&join(&path, "module"), format!("required (known: {KNOWN})")),
        };
        let pp = join(&path, "path");
        let backend_path = match (module, o.str("path")?) {
            (Module::Memfs, None | Some("/")) => "/".to_string(),
            (Module::Memfs, Some(p)) => return err(&pp, format!("memfs has no backing path; use \"/\", got {p:?}")),
            (Module::Diskfs, None) => "/".to_string(),
            (Module::Diskfs, Some(p)) => check_ns_path(&pp, p)?,
            (Module::Nfs, None) => return err(&pp, "required: the remote export, \"host:/path\""),
            (Module::Nfs, Some(p)) => check_remote_export(&pp, p)?,
        };
        let capacity = o.size_in("capacity_bytes", MEMFS_CAPACITY_BYTES_MIN, MEMFS_CAPACITY_BYTES_MAX)?;
        let capacity_bytes = match (module, capacity) {
            (Module::Memfs, c) => c.unwrap_or(MEMFS_CAPACITY_BYTES_DEFAULT),
            (_, None) => 0,
            (m, Some(_)) => {
                return err(
                    &join(&path, "capacity_bytes"),
                    format!("only memfs has a capacity bound; a {} mount's capacity is its storage's", m.as_str()),
                )
            }
        };
        let port = o.port("port", false)?;
        let connections = o.u64_in("connections", 1, NFS_MOUNT_CONNECTIONS_MAX as u64)?;
        let timeout_ms = o.u64_in("timeout_ms", 100, 600_000)?;
        let mount_port = o.port("mount_port", false)?;
        let portmap_port = o.port("portmap_port", false)?;
        let handle_map = match o.str("handle_map")? {
            None => None,
            Some(f) if f.starts_with('/') && !f.ends_with('/') && !f.contains('\0') => Some(f.to_string()),
            Some(f) => return err(&join(&path, "handle_map"), format!("expected an absolute file path (e.g. /var/lib/chimera/ds1.handles), got {f:?}")),
        };
        if let (Some(_), Some(_)) = (mount_port, portmap_port) {
            return err(&join(&path, "portmap_port"), "the portmapper is not asked when mount_port is given; set one of them");
        }
        let nfs = match module {
            Module::Nfs => Some(NfsMount {
                port: port.unwrap_or(Netid::Tcp.default_port()),
                mount_port,
                portmap_port: portmap_port.unwrap_or(111),
                connections: connections.map_or(NFS_MOUNT_CONNECTIONS_DEFAULT, |c| c as u32),
                timeout_ms: timeout_ms.unwrap_or(NFS_MOUNT_TIMEOUT_MS_DEFAULT),
                handle_map,
            }),
            m => {
                for (key, given) in [
                    ("port", port.is_some()),
                    ("connections", connections.is_some()),
                    ("timeout_ms", timeout_ms.is_some()),
                    ("mount_port", mount_port.is_some()),
                    ("portmap_port", portmap_port.is_some()),
                    ("handle_map", handle_map.is_some()),
                ] {
                    if given {
                        return err(&join(&path, key), format!("only an nfs mount has {key}; this is a {} mount", m.as_str()));
                    }
                }
                None
            }
        };
        o.finish(FOREIGN_MOUNT, warnings)?;
        out.push(MountConfig { name, module, path: backend_path, capacity_bytes, nfs });
    }
    Ok(out)
}

/// An `nfs` mount's remote export: "host:/path" or "[v6]:/path".
fn check_remote_export(path: &str, s: &str) -> Result<String, ConfigError> {
    let split = if s.starts_with('[') { s.find("]:").map(|i| (&s[..=i], &s[i + 2..])) } else { s.split_once(':') };
    let (host, export) = match split {
        Some((h, e)) if e.starts_with('/') => (h, e),
        _ => return err(path, format!("expected a remote export \"host:/path\", got {s:?}")),
    };
    // A port is not part of an export's name; "host:2049:/x" is a typo.
    if !host.starts_with('[') && host.contains(':') {
        return err(path, format!("expected a remote export \"host:/path\", got {s:?}"));
    }
    split_host_port(path, host, Netid::Tcp.default_port())?;
    check_ns_path(path, export)?;
    Ok(s.to_string())
}

/// Entries of an object keyed by name, or of an array of objects with a
/// `name` key: (key path for messages, name, body).
fn named_entries<'a>(what: &str, v: &'a Value) -> Result<Vec<(String, String, &'a Value)>, ConfigError> {
    match v {
        Value::Object(map) => Ok(map.iter().map(|(k, b)| (format!("{what}.{k}"), k.clone(), b)).collect()),
        Value::Array(items) => {
            let mut out = Vec::new();
            for (i, b) in items.iter().enumerate() {
                let path = format!("{what}[{i}]");
                let name = match b.get("name") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => return err(&join(&path, "name"), format!("expected a string, got {}", kind(other))),
                    None => return err(&join(&path, "name"), "required"),
                };
                out.push((path, name, b));
            }
            Ok(out)
        }
        other => err(what, format!("expected an object keyed by name or an array, got {}", kind(other))),
    }
}

/// The first component of a namespace path must be a configured mount.
fn check_under_mount(path: &str, p: &str, mounts: &[MountConfig]) -> Result<(), ConfigError> {
    let first = p.trim_start_matches('/').split('/').next().unwrap_or("");
    if !mounts.iter().any(|m| m.name == first) {
        let names: Vec<&str> = mounts.iter().map(|m| m.name.as_str()).collect();
        return err(path, format!("{p:?} is not under a configured mount (mounts: {})", names.join(", ")));
    }
    Ok(())
}

fn parse_exports(v: &Value, mounts: &[MountConfig], warnings: &mut Vec<String>) -> Result<Vec<ExportConfig>, ConfigError> {
    let entries = named_entries("exports", v)?;
    if entries.len() > EXPORTS_MAX {
        return err("exports", format!("{} exports, more than {EXPORTS_MAX}", entries.len()));
    }
    let mut out: Vec<ExportConfig> = Vec::new();
    for (path, name, body) in entries {
        let name = check_ns_path(&path, &name)?;
        if out.iter().any(|e| e.name == name) {
            return err(&path, format!("duplicate export {name:?}"));
        }
        let mut o = Obj::new(&path, body)?;
        o.seen.insert("name");
        let target = match o.str("path")? {
            Some(p) => check_ns_path(&join(&path, "path"), p)?,
            None => return err(&join(&path, "path"), "required (a namespace path such as \"/memfs\")"),
        };
        let access = match o.get("access") {
            None => None,
            Some(v) => Some(parse_access(&join(&path, "access"), v)?),
        };
        o.finish(&[], &mut Vec::new())?;
        // The reference resolves exports when a client mounts them, and its
        // own MDS config carries one that names no mount ("/ds1" -> "/ds"):
        // such an export is left out with a warning rather than refusing
        // the whole config. Every other malformation above is still an error.
        if let Err(e) = check_under_mount(&join(&path, "path"), &target, mounts) {
            warnings.push(format!("{e}; export {name:?} is not served"));
            continue;
        }
        // Rules are enforced per handle, and a handle names its mount:
        // two exports of one mount cannot have different rules.
        let mount = mount_of(&target);
        if let Some(other) = out.iter().find(|e| mount_of(&e.path) == mount && e.access != access) {
            return err(
                &join(&path, "access"),
                format!(
                    "export {:?} serves the same mount {mount:?} with different access rules; rules apply to a whole mount (give both the same rules)",
                    other.name
                ),
            );
        }
        out.push(ExportConfig { name, path: target, access });
    }
    Ok(out)
}

/// The mount a namespace path is in (its first component).
pub fn mount_of(p: &str) -> &str {
    p.trim_start_matches('/').split('/').next().unwrap_or("")
}

/// Largest anonymous uid/gid (4294967295 is "no id" to the kernel).
pub const ANON_ID_MAX: u64 = u32::MAX as u64 - 1;

/// An export's (or a volume's) `access` list: client rules in the shape
/// NFS-Ganesha users know, tried in order, the first whose `clients`
/// names the peer deciding. Errors name the key path
/// (`exports./memfs.access[1].clients[0]`).
pub fn parse_access(path: &str, v: &Value) -> Result<Vec<vfs::clients::Rule>, ConfigError> {
    use vfs::clients::{AccessType, Net, Rule, Squash, ANON_ID_DEFAULT, CLIENTS_MAX, RULES_MAX};
    let items = match v {
        Value::Array(items) => items,
        other => return err(path, format!("expected an array of client rules, got {}", kind(other))),
    };
    if items.len() > RULES_MAX {
        return err(path, format!("{} rules, more than {RULES_MAX}", items.len()));
    }
    let mut rules = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let rp = format!("{path}[{i}]");
        let mut o = Obj::new(&rp, item)?;
        let cp = o.key_path("clients");
        let specs: Vec<(String, &str)> = match o.get("clients") {
            None => return err(&cp, "required: a CIDR, a host address, \"*\", or an array of them"),
            Some(Value::String(s)) => vec![(cp.clone(), s.as_str())],
            Some(Value::Array(a)) => {
                if a.is_empty() {
                    return err(&cp, "empty: a rule names at least one client");
                }
                if a.len() > CLIENTS_MAX {
                    return err(&cp, format!("{} clients, more than {CLIENTS_MAX}", a.len()));
                }
                let mut v = Vec::with_capacity(a.len());
                for (j, c) in a.iter().enumerate() {
                    let p = format!("{cp}[{j}]");
                    match c {
                        Value::String(s) => v.push((p, s.as_str())),
                        other => return err(&p, format!("expected a string, got {}", kind(other))),
                    }
                }
                v
            }
            Some(other) => return err(&cp, format!("expected a string or an array of strings, got {}", kind(other))),
        };
        let mut clients = Vec::with_capacity(specs.len());
        for (p, spec) in specs {
            clients.push(Net::parse(spec).or_else(|m| err(&p, m))?);
        }
        let ap = o.key_path("access_type");
        let access = match o.str("access_type")? {
            None => AccessType::ReadWrite,
            Some(s) => match AccessType::parse(s) {
                Some(a) => a,
                None => return err(&ap, format!("expected \"rw\", \"ro\" or \"none\", got {s:?}")),
            },
        };
        let sp = o.key_path("squash");
        let squash = match o.str("squash")? {
            None => Squash::RootSquash,
            Some(s) => match Squash::parse(s) {
                Some(q) => q,
                None => {
                    return err(&sp, format!("expected \"root_squash\", \"all_squash\" or \"no_root_squash\", got {s:?}"))
                }
            },
        };
        let anon_uid = o.u64_in("anonymous_uid", 0, ANON_ID_MAX)?.map_or(ANON_ID_DEFAULT, |n| n as u32);
        let anon_gid = o.u64_in("anonymous_gid", 0, ANON_ID_MAX)?.map_or(ANON_ID_DEFAULT, |n| n as u32);
        o.finish(&[], &mut Vec::new())?;
        rules.push(Rule { clients, access, squash, anon_uid, anon_gid });
    }
    Ok(rules)
}

/// The JSON form of a rule list (what `parse_access` reads back).
pub fn access_json(rules: &[vfs::clients::Rule]) -> Value {
    Value::Array(
        rules
            .iter()
            .map(|r| {
                serde_json::json!({
                    "clients": r.clients.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
                    "access_type": r.access.as_str(),
                    "squash": r.squash.as_str(),
                    "anonymous_uid": r.anon_uid,
                    "anonymous_gid": r.anon_gid,
                })
            })
            .collect(),
    )
}

/// The volumes directory defaults into the mount clients are served from
/// (the first export's), else the first local one: with the reference's
/// mounts (sorted: `ds1` an nfs mount of another server, `ds2`, `mds`) the
/// first mount is the wrong place for the namespace's volumes.
fn parse_volumes(v: Option<&Value>, mounts: &[MountConfig], exports: &[ExportConfig]) -> Result<String, ConfigError> {
    let mount_of = |p: &str| {
        let first = p.trim_start_matches('/').split('/').next().unwrap_or("");
        mounts.iter().find(|m| m.name == first)
    };
    let local = |m: &&MountConfig| m.module != Module::Nfs;
    let home = exports
        .iter()
        .filter_map(|e| mount_of(&e.path))
        .find(local)
        .or_else(|| mounts.iter().find(local))
        .or(mounts.first());
    let default = home.map(|m| format!("/{}/volumes", m.name));
    let path = match v {
        None => default,
        Some(v) => {
            let mut o = Obj::new("volumes", v)?;
            let p = match o.str("path")? {
                Some(p) => Some(check_ns_path("volumes.path", p)?),
                None => default,
            };
            o.finish(&[], &mut Vec::new())?;
            p
        }
    };
    match path {
        // A DS-only process has no mounts and serves no volumes.
        None => Ok(String::new()),
        Some(p) => {
            if p == "/" || !p.trim_start_matches('/').contains('/') {
                return err("volumes.path", format!("{p:?} must be a directory inside a mount, e.g. \"/memfs/volumes\""));
            }
            check_under_mount("volumes.path", &p, mounts)?;
            Ok(p)
        }
    }
}

fn parse_admin(v: Option<&Value>, rest: &RestRef, role: Role) -> Result<AdminConfig, ConfigError> {
    if rest.http_port.is_some() && rest.https_port.is_some() {
        return err(
            "server.rest_https_port",
            "this server has one admin listener: set server.rest_http_port (plain HTTP) or server.rest_https_port (TLS), not both",
        );
    }
    let rest_port = rest.http_port.or(rest.https_port);
    let rest_port_key = if rest.http_port.is_some() { "server.rest_http_port" } else { "server.rest_https_port" };
    let mut a = AdminConfig {
        enabled: role.runs_mds(),
        bind: IpAddr::from([0, 0, 0, 0]),
        port: rest_port.unwrap_or(8080),
        token: String::new(),
        body_bytes_max: ADMIN_BODY_BYTES_DEFAULT as u32,
        conns_max: ADMIN_CONNS_DEFAULT as u32,
        token_generate: false,
        generated_token_file: None,
        tls: AdminTls::Off,
    };
    let mut tls = None;
    let mut token_file = None;
    if let Some(v) = v {
        let mut o = Obj::new("admin", v)?;
        if let Some(b) = o.bool("enabled")? {
            a.enabled = b;
        }
        if let Some(ip) = o.ip("bind")? {
            a.bind = ip;
        }
        let port = o.port("port", true)?;
        if let Some(p) = pick_alias("admin.port", port.map(u64::from), rest_port_key, rest_port.map(u64::from))? {
            a.port = p as u16;
        }
        if let Some(t) = o.str("token")? {
            if t.is_empty() {
                return err("admin.token", "must not be empty (leave it out to have one generated at start)");
            }
            a.token = t.to_string();
        }
        token_file = o.str("token_file")?;
        if let Some(t) = o.get("tls") {
            tls = Some(parse_admin_tls(t)?);
        }
        if let Some(n) = o.size_in("body_bytes_max", ADMIN_BODY_BYTES_MIN, ADMIN_BODY_BYTES_MAX)? {
            a.body_bytes_max = n as u32;
        }
        if let Some(n) = o.u64_in("conns_max", 1, ADMIN_CONNS_MAX)? {
            a.conns_max = n as u32;
        }
        o.finish(&[], &mut Vec::new())?;
    }
    if let Some(f) = token_file {
        if !a.token.is_empty() {
            return err("admin.token_file", "set either admin.token or admin.token_file, not both");
        }
        a.token = read_token_file("admin.token_file", Path::new(f))?;
    }
    a.tls = admin_tls(tls, rest, a.enabled)?;
    if a.enabled {
        // Unusable files are a config error, not a failure at start.
        a.tls.server_config()?;
        if a.token.is_empty() {
            // The reference format has no admin token: rather than refuse
            // its configs, start-up generates one (`provide_admin_token`).
            a.token_generate = true;
        } else {
            check_token("admin.token", &a.token)?;
        }
    }
    Ok(a)
}

/// `admin.tls`: `false` (plain HTTP) or `{"cert_file", "key_file"}`.
fn parse_admin_tls(v: &Value) -> Result<AdminTls, ConfigError> {
    const KEY: &str = "admin.tls";
    match v {
        Value::Bool(false) => Ok(AdminTls::Off),
        Value::Bool(true) => err(KEY, "true says nothing about the certificate: give {\"cert_file\": ..., \"key_file\": ...} (PEM files)"),
        Value::Object(_) => {
            let mut o = Obj::new(KEY, v)?;
            let mut file = |key: &'static str| -> Result<std::path::PathBuf, ConfigError> {
                let p = o.key_path(key);
                match o.str(key)? {
                    None => err(&p, "required (a PEM file)"),
                    Some("") => err(&p, "must not be empty"),
                    Some(f) => Ok(std::path::PathBuf::from(f)),
                }
            };
            let cert_file = file("cert_file")?;
            let key_file = file("key_file")?;
            o.finish(&[], &mut Vec::new())?;
            Ok(AdminTls::On { cert_file, key_file, cert_key: "admin.tls.cert_file", key_key: "admin.tls.key_file" })
        }
        other => err(KEY, format!("expected false (plain HTTP) or an object {{\"cert_file\", \"key_file\"}}, got {}", kind(other))),
    }
}

/// How the admin API is served, from `admin.tls` and the reference
/// format's REST keys. Plain HTTP only when said: `admin.tls: false`, or
/// the reference's `server.rest_http_port` (its plain-HTTP REST port).
fn admin_tls(ours: Option<AdminTls>, rest: &RestRef, enabled: bool) -> Result<AdminTls, ConfigError> {
    let theirs = match (rest.ssl_cert, rest.ssl_key) {
        (None, None) => None,
        (Some(c), Some(k)) if !c.is_empty() && !k.is_empty() => Some(AdminTls::On {
            cert_file: c.into(),
            key_file: k.into(),
            cert_key: "server.rest_ssl_cert",
            key_key: "server.rest_ssl_key",
        }),
        (Some(""), _) => return err("server.rest_ssl_cert", "must not be empty"),
        (_, Some(_)) if rest.ssl_key == Some("") => return err("server.rest_ssl_key", "must not be empty"),
        (Some(_), Some(_)) => unreachable!("both set and non-empty is the first arm"),
        (Some(_), None) => return err("server.rest_ssl_key", "required with server.rest_ssl_cert (the certificate's private key, PEM)"),
        (None, Some(_)) => return err("server.rest_ssl_cert", "required with server.rest_ssl_key (the certificate chain, PEM)"),
    };
    let tls = match (ours, theirs) {
        (Some(_), Some(_)) => return err("server.rest_ssl_cert", "set either admin.tls or server.rest_ssl_cert / rest_ssl_key, not both"),
        (Some(t), None) | (None, Some(t)) => Some(t),
        (None, None) => None,
    };
    match tls {
        Some(AdminTls::On { .. }) if rest.http_port.is_some() => err(
            "server.rest_http_port",
            "is the plain-HTTP port, but the admin API is configured for TLS: give the port as admin.port or server.rest_https_port",
        ),
        Some(AdminTls::Off) if rest.https_port.is_some() => {
            err("server.rest_https_port", "is the TLS port, but admin.tls is false: give the port as admin.port")
        }
        Some(t) => Ok(t),
        None if rest.https_port.is_some() => {
            err("server.rest_https_port", "needs server.rest_ssl_cert and server.rest_ssl_key (or admin.tls)")
        }
        None if rest.http_port.is_some() || !enabled => Ok(AdminTls::Off),
        None => err(
            "admin.tls",
            "required when the admin API is enabled: {\"cert_file\": ..., \"key_file\": ...} (PEM files) for HTTPS, or false for plain HTTP (local runs and tests only: the bearer token crosses the network in clear)",
        ),
    }
}

fn read_token_file(key: &str, f: &Path) -> Result<String, ConfigError> {
    let meta =
        std::fs::metadata(f).map_err(|e| ConfigError { path: key.into(), msg: format!("cannot read {f:?}: {e}") })?;
    if meta.len() > TOKEN_BYTES_MAX as u64 {
        return err(key, format!("{f:?} is {} bytes, longer than {TOKEN_BYTES_MAX}", meta.len()));
    }
    let t = std::fs::read_to_string(f).map_err(|e| ConfigError { path: key.into(), msg: format!("cannot read {f:?}: {e}") })?;
    // Secrets mounted from Kubernetes often end in a newline.
    let t = t.trim_end_matches(['\n', '\r']).to_string();
    if t.is_empty() {
        return err(key, format!("{f:?} is empty"));
    }
    Ok(t)
}

/// `<config file>.admin-token` in the config file's directory.
pub fn generated_token_path(config_file: &Path) -> std::path::PathBuf {
    let name = config_file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "chimerad".into());
    config_file.with_file_name(format!("{name}{GENERATED_TOKEN_SUFFIX}"))
}

/// The token kept in `f`, generating and writing it when `f` does not exist.
/// Returns it and whether it was created now.
fn generated_token(f: &Path) -> Result<(String, bool), ConfigError> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    const KEY: &str = "admin.token";
    // Two tries: a process that loses the race to create the file reads the
    // winner's token on its second pass.
    for _ in 0..2 {
        match std::fs::symlink_metadata(f) {
            Ok(meta) => {
                // It holds a secret: one others can read or replace would
                // hand them the admin API.
                if !meta.file_type().is_file() {
                    return err(KEY, format!("{} (generated token) is not a regular file", f.display()));
                }
                let mode = meta.permissions().mode() & 0o777;
                // SAFETY: geteuid has no preconditions.
                let euid = unsafe { libc::geteuid() };
                if mode & 0o077 != 0 || meta.uid() != euid {
                    return err(
                        KEY,
                        format!(
                            "{} (generated token) has mode {mode:04o} and owner {}; it must be mode 0600 and owned by uid {euid}",
                            f.display(),
                            meta.uid()
                        ),
                    );
                }
                let t = read_token_file(KEY, f)?;
                check_token(KEY, &t)?;
                return Ok((t, false));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return err(KEY, format!("cannot read {}: {e}", f.display())),
        }
        let token = random_hex(GENERATED_TOKEN_BYTES).map_err(|e| ConfigError { path: KEY.into(), msg: e })?;
        let io = |what: &str, e: std::io::Error| ConfigError {
            path: KEY.into(),
            msg: format!("none set and cannot {what} a generated one at {}: {e} (set admin.token_file)", f.display()),
        };
        // Written under a temporary name and linked into place: a crash
        // mid-write leaves no half-written token, and link (unlike rename)
        // never replaces a token another process has just created.
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = f.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(|e| io("write", e))?;
        let written = file.write_all(format!("{token}\n").as_bytes()).and_then(|_| file.sync_all());
        drop(file);
        let linked = written.and_then(|_| std::fs::hard_link(&tmp, f));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                // The new directory entry survives a crash too.
                if let Some(dir) = f.parent().filter(|d| !d.as_os_str().is_empty()) {
                    let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
                }
                return Ok((token, true));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("write", e)),
        }
    }
    err(KEY, format!("{} keeps appearing and disappearing; set admin.token_file", f.display()))
}

/// `n` bytes from the kernel's CSPRNG, hex-encoded (token characters).
fn random_hex(n: usize) -> Result<String, String> {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let rc = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), n - filled, 0) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("getrandom: {e}"));
        }
        filled += rc as usize;
    }
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn check_token(path: &str, t: &str) -> Result<(), ConfigError> {
    if t.len() > TOKEN_BYTES_MAX {
        return err(path, format!("token is longer than {TOKEN_BYTES_MAX} bytes"));
    }
    // RFC 6750 b64token characters; anything else cannot travel in a header.
    let ok = t.bytes().all(|c| c.is_ascii_alphanumeric() || b"-._~+/=".contains(&c));
    if !ok {
        return err(path, "token may contain only letters, digits and -._~+/=");
    }
    Ok(())
}

fn parse_metrics(v: Option<&Value>, port_alias: Option<u16>) -> Result<MetricsConfig, ConfigError> {
    let mut m = MetricsConfig { enabled: true, bind: IpAddr::from([0, 0, 0, 0]), port: port_alias.unwrap_or(9000) };
    if let Some(v) = v {
        let mut o = Obj::new("metrics", v)?;
        if let Some(b) = o.bool("enabled")? {
            m.enabled = b;
        }
        if let Some(ip) = o.ip("bind")? {
            m.bind = ip;
        }
        let port = o.port("port", true)?;
        if let Some(p) = pick_alias("metrics.port", port.map(u64::from), "server.metrics_port", port_alias.map(u64::from))? {
            m.port = p as u16;
        }
        o.finish(&[], &mut Vec::new())?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    //! Unit tests of the pieces; tests/config.rs covers whole files.
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_str("4096"), Some(4096));
        assert_eq!(parse_size_str("2M"), Some(2 << 20));
        assert_eq!(parse_size_str("2 GiB"), Some(2 << 30));
        assert_eq!(parse_size_str("1T"), Some(1 << 40));
        assert_eq!(parse_size_str(""), None);
        assert_eq!(parse_size_str("M"), None);
        assert_eq!(parse_size_str("1X"), None);
        assert_eq!(parse_size_str("-1"), None);
        // Overflow is an error, not a wrap.
        assert_eq!(parse_size_str("99999999999999999T"), None);
    }

    #[test]
    fn host_port() {
        assert_eq!(split_host_port("x", "10.0.0.2", 2049).unwrap(), ("10.0.0.2".into(), 2049));
        assert_eq!(split_host_port("x", "10.0.0.2:2050", 2049).unwrap(), ("10.0.0.2".into(), 2050));
        assert_eq!(split_host_port("x", "[fd00::1]:20049", 2049).unwrap(), ("fd00::1".into(), 20049));
        assert_eq!(split_host_port("x", "fd00::1", 2049).unwrap(), ("fd00::1".into(), 2049));
        assert_eq!(split_host_port("x", "ds-0.ds.ns.svc", 2049).unwrap(), ("ds-0.ds.ns.svc".into(), 2049));
        for bad in ["", ":2049", "10.0.0.2:0", "10.0.0.2:99999", "a b", "[fd00::1", "[zz]:1", "h:x"] {
            let e = split_host_port("x.uaddr", bad, 2049).unwrap_err();
            assert_eq!(e.path, "x.uaddr", "{bad}");
        }
    }

    #[test]
    fn ns_paths() {
        assert_eq!(check_ns_path("p", "/a/b/").unwrap(), "/a/b");
        assert_eq!(check_ns_path("p", "/").unwrap(), "/");
        for bad in ["a", "/a//b", "/a/../b", "/./a"] {
            assert!(check_ns_path("p", bad).is_err(), "{bad}");
        }
    }
}
