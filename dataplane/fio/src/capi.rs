//! The C ABI the fio shim (engine.c) calls; declared in
//! include/chimera_fio.h. Every function catches panics (a panic never
//! crosses into C) and reports failures as -errno plus a message written
//! into the caller's buffer.

use crate::{Config, Engine, Op};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// Options of one job, as engine.c reads them from fio.
#[repr(C)]
pub struct ChimeraFioConfig {
    pub server: *const c_char,
    pub export: *const c_char,
    pub mount_port: c_uint,
    pub conns: c_uint,
    pub iodepth: c_uint,
    pub uid: c_uint,
    pub gid: c_uint,
    /// Non-zero: pNFS (NFSv4.1 to the MDS, NFSv3 to the data servers).
    pub pnfs: c_uint,
    /// Microseconds to poll without sleeping before blocking (0: never).
    pub busy_poll_us: c_uint,
    /// Seconds the I/Os of a lost connection wait for a reconnect (0: they
    /// fail at once).
    pub retry_s: c_uint,
    pub hold_mib: c_uint,
    /// "tcp" (also NULL or empty) or "rdma".
    pub transport: *const c_char,
}

/// What C holds: the engine and the scratch `reap` fills.
pub struct ChimeraFio {
    engine: Engine,
    scratch: Vec<(u64, i64)>,
}

fn put_err(err: *mut c_char, errlen: usize, msg: &str) {
    if err.is_null() || errlen == 0 {
        return;
    }
    let n = msg.len().min(errlen - 1);
    // SAFETY: the caller gives a buffer of `errlen` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err as *mut u8, n);
        *err.add(n) = 0;
    }
}

fn string(p: *const c_char, what: &str) -> Result<String, String> {
    if p.is_null() {
        return Ok(String::new());
    }
    // SAFETY: fio's option strings are NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_str().map(str::to_string).map_err(|_| format!("{what} is not UTF-8"))
}

fn guarded<T>(err: *mut c_char, errlen: usize, fail: T, f: impl FnOnce() -> Result<T, String>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(m)) => {
            put_err(err, errlen, &m);
            fail
        }
        Err(_) => {
            put_err(err, errlen, "chimera-fio: internal error (panic); see stderr");
            fail
        }
    }
}

/// `guarded` for calls that answer a number or -errno: the error's message
/// goes into `err`.
fn errno_call(err: *mut c_char, errlen: usize, f: impl FnOnce() -> Result<c_int, (i32, String)>) -> c_int {
    let mut code = -libc::EINVAL;
    guarded(err, errlen, (), || match f() {
        Ok(v) => {
            code = v;
            Ok(())
        }
        Err((e, m)) => {
            code = -e;
            Err(m)
        }
    });
    code
}

/// Connect and mount; NULL with `err` filled on failure.
///
/// # Safety
/// `cfg` points to a valid config; `err` to `errlen` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn chimera_fio_connect(cfg: *const ChimeraFioConfig, err: *mut c_char, errlen: usize) -> *mut ChimeraFio {
    guarded(err, errlen, std::ptr::null_mut(), || {
        let c = cfg.as_ref().ok_or("no config")?;
        let cfg = Config {
            server: string(c.server, "chimera_server")?,
            export: string(c.export, "chimera_export")?,
            mount_port: u16::try_from(c.mount_port).map_err(|_| format!("chimera_mount_port {} is not a port", c.mount_port))?,
            conns: c.conns as usize,
            iodepth: c.iodepth.max(1) as usize,
            uid: c.uid,
            gid: c.gid,
            pnfs: c.pnfs != 0,
            busy_poll_us: c.busy_poll_us,
            retry_s: c.retry_s,
            hold_mib: c.hold_mib,
            rdma: if c.transport.is_null() { false } else { crate::parse_transport(&string(c.transport, "chimera_transport")?)? },
        };
        let depth = cfg.iodepth;
        let engine = Engine::connect(cfg)?;
        Ok(Box::into_raw(Box::new(ChimeraFio { engine, scratch: vec![(0, 0); depth] })))
    })
}

/// Open (or with `create`, create) `path`: the file's index, or -errno.
///
/// # Safety
/// `h` from `chimera_fio_connect`; `path` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn chimera_fio_open(h: *mut ChimeraFio, path: *const c_char, create: c_int, err: *mut c_char, errlen: usize) -> c_int {
    errno_call(err, errlen, || {
        let h = h.as_mut().ok_or_else(|| (libc::EINVAL, "no engine".to_string()))?;
        let path = string(path, "file name").map_err(|m| (libc::EINVAL, m))?;
        h.engine.open(&path, create != 0).map(|i| i as c_int)
    })
}

/// COMMIT what is unstable and forget the file: 0 or -errno.
///
/// # Safety
/// `h` from `chimera_fio_connect`.
#[no_mangle]
pub unsafe extern "C" fn chimera_fio_close(h: *mut ChimeraFio, file: c_int, err: *mut c_char, errlen: usize) -> c_int {
    errno_call(err, errlen, || {
        let h = h.as_mut().ok_or_else(|| (libc::EINVAL, "no engine".to_string()))?;
        h.engine.close(file as u32).map(|()| 0)
    })
}

/// Submit one I/O (`op` 0 read, 1 write, 2 sync): 0 or -errno.
///
/// # Safety
/// `buf` valid for `len` bytes and untouched until `tag` is reaped.
#[no_mangle]
pub unsafe extern "C" fn chimera_fio_queue(
    h: *mut ChimeraFio,
    file: c_int,
    op: c_int,
    offset: u64,
    buf: *mut c_void,
    len: u64,
    tag: u64,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    errno_call(err, errlen, || {
        let h = h.as_mut().ok_or_else(|| (libc::EINVAL, "no engine".to_string()))?;
        let op = match op {
            0 => Op::Read,
            1 => Op::Write,
            2 => Op::Sync,
            other => return Err((libc::EINVAL, format!("operation {other} is not read (0), write (1) or sync (2)"))),
        };
        h.engine.queue(file as u32, op, offset, buf as *mut u8, len as usize, tag).map(|()| 0)
    })
}

/// Reap between `min` and `max` finished I/Os into `tags` / `results`
/// (bytes, or -errno), waiting up to `timeout_ns` (< 0: no limit).
///
/// # Safety
/// `tags` and `results` hold `max` entries each.
#[no_mangle]
pub unsafe extern "C" fn chimera_fio_reap(
    h: *mut ChimeraFio,
    min: c_uint,
    max: c_uint,
    timeout_ns: i64,
    tags: *mut u64,
    results: *mut i64,
) -> c_int {
    guarded(std::ptr::null_mut(), 0, -libc::EIO, || {
        let h = h.as_mut().ok_or("no engine")?;
        let max = max as usize;
        if h.scratch.len() < max {
            h.scratch.resize(max, (0, 0));
        }
        let timeout = (timeout_ns >= 0).then(|| Duration::from_nanos(timeout_ns as u64));
        let n = h.engine.reap(min as usize, timeout, &mut h.scratch[..max]);
        for (k, &(tag, res)) in h.scratch[..n].iter().enumerate() {
            *tags.add(k) = tag;
            *results.add(k) = res;
        }
        Ok(n as c_int)
    })
}

/// Send what `chimera_fio_queue` queued (one send per connection): 0.
///
/// # Safety
/// `h` from `chimera_fio_connect`.
#[no_mangle]
pub unsafe extern "C" fn chimera_fio_commit(h: *mut ChimeraFio) -> c_int {
    guarded(std::ptr::null_mut(), 0, -libc::EIO, || {
        h.as_mut().ok_or("no engine")?.engine.commit();
        Ok(0)
    })
}

/// I/Os queued and not yet reaped.
///
/// # Safety
/// `h` from `chimera_fio_connect`.
#[no_mangle]
pub unsafe extern "C" fn chimera_fio_in_flight(h: *const ChimeraFio) -> c_uint {
    h.as_ref().map_or(0, |h| h.engine.in_flight() as c_uint)
}

/// Disconnect and free.
///
/// # Safety
/// `h` from `chimera_fio_connect`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn chimera_fio_free(h: *mut ChimeraFio) {
    if !h.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(h))));
    }
}
