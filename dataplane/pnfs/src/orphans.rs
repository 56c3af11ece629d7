//! The sweep of orphaned data files on the data servers.
//!
//! A data file outlives its MDS file when its removal could not reach the
//! DS (unreachable, or the MDS stopped with removals queued), or when the
//! MDS stopped between creating a file's data files and recording its
//! placement. Nothing else would ever remove them, so the control thread
//! lists each data server's data directory now and then and removes every
//! data file whose MDS object is gone: its name is the MDS handle
//! (`data_file_name`), and the MDS's backend answers `Stale` for a handle
//! whose object no longer exists (handles carry a generation, so a reused
//! inode is another handle). Only `Stale` removes: a handle of an export
//! this MDS does not serve (`BadHandle`), a live object (placed, or being
//! placed right now) and a name that is not a handle are left alone.
//!
//! The work is bounded: a few READDIR pages per control tick, one DS after
//! the other, a sweep at most every `orphan_sweep_interval_ms`.

use crate::{data_file_name, Pnfs};
use std::sync::atomic::Ordering;
use vfs::{FileHandle, VfsError};

/// READDIR pages (32 KiB each, a few hundred names) per control tick.
const PAGES_PER_TICK: usize = 4;

#[derive(Default)]
pub(crate) struct Sweep {
    /// When the next sweep may start (ms since the MDS started).
    next_due_ms: Option<u64>,
    /// DSes left in this sweep.
    pending: Vec<u64>,
    /// The DS being listed: id, READDIR cookie and cookie verifier.
    cur: Option<(u64, u64, [u8; 8])>,
}

/// The MDS handle a data file is named after, if the name is one.
pub(crate) fn handle_of_name(name: &[u8]) -> Option<FileHandle> {
    if name.len() % 2 != 0 || name.is_empty() {
        return None;
    }
    let hex = |c: u8| {
        (c as char)
            .to_digit(16)
            .filter(|_| !c.is_ascii_uppercase())
            .map(|d| d as u8)
    };
    let bytes: Option<Vec<u8>> = name
        .chunks(2)
        .map(|p| Some(hex(p[0])? << 4 | hex(p[1])?))
        .collect();
    let fh = FileHandle::from_bytes(&bytes?).ok()?;
    // Only the exact spelling `data_file_name` gives.
    (data_file_name(&fh).as_bytes() == name).then_some(fh)
}

impl Pnfs {
    /// One step of the orphan sweep (the control thread calls it each tick).
    pub(crate) fn sweep_orphans_some(&self) {
        let interval = self.cfg.orphan_sweep_interval_ms;
        if interval == 0 {
            return;
        }
        let now = self.now_ms();
        let mut sw = self.sweep.lock().unwrap_or_else(|e| e.into_inner());
        if sw.cur.is_none() && sw.pending.is_empty() {
            let due = *sw.next_due_ms.get_or_insert(interval);
            if now < due {
                return;
            }
            sw.next_due_ms = Some(now + interval);
            let st = self.state();
            sw.pending = st
                .ds
                .recs
                .iter()
                .filter(|r| r.present && r.healthy && r.spec.ready)
                .map(|r| r.id)
                .rev()
                .collect();
        }
        for _ in 0..PAGES_PER_TICK {
            let (id, cookie, mut verf) = match sw.cur.take() {
                Some(c) => c,
                None => match sw.pending.pop() {
                    Some(id) => (id, 0, [0u8; 8]),
                    None => return,
                },
            };
            let Some(conn) = self.state().ds.conn(id) else {
                continue;
            };
            let listed = {
                let mut c = conn.lock().unwrap_or_else(|e| e.into_inner());
                c.root().and_then(|root| {
                    c.client
                        .readdir_page(&root, cookie, &mut verf)
                        .map(|page| (root, page))
                })
            };
            let (root, (names, next, eof)) = match listed {
                Ok(x) => x,
                Err(e) => {
                    // This DS waits for the next sweep.
                    eprintln!(
                        "pnfs: orphan sweep: listing the data files of {}: {e}",
                        self.state().ds.name_of(id)
                    );
                    continue;
                }
            };
            for name in names {
                let Some(fh) = handle_of_name(&name) else {
                    continue;
                };
                if !matches!(self.vfs.getattr(&fh), Err(VfsError::Stale)) {
                    continue;
                }
                let gone = {
                    let mut c = conn.lock().unwrap_or_else(|e| e.into_inner());
                    c.client.remove(&root, &name)
                };
                match gone {
                    Ok(()) => {
                        self.metrics.orphans_removed.fetch_add(1, Ordering::Relaxed);
                        eprintln!(
                            "pnfs: orphan sweep: removed data file {} on {}: its MDS file no longer exists",
                            String::from_utf8_lossy(&name),
                            self.state().ds.name_of(id)
                        );
                    }
                    // Removed meanwhile (a REMOVE's own job got there first).
                    Err(crate::client3::CtlError::Status(crate::client3::NFS3ERR_NOENT)) => {}
                    Err(e) => eprintln!(
                        "pnfs: orphan sweep: removing {} on {}: {e}",
                        String::from_utf8_lossy(&name),
                        self.state().ds.name_of(id)
                    ),
                }
            }
            if !eof {
                sw.cur = Some((id, next, verf));
            }
        }
    }
}
