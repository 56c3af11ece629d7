//! Delegations at the program level (RFC 8881 §10.2, §10.4): the state
//! machine decides (`state::deleg`), this sends what it asks for — CB_RECALL
//! for each delegation an access conflicts with, CB_RECALL_ANY when the
//! table runs short — and revokes a delegation whose recall could not be
//! delivered. NFSv4 operations call [`Delegations::must_wait`] with the
//! caller's client ID; NFSv3 reaches it as a `vfs::DelegationBreaker`.

use crate::callback::{CbError, Callbacks, DelegRecall, RecallResult, RecallTicket};
use crate::state::{ClientId, Recall, State};
use crate::StateGuard;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;
use vfs::{FileHandle, Vfs};

pub struct Delegations {
    state: Arc<Mutex<State>>,
    vfs: Arc<dyn Vfs>,
    callbacks: Arc<Callbacks>,
    /// Delegations held (the state's gauge): zero means nothing to check.
    gauge: Arc<AtomicUsize>,
    clock: Instant,
    skew_ms: Arc<AtomicU64>,
    /// CB_RECALLs sent, delegations revoked (metrics, tests).
    recalls_sent: AtomicU64,
    revoked_undeliverable: AtomicU64,
}

impl Delegations {
    pub(crate) fn new(
        state: Arc<Mutex<State>>,
        vfs: Arc<dyn Vfs>,
        callbacks: Arc<Callbacks>,
        clock: Instant,
        skew_ms: Arc<AtomicU64>,
    ) -> Self {
        let gauge = state.lock().unwrap_or_else(|e| e.into_inner()).deleg_gauge();
        Delegations {
            state,
            vfs,
            callbacks,
            gauge,
            clock,
            skew_ms,
            recalls_sent: AtomicU64::new(0),
            revoked_undeliverable: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64 + self.skew_ms.load(Ordering::Relaxed)
    }

    /// Delegations held now.
    pub fn held(&self) -> usize {
        self.gauge.load(Ordering::Relaxed)
    }

    /// CB_RECALLs sent since start.
    pub fn recalls_sent(&self) -> u64 {
        self.recalls_sent.load(Ordering::Relaxed)
    }

    /// An access to `fh` by `by` (None: NFSv3 or the anonymous stateid).
    /// true: wait (NFS4ERR_DELAY / NFS3ERR_JUKEBOX); the conflicting
    /// delegations are being recalled.
    pub fn must_wait_for(&self, fh: &FileHandle, by: Option<ClientId>, write: bool) -> bool {
        if self.gauge.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let now = self.now_ms();
        let r = StateGuard::lock(&self.state, &*self.vfs).deleg_conflict(fh, by, write, now);
        match r {
            Ok(()) => false,
            Err(recalls) => {
                for r in recalls {
                    self.send_recall(r);
                }
                true
            }
        }
    }

    fn send_recall(&self, r: Recall) {
        let weak: Weak<Mutex<State>> = Arc::downgrade(&self.state);
        let key = r.key;
        let on_done = Box::new(move |_: RecallTicket, res: RecallResult| {
            if let Err(e) = res {
                eprintln!("nfs4: CB_RECALL of delegation {key} failed ({e}): revoking it");
                if let Some(st) = weak.upgrade() {
                    st.lock().unwrap_or_else(|e| e.into_inner()).recall_failed(key);
                }
            }
        });
        self.recalls_sent.fetch_add(1, Ordering::Relaxed);
        let recall = DelegRecall { fh: r.fh, stateid: r.stateid, truncate: false };
        match self.callbacks.recall_delegation_notify(r.clientid, recall, on_done) {
            Ok(_) => {}
            // Queue full: the reaper revokes it one lease after the recall.
            Err(CbError::Busy) => {}
            Err(e) => {
                eprintln!("nfs4: cannot recall delegation {key} from client {:#x} ({e}): revoking it", r.clientid);
                self.revoked_undeliverable.fetch_add(1, Ordering::Relaxed);
                StateGuard::lock(&self.state, &*self.vfs).recall_failed(key);
            }
        }
    }

    /// After a grant: CB_RECALL_ANY to every holder if the table is three
    /// quarters full (at most once per half lease).
    pub(crate) fn maybe_recall_any(&self) {
        let due = StateGuard::lock(&self.state, &*self.vfs).recall_any_due(self.now_ms());
        for r in due {
            if let Err(e) = self.callbacks.recall_any(r.clientid, r.keep) {
                eprintln!("nfs4: CB_RECALL_ANY to client {:#x} not sent ({e})", r.clientid);
            }
        }
    }
}

impl vfs::DelegationBreaker for Delegations {
    fn active(&self) -> bool {
        self.held() > 0
    }

    fn must_wait(&self, fh: &FileHandle, write: bool) -> bool {
        self.must_wait_for(fh, None, write)
    }
}
