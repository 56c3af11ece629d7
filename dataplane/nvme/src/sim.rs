//! A software NVMe controller behind the `Bus` trait, for tests on machines
//! without VFIO: a thread that watches the register file and doorbells the
//! way a controller does, executes admin and NVM commands against an
//! in-memory namespace, and posts completions with phase tags. DMA
//! addresses are the process's own addresses (identity IOVAs).
//!
//! Fault injection (`SimFaults`) makes it swallow commands (never complete
//! them), ignore aborts, or answer a status, so the driver's timeout,
//! abort and reset paths run in `cargo test`. It is a model of the
//! specification's behaviour the driver relies on, not a full controller;
//! the QEMU guest test drives the real driver against QEMU's controller.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::bus::Bus;
use crate::spec::*;

const BAR_BYTES: usize = 0x2000;

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub name: String,
    /// Namespace size in logical blocks of `lba_bytes`.
    pub lbas: u64,
    pub lba_bytes: u32,
    pub serial: String,
    pub model: String,
    /// MDTS (transfer limit = 2^mdts pages; 0 = none).
    pub mdts: u8,
    /// Entries per queue the controller allows.
    pub mqes: u16,
    /// I/O queue pairs it grants at most.
    pub queues_max: u16,
    pub write_zeroes: bool,
    /// An active namespace 1 (false: a controller with none).
    pub namespace: bool,
    /// Bytes of metadata per block in the namespace's format.
    pub metadata: u16,
    /// SGLs supported (SGLS bit 0).
    pub sgl: bool,
    /// MSI-X vectors it offers (`Bus::enable_irqs`): a completion on a
    /// queue created with interrupts on (IEN) signals its vector's eventfd,
    /// as VFIO does for a real controller. 0: completions are only polled.
    pub irq_vectors: u16,
}

impl SimConfig {
    pub fn new(name: &str, lbas: u64, lba_bytes: u32) -> SimConfig {
        SimConfig {
            name: name.into(),
            lbas,
            lba_bytes,
            serial: "SIM0001".into(),
            model: "chimera simulated controller".into(),
            mdts: 5,
            mqes: 127,
            queues_max: 4,
            write_zeroes: true,
            namespace: true,
            metadata: 0,
            sgl: true,
            irq_vectors: 0,
        }
    }
}

/// Faults the controller injects, changed at run time.
#[derive(Default)]
pub struct SimFaults {
    /// The next N I/O commands are taken and never completed.
    pub swallow: AtomicU32,
    /// Abort commands do nothing (the command stays lost until a reset).
    pub ignore_aborts: AtomicBool,
    /// The next I/O command completes with this status (0 = none).
    pub status_once: AtomicU16,
    /// Ignore CC.EN (the controller never becomes ready).
    pub dead: AtomicBool,
    /// Commands seen with SGL (PSDT 01b) and with PRP data pointers.
    pub sgl_commands: AtomicU32,
    pub prp_commands: AtomicU32,
    /// While set, I/O submission queues are not looked at: commands wait
    /// (a slow device), then run once it is cleared.
    pub hold: AtomicBool,
    /// Interrupts signalled (eventfd writes).
    pub irqs: AtomicU32,
}

struct Queue {
    base: usize,
    entries: u16,
    head: u16,
    cqid: u16,
}

struct Cq {
    base: usize,
    entries: u16,
    tail: u16,
    phase: bool,
    /// The vector it signals (IEN set at creation).
    vector: Option<u16>,
}

struct Ctl {
    sqs: HashMap<u16, Queue>,
    cqs: HashMap<u16, Cq>,
    lost: Vec<(u16, u16)>,
    ready: bool,
}

struct State {
    cfg: SimConfig,
    bar: Box<[AtomicU32]>,
    store: Mutex<Vec<u8>>,
    faults: Arc<SimFaults>,
    stop: AtomicBool,
    /// One eventfd per vector turned on (`enable_irqs`).
    irq_fds: Mutex<Vec<std::os::fd::OwnedFd>>,
}

pub struct SimBus {
    st: Arc<State>,
    thread: Option<JoinHandle<()>>,
}

impl SimBus {
    pub fn new(cfg: SimConfig) -> SimBus {
        let bar: Box<[AtomicU32]> = (0..BAR_BYTES / 4).map(|_| AtomicU32::new(0)).collect();
        let dstrd = 0u64;
        let to = 2u64; // 1 s
        let cap = (cfg.mqes as u64) | 1 << 16 | to << 24 | dstrd << 32 | 1 << 37;
        bar[REG_CAP / 4].store(cap as u32, Ordering::Relaxed);
        bar[REG_CAP / 4 + 1].store((cap >> 32) as u32, Ordering::Relaxed);
        bar[REG_VS / 4].store(0x0001_0400, Ordering::Relaxed);
        let bytes = (cfg.lbas * cfg.lba_bytes as u64) as usize;
        let st = Arc::new(State { cfg, bar, store: Mutex::new(vec![0u8; bytes]), faults: Arc::new(SimFaults::default()), stop: AtomicBool::new(false), irq_fds: Mutex::new(Vec::new()) });
        let s2 = st.clone();
        let thread = std::thread::Builder::new().name("nvme-sim".into()).spawn(move || run(&s2)).expect("spawn the simulated controller");
        SimBus { st, thread: Some(thread) }
    }

    pub fn faults(&self) -> Arc<SimFaults> {
        self.st.faults.clone()
    }

    /// A copy of the namespace's bytes `[off, off + len)`.
    pub fn read_store(&self, off: usize, len: usize) -> Vec<u8> {
        self.st.store.lock().unwrap()[off..off + len].to_vec()
    }
}

impl Drop for SimBus {
    fn drop(&mut self) {
        self.st.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Bus for SimBus {
    fn name(&self) -> &str {
        &self.st.cfg.name
    }

    fn bar0(&self) -> (NonNull<u8>, usize) {
        (NonNull::new(self.st.bar.as_ptr() as *mut u8).expect("non-null"), BAR_BYTES)
    }

    fn map_dma(&self, vaddr: *const u8, _len: usize) -> Result<u64, String> {
        Ok(vaddr as u64)
    }

    fn unmap_dma(&self, _iova: u64, _len: usize) {}

    fn enable_irqs(&self, want: usize) -> Result<usize, String> {
        let mut fds = self.st.irq_fds.lock().expect("irq fds");
        while fds.len() < want.min(self.st.cfg.irq_vectors as usize) {
            // SAFETY: a new eventfd, owned at once.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
            }
            // SAFETY: just created, not owned elsewhere.
            fds.push(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        }
        Ok(fds.len())
    }

    fn irq_fd(&self, vector: usize) -> Option<std::os::fd::RawFd> {
        self.st.irq_fds.lock().expect("irq fds").get(vector).map(|f| f.as_raw_fd())
    }
}

fn reg(st: &State, off: usize) -> u32 {
    st.bar[off / 4].load(Ordering::Acquire)
}

fn set_reg(st: &State, off: usize, v: u32) {
    st.bar[off / 4].store(v, Ordering::Release);
}

fn run(st: &State) {
    let mut ctl = Ctl { sqs: HashMap::new(), cqs: HashMap::new(), lost: Vec::new(), ready: false };
    while !st.stop.load(Ordering::Acquire) {
        let cc = reg(st, REG_CC);
        let en = cc & CC_EN != 0 && !st.faults.dead.load(Ordering::Relaxed);
        if en && !ctl.ready {
            let aqa = reg(st, REG_AQA);
            let asq = reg(st, REG_ASQ) as u64 | (reg(st, REG_ASQ + 4) as u64) << 32;
            let acq = reg(st, REG_ACQ) as u64 | (reg(st, REG_ACQ + 4) as u64) << 32;
            ctl.sqs.clear();
            ctl.cqs.clear();
            ctl.lost.clear();
            for i in 0..(BAR_BYTES - REG_DOORBELLS) / 4 {
                set_reg(st, REG_DOORBELLS + 4 * i, 0);
            }
            ctl.sqs.insert(0, Queue { base: asq as usize, entries: (aqa & 0xfff) as u16 + 1, head: 0, cqid: 0 });
            ctl.cqs.insert(0, Cq { base: acq as usize, entries: ((aqa >> 16) & 0xfff) as u16 + 1, tail: 0, phase: true, vector: None });
            ctl.ready = true;
            set_reg(st, REG_CSTS, CSTS_RDY);
        } else if !en && ctl.ready {
            ctl.ready = false;
            ctl.sqs.clear();
            ctl.cqs.clear();
            set_reg(st, REG_CSTS, 0);
        }
        let mut busy = false;
        if ctl.ready {
            let mut qids: Vec<u16> = ctl.sqs.keys().copied().collect();
            qids.sort();
            let held = st.faults.hold.load(Ordering::Acquire);
            for qid in qids.into_iter().filter(|q| *q == 0 || !held) {
                busy |= drain_sq(st, &mut ctl, qid);
            }
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// Process what the driver queued on SQ `qid`; whether anything was done.
fn drain_sq(st: &State, ctl: &mut Ctl, qid: u16) -> bool {
    let tail = reg(st, REG_DOORBELLS + 8 * qid as usize) as u16;
    let mut did = false;
    loop {
        let Some(q) = ctl.sqs.get(&qid) else { return did };
        if q.head == tail % q.entries {
            return did;
        }
        let cqid = q.cqid;
        // Room in the CQ? (its head doorbell is what the host consumed)
        let Some(cq) = ctl.cqs.get(&cqid) else { return did };
        let cq_head = reg(st, REG_DOORBELLS + 8 * cqid as usize + 4) as u16;
        if (cq.tail + 1) % cq.entries == cq_head % cq.entries {
            return did;
        }
        fence(Ordering::Acquire);
        // SAFETY: identity DMA: the SQ ring the driver created.
        let sqe = unsafe { std::ptr::read_volatile((q.base + q.head as usize * SQE_BYTES) as *const Sqe) };
        let head = (q.head + 1) % q.entries;
        ctl.sqs.get_mut(&qid).expect("present").head = head;
        did = true;
        let (result, status) = if qid == 0 { admin(st, ctl, &sqe) } else { io(st, ctl, qid, &sqe) };
        if status == u16::MAX {
            continue; // swallowed
        }
        if let Some(v) = post(ctl, cqid, qid, head, sqe.cid(), result, status) {
            signal(st, v);
        }
    }
}

/// Raise vector `v`: its eventfd counts one more (what VFIO does on an
/// MSI-X message).
fn signal(st: &State, v: u16) {
    if let Some(fd) = st.irq_fds.lock().expect("irq fds").get(v as usize) {
        st.faults.irqs.fetch_add(1, Ordering::Relaxed);
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 bytes to an eventfd we own; a full counter (never, in
        // a test) would only drop this wakeup.
        let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// Write a completion entry; the vector to raise, when its queue has one.
fn post(ctl: &mut Ctl, cqid: u16, sqid: u16, sq_head: u16, cid: u16, result: u32, status: u16) -> Option<u16> {
    let cq = ctl.cqs.get_mut(&cqid)?;
    let cqe = Cqe { result, rsvd: 0, sq: sq_head as u32 | (sqid as u32) << 16, status_cid: cid as u32 | (cq.phase as u32) << 16 | (status as u32) << 17 };
    // SAFETY: identity DMA: the CQ ring the driver created. The phase word
    // is written last.
    unsafe {
        let p = (cq.base + cq.tail as usize * CQE_BYTES) as *mut u32;
        std::ptr::write_volatile(p, cqe.result);
        std::ptr::write_volatile(p.add(1), 0);
        std::ptr::write_volatile(p.add(2), cqe.sq);
        fence(Ordering::Release);
        std::ptr::write_volatile(p.add(3), cqe.status_cid);
    }
    cq.tail = (cq.tail + 1) % cq.entries;
    if cq.tail == 0 {
        cq.phase = !cq.phase;
    }
    cq.vector
}

fn status(sct: u8, sc: u8) -> u16 {
    (sct as u16) << 8 | sc as u16
}

fn admin(st: &State, ctl: &mut Ctl, s: &Sqe) -> (u32, u16) {
    let cfg = &st.cfg;
    match s.opcode() {
        ADM_IDENTIFY => {
            let mut page = vec![0u8; PAGE_BYTES];
            match s.cdw10 & 0xff {
                CNS_CONTROLLER => {
                    let put = |page: &mut Vec<u8>, r: std::ops::Range<usize>, t: &str| {
                        let mut b = t.as_bytes().to_vec();
                        b.resize(r.len(), b' ');
                        page[r].copy_from_slice(&b);
                    };
                    put(&mut page, idc::SN, &cfg.serial);
                    put(&mut page, idc::MN, &cfg.model);
                    put(&mut page, idc::FR, "1.0");
                    page[idc::MDTS] = cfg.mdts;
                    page[idc::NN..idc::NN + 4].copy_from_slice(&1u32.to_le_bytes());
                    let oncs = if cfg.write_zeroes { ONCS_WRITE_ZEROES | ONCS_DSM } else { ONCS_DSM };
                    page[idc::ONCS..idc::ONCS + 2].copy_from_slice(&oncs.to_le_bytes());
                    page[idc::VWC] = 1;
                    if cfg.sgl {
                        page[idc::SGLS] = 1;
                    }
                }
                CNS_ACTIVE_NS_LIST => {
                    if cfg.namespace {
                        page[0..4].copy_from_slice(&1u32.to_le_bytes());
                    }
                }
                CNS_NAMESPACE => {
                    if s.nsid != 1 || !cfg.namespace {
                        return (0, status(0, SC_INVALID_NAMESPACE));
                    }
                    page[0..8].copy_from_slice(&cfg.lbas.to_le_bytes());
                    page[8..16].copy_from_slice(&cfg.lbas.to_le_bytes());
                    let lbads = cfg.lba_bytes.trailing_zeros();
                    let lbaf = (cfg.metadata as u32) | lbads << 16;
                    page[idn::LBAF0..idn::LBAF0 + 4].copy_from_slice(&lbaf.to_le_bytes());
                }
                _ => return (0, status(0, SC_INVALID_FIELD)),
            }
            // SAFETY: identity DMA into the driver's 4 KiB data page.
            unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), s.prp1 as usize as *mut u8, PAGE_BYTES) };
            (0, 0)
        }
        ADM_SET_FEATURES if s.cdw10 & 0xff == FEAT_NUM_QUEUES => {
            let n = ((s.cdw11 & 0xffff) + 1).min(cfg.queues_max as u32) - 1;
            (n | n << 16, 0)
        }
        ADM_CREATE_CQ => {
            let qid = s.cdw10 as u16;
            let entries = (s.cdw10 >> 16) as u16 + 1;
            if qid == 0 || qid > cfg.queues_max || ctl.cqs.contains_key(&qid) {
                return (0, status(1, SC_INVALID_QUEUE_ID));
            }
            if entries > cfg.mqes + 1 || entries < 2 {
                return (0, status(1, SC_INVALID_QUEUE_SIZE));
            }
            let vector = (s.cdw11 & 0b10 != 0).then_some((s.cdw11 >> 16) as u16);
            ctl.cqs.insert(qid, Cq { base: s.prp1 as usize, entries, tail: 0, phase: true, vector });
            (0, 0)
        }
        ADM_CREATE_SQ => {
            let qid = s.cdw10 as u16;
            let entries = (s.cdw10 >> 16) as u16 + 1;
            let cqid = (s.cdw11 >> 16) as u16;
            if qid == 0 || qid > cfg.queues_max || ctl.sqs.contains_key(&qid) || !ctl.cqs.contains_key(&cqid) {
                return (0, status(1, SC_INVALID_QUEUE_ID));
            }
            ctl.sqs.insert(qid, Queue { base: s.prp1 as usize, entries, head: 0, cqid });
            (0, 0)
        }
        ADM_DELETE_SQ => {
            ctl.sqs.remove(&(s.cdw10 as u16));
            (0, 0)
        }
        ADM_DELETE_CQ => {
            ctl.cqs.remove(&(s.cdw10 as u16));
            (0, 0)
        }
        ADM_ABORT => {
            let (sqid, cid) = (s.cdw10 as u16, (s.cdw10 >> 16) as u16);
            if st.faults.ignore_aborts.load(Ordering::Relaxed) {
                return (1, 0); // "not aborted"
            }
            if let Some(i) = ctl.lost.iter().position(|&x| x == (sqid, cid)) {
                ctl.lost.swap_remove(i);
                let (cqid, head) = match ctl.sqs.get(&sqid) {
                    Some(q) => (q.cqid, q.head),
                    None => return (1, 0),
                };
                if let Some(v) = post(ctl, cqid, sqid, head, cid, 0, status(0, SC_ABORT_REQUESTED)) {
                    signal(st, v);
                }
                return (0, 0);
            }
            (1, 0)
        }
        _ => (0, status(0, SC_INVALID_OPCODE)),
    }
}

/// Copy between the namespace and the memory a command's data pointer
/// names: one SGL data block, or PRP entries.
fn transfer(s: &Sqe, bytes: usize, mut f: impl FnMut(usize, *mut u8, usize)) {
    if (s.cdw0 >> 14) & 3 == 1 {
        f(0, s.prp1 as usize as *mut u8, bytes);
        return;
    }
    let pages = bytes.div_ceil(PAGE_BYTES);
    let page = |i: usize| -> usize {
        match (i, pages) {
            (0, _) => s.prp1 as usize,
            (1, 2) => s.prp2 as usize,
            // SAFETY: identity DMA: the driver's PRP list.
            _ => unsafe { std::ptr::read_volatile((s.prp2 as usize as *const u64).add(i - 1)) as usize },
        }
    };
    for i in 0..pages {
        let n = (bytes - i * PAGE_BYTES).min(PAGE_BYTES);
        f(i * PAGE_BYTES, page(i) as *mut u8, n);
    }
}

fn io(st: &State, ctl: &mut Ctl, qid: u16, s: &Sqe) -> (u32, u16) {
    let f = &st.faults;
    if f.swallow.load(Ordering::Relaxed) > 0 {
        f.swallow.fetch_sub(1, Ordering::Relaxed);
        ctl.lost.push((qid, s.cid()));
        return (0, u16::MAX);
    }
    let once = f.status_once.swap(0, Ordering::Relaxed);
    if once != 0 {
        return (0, once);
    }
    let cfg = &st.cfg;
    if s.nsid != 1 || !cfg.namespace {
        return (0, status(0, SC_INVALID_NAMESPACE));
    }
    let lb = cfg.lba_bytes as usize;
    match s.opcode() {
        IO_FLUSH => (0, 0),
        IO_READ | IO_WRITE | IO_WRITE_ZEROES => {
            let (slba, nlb) = (s.slba(), s.nlb() as u64);
            if slba.checked_add(nlb).is_none_or(|e| e > cfg.lbas) {
                return (0, status(0, SC_LBA_OUT_OF_RANGE));
            }
            let bytes = nlb as usize * lb;
            if s.opcode() != IO_WRITE_ZEROES && cfg.mdts != 0 && bytes > (PAGE_BYTES << cfg.mdts) {
                return (0, status(0, SC_INVALID_FIELD));
            }
            let at = slba as usize * lb;
            if s.opcode() != IO_WRITE_ZEROES {
                if (s.cdw0 >> 14) & 3 == 1 {
                    if !cfg.sgl || s.prp2 >> 56 != 0 {
                        return (0, status(0, SC_INVALID_FIELD));
                    }
                    if s.prp2 as u32 as usize != bytes {
                        return (0, status(0, 0x0f)); // data SGL length invalid
                    }
                    f.sgl_commands.fetch_add(1, Ordering::Relaxed);
                } else {
                    f.prp_commands.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut store = st.store.lock().unwrap();
            match s.opcode() {
                IO_READ => transfer(s, bytes, |off, p, n| {
                    // SAFETY: identity DMA into the driver's buffer.
                    unsafe { std::ptr::copy_nonoverlapping(store[at + off..].as_ptr(), p, n) }
                }),
                IO_WRITE => transfer(s, bytes, |off, p, n| {
                    // SAFETY: identity DMA from the driver's buffer.
                    unsafe { std::ptr::copy_nonoverlapping(p, store[at + off..].as_mut_ptr(), n) }
                }),
                _ => store[at..at + bytes].fill(0),
            }
            (0, 0)
        }
        IO_DSM => (0, 0),
        _ => (0, status(0, SC_INVALID_OPCODE)),
    }
}
