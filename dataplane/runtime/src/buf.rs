//! Connection buffers: small ones each connection owns, large ones lent by
//! bounded per-core pools while a connection needs them.
//!
//! Buffers are anonymous mappings, not heap blocks: a page is resident only
//! once touched, and unmapping gives every page back to the system, so a
//! storm of connections that come and go leaves nothing behind (heap blocks
//! of this size stay with the allocator and came back zero-filled, i.e.
//! touched, on reuse). Pool buffers are mapped on first use, up to the
//! pool's bound, and kept for the life of the core (the RDMA and NVMe
//! drivers will register these same regions once).

use std::ops::{Deref, DerefMut};

/// An anonymous, private, read-write mapping of `len` bytes (zero-filled).
pub(crate) struct MmapBuf {
    ptr: *mut u8,
    len: usize,
}

impl MmapBuf {
    pub(crate) fn new(len: usize) -> MmapBuf {
        assert!(len > 0);
        // SAFETY: a fresh anonymous mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "cannot map a {len}-byte connection buffer: {}", std::io::Error::last_os_error());
        MmapBuf { ptr: p as *mut u8, len }
    }
}

impl Drop for MmapBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no slice outlives self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

impl Deref for MmapBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, readable, alive while self is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for MmapBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and writable; `&mut self` makes it exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A core's pool of large buffers of one size, at most `count_max` of them.
pub(crate) struct Pool {
    free: Vec<MmapBuf>,
    made: usize,
    count_max: usize,
    buf_bytes: usize,
    /// Someone found the pool empty (wake them when a buffer comes back).
    pub(crate) waited: bool,
}

impl Pool {
    pub(crate) fn new(count_max: usize, buf_bytes: usize) -> Pool {
        assert!(count_max >= 1 && buf_bytes > 0);
        Pool { free: Vec::new(), made: 0, count_max, buf_bytes, waited: false }
    }

    pub(crate) fn available(&self) -> bool {
        !self.free.is_empty() || self.made < self.count_max
    }

    pub(crate) fn take(&mut self) -> Option<MmapBuf> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        if self.made < self.count_max {
            self.made += 1;
            return Some(MmapBuf::new(self.buf_bytes));
        }
        self.waited = true;
        None
    }

    pub(crate) fn give(&mut self, b: MmapBuf) {
        debug_assert_eq!(b.len, self.buf_bytes);
        debug_assert!(self.free.len() < self.made);
        self.free.push(b);
    }

    pub(crate) fn buf_bytes(&self) -> usize {
        self.buf_bytes
    }
}
