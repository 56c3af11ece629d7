//! What the driver needs from the machine: the controller's registers
//! (BAR0) and memory the controller can reach by DMA. `vfio::VfioBus` is the
//! real one; `sim::SimBus` is a software controller for tests on machines
//! without VFIO.

use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

pub trait Bus: Send + Sync {
    /// The name every error carries (the PCI address).
    fn name(&self) -> &str;
    /// BAR0: base and length of the register mapping.
    fn bar0(&self) -> (NonNull<u8>, usize);
    /// Make `[vaddr, vaddr + len)` reachable by the device; the IOVA of
    /// `vaddr`. Called once per memory region (queues at start, each buffer
    /// pool on first use); never on the I/O path.
    fn map_dma(&self, vaddr: *const u8, len: usize) -> Result<u64, String>;
    fn unmap_dma(&self, iova: u64, len: usize);
    /// Turn on up to `want` interrupt vectors, each signalling an eventfd
    /// (`irq_fd`); how many are on. The default: none (completions are
    /// only polled).
    fn enable_irqs(&self, want: usize) -> Result<usize, String> {
        let _ = want;
        Ok(0)
    }
    /// The eventfd vector `vector` signals, once enabled.
    fn irq_fd(&self, vector: usize) -> Option<std::os::fd::RawFd> {
        let _ = vector;
        None
    }
}

/// Register access through BAR0.
#[derive(Clone)]
pub struct Regs {
    bus: Arc<dyn Bus>,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: BAR0 is device memory; every access is a volatile 32/64-bit
// load or store at an offset checked against the mapping's length.
unsafe impl Send for Regs {}
unsafe impl Sync for Regs {}

impl Regs {
    pub fn new(bus: Arc<dyn Bus>) -> Regs {
        let (base, len) = bus.bar0();
        Regs { bus, base, len }
    }

    pub fn bus(&self) -> &Arc<dyn Bus> {
        &self.bus
    }

    fn at(&self, off: usize, bytes: usize) -> *mut u8 {
        assert!(off + bytes <= self.len && off % bytes == 0, "register offset {off:#x} outside BAR0 ({} bytes)", self.len);
        // SAFETY: bounds checked above.
        unsafe { self.base.as_ptr().add(off) }
    }

    pub fn read32(&self, off: usize) -> u32 {
        // SAFETY: aligned, inside the mapping.
        unsafe { std::ptr::read_volatile(self.at(off, 4) as *const u32) }
    }

    pub fn write32(&self, off: usize, v: u32) {
        // Everything written to memory the device reads (queue entries)
        // must be visible before the register write that tells it to look.
        fence(Ordering::SeqCst);
        // SAFETY: aligned, inside the mapping.
        unsafe { std::ptr::write_volatile(self.at(off, 4) as *mut u32, v) }
    }

    /// 64-bit registers are read as two 32-bit halves (low first), which
    /// every controller accepts.
    pub fn read64(&self, off: usize) -> u64 {
        self.read32(off) as u64 | (self.read32(off + 4) as u64) << 32
    }

    pub fn write64(&self, off: usize, v: u64) {
        self.write32(off, v as u32);
        self.write32(off + 4, (v >> 32) as u32);
    }

    /// Whether the mapping reaches a doorbell offset.
    pub fn has(&self, off: usize) -> bool {
        off + 4 <= self.len
    }
}

/// Memory the device reaches by DMA: an anonymous, populated, locked
/// mapping (2 MiB hugepages when asked and available) mapped once.
pub struct DmaMem {
    bus: Arc<dyn Bus>,
    base: NonNull<u8>,
    len: usize,
    iova: u64,
    /// Carved from the process's hugepage arena (`block::huge`), given
    /// back on drop instead of unmapped.
    carved: Option<block::huge::Carved>,
}

// SAFETY: plain memory; who writes which part is decided by the driver
// (queue slots, PRP slots) under its locks.
unsafe impl Send for DmaMem {}
unsafe impl Sync for DmaMem {}

pub const HUGE_BYTES: usize = 2 << 20;

impl DmaMem {
    /// `len` bytes: carved from the process's hugepage arena when
    /// `common.huge_pages` is on (`block::huge::configure`), else a mapping
    /// of its own (2 MiB hugepages when `hugepages`).
    pub fn new(bus: Arc<dyn Bus>, len: usize, hugepages: bool) -> Result<DmaMem, String> {
        if let Some(c) = block::huge::carve(len) {
            let c = c.map_err(|e| format!("queue memory: {e}"))?;
            let base = NonNull::new(c.as_ptr()).expect("carved memory is not null");
            let len = c.len();
            // As zeroed as a fresh mapping (the range may have served before).
            // SAFETY: the carved range is ours.
            unsafe { std::ptr::write_bytes(base.as_ptr(), 0, len) };
            let iova = bus.map_dma(base.as_ptr(), len)?;
            return Ok(DmaMem { bus, base, len, iova, carved: Some(c) });
        }
        let len = if hugepages { len.div_ceil(HUGE_BYTES) * HUGE_BYTES } else { len.div_ceil(4096) * 4096 };
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | libc::MAP_LOCKED;
        if hugepages {
            flags |= libc::MAP_HUGETLB;
        }
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "cannot map {len} bytes of {} for DMA ({e}); {}",
                if hugepages { "2 MiB hugepages" } else { "locked memory" },
                if hugepages {
                    "reserve hugepages (vm.nr_hugepages) or turn huge_pages off"
                } else {
                    "raise the memlock limit (ulimit -l, the pod's IPC_LOCK capability)"
                }
            ));
        }
        let base = NonNull::new(p as *mut u8).expect("mmap returned null");
        let iova = match bus.map_dma(base.as_ptr(), len) {
            Ok(i) => i,
            Err(e) => {
                // SAFETY: the mapping made above.
                unsafe { libc::munmap(p, len) };
                return Err(e);
            }
        };
        Ok(DmaMem { bus, base, len, iova, carved: None })
    }

    pub fn ptr(&self, off: usize) -> *mut u8 {
        assert!(off <= self.len);
        // SAFETY: inside the mapping.
        unsafe { self.base.as_ptr().add(off) }
    }

    pub fn iova(&self, off: usize) -> u64 {
        self.iova + off as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Zero the whole region (queues are zeroed before (re)creation).
    pub fn zero(&self) {
        // SAFETY: inside the mapping; the device is not using it.
        unsafe { std::ptr::write_bytes(self.base.as_ptr(), 0, self.len) };
    }

    pub fn slice(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.len);
        // SAFETY: inside the mapping; callers read what the device wrote
        // after its completion.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(off), len) }
    }
}

impl Drop for DmaMem {
    fn drop(&mut self) {
        self.bus.unmap_dma(self.iova, self.len);
        if self.carved.is_some() {
            return; // back to the arena
        }
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}
