//! Hugepage slabs that every DMA pool of the process is carved from
//! (`common.huge_pages`, `huge_page_size`, `slab_size`, `preallocate_slabs`
//! of the server configuration).
//!
//! A pool mapped on its own rounds its size up to one hugepage: harmless at
//! 2 MiB, but a 1 GiB page per pool would take gigabytes for a few pools of
//! a few MiB. So, when hugepages are configured, memory comes from slabs:
//! `slab_size` bytes of hugepages mapped at once (`preallocate_slabs` of
//! them at start, more on demand up to `slabs_max`), each carved into 4 KiB
//! aligned ranges, first fit; a range given back is merged with its free
//! neighbours and used again. Slabs are never unmapped (a device may have
//! registered them for DMA). Buffer pools (`Hugepages::AsConfigured`), the
//! NVMe driver's queue memory and other registered memory take their
//! ranges from the process's arena ([`configure`], [`carve`]); an arena of
//! its own ([`Arena::new`]) serves tests.

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

pub const PAGE_2M: usize = 2 << 20;
pub const PAGE_1G: usize = 1 << 30;
/// Ranges are carved in multiples of this (and aligned to it).
pub const CARVE_BYTES: usize = 4096;
/// Most slabs an arena maps, whatever the configuration asks.
pub const SLABS_MAX: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugeConfig {
    /// The hugepage size: `PAGE_2M` or `PAGE_1G` (`PAGE_4K` only in tests:
    /// ordinary pages, to exercise the carving anywhere).
    pub page_bytes: usize,
    /// Bytes mapped per slab: a multiple of `page_bytes`. A request larger
    /// than a slab gets a slab of its own, rounded up to whole pages.
    pub slab_bytes: usize,
    /// Slabs mapped at start (a start-up error when they cannot be).
    pub preallocate: usize,
    /// Most slabs mapped (1..=`SLABS_MAX`).
    pub slabs_max: usize,
}

/// Ordinary pages (tests of the carving).
pub const PAGE_4K: usize = 4096;

impl HugeConfig {
    pub fn check(&self) -> Result<(), String> {
        if ![PAGE_4K, PAGE_2M, PAGE_1G].contains(&self.page_bytes) {
            return Err(format!("hugepage size {} bytes: must be 2 MiB or 1 GiB", self.page_bytes));
        }
        if self.slab_bytes == 0 || self.slab_bytes % self.page_bytes != 0 {
            return Err(format!("slab size {} bytes: must be a non-zero multiple of the hugepage size ({} bytes)", self.slab_bytes, self.page_bytes));
        }
        if self.slabs_max == 0 || self.slabs_max > SLABS_MAX || self.preallocate > self.slabs_max {
            return Err(format!("{} slabs preallocated, at most {}: need 0 <= preallocated <= most <= {SLABS_MAX}", self.preallocate, self.slabs_max));
        }
        Ok(())
    }

    fn page_name(&self) -> &'static str {
        match self.page_bytes {
            PAGE_1G => "1 GiB hugepages",
            PAGE_2M => "2 MiB hugepages",
            _ => "ordinary pages",
        }
    }
}

struct Slab {
    base: NonNull<u8>,
    len: usize,
    /// Free ranges (offset, bytes), sorted by offset, never adjacent.
    free: Vec<(usize, usize)>,
}

// SAFETY: a slab is plain memory; who uses which range is decided by the
// `Carved` that owns it.
unsafe impl Send for Slab {}

struct Inner {
    cfg: HugeConfig,
    slabs: Mutex<Vec<Slab>>,
}

/// Hugepage slabs and what is carved from them; cheap to clone.
#[derive(Clone)]
pub struct Arena(Arc<Inner>);

/// What the arena holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub page_bytes: usize,
    pub slabs: usize,
    pub mapped_bytes: usize,
    pub carved_bytes: usize,
}

fn map_slab(cfg: &HugeConfig, len: usize) -> Result<NonNull<u8>, String> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
    if cfg.page_bytes != PAGE_4K {
        // MAP_HUGE_SHIFT encodes log2 of the page size.
        flags |= libc::MAP_HUGETLB | ((cfg.page_bytes.trailing_zeros() as i32) << libc::MAP_HUGE_SHIFT);
    }
    // SAFETY: a fresh anonymous mapping; no existing memory is touched.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        let sysfs = format!("/sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages", cfg.page_bytes >> 10);
        return Err(format!(
            "cannot map a slab of {len} bytes of {} ({e}): reserve {} of them ({sysfs}, or hugepagesz=/hugepages= on the kernel command line; HugePages_Free in /proc/meminfo counts the default size) or set common.huge_pages to false",
            cfg.page_name(),
            len / cfg.page_bytes
        ));
    }
    Ok(NonNull::new(p as *mut u8).expect("mmap returned null"))
}

impl Arena {
    /// An arena with `cfg.preallocate` slabs mapped now.
    pub fn new(cfg: HugeConfig) -> Result<Arena, String> {
        cfg.check()?;
        let mut slabs = Vec::new();
        for _ in 0..cfg.preallocate {
            slabs.push(Slab { base: map_slab(&cfg, cfg.slab_bytes)?, len: cfg.slab_bytes, free: vec![(0, cfg.slab_bytes)] });
        }
        Ok(Arena(Arc::new(Inner { cfg, slabs: Mutex::new(slabs) })))
    }

    pub fn config(&self) -> HugeConfig {
        self.0.cfg
    }

    /// `bytes` (rounded up to 4 KiB), 4 KiB aligned, from the first slab
    /// with room, or from a new slab while fewer than `slabs_max` exist.
    pub fn carve(&self, bytes: usize) -> Result<Carved, String> {
        if bytes == 0 {
            return Err("a carve of 0 bytes".into());
        }
        let want = bytes.checked_next_multiple_of(CARVE_BYTES).ok_or_else(|| format!("a carve of {bytes} bytes"))?;
        let cfg = self.0.cfg;
        let mut slabs = self.0.slabs.lock().unwrap_or_else(|e| e.into_inner());
        for (si, s) in slabs.iter_mut().enumerate() {
            if let Some(fi) = s.free.iter().position(|&(_, len)| len >= want) {
                let (off, len) = s.free[fi];
                if len == want {
                    s.free.remove(fi);
                } else {
                    s.free[fi] = (off + want, len - want);
                }
                // SAFETY: off + want <= the slab's length.
                let ptr = unsafe { NonNull::new_unchecked(s.base.as_ptr().add(off)) };
                return Ok(Carved { arena: self.clone(), slab: si, off, len: want, ptr });
            }
        }
        if slabs.len() >= cfg.slabs_max {
            let mapped: usize = slabs.iter().map(|s| s.len).sum();
            return Err(format!(
                "no room for {want} bytes in {} slabs of {} ({mapped} bytes mapped, the most allowed): raise common.slab_size or common.preallocate_slabs",
                slabs.len(),
                cfg.page_name()
            ));
        }
        let len = want.max(cfg.slab_bytes).checked_next_multiple_of(cfg.page_bytes).ok_or_else(|| format!("a carve of {bytes} bytes"))?;
        let base = map_slab(&cfg, len)?;
        let free = if len > want { vec![(want, len - want)] } else { Vec::new() };
        slabs.push(Slab { base, len, free });
        Ok(Carved { arena: self.clone(), slab: slabs.len() - 1, off: 0, len: want, ptr: base })
    }

    pub fn usage(&self) -> Usage {
        let slabs = self.0.slabs.lock().unwrap_or_else(|e| e.into_inner());
        let mapped_bytes: usize = slabs.iter().map(|s| s.len).sum();
        let free: usize = slabs.iter().flat_map(|s| s.free.iter().map(|&(_, l)| l)).sum();
        Usage { page_bytes: self.0.cfg.page_bytes, slabs: slabs.len(), mapped_bytes, carved_bytes: mapped_bytes - free }
    }

    fn give_back(&self, slab: usize, off: usize, len: usize) {
        let mut slabs = self.0.slabs.lock().unwrap_or_else(|e| e.into_inner());
        let free = &mut slabs[slab].free;
        let at = free.partition_point(|&(o, _)| o < off);
        debug_assert!(at == free.len() || off + len <= free[at].0, "a range given back twice");
        free.insert(at, (off, len));
        // Merge with the next, then with the previous.
        if at + 1 < free.len() && free[at].0 + free[at].1 == free[at + 1].0 {
            free[at].1 += free[at + 1].1;
            free.remove(at + 1);
        }
        if at > 0 && free[at - 1].0 + free[at - 1].1 == free[at].0 {
            free[at - 1].1 += free[at].1;
            free.remove(at);
        }
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Arena {:?}", self.usage())
    }
}

/// A range of a slab, owned; given back to its arena when dropped.
pub struct Carved {
    arena: Arena,
    slab: usize,
    off: usize,
    len: usize,
    ptr: NonNull<u8>,
}

// SAFETY: the only handle to its range.
unsafe impl Send for Carved {}
unsafe impl Sync for Carved {}

impl Carved {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes (the request rounded up to 4 KiB).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn page_bytes(&self) -> usize {
        self.arena.0.cfg.page_bytes
    }
}

impl Drop for Carved {
    fn drop(&mut self) {
        self.arena.give_back(self.slab, self.off, self.len);
    }
}

impl fmt::Debug for Carved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Carved {{ slab: {}, off: {}, len: {} }}", self.slab, self.off, self.len)
    }
}

/// The process's hugepage policy, set once at start (`configure`).
#[derive(Debug, Clone)]
pub enum Policy {
    /// Ordinary pages everywhere (`common.huge_pages: false`).
    Off,
    /// Every pool and queue from this arena (`common.huge_pages: true`).
    On(Arena),
}

static POLICY: OnceLock<Policy> = OnceLock::new();

/// Set the process's policy: `None` ordinary pages, `Some` an arena of
/// that shape (its preallocated slabs mapped now: an error names what to
/// reserve). Once per process; later calls are refused.
pub fn configure(cfg: Option<HugeConfig>) -> Result<Option<Usage>, String> {
    let p = match cfg {
        None => Policy::Off,
        Some(c) => Policy::On(Arena::new(c)?),
    };
    let usage = match &p {
        Policy::On(a) => Some(a.usage()),
        Policy::Off => None,
    };
    POLICY.set(p).map_err(|_| "the hugepage policy is set once per process".to_string())?;
    Ok(usage)
}

/// The policy set by `configure`; `None` when it never was (the default:
/// each pool tries 2 MiB hugepages of its own).
pub fn policy() -> Option<&'static Policy> {
    POLICY.get()
}

/// A range of the process's arena, when hugepages are configured on.
/// `None`: they are not (`Some(Err)`: they are, and the arena is full).
pub fn carve(bytes: usize) -> Option<Result<Carved, String>> {
    match POLICY.get()? {
        Policy::On(a) => Some(a.carve(bytes)),
        Policy::Off => None,
    }
}

/// The process arena's figures (for the log and `/metrics`).
pub fn usage() -> Option<Usage> {
    match POLICY.get()? {
        Policy::On(a) => Some(a.usage()),
        Policy::Off => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(preallocate: usize, slabs_max: usize) -> Arena {
        Arena::new(HugeConfig { page_bytes: PAGE_4K, slab_bytes: 64 << 10, preallocate, slabs_max }).unwrap()
    }

    #[test]
    fn carves_first_fit_merges_what_comes_back_and_reuses_it() {
        let a = small(1, 2);
        assert_eq!(a.usage(), Usage { page_bytes: PAGE_4K, slabs: 1, mapped_bytes: 64 << 10, carved_bytes: 0 });
        let x = a.carve(1).unwrap();
        assert_eq!(x.len(), 4096, "rounded up to 4 KiB");
        let y = a.carve(8192).unwrap();
        let z = a.carve(4096).unwrap();
        assert_eq!(y.as_ptr() as usize - x.as_ptr() as usize, 4096);
        assert_eq!(z.as_ptr() as usize - y.as_ptr() as usize, 8192);
        // SAFETY: the carved ranges are ours.
        unsafe { std::ptr::write_bytes(y.as_ptr(), 0xab, y.len()) };
        let y_at = y.as_ptr();
        drop(x);
        drop(y);
        // x and y merged: 12 KiB fits where they were.
        let w = a.carve(12 << 10).unwrap();
        assert_eq!(w.as_ptr() as usize, y_at as usize - 4096);
        assert_eq!(a.usage().carved_bytes, 16 << 10);
        drop(w);
        drop(z);
        assert_eq!(a.usage().carved_bytes, 0);
        assert_eq!(a.0.slabs.lock().unwrap()[0].free, vec![(0, 64 << 10)], "everything merged back into one range");
    }

    #[test]
    fn maps_slabs_on_demand_up_to_the_bound_and_says_so() {
        let a = small(0, 2);
        assert_eq!(a.usage().slabs, 0);
        let x = a.carve(60 << 10).unwrap();
        // Too large for the first slab's rest: a second slab.
        let y = a.carve(8 << 10).unwrap();
        assert_eq!(a.usage().slabs, 2);
        // Larger than a slab: refused at the bound, naming what to raise.
        let e = a.carve(1 << 20).unwrap_err();
        assert!(e.contains("2 slabs") && e.contains("common.slab_size"), "{e}");
        // Room left in the first slab still serves small carves.
        let z = a.carve(4096).unwrap();
        drop((x, y, z));
        assert_eq!(a.usage().carved_bytes, 0);
        assert!(a.carve(0).is_err());
        assert!(a.carve(usize::MAX).is_err());
    }

    #[test]
    fn a_carve_larger_than_a_slab_gets_one_of_its_own() {
        let a = small(0, 4);
        let big = a.carve(200 << 10).unwrap();
        assert_eq!(a.usage().mapped_bytes, 200 << 10);
        // SAFETY: ours.
        unsafe { std::ptr::write_bytes(big.as_ptr(), 1, big.len()) };
    }

    #[test]
    fn bad_shapes_are_refused_naming_the_problem() {
        let c = HugeConfig { page_bytes: PAGE_2M, slab_bytes: PAGE_2M, preallocate: 0, slabs_max: 1 };
        assert!(HugeConfig { page_bytes: 3 << 20, ..c }.check().unwrap_err().contains("2 MiB or 1 GiB"));
        assert!(HugeConfig { slab_bytes: 3 << 20, ..c }.check().unwrap_err().contains("multiple of the hugepage size"));
        assert!(HugeConfig { preallocate: 2, ..c }.check().is_err());
        assert!(HugeConfig { slabs_max: SLABS_MAX + 1, ..c }.check().is_err());
        assert!(c.check().is_ok());
    }

    /// Without hugepages reserved (none on a build machine), mapping a
    /// slab fails and the error says what to reserve and where.
    #[test]
    fn unavailable_hugepages_name_the_fix() {
        let free = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages").unwrap_or_default();
        let r = Arena::new(HugeConfig { page_bytes: PAGE_1G, slab_bytes: PAGE_1G, preallocate: 1, slabs_max: 1 });
        if free.trim().parse::<u64>().unwrap_or(0) > 0 {
            // 1 GiB pages reserved here: the slab maps.
            assert_eq!(r.unwrap().usage().mapped_bytes, PAGE_1G);
            return;
        }
        let e = r.unwrap_err();
        assert!(e.contains("1 GiB hugepages") && e.contains("hugepages-1048576kB") && e.contains("common.huge_pages"), "{e}");
    }
}
