//! Delegations (RFC 8881 §10.2, §10.4): granting read and write
//! delegations on OPEN, finding the ones another client's (or an NFSv3
//! client's) access conflicts with, recall bookkeeping, revocation one
//! lease after an unanswered recall, DELEGRETURN, and the CB_RECALL_ANY
//! trigger when the table runs short. Pure, like the rest of `State`:
//! the caller sends the callbacks the methods ask for.

use super::*;

/// No new delegation on a file for this long after one on it was
/// recalled: the client whose access caused the recall gets its turn
/// instead of the holder taking the file straight back.
pub const DELEG_REGRANT_HOLDOFF_MS: u64 = 2_000;
/// Files remembered as recently recalled (oldest forgotten first).
const RECENT_RECALLS_MAX: usize = 1024;
/// Revoked delegations remembered per client until it frees them.
pub const REVOKED_PER_CLIENT_MAX: usize = 1024;

/// What an OPEN asked for in its share_access want bits (§18.16.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelegWant {
    /// OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE: the server decides.
    NoPreference,
    Read,
    Write,
    Any,
    /// OPEN4_SHARE_ACCESS_WANT_NO_DELEG.
    NoDeleg,
    /// OPEN4_SHARE_ACCESS_WANT_CANCEL: we never queue wants, so nothing to cancel.
    Cancel,
}

impl DelegWant {
    /// Decode the want bits of share_access; None: an undefined value (NFS4ERR_INVAL).
    pub fn of(share_access: u32) -> Option<DelegWant> {
        use proto::nfs4 as p;
        Some(match share_access & p::OPEN4_SHARE_ACCESS_WANT_DELEG_MASK {
            p::OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE => DelegWant::NoPreference,
            p::OPEN4_SHARE_ACCESS_WANT_READ_DELEG => DelegWant::Read,
            p::OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG => DelegWant::Write,
            p::OPEN4_SHARE_ACCESS_WANT_ANY_DELEG => DelegWant::Any,
            p::OPEN4_SHARE_ACCESS_WANT_NO_DELEG => DelegWant::NoDeleg,
            p::OPEN4_SHARE_ACCESS_WANT_CANCEL => DelegWant::Cancel,
            _ => return None,
        })
    }
}

/// The delegation an OPEN got, or why not (a why_no_delegation4 value,
/// reported only when the client expressed a want).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelegGrant {
    Read(Stateid),
    Write(Stateid),
    None(i32),
}

/// A CB_RECALL to send: `key` names the delegation for `recall_failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recall {
    pub clientid: ClientId,
    pub key: u64,
    pub stateid: Stateid,
    pub fh: FileHandle,
}

/// A CB_RECALL_ANY to send: keep at most `keep` delegations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecallAny {
    pub clientid: ClientId,
    pub keep: u32,
}

impl State {
    /// Delegations held now, readable without the state lock.
    pub fn deleg_gauge(&self) -> Arc<AtomicUsize> {
        self.deleg_gauge.clone()
    }

    pub fn deleg_count(&self) -> usize {
        self.deleg_gauge.load(Ordering::Relaxed)
    }

    /// After `clientid` opened `fh` with `access` (OPEN succeeded): grant a
    /// delegation if it wants one, may have one, and nothing conflicts.
    /// `session`: the OPEN's session when a transport for callbacks is
    /// attached (None: nothing could recall the delegation); the client
    /// needs a usable back channel on one of its sessions, checked here
    /// under the same lock and only when a grant is otherwise possible.
    /// `reclaim`: CLAIM_PREVIOUS of a delegation of that type (granted
    /// back whenever delegations are on and the table has room).
    #[allow(clippy::too_many_arguments)] // the OPEN's facts, each used
    pub fn grant_delegation(
        &mut self,
        clientid: ClientId,
        fh: FileHandle,
        access: u32,
        want: DelegWant,
        session: Option<SessionId>,
        reclaim: Option<bool>,
        now_ms: u64,
    ) -> DelegGrant {
        use proto::nfs4 as p;
        let none = |why| DelegGrant::None(why);
        match want {
            DelegWant::NoDeleg => return none(p::WND4_NOT_WANTED),
            DelegWant::Cancel => return none(p::WND4_CANCELLED),
            _ => {}
        }
        if self.limits.delegations_max == 0 {
            // Delegations are switched off: the server supports none.
            return none(p::WND4_NOT_SUPP_FTYPE);
        }
        let cb_usable = session.is_some_and(|s| self.cb_path_flags(&s) & p::SEQ4_STATUS_CB_PATH_DOWN == 0);
        if !cb_usable || self.deleg_count() >= self.limits.delegations_max {
            return none(p::WND4_RESOURCE);
        }
        let write = match (reclaim, want) {
            (Some(w), _) => w,
            (None, DelegWant::Read) => false,
            (None, DelegWant::Write) => true,
            (None, _) => access & SHARE_WRITE != 0,
        };
        if reclaim.is_none() {
            self.forget_old_recalls(now_ms);
        }
        let f = self.files.get(&fh);
        if let Some(held) = f.and_then(|f| {
            f.delegs.iter().find(|k| self.states[*k].clientid == clientid).map(|k| &self.states[k])
        }) {
            let held_write = matches!(held.kind, Kind::Deleg { write: true, .. });
            return none(if write && !held_write { p::WND4_NOT_SUPP_UPGRADE } else { p::WND4_NOT_SUPP_DOWNGRADE });
        }
        if reclaim.is_none() {
            if self.recent_recalls.iter().any(|(h, _)| *h == fh) {
                return none(p::WND4_CONTENTION);
            }
            let Some(f) = f else { return none(p::WND4_CONTENTION) };
            let others_open = f.opens.iter().filter(|k| self.states[*k].clientid != clientid);
            let contended = if write {
                others_open.count() > 0 || !f.delegs.is_empty()
            } else {
                others_open.clone().any(|k| matches!(self.states[k].kind, Kind::Open { access, .. } if access & SHARE_WRITE != 0))
                    || f.delegs.iter().any(|k| matches!(self.states[k].kind, Kind::Deleg { write: true, .. }))
            };
            if contended {
                return none(p::WND4_CONTENTION);
            }
        }
        match self.new_state(clientid, fh, Kind::Deleg { write, recalled_ms: None }) {
            Ok(key) => {
                let sid = self.stateid_of(key);
                if write {
                    DelegGrant::Write(sid)
                } else {
                    DelegGrant::Read(sid)
                }
            }
            Err(_) => none(p::WND4_RESOURCE),
        }
    }

    fn forget_old_recalls(&mut self, now_ms: u64) {
        while self.recent_recalls.front().is_some_and(|(_, t)| now_ms.saturating_sub(*t) >= DELEG_REGRANT_HOLDOFF_MS) {
            self.recent_recalls.pop_front();
        }
    }

    /// An access to `fh` by `by` (None: a client without state, NFSv3 or
    /// the anonymous stateid): `write` for anything that changes the file
    /// or its names, otherwise a read (which only a write delegation
    /// conflicts with). Ok: nothing stands in the way. Err: delegations of
    /// other clients conflict — the caller answers "try later"
    /// (NFS4ERR_DELAY / NFS3ERR_JUKEBOX) and sends CB_RECALL for each
    /// returned (those already being recalled are not returned again).
    /// A delegation recalled a lease ago and not returned is revoked here.
    pub fn deleg_conflict(&mut self, fh: &FileHandle, by: Option<ClientId>, write: bool, now_ms: u64) -> Result<(), Vec<Recall>> {
        let Some(f) = self.files.get(fh) else { return Ok(()) };
        if f.delegs.is_empty() {
            return Ok(());
        }
        let lease = self.lease_ms();
        let mut overdue = Vec::new();
        let mut conflict = false;
        let mut recalls = Vec::new();
        for k in f.delegs.clone() {
            let rec = &self.states[&k];
            let Kind::Deleg { write: dw, recalled_ms } = rec.kind else { continue };
            if Some(rec.clientid) == by || (!write && !dw) {
                continue;
            }
            match recalled_ms {
                Some(t) if now_ms.saturating_sub(t) >= lease => overdue.push(k),
                Some(_) => conflict = true,
                None => {
                    conflict = true;
                    recalls.push(k);
                }
            }
        }
        for k in overdue {
            self.revoke(k);
        }
        for k in &recalls {
            if let Some(StateRec { kind: Kind::Deleg { recalled_ms, .. }, .. }) = self.states.get_mut(k) {
                *recalled_ms = Some(now_ms);
            }
            self.recalling.push(*k);
        }
        if !recalls.is_empty() {
            if self.recent_recalls.len() >= RECENT_RECALLS_MAX {
                self.recent_recalls.pop_front();
            }
            self.recent_recalls.push_back((*fh, now_ms));
        }
        if !conflict {
            return Ok(());
        }
        Err(recalls
            .into_iter()
            .map(|key| {
                let rec = &self.states[&key];
                Recall { clientid: rec.clientid, key, stateid: self.stateid_of(key), fh: rec.fh }
            })
            .collect())
    }

    /// Take a delegation away from its client (§10.4.6): its stateid
    /// answers NFS4ERR_DELEG_REVOKED and the client's SEQUENCE replies
    /// carry SEQ4_STATUS_RECALLABLE_STATE_REVOKED until it frees it.
    fn revoke(&mut self, key: u64) {
        let Some(rec) = self.states.get(&key) else { return };
        if !matches!(rec.kind, Kind::Deleg { .. }) {
            return;
        }
        let clientid = rec.clientid;
        eprintln!("nfs4: delegation {key} of client {clientid:#x} on file {:?} revoked (not returned within a lease of its recall)", rec.fh);
        self.drop_state(key);
        if let Some(c) = self.clients.get_mut(&clientid) {
            if c.revoked.len() >= REVOKED_PER_CLIENT_MAX {
                c.revoked.pop_front();
            }
            c.revoked.push_back(key);
        }
    }

    /// A CB_RECALL could not be delivered or was refused (no back channel,
    /// no reply within a lease, an error status): revoke the delegation
    /// now rather than keep the conflicting client waiting.
    pub fn recall_failed(&mut self, key: u64) {
        if matches!(self.states.get(&key), Some(StateRec { kind: Kind::Deleg { recalled_ms: Some(_), .. }, .. })) {
            self.revoke(key);
        }
    }

    /// Revoke every delegation recalled at least a lease ago (the reaper).
    pub(super) fn revoke_overdue(&mut self, now_ms: u64) -> usize {
        let lease = self.lease_ms();
        let overdue: Vec<u64> = self
            .recalling
            .iter()
            .copied()
            .filter(|k| {
                matches!(self.states.get(k), Some(StateRec { kind: Kind::Deleg { recalled_ms: Some(t), .. }, .. })
                    if now_ms.saturating_sub(*t) >= lease)
            })
            .collect();
        for k in &overdue {
            self.revoke(*k);
        }
        overdue.len()
    }

    /// DELEGRETURN (§18.6) of `sid` on `fh`.
    pub fn delegreturn(&mut self, clientid: ClientId, sid: &Stateid, fh: &FileHandle) -> StateResult<()> {
        let key = self.lookup(clientid, sid)?;
        let rec = &self.states[&key];
        if !matches!(rec.kind, Kind::Deleg { .. }) || rec.fh != *fh {
            return Err(StateError::BadStateid);
        }
        self.drop_state(key);
        Ok(())
    }

    /// An OPEN with CLAIM_DELEGATE_CUR / CLAIM_DELEG_CUR_FH (§18.16.3):
    /// `sid` must be the client's delegation on `fh`.
    pub fn check_deleg(&self, clientid: ClientId, sid: &Stateid, fh: &FileHandle) -> StateResult<()> {
        let key = self.lookup(clientid, sid)?;
        let rec = &self.states[&key];
        if !matches!(rec.kind, Kind::Deleg { .. }) || rec.fh != *fh {
            return Err(StateError::BadStateid);
        }
        Ok(())
    }

    /// The delegation (if any) `clientid` holds on `fh`: its stateid and whether it is a write delegation.
    pub fn deleg_of(&self, clientid: ClientId, fh: &FileHandle) -> Option<(Stateid, bool)> {
        let f = self.files.get(fh)?;
        let k = f.delegs.iter().find(|k| self.states[*k].clientid == clientid)?;
        Some((self.stateid_of(*k), matches!(self.states[k].kind, Kind::Deleg { write: true, .. })))
    }

    /// SEQ4_STATUS_RECALLABLE_STATE_REVOKED for a SEQUENCE of `clientid`.
    pub fn revoked_flags(&self, clientid: ClientId) -> u32 {
        match self.clients.get(&clientid) {
            Some(c) if !c.revoked.is_empty() => proto::nfs4::SEQ4_STATUS_RECALLABLE_STATE_REVOKED,
            _ => 0,
        }
    }

    /// When the table is three quarters full, ask every client holding
    /// delegations to keep at most half of its own (CB_RECALL_ANY,
    /// §20.6), at most once per half lease. Returns the calls to send.
    pub fn recall_any_due(&mut self, now_ms: u64) -> Vec<RecallAny> {
        let max = self.limits.delegations_max;
        if max == 0 || self.deleg_count() * 4 < max * 3 {
            return Vec::new();
        }
        if self.recall_any_ms.is_some_and(|t| now_ms.saturating_sub(t) < self.lease_ms() / 2) {
            return Vec::new();
        }
        self.recall_any_ms = Some(now_ms);
        let mut per: HashMap<ClientId, u32> = HashMap::new();
        for rec in self.states.values() {
            if matches!(rec.kind, Kind::Deleg { .. }) {
                *per.entry(rec.clientid).or_default() += 1;
            }
        }
        let mut v: Vec<RecallAny> = per.into_iter().map(|(clientid, n)| RecallAny { clientid, keep: n / 2 }).collect();
        v.sort_by_key(|r| r.clientid);
        v
    }
}
