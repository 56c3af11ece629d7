//! Memory registered with an RDMA device: page-aligned, pinned by the
//! registration, unregistered on drop. It comes from the allocator the
//! process installed ([`set_allocator`]: chimerad's hugepage slabs when
//! `common.huge_pages` is on), else from a mapping of its own, unmapped on
//! drop.

use crate::verbs;
use std::any::Any;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

/// Memory an installed allocator hands out: its start, its length (at
/// least what was asked, page-aligned), and what keeps it (dropped when
/// the region is, after the registration).
pub struct Carved {
    pub ptr: *mut u8,
    pub len: usize,
    pub keep: Box<dyn Any + Send + Sync>,
}

/// `len` bytes, or `None` when this allocator does not serve (then a
/// mapping of its own), or an error to report.
pub type Allocator = dyn Fn(usize) -> Option<Result<Carved, String>> + Send + Sync;

static ALLOCATOR: OnceLock<Box<Allocator>> = OnceLock::new();

/// Where registered memory comes from, once per process, before the
/// transport starts. False when one was installed already.
pub fn set_allocator(a: Box<Allocator>) -> bool {
    ALLOCATOR.set(a).is_ok()
}

/// Bytes registered now: from the installed allocator, and mapped by the
/// regions themselves.
pub static CARVED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static MAPPED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Memory registered with one protection domain.
pub struct Region {
    ptr: *mut u8,
    len: usize,
    mr: *mut c_void,
    pub lkey: u32,
    pub rkey: u32,
    /// From the installed allocator (not unmapped on drop).
    carved: Option<Box<dyn Any + Send + Sync>>,
}

impl Region {
    pub fn new(pd: *mut c_void, len: usize, access: c_int) -> Result<Region, String> {
        let l = verbs::lib()?;
        let (ptr, len, carved) = match ALLOCATOR.get().and_then(|a| a(len)) {
            Some(Ok(c)) => (c.ptr as *mut c_void, c.len, Some(c.keep)),
            Some(Err(e)) => return Err(format!("no memory to register for RDMA: {e}")),
            None => {
                let ptr = unsafe {
                    libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
                };
                if ptr == libc::MAP_FAILED {
                    return Err(format!("cannot map {len} bytes: {}", std::io::Error::last_os_error()));
                }
                (ptr, len, None)
            }
        };
        let mr = unsafe { (l.reg_mr)(pd, ptr, len, access) };
        if mr.is_null() {
            let e = std::io::Error::last_os_error();
            if carved.is_none() {
                unsafe { libc::munmap(ptr, len) };
            }
            return Err(format!("cannot register {len} bytes with the RDMA device: {e} (raise the memlock limit: ulimit -l / IPC_LOCK)"));
        }
        let counter = if carved.is_some() { &CARVED_BYTES } else { &MAPPED_BYTES };
        counter.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        let (lkey, rkey) = unsafe { verbs::mr_keys(mr) };
        Ok(Region { ptr: ptr as *mut u8, len, mr, lkey, rkey, carved })
    }

    /// `len` bytes at `at`. Not tied to a borrow of the region: the loop
    /// hands each slot to one user at a time (free lists), and the region
    /// outlives every use (it is dropped only after its queue pair).
    #[allow(clippy::mut_from_ref)]
    pub fn slice<'a>(&self, at: usize, len: usize) -> &'a mut [u8] {
        assert!(at + len <= self.len);
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }

    pub fn addr(&self, at: usize) -> u64 {
        self.ptr as u64 + at as u64
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Ok(l) = verbs::lib() {
            unsafe { (l.dereg_mr)(self.mr) };
        }
        if self.carved.take().is_some() {
            CARVED_BYTES.fetch_sub(self.len as u64, std::sync::atomic::Ordering::Relaxed);
            return; // back to its allocator
        }
        MAPPED_BYTES.fetch_sub(self.len as u64, std::sync::atomic::Ordering::Relaxed);
        unsafe { libc::munmap(self.ptr as *mut c_void, self.len) };
    }
}

