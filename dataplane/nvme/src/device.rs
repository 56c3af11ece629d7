//! The controller and its queues: bring-up (reset, admin queue, Identify,
//! number of queues), one I/O queue pair per `BlockQueue` while the
//! controller has pairs to give (then queues share pairs under a lock),
//! PRP lists, polled completions, command timeouts (abort, then a
//! controller reset that fails every command in flight back as an I/O
//! error), and the `BlockDevice` / `BlockQueue` contract of the block layer.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use block::{BlockDevice, BlockError, BlockQueue, BufPool, Completion, DeviceInfo, ErrorKind, Op, OpKind, Rejected, BLOCK_BYTES};

use crate::bus::{Bus, DmaMem, Regs};
use crate::spec::*;
use block::stats::{Snapshot, Stats};

/// Pages one command may carry: PRP1 plus a 63-entry list in a 512-byte
/// slot per command (256 KiB), or less when the controller's MDTS says so.
const CMD_PAGES_MAX: u32 = 64;
const PRP_SLOT_BYTES: usize = 512;
const ADMIN_ENTRIES: u16 = 32;
/// Buffer pools a device keeps registered for DMA at once (each stays
/// mapped, and alive, until no one else holds it).
const REGIONS_MAX: usize = 64;
/// Status the driver records for a command failed back by a reset.
const STATUS_RESET: u16 = 0xffff;
/// How often a queue looks for overdue commands.
const TIMEOUT_SCAN: Duration = Duration::from_millis(20);
/// `wait`: how long it polls before it sleeps, and the longest sleep on a
/// queue's interrupt eventfd before it looks again (timeouts are scanned
/// then).
const WAIT_SPIN: Duration = Duration::from_micros(100);
const WAIT_SLEEP_MAX: Duration = Duration::from_millis(20);

#[derive(Debug, Clone)]
pub struct Options {
    /// I/O queue pairs to ask the controller for (it may grant fewer).
    pub io_queues_max: u16,
    /// Entries per I/O queue (capped by CAP.MQES).
    pub queue_entries: u16,
    /// A command not completed in this time is aborted; one still not
    /// completed after as long again resets the controller.
    pub io_timeout: Duration,
    /// Bound on each admin command.
    pub admin_timeout: Duration,
    /// Queue memory from 2 MiB hugepages (falls back to ordinary pages).
    pub hugepages: bool,
    /// Describe each read/write buffer with one SGL data block when the
    /// controller supports SGLs (else, or when false, PRP lists).
    pub sgl: bool,
    /// Driver tests only: let requests past the namespace's end reach the
    /// controller (to see its LBA-out-of-range status come back).
    pub pass_out_of_range: bool,
    /// Completion interrupts (MSI-X through the bus, one vector per I/O
    /// pair): a queue with I/O in flight hands its loop an eventfd to
    /// sleep on (`notify_fd`) instead of being polled until it is idle.
    pub interrupts: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            io_queues_max: 64,
            queue_entries: 256,
            io_timeout: Duration::from_secs(30),
            admin_timeout: Duration::from_secs(10),
            hugepages: false,
            sgl: true,
            pass_out_of_range: false,
            interrupts: true,
        }
    }
}

/// What the controller and its namespace said about themselves.
#[derive(Debug, Clone)]
pub struct Identity {
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// NVMe version (major, minor).
    pub version: (u16, u8),
    pub nsid: u32,
    /// Namespace size in its own logical blocks, and their size.
    pub lbas: u64,
    pub lba_bytes: u32,
    /// Largest transfer per command (MDTS), if the controller limits it.
    pub mdts_bytes: Option<u64>,
    pub write_zeroes: bool,
    pub deallocate: bool,
    pub volatile_write_cache: bool,
    /// The controller supports SGLs for the NVM command set (SGLS).
    pub sgl: bool,
    pub io_queues: u16,
    pub queue_entries: u16,
    pub doorbell_stride: usize,
    /// MSI-X vectors on (`Options::interrupts`): vector 0 the admin
    /// queue's, vector q the I/O pair q's; pairs past them are polled only.
    pub irq_vectors: u16,
}

struct Admin {
    mem: DmaMem,
    tail: u16,
    head: u16,
    phase: bool,
    cid: u16,
}

struct Slot {
    busy: bool,
    owner: u16,
    op: u32,
    started: Instant,
    aborted: Option<Instant>,
}

struct HwQueue {
    qid: u16,
    entries: u16,
    mem: DmaMem,
    cq_off: usize,
    prp_off: usize,
    sq_tail: u16,
    sq_head: u16,
    cq_head: u16,
    phase: bool,
    rung: u16,
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// Finished commands per attached queue: (op, status).
    reaped: Vec<Vec<(u32, u16)>>,
    attached: Vec<bool>,
}

impl HwQueue {
    fn layout(entries: u16) -> (usize, usize, usize) {
        let cq_off = (entries as usize * SQE_BYTES).div_ceil(PAGE_BYTES) * PAGE_BYTES;
        let prp_off = cq_off + (entries as usize * CQE_BYTES).div_ceil(PAGE_BYTES) * PAGE_BYTES;
        (cq_off, prp_off, prp_off + entries as usize * PRP_SLOT_BYTES)
    }

    fn reset_rings(&mut self) {
        self.mem.zero();
        self.sq_tail = 0;
        self.sq_head = 0;
        self.cq_head = 0;
        self.rung = 0;
        self.phase = true;
    }

    fn full(&self) -> bool {
        self.free.is_empty() || (self.sq_tail + 1) % self.entries == self.sq_head
    }
}

struct Region {
    base: usize,
    len: usize,
    iova: u64,
    _pool: BufPool,
    _map: RegionMap,
}

/// Unmaps a registered pool's IOVA range when the device goes.
struct RegionMap {
    bus: Arc<dyn Bus>,
    iova: u64,
    len: usize,
}

impl Drop for RegionMap {
    fn drop(&mut self) {
        self.bus.unmap_dma(self.iova, self.len);
    }
}

struct Shared {
    info: DeviceInfo,
    regs: Regs,
    cap: Cap,
    opts: Options,
    ident: Identity,
    /// 4 KiB blocks to logical blocks: `lba << shift`.
    shift: u32,
    /// 4 KiB blocks per read/write command, and per write-zeroes command.
    rw_blocks_max: u32,
    wz_blocks_max: u64,
    /// Reads and writes carry one SGL data block descriptor.
    use_sgl: bool,
    admin: Mutex<Admin>,
    hw: Mutex<Vec<Arc<Mutex<HwQueue>>>>,
    regions: RwLock<Vec<Region>>,
    zero_page: DmaMem,
    stats: Stats,
    failed: AtomicBool,
    failure: Mutex<String>,
    resetting: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn db_sq(&self, qid: u16) -> usize {
        REG_DOORBELLS + (2 * qid as usize) * self.ident.doorbell_stride
    }
    fn db_cq(&self, qid: u16) -> usize {
        REG_DOORBELLS + (2 * qid as usize + 1) * self.ident.doorbell_stride
    }

    fn err(&self, op: OpKind, offset: Option<u64>, kind: ErrorKind) -> BlockError {
        BlockError::new(&self.info.name, op, offset, kind)
    }

    fn fail(&self, why: String) {
        *lock(&self.failure) = why;
        self.failed.store(true, Ordering::Release);
    }

    fn failure(&self) -> String {
        lock(&self.failure).clone()
    }
}

/// Run one admin command and wait for its completion (bounded).
fn admin_cmd(regs: &Regs, stride: usize, timeout: Duration, adm: &mut Admin, mut sqe: Sqe) -> Result<Cqe, String> {
    let cid = adm.cid;
    adm.cid = adm.cid.wrapping_add(1);
    sqe.cdw0 = (sqe.cdw0 & 0xffff) | (cid as u32) << 16;
    // SAFETY: the slot lies in the admin SQ page; the device reads it only
    // after the doorbell below.
    unsafe { std::ptr::write_volatile(adm.mem.ptr(adm.tail as usize * SQE_BYTES) as *mut Sqe, sqe) };
    adm.tail = (adm.tail + 1) % ADMIN_ENTRIES;
    regs.write32(REG_DOORBELLS, adm.tail as u32);
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    loop {
        // SAFETY: the CQ page of the admin memory.
        let cqe = unsafe { std::ptr::read_volatile(adm.mem.ptr(PAGE_BYTES + adm.head as usize * CQE_BYTES) as *const Cqe) };
        if cqe.phase() == adm.phase {
            fence(Ordering::Acquire);
            adm.head = (adm.head + 1) % ADMIN_ENTRIES;
            if adm.head == 0 {
                adm.phase = !adm.phase;
            }
            regs.write32(REG_DOORBELLS + stride, adm.head as u32);
            if cqe.cid() != cid {
                // A late completion of an earlier (timed-out) command.
                continue;
            }
            if cqe.status() != STATUS_SUCCESS {
                return Err(format!(
                    "admin command {:#04x} failed: status type {:#x} code {:#04x} ({})",
                    sqe.opcode(),
                    status_sct(cqe.status()),
                    status_sc(cqe.status()),
                    status_text(cqe.status())
                ));
            }
            return Ok(cqe);
        }
        if Instant::now() > deadline {
            return Err(format!("admin command {:#04x} not completed within {} ms", sqe.opcode(), timeout.as_millis()));
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

fn wait_ready(regs: &Regs, cap: Cap, ready: bool) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_millis(cap.timeout_ms());
    loop {
        let csts = regs.read32(REG_CSTS);
        if csts == u32::MAX {
            return Err("the controller's registers read all ones (device gone or not responding)".into());
        }
        if ready && csts & CSTS_CFS != 0 {
            return Err("the controller reports a fatal status (CSTS.CFS) while enabling".into());
        }
        if (csts & CSTS_RDY != 0) == ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the controller did not become {} within CAP.TO ({} ms)",
                if ready { "ready" } else { "disabled" },
                cap.timeout_ms()
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Disable, set up the admin queue, enable.
fn enable(regs: &Regs, cap: Cap, adm: &mut Admin) -> Result<(), String> {
    let cc = regs.read32(REG_CC);
    if cc & CC_EN != 0 || regs.read32(REG_CSTS) & CSTS_RDY != 0 {
        regs.write32(REG_CC, cc & !CC_EN);
        wait_ready(regs, cap, false)?;
    }
    adm.mem.zero();
    adm.tail = 0;
    adm.head = 0;
    adm.phase = true;
    let n = ADMIN_ENTRIES as u32 - 1;
    regs.write32(REG_AQA, n << 16 | n);
    regs.write64(REG_ASQ, adm.mem.iova(0));
    regs.write64(REG_ACQ, adm.mem.iova(PAGE_BYTES));
    regs.write32(REG_CC, CC_EN | CC_IO_ENTRY_SIZES);
    wait_ready(regs, cap, true)
}

fn set_queue_count(regs: &Regs, stride: usize, t: Duration, adm: &mut Admin, want: u16) -> Result<u16, String> {
    let mut s = Sqe::new(ADM_SET_FEATURES, 0);
    s.cdw10 = FEAT_NUM_QUEUES;
    s.cdw11 = (want as u32 - 1) << 16 | (want as u32 - 1);
    let r = admin_cmd(regs, stride, t, adm, s)?.result;
    let granted = ((r & 0xffff) + 1).min((r >> 16) + 1).min(want as u32);
    Ok(granted as u16)
}

/// Create I/O pair `q`; its completion queue raises vector `q.qid` when
/// the controller has that many `vectors` on, else it is only polled.
fn create_pair(sh_regs: &Regs, stride: usize, t: Duration, adm: &mut Admin, q: &HwQueue, vectors: u16) -> Result<(), String> {
    let mut c = Sqe::new(ADM_CREATE_CQ, 0);
    c.prp1 = q.mem.iova(q.cq_off);
    c.cdw10 = (q.entries as u32 - 1) << 16 | q.qid as u32;
    // Physically contiguous; interrupts enabled (IEN) on vector IV = qid.
    c.cdw11 = if q.qid < vectors { (q.qid as u32) << 16 | 0b10 | 1 } else { 1 };
    admin_cmd(sh_regs, stride, t, adm, c).map_err(|e| format!("creating I/O completion queue {}: {e}", q.qid))?;
    let mut s = Sqe::new(ADM_CREATE_SQ, 0);
    s.prp1 = q.mem.iova(0);
    s.cdw10 = (q.entries as u32 - 1) << 16 | q.qid as u32;
    s.cdw11 = (q.qid as u32) << 16 | 1;
    admin_cmd(sh_regs, stride, t, adm, s).map_err(|e| format!("creating I/O submission queue {}: {e}", q.qid))?;
    Ok(())
}

/// An NVMe controller's first active namespace as a block device.
pub struct NvmeDevice {
    sh: Arc<Shared>,
}

impl NvmeDevice {
    /// Bring the controller up on `bus`: reset, admin queue, Identify
    /// controller and namespaces, number of queues. I/O queue pairs are
    /// created as `queue()` is called.
    pub fn open(bus: Arc<dyn Bus>, opts: &Options) -> Result<NvmeDevice, BlockError> {
        let name: Arc<str> = bus.name().into();
        let open_err = |why: String| BlockError::new(&name, OpKind::Open, None, ErrorKind::Unusable { why });
        let regs = Regs::new(bus.clone());
        let cap = Cap(regs.read64(REG_CAP));
        if cap.0 == u64::MAX {
            return Err(open_err("the controller's registers read all ones (device gone or not responding)".into()));
        }
        if !cap.nvm_command_set() {
            return Err(open_err("the controller does not support the NVM command set".into()));
        }
        if cap.mps_min_bytes() > PAGE_BYTES as u64 {
            return Err(open_err(format!("the controller's smallest memory page is {} bytes; 4096 is needed", cap.mps_min_bytes())));
        }
        let stride = cap.doorbell_stride();
        let vs = regs.read32(REG_VS);
        let admin_mem = DmaMem::new(bus.clone(), 3 * PAGE_BYTES, false).map_err(open_err)?;
        let mut adm = Admin { mem: admin_mem, tail: 0, head: 0, phase: true, cid: 0 };
        enable(&regs, cap, &mut adm).map_err(open_err)?;
        let t = opts.admin_timeout;
        let data = PAGE_BYTES * 2;
        let identify = |adm: &mut Admin, cns: u32, nsid: u32| -> Result<Vec<u8>, String> {
            let mut s = Sqe::new(ADM_IDENTIFY, 0);
            s.nsid = nsid;
            s.prp1 = adm.mem.iova(data);
            s.cdw10 = cns;
            admin_cmd(&regs, stride, t, adm, s)?;
            Ok(adm.mem.slice(data, PAGE_BYTES).to_vec())
        };
        let idc = identify(&mut adm, CNS_CONTROLLER, 0).map_err(|e| open_err(format!("Identify controller: {e}")))?;
        let nn = le32(&idc, idc::NN);
        let list = identify(&mut adm, CNS_ACTIVE_NS_LIST, 0).map_err(|e| open_err(format!("Identify namespace list: {e}")))?;
        let Some(nsid) = (0..1024).map(|i| le32(&list, i * 4)).find(|&n| n != 0) else {
            return Err(open_err(format!(
                "the controller has no active namespace (it supports {nn}); create and attach one (nvme create-ns / attach-ns) before binding it to vfio-pci"
            )));
        };
        let idn = identify(&mut adm, CNS_NAMESPACE, nsid).map_err(|e| open_err(format!("Identify namespace {nsid}: {e}")))?;
        let lbas = le64(&idn, idn::NSZE);
        let fmt = (idn[idn::FLBAS] & 0xf) as usize;
        let lbaf = le32(&idn, idn::LBAF0 + 4 * fmt);
        let meta = lbaf & 0xffff;
        let lbads = (lbaf >> 16) & 0xff;
        if meta != 0 {
            return Err(open_err(format!(
                "namespace {nsid} uses a format with {meta} bytes of metadata per block; format it without metadata (nvme format --lbaf)"
            )));
        }
        if !(9..=12).contains(&lbads) {
            return Err(BlockError::new(&name, OpKind::Open, None, ErrorKind::BlockSizeUnsupported { logical_bytes: 1u32 << lbads.min(31) }));
        }
        let shift = 12 - lbads;
        let blocks = lbas >> shift;
        if blocks == 0 {
            return Err(open_err(format!("namespace {nsid} is empty")));
        }
        let mdts = idc[idc::MDTS];
        let mdts_bytes = (mdts != 0).then(|| (1u64 << mdts) * cap.mps_min_bytes());
        let mdts_pages = mdts_bytes.map(|b| (b / PAGE_BYTES as u64).max(1) as u32).unwrap_or(u32::MAX);
        let rw_blocks_max = CMD_PAGES_MAX.min(mdts_pages);
        let oncs = le16(&idc, idc::ONCS);
        let want = opts.io_queues_max.clamp(1, 1024);
        let granted = set_queue_count(&regs, stride, t, &mut adm, want).map_err(|e| open_err(format!("Set Features (number of queues): {e}")))?;
        let entries = (opts.queue_entries as u32).clamp(2, cap.mqes().min(4096)) as u16;
        // Vector 0 (the admin queue, polled) and one per I/O pair. A bus
        // that cannot give them leaves every pair polled.
        let irq_vectors = if opts.interrupts {
            match regs.bus().enable_irqs(1 + granted as usize) {
                Ok(n) => n as u16,
                Err(e) => {
                    eprintln!("nvme: {name}: no completion interrupts ({e}); queues are polled");
                    0
                }
            }
        } else {
            0
        };
        let ident = Identity {
            serial: text(&idc[idc::SN]),
            model: text(&idc[idc::MN]),
            firmware: text(&idc[idc::FR]),
            version: ((vs >> 16) as u16, (vs >> 8) as u8),
            nsid,
            lbas,
            lba_bytes: 1 << lbads,
            mdts_bytes,
            write_zeroes: oncs & ONCS_WRITE_ZEROES != 0,
            deallocate: oncs & ONCS_DSM != 0,
            volatile_write_cache: idc[idc::VWC] & 1 != 0,
            sgl: le32(&idc, idc::SGLS) & 3 != 0,
            io_queues: granted,
            queue_entries: entries,
            doorbell_stride: stride,
            irq_vectors,
        };
        let ident_sgl = ident.sgl;
        let zero_page = DmaMem::new(bus.clone(), PAGE_BYTES, false).map_err(open_err)?;
        zero_page.zero();
        let wz_blocks_max = if ident.write_zeroes { (1u64 << 16) >> shift } else { rw_blocks_max as u64 };
        let sh = Shared {
            info: DeviceInfo { name: name.clone(), blocks, read_only: false },
            regs,
            cap,
            opts: opts.clone(),
            ident,
            shift,
            rw_blocks_max,
            wz_blocks_max,
            use_sgl: opts.sgl && ident_sgl,
            admin: Mutex::new(adm),
            hw: Mutex::new(Vec::new()),
            regions: RwLock::new(Vec::new()),
            zero_page,
            stats: Stats::default(),
            failed: AtomicBool::new(false),
            failure: Mutex::new(String::new()),
            resetting: Mutex::new(()),
        };
        Ok(NvmeDevice { sh: Arc::new(sh) })
    }

    pub fn identity(&self) -> &Identity {
        &self.sh.ident
    }

    pub fn stats(&self) -> Snapshot {
        self.sh.stats.snapshot()
    }

    /// Whether reads and writes go out with SGL descriptors (else PRPs).
    pub fn uses_sgl(&self) -> bool {
        self.sh.use_sgl
    }

    /// I/O queue pairs created so far.
    pub fn hw_queues(&self) -> usize {
        lock(&self.sh.hw).len()
    }

    /// Register a buffer pool for DMA now (at start) rather than on its
    /// first use. The pool stays mapped (and alive) until the device is the
    /// only one holding it and another pool is registered.
    pub fn register(&self, pool: &BufPool) -> Result<(), BlockError> {
        let (base, len) = pool.region();
        register(&self.sh, base as usize, len, pool.clone()).map(|_| ())
    }

    /// Reset the controller now (what a command past its abort deadline
    /// does): every command in flight fails back with an I/O error, the
    /// queues are recreated, and I/O goes on.
    pub fn reset(&self, why: &str) -> Result<(), BlockError> {
        reset(&self.sh, why);
        if self.sh.failed.load(Ordering::Acquire) {
            return Err(self.sh.err(OpKind::Open, None, ErrorKind::Unusable { why: self.sh.failure() }));
        }
        Ok(())
    }
}

fn register(sh: &Shared, base: usize, len: usize, pool: BufPool) -> Result<u64, BlockError> {
    let mut regions = sh.regions.write().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = regions.iter().find(|r| r.base == base && r.len == len) {
        return Ok(r.iova);
    }
    // Pools nobody else holds any more (no handle, no buffer in flight)
    // are unmapped first: a tool or test that opens pools one after another
    // never runs out of registrations.
    regions.retain(|r| !r._pool.is_last_handle());
    if regions.len() >= REGIONS_MAX {
        return Err(sh.err(
            OpKind::Open,
            None,
            ErrorKind::Unusable { why: format!("more than {REGIONS_MAX} buffer pools registered for DMA; use one pool per server") },
        ));
    }
    let bus = sh.regs.bus().clone();
    let iova = bus.map_dma(base as *const u8, len).map_err(|why| sh.err(OpKind::Open, None, ErrorKind::Unusable { why }))?;
    regions.push(Region { base, len, iova, _pool: pool, _map: RegionMap { bus, iova, len } });
    Ok(iova)
}

/// Fail every command in flight back, reset the controller and recreate
/// the queues; on failure the device is marked failed (every later request
/// answers an I/O error naming why).
fn reset(sh: &Shared, why: &str) {
    // Lock order everywhere: the pair list, `resetting`, the admin queue,
    // then pairs.
    let list = lock(&sh.hw);
    let _one = lock(&sh.resetting);
    let mut adm = lock(&sh.admin);
    let hws: Vec<Arc<Mutex<HwQueue>>> = list.clone();
    let mut guards: Vec<MutexGuard<'_, HwQueue>> = hws.iter().map(|h| lock(h)).collect();
    sh.stats.resets.fetch_add(1, Ordering::Relaxed);
    for q in guards.iter_mut() {
        for cid in 0..q.slots.len() {
            if q.slots[cid].busy {
                q.slots[cid].busy = false;
                let (owner, op) = (q.slots[cid].owner as usize, q.slots[cid].op);
                if q.attached.get(owner).copied().unwrap_or(false) {
                    q.reaped[owner].push((op, STATUS_RESET));
                }
                q.free.push(cid as u16);
            }
        }
        q.reset_rings();
    }
    let stride = sh.ident.doorbell_stride;
    let t = sh.opts.admin_timeout;
    let r = enable(&sh.regs, sh.cap, &mut adm)
        .and_then(|_| set_queue_count(&sh.regs, stride, t, &mut adm, sh.ident.io_queues).map(|_| ()))
        .and_then(|_| guards.iter().try_for_each(|q| create_pair(&sh.regs, stride, t, &mut adm, q, sh.ident.irq_vectors)));
    if let Err(e) = r {
        sh.fail(format!("controller reset (after {why}) failed: {e}; restart the server once the device is healthy"));
    }
}

impl BlockDevice for NvmeDevice {
    fn info(&self) -> &DeviceInfo {
        &self.sh.info
    }

    fn stats(&self) -> Option<Snapshot> {
        Some(self.sh.stats.snapshot())
    }

    fn queue(&self, _core: usize, depth_max: usize) -> Result<Box<dyn BlockQueue>, BlockError> {
        if depth_max == 0 || depth_max > block::DEPTH_MAX {
            return Err(self.sh.err(OpKind::Open, None, ErrorKind::BadRequest { why: "queue depth_max must be 1..=4096" }));
        }
        if self.sh.failed.load(Ordering::Acquire) {
            return Err(self.sh.err(OpKind::Open, None, ErrorKind::Unusable { why: self.sh.failure() }));
        }
        let sh = &self.sh;
        let mut hws = lock(&sh.hw);
        // An idle pair first, then a new one while the controller has
        // pairs to give, then the least shared.
        let idle = hws.iter().find(|h| lock(h).attached.iter().all(|a| !a)).cloned();
        let hw = match idle {
            Some(h) => h,
            None if hws.len() < sh.ident.io_queues as usize => {
                let qid = hws.len() as u16 + 1;
                let entries = sh.ident.queue_entries;
                let (cq_off, prp_off, bytes) = HwQueue::layout(entries);
                let mem = DmaMem::new(sh.regs.bus().clone(), bytes, sh.opts.hugepages)
                    .or_else(|e| if sh.opts.hugepages { DmaMem::new(sh.regs.bus().clone(), bytes, false) } else { Err(e) })
                    .map_err(|why| sh.err(OpKind::Open, None, ErrorKind::Unusable { why }))?;
                let slots = (0..entries).map(|_| Slot { busy: false, owner: 0, op: 0, started: Instant::now(), aborted: None }).collect();
                let mut q = HwQueue {
                    qid,
                    entries,
                    mem,
                    cq_off,
                    prp_off,
                    sq_tail: 0,
                    sq_head: 0,
                    cq_head: 0,
                    phase: true,
                    rung: 0,
                    slots,
                    free: (0..entries - 1).rev().collect(),
                    reaped: Vec::new(),
                    attached: Vec::new(),
                };
                q.reset_rings();
                let _one = lock(&sh.resetting);
                let mut adm = lock(&sh.admin);
                create_pair(&sh.regs, sh.ident.doorbell_stride, sh.opts.admin_timeout, &mut adm, &q, sh.ident.irq_vectors)
                    .map_err(|why| sh.err(OpKind::Open, None, ErrorKind::Unusable { why }))?;
                let h = Arc::new(Mutex::new(q));
                hws.push(h.clone());
                h
            }
            None => hws.iter().min_by_key(|h| lock(h).attached.iter().filter(|a| **a).count()).cloned().expect("at least one pair"),
        };
        drop(hws);
        let owner = {
            let mut q = lock(&hw);
            match q.attached.iter().position(|a| !a) {
                Some(i) => {
                    q.attached[i] = true;
                    q.reaped[i].clear();
                    i
                }
                None => {
                    q.attached.push(true);
                    let cap = q.entries as usize;
                    q.reaped.push(Vec::with_capacity(cap));
                    q.attached.len() - 1
                }
            }
        };
        Ok(Box::new(NvmeQueue {
            sh: self.sh.clone(),
            hw,
            owner: owner as u16,
            depth_max,
            ops: (0..depth_max).map(|_| None).collect(),
            free_ops: (0..depth_max as u32).rev().collect(),
            pending: VecDeque::with_capacity(depth_max),
            mine: Vec::with_capacity(depth_max),
            inflight: 0,
            last_scan: Instant::now(),
        }))
    }
}

struct PendingOp {
    token: u64,
    op: Op,
    /// 4 KiB blocks handed to the controller so far, of `total`.
    issued: u64,
    total: u64,
    out: u32,
    iova: u64,
    err: Option<BlockError>,
    started: Instant,
}

/// One core's queue: an I/O queue pair (shared with other queues only when
/// the controller granted fewer pairs than there are queues).
pub struct NvmeQueue {
    sh: Arc<Shared>,
    hw: Arc<Mutex<HwQueue>>,
    owner: u16,
    depth_max: usize,
    ops: Vec<Option<PendingOp>>,
    free_ops: Vec<u32>,
    /// Ops with parts not yet handed to the controller, oldest first.
    pending: VecDeque<u32>,
    mine: Vec<(u32, u16)>,
    inflight: usize,
    last_scan: Instant,
}

impl NvmeQueue {
    fn iova_of(&self, buf: &block::Buf) -> Result<u64, BlockError> {
        let p = buf.as_ptr() as usize;
        {
            let regions = self.sh.regions.read().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = regions.iter().find(|r| p >= r.base && p + buf.len() <= r.base + r.len) {
                return Ok(r.iova + (p - r.base) as u64);
            }
        }
        let (base, len) = buf.pool_region();
        let iova = register(&self.sh, base as usize, len, buf.pool())?;
        Ok(iova + (p - base as usize) as u64)
    }

    /// Hand queued parts to the controller while it has room; one doorbell.
    fn issue(&mut self, q: &mut HwQueue) {
        let sh = &*self.sh;
        while let Some(&id) = self.pending.front() {
            let p = self.ops[id as usize].as_mut().expect("pending op exists");
            while p.issued < p.total {
                if q.full() {
                    break;
                }
                let cid = q.free.pop().expect("not full");
                let mut s;
                let n;
                match &p.op {
                    Op::Flush => {
                        s = Sqe::new(IO_FLUSH, cid);
                        n = 1;
                    }
                    Op::Read { lba, .. } | Op::Write { lba, .. } => {
                        n = (p.total - p.issued).min(sh.rw_blocks_max as u64);
                        s = Sqe::new(if matches!(p.op, Op::Read { .. }) { IO_READ } else { IO_WRITE }, cid);
                        let slba = (lba + p.issued) << sh.shift;
                        s.cdw10 = slba as u32;
                        s.cdw11 = (slba >> 32) as u32;
                        s.cdw12 = ((n << sh.shift) - 1) as u32;
                        let iova = p.iova + p.issued * BLOCK_BYTES as u64;
                        if sh.use_sgl {
                            // PSDT 01b: SGL1 is one data block descriptor
                            // (address, length, type 0) — the buffer is
                            // contiguous in IOVA space.
                            s.cdw0 |= 1 << 14;
                            s.prp1 = iova;
                            s.prp2 = n * BLOCK_BYTES as u64;
                        } else {
                            prps(q, cid, &mut s, |i| iova + i as u64 * PAGE_BYTES as u64, n as usize);
                        }
                    }
                    Op::WriteZeroes { lba, .. } => {
                        n = (p.total - p.issued).min(sh.wz_blocks_max);
                        let slba = (lba + p.issued) << sh.shift;
                        if sh.ident.write_zeroes {
                            s = Sqe::new(IO_WRITE_ZEROES, cid);
                        } else {
                            // No Write Zeroes: a write whose every page is the zero page.
                            s = Sqe::new(IO_WRITE, cid);
                            let z = sh.zero_page.iova(0);
                            prps(q, cid, &mut s, |_| z, n as usize);
                        }
                        s.cdw10 = slba as u32;
                        s.cdw11 = (slba >> 32) as u32;
                        s.cdw12 = ((n << sh.shift) - 1) as u32;
                    }
                }
                s.nsid = sh.ident.nsid;
                // SAFETY: the SQ slot at the tail is ours until the doorbell.
                unsafe { std::ptr::write_volatile(q.mem.ptr(q.sq_tail as usize * SQE_BYTES) as *mut Sqe, s) };
                q.sq_tail = (q.sq_tail + 1) % q.entries;
                q.slots[cid as usize] = Slot { busy: true, owner: self.owner, op: id, started: Instant::now(), aborted: None };
                p.issued += n;
                p.out += 1;
                sh.stats.commands.fetch_add(1, Ordering::Relaxed);
            }
            if p.issued < p.total {
                break;
            }
            self.pending.pop_front();
        }
        if q.rung != q.sq_tail {
            sh.regs.write32(sh.db_sq(q.qid), q.sq_tail as u32);
            q.rung = q.sq_tail;
        }
    }

    /// Finish what the controller completed and collect this queue's share.
    fn reap(&mut self, q: &mut HwQueue) {
        let mut moved = false;
        loop {
            let off = q.cq_off + q.cq_head as usize * CQE_BYTES;
            // SAFETY: inside the CQ ring.
            let cqe = unsafe { std::ptr::read_volatile(q.mem.ptr(off) as *const Cqe) };
            if cqe.phase() != q.phase {
                break;
            }
            fence(Ordering::Acquire);
            moved = true;
            q.cq_head = (q.cq_head + 1) % q.entries;
            if q.cq_head == 0 {
                q.phase = !q.phase;
            }
            q.sq_head = cqe.sq_head() % q.entries;
            let cid = cqe.cid() as usize;
            if cid >= q.slots.len() || !q.slots[cid].busy {
                continue; // a command already failed back by a reset
            }
            let slot = &mut q.slots[cid];
            slot.busy = false;
            let (owner, op) = (slot.owner as usize, slot.op);
            q.free.push(cid as u16);
            if q.attached.get(owner).copied().unwrap_or(false) {
                q.reaped[owner].push((op, cqe.status()));
            }
        }
        if moved {
            self.sh.regs.write32(self.sh.db_cq(q.qid), q.cq_head as u32);
        }
        std::mem::swap(&mut self.mine, &mut q.reaped[self.owner as usize]);
    }

    fn finish(&mut self, done: &mut Vec<Completion>) -> usize {
        let sh = self.sh.clone();
        let mut n = 0;
        for i in 0..self.mine.len() {
            let (id, status) = self.mine[i];
            let Some(p) = self.ops[id as usize].as_mut() else { continue };
            p.out -= 1;
            if status != STATUS_SUCCESS && p.err.is_none() {
                let kind = if status == STATUS_RESET {
                    sh.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                    ErrorKind::TimedOut { ms: sh.opts.io_timeout.as_millis() as u64 }
                } else {
                    ErrorKind::DeviceStatus { sct: status_sct(status), sc: status_sc(status), what: status_text(status) }
                };
                p.err = Some(sh.err(p.op.kind(), p.op.offset_bytes(), kind));
            }
            if p.out > 0 || (p.issued < p.total && p.err.is_none()) {
                continue;
            }
            if p.issued < p.total {
                // Failed part: the rest is never issued.
                self.pending.retain(|&x| x != id);
            }
            let p = self.ops[id as usize].take().expect("present");
            self.free_ops.push(id);
            self.inflight -= 1;
            let bytes = p.total * BLOCK_BYTES as u64;
            match p.op.kind() {
                OpKind::Read => {
                    sh.stats.reads.fetch_add(1, Ordering::Relaxed);
                    sh.stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
                }
                OpKind::Write => {
                    sh.stats.writes.fetch_add(1, Ordering::Relaxed);
                    sh.stats.bytes_written.fetch_add(bytes, Ordering::Relaxed);
                }
                OpKind::Flush => {
                    sh.stats.flushes.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    sh.stats.zeroes.fetch_add(1, Ordering::Relaxed);
                }
            }
            if p.err.is_some() {
                sh.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            sh.stats.latency(p.started.elapsed());
            done.push(Completion { token: p.token, result: p.err.map_or(Ok(()), Err), buf: p.op.into_buf() });
            n += 1;
        }
        self.mine.clear();
        n
    }

    /// Abort this queue's overdue commands; reset the controller when an
    /// aborted one is overdue again.
    fn scan_timeouts(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last_scan) < TIMEOUT_SCAN {
            return;
        }
        self.last_scan = now;
        let t = self.sh.opts.io_timeout;
        let mut aborts = Vec::new();
        let mut reset_needed = false;
        let qid;
        {
            let mut q = lock(&self.hw);
            qid = q.qid;
            for (cid, s) in q.slots.iter_mut().enumerate() {
                if !s.busy || s.owner != self.owner {
                    continue;
                }
                match s.aborted {
                    None if now.duration_since(s.started) > t => {
                        s.aborted = Some(now);
                        aborts.push(cid as u16);
                    }
                    Some(a) if now.duration_since(a) > t => reset_needed = true,
                    _ => {}
                }
            }
        }
        if reset_needed {
            reset(&self.sh, &format!("a command on queue {qid} was not completed {} ms after its abort", t.as_millis()));
            return;
        }
        if aborts.is_empty() {
            return;
        }
        let _one = lock(&self.sh.resetting);
        let mut adm = lock(&self.sh.admin);
        for cid in aborts {
            self.sh.stats.aborts.fetch_add(1, Ordering::Relaxed);
            let mut s = Sqe::new(ADM_ABORT, 0);
            s.cdw10 = (cid as u32) << 16 | qid as u32;
            // The abort's own answer does not matter: the command completes
            // (aborted or not), or the reset deadline catches it.
            let _ = admin_cmd(&self.sh.regs, self.sh.ident.doorbell_stride, self.sh.opts.admin_timeout, &mut adm, s);
        }
    }
}

/// Fill PRP1/PRP2 (and the command's PRP list slot) for `pages` pages.
fn prps(q: &mut HwQueue, cid: u16, s: &mut Sqe, page: impl Fn(usize) -> u64, pages: usize) {
    s.prp1 = page(0);
    match pages {
        0 | 1 => {}
        2 => s.prp2 = page(1),
        _ => {
            let off = q.prp_off + cid as usize * PRP_SLOT_BYTES;
            let list = q.mem.ptr(off) as *mut u64;
            for i in 1..pages {
                // SAFETY: at most CMD_PAGES_MAX - 1 entries of 8 bytes in a
                // 512-byte slot owned by this command.
                unsafe { std::ptr::write_volatile(list.add(i - 1), page(i)) };
            }
            s.prp2 = q.mem.iova(off);
        }
    }
}

impl BlockQueue for NvmeQueue {
    fn info(&self) -> &DeviceInfo {
        &self.sh.info
    }

    fn depth_max(&self) -> usize {
        self.depth_max
    }

    fn inflight(&self) -> usize {
        self.inflight
    }

    fn submit(&mut self, op: Op, token: u64) -> Result<(), Rejected> {
        let sh = &*self.sh;
        if sh.opts.pass_out_of_range {
            if let Some((_, 0)) = op.range() {
                return Err(Rejected::Invalid(op, sh.err(OpKind::Read, None, ErrorKind::BadRequest { why: "zero blocks" })));
            }
        } else if let Err(e) = sh.info.check(&op) {
            return Err(Rejected::Invalid(op, e));
        }
        if sh.failed.load(Ordering::Acquire) {
            let e = sh.err(op.kind(), op.offset_bytes(), ErrorKind::Unusable { why: sh.failure() });
            return Err(Rejected::Invalid(op, e));
        }
        if self.inflight >= self.depth_max {
            return Err(Rejected::Busy(op));
        }
        let (total, iova) = match &op {
            Op::Read { blocks, buf, .. } | Op::Write { blocks, buf, .. } => match self.iova_of(buf) {
                Ok(i) => (*blocks as u64, i),
                Err(e) => return Err(Rejected::Invalid(op, e)),
            },
            Op::Flush => (1, 0),
            Op::WriteZeroes { blocks, .. } => (*blocks, 0),
        };
        let id = self.free_ops.pop().expect("inflight < depth_max");
        self.ops[id as usize] = Some(PendingOp { token, op, issued: 0, total, out: 0, iova, err: None, started: Instant::now() });
        self.pending.push_back(id);
        self.inflight += 1;
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<Completion>) -> usize {
        if self.inflight == 0 {
            return 0;
        }
        {
            let hw = self.hw.clone();
            let mut q = lock(&hw);
            self.reap(&mut q);
            self.issue(&mut q);
        }
        let n = self.finish(done);
        if self.inflight > 0 {
            self.scan_timeouts();
        }
        n
    }

    /// Poll for up to `WAIT_SPIN` (a fast device answers within it, and a
    /// benchmark's latency is the device's); then, when the pair has its
    /// own interrupt vector, sleep on its eventfd until the controller
    /// signals a completion (at most `WAIT_SLEEP_MAX` at a time, so
    /// timeouts are still scanned). Without one (a shared pair, no MSI-X):
    /// yield, then nap.
    fn wait(&mut self, done: &mut Vec<Completion>) -> usize {
        let fd = self.notify_fd();
        let t0 = Instant::now();
        let mut spins = 0u32;
        let mut sleeping = false;
        loop {
            if let (true, Some(fd)) = (sleeping, fd) {
                // Cleared before the queue is looked at: a completion
                // after that look raises the vector again and ends the
                // sleep below.
                drain_eventfd(fd);
            }
            let n = self.poll(done);
            if n > 0 || self.inflight == 0 {
                return n;
            }
            spins += 1;
            match fd {
                Some(fd) if sleeping => sleep_on(fd, WAIT_SLEEP_MAX),
                Some(_) => {
                    // Sleep from the next turn on (after a drain and a look).
                    sleeping = t0.elapsed() >= WAIT_SPIN;
                    std::hint::spin_loop();
                }
                None if spins < 200 => std::hint::spin_loop(),
                None if spins < 400 => std::thread::yield_now(),
                None => std::thread::sleep(Duration::from_micros(20)),
            }
        }
    }

    /// The pair's MSI-X eventfd, when it has a vector and this queue is
    /// the only one attached to it (two loops reading one eventfd would
    /// take each other's wakeups: shared pairs are polled).
    fn notify_fd(&self) -> Option<std::os::fd::RawFd> {
        let qid = {
            let hw = lock(&self.hw);
            if hw.qid >= self.sh.ident.irq_vectors || hw.attached.iter().filter(|a| **a).count() != 1 {
                return None;
            }
            hw.qid
        };
        self.sh.regs.bus().irq_fd(qid as usize)
    }
}

/// Empty an eventfd (non-blocking): what it counted is about to be looked
/// at.
fn drain_eventfd(fd: std::os::fd::RawFd) {
    let mut v = [0u8; 8];
    // SAFETY: an 8-byte read into our buffer; EAGAIN when it is empty.
    let _ = unsafe { libc::read(fd, v.as_mut_ptr().cast(), 8) };
}

/// Sleep until `fd` is readable or `max` has passed.
fn sleep_on(fd: std::os::fd::RawFd, max: Duration) {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd of ours; EINTR or a timeout just end the sleep.
    let _ = unsafe { libc::poll(&mut p, 1, max.as_millis() as libc::c_int) };
}

impl Drop for NvmeQueue {
    fn drop(&mut self) {
        // Commands still in flight own buffers the controller may write:
        // wait them out (timeouts and resets bound this), then detach.
        let mut done = Vec::new();
        let deadline = Instant::now() + self.sh.opts.io_timeout * 3;
        while self.inflight > 0 && Instant::now() < deadline && !self.sh.failed.load(Ordering::Acquire) {
            self.wait(&mut done);
            done.clear();
        }
        if self.inflight > 0 {
            // Never hand memory the device may still write back to a pool.
            for p in self.ops.drain(..).flatten() {
                std::mem::forget(p.op);
            }
        }
        let mut q = lock(&self.hw);
        let o = self.owner as usize;
        q.attached[o] = false;
        q.reaped[o].clear();
    }
}
