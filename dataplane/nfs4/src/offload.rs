//! Asynchronous intra-server COPY (RFC 7862 §4.4, §15.2, §15.8, §15.9,
//! §16.1): a COPY the client lets the server run asynchronously
//! (ca_synchronous false), larger than one synchronous COPY covers
//! (`COPY_BYTES_MAX`), is answered at once with a copy stateid
//! (wr_callback_id); a worker thread copies in `COPY_BYTES_MAX` chunks and
//! then sends CB_OFFLOAD with the outcome on the client's back channel.
//! OFFLOAD_STATUS reports the progress, OFFLOAD_CANCEL stops the copy
//! between chunks (no CB_OFFLOAD then, §15.8.3). Bounded: `OFFLOADS_MAX`
//! copies run at once (beyond that COPY stays synchronous), finished ones
//! are remembered for OFFLOAD_STATUS up to `OFFLOADS_DONE_MAX`.

use crate::callback::{Callbacks, OffloadDone};
use crate::state::{ClientId, Stateid};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vfs::{FileHandle, Vfs};

/// Copies running at once, all clients.
pub const OFFLOADS_MAX: usize = 16;
/// Finished copies remembered for OFFLOAD_STATUS.
pub const OFFLOADS_DONE_MAX: usize = 256;
/// Largest asynchronous COPY (a bigger request is answered short of it,
/// and the client asks again for the rest).
pub const OFFLOAD_BYTES_MAX: u64 = 1 << 30;
/// Copy stateids carry this in the high bit of their key, apart from the
/// open, lock and delegation stateids (`state`).
const KEY_BIT: u64 = 1 << 63;

struct Job {
    clientid: ClientId,
    dst: FileHandle,
    copied: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
    /// Set when the copy ended: its nfsstat4.
    done: Option<i32>,
}

#[derive(Default)]
struct Table {
    jobs: HashMap<u64, Job>,
    done_order: VecDeque<u64>,
    running: usize,
}

/// Progress of a copy, for OFFLOAD_STATUS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub copied: u64,
    /// The copy's final status once it ended.
    pub complete: Option<i32>,
}

pub struct Offloads {
    epoch: u32,
    next: AtomicU64,
    table: Mutex<Table>,
}

/// What a started copy needs to run.
pub struct CopyJob {
    pub clientid: ClientId,
    pub src: FileHandle,
    pub src_offset: u64,
    pub dst: FileHandle,
    pub dst_offset: u64,
    pub count: u64,
    /// Bytes per `Vfs::copy_range` call.
    pub chunk: u64,
    /// Bytes of `count` the COPY itself copied before handing over.
    pub already: u64,
}

impl Offloads {
    pub(crate) fn new(epoch: u32) -> Self {
        Offloads { epoch, next: AtomicU64::new(1), table: Mutex::new(Table::default()) }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stateid(&self, key: u64) -> Stateid {
        let mut other = [0u8; 12];
        other[..4].copy_from_slice(&self.epoch.to_be_bytes());
        other[4..].copy_from_slice(&key.to_be_bytes());
        Stateid { seqid: 1, other }
    }

    fn key_of(&self, sid: &Stateid) -> Option<u64> {
        let epoch = u32::from_be_bytes(sid.other[..4].try_into().unwrap());
        let key = u64::from_be_bytes(sid.other[4..].try_into().unwrap());
        (epoch == self.epoch && key & KEY_BIT != 0).then_some(key)
    }

    /// Copies running now.
    pub fn running(&self) -> usize {
        self.table().running
    }

    /// Start `job` on a worker thread; None when `OFFLOADS_MAX` run already
    /// (the caller copies synchronously instead). CB_OFFLOAD goes to the
    /// client when it ends (unless cancelled).
    pub(crate) fn start(self: &Arc<Self>, job: CopyJob, vfs: Arc<dyn Vfs>, callbacks: Arc<Callbacks>) -> Option<Stateid> {
        let key = KEY_BIT | self.next.fetch_add(1, Ordering::Relaxed);
        let copied = Arc::new(AtomicU64::new(0));
        let cancel = Arc::new(AtomicBool::new(false));
        {
            let mut t = self.table();
            if t.running >= OFFLOADS_MAX {
                return None;
            }
            t.running += 1;
            t.jobs.insert(key, Job { clientid: job.clientid, dst: job.dst, copied: copied.clone(), cancel: cancel.clone(), done: None });
        }
        let sid = self.stateid(key);
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("nfs4-copy".into()).spawn(move || {
            let status = run_copy(&job, &*vfs, &copied, &cancel);
            let n = copied.load(Ordering::Relaxed);
            me.finish(key, status);
            if cancel.load(Ordering::Relaxed) {
                return; // OFFLOAD_CANCEL: no CB_OFFLOAD (RFC 7862 §15.8.3)
            }
            let done = OffloadDone { fh: job.dst, stateid: sid, status, count: n, verifier: vfs.write_verifier() };
            if let Err(e) = callbacks.offload(job.clientid, done) {
                eprintln!("nfs4: CB_OFFLOAD for copy {key:#x} of client {:#x} not sent ({e}); OFFLOAD_STATUS still reports it", job.clientid);
            }
        });
        if let Err(e) = spawned {
            eprintln!("nfs4: cannot start a copy thread ({e}): copying synchronously");
            let mut t = self.table();
            t.jobs.remove(&key);
            t.running -= 1;
            return None;
        }
        Some(sid)
    }

    fn finish(&self, key: u64, status: i32) {
        let mut t = self.table();
        t.running -= 1;
        if let Some(j) = t.jobs.get_mut(&key) {
            j.done = Some(status);
        }
        t.done_order.push_back(key);
        while t.done_order.len() > OFFLOADS_DONE_MAX {
            if let Some(old) = t.done_order.pop_front() {
                t.jobs.remove(&old);
            }
        }
    }

    /// OFFLOAD_STATUS (§15.9) of `sid` on `dst` for `clientid`.
    pub fn status(&self, clientid: ClientId, sid: &Stateid, dst: &FileHandle) -> Option<Progress> {
        let key = self.key_of(sid)?;
        let t = self.table();
        let j = t.jobs.get(&key).filter(|j| j.clientid == clientid && j.dst == *dst)?;
        Some(Progress { copied: j.copied.load(Ordering::Relaxed), complete: j.done })
    }

    /// OFFLOAD_CANCEL (§15.8): false when no such copy of this client.
    pub fn cancel(&self, clientid: ClientId, sid: &Stateid, dst: &FileHandle) -> bool {
        let Some(key) = self.key_of(sid) else { return false };
        let t = self.table();
        match t.jobs.get(&key).filter(|j| j.clientid == clientid && j.dst == *dst) {
            Some(j) => {
                j.cancel.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

/// Copy in chunks, counting progress, stopping early on cancel. Returns
/// the nfsstat4 the copy ends with.
fn run_copy(job: &CopyJob, vfs: &dyn Vfs, copied: &AtomicU64, cancel: &AtomicBool) -> i32 {
    let mut done = job.already;
    copied.store(done, Ordering::Relaxed);
    while done < job.count {
        if cancel.load(Ordering::Relaxed) {
            // Stopped by OFFLOAD_CANCEL: what was copied stays.
            break;
        }
        let n = (job.count - done).min(job.chunk);
        match vfs.copy_range(&job.src, job.src_offset + done, &job.dst, job.dst_offset + done, n) {
            Ok(0) => break,
            Ok(k) => {
                done += k;
                copied.store(done, Ordering::Relaxed);
            }
            Err(e) => return crate::error::vfs_status(e),
        }
    }
    proto::nfs4::NFS4_OK
}
