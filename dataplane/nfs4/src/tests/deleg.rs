//! Delegations on the wire (RFC 8881 §10.2, §10.4, §18.6, §18.16.3,
//! §20.2, §20.6): OPEN grants read and write delegations per the want
//! flags, a conflicting OPEN / READ / WRITE / SETATTR / GETATTR / REMOVE /
//! RENAME / LINK from another client gets NFS4ERR_DELAY while CB_RECALL
//! goes out on the holder's back channel (decoded here from the record the
//! transport would send), DELEGRETURN lets it through, an unreturned or
//! undeliverable recall revokes the delegation (DELEG_REVOKED,
//! SEQ4_STATUS_RECALLABLE_STATE_REVOKED, FREE_STATEID), CB_RECALL_ANY when
//! the table runs short, the bound, the off switch, the delegation claims,
//! and hostile stateids.

use super::*;
use crate::callback::Callbacks;
use rpc::backchannel::{CallSender, ReplySink, SendError};
use std::sync::Mutex;

const LEASE_S: u32 = 10;

/// The transport, as far as callbacks go: records are kept for the test.
#[derive(Default)]
struct Capture {
    sent: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl CallSender for Capture {
    fn send(&self, conn_id: u64, record: Vec<u8>) -> Result<(), SendError> {
        self.sent.lock().unwrap().push((conn_id, record));
        Ok(())
    }
}

struct Srv {
    s: Server,
    cap: Arc<Capture>,
    cb: Arc<Callbacks>,
}

impl Drop for Srv {
    fn drop(&mut self) {
        self.cb.shutdown();
    }
}

fn srv_with(delegations_max: usize) -> Srv {
    let cfg = Config { grace_time_s: 0, lease_time_s: LEASE_S, delegations_max, ..Config::default() };
    let s = server_with(cfg, 64 << 20);
    let cap = Arc::new(Capture::default());
    let cb = s.prog.callbacks();
    cb.attach(cap.clone());
    Srv { s, cap, cb }
}

fn srv() -> Srv {
    srv_with(64)
}

/// One decoded CB_COMPOUND: its xid, CB_SEQUENCE and second operation.
struct Cb {
    xid: u32,
    session: [u8; 16],
    seqid: u32,
    slot: u32,
    op: CbArg,
}

#[derive(Debug, PartialEq)]
enum CbArg {
    Recall { stateid: p::stateid4, truncate: bool, fh: Vec<u8> },
    RecallAny { keep: u32, mask: Vec<u32> },
    /// CB_OFFLOAD (decoded by hand: not in the generated XDR).
    Offload { fh: Vec<u8>, stateid: p::stateid4, status: i32, count: u64 },
}

impl Srv {
    /// Callbacks sent since the last call, decoded.
    fn take_cbs(&self) -> Vec<Cb> {
        let sent = std::mem::take(&mut *self.cap.sent.lock().unwrap());
        sent.into_iter()
            .map(|(_, rec)| {
                let mut d = Decoder::new(&rec[4..]);
                let xid = d.u32().unwrap();
                assert_eq!(d.u32().unwrap(), 0, "a CALL");
                for _ in 0..4 {
                    d.u32().unwrap(); // rpcvers, program, version, procedure
                }
                for _ in 0..2 {
                    d.u32().unwrap();
                    d.opaque_var(400).unwrap(); // credential, verifier
                }
                d.opaque_var(64).unwrap(); // tag
                d.u32().unwrap(); // minorversion: the session's (v42::callbacks_use_the_minor_version_of_the_session)
                d.u32().unwrap(); // callback_ident
                assert_eq!(d.u32().unwrap(), 2, "CB_SEQUENCE + one operation");
                let p::nfs_cb_argop4::OP_CB_SEQUENCE(seq) = p::nfs_cb_argop4::decode(&mut d).unwrap() else { panic!("CB_SEQUENCE first") };
                if d.clone().u32().unwrap() == crate::callback::OP_CB_OFFLOAD as u32 {
                    d.u32().unwrap();
                    let fh = d.opaque_var(128).unwrap().to_vec();
                    let stateid = p::stateid4::decode(&mut d).unwrap();
                    let status = d.i32().unwrap();
                    assert_eq!(status, p::NFS4_OK);
                    assert_eq!(d.u32().unwrap(), 0, "no callback id in the write_response4");
                    let count = d.u64().unwrap();
                    assert_eq!(d.i32().unwrap(), p::stable_how4::FILE_SYNC4 as i32);
                    d.opaque_fixed::<8>().unwrap();
                    assert_eq!(d.remaining(), 0);
                    let op = CbArg::Offload { fh, stateid, status, count };
                    return Cb { xid, session: seq.csa_sessionid, seqid: seq.csa_sequenceid, slot: seq.csa_slotid, op };
                }
                let second = p::nfs_cb_argop4::decode(&mut d).unwrap();
                let op = match &second {
                    p::nfs_cb_argop4::OP_CB_RECALL(r) => {
                        CbArg::Recall { stateid: r.stateid.clone(), truncate: r.truncate, fh: r.fh.to_vec() }
                    }
                    p::nfs_cb_argop4::OP_CB_RECALL_ANY(r) => {
                        CbArg::RecallAny { keep: r.craa_objects_to_keep, mask: r.craa_type_mask.clone() }
                    }
                    other => panic!("unexpected callback {other:?}"),
                };
                Cb { xid, session: seq.csa_sessionid, seqid: seq.csa_sequenceid, slot: seq.csa_slotid, op }
            })
            .collect()
    }

    /// The client's answer to `cb`: CB_SEQUENCE OK, then `status` for the operation.
    fn answer(&self, cb: &Cb, status: i32) {
        let opnum = match cb.op {
            CbArg::Recall { .. } => p::OP_CB_RECALL,
            CbArg::RecallAny { .. } => p::OP_CB_RECALL_ANY,
            CbArg::Offload { .. } => crate::callback::OP_CB_OFFLOAD,
        };
        let mut b = vec![0u8; 512];
        let mut e = Encoder::new(&mut b);
        for w in [cb.xid, 1, 0, 0, 0, 0] {
            e.u32(w).unwrap();
        }
        e.i32(status).unwrap();
        e.opaque_var(b"").unwrap();
        e.u32(2).unwrap();
        e.u32(p::OP_CB_SEQUENCE as u32).unwrap();
        p::CB_SEQUENCE4res::NFS4_OK(p::CB_SEQUENCE4resok {
            csr_sessionid: cb.session,
            csr_sequenceid: cb.seqid,
            csr_slotid: cb.slot,
            csr_highest_slotid: 0,
            csr_target_highest_slotid: 0,
        })
        .encode(&mut e)
        .unwrap();
        e.u32(opnum as u32).unwrap();
        e.i32(status).unwrap();
        let n = e.position();
        let conn = rpc::ConnInfo { conn_id: 1, peer: "127.0.0.1:700".parse().unwrap(), core: 0 };
        self.cb.reply(&conn, cb.xid, &b[..n]);
    }
}

/// A client whose session has a usable back channel (AUTH_NONE callbacks).
fn client(s: &Srv, owner: &[u8]) -> Client {
    v42::connect_minor(&s.s, owner, 1)
}

/// What an OPEN answered: status, and when OK its stateid, handle and delegation.
struct Opened {
    status: i32,
    sid: p::stateid4,
    fh: Vec<u8>,
    deleg: Deleg,
}

#[derive(Debug, Clone, PartialEq)]
enum Deleg {
    None,
    NoneExt(i32),
    Read(p::stateid4),
    Write(p::stateid4),
}

fn open_claim(s: &Srv, c: &mut Client, owner: &[u8], fh: Option<&[u8]>, claim: p::open_claim4<'_>, share_access: u32, create: bool) -> Opened {
    let (mask, vals) = fattr_mode(0o644);
    let openhow = if create {
        p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 { attrmask: mask, attr_vals: &vals }))
    } else {
        p::openflag4::default(p::OPEN4_NOCREATE)
    };
    let args = p::OPEN4args { seqid: 0, share_access, share_deny: 0, owner: p::state_owner4 { clientid: 0, owner }, openhow, claim };
    let req = match fh {
        Some(fh) => c.seq_req(false).op(p::OP_PUTFH, &putfh(fh)),
        None => c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]),
    };
    let mut r = s.s.call(req.op(p::OP_OPEN, &args).raw(p::OP_GETFH as u32, &[]));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    let st = r.next(if fh.is_some() { p::OP_PUTFH } else { p::OP_PUTROOTFH });
    assert_eq!(st, p::NFS4_OK);
    let st = r.next(p::OP_OPEN);
    if st != p::NFS4_OK {
        return Opened { status: st, sid: stateid0(), fh: vec![], deleg: Deleg::None };
    }
    let mut d = r.body();
    let o = p::OPEN4resok::decode(&mut d).unwrap();
    let deleg = match &o.delegation {
        p::open_delegation4::OPEN_DELEGATE_NONE => Deleg::None,
        p::open_delegation4::OPEN_DELEGATE_READ(r) => {
            assert!(!r.recall);
            Deleg::Read(r.stateid.clone())
        }
        p::open_delegation4::OPEN_DELEGATE_WRITE(w) => {
            assert_eq!(w.space_limit, p::nfs_space_limit4::NFS_LIMIT_SIZE(u64::MAX));
            Deleg::Write(w.stateid.clone())
        }
        p::open_delegation4::OPEN_DELEGATE_NONE_EXT(n) => Deleg::NoneExt(match n {
            p::open_none_delegation4::WND4_CONTENTION(push) | p::open_none_delegation4::WND4_RESOURCE(push) => {
                assert!(!push, "we never push a delegation later");
                if matches!(n, p::open_none_delegation4::WND4_CONTENTION(_)) {
                    p::WND4_CONTENTION
                } else {
                    p::WND4_RESOURCE
                }
            }
            p::open_none_delegation4::default(w) => *w,
        }),
    };
    let sid = o.stateid.clone();
    let pos = d.position();
    let mut rest = Decoder::new(&r.body_bytes()[pos..]);
    assert_eq!(rest.i32().unwrap(), p::OP_GETFH);
    assert_eq!(rest.i32().unwrap(), p::NFS4_OK);
    let fh = rest.opaque_var(128).unwrap().to_vec();
    Opened { status: st, sid, fh, deleg }
}

fn open_name(s: &Srv, c: &mut Client, owner: &[u8], name: &[u8], share_access: u32) -> Opened {
    open_claim(s, c, owner, None, p::open_claim4::CLAIM_NULL(name), share_access, true)
}

fn delegreturn(s: &Srv, c: &mut Client, fh: &[u8], sid: &p::stateid4) -> i32 {
    on_fh(&s.s, c, fh, p::OP_DELEGRETURN, &p::DELEGRETURN4args { deleg_stateid: sid.clone() }).0
}

fn seq_flags(s: &Srv, c: &mut Client) -> u32 {
    let mut r = s.s.call(c.seq_req(false));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE).sr_status_flags
}

fn test_stateid(s: &Srv, c: &mut Client, sid: &p::stateid4) -> i32 {
    let mut r = s.s.call(c.seq_req(false).op(p::OP_TEST_STATEID, &p::TEST_STATEID4args { ts_stateids: vec![sid.clone()] }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    let st = r.next(p::OP_TEST_STATEID);
    assert_eq!(st, p::NFS4_OK);
    let mut d = r.body();
    assert_eq!(d.u32().unwrap(), 1);
    d.i32().unwrap()
}

fn free_stateid(s: &Srv, c: &mut Client, sid: &p::stateid4) -> i32 {
    let mut r = s.s.call(c.seq_req(false).op(p::OP_FREE_STATEID, &p::FREE_STATEID4args { fsa_stateid: sid.clone() }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.next(p::OP_FREE_STATEID)
}

fn recall_of(cbs: &[Cb]) -> (p::stateid4, Vec<u8>) {
    assert_eq!(cbs.len(), 1, "one CB_RECALL");
    match &cbs[0].op {
        CbArg::Recall { stateid, truncate, fh } => {
            assert!(!truncate);
            (stateid.clone(), fh.clone())
        }
        other => panic!("expected CB_RECALL, got {other:?}"),
    }
}

/// `holder` opens "f" for reading (a read delegation), `writer` opens it
/// for writing: DELAY, and the one CB_RECALL that went out.
fn recalled_read_delegation(s: &Srv, holder: &mut Client, writer: &mut Client) -> (Opened, p::stateid4, Cb) {
    let oa = open_name(s, holder, b"oa", b"f", READ);
    let Deleg::Read(rd) = oa.deleg.clone() else { panic!("read delegation expected, got {:?}", oa.deleg) };
    assert_eq!(open_name(s, writer, b"ob", b"f", BOTH).status, p::NFS4ERR_DELAY);
    let mut cbs = s.take_cbs();
    recall_of(&cbs);
    (oa, rd, cbs.remove(0))
}

const READ: u32 = p::OPEN4_SHARE_ACCESS_READ;
const BOTH: u32 = p::OPEN4_SHARE_ACCESS_BOTH;

#[test]
fn read_delegation_recalled_by_another_clients_write_open_rfc8881_10_4() {
    let s = srv();
    let mut a = client(&s, b"holder");
    let mut b = client(&s, b"writer");
    let oa = open_name(&s, &mut a, b"oa", b"f", BOTH);
    // A write open by the only client: a write delegation.
    let Deleg::Write(wd) = oa.deleg.clone() else { panic!("write delegation expected, got {:?}", oa.deleg) };
    assert_eq!(delegreturn(&s, &mut a, &oa.fh, &wd), p::NFS4_OK);
    assert_eq!(delegreturn(&s, &mut a, &oa.fh, &wd), p::NFS4ERR_BAD_STATEID, "returned already");
    assert_eq!(close_via(&s.s, &mut a, &oa.fh, &oa.sid), p::NFS4_OK);
    // Returned unasked: a read open gets a read delegation at once (no one
    // else has the file open).
    let ra = open_name(&s, &mut a, b"oa2", b"f", READ);
    let Deleg::Read(rd) = ra.deleg.clone() else { panic!("read delegation expected, got {:?}", ra.deleg) };
    // Another client's read open shares it (and gets a read delegation too).
    let rb = open_name(&s, &mut b, b"ob-r", b"f", READ);
    assert_eq!(rb.status, p::NFS4_OK);
    let Deleg::Read(rbd) = rb.deleg.clone() else { panic!("second read delegation expected, got {:?}", rb.deleg) };
    assert_eq!(delegreturn(&s, &mut b, &rb.fh, &rbd), p::NFS4_OK);
    assert!(s.take_cbs().is_empty(), "nothing recalled yet");
    // B opens for writing: DELAY, and A's delegation is recalled.
    let w = open_name(&s, &mut b, b"ob", b"f", BOTH);
    assert_eq!(w.status, p::NFS4ERR_DELAY);
    let cbs = s.take_cbs();
    let (sid, fh) = recall_of(&cbs);
    assert_eq!((sid.other, fh.clone()), (rd.other, ra.fh.clone()), "CB_RECALL names A's delegation and the file");
    // Retried before A returns it: DELAY again, no second recall.
    assert_eq!(open_name(&s, &mut b, b"ob", b"f", BOTH).status, p::NFS4ERR_DELAY);
    assert!(s.take_cbs().is_empty(), "one recall per delegation");
    s.answer(&cbs[0], p::NFS4_OK);
    // A keeps using it until it returns it: I/O under the delegation stateid.
    assert_eq!(read_via(&s.s, &mut a, &ra.fh, &rd, 10), Ok(vec![]));
    assert_eq!(write_via(&s.s, &mut a, &ra.fh, &rd, 0, b"x"), p::NFS4ERR_OPENMODE, "a read delegation does not write");
    assert_eq!(delegreturn(&s, &mut a, &ra.fh, &rd), p::NFS4_OK);
    let w = open_name(&s, &mut b, b"ob", b"f", BOTH);
    assert_eq!(w.status, p::NFS4_OK, "the open goes through once the delegation is back");
    assert_eq!(w.deleg, Deleg::None, "A still has it open for reading: no write delegation");
    assert_eq!(write_via(&s.s, &mut b, &w.fh, &w.sid, 0, b"new"), p::NFS4_OK);
    s.s.prog.state().assert_invariants();
}

#[test]
fn write_delegation_conflicts_with_every_access_of_another_client() {
    let s = srv();
    let mut a = client(&s, b"holder");
    let mut b = client(&s, b"other");
    let oa = open_name(&s, &mut a, b"oa", b"w", BOTH);
    let Deleg::Write(wd) = oa.deleg.clone() else { panic!("write delegation expected") };
    assert_eq!(write_via(&s.s, &mut a, &oa.fh, &wd, 0, b"cached"), p::NFS4_OK, "I/O under the write delegation");
    assert_eq!(getattr_via(&s.s, &mut a, &oa.fh), p::NFS4_OK, "the holder's own GETATTR");
    // Another client: GETATTR (it could see a stale size), READ with the
    // anonymous stateid, SETATTR, REMOVE, RENAME, LINK — each DELAY.
    assert_eq!(getattr_via(&s.s, &mut b, &oa.fh), p::NFS4ERR_DELAY);
    let (_, fh) = recall_of(&s.take_cbs());
    assert_eq!(fh, oa.fh);
    assert_eq!(read_via(&s.s, &mut b, &oa.fh, &stateid0(), 10), Err(p::NFS4ERR_DELAY));
    let sa = p::SETATTR4args { stateid: stateid0(), obj_attributes: p::fattr4 { attrmask: fattr_mode(0o600).0, attr_vals: &fattr_mode(0o600).1 } };
    assert_eq!(on_fh(&s.s, &mut b, &oa.fh, p::OP_SETATTR, &sa).0, p::NFS4ERR_DELAY);
    assert_eq!(remove_via(&s.s, &mut b, b"w"), p::NFS4ERR_DELAY);
    let mut r = s.s.call(
        b.seq_req(false)
            .raw(p::OP_PUTROOTFH as u32, &[])
            .raw(p::OP_SAVEFH as u32, &[])
            .op(p::OP_RENAME, &p::RENAME4args { oldname: b"w", newname: b"w2" }),
    );
    assert_eq!(r.status, p::NFS4ERR_DELAY, "RENAME");
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    let mut r = s.s.call(
        b.seq_req(false)
            .op(p::OP_PUTFH, &putfh(&oa.fh))
            .raw(p::OP_SAVEFH as u32, &[])
            .raw(p::OP_PUTROOTFH as u32, &[])
            .op(p::OP_LINK, &p::LINK4args { newname: b"w-link" }),
    );
    assert_eq!(r.status, p::NFS4ERR_DELAY, "LINK");
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert!(s.take_cbs().is_empty(), "all of them wait for the one recall");
    // NFSv3 (no client ID) goes through the same gate.
    let d = s.s.prog.delegations();
    let raw = vfs::FileHandle::from_bytes(&oa.fh).unwrap();
    assert!(vfs::DelegationBreaker::must_wait(&*d, &raw, false), "an NFSv3 READ waits for a write delegation");
    assert_eq!(delegreturn(&s, &mut a, &oa.fh, &wd), p::NFS4_OK);
    assert!(!vfs::DelegationBreaker::active(&*d));
    assert!(!vfs::DelegationBreaker::must_wait(&*d, &raw, true));
    assert_eq!(getattr_via(&s.s, &mut b, &oa.fh), p::NFS4_OK);
    assert_eq!(read_via(&s.s, &mut b, &oa.fh, &stateid0(), 10), Ok(b"cached".to_vec()), "the holder's writes are there");
    assert_eq!(remove_via(&s.s, &mut b, b"w"), p::NFS4_OK);
    s.s.prog.state().assert_invariants();
}

#[test]
fn an_unreturned_delegation_is_revoked_after_a_lease_rfc8881_10_4_6() {
    let s = srv();
    let mut a = client(&s, b"silent");
    let mut b = client(&s, b"waiting");
    let (oa, rd, cb) = recalled_read_delegation(&s, &mut a, &mut b);
    s.answer(&cb, p::NFS4_OK); // accepted, but A never returns it
    s.s.prog.advance_clock_ms(u64::from(LEASE_S) * 1000 / 2);
    assert_eq!(seq_flags(&s, &mut a) & p::SEQ4_STATUS_RECALLABLE_STATE_REVOKED, 0);
    assert_eq!(open_name(&s, &mut b, b"ob", b"f", BOTH).status, p::NFS4ERR_DELAY, "half a lease: still waiting");
    s.s.prog.advance_clock_ms(u64::from(LEASE_S) * 1000 / 2);
    seq_flags(&s, &mut b); // B renews its lease, so the reaper keeps it
    assert_eq!(s.s.prog.reap_now(), 0, "no client expired");
    assert_eq!(seq_flags(&s, &mut a) & p::SEQ4_STATUS_RECALLABLE_STATE_REVOKED, p::SEQ4_STATUS_RECALLABLE_STATE_REVOKED);
    assert_eq!(open_name(&s, &mut b, b"ob", b"f", BOTH).status, p::NFS4_OK, "revoked: the open goes through");
    assert_eq!(test_stateid(&s, &mut a, &rd), p::NFS4ERR_DELEG_REVOKED);
    assert_eq!(read_via(&s.s, &mut a, &oa.fh, &rd, 1), Err(p::NFS4ERR_DELEG_REVOKED));
    assert_eq!(delegreturn(&s, &mut a, &oa.fh, &rd), p::NFS4ERR_DELEG_REVOKED);
    assert_eq!(free_stateid(&s, &mut a, &rd), p::NFS4_OK);
    assert_eq!(seq_flags(&s, &mut a) & p::SEQ4_STATUS_RECALLABLE_STATE_REVOKED, 0, "freed: the flag clears");
    assert_eq!(test_stateid(&s, &mut a, &rd), p::NFS4ERR_BAD_STATEID);
    s.s.prog.state().assert_invariants();
}

#[test]
fn a_refused_recall_revokes_at_once() {
    let s = srv();
    let mut a = client(&s, b"confused");
    let mut b = client(&s, b"waiting");
    let (_, _, cb) = recalled_read_delegation(&s, &mut a, &mut b);
    s.answer(&cb, p::NFS4ERR_BADHANDLE);
    assert_eq!(open_name(&s, &mut b, b"ob", b"f", BOTH).status, p::NFS4_OK, "no lease-long wait");
    assert_ne!(seq_flags(&s, &mut a) & p::SEQ4_STATUS_RECALLABLE_STATE_REVOKED, 0);
}

#[test]
fn want_flags_rfc8881_18_16_3() {
    let s = srv();
    let mut a = client(&s, b"wants");
    let mut b = client(&s, b"other");
    let o = open_name(&s, &mut a, b"o", b"n", BOTH | p::OPEN4_SHARE_ACCESS_WANT_NO_DELEG);
    assert_eq!(o.deleg, Deleg::NoneExt(p::WND4_NOT_WANTED));
    let o = open_name(&s, &mut a, b"o", b"c", BOTH | p::OPEN4_SHARE_ACCESS_WANT_CANCEL);
    assert_eq!(o.deleg, Deleg::NoneExt(p::WND4_CANCELLED));
    let o = open_name(&s, &mut a, b"o", b"r", BOTH | p::OPEN4_SHARE_ACCESS_WANT_READ_DELEG);
    assert!(matches!(o.deleg, Deleg::Read(_)), "a read delegation asked for on a write open: {:?}", o.deleg);
    let o = open_name(&s, &mut a, b"o", b"r", BOTH | p::OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG);
    assert_eq!(o.deleg, Deleg::NoneExt(p::WND4_NOT_SUPP_UPGRADE), "holds a read delegation already");
    let o = open_name(&s, &mut a, b"o", b"any", READ | p::OPEN4_SHARE_ACCESS_WANT_ANY_DELEG);
    assert!(matches!(o.deleg, Deleg::Read(_)), "any, on a read open: read");
    // B has "busy" open for reading: A's wish for a write delegation meets contention.
    let ob = open_name(&s, &mut b, b"ob", b"busy", READ | p::OPEN4_SHARE_ACCESS_WANT_NO_DELEG);
    assert_eq!(ob.status, p::NFS4_OK);
    let o = open_name(&s, &mut a, b"o", b"busy", BOTH | p::OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG);
    assert_eq!(o.deleg, Deleg::NoneExt(p::WND4_CONTENTION));
    // Undefined want values are INVAL.
    assert_eq!(open_name(&s, &mut a, b"o", b"x", READ | 0x0600).status, p::NFS4ERR_INVAL);
    assert_eq!(open_name(&s, &mut a, b"o", b"x", READ | 0xff00).status, p::NFS4ERR_INVAL);
    // A client without a usable back channel gets none.
    let mut n = session_only(&s.s, b"no-callbacks", 1);
    assert_eq!(reclaim_complete(&s.s, &mut n), p::NFS4_OK);
    let o = open_name(&s, &mut n, b"o", b"nocb", READ);
    assert_eq!(o.deleg, Deleg::None);
    let o = open_name(&s, &mut n, b"o", b"nocb2", READ | p::OPEN4_SHARE_ACCESS_WANT_READ_DELEG);
    assert_eq!(o.deleg, Deleg::NoneExt(p::WND4_RESOURCE));
    // Switched off (delegations_max 0): none, and a want says the server supports none.
    let off = srv_with(0);
    let mut c = client(&off, b"off");
    assert_eq!(open_name(&off, &mut c, b"o", b"f", BOTH).deleg, Deleg::None);
    let o = open_name(&off, &mut c, b"o", b"g", BOTH | p::OPEN4_SHARE_ACCESS_WANT_ANY_DELEG);
    assert_eq!(o.deleg, Deleg::NoneExt(p::WND4_NOT_SUPP_FTYPE));
    assert!(off.take_cbs().is_empty());
}

#[test]
fn the_bound_holds_and_recall_any_goes_out_at_three_quarters_rfc8881_20_6() {
    let s = srv_with(4);
    let mut a = client(&s, b"hoarder");
    for (i, name) in [b"f0", b"f1", b"f2", b"f3"].iter().enumerate() {
        let o = open_name(&s, &mut a, b"o", *name, READ);
        assert!(matches!(o.deleg, Deleg::Read(_)), "delegation {i}");
        let cbs = s.take_cbs();
        if i == 2 {
            // 3 of 4 held: keep at most half.
            assert_eq!(cbs.len(), 1, "CB_RECALL_ANY at three quarters");
            assert_eq!(cbs[0].op, CbArg::RecallAny { keep: 1, mask: vec![1 << p::RCA4_TYPE_MASK_RDATA_DLG | 1 << p::RCA4_TYPE_MASK_WDATA_DLG] });
            s.answer(&cbs[0], p::NFS4_OK);
        } else {
            assert!(cbs.is_empty(), "at most one CB_RECALL_ANY per half lease (grant {i})");
        }
    }
    let o = open_name(&s, &mut a, b"o", b"f4", READ | p::OPEN4_SHARE_ACCESS_WANT_READ_DELEG);
    assert_eq!(o.status, p::NFS4_OK, "the open itself succeeds");
    assert_eq!(o.deleg, Deleg::NoneExt(p::WND4_RESOURCE), "at the bound: no delegation");
    assert_eq!(s.s.prog.delegations().held(), 4);
    s.s.prog.state().assert_invariants();
}

#[test]
fn opens_under_a_delegation_and_hostile_stateids() {
    let s = srv();
    let mut a = client(&s, b"claims");
    let mut b = client(&s, b"thief");
    let o = open_name(&s, &mut a, b"o", b"f", READ);
    let Deleg::Read(d) = o.deleg.clone() else { panic!("read delegation expected") };
    // CLAIM_DELEG_CUR_FH and CLAIM_DELEGATE_CUR: opens the client makes
    // under its delegation (when returning it).
    let c = open_claim(&s, &mut a, b"o2", Some(&o.fh), p::open_claim4::CLAIM_DELEG_CUR_FH(d.clone()), READ, false);
    assert_eq!(c.status, p::NFS4_OK);
    let cur = p::open_claim_delegate_cur4 { delegate_stateid: d.clone(), file: b"f" };
    let c = open_claim(&s, &mut a, b"o3", None, p::open_claim4::CLAIM_DELEGATE_CUR(cur), READ, false);
    assert_eq!(c.status, p::NFS4_OK);
    // Hostile: another client's delegation stateid, an open stateid, a
    // delegation named on the wrong file, FREE_STATEID of a live one.
    let c = open_claim(&s, &mut b, b"x", Some(&o.fh), p::open_claim4::CLAIM_DELEG_CUR_FH(d.clone()), READ, false);
    assert_eq!(c.status, p::NFS4ERR_BAD_STATEID);
    let c = open_claim(&s, &mut a, b"x", Some(&o.fh), p::open_claim4::CLAIM_DELEG_CUR_FH(o.sid.clone()), READ, false);
    assert_eq!(c.status, p::NFS4ERR_BAD_STATEID);
    assert_eq!(delegreturn(&s, &mut b, &o.fh, &d), p::NFS4ERR_BAD_STATEID);
    assert_eq!(delegreturn(&s, &mut a, &o.fh, &o.sid), p::NFS4ERR_BAD_STATEID, "an open stateid is no delegation");
    let other = open_name(&s, &mut a, b"o", b"g", READ | p::OPEN4_SHARE_ACCESS_WANT_NO_DELEG);
    assert_eq!(delegreturn(&s, &mut a, &other.fh, &d), p::NFS4ERR_BAD_STATEID, "delegation of another file");
    assert_eq!(free_stateid(&s, &mut a, &d), p::NFS4ERR_LOCKS_HELD);
    let prev = open_claim(&s, &mut a, b"x", Some(&o.fh), p::open_claim4::CLAIM_DELEG_PREV_FH, READ, false);
    assert_eq!(prev.status, p::NFS4ERR_NOTSUPP);
    assert_eq!(delegreturn(&s, &mut a, &o.fh, &d), p::NFS4_OK);
    s.s.prog.state().assert_invariants();
}

// ---- asynchronous COPY and CB_OFFLOAD (RFC 7862 §15.2, §15.8, §15.9, §16.1) ----

fn offload_op(s: &Srv, c: &mut Client, fh: &[u8], opnum: i32, sid: &p::stateid4) -> (i32, Vec<u8>) {
    let (st, r) = v42::on_fh42(&s.s, c, fh, opnum as u32, &v42::xdr(sid));
    (st, r.body_bytes().to_vec())
}

#[test]
fn an_asynchronous_copy_reports_with_cb_offload_rfc7862_15_2() {
    const MIB: usize = 1 << 20;
    let s = srv();
    let mut c = v42::connect_minor(&s.s, b"copier", 2);
    let (ssid, src) = v42::open42(&s.s, &mut c, b"src", BOTH);
    let data: Vec<u8> = (0..20 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    for (i, chunk) in data.chunks(MIB).enumerate() {
        v42::write42(&s.s, &mut c, &src, &ssid, (i * MIB) as u64, chunk);
    }
    let (dsid, dst) = v42::open42(&s.s, &mut c, b"dst", BOTH);
    // Asked synchronously: one COPY_BYTES_MAX chunk, answered short.
    let mut a = v42::copy_args(&ssid, &dsid, 0, 0, 0);
    let ok = v42::copy42_res(&s.s, &mut c, &src, &dst, &a).unwrap();
    assert!(ok.cr_requirements.cr_synchronous && ok.cr_response.wr_callback_id.is_empty());
    assert_eq!(ok.cr_response.wr_count, crate::ops::COPY_BYTES_MAX);
    // Asynchronous allowed: a copy stateid at once, the rest on a worker.
    a.ca_synchronous = false;
    let ok = v42::copy42_res(&s.s, &mut c, &src, &dst, &a).unwrap();
    assert!(!ok.cr_requirements.cr_synchronous, "ran asynchronously");
    assert_eq!(ok.cr_response.wr_callback_id.len(), 1, "with a copy stateid");
    assert_eq!(ok.cr_response.wr_count, 0);
    let copy_sid = ok.cr_response.wr_callback_id[0].clone();
    // CB_OFFLOAD arrives with the whole count.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let cb = loop {
        let mut cbs = s.take_cbs();
        if let Some(cb) = cbs.pop() {
            break cb;
        }
        assert!(std::time::Instant::now() < deadline, "no CB_OFFLOAD within 10 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(cb.op, CbArg::Offload { fh: dst.clone(), stateid: copy_sid.clone(), status: p::NFS4_OK, count: data.len() as u64 });
    s.answer(&cb, p::NFS4_OK);
    assert_eq!(s.s.prog.offloads.running(), 0);
    let raw_dst = vfs::FileHandle::from_bytes(&dst).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(s.s.fs.read(&raw_dst, 0, &mut back).unwrap().0, data.len());
    assert!(back == data, "the destination holds the source's bytes");
    // OFFLOAD_STATUS: done, everything copied; OFFLOAD_CANCEL of a finished copy is harmless.
    let (st, body) = offload_op(&s, &mut c, &dst, p::OP_OFFLOAD_STATUS, &copy_sid);
    assert_eq!(st, p::NFS4_OK);
    let mut d = Decoder::new(&body);
    assert_eq!(d.u64().unwrap(), data.len() as u64);
    assert_eq!((d.u32().unwrap(), d.i32().unwrap()), (1, p::NFS4_OK), "osr_complete holds the final status");
    assert_eq!(offload_op(&s, &mut c, &dst, p::OP_OFFLOAD_CANCEL, &copy_sid).0, p::NFS4_OK);
    // Hostile: another file, another client, a made-up or an open stateid.
    assert_eq!(offload_op(&s, &mut c, &src, p::OP_OFFLOAD_STATUS, &copy_sid).0, p::NFS4ERR_BAD_STATEID);
    let mut other = v42::connect_minor(&s.s, b"other", 2);
    assert_eq!(offload_op(&s, &mut other, &dst, p::OP_OFFLOAD_STATUS, &copy_sid).0, p::NFS4ERR_BAD_STATEID);
    assert_eq!(offload_op(&s, &mut other, &dst, p::OP_OFFLOAD_CANCEL, &copy_sid).0, p::NFS4ERR_BAD_STATEID);
    let forged = p::stateid4 { seqid: 1, other: [0xff; 12] };
    assert_eq!(offload_op(&s, &mut c, &dst, p::OP_OFFLOAD_STATUS, &forged).0, p::NFS4ERR_BAD_STATEID);
    assert_eq!(offload_op(&s, &mut c, &dst, p::OP_OFFLOAD_STATUS, &dsid).0, p::NFS4ERR_BAD_STATEID);
    // Truncated arguments are BADXDR, not a crash.
    let (st, _) = v42::on_fh42(&s.s, &mut c, &dst, p::OP_OFFLOAD_STATUS as u32, &[0; 7]);
    assert_eq!(st, p::NFS4ERR_BADXDR);
}
