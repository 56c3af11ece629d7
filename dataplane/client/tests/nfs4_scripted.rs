//! NFSv4.1 against a scripted server: it checks every SEQUENCE against its
//! own slot table (NFS4ERR_SEQ_MISORDERED on a wrong sequence id), grants
//! 4 slots, answers WRITE UNSTABLE, and "restarts" (new write verifier,
//! unstable data lost) on a LOOKUP of "restart". On a LOOKUP of
//! "callbacks" it first calls back on the connection (a back channel is
//! granted when asked): garbage, CB_NULL, a wrong program and RPC version,
//! a wrong session, an operation the client does not implement, a garbage
//! CB_COMPOUND, then a CB_LAYOUTRECALL; it keeps the client's replies.

use client::nfs4::Nfs41;
use client::{Auth, Error, Limits};
use proto::nfs4 as p;
use proto::xdr::{Decoder, Xdr};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

const SLOTS: u32 = 4;
const SESSION: [u8; 16] = [5; 16];

#[derive(Default)]
struct State {
    data: BTreeMap<u64, Vec<u8>>,
    seq_errors: u32,
    max_slot_seen: u32,
    /// The client's replies to our calls, in order.
    replies: Vec<Vec<u8>>,
    /// Answer minor version 2 with NFS4ERR_MINOR_VERS_MISMATCH (a 4.1
    /// server); the minor versions seen.
    refuse_42: bool,
    minors: Vec<u32>,
}

const CB_PROG: u32 = 0x4000_0000;

/// A call record of ours to the client: xid, CALL, rpcvers, prog, vers,
/// proc, AUTH_NONE credential and verifier, then `args`.
fn cb_call(xid: u32, rpcvers: u32, prog: u32, proc_num: u32, args: &[u8]) -> Vec<u8> {
    let mut m: Vec<u8> = [xid, 0, rpcvers, prog, 1, proc_num, 0, 0, 0, 0].iter().flat_map(|w| w.to_be_bytes()).collect();
    m.extend_from_slice(args);
    let mut rec = (0x8000_0000u32 | m.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(&m);
    rec
}

fn cb_compound(session: [u8; 16], second: Option<p::nfs_cb_argop4<'_>>) -> Vec<u8> {
    let mut argarray = vec![p::nfs_cb_argop4::OP_CB_SEQUENCE(p::CB_SEQUENCE4args {
        csa_sessionid: session,
        csa_sequenceid: 1,
        csa_slotid: 0,
        csa_highest_slotid: 0,
        csa_cachethis: false,
        csa_referring_call_lists: vec![],
    })];
    argarray.extend(second);
    proto::xdr::to_vec(&p::CB_COMPOUND4args { tag: b"t", minorversion: 1, callback_ident: 0, argarray }).unwrap()
}

/// The calls the server makes on a LOOKUP of "callbacks" (xids 0x100..).
fn callbacks() -> Vec<u8> {
    let sid = p::stateid4 { seqid: 2, other: [8; 12] };
    let recall = p::nfs_cb_argop4::OP_CB_LAYOUTRECALL(p::CB_LAYOUTRECALL4args {
        clora_type: p::layouttype4::LAYOUT4_FLEX_FILES,
        clora_iomode: p::layoutiomode4::LAYOUTIOMODE4_RW,
        clora_changed: true,
        clora_recall: p::layoutrecall4::LAYOUTRECALL4_FILE(p::layoutrecall_file4 { lor_fh: b"fh", lor_offset: 0, lor_length: u64::MAX, lor_stateid: sid.clone() }),
    });
    let deleg = p::nfs_cb_argop4::OP_CB_RECALL(p::CB_RECALL4args { stateid: sid, truncate: false, fh: b"fh" });
    let mut out = Vec::new();
    // Garbage: a CALL cut short inside its header.
    out.extend_from_slice(&[0x80, 0, 0, 12, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    out.extend(cb_call(0x101, 2, CB_PROG, 0, &[])); // CB_NULL
    out.extend(cb_call(0x102, 2, 99, 1, &[])); // not its program
    out.extend(cb_call(0x103, 3, CB_PROG, 1, &[])); // RPC version 3
    out.extend(cb_call(0x104, 2, CB_PROG, 1, &cb_compound([9; 16], None))); // another session
    out.extend(cb_call(0x105, 2, CB_PROG, 1, &cb_compound(SESSION, Some(deleg)))); // CB_RECALL: not implemented
    out.extend(cb_call(0x106, 2, CB_PROG, 1, &[0, 0, 0, 200, 1, 2])); // garbage CB_COMPOUND
    out.extend(cb_call(0x107, 2, CB_PROG, 1, &cb_compound(SESSION, Some(recall))));
    out
}

fn serve(mut s: TcpStream, st: Arc<Mutex<State>>) {
    let mut verf = [1u8; 8];
    let mut slots = [0u32; SLOTS as usize]; // last sequence id seen per slot
    loop {
        let mut m = [0u8; 4];
        if s.read_exact(&mut m).is_err() {
            return;
        }
        let mut call = vec![0u8; (u32::from_be_bytes(m) & 0x7fff_ffff) as usize];
        s.read_exact(&mut call).unwrap();
        if call.len() >= 8 && call[4..8] == [0, 0, 0, 1] {
            // A REPLY to one of our calls.
            st.lock().unwrap().replies.push(call);
            continue;
        }
        let mut d = Decoder::new(&call);
        let xid = d.u32().unwrap();
        d.skip(20).unwrap();
        for _ in 0..2 {
            d.u32().unwrap();
            d.opaque_var(400).unwrap();
        }
        let args = p::COMPOUND4args::decode(&mut d).unwrap();
        let mut res: Vec<p::nfs_resop4> = Vec::new();
        let mut status = p::nfsstat4::NFS4_OK;
        let refuse = {
            let mut g = st.lock().unwrap();
            g.minors.push(args.minorversion);
            g.refuse_42 && args.minorversion == 2
        };
        if refuse {
            status = p::nfsstat4::NFS4ERR_MINOR_VERS_MISMATCH;
        }
        let four = 90u32.to_be_bytes();
        for op in if refuse { &[][..] } else { &args.argarray[..] } {
            let r = match op {
                p::nfs_argop4::OP_EXCHANGE_ID(_) => p::nfs_resop4::OP_EXCHANGE_ID(p::EXCHANGE_ID4res::NFS4_OK(p::EXCHANGE_ID4resok {
                    eir_clientid: 77,
                    eir_sequenceid: 1,
                    eir_flags: 0,
                    eir_state_protect: p::state_protect4_r::SP4_NONE,
                    eir_server_owner: p::server_owner4 { so_minor_id: 0, so_major_id: b"s" },
                    eir_server_scope: b"s",
                    eir_server_impl_id: vec![],
                })),
                p::nfs_argop4::OP_CREATE_SESSION(a) => {
                    let mut fore = a.csa_fore_chan_attrs.clone();
                    fore.ca_maxrequests = SLOTS;
                    p::nfs_resop4::OP_CREATE_SESSION(p::CREATE_SESSION4res::NFS4_OK(p::CREATE_SESSION4resok {
                        csr_sessionid: SESSION,
                        csr_sequence: 1,
                        csr_flags: a.csa_flags & p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
                        csr_fore_chan_attrs: fore,
                        csr_back_chan_attrs: a.csa_back_chan_attrs.clone(),
                    }))
                }
                p::nfs_argop4::OP_SEQUENCE(a) => {
                    let i = a.sa_slotid as usize;
                    let mut g = st.lock().unwrap();
                    g.max_slot_seen = g.max_slot_seen.max(a.sa_slotid);
                    if i >= slots.len() || a.sa_sessionid != SESSION {
                        p::nfs_resop4::OP_SEQUENCE(p::SEQUENCE4res::default(p::NFS4ERR_BADSLOT))
                    } else if a.sa_sequenceid != slots[i].wrapping_add(1) {
                        g.seq_errors += 1;
                        p::nfs_resop4::OP_SEQUENCE(p::SEQUENCE4res::default(p::NFS4ERR_SEQ_MISORDERED))
                    } else {
                        slots[i] = a.sa_sequenceid;
                        p::nfs_resop4::OP_SEQUENCE(p::SEQUENCE4res::NFS4_OK(p::SEQUENCE4resok {
                            sr_sessionid: SESSION,
                            sr_sequenceid: a.sa_sequenceid,
                            sr_slotid: a.sa_slotid,
                            sr_highest_slotid: SLOTS - 1,
                            sr_target_highest_slotid: SLOTS - 1,
                            sr_status_flags: 0,
                        }))
                    }
                }
                p::nfs_argop4::OP_RECLAIM_COMPLETE(_) => {
                    p::nfs_resop4::OP_RECLAIM_COMPLETE(p::RECLAIM_COMPLETE4res { rcr_status: p::nfsstat4::NFS4_OK })
                }
                p::nfs_argop4::OP_PUTROOTFH => p::nfs_resop4::OP_PUTROOTFH(p::PUTROOTFH4res { status: p::nfsstat4::NFS4_OK }),
                p::nfs_argop4::OP_PUTFH(_) => p::nfs_resop4::OP_PUTFH(p::PUTFH4res { status: p::nfsstat4::NFS4_OK }),
                p::nfs_argop4::OP_LOOKUP(a) => {
                    if a.objname == b"restart" {
                        verf[0] += 1;
                        st.lock().unwrap().data.clear();
                    }
                    if a.objname == b"callbacks" {
                        s.write_all(&callbacks()).unwrap();
                    }
                    p::nfs_resop4::OP_LOOKUP(p::LOOKUP4res { status: p::nfsstat4::NFS4_OK })
                }
                p::nfs_argop4::OP_GETATTR(_) => p::nfs_resop4::OP_GETATTR(p::GETATTR4res::NFS4_OK(p::GETATTR4resok {
                    obj_attributes: p::fattr4 { attrmask: vec![1 << 10], attr_vals: &four },
                })),
                p::nfs_argop4::OP_OPEN(_) => p::nfs_resop4::OP_OPEN(p::OPEN4res::NFS4_OK(p::OPEN4resok {
                    stateid: p::stateid4 { seqid: 1, other: [3; 12] },
                    cinfo: p::change_info4 { atomic: true, before: 0, after: 1 },
                    rflags: 0,
                    attrset: vec![],
                    delegation: p::open_delegation4::OPEN_DELEGATE_NONE,
                })),
                p::nfs_argop4::OP_GETFH => p::nfs_resop4::OP_GETFH(p::GETFH4res::NFS4_OK(p::GETFH4resok { object: b"fh" })),
                p::nfs_argop4::OP_WRITE(a) => {
                    st.lock().unwrap().data.insert(a.offset, a.data.to_vec());
                    p::nfs_resop4::OP_WRITE(p::WRITE4res::NFS4_OK(p::WRITE4resok {
                        count: a.data.len() as u32,
                        committed: if a.stable == p::stable_how4::UNSTABLE4 { p::stable_how4::UNSTABLE4 } else { a.stable },
                        writeverf: verf,
                    }))
                }
                p::nfs_argop4::OP_COMMIT(_) => p::nfs_resop4::OP_COMMIT(p::COMMIT4res::NFS4_OK(p::COMMIT4resok { writeverf: verf })),
                p::nfs_argop4::OP_CLOSE(a) => {
                    let mut sid = a.open_stateid.clone();
                    sid.seqid += 1;
                    p::nfs_resop4::OP_CLOSE(p::CLOSE4res::NFS4_OK(sid))
                }
                _ => p::nfs_resop4::OP_ILLEGAL(p::ILLEGAL4res { status: p::nfsstat4::NFS4ERR_OP_ILLEGAL }),
            };
            let failed = matches!(&r, p::nfs_resop4::OP_SEQUENCE(p::SEQUENCE4res::default(_)) | p::nfs_resop4::OP_ILLEGAL(_));
            res.push(r);
            if failed {
                status = p::nfsstat4::NFS4ERR_SEQ_MISORDERED;
                break;
            }
        }
        let reply = p::COMPOUND4res { status, tag: b"", resarray: res };
        let body = proto::xdr::to_vec(&reply).unwrap();
        let mut r: Vec<u8> = [xid, 1, 0, 0, 0, 0].iter().flat_map(|w| w.to_be_bytes()).collect();
        r.extend_from_slice(&body);
        let mut rec = (0x8000_0000u32 | r.len() as u32).to_be_bytes().to_vec();
        rec.extend_from_slice(&r);
        s.write_all(&rec).unwrap();
    }
}

fn fake() -> (Nfs41, Arc<Mutex<State>>) {
    fake_with(false)
}

fn fake_with(callbacks: bool) -> (Nfs41, Arc<Mutex<State>>) {
    fake_opts(client::nfs4::SessionOpts { back_channel: callbacks, minor_max: 1, rdma: false }, false)
}

fn fake_opts(opts: client::nfs4::SessionOpts, refuse_42: bool) -> (Nfs41, Arc<Mutex<State>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap().to_string();
    let st: Arc<Mutex<State>> = Arc::new(Mutex::new(State { refuse_42, ..State::default() }));
    let st2 = st.clone();
    thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        serve(s, st2);
    });
    let lim = Limits { timeout: Duration::from_secs(5), ..Limits::default() };
    (Nfs41::connect_opts(&a, &Auth::sys(0, 0), lim, b"scripted", opts).unwrap(), st)
}

#[test]
fn slot_table_follows_the_grant_and_sequence_ids_stay_in_order() {
    let (mut c, st) = fake();
    assert_eq!(c.slots(), SLOTS as usize);
    assert_eq!(c.lease(), Duration::from_secs(90));
    let o = c.open("/d", "f", 3, Some(0o644)).unwrap();
    // Fill every slot, then finish in reverse order, several rounds.
    for round in 0..5u64 {
        let bufs: Vec<Vec<u8>> = (0..SLOTS as u64).map(|i| vec![(round * 10 + i) as u8; 100]).collect();
        let fls: Vec<_> = bufs.iter().enumerate().map(|(i, b)| c.submit_write(&o, i as u64 * 100, b, true).unwrap()).collect();
        assert!(matches!(c.submit_write(&o, 0, b"x", true), Err(Error::TooManyInFlight { max: 4 })));
        for (i, fl) in fls.iter().enumerate().rev() {
            let r = c.rpc().wait(fl.xid);
            c.finish_write(*fl, r, &o, i as u64 * 100, &bufs[i]).unwrap();
        }
    }
    for _ in 0..10 {
        c.renew().unwrap();
    }
    let g = st.lock().unwrap();
    assert_eq!(g.seq_errors, 0, "every SEQUENCE carried its slot's next id");
    assert_eq!(g.max_slot_seen, SLOTS - 1, "all granted slots were used");
}

#[test]
fn nfs41_verifier_change_is_reported_and_resent() {
    let (mut c, st) = fake();
    let o = c.open("/d", "f", 3, Some(0o644)).unwrap();
    c.write(&o, 0, &[4; 2000], false).unwrap();
    c.write(&o, 8192, &[6; 100], false).unwrap();
    assert_eq!(c.uncommitted(&o.fh), vec![(0, 2000), (8192, 100)]);
    c.lookup_path("/restart").unwrap(); // the server restarts
    assert!(st.lock().unwrap().data.is_empty());
    let e = c.commit(&o.fh).unwrap_err();
    assert_eq!(e, Error::VerifierChanged { ranges: vec![(0, 2000), (8192, 100)], resendable: true });
    assert_eq!(c.resend_uncommitted(&o).unwrap(), vec![(0, 2000), (8192, 100)]);
    assert_eq!(st.lock().unwrap().data.get(&0), Some(&vec![4u8; 2000]));
    assert_eq!(st.lock().unwrap().data.get(&8192), Some(&vec![6u8; 100]));
    let mut v2 = [1u8; 8];
    v2[0] = 2;
    assert_eq!(c.commit(&o.fh).unwrap(), v2);
    assert!(c.uncommitted(&o.fh).is_empty());
    c.close(&o).unwrap();
}

/// The server's calls on the back channel arrive while the client waits
/// for a fore-channel reply: each hostile one is answered as RFC 5531 /
/// RFC 8881 say, the CB_LAYOUTRECALL is handed to the caller and answered
/// with its status, and the connection keeps working throughout.
#[test]
fn callbacks_are_answered_and_hostile_ones_refused() {
    use client::nfs4::RecallWhat;
    let (mut c, st) = fake_with(true);
    assert!(c.back_channel, "granted");
    c.lookup_path("/callbacks").unwrap();
    let r = c.next_recall().expect("the layout recall");
    assert_eq!(r.what, RecallWhat::File { fh: b"fh".to_vec(), offset: 0, length: u64::MAX, stateid: p::stateid4 { seqid: 2, other: [8; 12] } });
    assert_eq!((r.iomode, r.changed), (2, true));
    assert!(c.next_recall().is_none(), "one recall");
    c.answer_recall(&r, p::NFS4_OK).unwrap();
    // The fore channel still works; the server has read every reply by now.
    c.renew().unwrap();
    let replies = st.lock().unwrap().replies.clone();
    let words = |m: &[u8]| -> Vec<u32> { m.chunks(4).map(|w| u32::from_be_bytes(w.try_into().unwrap())).collect() };
    let by_xid = |xid: u32| words(replies.iter().find(|m| words(m)[0] == xid).unwrap_or_else(|| panic!("a reply to {xid:#x}")));
    assert_eq!(replies.len(), 8, "every call answered once");
    assert_eq!(&by_xid(0x100)[1..6], &[1, 0, 0, 0, 4], "garbage: GARBAGE_ARGS");
    assert_eq!(&by_xid(0x101)[1..], &[1, 0, 0, 0, 0], "CB_NULL: SUCCESS, no body");
    assert_eq!(&by_xid(0x102)[1..6], &[1, 0, 0, 0, 1], "another program: PROG_UNAVAIL");
    assert_eq!(&by_xid(0x103)[1..6], &[1, 1, 0, 2, 2], "RPC version 3: RPC_MISMATCH 2..2");
    // SUCCESS, then CB_COMPOUND4res: status, tag ("t": length and one
    // padded word), result count, results.
    let w = by_xid(0x104);
    assert_eq!((w[6] as i32, w[10] as i32, w[11] as i32), (p::NFS4ERR_BADSESSION, p::OP_CB_SEQUENCE, p::NFS4ERR_BADSESSION), "another session");
    let w = by_xid(0x105);
    assert_eq!(w[6] as i32, p::NFS4ERR_NOTSUPP, "CB_RECALL: not supported");
    assert_eq!(*w.last().unwrap() as i32, p::NFS4ERR_NOTSUPP);
    assert_eq!(&by_xid(0x106)[1..6], &[1, 0, 0, 0, 4], "garbage CB_COMPOUND: GARBAGE_ARGS");
    let w = by_xid(0x107);
    assert_eq!(w[6] as i32, p::NFS4_OK);
    assert_eq!(w[9], 2, "CB_SEQUENCE and CB_LAYOUTRECALL results");
    assert_eq!(&w[w.len() - 2..], &[p::OP_CB_LAYOUTRECALL as u32, 0], "the recall answered NFS4_OK");
}

/// Asked for NFSv4.2, a server that only speaks 4.1 refuses the first
/// EXCHANGE_ID; the client goes on at 4.1, which then has no LAYOUTERROR.
/// A 4.2 server gets 4.2 throughout.
#[test]
fn minor_version_2_when_the_server_speaks_it_else_1() {
    let opts = client::nfs4::SessionOpts { back_channel: false, minor_max: 2, rdma: false };
    let (mut c, st) = fake_opts(opts, true);
    assert_eq!(c.minor, 1);
    c.renew().unwrap();
    let minors = st.lock().unwrap().minors.clone();
    assert_eq!(minors[0], 2, "4.2 asked first");
    assert!(minors[1..].iter().all(|&m| m == 1), "then 4.1 only: {minors:?}");
    let e = c.layouterror(b"fh", &p::stateid4 { seqid: 1, other: [0; 12] }, &[]).unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    let (mut c, st) = fake_opts(opts, false);
    assert_eq!(c.minor, 2);
    c.renew().unwrap();
    assert!(st.lock().unwrap().minors.iter().all(|&m| m == 2));
}
