//! Resync of stale mirror copies.
//!
//! A copy goes stale when it misses writes: its DS was draining (a rolling
//! restart), unhealthy, or failed a write. It is never read again, and
//! without a way back every rolling restart would leave a mirrored file one
//! copy poorer, until the second DS to restart took the last good copy
//! with it. When the DS of a stale copy is active again, the control thread
//! copies a good mirror over it, one file at a time:
//!
//! 1. the file is marked *resyncing*: LAYOUTGET for it is refused
//!    (LAYOUTUNAVAILABLE: the Linux client does its I/O through the MDS),
//!    and writes through the MDS go to the stale copy as well;
//! 2. every layout of the file is recalled; the resync waits until they are
//!    returned (the client flushed what it wrote to the DSes) and fences the
//!    file when they are not returned within `RETURN_WAIT`;
//! 3. the stale data file is truncated to nothing and extended to the
//!    file's size, then the good copy is copied over it up to `CHUNK` bytes at a
//!    time (chunks that read as zeros are left as holes), FILE_SYNC, each
//!    chunk under `resync_gate` held exclusively, so no write through the
//!    MDS lands between a chunk's read and its write;
//! 4. unless a write through the MDS missed the copy meanwhile, the copy is
//!    good again and the placement is stored; otherwise it stays stale and
//!    is tried again after `RETRY_MS`.
//!
//! Only placements in memory are walked (`State::stale_files`): after an MDS
//! restart a file's stale copy is found when the file is first used again.
//! Mirrored files are one whole-file segment (`Placement::segmented` is
//! false), so every other non-stale slot holds the same bytes; a striped
//! placement never has a second copy of a unit to copy from.

use crate::client3::{CtlError, Sattr};
use crate::{Placement, Pnfs, State};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use vfs::FileHandle;

/// Bytes copied per chunk (one READ from the good copy, one WRITE).
pub const CHUNK: u32 = 256 << 10;
/// How long a resync waits for the file's recalled layouts to come back
/// before it fences the file.
pub const RETURN_WAIT: Duration = Duration::from_secs(10);
/// A failed resync of a copy is tried again after this long.
pub const RETRY_MS: u64 = 30_000;
/// At most this long of resync work per control-thread tick, so removals
/// and health probes are not held up behind a long queue of copies.
const TICK_BUDGET: Duration = Duration::from_secs(5);

/// Clears `State::resyncing` however the resync ends.
struct Resyncing<'a>(&'a Pnfs);

impl Drop for Resyncing<'_> {
    fn drop(&mut self) {
        self.0.state().resyncing = None;
    }
}

impl Pnfs {
    /// Stale copies per DS id (placements in memory).
    pub(crate) fn stale_by_ds(&self, st: &State) -> HashMap<u64, u64> {
        let mut out = HashMap::new();
        for fh in &st.stale_files {
            if let Some(p) = st.files.get(fh) {
                for (i, id) in p.dses.iter().enumerate() {
                    if p.stale[i] {
                        *out.entry(*id).or_default() += 1;
                    }
                }
            }
        }
        out
    }

    /// A stale copy that can be brought back now: its DS is active, a good
    /// copy on an active DS exists, and it did not fail recently.
    fn next_resync(&self) -> Option<(FileHandle, usize)> {
        let now = self.now_ms();
        let st = self.state();
        for fh in &st.stale_files {
            let Some(p) = st.files.get(fh) else { continue };
            if p.segmented() {
                continue;
            }
            for i in 0..p.dses.len() {
                let due = st.resync_retry_after.get(&(*fh, i)).is_none_or(|t| now >= *t);
                if p.stale[i] && due && Self::usable(&st, p, i) && Self::source(&st, p, i).is_some() {
                    return Some((*fh, i));
                }
            }
        }
        None
    }

    fn usable(st: &State, p: &Placement, i: usize) -> bool {
        st.ds.get(p.dses[i]).is_some_and(|r| r.active())
    }

    /// A good copy of `p` other than slot `i`, on an active DS.
    fn source(st: &State, p: &Placement, i: usize) -> Option<usize> {
        (0..p.dses.len()).find(|&j| j != i && !p.stale[j] && Self::usable(st, p, j))
    }

    /// Resync what can be resynced, within one tick's budget (control thread).
    pub(crate) fn resync_some(&self) {
        let start = Instant::now();
        while start.elapsed() < TICK_BUDGET {
            let Some((fh, i)) = self.next_resync() else { return };
            match self.resync(&fh, i) {
                Ok(bytes) => {
                    self.metrics.resyncs.fetch_add(1, Ordering::Relaxed);
                    self.metrics.resync_bytes.fetch_add(bytes, Ordering::Relaxed);
                    let mut st = self.state();
                    st.resync_retry_after.remove(&(fh, i));
                }
                Err(e) => {
                    self.metrics.resync_failures.fetch_add(1, Ordering::Relaxed);
                    let at = self.now_ms() + RETRY_MS;
                    self.state().resync_retry_after.insert((fh, i), at);
                    eprintln!("pnfs: resync of the stale copy of {} stopped: {e}; tried again in {} s", crate::data_file_name(&fh), RETRY_MS / 1000);
                }
            }
        }
    }

    /// Copy a good mirror of `fh` over its stale copy in slot `i` (see the
    /// module's steps); returns the bytes written to the copy.
    pub(crate) fn resync(&self, fh: &FileHandle, i: usize) -> Result<u64, String> {
        {
            let mut st = self.state();
            st.resyncing = Some((*fh, i));
            st.resync_broken = false;
        }
        let _clear = Resyncing(self);
        self.recall_where(|l| l.fh == *fh, true);
        let deadline = Instant::now() + RETURN_WAIT;
        while self.state().layouts.values().any(|l| l.fh == *fh) {
            if Instant::now() >= deadline {
                self.fence(fh);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mds_size = self.vfs.getattr(fh).map_err(|e| format!("the file's attributes: {e:?}"))?.size;
        let (p, target) = {
            let st = self.state();
            let p = st.files.get(fh).cloned().ok_or("the file is gone")?;
            if !p.stale[i] {
                return Ok(0);
            }
            let target = st.ds.conn(p.dses[i]).ok_or("the copy's data server has no connection")?;
            (p, target)
        };
        let source_size = {
            let st = self.state();
            let j = Self::source(&st, &p, i).ok_or("no good copy on an active data server")?;
            let c = st.ds.conn(p.dses[j]).ok_or("the good copy's data server has no connection")?;
            drop(st);
            let r = c.lock().unwrap_or_else(|e| e.into_inner()).client.getattr(&p.data_fh[j]);
            r.map_err(|e| format!("the good copy's attributes: {e:?}"))?.size
        };
        // Beyond the MDS's size only when a fenced client's writes reached
        // the DSes without a LAYOUTCOMMIT: copy those too.
        let size = mds_size.max(source_size);
        {
            let _g = self.resync_gate.write().unwrap_or_else(|e| e.into_inner());
            let mut t = target.lock().unwrap_or_else(|e| e.into_inner());
            for s in [0, size] {
                t.client.setattr(&p.data_fh[i], &Sattr { size: Some(s), ..Default::default() }).map_err(|e| self.target_failed(&p, i, "truncating the copy", e))?;
            }
        }
        let mut copied = 0u64;
        let mut buf = Vec::new();
        let mut off = 0u64;
        while off < size {
            let n = (size - off).min(CHUNK as u64) as u32;
            let _g = self.resync_gate.write().unwrap_or_else(|e| e.into_inner());
            // The good copy again under the gate: a write through the MDS
            // may have found it failing since.
            let src = {
                let st = self.state();
                let cur = st.files.get(fh).ok_or("the file is gone")?;
                let j = Self::source(&st, cur, i).ok_or("no good copy on an active data server")?;
                (st.ds.conn(cur.dses[j]).ok_or("the good copy's data server has no connection")?, cur.dses[j], j)
            };
            let r = src.0.lock().unwrap_or_else(|e| e.into_inner()).client.read(&p.data_fh[src.2], off, n, &mut buf);
            let eof = match r {
                Ok(eof) => eof,
                Err(e) => {
                    if matches!(e, CtlError::Unreachable(_)) {
                        self.ds_failed(src.1);
                    }
                    return Err(format!("reading the good copy at {off}: {e:?}"));
                }
            };
            if buf.iter().any(|b| *b != 0) {
                let w = target.lock().unwrap_or_else(|e| e.into_inner()).client.write(&p.data_fh[i], off, &buf, 2);
                match w {
                    Ok((c, _)) if c as usize == buf.len() => copied += c as u64,
                    Ok((c, _)) => return Err(format!("the copy took {c} of {} bytes at {off}", buf.len())),
                    Err(e) => return Err(self.target_failed(&p, i, "writing the copy", e)),
                }
            }
            // A short read is the good copy's end (the rest is a hole) or
            // the data server's transfer size (go on from where it ended).
            if buf.is_empty() || eof {
                break;
            }
            off += buf.len() as u64;
        }
        {
            // Under the gate: no write through the MDS is half done.
            let _g = self.resync_gate.write().unwrap_or_else(|e| e.into_inner());
            let mut st = self.state();
            if st.resync_broken {
                return Err("a write through the MDS did not reach the copy".into());
            }
            let Some(f) = st.files.get_mut(fh) else { return Err("the file is gone".into()) };
            f.stale[i] = false;
            if !f.stale.iter().any(|s| *s) {
                st.stale_files.remove(fh);
            }
        }
        self.persist(fh);
        Ok(copied)
    }

    fn target_failed(&self, p: &Placement, i: usize, what: &str, e: CtlError) -> String {
        if matches!(e, CtlError::Unreachable(_)) {
            self.ds_failed(p.dses[i]);
        }
        format!("{what}: {e:?}")
    }
}
