//! One core's event loop: accepts, receives records, dispatches them, sends
//! replies — all through one io_uring.

use crate::buf::{MmapBuf, Pool};
use crate::sys;
use crate::Shared;
use io_uring::{opcode, squeue, types, IoUring};
use rpc::metrics::{self, ConnEvent};
use rpc::lend::{Lender, Lent};
use rpc::record::{self, Next};
use rpc::park::{ParkSlot, Payload, Ticket};
use rpc::{ConnInfo, Outcome};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KIND_ACCEPT: u64 = 1;
const KIND_RECV: u64 = 2;
const KIND_SEND: u64 = 3;
const KIND_TIMEOUT: u64 = 4;
const KIND_WAKE: u64 = 5;
/// An eventfd read on a backend poller's notify descriptor (`rpc::poller`).
const KIND_NOTIFY: u64 = 6;
/// A readiness poll on a poller's wake descriptor (`Poller::wake_fds`).
const KIND_WAKE_POLL: u64 = 7;

/// How long a sleeping loop waits before rechecking the stop flag.
const IDLE_WAKE: Duration = Duration::from_millis(100);
/// Extra receive space beyond one maximal record in a pool's receive
/// buffer, so several small records (pipelined calls) arrive in one receive.
const RECV_SLACK_BYTES: usize = 64 << 10;
/// What every connection owns: a receive buffer for records up to this
/// size (larger ones move to a pool buffer) and two reply buffers (a reply
/// that does not fit moves its buffer to a pool buffer). Together 32 KiB,
/// resident only as far as touched.
pub(crate) const RECV_SMALL_BYTES: usize = 16 << 10;
pub(crate) const REPLY_SMALL_BYTES: usize = 8 << 10;
/// How long shutdown waits for in-flight operations to drain.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);
/// Server-initiated records held per connection while its reply buffer is
/// full; more are dropped (the caller's timeout reports it).
const OUT_PENDING_PER_CONN_MAX: usize = 64;
/// iovecs per sendmsg of a reply buffer with lent pieces (Linux UIO_MAXIOV
/// is 1024); the rest goes in the next send.
const IOV_PER_SEND_MAX: usize = 1024;

fn user_data(kind: u64, gen: u32, slot: usize) -> u64 {
    debug_assert!(slot < (1 << 32));
    (kind << 56) | ((gen as u64 & 0x00ff_ffff) << 32) | slot as u64
}

fn split(ud: u64) -> (u64, u32, usize) {
    (ud >> 56, ((ud >> 32) & 0x00ff_ffff) as u32, (ud & 0xffff_ffff) as usize)
}

struct Conn {
    fd: OwnedFd,
    info: ConnInfo,
    gen: u32,
    /// The receive buffer: the connection's own, or a pool buffer while a
    /// large record needs one (then the own one waits in `rsmall`).
    rbuf: MmapBuf,
    rsmall: Option<MmapBuf>,
    /// The last receive filled the connection's own buffer (or brought at
    /// least its size): the client sends faster than it holds.
    recv_streaming: bool,
    /// Parse position and end of received data in `rbuf`.
    rpos: usize,
    rfill: usize,
    /// Two reply buffers: `fill` is being appended to; the other may be in
    /// flight to the socket.
    /// Each the connection's own or, while a large reply needs one, a pool
    /// buffer (the own one then waits in `wsmall`).
    wbuf: [MmapBuf; 2],
    wsmall: [Option<MmapBuf>; 2],
    wlen: [usize; 2],
    /// Replies held in each buffer (calls in flight on this connection).
    wcount: [usize; 2],
    fill: usize,
    sending: bool,
    send_off: usize,
    recv_inflight: bool,
    closing: bool,
    /// Server-initiated records (back-channel calls) not yet in a buffer.
    out: std::collections::VecDeque<Vec<u8>>,
    /// Buffers lent to the replies in each reply buffer (zero-copy READ):
    /// each goes on the wire at its `pos` (an offset into the buffer). Their
    /// bytes count against the buffer's room as if copied in.
    lent: [Vec<Lent>; 2],
    lent_bytes: [usize; 2],
    /// The iovecs and header of the sendmsg in flight, for buffers with
    /// lent pieces; boxed so the kernel's pointers survive moves of `Conn`.
    iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
    /// Calls of this connection parked on a slow backend, and those of
    /// them completed and waiting for reply room (park table indexes).
    parked: usize,
    ready: VecDeque<usize>,
}

impl Conn {
    fn inflight(&self) -> usize {
        self.wcount[0] + self.wcount[1] + self.parked
    }

    /// Bytes buffer `s` puts on the wire: what was written plus what was lent.
    fn send_len(&self, s: usize) -> usize {
        self.wlen[s] + self.lent_bytes[s]
    }

    /// Point `msg` at the iovecs of buffer `s` from byte `send_off` on: the
    /// buffer's bytes interleaved with the pieces lent to its replies.
    fn prepare_sendmsg(&mut self, s: usize) {
        fn add(iov: &mut Vec<libc::iovec>, skip: &mut usize, base: *const u8, len: usize) {
            if *skip >= len {
                *skip -= len;
                return;
            }
            if iov.len() < IOV_PER_SEND_MAX {
                // SAFETY: `skip < len`, inside the slice `base` starts.
                iov.push(libc::iovec { iov_base: unsafe { base.add(*skip) } as *mut libc::c_void, iov_len: len - *skip });
            }
            *skip = 0;
        }
        let mut skip = self.send_off;
        self.iov.clear();
        let buf = self.wbuf[s].as_ptr();
        let mut from = 0;
        for l in &self.lent[s] {
            // SAFETY: from <= l.pos <= wlen[s], inside wbuf[s].
            add(&mut self.iov, &mut skip, unsafe { buf.add(from) }, l.pos - from);
            for p in &l.pieces {
                add(&mut self.iov, &mut skip, p.buf[p.at..].as_ptr(), p.len);
            }
            from = l.pos;
        }
        add(&mut self.iov, &mut skip, unsafe { buf.add(from) }, self.wlen[s] - from);
        // SAFETY: an all-zero msghdr is valid (no name, no control).
        *self.msg = unsafe { std::mem::zeroed() };
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len() as _;
    }
}

/// The send of buffer `s` from `send_off` on: a plain send of the buffer, or
/// a sendmsg interleaving it with the pieces its replies lent.
fn send_sqe(c: &mut Conn, s: usize, slot: usize) -> squeue::Entry {
    let fd = types::Fd(c.fd.as_raw_fd());
    let ud = user_data(KIND_SEND, c.gen, slot);
    if c.lent[s].is_empty() {
        let (ptr, len) = (c.wbuf[s][c.send_off..].as_ptr(), c.wlen[s] - c.send_off);
        return opcode::Send::new(fd, ptr, len as u32).flags(libc::MSG_NOSIGNAL).build().user_data(ud);
    }
    c.prepare_sendmsg(s);
    opcode::SendMsg::new(fd, &*c.msg as *const libc::msghdr).flags(libc::MSG_NOSIGNAL as u32).build().user_data(ud)
}

/// A call parked on a slow backend (see `rpc::park`): what it needs to run
/// again when its completion comes back to this core.
struct Parked {
    /// The connection's slot and generation (it may close meanwhile).
    slot: usize,
    conn_gen: u32,
    /// Who called (a call whose connection closed still runs to its reply,
    /// for the duplicate-request cache and NFSv4's slot).
    info: ConnInfo,
    record: Vec<u8>,
    state: Vec<u8>,
    started: Instant,
    /// The completion, once it arrived (outer `Some`).
    payload: Option<Option<Payload>>,
}

/// One core's parked calls, bounded in count and in record bytes.
type ParkTable = rpc::park::Table<Parked>;

/// `rpc::park::ParkSlot` for one call of one connection of this core.
struct CoreParker<'a> {
    table: &'a RefCell<ParkTable>,
    mail: &'a Arc<crate::Mailboxes>,
    core: usize,
    slot: usize,
    conn_gen: u32,
    info: ConnInfo,
    /// A resumed call parking again: when it first arrived (its latency
    /// counts every wait). Its table room is checked here (a new call's
    /// was checked before it ran).
    again: Option<Instant>,
}

impl ParkSlot for CoreParker<'_> {
    fn park(&self, record: &[u8], state: &[u8]) -> Option<Ticket> {
        let bytes = record.len() + state.len();
        if self.again.is_some() && !self.table.borrow().has_room(bytes) {
            return None;
        }
        let p = Parked {
            slot: self.slot,
            conn_gen: self.conn_gen,
            info: self.info,
            record: record.to_vec(),
            state: state.to_vec(),
            started: self.again.unwrap_or_else(Instant::now),
            payload: None,
        };
        let (i, gen) = self.table.borrow_mut().insert(p, bytes);
        let (mail, core) = (self.mail.clone(), self.core);
        Some(Ticket::new(move |payload| mail.complete(core, (i, gen, payload))))
    }
}

/// Move reply buffer `f` of `c` to a pool buffer, its bytes copied (the
/// lent pieces' positions are offsets, unchanged). False: the pool is empty.
fn move_to_pool(c: &mut Conn, f: usize, pool: &mut Pool) -> bool {
    debug_assert!(c.wsmall[f].is_none() && f == c.fill);
    let Some(mut big) = pool.take() else { return false };
    let n = c.wlen[f];
    big[..n].copy_from_slice(&c.wbuf[f][..n]);
    c.wsmall[f] = Some(std::mem::replace(&mut c.wbuf[f], big));
    true
}

/// Copy a reply of `n` bytes (plus `lent` bytes it lent) built in `scratch`
/// to the end of the connection's buffer being filled, moving that buffer
/// to a pool buffer first when it does not fit. Room was checked before
/// the call ran (`Loop::reply_room`), so this cannot fail.
fn place(c: &mut Conn, scratch: &[u8], n: usize, lent: usize, pool: &mut Pool) {
    let f = c.fill;
    if c.wbuf[f].len().saturating_sub(c.send_len(f)) < n + lent || c.wbuf[f].len() - c.wlen[f] < n {
        assert!(c.wsmall[f].is_none(), "a pool reply buffer with room for a maximal reply was too small");
        let moved = move_to_pool(c, f, pool);
        assert!(moved, "reply room was checked before the call");
    }
    c.wbuf[f][c.wlen[f]..c.wlen[f] + n].copy_from_slice(&scratch[..n]);
}

pub(crate) struct Loop {
    core: usize,
    ring: IoUring,
    listeners: Vec<OwnedFd>,
    accept_inflight: Vec<bool>,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    gens: Vec<u32>,
    free: Vec<usize>,
    ts: types::Timespec,
    timeout_armed: bool,
    record_bytes_max: usize,
    reply_bytes_max: usize,
    inflight_per_conn_max: usize,
    /// Target of the eventfd read that wakes the loop for queued records.
    wake_buf: Box<u64>,
    wake_inflight: bool,
    /// Collects what the reply being built lends (zero-copy READ).
    lender: Lender,
    /// The ring defers completion work to this loop (see `new_ring`).
    deferred: bool,
    parks: RefCell<ParkTable>,
    parked_per_conn_max: usize,
    /// Large receive and reply buffers, lent to connections while needed.
    recv_pool: Pool,
    reply_pool: Pool,
    /// Where a reply is built when the connection's buffer may be too
    /// small for it; then copied to the connection (moving it to a pool
    /// buffer if it does not fit).
    scratch: MmapBuf,
    /// Notify descriptors of busy backend pollers (`rpc::poller`) this turn.
    poll_fds: Vec<RawFd>,
    /// Eventfd reads armed on them while the loop sleeps: the descriptor
    /// and the read's target (the kernel writes it; it lives here).
    notify: Vec<(RawFd, Box<u64>, bool)>,
    /// Pollers' wake descriptors (`Poller::wake_fds`) and whether a
    /// readiness poll is armed on each.
    wake_polls: Vec<(RawFd, bool)>,
    wake_scratch: Vec<RawFd>,
    /// `on_done`'s lists, kept between calls so taking completions does
    /// not allocate.
    done_spare: Vec<crate::Completed>,
    touched_spare: Vec<usize>,
}

impl Loop {
    pub(crate) fn new(core: usize, ring: IoUring, listeners: Vec<OwnedFd>, shared: Arc<Shared>, deferred: bool) -> Self {
        let limits = shared.cfg.limits;
        let n = listeners.len();
        Loop {
            core,
            ring,
            listeners,
            accept_inflight: vec![false; n],
            shared,
            conns: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            ts: types::Timespec::from(IDLE_WAKE),
            timeout_armed: false,
            record_bytes_max: limits.record_bytes_max,
            reply_bytes_max: limits.reply_bytes_max,
            inflight_per_conn_max: limits.inflight_per_conn_max,
            wake_buf: Box::new(0),
            wake_inflight: false,
            lender: Lender::new(),
            deferred,
            parks: RefCell::new(ParkTable::new(limits.parked_per_core_max, limits.parked_bytes_per_core_max)),
            parked_per_conn_max: limits.parked_per_conn_max,
            recv_pool: Pool::new(limits.recv_buffers_per_core, limits.record_bytes_max + 4 + RECV_SLACK_BYTES),
            // Room for a maximal reply after whatever the connection's own
            // buffer held when it moved.
            reply_pool: Pool::new(limits.reply_buffers_per_core, (2 * limits.reply_bytes_max).max(REPLY_SMALL_BYTES + limits.reply_bytes_max)),
            scratch: MmapBuf::new(limits.reply_bytes_max),
            poll_fds: Vec::new(),
            notify: Vec::new(),
            wake_polls: Vec::new(),
            wake_scratch: Vec::new(),
            done_spare: Vec::new(),
            touched_spare: Vec::new(),
        }
    }

    /// Is there anything for the kernel to do or to tell us? With a
    /// deferring ring the answer is in shared memory: queued submissions,
    /// completion work pending (the TASKRUN flag) or an overflowed
    /// completion queue. A plain ring cannot tell without entering.
    fn kernel_has_work(&mut self) -> bool {
        if !self.deferred {
            return true;
        }
        let mut sq = self.ring.submission();
        sq.sync();
        !sq.is_empty() || sq.taskrun() || sq.cq_overflow()
    }

    fn push(&mut self, sqe: squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to is owned by a Conn (or
            // self) that is not freed while the operation is in flight
            // (`recv_inflight` / `sending` / `accept_inflight` gate frees).
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            // Queue full: hand what we have to the kernel and retry.
            let _ = self.ring.submit();
        }
    }

    pub(crate) fn run(mut self) {
        metrics::set_core(self.core);
        crate::set_own_core(self.core);
        rpc::poller::serve_on_this_thread();
        if let Some(h) = self.shared.cfg.on_core_start.clone() {
            (h.0)(self.core);
        }
        for i in 0..self.listeners.len() {
            self.arm_accept(i);
        }
        self.arm_wake();
        let spin = Duration::from_micros(self.shared.cfg.poll_spin_us);
        let mut last_event = Instant::now();
        let mut batch: Vec<(u64, i32)> = Vec::with_capacity(4096);
        // A backend poller in flight without a notify descriptor; any
        // backend poller in flight.
        let (mut spin_pollers, mut device_busy) = (false, false);
        // While device operations are in flight (`Config::device_poll_us`).
        let device_spin = Duration::from_micros(self.shared.cfg.device_poll_us);
        while !self.shared.stop.load(Ordering::Relaxed) {
            let idle = last_event.elapsed();
            let polling = spin_pollers || idle < spin || (device_busy && idle < device_spin);
            // A poller that finds work as the loop goes to sleep keeps it up.
            let polling = polling || {
                let found = rpc::poller::before_sleep_all();
                if found {
                    last_event = Instant::now();
                } else {
                    self.arm_wake_polls();
                }
                found
            };
            let r = if polling {
                if self.kernel_has_work() {
                    self.ring.submit()
                } else {
                    // Busy and nothing new: spin in user space, no syscall.
                    std::hint::spin_loop();
                    Ok(0)
                }
            } else {
                if !self.timeout_armed {
                    let ts = &self.ts as *const types::Timespec;
                    self.push(opcode::Timeout::new(ts).build().user_data(user_data(KIND_TIMEOUT, 0, 0)));
                    self.timeout_armed = true;
                }
                self.ring.submit_and_wait(1)
            };
            if let Err(e) = r {
                if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EBUSY) {
                    eprintln!("chimera-core-{}: io_uring submit failed: {e}", self.core);
                    break;
                }
            }
            self.drain(&mut batch);
            if !batch.is_empty() {
                last_event = Instant::now();
            }
            for &(ud, res) in &batch {
                self.complete(ud, res);
            }
            if !batch.is_empty() {
                self.unstall();
            }
            let turn = self.poll_backends();
            if turn.completed > 0 {
                last_event = Instant::now();
            }
            spin_pollers = turn.spin;
            device_busy = turn.busy;
        }
        self.shutdown(&mut batch);
    }

    /// Reap the backends' device queues of this core (`rpc::poller`): their
    /// completions go to the mailbox, taken here at once rather than at the
    /// eventfd wake-up. While operations are in flight, an eventfd read is
    /// armed on each queue's notify descriptor so a sleeping loop wakes for
    /// them.
    fn poll_backends(&mut self) -> rpc::poller::Turn {
        let mut fds = std::mem::take(&mut self.poll_fds);
        let turn = rpc::poller::poll_all(&mut fds);
        if turn.completed > 0 {
            crate::take_own_mail();
            self.on_done();
        }
        // Completions this loop posted to itself (none woke it); taking
        // them may resume calls that complete more the same way.
        while crate::take_own_mail() {
            self.on_done();
        }
        for &fd in &fds {
            if self.notify.iter().any(|(f, _, armed)| *f == fd && *armed) {
                continue;
            }
            let i = match self.notify.iter().position(|(f, _, armed)| *f == fd || !*armed) {
                Some(i) => i,
                None => {
                    self.notify.push((fd, Box::new(0), false));
                    self.notify.len() - 1
                }
            };
            let (f, buf, armed) = &mut self.notify[i];
            *f = fd;
            *armed = true;
            let target = &mut **buf as *mut u64 as *mut u8;
            let sqe = opcode::Read::new(types::Fd(fd), target, 8).build().user_data(user_data(KIND_NOTIFY, 0, i));
            self.push(sqe);
        }
        self.poll_fds = fds;
        turn
    }

    /// A readiness poll on every wake descriptor of this thread's pollers
    /// not watched yet, so the sleep ends when one becomes readable.
    fn arm_wake_polls(&mut self) {
        let mut fds = std::mem::take(&mut self.wake_scratch);
        rpc::poller::wake_fds_all(&mut fds);
        for &fd in &fds {
            let i = match self.wake_polls.iter().position(|w| w.0 == fd) {
                Some(i) if self.wake_polls[i].1 => continue,
                Some(i) => i,
                None => {
                    self.wake_polls.push((fd, false));
                    self.wake_polls.len() - 1
                }
            };
            self.wake_polls[i].1 = true;
            let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(user_data(KIND_WAKE_POLL, 0, i));
            self.push(sqe);
        }
        self.wake_scratch = fds;
    }

    fn drain(&mut self, batch: &mut Vec<(u64, i32)>) {
        batch.clear();
        for cqe in self.ring.completion() {
            batch.push((cqe.user_data(), cqe.result()));
        }
    }

    fn complete(&mut self, ud: u64, res: i32) {
        let (kind, gen, slot) = split(ud);
        match kind {
            KIND_ACCEPT => self.on_accept(slot, res),
            KIND_RECV => self.on_recv(slot, gen, res),
            KIND_SEND => self.on_send(slot, gen, res),
            KIND_TIMEOUT => self.timeout_armed = false,
            KIND_WAKE => self.on_wake(),
            KIND_NOTIFY => {
                if let Some(n) = self.notify.get_mut(slot) {
                    n.2 = false;
                }
            }
            KIND_WAKE_POLL => {
                if let Some(w) = self.wake_polls.get_mut(slot) {
                    w.1 = false;
                }
            }
            _ => unreachable!("unknown completion kind {kind}"),
        }
    }

    fn arm_accept(&mut self, i: usize) {
        if self.accept_inflight[i] || self.shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let fd = self.listeners[i].as_raw_fd();
        let sqe = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(KIND_ACCEPT, 0, i));
        self.push(sqe);
        self.accept_inflight[i] = true;
    }

    fn on_accept(&mut self, listener: usize, res: i32) {
        self.accept_inflight[listener] = false;
        if res >= 0 {
            // SAFETY: the kernel handed us a new descriptor we now own.
            let fd: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(res as RawFd) };
            let max = self.shared.cfg.limits.conns_max;
            if self.shared.conns_open.fetch_add(1, Ordering::SeqCst) >= max {
                self.shared.conns_open.fetch_sub(1, Ordering::SeqCst);
                metrics::conn_event(ConnEvent::Rejected);
                drop(fd);
            } else {
                self.add_conn(fd);
            }
        }
        self.arm_accept(listener);
    }

    fn add_conn(&mut self, fd: OwnedFd) {
        let raw = fd.as_raw_fd();
        sys::tune_conn(raw);
        let peer = sys::peer_addr(raw).unwrap_or_else(|_| "0.0.0.0:0".parse().unwrap());
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.conns.push(None);
                self.gens.push(0);
                self.conns.len() - 1
            }
        };
        self.gens[slot] = self.gens[slot].wrapping_add(1);
        // The low bits name this core (see `CONN_CORE_BITS`).
        let n = self.shared.next_conn_id.fetch_add(1, Ordering::Relaxed);
        let conn_id = (n << crate::CONN_CORE_BITS) | self.core as u64;
        self.conns[slot] = Some(Conn {
            fd,
            info: ConnInfo { conn_id, peer, core: self.core },
            gen: self.gens[slot],
            rbuf: MmapBuf::new(RECV_SMALL_BYTES),
            rsmall: None,
            recv_streaming: false,
            rpos: 0,
            rfill: 0,
            wbuf: [MmapBuf::new(REPLY_SMALL_BYTES), MmapBuf::new(REPLY_SMALL_BYTES)],
            wsmall: [None, None],
            wlen: [0; 2],
            wcount: [0; 2],
            fill: 0,
            sending: false,
            send_off: 0,
            recv_inflight: false,
            closing: false,
            out: std::collections::VecDeque::new(),
            lent: [Vec::new(), Vec::new()],
            lent_bytes: [0; 2],
            iov: Vec::new(),
            // SAFETY: an all-zero msghdr is valid.
            msg: Box::new(unsafe { std::mem::zeroed() }),
            parked: 0,
            ready: VecDeque::new(),
        });
        metrics::conn_event(ConnEvent::Accepted);
        self.maybe_recv(slot);
    }

    fn conn(&mut self, slot: usize, gen: u32) -> Option<&mut Conn> {
        match self.conns.get_mut(slot) {
            Some(Some(c)) if c.gen & 0x00ff_ffff == gen => Some(c),
            _ => None,
        }
    }

    fn on_recv(&mut self, slot: usize, gen: u32, res: i32) {
        let Some(c) = self.conn(slot, gen) else { return };
        c.recv_inflight = false;
        if res <= 0 {
            // 0: the peer closed; negative: reset or cancelled.
            self.close(slot, false);
        } else {
            c.rfill += res as usize;
            c.recv_streaming = res as usize >= RECV_SMALL_BYTES || c.rfill == c.rbuf.len();
            debug_assert!(c.rfill <= c.rbuf.len());
            self.process(slot);
        }
        self.settle(slot);
    }

    fn on_send(&mut self, slot: usize, gen: u32, res: i32) {
        let Some(c) = self.conn(slot, gen) else { return };
        if res < 0 {
            c.sending = false;
            self.close(slot, false);
            self.settle(slot);
            return;
        }
        let s = c.fill ^ 1;
        c.send_off += res as usize;
        if c.send_off < c.send_len(s) {
            let sqe = send_sqe(c, s, slot);
            self.push(sqe);
            return;
        }
        c.wlen[s] = 0;
        c.wcount[s] = 0;
        c.lent_bytes[s] = 0;
        c.sending = false;
        let c = self.conns[slot].as_mut().expect("checked above");
        // Sent. A busy connection keeps its pool buffer (its next replies
        // go straight into it, no copy) unless another connection waits for
        // one; an idle one gives it back and returns to its own.
        // An idle connection gives back both (the one being filled is
        // empty then): a connection never holds a pool buffer while it has
        // nothing in flight, so whoever waits for one gets it.
        let idle = c.send_len(c.fill) == 0 && c.parked == 0 && c.rpos == c.rfill;
        if idle || self.reply_pool.waited {
            for b in [s, c.fill] {
                if c.wsmall[b].is_some() && c.send_len(b) == 0 {
                    let small = c.wsmall[b].take().expect("checked above");
                    self.reply_pool.give(std::mem::replace(&mut c.wbuf[b], small));
                }
            }
        }
        if c.send_len(c.fill) == 0 {
            // Nothing was queued meanwhile: keep filling the buffer just
            // sent, still in cache, instead of alternating between two
            // cold megabyte-sized buffers (one call at a time, large READs).
            c.fill = s;
        }
        // The pieces lent to the sent replies go back to their owners.
        if let Some(c) = self.conns[slot].as_mut() {
            for l in c.lent[s].drain(..) {
                self.lender.recycle(l.pieces);
            }
        }
        self.process(slot);
        self.settle(slot);
    }

    /// Can this connection take another call right now?
    fn has_room(&self, c: &Conn) -> bool {
        c.inflight() < self.inflight_per_conn_max && self.reply_room(c).0
    }

    /// Is there room for the connection's next reply, whatever its size: in
    /// its buffer being filled, or in a pool buffer it may move to? And is
    /// it the former (`reply_direct`)?
    fn reply_room(&self, c: &Conn) -> (bool, bool) {
        let direct = self.reply_direct(c);
        (direct || (c.wsmall[c.fill].is_none() && self.reply_pool.available()), direct)
    }

    /// Can a maximal reply be written straight into the buffer being filled?
    fn reply_direct(&self, c: &Conn) -> bool {
        c.wbuf[c.fill].len().saturating_sub(c.send_len(c.fill)) >= self.reply_bytes_max
    }

    /// The connection cannot reply for want of a pool buffer: note it, so
    /// that it is read again when one comes back.
    fn note_reply_wait(&mut self, slot: usize) {
        if let Some(c) = &self.conns[slot] {
            if !self.reply_direct(c) && c.wsmall[c.fill].is_none() && !self.reply_pool.available() {
                self.reply_pool.waited = true;
            }
        }
    }

    /// Reply to the connection's completed parked calls while there is
    /// room, then dispatch every complete record that fits its limits.
    fn process(&mut self, slot: usize) {
        let dispatcher = self.shared.dispatcher.clone();
        let record_max = self.record_bytes_max;
        self.resume_ready(slot);
        loop {
            let (room, direct) = match &self.conns[slot] {
                Some(c) if !c.closing => {
                    let (reply_room, direct) = self.reply_room(c);
                    (reply_room && c.inflight() < self.inflight_per_conn_max && c.ready.is_empty(), direct)
                }
                _ => return,
            };
            if !room {
                self.note_reply_wait(slot);
                break;
            }
            let c = self.conns[slot].as_mut().unwrap();
            match record::next_record(&mut c.rbuf, c.rpos, c.rfill, record_max) {
                Next::Record { start, end, consumed } => {
                    if c.parked >= self.parked_per_conn_max {
                        break;
                    }
                    if !self.parks.borrow().has_room(end - start) {
                        // Resumed when a parked call of this core leaves.
                        self.parks.borrow_mut().stalled = true;
                        break;
                    }
                    let f = c.fill;
                    let parker = CoreParker {
                        table: &self.parks,
                        mail: &self.shared.mail,
                        core: self.core,
                        slot,
                        conn_gen: c.gen,
                        info: c.info,
                        again: None,
                    };
                    let record = &c.rbuf[start..end];
                    let (outcome, in_scratch) = if direct {
                        let out = &mut c.wbuf[f][c.wlen[f]..];
                        (dispatcher.handle_parking(&c.info, record, out, Some(&self.lender), &parker), false)
                    } else {
                        // A small buffer: replies the program bounds within
                        // its room go straight in, others to the scratch.
                        let room = c.wbuf[f].len().saturating_sub(c.wlen[f] + c.lent_bytes[f]);
                        let small = &mut c.wbuf[f][c.wlen[f]..c.wlen[f] + room];
                        dispatcher.handle_split(&c.info, record, small, &mut self.scratch, Some(&self.lender), &parker)
                    };
                    match outcome {
                        Outcome::Parked => {
                            // Nothing of the reply was lent (asserted by the dispatcher).
                            let _ = self.lender.take();
                            c.parked += 1;
                        }
                        Outcome::Reply(n) => {
                            let lent = self.lender.take();
                            if in_scratch {
                                let lent_bytes = lent.as_ref().map_or(0, |l| l.len);
                                place(c, &self.scratch, n, lent_bytes, &mut self.reply_pool);
                            }
                            if let Some(mut l) = lent {
                                l.pos += c.wlen[f];
                                c.lent_bytes[f] += l.len;
                                c.lent[f].push(l);
                            }
                            c.wlen[f] += n;
                            c.wcount[f] += 1;
                        }
                        Outcome::Nothing => {}
                        Outcome::Close => {
                            self.close(slot, true);
                            return;
                        }
                    }
                    c.rpos = consumed;
                }
                Next::Incomplete { need } => {
                    // Never move bytes while a receive may be landing in
                    // the tail: it completes into the old offsets.
                    let streaming = c.recv_streaming && self.recv_pool.available() && !self.recv_pool.waited;
                    if !c.recv_inflight && (need > c.rbuf.len() || streaming) && c.rsmall.is_none() {
                        // A record larger than the connection's own buffer
                        // (move to a pool buffer, or wait for one), or a
                        // client sending more than it holds at once (move
                        // while one is free: fewer receives, no compaction).
                        let Some(mut big) = self.recv_pool.take() else { break };
                        let len = c.rfill - c.rpos;
                        big[..len].copy_from_slice(&c.rbuf[c.rpos..c.rfill]);
                        c.rsmall = Some(std::mem::replace(&mut c.rbuf, big));
                        c.rpos = 0;
                        c.rfill = len;
                        break;
                    }
                    if c.rpos == 0 && c.rfill == c.rbuf.len() && !c.recv_inflight && need <= c.rbuf.len() {
                        // Full buffer and still no record: fragment headers
                        // are eating the space. Not a client we can serve.
                        self.close(slot, true);
                        return;
                    }
                    if !c.recv_inflight && c.rpos > 0 && c.rpos + need > c.rbuf.len() {
                        c.rbuf.copy_within(c.rpos..c.rfill, 0);
                        c.rfill -= c.rpos;
                        c.rpos = 0;
                    }
                    break;
                }
                Next::TooLong { .. } => {
                    self.close(slot, true);
                    return;
                }
            }
        }
        let c = self.conns[slot].as_mut().unwrap();
        if c.rpos == c.rfill && !c.recv_inflight {
            c.rpos = 0;
            c.rfill = 0;
            if let Some(small) = c.rsmall.take() {
                // Drained: the pool buffer goes back (a receive always waits
                // in the buffer of an idle connection, so one kept past this
                // point could not be taken back while it idles).
                self.recv_pool.give(std::mem::replace(&mut c.rbuf, small));
            }
        }
    }

    /// Reply to completed parked calls of `slot` while its reply buffer has
    /// room for a maximal reply (out of order: the xid names the call).
    fn resume_ready(&mut self, slot: usize) {
        loop {
            let Some(c) = self.conns[slot].as_ref() else { return };
            if c.closing || c.ready.is_empty() {
                return;
            }
            let (room, direct) = self.reply_room(c);
            if !room {
                self.note_reply_wait(slot);
                return;
            }
            let c = self.conns[slot].as_mut().expect("checked above");
            let i = c.ready.pop_front().expect("checked non-empty");
            let p = self.parks.borrow_mut().remove(i);
            c.parked -= 1;
            let payload = p.payload.expect("ready calls have completed");
            let f = c.fill;
            let out = if direct { &mut c.wbuf[f][c.wlen[f]..] } else { &mut self.scratch[..] };
            let parker = CoreParker {
                table: &self.parks,
                mail: &self.shared.mail,
                core: self.core,
                slot,
                conn_gen: c.gen,
                info: c.info,
                again: Some(p.started),
            };
            let o = self.shared.dispatcher.resume(&c.info, &p.record, &p.state, payload.as_deref(), out, p.started, None, Some(&parker));
            match o {
                Outcome::Reply(n) => {
                    if !direct {
                        place(c, &self.scratch, n, 0, &mut self.reply_pool);
                    }
                    c.wlen[f] += n;
                    c.wcount[f] += 1;
                }
                Outcome::Nothing => {}
                // Waits again (a later operation of its COMPOUND): still
                // this connection's, answered by a later completion.
                Outcome::Parked => c.parked += 1,
                Outcome::Close => {
                    self.close(slot, true);
                    return;
                }
            }
        }
    }

    /// Completions of parked calls arrived: queue each on its connection
    /// (dropped when that connection has gone) and answer what fits.
    fn on_done(&mut self) {
        let mut done = std::mem::take(&mut self.done_spare);
        {
            let mut q = self.shared.mail.boxes[self.core].done.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *q, &mut done);
        }
        if done.is_empty() {
            self.done_spare = done;
            return;
        }
        let mut touched = std::mem::take(&mut self.touched_spare);
        touched.clear();
        for (i, gen, payload) in done.drain(..) {
            let (slot, conn_gen) = {
                let mut t = self.parks.borrow_mut();
                let Some(p) = t.get_mut(i, gen) else { continue };
                debug_assert!(p.payload.is_none(), "a ticket completes once");
                p.payload = Some(payload);
                (p.slot, p.conn_gen)
            };
            match self.conn(slot, conn_gen & 0x00ff_ffff) {
                Some(c) if c.gen == conn_gen && !c.closing => {
                    c.ready.push_back(i);
                    if !touched.contains(&slot) {
                        touched.push(slot);
                    }
                }
                _ => {
                    // Its connection closed: nobody to answer, but the call
                    // still ends — its reply goes to the duplicate-request
                    // cache (a retransmission on a new connection gets it)
                    // and an NFSv4 COMPOUND gives its session slot back.
                    let p = self.parks.borrow_mut().remove(i);
                    let payload = p.payload.expect("completed above");
                    let parker = CoreParker {
                        table: &self.parks,
                        mail: &self.shared.mail,
                        core: self.core,
                        slot,
                        conn_gen,
                        info: p.info,
                        again: Some(p.started),
                    };
                    let o = self.shared.dispatcher.resume(&p.info, &p.record, &p.state, payload.as_deref(), &mut self.scratch[..], p.started, None, Some(&parker));
                    if o != Outcome::Parked {
                        // (Parked again: it stays counted on its closing
                        // connection until it ends.)
                        self.conn_lost_park(slot, conn_gen);
                    }
                }
            }
        }
        for &slot in &touched {
            self.process(slot);
            self.settle(slot);
        }
        self.done_spare = done;
        self.touched_spare = touched;
        self.unstall();
    }

    /// A closed connection's parked call left the table.
    fn conn_lost_park(&mut self, slot: usize, conn_gen: u32) {
        if let Some(Some(c)) = self.conns.get_mut(slot) {
            if c.gen == conn_gen {
                c.parked -= 1;
            }
        }
    }

    /// After parked calls left a table that had stalled connections, or
    /// pool buffers came back that connections waited for, read them again.
    fn unstall(&mut self) {
        if !self.recv_pool.waited && !self.reply_pool.waited && !self.parks.get_mut().stalled {
            return;
        }
        let stalled = {
            let mut t = self.parks.borrow_mut();
            let go = t.stalled && !t.full();
            if go {
                t.stalled = false;
            }
            go
        };
        let pools = (self.recv_pool.waited && self.recv_pool.available())
            || (self.reply_pool.waited && self.reply_pool.available());
        if pools {
            self.recv_pool.waited = false;
            self.reply_pool.waited = false;
        }
        if stalled || pools {
            for slot in 0..self.conns.len() {
                if self.conns[slot].is_some() {
                    self.process(slot);
                    self.settle(slot);
                }
            }
        }
    }

    /// Start sends and receives the connection is ready for; free it once
    /// closed with nothing in flight.
    fn settle(&mut self, slot: usize) {
        self.maybe_send(slot);
        self.maybe_recv(slot);
        let done = matches!(&self.conns[slot], Some(c) if c.closing && !c.recv_inflight && !c.sending);
        if done {
            let mut c = self.conns[slot].take().expect("checked above");
            if let Some(small) = c.rsmall.take() {
                self.recv_pool.give(std::mem::replace(&mut c.rbuf, small));
            }
            for s in 0..2 {
                if let Some(small) = c.wsmall[s].take() {
                    self.reply_pool.give(std::mem::replace(&mut c.wbuf[s], small));
                }
            }
            for &i in &c.ready {
                self.parks.borrow_mut().remove(i);
            }
            self.shared.dispatcher.conn_closed(&c.info);
            self.free.push(slot);
            self.shared.conns_open.fetch_sub(1, Ordering::SeqCst);
            metrics::conn_event(ConnEvent::Closed);
        }
    }

    fn maybe_send(&mut self, slot: usize) {
        let Some(c) = self.conns[slot].as_mut() else { return };
        // Queued server-initiated records join the buffer being filled
        // while they fit; the rest wait for the next send to complete.
        while let Some(r) = c.out.front() {
            let f = c.fill;
            if c.wbuf[f].len() - c.wlen[f] < r.len() {
                // A record larger than the connection's own buffer moves it
                // to a pool buffer; otherwise it waits for the next send.
                let fits_big = c.wlen[f] + r.len() <= self.reply_pool.buf_bytes();
                if c.wsmall[f].is_some() || !fits_big || !move_to_pool(c, f, &mut self.reply_pool) {
                    break;
                }
                continue;
            }
            let r = c.out.pop_front().expect("front exists");
            c.wbuf[f][c.wlen[f]..c.wlen[f] + r.len()].copy_from_slice(&r);
            c.wlen[f] += r.len();
        }
        if c.sending || c.wlen[c.fill] == 0 || c.closing {
            return;
        }
        let s = c.fill;
        c.fill ^= 1;
        c.sending = true;
        c.send_off = 0;
        let sqe = send_sqe(c, s, slot);
        self.push(sqe);
    }

    fn maybe_recv(&mut self, slot: usize) {
        let room = match &self.conns[slot] {
            Some(c) => !c.closing && !c.recv_inflight && c.rfill < c.rbuf.len() && self.has_room(c),
            None => false,
        };
        if !room {
            return;
        }
        let c = self.conns[slot].as_mut().unwrap();
        c.recv_inflight = true;
        let ptr = c.rbuf[c.rfill..].as_mut_ptr();
        let len = (c.rbuf.len() - c.rfill) as u32;
        let sqe = opcode::Recv::new(types::Fd(c.fd.as_raw_fd()), ptr, len)
            .build()
            .user_data(user_data(KIND_RECV, c.gen, slot));
        self.push(sqe);
    }

    fn arm_wake(&mut self) {
        if self.wake_inflight {
            return;
        }
        let fd = self.shared.mail.boxes[self.core].efd.as_raw_fd();
        let buf = &mut *self.wake_buf as *mut u64 as *mut u8;
        let sqe = opcode::Read::new(types::Fd(fd), buf, 8).build().user_data(user_data(KIND_WAKE, 0, 0));
        self.push(sqe);
        self.wake_inflight = true;
    }

    /// A control thread queued records for connections of this core: move
    /// each to its connection and start sending.
    fn on_wake(&mut self) {
        self.wake_inflight = false;
        self.on_done();
        let batch: Vec<(u64, Vec<u8>)> = {
            let mut q = self.shared.mail.boxes[self.core].queue.lock().unwrap_or_else(|e| e.into_inner());
            q.drain(..).collect()
        };
        for (conn_id, rec) in batch {
            let slot = self.conns.iter().position(|c| matches!(c, Some(c) if c.info.conn_id == conn_id && !c.closing));
            let Some(slot) = slot else {
                eprintln!("chimera-core-{}: server-initiated record for closed connection {conn_id}: dropped", self.core);
                continue;
            };
            let c = self.conns[slot].as_mut().expect("found above");
            if c.out.len() >= OUT_PENDING_PER_CONN_MAX {
                eprintln!("chimera-core-{}: connection {conn_id} has {} records waiting: dropped one", self.core, c.out.len());
                continue;
            }
            c.out.push_back(rec);
            self.settle(slot);
        }
        if !self.shared.stop.load(Ordering::Relaxed) {
            self.arm_wake();
        }
    }

    /// Begin closing: in-flight operations are woken by the shutdown and the
    /// slot is freed in `settle` once they complete.
    fn close(&mut self, slot: usize, protocol_error: bool) {
        if let Some(c) = self.conns[slot].as_mut() {
            if !c.closing {
                c.closing = true;
                if protocol_error {
                    metrics::conn_event(ConnEvent::ProtocolError);
                }
                unsafe { libc::shutdown(c.fd.as_raw_fd(), libc::SHUT_RDWR) };
            }
        }
    }

    fn shutdown(&mut self, batch: &mut Vec<(u64, i32)>) {
        for l in &self.listeners {
            unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for slot in 0..self.conns.len() {
            self.close(slot, false);
            self.settle(slot);
        }
        let deadline = Instant::now() + SHUTDOWN_DRAIN;
        loop {
            if self.wake_inflight {
                // Complete the pending eventfd read: its buffer lives in self.
                self.shared.mail.wake(self.core);
            }
            // Device reads in flight still answer (and free their calls).
            let turn = self.poll_backends();
            let busy = self.wake_inflight
                || self.accept_inflight.iter().any(|&a| a)
                || self.conns.iter().any(|c| c.is_some())
                || turn.busy;
            if !busy || Instant::now() > deadline {
                // An eventfd read still armed may complete after the loop
                // is gone: its target must outlive it.
                for (_, buf, armed) in std::mem::take(&mut self.notify) {
                    if armed {
                        std::mem::forget(buf);
                    }
                }
                break;
            }
            if !self.timeout_armed {
                let ts = &self.ts as *const types::Timespec;
                self.push(opcode::Timeout::new(ts).build().user_data(user_data(KIND_TIMEOUT, 0, 0)));
                self.timeout_armed = true;
            }
            let _ = self.ring.submit_and_wait(1);
            self.drain(batch);
            for &(ud, res) in batch.iter() {
                self.complete(ud, res);
            }
        }
    }
}
