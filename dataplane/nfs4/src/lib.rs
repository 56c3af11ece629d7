//! NFSv4.1 server (RFC 8881): RPC program 100003 version 4, minor version 1.
//!
//! `compound` runs a COMPOUND the way RFC 8881 §16.2 describes it, one
//! operation at a time; `ops` holds one function per operation; `state` is
//! the pure session/stateid/lock/lease state machine; `attrs` encodes fattr4.
//! Everything below the protocol goes through `vfs::Vfs`.

pub mod attrs;
pub mod callback;
mod compound;
pub mod delegations;
pub mod offload;
pub mod error;
pub mod layout;
mod ops;
mod park;
pub mod state;
#[cfg(test)]
mod tests;

use rpc::{CallContext, CallError, Program};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use vfs::{ExportId, Vfs};

/// Server configuration. Every limit is named and bounded (asserted in `new`).
#[derive(Debug, Clone)]
pub struct Config {
    /// Lease a client must renew within (lease_time attribute).
    pub lease_time_s: u32,
    /// Grace period after start during which only reclaims are accepted.
    pub grace_time_s: u32,
    /// Export whose root PUTROOTFH/PUTPUBFH return (0: the router's pseudo-root).
    pub root_export: ExportId,
    /// Largest READ/WRITE payload (maxread/maxwrite).
    pub read_bytes_max: u32,
    pub write_bytes_max: u32,
    /// server_owner4.so_major_id and eir_server_scope: identical on servers
    /// that share state (trunking).
    pub server_owner: Vec<u8>,
    pub server_scope: Vec<u8>,
    pub clients_max: usize,
    pub sessions_per_client_max: usize,
    pub slots_per_session_max: u32,
    pub ops_per_compound_max: u32,
    pub request_bytes_max: u32,
    pub response_bytes_max: u32,
    pub response_cached_bytes_max: u32,
    pub stateids_max: usize,
    pub locks_max: usize,
    /// Replay-cache memory of all sessions together.
    pub reply_cache_bytes_max: u64,
    /// Read and write delegations held at once, all clients; 0 turns
    /// delegations off (chimerad: `server.nfs4_delegations`).
    pub delegations_max: usize,
}

impl Default for Config {
    fn default() -> Self {
        let l = state::Limits::default();
        Config {
            lease_time_s: l.lease_time_s,
            grace_time_s: l.grace_time_s,
            root_export: 0,
            read_bytes_max: 1024 * 1024,
            write_bytes_max: 1024 * 1024,
            server_owner: b"chimera".to_vec(),
            server_scope: b"chimera".to_vec(),
            clients_max: l.clients_max,
            sessions_per_client_max: l.sessions_per_client_max,
            slots_per_session_max: l.slots_per_session_max,
            ops_per_compound_max: l.ops_per_compound_max,
            request_bytes_max: l.request_bytes_max,
            response_bytes_max: l.response_bytes_max,
            response_cached_bytes_max: l.response_cached_bytes_max,
            stateids_max: l.stateids_max,
            locks_max: l.locks_max,
            reply_cache_bytes_max: l.reply_cache_bytes_max,
            delegations_max: l.delegations_max,
        }
    }
}

/// Bytes of a COMPOUND reply beyond the READ payload (headers, SEQUENCE,
/// PUTFH, GETATTR): the response size must leave room for them.
pub const REPLY_OVERHEAD_BYTES: u32 = 4096;
/// Longest owner/server strings we accept in configuration (NFS4_OPAQUE_LIMIT).
pub const OPAQUE_BYTES_MAX: usize = 1024;

impl Config {
    fn limits(&self) -> state::Limits {
        state::Limits {
            lease_time_s: self.lease_time_s,
            grace_time_s: self.grace_time_s,
            clients_max: self.clients_max,
            sessions_per_client_max: self.sessions_per_client_max,
            slots_per_session_max: self.slots_per_session_max,
            ops_per_compound_max: self.ops_per_compound_max,
            request_bytes_max: self.request_bytes_max,
            response_bytes_max: self.response_bytes_max,
            response_cached_bytes_max: self.response_cached_bytes_max,
            stateids_max: self.stateids_max,
            locks_max: self.locks_max,
            expired_remembered_max: 4096,
            reply_cache_bytes_max: self.reply_cache_bytes_max,
            delegations_max: self.delegations_max,
        }
    }

    /// Check every limit; the error names the offending field so a config
    /// loader can report it. `Nfs4Program::new` panics on an invalid config.
    pub fn check(&self) -> Result<(), String> {
        fn range(name: &str, v: u64, min: u64, max: u64) -> Result<(), String> {
            if v < min || v > max {
                return Err(format!("nfs4 config: {name} = {v} is outside {min}..={max}"));
            }
            Ok(())
        }
        range("lease_time_s", self.lease_time_s.into(), 1, 3600)?;
        range("grace_time_s", self.grace_time_s.into(), 0, 3600)?;
        range("read_bytes_max", self.read_bytes_max.into(), 4096, 16 << 20)?;
        range("write_bytes_max", self.write_bytes_max.into(), 4096, 16 << 20)?;
        let read_min = u64::from(self.read_bytes_max) + u64::from(REPLY_OVERHEAD_BYTES);
        range("response_bytes_max", self.response_bytes_max.into(), read_min, u32::MAX.into())?;
        let write_min = u64::from(self.write_bytes_max) + u64::from(REPLY_OVERHEAD_BYTES);
        range("request_bytes_max", self.request_bytes_max.into(), write_min, u32::MAX.into())?;
        range("response_cached_bytes_max", self.response_cached_bytes_max.into(), 512, 1 << 20)?;
        range("slots_per_session_max", self.slots_per_session_max.into(), 1, 1024)?;
        // The Linux client refuses sessions allowing fewer than 8 operations.
        range("ops_per_compound_max", self.ops_per_compound_max.into(), 8, 1024)?;
        range("clients_max", self.clients_max as u64, 1, 1 << 24)?;
        range("sessions_per_client_max", self.sessions_per_client_max as u64, 1, 1024)?;
        range("stateids_max", self.stateids_max as u64, 1, 1 << 28)?;
        range("reply_cache_bytes_max", self.reply_cache_bytes_max, u64::from(self.response_cached_bytes_max), 1 << 40)?;
        range("locks_max", self.locks_max as u64, 2, 1 << 28)?;
        range("delegations_max", self.delegations_max as u64, 0, 1 << 24)?;
        range("server_owner bytes", self.server_owner.len() as u64, 1, OPAQUE_BYTES_MAX as u64)?;
        range("server_scope bytes", self.server_scope.len() as u64, 1, OPAQUE_BYTES_MAX as u64)?;
        Ok(())
    }
}

/// The NFSv4.1 program: register with `rpc::Dispatcher`.
pub struct Nfs4Program {
    vfs: Arc<dyn Vfs>,
    cfg: Arc<Config>,
    state: Arc<Mutex<state::State>>,
    clock: Instant,
    /// Added to the clock: lets tests move time forward (leases, grace).
    skew_ms: Arc<std::sync::atomic::AtomicU64>,
    reaper: Option<Reaper>,
    callbacks: Arc<callback::Callbacks>,
    delegations: Arc<delegations::Delegations>,
    /// Asynchronous COPYs (`offload`).
    offloads: Arc<offload::Offloads>,
    /// pNFS layouts (RFC 8881 §12); None: LAYOUTGET & co. are NOTSUPP.
    layouts: Option<Arc<dyn layout::LayoutServer>>,
    /// Export access rules (`compound::Compound::admit`).
    access: Arc<vfs::clients::AccessTable>,
}

/// Background lease reaper: wakes every second, stops when the program drops.
struct Reaper {
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Nfs4Program {
    fn drop(&mut self) {
        if let Some(mut r) = self.reaper.take() {
            let _ = r.stop.send(());
            if let Some(t) = r.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// How often the reaper looks for expired leases.
pub const REAP_INTERVAL_MS: u64 = 1000;

impl Nfs4Program {
    pub fn new(vfs: Arc<dyn Vfs>, cfg: Config) -> Self {
        let mut p = Self::new_without_reaper(vfs, cfg);
        let (stop, rx) = std::sync::mpsc::channel::<()>();
        let st = Arc::downgrade(&p.state);
        let vfs = p.vfs.clone();
        let clock = p.clock;
        let thread = std::thread::Builder::new()
            .name("nfs4-lease-reaper".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    rx.recv_timeout(Duration::from_millis(REAP_INTERVAL_MS))
                {
                    let Some(st) = st.upgrade() else { return };
                    let now = clock.elapsed().as_millis() as u64;
                    StateGuard::lock(&st, &*vfs).reap(now);
                }
            })
            .expect("spawn lease reaper");
        p.reaper = Some(Reaper { stop, thread: Some(thread) });
        p
    }

    /// Without the background thread: tests drive expiry with `reap_now`.
    pub fn new_without_reaper(vfs: Arc<dyn Vfs>, cfg: Config) -> Self {
        if let Err(e) = cfg.check() {
            panic!("{e}");
        }
        let mut st = state::State::new(cfg.limits(), instance_epoch(), 0);
        if let Some(owners) = vfs.client_records() {
            st.set_reclaimable(owners);
        }
        let state = Arc::new(Mutex::new(st));
        let callbacks = Arc::new(callback::Callbacks::new(state.clone(), u64::from(cfg.lease_time_s) * 1000));
        let clock = Instant::now();
        let skew_ms: Arc<std::sync::atomic::AtomicU64> = Default::default();
        let delegations =
            Arc::new(delegations::Delegations::new(state.clone(), vfs.clone(), callbacks.clone(), clock, skew_ms.clone()));
        Nfs4Program {
            vfs,
            cfg: Arc::new(cfg),
            state,
            clock,
            skew_ms,
            reaper: None,
            callbacks,
            delegations,
            offloads: Arc::new(offload::Offloads::new(instance_epoch())),
            layouts: None,
            access: Default::default(),
        }
    }

    /// The same program for a worker that runs the rest of a COMPOUND
    /// (`compound::offload`): every table shared, no lease reaper of its
    /// own (dropping it stops nothing).
    pub(crate) fn share(&self) -> Nfs4Program {
        Nfs4Program {
            vfs: self.vfs.clone(),
            cfg: self.cfg.clone(),
            state: self.state.clone(),
            clock: self.clock,
            skew_ms: self.skew_ms.clone(),
            reaper: None,
            callbacks: self.callbacks.clone(),
            delegations: self.delegations.clone(),
            offloads: self.offloads.clone(),
            layouts: self.layouts.clone(),
            access: self.access.clone(),
        }
    }

    /// Export access rules to enforce on every operation with a current
    /// filehandle (default: a table without rules, every client read-write).
    pub fn with_access(mut self, access: Arc<vfs::clients::AccessTable>) -> Self {
        self.access = access;
        self
    }

    pub(crate) fn access(&self) -> &vfs::clients::AccessTable {
        &self.access
    }

    /// Serve pNFS layouts from `l` (the MDS role): fs_layout_types then
    /// advertises its layout type and the layout operations reach it.
    pub fn with_layouts(mut self, l: Arc<dyn layout::LayoutServer>) -> Self {
        self.layouts = Some(l);
        self
    }

    pub(crate) fn layout_type(&self) -> u32 {
        self.layouts.as_ref().map_or(0, |l| l.layout_type())
    }

    pub(crate) fn layout_blksize(&self) -> u32 {
        self.layouts.as_ref().map_or(attrs::LAYOUT_BLKSIZE_BYTES, |l| l.blksize())
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64 + self.skew_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Move this program's clock forward (tests of leases and grace; the
    /// background reaper keeps using the real clock).
    #[doc(hidden)]
    pub fn advance_clock_ms(&self, ms: u64) {
        self.skew_ms.fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn state(&self) -> StateGuard<'_> {
        StateGuard::lock(&self.state, &*self.vfs)
    }

    /// Expire leases now (what the reaper does every second).
    pub fn reap_now(&self) -> usize {
        let now = self.now_ms();
        self.state().reap(now)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The back channel: CB_LAYOUTRECALL and friends (see `callback`).
    /// Milliseconds of the grace period left (0 once over or lifted), for
    /// the admin API: a rolling restart moves on only after it.
    pub fn grace_probe(&self) -> Arc<dyn Fn() -> u64 + Send + Sync> {
        let st = Arc::downgrade(&self.state);
        let (clock, skew) = (self.clock, self.skew_ms.clone());
        Arc::new(move || {
            let Some(st) = st.upgrade() else { return 0 };
            let now = clock.elapsed().as_millis() as u64 + skew.load(std::sync::atomic::Ordering::Relaxed);
            let g = st.lock().unwrap_or_else(|e| e.into_inner());
            g.grace_remaining_ms(now)
        })
    }

    pub fn callbacks(&self) -> Arc<callback::Callbacks> {
        self.callbacks.clone()
    }

    /// The delegations this program grants: NFSv3 on the same files asks
    /// it before reading or changing one (`vfs::DelegationBreaker`).
    pub fn delegations(&self) -> Arc<delegations::Delegations> {
        self.delegations.clone()
    }
}

/// The state lock, held. Dropping it releases the backend's open
/// references (`Vfs::unpin`) of every file whose last open went while it
/// was held — by CLOSE, lease expiry, a replaced client record, whatever
/// path — so no such reference is leaked. The unpins run after the lock
/// is released: an OPEN pins under the lock, and pins are counted, so a
/// late unpin can only keep a nameless file a moment longer, never free
/// one that is open.
pub(crate) struct StateGuard<'a> {
    st: Option<MutexGuard<'a, state::State>>,
    vfs: &'a dyn Vfs,
}

impl<'a> StateGuard<'a> {
    fn lock(st: &'a Mutex<state::State>, vfs: &'a dyn Vfs) -> StateGuard<'a> {
        // A panic while holding the lock leaves state consistent per call
        // (each method is all-or-nothing on its tables): keep serving.
        StateGuard { st: Some(st.lock().unwrap_or_else(|e| e.into_inner())), vfs }
    }
}

impl Deref for StateGuard<'_> {
    type Target = state::State;
    fn deref(&self) -> &state::State {
        self.st.as_ref().expect("held until drop")
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut state::State {
        self.st.as_mut().expect("held until drop")
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let Some(mut st) = self.st.take() else { return };
        if !st.unpins_pending() && !st.record_changes_pending() {
            return;
        }
        let unpins = st.take_unpins();
        let records = st.take_record_changes();
        drop(st);
        for fh in &unpins {
            self.vfs.unpin(fh);
        }
        // Client records reach stable storage before the reply that lets
        // the client hold state (the guard drops before the reply leaves).
        for (owner, present) in &records {
            self.vfs.record_client(owner, *present);
        }
    }
}

impl Program for Nfs4Program {
    fn program(&self) -> u32 {
        proto::nfs4::NFS4_PROGRAM
    }

    fn version(&self) -> u32 {
        proto::nfs4::NFS_V4
    }

    /// NFSv4.1 gets exactly-once semantics from the session slot table, not
    /// from the RPC duplicate-request cache (RFC 8881 §2.10.6).
    fn idempotent(&self, _proc_num: u32) -> bool {
        true
    }

    fn call(&self, ctx: &CallContext<'_>, args: &[u8], reply: &mut proto::xdr::Encoder<'_>) -> Result<(), CallError> {
        match ctx.proc_num {
            0 => Ok(()), // NULL
            1 => compound::run(self, ctx, args, reply),
            _ => Err(CallError::ProcUnavail),
        }
    }
}

/// A number naming this server instance inside client IDs, session IDs and
/// stateids, so that a restarted server refuses its predecessor's
/// (NFS4ERR_STALE_CLIENTID, BADSESSION, STALE_STATEID) and clients recover.
/// Seconds alone were not enough: a server restarted within the same second
/// handed out, and accepted, the ids of the one before. Never 0.
pub fn instance_epoch() -> u32 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0) as u64;
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mixed = (nanos ^ (u64::from(std::process::id()) << 40) ^ n.rotate_left(20)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    match (mixed >> 32) as u32 {
        0 => 1,
        e => e,
    }
}
