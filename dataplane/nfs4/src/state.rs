//! NFSv4.1 server state (RFC 8881 §2.4, §2.10, §8, §9): client records,
//! sessions and their slot tables with the reply cache, stateids, open and
//! lock owners, share reservations, the byte-range lock table, leases and the
//! grace period.
//!
//! Pure: no I/O, no clock. Every method that depends on time takes `now_ms`
//! (a monotonic millisecond count chosen by the caller), so tests drive time
//! explicitly. Errors are [`StateError`]; the protocol layer maps them to
//! nfsstat4 in one place. Every table is bounded by a named limit.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use vfs::FileHandle;

mod deleg;
pub use deleg::{DelegGrant, DelegWant, Recall, RecallAny, DELEG_REGRANT_HOLDOFF_MS, REVOKED_PER_CLIENT_MAX};

/// Bounds and timers of the state machine. Every table is limited so a hostile
/// or buggy client cannot grow server memory without bound.
#[derive(Debug, Clone)]
pub struct Limits {
    pub lease_time_s: u32,
    pub grace_time_s: u32,
    pub clients_max: usize,
    pub sessions_per_client_max: usize,
    /// Fore-channel slots granted per session at most (ca_maxrequests).
    pub slots_per_session_max: u32,
    /// Operations per COMPOUND granted at most (ca_maxoperations).
    pub ops_per_compound_max: u32,
    pub request_bytes_max: u32,
    pub response_bytes_max: u32,
    /// Largest reply kept in a slot's replay cache (ca_maxresponsesize_cached).
    pub response_cached_bytes_max: u32,
    /// Open and lock stateids, all clients together.
    pub stateids_max: usize,
    /// Byte-range locks, all files together.
    pub locks_max: usize,
    /// Stateids of expired clients remembered so they get NFS4ERR_EXPIRED.
    pub expired_remembered_max: usize,
    /// Replay-cache memory of all sessions together (slots x cached reply
    /// size): CREATE_SESSION grants fewer slots when it runs short.
    pub reply_cache_bytes_max: u64,
    /// Delegations held at once, all clients (0: none are granted).
    pub delegations_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            lease_time_s: 90,
            grace_time_s: 90,
            clients_max: 4096,
            sessions_per_client_max: 16,
            slots_per_session_max: 64,
            ops_per_compound_max: 32,
            request_bytes_max: 1024 * 1024 + 4096,
            response_bytes_max: 1024 * 1024 + 4096,
            response_cached_bytes_max: 8192,
            stateids_max: 1 << 20,
            locks_max: 1 << 20,
            expired_remembered_max: 4096,
            reply_cache_bytes_max: 256 << 20,
            delegations_max: 0,
        }
    }
}

/// Why a state operation failed; each maps to exactly one nfsstat4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateError {
    BadSession,
    BadSlot,
    SeqMisordered,
    /// The slot is executing the previous request.
    Delay,
    RetryUncachedRep,
    StaleClientId,
    ClientIdBusy,
    BadStateid,
    OldStateid,
    StaleStateid,
    Expired,
    ShareDenied,
    OpenMode,
    LocksHeld,
    Grace,
    NoGrace,
    CompleteAlready,
    Inval,
    /// Owner or state tables are full.
    Resource,
    NoEnt,
    NotSame,
    LockRange,
    /// The client ID belongs to another principal (§18.35.5 case 3, §18.36.4).
    ClidInUse,
    /// An update of a confirmed record by another principal (§18.35.5 case 9).
    Perm,
    /// Channel sizes that cannot carry any request (§18.36.3).
    TooSmall,
    /// A delegation the server revoked (the client frees it with FREE_STATEID).
    DelegRevoked,
}

pub type StateResult<T> = Result<T, StateError>;

pub type ClientId = u64;
pub type SessionId = [u8; 16];
/// Who sent an EXCHANGE_ID / CREATE_SESSION: for AUTH_SYS the uid (AUTH_NONE
/// is the nobody uid). RPCSEC_GSS is not supported, so this is all we have.
pub type Principal = u32;

/// Smallest channel sizes that can carry any request at all (RFC 8881
/// §18.36.3, NFS4ERR_TOOSMALL below them). ca_maxrequestsize and
/// ca_maxresponsesize count the RPC header too (§18.36.2): the smallest call
/// header (AUTH_NONE credential and verifier) is 40 bytes, the reply header
/// 24. Fore channel: COMPOUND4args with an empty tag (12) + SEQUENCE (4 + 32);
/// its reply COMPOUND4res (12) + SEQUENCE4res (8 + 36).
pub const RPC_CALL_HEADER_BYTES_MIN: u32 = 40;
pub const RPC_REPLY_HEADER_BYTES: u32 = 24;
pub const FORE_REQUEST_BYTES_MIN: u32 = RPC_CALL_HEADER_BYTES_MIN + 12 + 36;
pub const FORE_RESPONSE_BYTES_MIN: u32 = RPC_REPLY_HEADER_BYTES + 12 + 44;
/// Back channel: CB_COMPOUND4args (16) + CB_SEQUENCE (4 + 36); its reply
/// CB_COMPOUND4res (12) + CB_SEQUENCE4res (8 + 32).
pub const BACK_REQUEST_BYTES_MIN: u32 = RPC_CALL_HEADER_BYTES_MIN + 16 + 40;
pub const BACK_RESPONSE_BYTES_MIN: u32 = RPC_REPLY_HEADER_BYTES + 12 + 40;
/// csa_flags defined by RFC 8881 §18.36.2; any other bit is NFS4ERR_INVAL.
const CREATE_SESSION_FLAGS_DEFINED: u32 = proto::nfs4::CREATE_SESSION4_FLAG_PERSIST
    | proto::nfs4::CREATE_SESSION4_FLAG_CONN_BACK_CHAN
    | proto::nfs4::CREATE_SESSION4_FLAG_CONN_RDMA;

/// stateid4 (RFC 8881 §8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stateid {
    pub seqid: u32,
    pub other: [u8; 12],
}

impl Stateid {
    /// All zeros: the anonymous stateid (§8.2.3).
    pub const ANONYMOUS: Stateid = Stateid { seqid: 0, other: [0; 12] };
    /// All ones: READ bypass stateid.
    pub const BYPASS: Stateid = Stateid { seqid: u32::MAX, other: [0xff; 12] };
    /// seqid 1, other zero: "the current stateid" of the COMPOUND.
    pub const CURRENT: Stateid = Stateid { seqid: 1, other: [0; 12] };
    /// seqid all ones, other zero: the invalid stateid (returned by CLOSE).
    pub const INVALID: Stateid = Stateid { seqid: u32::MAX, other: [0; 12] };

    pub fn is_special(&self) -> bool {
        self.other == [0; 12] || self.other == [0xff; 12]
    }
}

/// OPEN4_SHARE_ACCESS_* / OPEN4_SHARE_DENY_* low bits.
pub const SHARE_READ: u32 = 1;
pub const SHARE_WRITE: u32 = 2;
pub const SHARE_BOTH: u32 = 3;

/// Negotiated channel attributes (channel_attrs4 without the RDMA list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelAttrs {
    pub headerpad_bytes: u32,
    pub request_bytes_max: u32,
    pub response_bytes_max: u32,
    pub response_cached_bytes_max: u32,
    pub ops_max: u32,
    pub requests_max: u32,
}

#[derive(Debug)]
struct Slot {
    /// Sequence id of the last request executed in this slot (0 before any).
    seqid: u32,
    busy: bool,
    /// `reply` holds the full reply of request `seqid`.
    cached: bool,
    /// Allocated once at session creation with the negotiated cache size.
    reply: Vec<u8>,
}

#[derive(Debug)]
pub struct Session {
    pub id: SessionId,
    pub clientid: ClientId,
    pub fore: ChannelAttrs,
    pub back: ChannelAttrs,
    pub flags: u32,
    pub cb_program: u32,
    /// The minor version of the COMPOUND that created the session: its
    /// callbacks are CB_COMPOUNDs of the same minor version (a Linux 4.2
    /// client finds the session of a callback by sessionid and minor
    /// version together).
    pub minor: u32,
    slots: Vec<Slot>,
    conns: Vec<u64>,
    /// The back channel (RFC 8881 §2.10.3.1), used by `crate::callback`.
    pub back_chan: BackChan,
}

/// Back-channel slots used per session at most, whatever the client offers
/// in ca_maxrequests (we use min of the two).
pub const CB_SLOTS_MAX: u32 = 16;
/// Connections remembered per session for each channel.
pub const CONNS_PER_SESSION_MAX: usize = 64;

/// One session's back channel: the connections the client bound for
/// callbacks, the program and credential to call with, and the callback
/// slot table (RFC 8881 §2.10.6.3: the server is the requester here).
#[derive(Debug, Clone, Default)]
pub struct BackChan {
    /// csa_cb_program / bca_cb_program.
    pub program: u32,
    /// The first credential flavor we can use from csa_sec_parms /
    /// bca_sec_parms; None: the client offered only RPCSEC_GSS.
    pub cred: Option<rpc::backchannel::CallCred>,
    /// Connections bound for the back channel, most recent last.
    pub conns: Vec<u64>,
    pub slots: Vec<CbSlot>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CbSlot {
    /// Sequence id of the last CB_SEQUENCE sent on this slot (0 before any).
    pub seqid: u32,
    pub busy: bool,
    /// The last call timed out: the client may or may not have seen `seqid`.
    pub uncertain: bool,
}

/// A callback slot taken by `cb_begin`: everything needed to send.
#[derive(Debug, Clone)]
pub struct CbCall {
    pub session: SessionId,
    pub slot: u32,
    pub seqid: u32,
    pub highest_slot: u32,
    pub conn: u64,
    pub program: u32,
    pub cred: rpc::backchannel::CallCred,
    pub request_bytes_max: u32,
    pub ops_max: u32,
    /// The session's minor version (the CB_COMPOUND's minorversion).
    pub minor: u32,
}

/// Why `cb_begin` found no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CbBusy {
    /// No session of the client has a usable back channel.
    NoBackChannel,
    /// Every slot of every usable back channel is in use.
    SlotsBusy,
}

/// What CREATE_SESSION returned, kept for its replay (§18.36.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedSession {
    pub id: SessionId,
    pub sequence: u32,
    pub flags: u32,
    pub fore: ChannelAttrs,
    pub back: ChannelAttrs,
}

#[derive(Debug)]
struct Client {
    id: ClientId,
    owner: Vec<u8>,
    verifier: [u8; 8],
    /// The principal of the EXCHANGE_ID that made this record.
    principal: Principal,
    confirmed: bool,
    /// csa_sequence of the last CREATE_SESSION executed, and its result
    /// (the one-slot CREATE_SESSION reply cache of §18.36.4; an error is
    /// cached as well, since the client counts a failed request too).
    cs_seq: u32,
    cs_last: Option<StateResult<CreatedSession>>,
    renewed_ms: u64,
    sessions: Vec<SessionId>,
    reclaim_complete: bool,
    /// The confirmed record of the same owner this unconfirmed one will
    /// replace when confirmed (a client reboot).
    replaces: Option<ClientId>,
    /// Delegations the server revoked, until the client frees them
    /// (SEQ4_STATUS_RECALLABLE_STATE_REVOKED while any; at most
    /// `REVOKED_PER_CLIENT_MAX`, oldest forgotten first).
    revoked: VecDeque<u64>,
}

/// Result of EXCHANGE_ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchanged {
    pub clientid: ClientId,
    /// eir_sequenceid: what the first CREATE_SESSION must carry.
    pub sequence: u32,
    pub confirmed: bool,
}

/// Lock types (nfs_lock_type4): READ_LT/READW_LT are shared, WRITE_LT/WRITEW_LT exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    Read,
    Write,
}

/// A conflicting lock, reported as LOCK4denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub offset: u64,
    pub length: u64,
    pub kind: LockKind,
    pub clientid: ClientId,
    pub owner: Vec<u8>,
}

#[derive(Debug)]
pub enum LockError {
    State(StateError),
    Denied(Conflict),
}

impl From<StateError> for LockError {
    fn from(e: StateError) -> Self {
        LockError::State(e)
    }
}

/// How a LOCK names its lock owner (locker4).
#[derive(Debug, Clone, Copy)]
pub enum Locker<'a> {
    New { open_stateid: Stateid, owner: &'a [u8] },
    Existing { lock_stateid: Stateid },
}

#[derive(Debug)]
enum Kind {
    Open { owner: Vec<u8>, access: u32, deny: u32 },
    Lock { open: u64, owner: Vec<u8> },
    /// A read or write delegation (§10.4); `recalled_ms`: when CB_RECALL
    /// was sent (revoked one lease later if not returned).
    Deleg { write: bool, recalled_ms: Option<u64> },
}

#[derive(Debug)]
struct StateRec {
    clientid: ClientId,
    fh: FileHandle,
    seqid: u32,
    kind: Kind,
}

#[derive(Debug, Clone)]
struct LockRange {
    state: u64,
    kind: LockKind,
    start: u64,
    /// Inclusive last byte.
    last: u64,
}

#[derive(Debug, Default)]
struct FileState {
    opens: Vec<u64>,
    locks: Vec<LockRange>,
    delegs: Vec<u64>,
    /// The backend holds an open reference (`vfs::Vfs::pin`) for this
    /// file's opens: released when the record goes (`take_unpins`).
    pinned: bool,
}

/// A validated stateid: which state it names and what the file was opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validated {
    /// None for the anonymous and bypass stateids.
    pub key: Option<u64>,
    pub access: u32,
}

pub struct State {
    limits: Limits,
    boot_epoch: u32,
    started_ms: u64,
    next_client: u32,
    next_session: u32,
    next_state: u64,
    clients: HashMap<ClientId, Client>,
    by_owner: HashMap<Vec<u8>, ClientId>,
    sessions: HashMap<SessionId, Session>,
    states: HashMap<u64, StateRec>,
    files: HashMap<FileHandle, FileState>,
    locks_total: usize,
    /// Sum over sessions of slots x negotiated cached reply size.
    reply_cache_bytes: u64,
    expired: HashSet<u64>,
    expired_order: VecDeque<u64>,
    /// Files whose last open went (CLOSE, lease expiry, client replaced)
    /// while pinned: the caller unpins them in the backend (`take_unpins`).
    unpins: Vec<FileHandle>,
    /// Owners that may reclaim (they held state when the server last
    /// stopped, per the backend's stable storage); `None`: no stable
    /// storage, any client may reclaim during grace.
    reclaimable: Option<HashSet<Vec<u8>>>,
    /// Grace ended early: every reclaimable client sent RECLAIM_COMPLETE
    /// (or there were none).
    grace_lifted: bool,
    /// Client records to write to (true) or erase from (false) stable
    /// storage (`take_record_changes`).
    record_changes: Vec<(Vec<u8>, bool)>,
    /// Delegations held (a copy readable without the lock, so paths that
    /// check for conflicts cost nothing while there are none).
    deleg_gauge: Arc<AtomicUsize>,
    /// Delegations being recalled (revoked one lease after the recall).
    recalling: Vec<u64>,
    /// Files recently recalled: no new delegation on them for
    /// `DELEG_REGRANT_HOLDOFF_MS` (the conflicting opener gets its turn).
    recent_recalls: VecDeque<(FileHandle, u64)>,
    /// When CB_RECALL_ANY last went out (sent at most once per half lease).
    recall_any_ms: Option<u64>,
}

fn range_last(offset: u64, length: u64) -> StateResult<u64> {
    if length == 0 {
        return Err(StateError::Inval);
    }
    if length == u64::MAX {
        return Ok(u64::MAX);
    }
    offset.checked_add(length - 1).ok_or(StateError::Inval)
}

fn range_length(start: u64, last: u64) -> u64 {
    if last == u64::MAX {
        u64::MAX
    } else {
        last - start + 1
    }
}

impl State {
    /// `boot_epoch` distinguishes this server instance's ids from an earlier
    /// one's (seconds since the epoch at start is a good choice).
    pub fn new(limits: Limits, boot_epoch: u32, now_ms: u64) -> Self {
        assert!(limits.lease_time_s > 0, "lease_time_s must be positive");
        assert!(limits.slots_per_session_max > 0 && limits.ops_per_compound_max > 0);
        State {
            limits,
            boot_epoch,
            started_ms: now_ms,
            next_client: 1,
            next_session: 1,
            next_state: 1,
            clients: HashMap::new(),
            by_owner: HashMap::new(),
            sessions: HashMap::new(),
            states: HashMap::new(),
            files: HashMap::new(),
            locks_total: 0,
            reply_cache_bytes: 0,
            expired: HashSet::new(),
            expired_order: VecDeque::new(),
            unpins: Vec::new(),
            reclaimable: None,
            grace_lifted: false,
            record_changes: Vec::new(),
            deleg_gauge: Arc::new(AtomicUsize::new(0)),
            recalling: Vec::new(),
            recent_recalls: VecDeque::new(),
            recall_any_ms: None,
        }
    }

    /// The client owners stable storage says held state when the server
    /// last stopped: only they may reclaim (others get NFS4ERR_NO_GRACE),
    /// and grace ends as soon as each has sent RECLAIM_COMPLETE — at once
    /// when there are none (RFC 8881 §8.4.3).
    pub fn set_reclaimable(&mut self, owners: Vec<Vec<u8>>) {
        self.grace_lifted = owners.is_empty();
        self.reclaimable = Some(owners.into_iter().collect());
    }

    /// Client records to write (true) or erase (false) on stable storage,
    /// since the last call: written by the caller after releasing the lock
    /// (a client confirmed; a client's lease expired or it was destroyed).
    pub fn take_record_changes(&mut self) -> Vec<(Vec<u8>, bool)> {
        std::mem::take(&mut self.record_changes)
    }

    pub fn record_changes_pending(&self) -> bool {
        !self.record_changes.is_empty()
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn lease_ms(&self) -> u64 {
        self.limits.lease_time_s as u64 * 1000
    }

    // ---- grace (§8.4.2) ----

    /// Milliseconds of the grace period left (0: over, or lifted early).
    pub fn grace_remaining_ms(&self, now_ms: u64) -> u64 {
        if !self.in_grace(now_ms) {
            return 0;
        }
        (self.started_ms + self.limits.grace_time_s as u64 * 1000).saturating_sub(now_ms)
    }

    pub fn in_grace(&self, now_ms: u64) -> bool {
        !self.grace_lifted && now_ms < self.started_ms + self.limits.grace_time_s as u64 * 1000
    }

    /// May `clientid` reclaim now? Only during grace and before its RECLAIM_COMPLETE.
    fn check_reclaim(&self, clientid: ClientId, now_ms: u64) -> StateResult<()> {
        let c = self.clients.get(&clientid).ok_or(StateError::StaleClientId)?;
        if !self.in_grace(now_ms) || c.reclaim_complete {
            return Err(StateError::NoGrace);
        }
        // A client stable storage does not know held no state before the
        // restart: nothing of its own to reclaim (§8.4.3).
        if self.reclaimable.as_ref().is_some_and(|r| !r.contains(&c.owner)) {
            return Err(StateError::NoGrace);
        }
        Ok(())
    }

    /// May `clientid` obtain locking state (an open or a byte-range lock)
    /// now? A reclaim: only during grace, before its RECLAIM_COMPLETE
    /// (§8.4.2.1). Anything else: only outside grace, and only once the
    /// client sent RECLAIM_COMPLETE for this client ID, grace or not
    /// (§18.51.3: NFS4ERR_GRACE before it).
    pub fn check_locking(&self, clientid: ClientId, reclaim: bool, now_ms: u64) -> StateResult<()> {
        if reclaim {
            return self.check_reclaim(clientid, now_ms);
        }
        let c = self.clients.get(&clientid).ok_or(StateError::StaleClientId)?;
        if !c.reclaim_complete {
            return Err(StateError::Grace);
        }
        self.check_not_grace(now_ms)
    }

    fn check_not_grace(&self, now_ms: u64) -> StateResult<()> {
        if self.in_grace(now_ms) {
            Err(StateError::Grace)
        } else {
            Ok(())
        }
    }

    // ---- clients (§18.35, §18.50, §18.51) ----

    /// EXCHANGE_ID for SP4_NONE: the nine cases of RFC 8881 §18.35.5,
    /// each named below. `principal` is the caller's (see [`Principal`]).
    pub fn exchange_id(
        &mut self,
        owner: &[u8],
        verifier: [u8; 8],
        principal: Principal,
        update: bool,
        now_ms: u64,
    ) -> StateResult<Exchanged> {
        // The owner index names the newest record; an unconfirmed one that
        // will replace a confirmed one (case 5) points at it.
        let (conf, unconf) = match self.by_owner.get(owner).and_then(|id| self.clients.get(id)) {
            Some(c) if c.confirmed => (Some(c.id), None),
            Some(c) => (c.replaces, Some(c.id)),
            None => (None, None),
        };
        if update {
            // Case 7: nothing confirmed to update.
            let Some(id) = conf else { return Err(StateError::NoEnt) };
            let c = self.clients.get_mut(&id).expect("owner index points at a live client");
            if c.principal != principal {
                return Err(StateError::Perm); // case 9
            }
            if c.verifier != verifier {
                return Err(StateError::NotSame); // case 8
            }
            // Case 6: the update (SP4_NONE: nothing to change but the lease).
            c.renewed_ms = now_ms;
            return Ok(Exchanged { clientid: id, sequence: c.cs_seq.wrapping_add(1), confirmed: true });
        }
        let mut replaces = None;
        let mut collision = None;
        if let Some(id) = conf {
            let c = &self.clients[&id];
            if c.principal != principal {
                // Case 3, client collision: refused while the record has
                // state (opens, locks, sessions); else it is dropped.
                if self.client_has_state(id) {
                    return Err(StateError::ClidInUse);
                }
                collision = Some(id);
            } else if c.verifier == verifier {
                // Case 2: a retransmission or a trunked connection.
                let c = self.clients.get_mut(&id).expect("checked above");
                c.renewed_ms = now_ms;
                return Ok(Exchanged { clientid: id, sequence: c.cs_seq.wrapping_add(1), confirmed: true });
            } else {
                // Case 5, client restart: a new unconfirmed record; the old
                // one keeps its state until CREATE_SESSION confirms the new.
                replaces = Some(id);
            }
        }
        let freed = usize::from(unconf.is_some()) + usize::from(collision.is_some());
        if self.clients.len() - freed >= self.limits.clients_max {
            return Err(StateError::Resource);
        }
        if let Some(id) = collision {
            self.expire_client(id, false);
        }
        if let Some(id) = unconf {
            // Case 4: an unconfirmed record is replaced by a new one with a
            // new client ID (CREATE_SESSION on the old ID: STALE_CLIENTID).
            self.expire_client(id, false);
        }
        // Case 1 (and the new record of cases 3, 4, 5).
        let id = ((self.boot_epoch as u64) << 32) | self.next_client as u64;
        self.next_client = self.next_client.wrapping_add(1).max(1);
        let c = Client {
            id,
            owner: owner.to_vec(),
            verifier,
            principal,
            confirmed: false,
            cs_seq: 0,
            cs_last: None,
            renewed_ms: now_ms,
            sessions: Vec::new(),
            reclaim_complete: false,
            replaces,
            revoked: VecDeque::new(),
        };
        self.by_owner.insert(c.owner.clone(), id);
        self.clients.insert(id, c);
        Ok(Exchanged { clientid: id, sequence: 1, confirmed: false })
    }

    /// Does the client hold sessions, opens or locks (§18.35.5 case 3)?
    fn client_has_state(&self, clientid: ClientId) -> bool {
        self.clients.get(&clientid).is_some_and(|c| !c.sessions.is_empty())
            || self.states.values().any(|s| s.clientid == clientid)
    }

    fn client_mut(&mut self, clientid: ClientId) -> StateResult<&mut Client> {
        self.clients.get_mut(&clientid).ok_or(StateError::StaleClientId)
    }

    /// CREATE_SESSION (RFC 8881 §18.36.4): principal check, the one-slot
    /// reply cache (replay / misordered), then the request itself. Its
    /// result, success or error, is cached and consumes the sequence id (the
    /// client counts a failed request too); a failed request reserves
    /// nothing. `flags` are csa_flags as asked; CONN_BACK_CHAN is granted
    /// only with `back_chan_ok` (a callback credential we can use).
    #[allow(clippy::too_many_arguments)] // mirrors CREATE_SESSION4args
    pub fn create_session(
        &mut self,
        clientid: ClientId,
        sequence: u32,
        principal: Principal,
        flags: u32,
        back_chan_ok: bool,
        fore_asked: ChannelAttrs,
        back_asked: ChannelAttrs,
        cb_program: u32,
        now_ms: u64,
    ) -> StateResult<CreatedSession> {
        let c = self.client_mut(clientid)?;
        if !c.confirmed && c.principal != principal {
            // Not the EXCHANGE_ID's principal: refused before the slot is
            // looked at, so a stranger cannot use up the owner's sequence.
            return Err(StateError::ClidInUse);
        }
        if sequence == c.cs_seq {
            if let Some(last) = c.cs_last {
                return last;
            }
        }
        if sequence != c.cs_seq.wrapping_add(1) {
            return Err(StateError::SeqMisordered);
        }
        let r = self.create_session_new(clientid, sequence, flags, back_chan_ok, fore_asked, back_asked, cb_program, now_ms);
        let c = self.clients.get_mut(&clientid).expect("checked above");
        c.cs_seq = sequence;
        c.cs_last = Some(r);
        r
    }

    /// The CREATE_SESSION request proper: every check comes before anything
    /// is reserved, so an error leaves no trace but the cached result.
    #[allow(clippy::too_many_arguments)]
    fn create_session_new(
        &mut self,
        clientid: ClientId,
        sequence: u32,
        flags: u32,
        back_chan_ok: bool,
        fore_asked: ChannelAttrs,
        back_asked: ChannelAttrs,
        cb_program: u32,
        now_ms: u64,
    ) -> StateResult<CreatedSession> {
        if flags & !CREATE_SESSION_FLAGS_DEFINED != 0 {
            return Err(StateError::Inval);
        }
        let too_small = |a: &ChannelAttrs, req_min: u32, resp_min: u32| {
            a.request_bytes_max < req_min || a.response_bytes_max < resp_min || a.ops_max == 0
        };
        if too_small(&fore_asked, FORE_REQUEST_BYTES_MIN, FORE_RESPONSE_BYTES_MIN)
            || too_small(&back_asked, BACK_REQUEST_BYTES_MIN, BACK_RESPONSE_BYTES_MIN)
        {
            return Err(StateError::TooSmall);
        }
        let c = self.clients.get(&clientid).ok_or(StateError::StaleClientId)?;
        if c.sessions.len() >= self.limits.sessions_per_client_max {
            return Err(StateError::Resource);
        }
        let mut fore = self.negotiate_fore(&fore_asked);
        // Fit the slot table into what is left of the replay-cache budget.
        let per_slot = u64::from(fore.response_cached_bytes_max).max(1);
        let left = self.limits.reply_cache_bytes_max.saturating_sub(self.reply_cache_bytes);
        let fit = (left / per_slot).min(u64::from(fore.requests_max)) as u32;
        if fit == 0 {
            return Err(StateError::Resource);
        }
        // Nothing fails from here on.
        fore.requests_max = fit;
        self.reply_cache_bytes += per_slot * u64::from(fit);
        let back = negotiate_back(&back_asked);
        let flags = if back_chan_ok { flags & proto::nfs4::CREATE_SESSION4_FLAG_CONN_BACK_CHAN } else { 0 };
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&clientid.to_be_bytes());
        id[8..12].copy_from_slice(&self.next_session.to_be_bytes());
        id[12..].copy_from_slice(&self.boot_epoch.to_be_bytes());
        self.next_session = self.next_session.wrapping_add(1);
        // Reply buffers grow on first use, up to the negotiated size (charged above).
        let slots = (0..fore.requests_max)
            .map(|_| Slot { seqid: 0, busy: false, cached: false, reply: Vec::new() })
            .collect();
        let created = CreatedSession { id, sequence, flags, fore, back };
        self.sessions.insert(
            id,
            Session {
                id,
                clientid,
                fore,
                back,
                flags,
                cb_program,
                minor: 1,
                slots,
                conns: Vec::new(),
                back_chan: BackChan {
                    program: cb_program,
                    cred: None,
                    conns: Vec::new(),
                    slots: vec![CbSlot::default(); back.requests_max.clamp(1, CB_SLOTS_MAX) as usize],
                },
            },
        );
        let c = self.clients.get_mut(&clientid).expect("checked above");
        let replaced = c.replaces.take();
        c.sessions.push(id);
        c.renewed_ms = now_ms;
        let newly = !c.confirmed;
        c.confirmed = true;
        if newly {
            // On stable storage before the client can hold any state.
            let owner = c.owner.clone();
            self.record_changes.push((owner, true));
        }
        if let Some(old) = replaced {
            // The rebooted client's previous incarnation and its state go now.
            self.expire_client(old, false);
        }
        Ok(created)
    }

    fn negotiate_fore(&self, a: &ChannelAttrs) -> ChannelAttrs {
        let l = &self.limits;
        ChannelAttrs {
            headerpad_bytes: 0,
            request_bytes_max: a.request_bytes_max.min(l.request_bytes_max),
            response_bytes_max: a.response_bytes_max.min(l.response_bytes_max),
            // A reply too big to send is too big to cache.
            response_cached_bytes_max: a
                .response_cached_bytes_max
                .min(a.response_bytes_max)
                .min(l.response_cached_bytes_max),
            ops_max: a.ops_max.clamp(1, l.ops_per_compound_max),
            requests_max: a.requests_max.clamp(1, l.slots_per_session_max),
        }
    }

    fn remove_session(&mut self, id: &SessionId) -> Option<Session> {
        let s = self.sessions.remove(id)?;
        let charged = u64::from(s.fore.response_cached_bytes_max).max(1) * s.slots.len() as u64;
        self.reply_cache_bytes -= charged;
        Some(s)
    }

    /// DESTROY_SESSION (§18.37).
    pub fn destroy_session(&mut self, id: &SessionId) -> StateResult<()> {
        let s = self.remove_session(id).ok_or(StateError::BadSession)?;
        if let Some(c) = self.clients.get_mut(&s.clientid) {
            c.sessions.retain(|x| x != id);
        }
        Ok(())
    }

    /// DESTROY_CLIENTID (§18.50): only a client without sessions or state.
    pub fn destroy_clientid(&mut self, clientid: ClientId) -> StateResult<()> {
        let c = self.clients.get(&clientid).ok_or(StateError::StaleClientId)?;
        if !c.sessions.is_empty() || self.states.values().any(|s| s.clientid == clientid) {
            return Err(StateError::ClientIdBusy);
        }
        self.expire_client(clientid, false);
        Ok(())
    }

    /// RECLAIM_COMPLETE (§18.51) for the whole client.
    pub fn reclaim_complete(&mut self, clientid: ClientId) -> StateResult<()> {
        let c = self.client_mut(clientid)?;
        if c.reclaim_complete {
            return Err(StateError::CompleteAlready);
        }
        c.reclaim_complete = true;
        let owner = c.owner.clone();
        if let Some(r) = self.reclaimable.as_mut() {
            r.remove(&owner);
            if r.is_empty() {
                // Every client that could reclaim has: no one waits for grace.
                self.grace_lifted = true;
            }
        }
        Ok(())
    }

    pub fn client_exists(&self, clientid: ClientId) -> bool {
        self.clients.contains_key(&clientid)
    }

    // ---- sessions and slots (§2.10.6, §18.46) ----

    pub fn session(&self, id: &SessionId) -> StateResult<&Session> {
        self.sessions.get(id).ok_or(StateError::BadSession)
    }

    /// BIND_CONN_TO_SESSION (§18.34).
    pub fn bind_conn(&mut self, id: &SessionId, conn: u64) -> StateResult<()> {
        let s = self.sessions.get_mut(id).ok_or(StateError::BadSession)?;
        if !s.conns.contains(&conn) {
            // Bounded: one entry per connection of this session, capped at the slot count.
            if s.conns.len() >= CONNS_PER_SESSION_MAX {
                s.conns.remove(0);
            }
            s.conns.push(conn);
        }
        Ok(())
    }

    /// BIND_CONN_TO_SESSION with a direction, and CREATE_SESSION with
    /// CONN_BACK_CHAN (§18.34.3, §18.36.3): `back` adds the connection to
    /// the back channel, `!back` takes it off (a fore-only binding).
    pub fn bind_conn_dir(&mut self, id: &SessionId, conn: u64, back: bool) -> StateResult<()> {
        self.bind_conn(id, conn)?;
        let b = &mut self.sessions.get_mut(id).ok_or(StateError::BadSession)?.back_chan;
        b.conns.retain(|c| *c != conn);
        if back {
            if b.conns.len() >= CONNS_PER_SESSION_MAX {
                b.conns.remove(0);
            }
            b.conns.push(conn);
        }
        Ok(())
    }

    /// CREATE_SESSION: the minor version the session was created in.
    pub fn set_session_minor(&mut self, id: &SessionId, minor: u32) -> StateResult<()> {
        self.sessions.get_mut(id).ok_or(StateError::BadSession)?.minor = minor;
        Ok(())
    }

    /// CREATE_SESSION / BACKCHANNEL_CTL (§18.33): how to call the client.
    pub fn set_callback_sec(&mut self, id: &SessionId, program: u32, cred: Option<rpc::backchannel::CallCred>) -> StateResult<()> {
        let b = &mut self.sessions.get_mut(id).ok_or(StateError::BadSession)?.back_chan;
        b.program = program;
        b.cred = cred;
        Ok(())
    }

    /// A transport connection closed: it carries neither channel any more.
    pub fn conn_closed(&mut self, conn: u64) {
        for s in self.sessions.values_mut() {
            s.conns.retain(|c| *c != conn);
            s.back_chan.conns.retain(|c| *c != conn);
        }
    }

    fn back_usable(s: &Session) -> bool {
        !s.back_chan.conns.is_empty() && s.back_chan.cred.is_some()
    }

    /// SEQ4_STATUS_CB_PATH_DOWN[_SESSION] bits for a SEQUENCE on `id`
    /// (§18.46.3): this session, and all of its client's sessions, without
    /// a usable back channel.
    pub fn cb_path_flags(&self, id: &SessionId) -> u32 {
        let Some(s) = self.sessions.get(id) else { return 0 };
        let mut flags = 0;
        if !Self::back_usable(s) {
            flags |= proto::nfs4::SEQ4_STATUS_CB_PATH_DOWN_SESSION;
        }
        let any = self
            .clients
            .get(&s.clientid)
            .is_some_and(|c| c.sessions.iter().any(|sid| self.sessions.get(sid).is_some_and(Self::back_usable)));
        if !any {
            flags |= proto::nfs4::SEQ4_STATUS_CB_PATH_DOWN;
        }
        flags
    }

    /// Take a callback slot on a usable back channel of `clientid` (the
    /// most recently bound connection of the first session that has a free
    /// slot) and advance its sequence id.
    pub fn cb_begin(&mut self, clientid: ClientId) -> Result<CbCall, CbBusy> {
        let c = self.clients.get(&clientid).ok_or(CbBusy::NoBackChannel)?;
        let mut usable = false;
        for sid in &c.sessions {
            let Some(s) = self.sessions.get_mut(sid) else { continue };
            if !Self::back_usable(s) {
                continue;
            }
            usable = true;
            let b = &mut s.back_chan;
            let Some(i) = b.slots.iter().position(|x| !x.busy) else { continue };
            let slot = &mut b.slots[i];
            slot.busy = true;
            // Sequence ids skip 0 when they wrap (§2.10.6.1).
            slot.seqid = if slot.seqid == u32::MAX { 1 } else { slot.seqid + 1 };
            return Ok(CbCall {
                session: s.id,
                slot: i as u32,
                seqid: slot.seqid,
                highest_slot: b.slots.len() as u32 - 1,
                conn: *b.conns.last().expect("usable has a connection"),
                program: b.program,
                cred: b.cred.clone().expect("usable has a credential"),
                request_bytes_max: s.back.request_bytes_max,
                ops_max: s.back.ops_max,
                minor: s.minor,
            });
        }
        Err(if usable { CbBusy::SlotsBusy } else { CbBusy::NoBackChannel })
    }

    /// Release a slot taken by `cb_begin`. `outcome`: Some(true) the client
    /// executed CB_SEQUENCE; Some(false) it refused it (the sequence id was
    /// not consumed: step back); None no reply (timeout: unknown).
    pub fn cb_end(&mut self, session: &SessionId, slot: u32, outcome: Option<bool>) {
        let Some(s) = self.sessions.get_mut(session) else { return };
        let Some(x) = s.back_chan.slots.get_mut(slot as usize) else { return };
        x.busy = false;
        match outcome {
            Some(true) => x.uncertain = false,
            Some(false) => {
                x.seqid = if x.seqid <= 1 { 0 } else { x.seqid - 1 };
                x.uncertain = false;
            }
            None => x.uncertain = true,
        }
    }

    /// After a timeout the client turned out never to have seen the lost
    /// call (it answered the next one SEQ_MISORDERED): step the slot back
    /// over the lost sequence id too, so the next call reuses it.
    pub fn cb_resync(&mut self, session: &SessionId, slot: u32) {
        let Some(s) = self.sessions.get_mut(session) else { return };
        let Some(x) = s.back_chan.slots.get_mut(slot as usize) else { return };
        assert!(!x.busy, "resync of a slot in use");
        x.seqid = x.seqid.saturating_sub(1);
    }

    /// Was the last call on this slot a timeout (see `cb_end`)?
    pub fn cb_uncertain(&self, session: &SessionId, slot: u32) -> bool {
        self.sessions.get(session).and_then(|s| s.back_chan.slots.get(slot as usize)).is_some_and(|x| x.uncertain)
    }

    /// The slot check of SEQUENCE (§2.10.6.1). `Ok(false)`: execute the
    /// request (the slot is now busy; finish with `sequence_end`).
    /// `Ok(true)`: a retransmission whose cached reply `cached_reply` returns.
    pub fn sequence_begin(
        &mut self,
        id: &SessionId,
        slotid: u32,
        seqid: u32,
        conn: u64,
        now_ms: u64,
    ) -> StateResult<bool> {
        let s = self.sessions.get_mut(id).ok_or(StateError::BadSession)?;
        let slot = s.slots.get_mut(slotid as usize).ok_or(StateError::BadSlot)?;
        let replay = if seqid == slot.seqid.wrapping_add(1) {
            slot.seqid = seqid;
            slot.busy = true;
            slot.cached = false;
            slot.reply.clear();
            false
        } else if seqid == slot.seqid && slot.seqid != 0 {
            if slot.busy {
                return Err(StateError::Delay);
            }
            if !slot.cached {
                return Err(StateError::RetryUncachedRep);
            }
            true
        } else {
            return Err(StateError::SeqMisordered);
        };
        // SP4_NONE: a connection is bound implicitly by using it (§2.10.3.1).
        if !s.conns.contains(&conn) {
            if s.conns.len() >= 64 {
                s.conns.remove(0);
            }
            s.conns.push(conn);
        }
        let clientid = s.clientid;
        if let Some(c) = self.clients.get_mut(&clientid) {
            c.renewed_ms = now_ms;
        }
        Ok(replay)
    }

    /// The cached reply of a slot (valid after `sequence_begin` returned true).
    pub fn cached_reply(&self, id: &SessionId, slotid: u32) -> Option<&[u8]> {
        let s = self.sessions.get(id)?;
        let slot = s.slots.get(slotid as usize)?;
        slot.cached.then_some(&slot.reply[..])
    }

    /// Finish a request started by `sequence_begin`: free the slot and keep
    /// `reply` for retransmissions if given (it must fit the negotiated cache
    /// size; the caller has checked). Tolerates a session destroyed meanwhile.
    pub fn sequence_end(&mut self, id: &SessionId, slotid: u32, reply: Option<&[u8]>) {
        let Some(s) = self.sessions.get_mut(id) else { return };
        let cache_max = s.fore.response_cached_bytes_max as usize;
        let Some(slot) = s.slots.get_mut(slotid as usize) else { return };
        slot.busy = false;
        if let Some(r) = reply {
            assert!(r.len() <= cache_max, "cached reply larger than negotiated");
            slot.reply.clear();
            slot.reply.extend_from_slice(r);
            slot.cached = true;
        }
    }

    // ---- leases (§8.3) ----

    /// Expire every client whose lease ran out: its sessions, opens and locks
    /// are freed and its stateids answer NFS4ERR_EXPIRED from now on.
    /// Returns how many clients expired.
    pub fn reap(&mut self, now_ms: u64) -> usize {
        let lease = self.lease_ms();
        let dead: Vec<ClientId> = self
            .clients
            .values()
            .filter(|c| now_ms.saturating_sub(c.renewed_ms) > lease)
            .map(|c| c.id)
            .collect();
        for id in &dead {
            self.expire_client(*id, true);
        }
        self.revoke_overdue(now_ms);
        dead.len()
    }

    fn expire_client(&mut self, clientid: ClientId, remember: bool) {
        let Some(c) = self.clients.remove(&clientid) else { return };
        // During a reboot two records share the owner; the index names the newer.
        if self.by_owner.get(&c.owner) == Some(&clientid) {
            self.by_owner.remove(&c.owner);
            if c.confirmed {
                // Its state is gone: it may not reclaim after a restart.
                self.record_changes.push((c.owner.clone(), false));
            }
        }
        for sid in &c.sessions {
            self.remove_session(sid);
        }
        let keys: Vec<u64> =
            self.states.iter().filter(|(_, s)| s.clientid == clientid).map(|(k, _)| *k).collect();
        for k in keys {
            self.drop_state(k);
            if remember {
                self.remember_expired(k);
            }
        }
    }

    fn remember_expired(&mut self, key: u64) {
        if self.limits.expired_remembered_max == 0 {
            return;
        }
        while self.expired_order.len() >= self.limits.expired_remembered_max {
            if let Some(old) = self.expired_order.pop_front() {
                self.expired.remove(&old);
            }
        }
        self.expired.insert(key);
        self.expired_order.push_back(key);
    }

    // ---- stateids (§8.2) ----

    fn stateid_of(&self, key: u64) -> Stateid {
        let rec = &self.states[&key];
        let mut other = [0u8; 12];
        other[..4].copy_from_slice(&self.boot_epoch.to_be_bytes());
        other[4..].copy_from_slice(&key.to_be_bytes());
        Stateid { seqid: rec.seqid, other }
    }

    /// Find the state a non-special stateid names, checking its instance,
    /// owner client and seqid (§8.2.2: seqid 0 means "the current one").
    fn lookup(&self, clientid: ClientId, sid: &Stateid) -> StateResult<u64> {
        if sid.is_special() {
            return Err(StateError::BadStateid);
        }
        let epoch = u32::from_be_bytes(sid.other[..4].try_into().unwrap());
        let key = u64::from_be_bytes(sid.other[4..].try_into().unwrap());
        if epoch != self.boot_epoch {
            return Err(StateError::StaleStateid);
        }
        let Some(rec) = self.states.get(&key) else {
            return Err(if self.expired.contains(&key) {
                StateError::Expired
            } else if self.clients.get(&clientid).is_some_and(|c| c.revoked.contains(&key)) {
                StateError::DelegRevoked
            } else {
                StateError::BadStateid
            });
        };
        if rec.clientid != clientid {
            return Err(StateError::BadStateid);
        }
        if sid.seqid != 0 {
            if sid.seqid > rec.seqid {
                return Err(StateError::BadStateid);
            }
            if sid.seqid < rec.seqid {
                return Err(StateError::OldStateid);
            }
        }
        Ok(key)
    }

    fn new_state(&mut self, clientid: ClientId, fh: FileHandle, kind: Kind) -> StateResult<u64> {
        if self.states.len() >= self.limits.stateids_max {
            return Err(StateError::Resource);
        }
        let key = self.next_state;
        self.next_state += 1;
        let is_open = matches!(kind, Kind::Open { .. });
        let is_deleg = matches!(kind, Kind::Deleg { .. });
        self.states.insert(key, StateRec { clientid, fh, seqid: 1, kind });
        if is_open {
            self.files.entry(fh).or_default().opens.push(key);
        }
        if is_deleg {
            self.files.entry(fh).or_default().delegs.push(key);
            self.deleg_gauge.fetch_add(1, Ordering::Relaxed);
        }
        Ok(key)
    }

    fn bump(&mut self, key: u64) -> Stateid {
        let rec = self.states.get_mut(&key).expect("bump of a live state");
        // seqid 0 is reserved (§8.2.2): wrap from u32::MAX to 1.
        rec.seqid = if rec.seqid == u32::MAX { 1 } else { rec.seqid + 1 };
        self.stateid_of(key)
    }

    /// Remove a state and everything hanging off it (an open's lock states).
    fn drop_state(&mut self, key: u64) {
        let Some(rec) = self.states.remove(&key) else { return };
        if let Kind::Open { .. } = rec.kind {
            let children: Vec<u64> = self
                .states
                .iter()
                .filter(|(_, s)| matches!(s.kind, Kind::Lock { open, .. } if open == key))
                .map(|(k, _)| *k)
                .collect();
            for c in children {
                self.drop_state(c);
            }
        }
        if let Kind::Deleg { recalled_ms, .. } = rec.kind {
            self.deleg_gauge.fetch_sub(1, Ordering::Relaxed);
            if recalled_ms.is_some() {
                self.recalling.retain(|k| *k != key);
            }
        }
        if let Some(f) = self.files.get_mut(&rec.fh) {
            f.opens.retain(|k| *k != key);
            f.delegs.retain(|k| *k != key);
            let before = f.locks.len();
            f.locks.retain(|l| l.state != key);
            self.locks_total -= before - f.locks.len();
            // The backend's open reference is for opens: it goes with the last.
            if f.opens.is_empty() && f.pinned {
                f.pinned = false;
                self.unpins.push(rec.fh);
            }
            if f.opens.is_empty() && f.locks.is_empty() && f.delegs.is_empty() {
                self.files.remove(&rec.fh);
            }
        }
    }

    // ---- open references in the backend (OPEN4_RESULT_PRESERVE_UNLINKED) ----

    /// Does the backend hold an open reference for `fh`'s opens?
    pub fn is_pinned(&self, fh: &FileHandle) -> bool {
        self.files.get(fh).is_some_and(|f| f.pinned)
    }

    /// Record that the caller pinned `fh` in the backend for its opens
    /// (after a successful `open`, under the same lock). Its last open
    /// going away, by whatever path, queues it for `take_unpins`.
    pub fn set_pinned(&mut self, fh: &FileHandle) {
        let f = self.files.get_mut(fh).expect("set_pinned after a successful open");
        debug_assert!(!f.pinned && !f.opens.is_empty());
        f.pinned = true;
    }

    /// Whether files await their unpin (cheap; no allocation).
    pub fn unpins_pending(&self) -> bool {
        !self.unpins.is_empty()
    }

    /// Files whose last open went since the last call: each was pinned
    /// once and must be unpinned once in the backend. Every path that drops
    /// opens (CLOSE, the reaper, a replaced or collided client record)
    /// funnels through `drop_state`, which queues here.
    pub fn take_unpins(&mut self) -> Vec<FileHandle> {
        std::mem::take(&mut self.unpins)
    }

    /// Validate a stateid used for I/O on `fh` (READ, WRITE, SETATTR size).
    /// The anonymous and bypass stateids are accepted outside grace.
    pub fn check_io(
        &self,
        clientid: Option<ClientId>,
        sid: &Stateid,
        fh: &FileHandle,
        now_ms: u64,
    ) -> StateResult<Validated> {
        if *sid == Stateid::ANONYMOUS || *sid == Stateid::BYPASS {
            // Anonymous I/O could conflict with state not yet reclaimed.
            self.check_not_grace(now_ms)?;
            return Ok(Validated { key: None, access: SHARE_BOTH });
        }
        let clientid = clientid.ok_or(StateError::BadStateid)?;
        let key = self.lookup(clientid, sid)?;
        let rec = &self.states[&key];
        if rec.fh != *fh {
            return Err(StateError::BadStateid);
        }
        let access = match &rec.kind {
            Kind::Open { access, .. } => *access,
            Kind::Lock { open, .. } => match self.states.get(open) {
                Some(StateRec { kind: Kind::Open { access, .. }, .. }) => *access,
                _ => return Err(StateError::BadStateid),
            },
            // I/O under a delegation stateid (§9.1.3): a write delegation
            // covers both, a read delegation reads.
            Kind::Deleg { write: true, .. } => SHARE_BOTH,
            Kind::Deleg { write: false, .. } => SHARE_READ,
        };
        Ok(Validated { key: Some(key), access })
    }

    /// TEST_STATEID (§18.48) for one stateid.
    pub fn test_stateid(&self, clientid: ClientId, sid: &Stateid) -> StateResult<()> {
        self.lookup(clientid, sid).map(|_| ())
    }

    /// FREE_STATEID (§18.38): a lock stateid without locks; anything else is busy.
    /// A revoked delegation's stateid is forgotten (§8.2.4, §18.38.3).
    pub fn free_stateid(&mut self, clientid: ClientId, sid: &Stateid) -> StateResult<()> {
        let key = match self.lookup(clientid, sid) {
            Err(StateError::DelegRevoked) => {
                let key = u64::from_be_bytes(sid.other[4..].try_into().unwrap());
                if let Some(c) = self.clients.get_mut(&clientid) {
                    c.revoked.retain(|k| *k != key);
                }
                return Ok(());
            }
            r => r?,
        };
        let rec = &self.states[&key];
        match rec.kind {
            // A live delegation is returned with DELEGRETURN, not freed.
            Kind::Open { .. } | Kind::Deleg { .. } => Err(StateError::LocksHeld),
            Kind::Lock { .. } => {
                let held = self.files.get(&rec.fh).is_some_and(|f| f.locks.iter().any(|l| l.state == key));
                if held {
                    return Err(StateError::LocksHeld);
                }
                self.drop_state(key);
                Ok(())
            }
        }
    }

    // ---- opens and share reservations (§9.7, §18.16) ----

    /// OPEN: create or upgrade the open state of (`clientid`, `owner`) on
    /// `fh`. `reclaim` is CLAIM_PREVIOUS, allowed only during grace; other
    /// opens are refused during grace and before RECLAIM_COMPLETE
    /// (`check_locking`).
    #[allow(clippy::too_many_arguments)] // mirrors OPEN4args
    pub fn open(
        &mut self,
        clientid: ClientId,
        owner: &[u8],
        fh: FileHandle,
        access: u32,
        deny: u32,
        reclaim: bool,
        now_ms: u64,
    ) -> StateResult<Stateid> {
        if access == 0 || access > SHARE_BOTH || deny > SHARE_BOTH {
            return Err(StateError::Inval);
        }
        self.check_locking(clientid, reclaim, now_ms)?;
        let mut mine = None;
        if let Some(f) = self.files.get(&fh) {
            for k in &f.opens {
                let rec = &self.states[k];
                let Kind::Open { owner: o, access: a, deny: d } = &rec.kind else { continue };
                if rec.clientid == clientid && o[..] == *owner {
                    mine = Some(*k);
                    continue;
                }
                if a & deny != 0 || d & access != 0 {
                    return Err(StateError::ShareDenied);
                }
            }
        }
        let key = match mine {
            Some(k) => {
                if let Some(StateRec { kind: Kind::Open { access: a, deny: d, .. }, .. }) =
                    self.states.get_mut(&k)
                {
                    *a |= access;
                    *d |= deny;
                }
                return Ok(self.bump(k));
            }
            None => self.new_state(
                clientid,
                fh,
                Kind::Open { owner: owner.to_vec(), access, deny },
            )?,
        };
        Ok(self.stateid_of(key))
    }

    /// OPEN_DOWNGRADE (§18.18): the new modes must be a subset of the current.
    pub fn open_downgrade(
        &mut self,
        clientid: ClientId,
        sid: &Stateid,
        access: u32,
        deny: u32,
    ) -> StateResult<Stateid> {
        let key = self.lookup(clientid, sid)?;
        let Some(StateRec { kind: Kind::Open { access: a, deny: d, .. }, .. }) = self.states.get_mut(&key)
        else {
            return Err(StateError::BadStateid);
        };
        if access == 0 || access & !*a != 0 || deny & !*d != 0 {
            return Err(StateError::Inval);
        }
        *a = access;
        *d = deny;
        Ok(self.bump(key))
    }

    /// CLOSE (§18.2): refuses while byte-range locks are held under this open.
    pub fn close(&mut self, clientid: ClientId, sid: &Stateid) -> StateResult<Stateid> {
        let key = self.lookup(clientid, sid)?;
        let rec = &self.states[&key];
        if !matches!(rec.kind, Kind::Open { .. }) {
            return Err(StateError::BadStateid);
        }
        let held = self.files.get(&rec.fh).is_some_and(|f| {
            f.locks.iter().any(|l| {
                matches!(self.states.get(&l.state), Some(StateRec { kind: Kind::Lock { open, .. }, .. }) if *open == key)
            })
        });
        if held {
            return Err(StateError::LocksHeld);
        }
        self.drop_state(key);
        Ok(Stateid::INVALID)
    }

    /// Number of open and lock stateids held (tests, metrics).
    pub fn stateid_count(&self) -> usize {
        self.states.len()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    /// Replay-cache memory reserved by all sessions (tests, metrics).
    pub fn reply_cache_bytes(&self) -> u64 {
        self.reply_cache_bytes
    }

    // ---- byte-range locks (§9.2, §18.10–18.12) ----

    fn lock_owner_of(&self, key: u64) -> (ClientId, &[u8]) {
        let rec = &self.states[&key];
        match &rec.kind {
            Kind::Lock { owner, .. } => (rec.clientid, owner),
            Kind::Open { owner, .. } => (rec.clientid, owner),
            Kind::Deleg { .. } => (rec.clientid, &[]),
        }
    }

    /// First lock on `fh` held by someone other than (`clientid`, `owner`)
    /// that conflicts with [start, last] of `kind`.
    fn find_conflict(
        &self,
        fh: &FileHandle,
        clientid: ClientId,
        owner: &[u8],
        kind: LockKind,
        start: u64,
        last: u64,
    ) -> Option<Conflict> {
        let f = self.files.get(fh)?;
        f.locks.iter().find_map(|l| {
            let (c, o) = self.lock_owner_of(l.state);
            let same = c == clientid && o == owner;
            let overlap = l.start <= last && start <= l.last;
            let exclusive = kind == LockKind::Write || l.kind == LockKind::Write;
            (!same && overlap && exclusive).then(|| Conflict {
                offset: l.start,
                length: range_length(l.start, l.last),
                kind: l.kind,
                clientid: c,
                owner: o.to_vec(),
            })
        })
    }

    /// LOCK (§18.10). Returns the lock stateid (seqid bumped when it existed).
    #[allow(clippy::too_many_arguments)]
    pub fn lock(
        &mut self,
        clientid: ClientId,
        fh: &FileHandle,
        locker: Locker<'_>,
        kind: LockKind,
        offset: u64,
        length: u64,
        reclaim: bool,
        now_ms: u64,
    ) -> Result<Stateid, LockError> {
        let last = range_last(offset, length)?;
        self.check_locking(clientid, reclaim, now_ms)?;
        // Resolve (or prepare) the lock state and the open it hangs off.
        let (existing, open_key, owner) = match locker {
            Locker::New { open_stateid, owner } => {
                let open = self.lookup(clientid, &open_stateid)?;
                if !matches!(self.states[&open].kind, Kind::Open { .. }) {
                    return Err(StateError::BadStateid.into());
                }
                // One lock stateid per (lock-owner, file) (§8.2): a lock-owner
                // reached through another open of the same file reuses it.
                let found = self.states.iter().find_map(|(k, s)| match &s.kind {
                    Kind::Lock { owner: w, .. } if s.clientid == clientid && s.fh == *fh && w[..] == *owner => {
                        Some(*k)
                    }
                    _ => None,
                });
                (found, open, owner.to_vec())
            }
            Locker::Existing { lock_stateid } => {
                let k = self.lookup(clientid, &lock_stateid)?;
                match &self.states[&k].kind {
                    Kind::Lock { open, owner } => (Some(k), *open, owner.clone()),
                    Kind::Open { .. } | Kind::Deleg { .. } => return Err(StateError::BadStateid.into()),
                }
            }
        };
        let open_rec = &self.states[&open_key];
        if open_rec.fh != *fh {
            return Err(StateError::BadStateid.into());
        }
        let Kind::Open { access, .. } = open_rec.kind else { unreachable!() };
        let needed = if kind == LockKind::Write { SHARE_WRITE } else { SHARE_READ };
        if access & needed == 0 {
            return Err(StateError::OpenMode.into());
        }
        if let Some(c) = self.find_conflict(fh, clientid, &owner, kind, offset, last) {
            return Err(LockError::Denied(c));
        }
        if self.locks_total + 2 > self.limits.locks_max {
            return Err(StateError::Resource.into());
        }
        let key = match existing {
            Some(k) => k,
            None => self.new_state(clientid, *fh, Kind::Lock { open: open_key, owner })?,
        };
        // POSIX semantics for the owner's own ranges: the new lock replaces
        // whatever it overlaps (upgrade, downgrade, split).
        self.unlock_range(fh, key, offset, last);
        let f = self.files.entry(*fh).or_default();
        f.locks.push(LockRange { state: key, kind, start: offset, last });
        self.locks_total += 1;
        Ok(if existing.is_some() { self.bump(key) } else { self.stateid_of(key) })
    }

    /// Remove [start, last] from the ranges held by lock state `key`,
    /// splitting ranges that straddle it.
    fn unlock_range(&mut self, fh: &FileHandle, key: u64, start: u64, last: u64) {
        let Some(f) = self.files.get_mut(fh) else { return };
        let before_len = f.locks.len();
        let mut kept = Vec::with_capacity(before_len + 1);
        for l in f.locks.drain(..) {
            if l.state != key || l.last < start || last < l.start {
                kept.push(l);
                continue;
            }
            if l.start < start {
                kept.push(LockRange { last: start - 1, ..l.clone() });
            }
            if last < l.last {
                kept.push(LockRange { start: last + 1, ..l.clone() });
            }
        }
        self.locks_total = self.locks_total + kept.len() - before_len;
        f.locks = kept;
    }

    /// LOCKT (§18.11): would this lock be granted?
    #[allow(clippy::too_many_arguments)] // mirrors LOCKT4args
    pub fn lockt(
        &self,
        clientid: ClientId,
        fh: &FileHandle,
        owner: &[u8],
        kind: LockKind,
        offset: u64,
        length: u64,
        now_ms: u64,
    ) -> Result<(), LockError> {
        let last = range_last(offset, length)?;
        self.check_not_grace(now_ms)?;
        match self.find_conflict(fh, clientid, owner, kind, offset, last) {
            Some(c) => Err(LockError::Denied(c)),
            None => Ok(()),
        }
    }

    /// LOCKU (§18.12).
    pub fn locku(
        &mut self,
        clientid: ClientId,
        fh: &FileHandle,
        sid: &Stateid,
        offset: u64,
        length: u64,
    ) -> StateResult<Stateid> {
        let last = range_last(offset, length)?;
        let key = self.lookup(clientid, sid)?;
        let rec = &self.states[&key];
        if !matches!(rec.kind, Kind::Lock { .. }) || rec.fh != *fh {
            return Err(StateError::BadStateid);
        }
        self.unlock_range(fh, key, offset, last);
        Ok(self.bump(key))
    }

    /// Locks currently held on `fh` (tests).
    pub fn lock_count(&self, fh: &FileHandle) -> usize {
        self.files.get(fh).map_or(0, |f| f.locks.len())
    }

    /// Check every cross-table invariant; panics naming the broken one.
    /// Used by the randomized tests after each step.
    pub fn assert_invariants(&self) {
        let locks: usize = self.files.values().map(|f| f.locks.len()).sum();
        assert_eq!(locks, self.locks_total, "locks_total matches the lock table");
        let charged: u64 = self
            .sessions
            .values()
            .map(|s| u64::from(s.fore.response_cached_bytes_max).max(1) * s.slots.len() as u64)
            .sum();
        assert_eq!(charged, self.reply_cache_bytes, "replay-cache charge matches the sessions");
        assert!(self.reply_cache_bytes <= self.limits.reply_cache_bytes_max);
        for (fh, f) in &self.files {
            assert!(!f.opens.is_empty() || !f.locks.is_empty() || !f.delegs.is_empty(), "empty file entries are dropped");
            for k in &f.delegs {
                let rec = self.states.get(k).expect("delegation in file table exists");
                assert!(matches!(rec.kind, Kind::Deleg { .. }) && rec.fh == *fh);
            }
            assert!(!f.pinned || !f.opens.is_empty(), "a pinned file has opens");
            for k in &f.opens {
                let rec = self.states.get(k).expect("open in file table exists");
                assert!(matches!(rec.kind, Kind::Open { .. }) && rec.fh == *fh);
            }
            for (i, a) in f.locks.iter().enumerate() {
                let rec = self.states.get(&a.state).expect("lock range's state exists");
                assert!(matches!(rec.kind, Kind::Lock { .. }) && rec.fh == *fh);
                assert!(a.start <= a.last);
                for b in &f.locks[i + 1..] {
                    let overlap = a.start <= b.last && b.start <= a.last;
                    if !overlap {
                        continue;
                    }
                    let same = self.lock_owner_of(a.state) == self.lock_owner_of(b.state);
                    assert!(!same, "one owner's ranges never overlap (they are merged/split)");
                    assert!(a.kind == LockKind::Read && b.kind == LockKind::Read, "conflicting locks coexist");
                }
            }
        }
        let delegs = self.states.values().filter(|r| matches!(r.kind, Kind::Deleg { .. })).count();
        assert_eq!(delegs, self.deleg_gauge.load(Ordering::Relaxed), "delegation gauge matches the table");
        for k in &self.recalling {
            assert!(matches!(self.states.get(k), Some(StateRec { kind: Kind::Deleg { recalled_ms: Some(_), .. }, .. })));
        }
        for (k, rec) in &self.states {
            assert!(self.clients.contains_key(&rec.clientid), "state {k} outlived its client");
            if let Kind::Lock { open, .. } = rec.kind {
                assert!(self.states.contains_key(&open), "lock state {k} outlived its open");
            }
        }
        for (id, s) in &self.sessions {
            let c = self.clients.get(&s.clientid).expect("session's client exists");
            assert!(c.sessions.contains(id));
        }
        for (owner, id) in &self.by_owner {
            assert_eq!(&self.clients[id].owner, owner);
        }
    }
}

fn negotiate_back(a: &ChannelAttrs) -> ChannelAttrs {
    // The client's values are echoed: the Linux client refuses a session
    // whose back-channel ops/requests differ from what it asked for or
    // whose response size is smaller. Our use is bounded separately: at most
    // CB_SLOTS_MAX callback slots, and every CB_COMPOUND is checked against
    // ca_maxrequestsize / ca_maxoperations. We cache no callback replies.
    ChannelAttrs { headerpad_bytes: 0, response_cached_bytes_max: 0, ..*a }
}

#[cfg(test)]
mod tests {
    //! Proves the state machine's rules in isolation: client confirmation,
    //! CREATE_SESSION replay, slot sequencing and the reply cache, stateid
    //! seqids, share reservations, lock conflicts and splitting, lease expiry
    //! freeing everything, and the grace period.
    use super::*;

    const FH: FileHandle = FileHandle { export_id: 1, ino: 10, generation: 1 };
    const FH2: FileHandle = FileHandle { export_id: 1, ino: 11, generation: 1 };

    fn attrs() -> ChannelAttrs {
        ChannelAttrs {
            headerpad_bytes: 0,
            request_bytes_max: 1 << 20,
            response_bytes_max: 1 << 20,
            response_cached_bytes_max: 4096,
            ops_max: 8,
            requests_max: 4,
        }
    }

    fn no_grace() -> Limits {
        Limits { grace_time_s: 0, lease_time_s: 10, ..Limits::default() }
    }

    /// A confirmed client with one session, at time 0.
    fn setup(st: &mut State, owner: &[u8]) -> (ClientId, SessionId) {
        setup_at(st, owner, 0)
    }

    fn setup_at(st: &mut State, owner: &[u8], now: u64) -> (ClientId, SessionId) {
        let x = st.exchange_id(owner, [1; 8], 0, false, now).unwrap();
        assert!(!x.confirmed);
        let cs = st.create_session(x.clientid, x.sequence, 0, 0, true, attrs(), attrs(), 0x4000_0000, now).unwrap();
        if !st.in_grace(now) {
            // What every client does first (§18.51.3); during grace the
            // tests reclaim before it.
            st.reclaim_complete(x.clientid).unwrap();
        }
        (x.clientid, cs.id)
    }

    #[test]
    fn exchange_id_cases() {
        let mut st = State::new(no_grace(), 7, 0);
        let a = st.exchange_id(b"alice", [1; 8], 0, false, 0).unwrap();
        // Unconfirmed retry replaces the record.
        let a2 = st.exchange_id(b"alice", [1; 8], 0, false, 0).unwrap();
        assert_ne!(a.clientid, a2.clientid);
        assert_eq!(st.client_count(), 1);
        assert_eq!(st.create_session(a.clientid, 1, 0, 0, true, attrs(), attrs(), 0, 0), Err(StateError::StaleClientId));
        st.create_session(a2.clientid, a2.sequence, 0, 0, true, attrs(), attrs(), 0, 0).unwrap();
        // Confirmed + same verifier: same clientid, confirmed flag.
        let a3 = st.exchange_id(b"alice", [1; 8], 0, false, 0).unwrap();
        assert_eq!(a3.clientid, a2.clientid);
        assert!(a3.confirmed);
        assert_eq!(a3.sequence, 2);
        // Update with the wrong verifier is refused.
        assert_eq!(st.exchange_id(b"alice", [2; 8], 0, true, 0), Err(StateError::NotSame));
        assert_eq!(st.exchange_id(b"bob", [2; 8], 0, true, 0), Err(StateError::NoEnt));
        // A reboot (new verifier) gives a new client; the old one keeps its
        // session and state until the new one is confirmed.
        st.reclaim_complete(a2.clientid).unwrap();
        let o = st.open(a2.clientid, b"o", FH, SHARE_READ, 0, false, 0).unwrap();
        let a4 = st.exchange_id(b"alice", [9; 8], 0, false, 0).unwrap();
        assert_ne!(a4.clientid, a2.clientid);
        assert!(!a4.confirmed);
        assert_eq!(st.session_count(), 1);
        assert!(st.test_stateid(a2.clientid, &o).is_ok());
        st.assert_invariants();
        // Retried before confirmation: still one replacement pending.
        let a5 = st.exchange_id(b"alice", [9; 8], 0, false, 0).unwrap();
        st.create_session(a5.clientid, a5.sequence, 0, 0, true, attrs(), attrs(), 0, 0).unwrap();
        assert!(!st.client_exists(a2.clientid) && !st.client_exists(a4.clientid));
        assert_eq!(st.test_stateid(a2.clientid, &o), Err(StateError::BadStateid));
        assert_eq!(st.session_count(), 1);
        assert_eq!(st.client_count(), 1);
        st.assert_invariants();
    }

    #[test]
    fn create_session_replay_and_misorder() {
        let mut st = State::new(no_grace(), 7, 0);
        let x = st.exchange_id(b"c", [1; 8], 0, false, 0).unwrap();
        let big = ChannelAttrs { requests_max: 10_000, ops_max: 10_000, response_cached_bytes_max: u32::MAX, ..attrs() };
        let s1 = st.create_session(x.clientid, 1, 0, 0, true, big, big, 0, 0).unwrap();
        assert_eq!(s1.fore.requests_max, Limits::default().slots_per_session_max);
        assert_eq!(s1.fore.ops_max, Limits::default().ops_per_compound_max);
        assert_eq!(s1.fore.response_cached_bytes_max, Limits::default().response_cached_bytes_max);
        let again = st.create_session(x.clientid, 1, 0, 0, true, big, big, 0, 0).unwrap();
        assert_eq!(again, s1, "replay returns the same session");
        assert_eq!(st.session_count(), 1);
        assert_eq!(st.create_session(x.clientid, 5, 0, 0, true, big, big, 0, 0), Err(StateError::SeqMisordered));
        let s2 = st.create_session(x.clientid, 2, 0, 0, true, big, big, 0, 0).unwrap();
        assert_ne!(s2.id, s1.id);
        assert_eq!(st.destroy_clientid(x.clientid), Err(StateError::ClientIdBusy));
        st.destroy_session(&s1.id).unwrap();
        st.destroy_session(&s2.id).unwrap();
        assert_eq!(st.destroy_session(&s2.id), Err(StateError::BadSession));
        st.destroy_clientid(x.clientid).unwrap();
        assert_eq!(st.destroy_clientid(x.clientid), Err(StateError::StaleClientId));
    }

    #[test]
    fn slots_sequence_and_replay_cache() {
        let mut st = State::new(no_grace(), 7, 0);
        let (_, sid) = setup(&mut st, b"c");
        assert_eq!(st.sequence_begin(&sid, 9, 1, 1, 0), Err(StateError::BadSlot));
        assert_eq!(st.sequence_begin(&sid, 0, 2, 1, 0), Err(StateError::SeqMisordered));
        assert_eq!(st.sequence_begin(&sid, 0, 0, 1, 0), Err(StateError::SeqMisordered));
        assert_eq!(st.sequence_begin(&sid, 0, 1, 1, 0), Ok(false));
        // Retransmission while the first is executing.
        assert_eq!(st.sequence_begin(&sid, 0, 1, 1, 0), Err(StateError::Delay));
        st.sequence_end(&sid, 0, Some(b"reply-1"));
        assert_eq!(st.sequence_begin(&sid, 0, 1, 1, 0), Ok(true));
        assert_eq!(st.cached_reply(&sid, 0), Some(&b"reply-1"[..]));
        // Next request, not cached: a retransmission cannot be answered.
        assert_eq!(st.sequence_begin(&sid, 0, 2, 1, 0), Ok(false));
        st.sequence_end(&sid, 0, None);
        assert_eq!(st.sequence_begin(&sid, 0, 2, 1, 0), Err(StateError::RetryUncachedRep));
        assert_eq!(st.sequence_begin(&[0; 16], 0, 1, 1, 0), Err(StateError::BadSession));
    }

    #[test]
    fn open_share_reservations_and_stateid_seqids() {
        let mut st = State::new(no_grace(), 7, 0);
        let (a, _) = setup(&mut st, b"a");
        let (b, _) = setup(&mut st, b"b");
        let s1 = st.open(a, b"o1", FH, SHARE_READ, SHARE_WRITE, false, 0).unwrap();
        assert_eq!(s1.seqid, 1);
        assert_eq!(st.open(b, b"o2", FH, SHARE_WRITE, 0, false, 0), Err(StateError::ShareDenied));
        assert_eq!(st.open(b, b"o2", FH, SHARE_READ, SHARE_READ, false, 0), Err(StateError::ShareDenied));
        st.open(b, b"o2", FH, SHARE_READ, 0, false, 0).unwrap();
        // Upgrade by the same owner: same other, seqid 2.
        let s2 = st.open(a, b"o1", FH, SHARE_BOTH, SHARE_WRITE, false, 0).unwrap();
        assert_eq!((s2.other, s2.seqid), (s1.other, 2));
        assert_eq!(st.check_io(Some(a), &s1, &FH, 0), Err(StateError::OldStateid));
        assert_eq!(st.check_io(Some(a), &Stateid { seqid: 3, ..s1 }, &FH, 0), Err(StateError::BadStateid));
        assert_eq!(st.check_io(Some(a), &Stateid { seqid: 0, ..s1 }, &FH, 0).unwrap().access, SHARE_BOTH);
        assert_eq!(st.check_io(Some(b), &s2, &FH, 0), Err(StateError::BadStateid), "other client's stateid");
        assert_eq!(st.check_io(Some(a), &s2, &FH2, 0), Err(StateError::BadStateid), "other file");
        let mut stale = s2;
        stale.other[0] ^= 1;
        assert_eq!(st.check_io(Some(a), &stale, &FH, 0), Err(StateError::StaleStateid));
        let s3 = st.open_downgrade(a, &s2, SHARE_READ, 0).unwrap();
        assert_eq!(s3.seqid, 3);
        assert_eq!(st.open_downgrade(a, &s3, SHARE_BOTH, 0), Err(StateError::Inval), "not a downgrade");
        assert_eq!(st.close(a, &s3), Ok(Stateid::INVALID));
        assert_eq!(st.check_io(Some(a), &s3, &FH, 0), Err(StateError::BadStateid));
        assert_eq!(st.open(a, b"o1", FH, 0, 0, false, 0), Err(StateError::Inval));
    }

    #[test]
    fn byte_range_locks_conflict_split_and_release() {
        let mut st = State::new(no_grace(), 7, 0);
        let (a, _) = setup(&mut st, b"a");
        let (b, _) = setup(&mut st, b"b");
        let oa = st.open(a, b"oa", FH, SHARE_BOTH, 0, false, 0).unwrap();
        let ob = st.open(b, b"ob", FH, SHARE_READ, 0, false, 0).unwrap();
        let la = st
            .lock(a, &FH, Locker::New { open_stateid: oa, owner: b"la" }, LockKind::Write, 0, 100, false, 0)
            .unwrap();
        // b may not write-lock (read-only open) nor read-lock an overlapping range.
        let r = st.lock(b, &FH, Locker::New { open_stateid: ob, owner: b"lb" }, LockKind::Write, 0, 1, false, 0);
        assert!(matches!(r, Err(LockError::State(StateError::OpenMode))));
        let r = st.lock(b, &FH, Locker::New { open_stateid: ob, owner: b"lb" }, LockKind::Read, 50, 10, false, 0);
        match r {
            Err(LockError::Denied(c)) => {
                assert_eq!((c.offset, c.length, c.kind, c.clientid), (0, 100, LockKind::Write, a));
                assert_eq!(c.owner, b"la");
            }
            other => panic!("expected denial, got {other:?}"),
        }
        assert!(st.lockt(b, &FH, b"lb", LockKind::Read, 100, 10, 0).is_ok(), "adjacent range is free");
        assert!(matches!(st.lockt(b, &FH, b"lb", LockKind::Read, 99, 1, 0), Err(LockError::Denied(_))));
        // Unlock the middle: two pieces stay; the hole is lockable by b.
        let la2 = st.locku(a, &FH, &la, 40, 20).unwrap();
        assert_eq!(la2.seqid, 2);
        assert_eq!(st.lock_count(&FH), 2);
        let lb = st
            .lock(b, &FH, Locker::New { open_stateid: ob, owner: b"lb" }, LockKind::Read, 40, 20, false, 0)
            .unwrap();
        // Whole-file length (all ones) and a zero length.
        assert!(matches!(st.lockt(b, &FH, b"x", LockKind::Write, 70, u64::MAX, 0), Err(LockError::Denied(_))));
        assert!(matches!(st.lockt(b, &FH, b"x", LockKind::Write, 0, 0, 0), Err(LockError::State(StateError::Inval))));
        assert!(matches!(
            st.lockt(b, &FH, b"x", LockKind::Write, u64::MAX, 2, 0),
            Err(LockError::State(StateError::Inval))
        ));
        // CLOSE with locks held is refused; FREE_STATEID too.
        assert_eq!(st.close(a, &oa), Err(StateError::LocksHeld));
        assert_eq!(st.free_stateid(a, &la2), Err(StateError::LocksHeld));
        let la3 = st.locku(a, &FH, &la2, 0, u64::MAX).unwrap();
        st.free_stateid(a, &la3).unwrap();
        st.close(a, &oa).unwrap();
        assert_eq!(st.lock_count(&FH), 1);
        let lb2 = st.locku(b, &FH, &lb, 0, u64::MAX).unwrap();
        assert_eq!(st.lock_count(&FH), 0);
        assert_eq!(lb2.seqid, 2);
    }

    #[test]
    fn lease_expiry_frees_state_and_reports_expired() {
        let mut st = State::new(no_grace(), 7, 0);
        let (a, sa) = setup(&mut st, b"a");
        let (b, sb) = setup(&mut st, b"b");
        let oa = st.open(a, b"oa", FH, SHARE_BOTH, SHARE_BOTH, false, 0).unwrap();
        st.lock(a, &FH, Locker::New { open_stateid: oa, owner: b"la" }, LockKind::Write, 0, 1, false, 0).unwrap();
        // b keeps renewing; a goes silent past the 10 s lease.
        assert_eq!(st.sequence_begin(&sb, 0, 1, 2, 9_000), Ok(false));
        st.sequence_end(&sb, 0, None);
        assert_eq!(st.reap(10_000), 0, "not yet expired at exactly one lease");
        assert_eq!(st.reap(10_001), 1);
        assert!(!st.client_exists(a) && st.client_exists(b));
        assert_eq!(st.sequence_begin(&sa, 0, 1, 1, 10_001), Err(StateError::BadSession));
        assert_eq!(st.lock_count(&FH), 0);
        assert_eq!(st.stateid_count(), 0);
        assert_eq!(st.check_io(Some(a), &oa, &FH, 10_001), Err(StateError::Expired));
        // The share reservation is gone: b can open for writing.
        st.open(b, b"ob", FH, SHARE_WRITE, 0, false, 10_001).unwrap();
    }

    #[test]
    fn grace_period_allows_only_reclaims() {
        let limits = Limits { grace_time_s: 5, lease_time_s: 100, ..Limits::default() };
        let mut st = State::new(limits, 7, 1_000);
        let (a, _) = setup(&mut st, b"a");
        assert!(st.in_grace(1_000));
        assert_eq!(st.open(a, b"o", FH, SHARE_READ, 0, false, 1_000), Err(StateError::Grace));
        assert_eq!(st.check_io(Some(a), &Stateid::ANONYMOUS, &FH, 1_000), Err(StateError::Grace));
        let o = st.open(a, b"o", FH, SHARE_READ, 0, true, 1_000).unwrap();
        let r = st.lock(a, &FH, Locker::New { open_stateid: o, owner: b"l" }, LockKind::Read, 0, 1, false, 1_000);
        assert!(matches!(r, Err(LockError::State(StateError::Grace))));
        st.lock(a, &FH, Locker::New { open_stateid: o, owner: b"l" }, LockKind::Read, 0, 1, true, 1_000).unwrap();
        st.reclaim_complete(a).unwrap();
        assert_eq!(st.reclaim_complete(a), Err(StateError::CompleteAlready));
        assert_eq!(st.open(a, b"o2", FH2, SHARE_READ, 0, true, 1_000), Err(StateError::NoGrace));
        // After grace: reclaims are refused, new opens allowed.
        assert!(!st.in_grace(6_000));
        st.open(a, b"o2", FH2, SHARE_READ, 0, false, 6_000).unwrap();
        let (b, _) = setup(&mut st, b"b");
        assert_eq!(st.open(b, b"o", FH2, SHARE_READ, 0, true, 6_000), Err(StateError::NoGrace));
        // Reclaim first (§18.51.3): after grace too, b may not open or lock
        // before its RECLAIM_COMPLETE.
        assert_eq!(st.open(b, b"o", FH2, SHARE_READ, 0, false, 6_000), Err(StateError::Grace));
        assert_eq!(st.check_locking(b, false, 6_000), Err(StateError::Grace));
        let r = st.lock(b, &FH2, Locker::New { open_stateid: o, owner: b"l" }, LockKind::Read, 0, 1, false, 6_000);
        assert!(matches!(r, Err(LockError::State(StateError::Grace))));
        st.reclaim_complete(b).unwrap();
        st.open(b, b"o", FH2, SHARE_READ, 0, false, 6_000).unwrap();
    }

    #[test]
    fn only_clients_on_stable_storage_reclaim_and_grace_ends_when_they_are_done() {
        let limits = Limits { grace_time_s: 60, lease_time_s: 10, ..Limits::default() };
        let mut st = State::new(limits.clone(), 7, 1_000);
        // Stable storage says a and b held state before the restart.
        st.set_reclaimable(vec![b"a".to_vec(), b"b".to_vec()]);
        let (a, _) = setup(&mut st, b"a");
        let (b, _) = setup(&mut st, b"b");
        let (c, _) = setup(&mut st, b"c");
        // Each confirmed client is written to stable storage, once.
        let mut recorded: Vec<Vec<u8>> = st.take_record_changes().into_iter().filter(|(_, p)| *p).map(|(o, _)| o).collect();
        recorded.sort();
        assert_eq!(recorded, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert!(st.take_record_changes().is_empty());
        st.open(a, b"o", FH, SHARE_READ, 0, true, 1_000).unwrap();
        // c held nothing before the restart: nothing to reclaim.
        assert_eq!(st.open(c, b"o", FH2, SHARE_READ, 0, true, 1_000), Err(StateError::NoGrace));
        st.reclaim_complete(a).unwrap();
        assert!(st.in_grace(2_000), "b has not finished reclaiming");
        st.reclaim_complete(b).unwrap();
        assert!(!st.in_grace(2_000), "every reclaimable client is done: grace is over");
        st.reclaim_complete(c).unwrap();
        st.open(c, b"o", FH2, SHARE_READ, 0, false, 2_000).unwrap();
        // A lease that expires erases the record.
        assert!(st.reap(1_000_000) >= 1);
        let mut erased: Vec<Vec<u8>> = st.take_record_changes().into_iter().filter(|(_, p)| !*p).map(|(o, _)| o).collect();
        erased.sort();
        assert_eq!(erased, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        // No client to wait for: no grace at all.
        let mut fresh = State::new(limits, 8, 1_000);
        fresh.set_reclaimable(Vec::new());
        assert!(!fresh.in_grace(1_000));
    }

    #[test]
    fn reply_cache_budget_limits_slots() {
        // Room for 6 slots of 4096 bytes: the first session gets its 4, the
        // second the 2 left, the third none until one is destroyed.
        let limits = Limits { reply_cache_bytes_max: 6 * 4096, ..no_grace() };
        let mut st = State::new(limits, 7, 0);
        let x = st.exchange_id(b"c", [1; 8], 0, false, 0).unwrap();
        let s1 = st.create_session(x.clientid, 1, 0, 0, true, attrs(), attrs(), 0, 0).unwrap();
        assert_eq!(s1.fore.requests_max, 4);
        let s2 = st.create_session(x.clientid, 2, 0, 0, true, attrs(), attrs(), 0, 0).unwrap();
        assert_eq!(s2.fore.requests_max, 2);
        let before = st.reply_cache_bytes;
        assert_eq!(st.create_session(x.clientid, 3, 0, 0, true, attrs(), attrs(), 0, 0), Err(StateError::Resource));
        assert_eq!(st.reply_cache_bytes, before, "a failed CREATE_SESSION reserves nothing");
        st.destroy_session(&s1.id).unwrap();
        // The failure was cached (§18.36.4): its retransmission gets it again,
        // the next request is executed.
        assert_eq!(st.create_session(x.clientid, 3, 0, 0, true, attrs(), attrs(), 0, 0), Err(StateError::Resource));
        assert_eq!(st.create_session(x.clientid, 4, 0, 0, true, attrs(), attrs(), 0, 0).unwrap().fore.requests_max, 4);
    }

    /// Seeded random walk over clients, opens, locks, unlocks, closes and
    /// lease expiry; the cross-table invariants hold after every step and
    /// every granted lock is re-checked against the others.
    #[test]
    fn random_walk_keeps_invariants() {
        let mut st = State::new(Limits { lease_time_s: 5, ..no_grace() }, 7, 0);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let files = [FH, FH2];
        let mut now = 0u64;
        let mut clients: Vec<(ClientId, SessionId)> = Vec::new();
        let mut opens: Vec<(ClientId, Stateid, FileHandle)> = Vec::new();
        let mut locks: Vec<(ClientId, Stateid, FileHandle)> = Vec::new();
        for step in 0..5000u32 {
            now += next(300);
            match next(9) {
                0 if clients.len() < 4 => {
                    let owner = format!("c{step}");
                    clients.push(setup_at(&mut st, owner.as_bytes(), now));
                }
                1 | 2 if !clients.is_empty() => {
                    let (c, _) = clients[next(clients.len() as u64) as usize];
                    let fh = files[next(2) as usize];
                    let owner = [b'o', next(3) as u8];
                    if let Ok(sid) = st.open(c, &owner, fh, 1 + next(3) as u32, next(2) as u32, false, now) {
                        opens.push((c, sid, fh));
                    }
                }
                3 | 4 if !opens.is_empty() => {
                    let (c, sid, fh) = opens[next(opens.len() as u64) as usize];
                    let kind = if next(2) == 0 { LockKind::Read } else { LockKind::Write };
                    let owner = [b'l', next(2) as u8];
                    let locker = Locker::New { open_stateid: Stateid { seqid: 0, ..sid }, owner: &owner };
                    let (off, len) = (next(50), 1 + next(50));
                    if let Ok(l) = st.lock(c, &fh, locker, kind, off, len, false, now) {
                        locks.push((c, l, fh));
                    }
                }
                5 if !locks.is_empty() => {
                    let (c, l, fh) = locks[next(locks.len() as u64) as usize];
                    let _ = st.locku(c, &fh, &Stateid { seqid: 0, ..l }, next(50), 1 + next(50));
                }
                6 if !opens.is_empty() => {
                    let i = next(opens.len() as u64) as usize;
                    let (c, sid, _) = opens[i];
                    if st.close(c, &Stateid { seqid: 0, ..sid }).is_ok() {
                        opens.swap_remove(i);
                    }
                }
                7 if !clients.is_empty() => {
                    // Renew one client; others may lapse.
                    let (_, sid) = clients[next(clients.len() as u64) as usize];
                    if let Some(s) = st.sessions.get(&sid) {
                        let seq = s.slots[0].seqid.wrapping_add(1);
                        if st.sequence_begin(&sid, 0, seq, 1, now) == Ok(false) {
                            st.sequence_end(&sid, 0, None);
                        }
                    }
                }
                _ => {
                    st.reap(now);
                    clients.retain(|(c, _)| st.client_exists(*c));
                    opens.retain(|(c, _, _)| st.client_exists(*c));
                    locks.retain(|(c, _, _)| st.client_exists(*c));
                }
            }
            st.assert_invariants();
        }
    }

    /// The back channel's bookkeeping: which connections carry it, the
    /// CB_PATH_DOWN flags, callback slots (one in flight per slot, sequence
    /// ids advanced on success, stepped back when refused, resynchronised
    /// after a lost call), and connection close.
    #[test]
    fn back_channel_bindings_flags_and_slots() {
        use proto::nfs4::{SEQ4_STATUS_CB_PATH_DOWN as DOWN, SEQ4_STATUS_CB_PATH_DOWN_SESSION as DOWN_S};
        use rpc::backchannel::CallCred;
        let mut st = State::new(no_grace(), 7, 0);
        let (a, sid) = setup(&mut st, b"a");
        assert_eq!(st.cb_path_flags(&sid), DOWN | DOWN_S, "no connection bound for callbacks");
        assert_eq!(st.cb_begin(a).unwrap_err(), CbBusy::NoBackChannel);
        st.bind_conn_dir(&sid, 5, true).unwrap();
        assert_eq!(st.cb_path_flags(&sid), DOWN | DOWN_S, "bound, but no usable credential yet");
        st.set_callback_sec(&sid, 0x4000_0001, Some(CallCred::None)).unwrap();
        assert_eq!(st.cb_path_flags(&sid), 0);
        // attrs() offers 4 back-channel slots: four calls at once, then busy.
        let calls: Vec<CbCall> = (0..4).map(|_| st.cb_begin(a).unwrap()).collect();
        assert_eq!(st.cb_begin(a).unwrap_err(), CbBusy::SlotsBusy);
        assert!(calls.iter().enumerate().all(|(i, c)| c.slot == i as u32 && c.seqid == 1 && c.conn == 5));
        assert_eq!((calls[0].program, calls[0].highest_slot), (0x4000_0001, 3));
        st.cb_end(&sid, 0, Some(true));
        st.cb_end(&sid, 1, Some(false));
        st.cb_end(&sid, 2, None);
        assert_eq!(st.cb_begin(a).unwrap().seqid, 2, "slot 0: sequence advanced");
        assert_eq!(st.cb_begin(a).unwrap().seqid, 1, "slot 1: refused, sequence reused");
        let c2 = st.cb_begin(a).unwrap();
        assert_eq!((c2.slot, c2.seqid), (2, 2));
        assert!(st.cb_uncertain(&sid, 2));
        st.cb_end(&sid, 2, Some(false));
        st.cb_resync(&sid, 2);
        assert_eq!(st.cb_begin(a).unwrap().seqid, 1, "slot 2: back over the lost call");
        // A second session keeps the client reachable; closing the only
        // back-channel connection of the first takes its path down.
        let s2 = st.create_session(a, 2, 0, 0, true, attrs(), attrs(), 0, 0).unwrap().id;
        st.bind_conn_dir(&s2, 6, true).unwrap();
        st.set_callback_sec(&s2, 1, Some(CallCred::None)).unwrap();
        st.conn_closed(5);
        assert_eq!(st.cb_path_flags(&sid), DOWN_S);
        assert_eq!(st.cb_path_flags(&s2), 0);
        // A fore-only binding takes a connection off the back channel.
        st.bind_conn_dir(&s2, 6, false).unwrap();
        assert_eq!(st.cb_path_flags(&s2), DOWN | DOWN_S);
        assert_eq!(st.bind_conn_dir(&[9; 16], 6, true), Err(StateError::BadSession));
        st.assert_invariants();
    }

    #[test]
    fn tables_are_bounded() {
        let limits = Limits { clients_max: 2, sessions_per_client_max: 1, stateids_max: 1, ..no_grace() };
        let mut st = State::new(limits, 7, 0);
        let (a, _) = setup(&mut st, b"a");
        setup(&mut st, b"b");
        assert_eq!(st.exchange_id(b"c", [1; 8], 0, false, 0), Err(StateError::Resource));
        assert_eq!(st.create_session(a, 2, 0, 0, true, attrs(), attrs(), 0, 0), Err(StateError::Resource));
        st.open(a, b"o", FH, SHARE_READ, 0, false, 0).unwrap();
        assert_eq!(st.open(a, b"o2", FH2, SHARE_READ, 0, false, 0), Err(StateError::Resource));
    }
}
