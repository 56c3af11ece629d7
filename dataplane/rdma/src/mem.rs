//! Memory registered with an RDMA device: mmap'd, page-aligned, pinned
//! by the registration, unregistered and unmapped on drop.

use crate::verbs;
use std::ffi::{c_int, c_void};

/// mmap'd memory registered with one protection domain.
pub struct Region {
    ptr: *mut u8,
    len: usize,
    mr: *mut c_void,
    pub lkey: u32,
    pub rkey: u32,
}

impl Region {
    pub fn new(pd: *mut c_void, len: usize, access: c_int) -> Result<Region, String> {
        let l = verbs::lib()?;
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("cannot map {len} bytes: {}", std::io::Error::last_os_error()));
        }
        let mr = unsafe { (l.reg_mr)(pd, ptr, len, access) };
        if mr.is_null() {
            let e = std::io::Error::last_os_error();
            unsafe { libc::munmap(ptr, len) };
            return Err(format!("cannot register {len} bytes with the RDMA device: {e} (raise the memlock limit: ulimit -l / IPC_LOCK)"));
        }
        let (lkey, rkey) = unsafe { verbs::mr_keys(mr) };
        Ok(Region { ptr: ptr as *mut u8, len, mr, lkey, rkey })
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
        unsafe { libc::munmap(self.ptr as *mut c_void, self.len) };
    }
}

