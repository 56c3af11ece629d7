//! Per-core pools of 4 KiB-aligned buffers in one contiguous mapping.
//!
//! O_DIRECT needs buffers aligned to the device's logical block; VFIO DMA
//! needs memory mapped once into the IOMMU. Both are served by carving a
//! pool out of one anonymous mapping made at start (pre-faulted, so the
//! data path never takes a page fault), optionally on 2 MiB hugepages. The
//! whole region is one range (`region`), so it can be registered once
//! (io_uring fixed buffers, a VFIO DMA map). Taking and returning a buffer
//! allocates nothing; an exhausted pool answers `None` (back-pressure, not
//! growth).

use crate::BLOCK_BYTES;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Hugepage size the pool rounds its mapping to when it uses hugepages.
pub const HUGEPAGE_BYTES: usize = 2 << 20;
/// Largest buffer: a request moves at most this many bytes (io_uring and
/// NVMe transfers beyond this are split by the caller).
pub const BUF_BYTES_MAX: usize = 1 << 20;
/// Largest pool, a sanity bound on configuration (16 GiB).
pub const POOL_BYTES_MAX: usize = 16 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hugepages {
    /// Ordinary 4 KiB pages.
    Off,
    /// 2 MiB hugepages when the system has enough free; otherwise ordinary
    /// pages and a warning (`BufPool::warning`).
    Try,
    /// 2 MiB hugepages or an error.
    Require,
    /// As the process is configured (`crate::huge::configure`): carved
    /// from its hugepage arena when hugepages are on (ordinary pages and a
    /// warning when the arena has no room), ordinary pages when they are
    /// off, and as `Try` when nothing was configured.
    AsConfigured,
}

#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Bytes per buffer: a multiple of 4 KiB, at most `BUF_BYTES_MAX`.
    pub buf_bytes: usize,
    /// Buffers in the pool; the pool never grows.
    pub bufs_max: usize,
    pub hugepages: Hugepages,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    BadConfig(String),
    /// `Hugepages::Require` and the mapping failed.
    NoHugepages { bytes: usize, errno: i32 },
    Map { bytes: usize, errno: i32 },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::BadConfig(s) => write!(f, "buffer pool: {s}"),
            PoolError::NoHugepages { bytes, errno } => write!(
                f,
                "buffer pool: cannot map {bytes} bytes of 2 MiB hugepages ({}); reserve them with vm.nr_hugepages (see HugePages_Free in /proc/meminfo) or configure ordinary pages",
                std::io::Error::from_raw_os_error(*errno)
            ),
            PoolError::Map { bytes, errno } => {
                write!(f, "buffer pool: cannot map {bytes} bytes ({})", std::io::Error::from_raw_os_error(*errno))
            }
        }
    }
}

impl std::error::Error for PoolError {}

struct Region {
    base: NonNull<u8>,
    map_bytes: usize,
    /// Carved from the hugepage arena (given back on drop), not mapped.
    carved: Option<crate::huge::Carved>,
}

// SAFETY: the region is plain memory owned by the pool; who may touch which
// part is decided by buffer ownership (one `Buf` per slice).
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    fn mapped(base: Result<NonNull<u8>, i32>, map_bytes: usize) -> Result<Region, PoolError> {
        let base = base.map_err(|errno| PoolError::Map { bytes: map_bytes, errno })?;
        Ok(Region { base, map_bytes, carved: None })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.carved.is_some() {
            return; // the range goes back to its arena
        }
        // SAFETY: the mapping made in `map`, unmapped once; every `Buf`
        // holds the pool alive, so no buffer outlives it.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.map_bytes) };
    }
}

struct Inner {
    region: Region,
    buf_bytes: usize,
    bufs_max: usize,
    hugepages: bool,
    warning: Option<String>,
    /// Indexes of free buffers. One core takes and returns them, so the
    /// lock is uncontended; it is there because a buffer may be dropped on
    /// another thread (a completion handed on).
    free: Mutex<Vec<u32>>,
}

/// A bounded pool of aligned buffers; cheap to clone (shared).
#[derive(Clone)]
pub struct BufPool(Arc<Inner>);

fn map(bytes: usize, huge: bool) -> Result<NonNull<u8>, i32> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
    if huge {
        flags |= libc::MAP_HUGETLB;
    }
    // SAFETY: a fresh anonymous mapping; no existing memory is touched.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM));
    }
    Ok(NonNull::new(p as *mut u8).expect("mmap returned null"))
}

impl BufPool {
    pub fn new(cfg: PoolConfig) -> Result<BufPool, PoolError> {
        if cfg.buf_bytes == 0 || cfg.buf_bytes % BLOCK_BYTES != 0 || cfg.buf_bytes > BUF_BYTES_MAX {
            return Err(PoolError::BadConfig(format!(
                "buf_bytes {} must be a non-zero multiple of {BLOCK_BYTES} up to {BUF_BYTES_MAX}",
                cfg.buf_bytes
            )));
        }
        let bytes = cfg.buf_bytes.checked_mul(cfg.bufs_max).filter(|&b| b > 0 && b <= POOL_BYTES_MAX);
        let Some(bytes) = bytes else {
            return Err(PoolError::BadConfig(format!(
                "bufs_max {} x buf_bytes {} must be 1..={POOL_BYTES_MAX} bytes",
                cfg.bufs_max, cfg.buf_bytes
            )));
        };
        let huge_bytes = bytes.div_ceil(HUGEPAGE_BYTES) * HUGEPAGE_BYTES;
        let mut carved = None;
        let policy = match cfg.hugepages {
            Hugepages::AsConfigured => match crate::huge::policy() {
                None => Hugepages::Try,
                Some(crate::huge::Policy::Off) => Hugepages::Off,
                Some(crate::huge::Policy::On(a)) => match a.carve(bytes) {
                    Ok(c) => {
                        carved = Some(c);
                        Hugepages::AsConfigured
                    }
                    Err(e) => {
                        let w = format!("buffer pool: {e}; using ordinary pages");
                        return Self::finish(cfg, Region::mapped(map(bytes, false), bytes)?, false, Some(w));
                    }
                },
            },
            p => p,
        };
        if let Some(c) = carved {
            let base = NonNull::new(c.as_ptr()).expect("carved memory is not null");
            let region = Region { base, map_bytes: c.len(), carved: Some(c) };
            return Self::finish(cfg, region, true, None);
        }
        let (base, map_bytes, hugepages, warning) = match policy {
            Hugepages::Off => (map(bytes, false), bytes, false, None),
            Hugepages::Require => match map(huge_bytes, true) {
                Ok(p) => (Ok(p), huge_bytes, true, None),
                Err(errno) => return Err(PoolError::NoHugepages { bytes: huge_bytes, errno }),
            },
            Hugepages::Try | Hugepages::AsConfigured => match map(huge_bytes, true) {
                Ok(p) => (Ok(p), huge_bytes, true, None),
                Err(errno) => {
                    let w = PoolError::NoHugepages { bytes: huge_bytes, errno }.to_string() + "; using ordinary pages";
                    (map(bytes, false), bytes, false, Some(w))
                }
            },
        };
        Self::finish(cfg, Region::mapped(base, map_bytes)?, hugepages, warning)
    }

    fn finish(cfg: PoolConfig, region: Region, hugepages: bool, warning: Option<String>) -> Result<BufPool, PoolError> {
        debug_assert_eq!(region.base.as_ptr() as usize % BLOCK_BYTES, 0, "mmap is page aligned");
        // Handed out lowest index first (pop from the end).
        let free = (0..cfg.bufs_max as u32).rev().collect();
        Ok(BufPool(Arc::new(Inner {
            region,
            buf_bytes: cfg.buf_bytes,
            bufs_max: cfg.bufs_max,
            hugepages,
            warning,
            free: Mutex::new(free),
        })))
    }

    /// A free buffer, or `None` when all `bufs_max` are taken. Its contents
    /// are whatever its last user left.
    pub fn get(&self) -> Option<Buf> {
        let i = self.0.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        // SAFETY: i < bufs_max, so the slice lies inside the mapping.
        let ptr = unsafe { self.0.region.base.as_ptr().add(i as usize * self.0.buf_bytes) };
        Some(Buf { ptr: NonNull::new(ptr).expect("inside the mapping"), index: i, pool: self.0.clone() })
    }

    pub fn buf_bytes(&self) -> usize {
        self.0.buf_bytes
    }

    pub fn bufs_max(&self) -> usize {
        self.0.bufs_max
    }

    pub fn bufs_free(&self) -> usize {
        self.0.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether this handle is the last one: no other `BufPool` clone and no
    /// `Buf` of the pool exists (a device that registered the pool for DMA
    /// unmaps it then).
    pub fn is_last_handle(&self) -> bool {
        Arc::strong_count(&self.0) == 1
    }

    /// Whether the pool sits on hugepages (2 MiB, or the arena's size).
    pub fn hugepages(&self) -> bool {
        self.0.hugepages
    }

    /// Whether the pool was carved from the process's hugepage arena.
    pub fn carved(&self) -> bool {
        self.0.region.carved.is_some()
    }

    /// Why `Hugepages::Try` fell back to ordinary pages (for the log).
    pub fn warning(&self) -> Option<&str> {
        self.0.warning.as_deref()
    }

    /// The whole region (base address, bytes), to register once with a
    /// ring or an IOMMU; every buffer lies inside it.
    pub fn region(&self) -> (*const u8, usize) {
        (self.0.region.base.as_ptr(), self.0.region.map_bytes)
    }
}

/// One buffer of a pool, owned: it goes back to the pool when dropped.
pub struct Buf {
    ptr: NonNull<u8>,
    index: u32,
    pool: Arc<Inner>,
}

// SAFETY: a `Buf` is the only handle to its slice of the region.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}

impl Buf {
    /// Bytes in this buffer (the pool's `buf_bytes`).
    pub fn len(&self) -> usize {
        self.pool.buf_bytes
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whole 4 KiB blocks this buffer holds.
    pub fn blocks(&self) -> u32 {
        (self.pool.buf_bytes / BLOCK_BYTES) as u32
    }

    /// Position in the pool (for a fixed-buffer index or a DMA offset).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The region of the pool this buffer belongs to (what a device that
    /// maps memory for DMA registers; see `BufPool::region`).
    pub fn pool_region(&self) -> (*const u8, usize) {
        (self.pool.region.base.as_ptr(), self.pool.region.map_bytes)
    }

    /// The pool this buffer belongs to (a device keeps the pool it
    /// registered for DMA alive).
    pub fn pool(&self) -> BufPool {
        BufPool(self.pool.clone())
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes inside the mapping, owned by this Buf.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.pool.buf_bytes) }
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.pool.buf_bytes) }
    }
}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buf {{ index: {}, bytes: {} }}", self.index, self.pool.buf_bytes)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert!(free.len() < self.pool.bufs_max, "a buffer returned twice");
        free.push(self.index);
    }
}
