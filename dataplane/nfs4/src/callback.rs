//! The NFSv4.1 back channel (RFC 8881 §2.10.3.1, §18.33–§18.36, §20):
//! server-initiated CB_COMPOUND calls on a connection the client bound to
//! its session's back channel, and their replies.
//!
//! Use: the MDS (a control thread or an op handler) calls
//! [`Callbacks::layout_recall`]; it never blocks: it encodes
//! CB_COMPOUND { CB_SEQUENCE, CB_LAYOUTRECALL }, hands the record to the
//! transport (which sends it on the client's connection from its core) and
//! returns a [`RecallTicket`]. The outcome arrives with the client's reply
//! (or a timeout) and is read with [`Callbacks::poll`] / [`Callbacks::wait`],
//! or pushed to the `on_done` closure given to
//! [`Callbacks::layout_recall_notify`].
//!
//! Delegations use the same machinery: [`Callbacks::recall_delegation_notify`]
//! sends CB_RECALL (§20.2) and [`Callbacks::recall_any`] CB_RECALL_ANY
//! (§20.6); slots, retries on NFS4ERR_DELAY, timeouts and bounds are shared.

use crate::state::{CbBusy, CbCall, ClientId, SessionId, State, Stateid};
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder, Xdr};
use rpc::backchannel::{self as bc, CallSender, ReplySink, SendError, XidAllocator};
use rpc::ConnInfo;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};
use vfs::FileHandle;

/// Callbacks waiting for a free back-channel slot or a retry, all clients.
pub const CB_QUEUED_MAX: usize = 1024;
/// Finished results kept for `poll`/`wait` (oldest forgotten first).
pub const CB_DONE_MAX: usize = 4096;
/// NFS4ERR_DELAY answers retried per callback before giving up.
pub const CB_DELAY_RETRIES_MAX: u32 = 30;
/// First wait after NFS4ERR_DELAY; doubles up to `CB_DELAY_BACKOFF_MAX_MS`.
pub const CB_DELAY_BACKOFF_MIN_MS: u64 = 20;
pub const CB_DELAY_BACKOFF_MAX_MS: u64 = 1000;
/// Largest CB_COMPOUND record we build (CB_SEQUENCE + CB_LAYOUTRECALL of a
/// 128-byte handle need well under 1 KiB).
pub const CB_RECORD_BYTES_MAX: usize = 4096;
/// How often the timer thread looks at deadlines when nothing is due sooner.
const TIMER_IDLE_MS: u64 = 1000;
/// Log the first few dropped replies, then one in this many.
const LOG_FIRST: u64 = 16;
const LOG_EVERY: u64 = 1000;

/// What a CB_LAYOUTRECALL names (layoutrecall4, RFC 8881 §20.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecallKind {
    /// LAYOUTRECALL4_FILE: the layouts of one file in [offset, offset+length)
    /// (length u64::MAX: to the end of the file); `stateid` is the layout
    /// stateid the server holds for the client on that file.
    File { fh: FileHandle, stateid: Stateid, offset: u64, length: u64 },
    /// LAYOUTRECALL4_FSID: every layout of one file system.
    Fsid { major: u64, minor: u64 },
    /// LAYOUTRECALL4_ALL: every layout the client holds.
    All,
}

/// CB_LAYOUTRECALL4args without the session part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRecall {
    /// layouttype4 (LAYOUT4_FLEX_FILES = 4).
    pub layout_type: u32,
    /// layoutiomode4: LAYOUTIOMODE4_READ 1, _RW 2, _ANY 3.
    pub iomode: u32,
    /// clora_changed: the layout changed (the client must not write through
    /// the old one; RFC 8881 §20.3.3).
    pub changed: bool,
    pub kind: RecallKind,
}

/// CB_RECALL4args: give back the delegation `stateid` on `fh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegRecall {
    pub fh: FileHandle,
    pub stateid: Stateid,
    /// The file is about to be truncated to zero (the client need not flush).
    pub truncate: bool,
}

/// CB_OFFLOAD4args (RFC 7862 §16.1): an asynchronous COPY ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadDone {
    /// The copy's destination file.
    pub fh: FileHandle,
    /// The copy stateid COPY answered with (wr_callback_id).
    pub stateid: Stateid,
    /// NFS4_OK, or the error that stopped it.
    pub status: i32,
    /// Bytes copied.
    pub count: u64,
    pub verifier: [u8; 8],
}

/// OP_CB_OFFLOAD (RFC 7862 §16.1; not in the XDR we generate from, so
/// encoded by hand).
pub const OP_CB_OFFLOAD: i32 = 15;

/// The operation a CB_COMPOUND carries after CB_SEQUENCE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CbOp {
    Layout(LayoutRecall),
    Deleg(DelegRecall),
    /// CB_RECALL_ANY: keep at most `keep` objects of the types in `mask`
    /// (bit numbers RCA4_TYPE_MASK_*).
    RecallAny { keep: u32, mask: u32 },
    Offload(OffloadDone),
}

impl CbOp {
    fn opnum(&self) -> i32 {
        match self {
            CbOp::Layout(_) => p::OP_CB_LAYOUTRECALL,
            CbOp::Deleg(_) => p::OP_CB_RECALL,
            CbOp::RecallAny { .. } => p::OP_CB_RECALL_ANY,
            CbOp::Offload(_) => OP_CB_OFFLOAD,
        }
    }
}

/// Names one callback in flight or done (unique for the process life).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecallTicket(pub u64);

/// How a recall ended when the client answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecallOutcome {
    /// NFS4_OK: the client will LAYOUTRETURN what was recalled.
    Accepted,
    /// NFS4ERR_NOMATCHING_LAYOUT: the client holds none of it (treat the
    /// range as returned, §20.3.4).
    NoMatchingLayout,
}

/// Why a callback could not be delivered or was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CbError {
    /// No transport attached to this program (unit tests, or a role
    /// without the data path).
    NotAttached,
    /// The client has no session with a usable back channel (the client is
    /// told with SEQ4_STATUS_CB_PATH_DOWN on its SEQUENCE replies).
    NoBackChannel,
    /// Too many callbacks queued (`CB_QUEUED_MAX`): try again later.
    Busy,
    /// No reply within the deadline (one lease); the connection may be dead.
    Timeout,
    /// The client kept answering NFS4ERR_DELAY past `CB_DELAY_RETRIES_MAX`.
    DelayExhausted,
    /// The connection carrying the call closed before the reply.
    ConnectionLost,
    /// The client answered with this nfsstat4 (CB_SEQUENCE or the op).
    Status(i32),
    /// The client's reply was not a valid RPC/CB_COMPOUND reply, or the RPC
    /// layer refused the call (accept_stat / reject); logged with details.
    BadReply,
    /// The CB_COMPOUND does not fit the back channel's ca_maxrequestsize
    /// (or its ca_maxoperations is below 2).
    TooBig,
    /// The recall itself is malformed (unknown layout type or iomode).
    Invalid,
}

impl std::fmt::Display for CbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Result of one recall, as `poll`/`wait`/`on_done` report it.
pub type RecallResult = Result<RecallOutcome, CbError>;

/// The back channel of one `Nfs4Program` (see the module doc).
///
/// Bounds: calls in flight per session = its callback slots
/// (min(ca_maxrequests, `state::CB_SLOTS_MAX`)); waiting callbacks
/// `CB_QUEUED_MAX`; each call times out after one lease; NFS4ERR_DELAY is
/// retried at most `CB_DELAY_RETRIES_MAX` times and never past two leases.
pub struct Callbacks {
    state: Arc<Mutex<State>>,
    lease_ms: u64,
    clock: Instant,
    sender: OnceLock<Arc<dyn CallSender>>,
    xids: XidAllocator,
    next_ticket: AtomicU64,
    inner: Mutex<Inner>,
    /// Signalled when a result lands (for `wait`) and when work is queued
    /// (for the timer thread).
    changed: Condvar,
    timer: Mutex<Option<std::thread::JoinHandle<()>>>,
    stop: std::sync::atomic::AtomicBool,
    dropped_replies: AtomicU64,
}

type OnDone = Box<dyn FnOnce(RecallTicket, RecallResult) + Send>;

struct Job {
    ticket: RecallTicket,
    clientid: ClientId,
    recall: CbOp,
    delays: u32,
    /// A SEQ_MISORDERED after a timed-out call was resynchronised once.
    resynced: bool,
    not_before_ms: u64,
    deadline_ms: u64,
    /// What to report if the deadline passes while waiting.
    last_error: CbError,
    on_done: Option<OnDone>,
}

struct Inflight {
    job: Job,
    conn: u64,
    session: SessionId,
    slot: u32,
    seqid: u32,
    timeout_ms: u64,
}

#[derive(Default)]
struct Inner {
    inflight: HashMap<u32, Inflight>,
    waiting: VecDeque<Job>,
    done: HashMap<RecallTicket, RecallResult>,
    done_order: VecDeque<RecallTicket>,
}

/// What a reply said, once decoded.
enum Verdict {
    Done(RecallResult),
    /// Send again after a pause (NFS4ERR_DELAY).
    Delay,
    /// CB_SEQUENCE said SEQ_MISORDERED after a timeout: resend at once.
    Resync,
}

impl Callbacks {
    pub(crate) fn new(state: Arc<Mutex<State>>, lease_ms: u64) -> Self {
        assert!(lease_ms > 0);
        Callbacks {
            state,
            lease_ms,
            clock: Instant::now(),
            sender: OnceLock::new(),
            xids: XidAllocator::default(),
            next_ticket: AtomicU64::new(1),
            inner: Mutex::new(Inner::default()),
            changed: Condvar::new(),
            timer: Mutex::new(None),
            stop: Default::default(),
            dropped_replies: AtomicU64::new(0),
        }
    }

    /// Connect the back channel to a transport (`runtime::Server::sender`)
    /// and start the timer thread (timeouts, DELAY retries). Once only.
    pub fn attach(self: &Arc<Self>, sender: Arc<dyn CallSender>) {
        if self.sender.set(sender).is_err() {
            panic!("callbacks attached twice");
        }
        let weak: Weak<Callbacks> = Arc::downgrade(self);
        let t = std::thread::Builder::new()
            .name("nfs4-callbacks".into())
            .spawn(move || timer_loop(weak))
            .expect("spawn callback timer");
        *self.timer.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    }

    /// Stop the timer thread (also done on drop of the last reference).
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.changed.notify_all();
        let t = self.timer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// Whether a transport is attached (no callback can be sent before).
    pub fn attached(&self) -> bool {
        self.sender.get().is_some()
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Send CB_COMPOUND { CB_SEQUENCE, CB_LAYOUTRECALL } to `clientid` on a
    /// back channel of one of its sessions. Never blocks. NFS4ERR_DELAY from
    /// the client is retried (bounded); the result is read with
    /// `poll`/`wait`.
    pub fn layout_recall(&self, clientid: ClientId, recall: LayoutRecall) -> Result<RecallTicket, CbError> {
        self.submit(clientid, CbOp::Layout(recall), None)
    }

    /// As `layout_recall`, and `on_done` runs once with the result. It runs
    /// on whichever thread sees the outcome (a data-path core for a reply,
    /// the callback timer thread for a timeout): it must be short and must
    /// not block (send to a channel, set a flag). Not called when this
    /// returns Err.
    pub fn layout_recall_notify(
        &self,
        clientid: ClientId,
        recall: LayoutRecall,
        on_done: Box<dyn FnOnce(RecallTicket, RecallResult) + Send>,
    ) -> Result<RecallTicket, CbError> {
        self.submit(clientid, CbOp::Layout(recall), Some(on_done))
    }

    /// CB_COMPOUND { CB_SEQUENCE, CB_RECALL }: ask `clientid` to return a
    /// delegation. NFS4_OK means it will (DELEGRETURN follows); `on_done`
    /// runs once with the outcome, as for `layout_recall_notify`.
    pub fn recall_delegation_notify(
        &self,
        clientid: ClientId,
        recall: DelegRecall,
        on_done: Box<dyn FnOnce(RecallTicket, RecallResult) + Send>,
    ) -> Result<RecallTicket, CbError> {
        self.submit(clientid, CbOp::Deleg(recall), Some(on_done))
    }

    /// CB_COMPOUND { CB_SEQUENCE, CB_RECALL_ANY }: ask `clientid` to keep
    /// at most `keep` read and write delegations. The result is read with
    /// `poll`/`wait` (nothing depends on it: the client returns what it
    /// chooses with DELEGRETURN).
    /// CB_COMPOUND { CB_SEQUENCE, CB_OFFLOAD }: tell `clientid` an
    /// asynchronous COPY ended. Nothing waits for the answer.
    pub fn offload(&self, clientid: ClientId, done: OffloadDone) -> Result<RecallTicket, CbError> {
        self.submit(clientid, CbOp::Offload(done), Some(Box::new(|_, _| {})))
    }

    pub fn recall_any(&self, clientid: ClientId, keep: u32) -> Result<RecallTicket, CbError> {
        let mask = 1 << p::RCA4_TYPE_MASK_RDATA_DLG | 1 << p::RCA4_TYPE_MASK_WDATA_DLG;
        self.submit(clientid, CbOp::RecallAny { keep, mask }, None)
    }

    /// The result of a finished callback (taken: a second poll returns
    /// None), or None while it is in flight.
    pub fn poll(&self, ticket: RecallTicket) -> Option<RecallResult> {
        let mut g = self.inner();
        let r = g.done.remove(&ticket);
        if r.is_some() {
            g.done_order.retain(|t| *t != ticket);
        }
        r
    }

    /// Block the calling (control or test) thread until the callback ends
    /// or `timeout` passes (None then). Never call it on a data-path core.
    pub fn wait(&self, ticket: RecallTicket, timeout: Duration) -> Option<RecallResult> {
        let end = Instant::now() + timeout;
        let mut g = self.inner();
        loop {
            if let Some(r) = g.done.remove(&ticket) {
                g.done_order.retain(|t| *t != ticket);
                return Some(r);
            }
            let now = Instant::now();
            if now >= end {
                return None;
            }
            g = self.changed.wait_timeout(g, end - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Callbacks in flight (sent, not answered) and waiting, for tests and
    /// metrics.
    pub fn pending(&self) -> (usize, usize) {
        let g = self.inner();
        (g.inflight.len(), g.waiting.len())
    }

    fn submit(&self, clientid: ClientId, recall: CbOp, on_done: Option<OnDone>) -> Result<RecallTicket, CbError> {
        if self.sender.get().is_none() {
            return Err(CbError::NotAttached);
        }
        if let CbOp::Layout(l) = &recall {
            if p::layouttype4::from_i32(l.layout_type as i32).is_none() || p::layoutiomode4::from_i32(l.iomode as i32).is_none() {
                return Err(CbError::Invalid);
            }
        }
        let now = self.now_ms();
        let ticket = RecallTicket(self.next_ticket.fetch_add(1, Ordering::Relaxed));
        let job = Job {
            ticket,
            clientid,
            recall,
            delays: 0,
            resynced: false,
            not_before_ms: now,
            deadline_ms: now + 2 * self.lease_ms,
            last_error: CbError::Timeout,
            on_done,
        };
        match self.try_send(job) {
            Ok(()) => Ok(ticket),
            Err((job, CbError::Busy)) => {
                let mut g = self.inner();
                if g.waiting.len() >= CB_QUEUED_MAX {
                    return Err(CbError::Busy);
                }
                g.waiting.push_back(job);
                drop(g);
                self.changed.notify_all();
                Ok(ticket)
            }
            Err((_, e)) => Err(e),
        }
    }

    /// Take a slot, encode, register and queue the call. Err(Busy): no free
    /// slot now (the job comes back to be queued).
    fn try_send(&self, job: Job) -> Result<(), (Job, CbError)> {
        let sender = self.sender.get().expect("checked by the caller").clone();
        let call = match self.st().cb_begin(job.clientid) {
            Ok(c) => c,
            Err(CbBusy::SlotsBusy) => return Err((job, CbError::Busy)),
            Err(CbBusy::NoBackChannel) => return Err((job, CbError::NoBackChannel)),
        };
        let xid = self.xids.next();
        let record = match encode_recall(xid, &call, &job.recall) {
            Ok(r) => r,
            Err(e) => {
                self.st().cb_end(&call.session, call.slot, Some(false));
                return Err((job, e));
            }
        };
        let now = self.now_ms();
        let inflight = Inflight {
            job,
            conn: call.conn,
            session: call.session,
            slot: call.slot,
            seqid: call.seqid,
            timeout_ms: now + self.lease_ms,
        };
        // Registered before sending: the reply may arrive before `send` returns.
        self.inner().inflight.insert(xid, inflight);
        self.changed.notify_all();
        if let Err(e) = sender.send(call.conn, record) {
            let f = self.inner().inflight.remove(&xid);
            self.st().cb_end(&call.session, call.slot, Some(false));
            let err = match e {
                SendError::QueueFull => CbError::Busy,
                SendError::NoConnection | SendError::Stopped => CbError::ConnectionLost,
                SendError::TooLarge => CbError::TooBig,
            };
            match f {
                Some(f) => return Err((f.job, err)),
                // Answered already (cannot happen without a send); nothing to undo.
                None => return Ok(()),
            }
        }
        Ok(())
    }

    fn finish(&self, mut job: Job, r: RecallResult) {
        let on_done = job.on_done.take();
        if let Some(f) = on_done {
            f(job.ticket, r);
        } else {
            let mut g = self.inner();
            while g.done_order.len() >= CB_DONE_MAX {
                if let Some(old) = g.done_order.pop_front() {
                    g.done.remove(&old);
                }
            }
            g.done.insert(job.ticket, r);
            g.done_order.push_back(job.ticket);
        }
        self.changed.notify_all();
    }

    /// Put a job back to be sent at `not_before_ms` (bounded by its deadline
    /// and the queue).
    fn requeue(&self, mut job: Job, not_before_ms: u64, why: CbError) {
        job.not_before_ms = not_before_ms;
        job.last_error = why;
        if not_before_ms >= job.deadline_ms {
            return self.finish(job, Err(why));
        }
        let mut g = self.inner();
        if g.waiting.len() >= CB_QUEUED_MAX {
            drop(g);
            return self.finish(job, Err(CbError::Busy));
        }
        g.waiting.push_back(job);
        drop(g);
        self.changed.notify_all();
    }

    /// Send every waiting job that is due; fail those past their deadline.
    /// Returns when the next one is due (ms), if any.
    fn run_waiting(&self) -> Option<u64> {
        let now = self.now_ms();
        let due: Vec<Job> = {
            let mut g = self.inner();
            let (due, later): (Vec<Job>, Vec<Job>) = g.waiting.drain(..).partition(|j| j.not_before_ms <= now);
            g.waiting.extend(later);
            due
        };
        for job in due {
            if now >= job.deadline_ms {
                let e = job.last_error;
                self.finish(job, Err(e));
                continue;
            }
            match self.try_send(job) {
                Ok(()) => {}
                // Slots busy, or the client has no back channel right now
                // (it may bind one): wait a little, within the deadline.
                Err((job, e @ (CbError::Busy | CbError::NoBackChannel | CbError::ConnectionLost))) => {
                    let e = if job.last_error == CbError::ConnectionLost { CbError::ConnectionLost } else { e };
                    let next = now + CB_DELAY_BACKOFF_MIN_MS * 5;
                    self.requeue(job, next.min(job_deadline_guard(now)), e)
                }
                Err((job, e)) => self.finish(job, Err(e)),
            }
        }
        self.inner().waiting.iter().map(|j| j.not_before_ms).min()
    }

    /// Fail calls whose reply is overdue. Returns the next deadline.
    fn expire_inflight(&self) -> Option<u64> {
        let now = self.now_ms();
        let overdue: Vec<(u32, Inflight)> = {
            let mut g = self.inner();
            let xids: Vec<u32> = g.inflight.iter().filter(|(_, f)| f.timeout_ms <= now).map(|(x, _)| *x).collect();
            xids.into_iter().filter_map(|x| g.inflight.remove(&x).map(|f| (x, f))).collect()
        };
        for (xid, f) in overdue {
            eprintln!("nfs4 callback: xid {xid:#x} on connection {} got no reply in {} ms", f.conn, self.lease_ms);
            self.st().cb_end(&f.session, f.slot, None);
            self.finish(f.job, Err(CbError::Timeout));
        }
        self.inner().inflight.values().map(|f| f.timeout_ms).min()
    }

    fn log_drop(&self, conn: &ConnInfo, xid: u32, why: &str) {
        let n = self.dropped_replies.fetch_add(1, Ordering::Relaxed);
        if n < LOG_FIRST || n % LOG_EVERY == 0 {
            eprintln!("nfs4 callback: reply xid {xid:#x} from {} (connection {}): {why}: dropped", conn.peer, conn.conn_id);
        }
    }

    /// Decide what a reply means for the call it answers.
    fn judge(&self, f: &Inflight, msg: &[u8]) -> (Option<bool>, Verdict) {
        let (_, reply) = match bc::parse_reply(msg) {
            Ok(r) => r,
            // We cannot tell whether the client ran CB_SEQUENCE.
            Err(_) => return (None, Verdict::Done(Err(CbError::BadReply))),
        };
        let results = match reply {
            bc::Reply::Success(r) => r,
            // Refused at the RPC level: CB_SEQUENCE did not run.
            bc::Reply::Accepted(_) | bc::Reply::Denied(_) => return (Some(false), Verdict::Done(Err(CbError::BadReply))),
        };
        let mut d = Decoder::new(results);
        let Ok(head) = decode_head(&mut d) else { return (None, Verdict::Done(Err(CbError::BadReply))) };
        let (status, count) = head;
        if count == 0 {
            return (Some(false), Verdict::Done(Err(CbError::Status(status))));
        }
        let Ok(seq) = decode_op::<p::CB_SEQUENCE4res>(&mut d, p::OP_CB_SEQUENCE) else {
            return (None, Verdict::Done(Err(CbError::BadReply)));
        };
        match seq {
            p::CB_SEQUENCE4res::NFS4_OK(ok) => {
                if ok.csr_sessionid != f.session || ok.csr_sequenceid != f.seqid || ok.csr_slotid != f.slot {
                    return (Some(true), Verdict::Done(Err(CbError::BadReply)));
                }
            }
            p::CB_SEQUENCE4res::default(code) => {
                let v = if code == p::NFS4ERR_DELAY {
                    Verdict::Delay
                } else if code == p::NFS4ERR_SEQ_MISORDERED && !f.job.resynced && self.st().cb_uncertain(&f.session, f.slot) {
                    Verdict::Resync
                } else {
                    Verdict::Done(Err(CbError::Status(code)))
                };
                return (Some(false), v);
            }
        }
        if count < 2 {
            return (Some(true), Verdict::Done(Err(CbError::Status(status))));
        }
        // CB_LAYOUTRECALL4res, CB_RECALL4res and CB_RECALL_ANY4res are each
        // one status word.
        let Ok(op_status) = decode_op::<i32>(&mut d, f.job.recall.opnum()) else {
            return (Some(true), Verdict::Done(Err(CbError::BadReply)));
        };
        let layout = matches!(f.job.recall, CbOp::Layout(_));
        let v = match op_status {
            s if s == p::NFS4_OK => Verdict::Done(Ok(RecallOutcome::Accepted)),
            s if layout && s == p::NFS4ERR_NOMATCHING_LAYOUT => Verdict::Done(Ok(RecallOutcome::NoMatchingLayout)),
            s if s == p::NFS4ERR_DELAY => Verdict::Delay,
            s => Verdict::Done(Err(CbError::Status(s))),
        };
        (Some(true), v)
    }
}

/// A requeue time never past "now + one backoff step" beyond what the
/// deadline check in `requeue` enforces.
fn job_deadline_guard(now: u64) -> u64 {
    now + CB_DELAY_BACKOFF_MAX_MS
}

/// status, tag, resarray count of CB_COMPOUND4res.
fn decode_head(d: &mut Decoder<'_>) -> proto::xdr::Result<(i32, u32)> {
    let status = d.i32()?;
    let _tag = d.opaque_var(1024)?;
    let count = d.u32()?;
    Ok((status, count))
}

/// One nfs_cb_resop4 that must be `op`.
fn decode_op<'a, T: Xdr<'a>>(d: &mut Decoder<'a>, op: i32) -> proto::xdr::Result<T> {
    let got = d.u32()?;
    if got != op as u32 {
        return Err(proto::xdr::XdrError::BadEnum { name: "nfs_cb_opnum4", value: got as i32 });
    }
    T::decode(d)
}

/// The operation after CB_SEQUENCE, encoded (`fh_bytes` holds a handle it borrows).
fn cb_argop<'a>(op: &CbOp, fh_bytes: &'a mut Vec<u8>) -> Result<p::nfs_cb_argop4<'a>, CbError> {
    match op {
        CbOp::Layout(r) => layout_argop(r, fh_bytes),
        CbOp::Deleg(r) => {
            *fh_bytes = r.fh.to_bytes().to_vec();
            Ok(p::nfs_cb_argop4::OP_CB_RECALL(p::CB_RECALL4args {
                stateid: p::stateid4 { seqid: r.stateid.seqid, other: r.stateid.other },
                truncate: r.truncate,
                fh: fh_bytes,
            }))
        }
        CbOp::RecallAny { keep, mask } => {
            Ok(p::nfs_cb_argop4::OP_CB_RECALL_ANY(p::CB_RECALL_ANY4args { craa_objects_to_keep: *keep, craa_type_mask: vec![*mask] }))
        }
        CbOp::Offload(_) => unreachable!("CB_OFFLOAD is encoded by encode_offload"),
    }
}

/// CB_OFFLOAD4args after its op number: coa_fh, coa_stateid, and
/// offload_info4 (NFS4_OK: write_response4 with no callback id, the count,
/// FILE_SYNC4 and the verifier; otherwise the bytes copied).
fn encode_offload(e: &mut Encoder<'_>, o: &OffloadDone) -> proto::xdr::Result<()> {
    e.u32(OP_CB_OFFLOAD as u32)?;
    e.opaque_var(&o.fh.to_bytes())?;
    p::stateid4 { seqid: o.stateid.seqid, other: o.stateid.other }.encode(e)?;
    e.i32(o.status)?;
    if o.status == p::NFS4_OK {
        e.u32(0)?; // wr_callback_id<1>: empty
        e.u64(o.count)?;
        e.i32(p::stable_how4::FILE_SYNC4 as i32)?;
        e.opaque_fixed(&o.verifier)?;
    } else {
        e.u64(o.count)?;
    }
    Ok(())
}

fn layout_argop<'a>(r: &LayoutRecall, fh_bytes: &'a mut Vec<u8>) -> Result<p::nfs_cb_argop4<'a>, CbError> {
    let recall = match &r.kind {
        RecallKind::File { fh, stateid, offset, length } => {
            *fh_bytes = fh.to_bytes().to_vec();
            p::layoutrecall4::LAYOUTRECALL4_FILE(p::layoutrecall_file4 {
                lor_fh: fh_bytes,
                lor_offset: *offset,
                lor_length: *length,
                lor_stateid: p::stateid4 { seqid: stateid.seqid, other: stateid.other },
            })
        }
        RecallKind::Fsid { major, minor } => p::layoutrecall4::LAYOUTRECALL4_FSID(p::fsid4 { major: *major, minor: *minor }),
        RecallKind::All => p::layoutrecall4::LAYOUTRECALL4_ALL,
    };
    Ok(p::nfs_cb_argop4::OP_CB_LAYOUTRECALL(p::CB_LAYOUTRECALL4args {
        clora_type: p::layouttype4::from_i32(r.layout_type as i32).ok_or(CbError::Invalid)?,
        clora_iomode: p::layoutiomode4::from_i32(r.iomode as i32).ok_or(CbError::Invalid)?,
        clora_changed: r.changed,
        clora_recall: recall,
    }))
}

/// The RPC record of CB_COMPOUND { CB_SEQUENCE, `op` } (RFC 8881 §19.2,
/// §20.9, and §20.3 / §20.2 / §20.6) for the slot `call` holds.
fn encode_recall(xid: u32, call: &CbCall, op: &CbOp) -> Result<Vec<u8>, CbError> {
    if call.ops_max < 2 {
        return Err(CbError::TooBig);
    }
    let mut fh_bytes = Vec::new();
    let seq = p::nfs_cb_argop4::OP_CB_SEQUENCE(p::CB_SEQUENCE4args {
        csa_sessionid: call.session,
        csa_sequenceid: call.seqid,
        csa_slotid: call.slot,
        csa_highest_slotid: call.highest_slot,
        csa_cachethis: false,
        csa_referring_call_lists: Vec::new(),
    });
    let mut buf = vec![0u8; CB_RECORD_BYTES_MAX];
    let mut e = Encoder::new(&mut buf);
    bc::start_call(&mut e, xid, call.program, p::NFS_CB, p::CB_COMPOUND, &call.cred).map_err(|_| CbError::TooBig)?;
    let args_at = e.position();
    // CB_COMPOUND4args: tag, minorversion, callback_ident, two operations.
    let head = |e: &mut Encoder<'_>| -> proto::xdr::Result<()> {
        e.opaque_var(b"")?;
        e.u32(call.minor)?;
        e.u32(0)?;
        e.u32(2)?;
        seq.encode(e)
    };
    head(&mut e).map_err(|_| CbError::TooBig)?;
    match op {
        CbOp::Offload(o) => encode_offload(&mut e, o).map_err(|_| CbError::TooBig)?,
        other => cb_argop(other, &mut fh_bytes)?.encode(&mut e).map_err(|_| CbError::TooBig)?,
    }
    // ca_maxrequestsize counts the RPC header too (§18.36.3); the record
    // mark is not part of the request.
    if e.position() - 4 > call.request_bytes_max as usize {
        return Err(CbError::TooBig);
    }
    debug_assert!(e.position() > args_at);
    let n = bc::finish_record(&mut e);
    buf.truncate(n);
    Ok(buf)
}

impl ReplySink for Callbacks {
    fn reply(&self, conn: &ConnInfo, xid: u32, msg: &[u8]) {
        let f = {
            let mut g = self.inner();
            match g.inflight.get(&xid) {
                None => None,
                Some(f) if f.conn != conn.conn_id => {
                    drop(g);
                    return self.log_drop(conn, xid, "answers a call sent on another connection");
                }
                Some(_) => g.inflight.remove(&xid),
            }
        };
        let Some(f) = f else { return self.log_drop(conn, xid, "no callback in flight with that xid") };
        let (seq_ran, verdict) = self.judge(&f, msg);
        if matches!(verdict, Verdict::Done(Err(CbError::BadReply))) {
            self.log_drop(conn, xid, "not a valid CB_COMPOUND reply");
        }
        {
            let mut st = self.st();
            st.cb_end(&f.session, f.slot, seq_ran);
            if matches!(verdict, Verdict::Resync) {
                st.cb_resync(&f.session, f.slot);
            }
        }
        let mut job = f.job;
        let now = self.now_ms();
        match verdict {
            Verdict::Done(r) => self.finish(job, r),
            Verdict::Resync => {
                job.resynced = true;
                self.requeue(job, now, CbError::Status(p::NFS4ERR_SEQ_MISORDERED));
            }
            Verdict::Delay => {
                job.delays += 1;
                if job.delays > CB_DELAY_RETRIES_MAX {
                    self.finish(job, Err(CbError::DelayExhausted));
                } else {
                    let pause = (CB_DELAY_BACKOFF_MIN_MS << (job.delays - 1).min(16)).min(CB_DELAY_BACKOFF_MAX_MS);
                    self.requeue(job, now + pause, CbError::DelayExhausted);
                }
            }
        }
        // A slot came free: a waiting callback may go now.
        self.changed.notify_all();
    }

    fn conn_closed(&self, conn_id: u64) {
        self.st().conn_closed(conn_id);
        let lost: Vec<Inflight> = {
            let mut g = self.inner();
            let xids: Vec<u32> = g.inflight.iter().filter(|(_, f)| f.conn == conn_id).map(|(x, _)| *x).collect();
            xids.into_iter().filter_map(|x| g.inflight.remove(&x)).collect()
        };
        let now = self.now_ms();
        for f in lost {
            // Unknown whether the client saw it; resend on another (or a
            // re-bound) back channel within the deadline.
            self.st().cb_end(&f.session, f.slot, None);
            self.requeue(f.job, now + CB_DELAY_BACKOFF_MIN_MS, CbError::ConnectionLost);
        }
    }
}

impl Drop for Callbacks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The timer thread: sends due retries and fails overdue calls. Holds only
/// a weak reference, so it ends when the program is dropped.
fn timer_loop(weak: Weak<Callbacks>) {
    loop {
        let Some(cb) = weak.upgrade() else { return };
        if cb.stop.load(Ordering::SeqCst) {
            return;
        }
        let next_wait = cb.run_waiting();
        let next_inflight = cb.expire_inflight();
        let now = cb.now_ms();
        let next = [next_wait, next_inflight].into_iter().flatten().min().unwrap_or(now + TIMER_IDLE_MS);
        let pause = next.saturating_sub(now).clamp(1, TIMER_IDLE_MS);
        let g = cb.inner();
        drop(cb.changed.wait_timeout(g, Duration::from_millis(pause)));
    }
}
