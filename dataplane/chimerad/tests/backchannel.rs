//! Proves the NFSv4.1 back channel end to end over real TCP: the data path
//! (runtime io_uring loops + rpc::Dispatcher + nfs4::Nfs4Program over memfs,
//! wired as chimerad wires it) and a test client that speaks NFSv4.1 on one
//! connection, as the Linux client does (RFC 8881 §2.10.3.1: callbacks ride
//! the client's own connection).
//!
//! - A session created with CONN_BACK_CHAN gets CB_COMPOUND { CB_SEQUENCE,
//!   CB_LAYOUTRECALL } calls on that connection, with the right program,
//!   credential, session, slot, sequence ids and recall arguments; the
//!   client's answers (NFS4_OK, NFS4ERR_DELAY then OK, NOMATCHING_LAYOUT, a
//!   CB_SEQUENCE error) come back as the ticket's outcome; fore-channel calls
//!   interleave on the same connection throughout.
//! - Hostile replies (unknown xid, truncated, garbage body for a real call)
//!   are dropped and the connection keeps serving.
//! - Without a back channel: CbError::NoBackChannel and
//!   SEQ4_STATUS_CB_PATH_DOWN[_SESSION]; BIND_CONN_TO_SESSION fixes it; a
//!   closed connection takes its back channel away.
//! - An unanswered call times out after one lease; the next call on the slot
//!   resynchronises after the client's SEQ_MISORDERED.
//!
//! Every wait is bounded (socket read timeouts 10 s, ticket waits ≤ 10 s).

use nfs4::callback::{CbError, LayoutRecall, RecallKind, RecallOutcome};
use nfs4::state::Stateid;
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder, Xdr};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vfs::memfs::{MemFs, MemFsConfig};
use vfs::FileHandle;

const CB_PROG: u32 = 0x4000_0123;
const WAIT: Duration = Duration::from_secs(10);

struct Srv {
    server: Option<runtime::Server>,
    cb: Arc<nfs4::callback::Callbacks>,
    addr: SocketAddr,
}

impl Drop for Srv {
    fn drop(&mut self) {
        self.cb.shutdown();
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

fn start(lease_time_s: u32) -> Srv {
    let fs = Arc::new(MemFs::new(MemFsConfig { export_id: 1, capacity_bytes: 16 << 20 }));
    let cfg = nfs4::Config { grace_time_s: 0, lease_time_s, root_export: 1, ..Default::default() };
    let prog = nfs4::Nfs4Program::new(fs, cfg);
    let cb = prog.callbacks();
    let limits = rpc::Limits::default();
    let mut d = rpc::Dispatcher::new(limits);
    d.register(Arc::new(prog), "nfs4", &["null", "compound"]);
    d.set_reply_sink(cb.clone());
    let rcfg = runtime::Config { cores: 2, listen: vec!["127.0.0.1:0".parse().unwrap()], limits, ..Default::default() };
    let server = runtime::Server::start(rcfg, Arc::new(d)).unwrap();
    cb.attach(server.sender());
    let addr = server.local_addrs()[0];
    Srv { server: Some(server), cb, addr }
}

/// A COMPOUND body under construction (ops encoded with generated types).
struct Req {
    buf: Vec<u8>,
    n: u32,
}

impl Req {
    fn new() -> Req {
        Req { buf: Vec::new(), n: 0 }
    }
    fn op<'a, T: Xdr<'a>>(mut self, opnum: i32, args: &T) -> Req {
        let mut b = vec![0u8; 4096];
        let mut e = Encoder::new(&mut b);
        e.u32(opnum as u32).unwrap();
        args.encode(&mut e).unwrap();
        let k = e.position();
        self.buf.extend_from_slice(&b[..k]);
        self.n += 1;
        self
    }
}

/// One client connection: fore-channel calls out, back-channel calls in.
struct Conn {
    s: TcpStream,
    xid: u32,
    /// CB calls received while waiting for a fore-channel reply.
    calls: VecDeque<Vec<u8>>,
}

fn record(msg: &[u8]) -> Vec<u8> {
    let mut r = rpc::record::header(msg.len()).to_vec();
    r.extend_from_slice(msg);
    r
}

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect()
}

impl Conn {
    fn open(a: SocketAddr) -> Conn {
        let s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        Conn { s, xid: 100, calls: VecDeque::new() }
    }

    fn read_record(&mut self) -> Vec<u8> {
        let mut h = [0u8; 4];
        self.s.read_exact(&mut h).expect("record header within the timeout");
        let len = (u32::from_be_bytes(h) & 0x7fff_ffff) as usize;
        let mut b = vec![0u8; len];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    /// Send COMPOUND(req); return the COMPOUND4res bytes. Callback CALLs
    /// arriving meanwhile are queued.
    fn compound(&mut self, req: Req) -> Vec<u8> {
        self.xid += 1;
        let xid = self.xid;
        let mut m = Vec::new();
        for w in [xid, 0, 2, p::NFS4_PROGRAM, 4, 1, 0, 0, 0, 0] {
            m.extend_from_slice(&w.to_be_bytes());
        }
        m.extend_from_slice(&0u32.to_be_bytes()); // tag
        m.extend_from_slice(&1u32.to_be_bytes()); // minorversion
        m.extend_from_slice(&req.n.to_be_bytes());
        m.extend_from_slice(&req.buf);
        self.s.write_all(&record(&m)).unwrap();
        loop {
            let r = self.read_record();
            let w = words(&r[..8]);
            if w[1] == 0 {
                self.calls.push_back(r);
                continue;
            }
            assert_eq!(w[0], xid, "reply to our call");
            assert_eq!(&words(&r[..24])[1..], &[1, 0, 0, 0, 0], "REPLY, accepted, null verifier, SUCCESS");
            return r[24..].to_vec();
        }
    }

    /// The next back-channel CALL (queued or read now).
    fn next_call(&mut self) -> Vec<u8> {
        if let Some(c) = self.calls.pop_front() {
            return c;
        }
        let r = self.read_record();
        assert_eq!(words(&r[..8])[1], 0, "a CALL from the server");
        r
    }

    fn send_raw(&mut self, msg: &[u8]) {
        self.s.write_all(&record(msg)).unwrap();
    }
}

/// Decoded COMPOUND4res: status and the ops' (opnum, status, body) bytes.
fn res_status(r: &[u8]) -> (i32, Decoder<'_>) {
    let mut d = Decoder::new(r);
    let status = d.i32().unwrap();
    d.opaque_var(1024).unwrap();
    let _n = d.u32().unwrap();
    (status, d)
}

fn exchange_id(c: &mut Conn, owner: &[u8]) -> (u64, u32) {
    let args = p::EXCHANGE_ID4args {
        eia_clientowner: p::client_owner4 { co_verifier: [3; 8], co_ownerid: owner },
        eia_flags: 0,
        eia_state_protect: p::state_protect4_a::SP4_NONE,
        eia_client_impl_id: vec![],
    };
    let r = c.compound(Req::new().op(p::OP_EXCHANGE_ID, &args));
    let (st, mut d) = res_status(&r);
    assert_eq!(st, p::NFS4_OK);
    assert_eq!(d.u32().unwrap(), p::OP_EXCHANGE_ID as u32);
    assert_eq!(d.i32().unwrap(), p::NFS4_OK);
    let ok = p::EXCHANGE_ID4resok::decode(&mut d).unwrap();
    (ok.eir_clientid, ok.eir_sequenceid)
}

fn chan(slots: u32) -> p::channel_attrs4 {
    p::channel_attrs4 {
        ca_headerpadsize: 0,
        ca_maxrequestsize: 1 << 20,
        ca_maxresponsesize: 1 << 20,
        ca_maxresponsesize_cached: 4096,
        ca_maxoperations: 8,
        ca_maxrequests: slots,
        ca_rdma_ird: vec![],
    }
}

/// A session whose client tracks its fore slot-0 sequence.
struct Session {
    clientid: u64,
    id: [u8; 16],
    seq: u32,
}

fn create_session(c: &mut Conn, owner: &[u8], flags: u32) -> Session {
    let (clientid, sequence) = exchange_id(c, owner);
    let cred = proto::rpc::authsys_parms { stamp: 9, machinename: b"guest", uid: 0, gid: 0, gids: vec![] };
    let args = p::CREATE_SESSION4args {
        csa_clientid: clientid,
        csa_sequence: sequence,
        csa_flags: flags,
        csa_fore_chan_attrs: chan(8),
        csa_back_chan_attrs: chan(1),
        csa_cb_program: CB_PROG,
        csa_sec_parms: vec![p::callback_sec_parms4::AUTH_SYS(cred)],
    };
    let r = c.compound(Req::new().op(p::OP_CREATE_SESSION, &args));
    let (st, mut d) = res_status(&r);
    assert_eq!(st, p::NFS4_OK);
    d.u32().unwrap();
    d.i32().unwrap();
    let ok = p::CREATE_SESSION4resok::decode(&mut d).unwrap();
    assert_eq!(ok.csr_flags, flags, "back channel granted as asked");
    assert_eq!(ok.csr_back_chan_attrs.ca_maxrequests, 1);
    Session { clientid, id: ok.csr_sessionid, seq: 0 }
}

/// SEQUENCE alone: returns sr_status_flags.
fn sequence(c: &mut Conn, s: &mut Session) -> u32 {
    s.seq += 1;
    let args = p::SEQUENCE4args {
        sa_sessionid: s.id,
        sa_sequenceid: s.seq,
        sa_slotid: 0,
        sa_highest_slotid: 0,
        sa_cachethis: false,
    };
    let r = c.compound(Req::new().op(p::OP_SEQUENCE, &args));
    let (st, mut d) = res_status(&r);
    assert_eq!(st, p::NFS4_OK, "SEQUENCE");
    d.u32().unwrap();
    d.i32().unwrap();
    p::SEQUENCE4resok::decode(&mut d).unwrap().sr_status_flags
}

const FH: FileHandle = FileHandle { export_id: 1, ino: 42, generation: 7 };

fn file_recall() -> LayoutRecall {
    LayoutRecall {
        layout_type: p::LAYOUT4_FLEX_FILES as u32,
        iomode: p::LAYOUTIOMODE4_RW as u32,
        changed: true,
        kind: RecallKind::File { fh: FH, stateid: Stateid { seqid: 3, other: [5; 12] }, offset: 4096, length: u64::MAX },
    }
}

/// What the client saw in one CB_COMPOUND call.
struct SeenCall {
    xid: u32,
    seqid: u32,
    slot: u32,
}

/// Check the RPC header and CB_SEQUENCE of a CB_COMPOUND call, and that its
/// CB_LAYOUTRECALL carries `want`.
fn check_call(call: &[u8], s: &Session, want: &LayoutRecall) -> SeenCall {
    let w = words(&call[..28]);
    assert_eq!(&w[1..6], &[0, 2, CB_PROG, p::NFS_CB, p::CB_COMPOUND], "CALL rpcvers 2, cb program, NFS_CB, CB_COMPOUND");
    assert_eq!(w[6], 1, "AUTH_SYS, as csa_sec_parms asked");
    let mut d = Decoder::new(&call[28..]);
    let cred = d.opaque_var(400).unwrap();
    let mut cd = Decoder::new(cred);
    assert_eq!(cd.u32().unwrap(), 9, "stamp");
    assert_eq!(cd.opaque_var(255).unwrap(), b"guest");
    assert_eq!(d.u32().unwrap(), 0, "null verifier");
    d.opaque_var(400).unwrap();
    let args = p::CB_COMPOUND4args::decode(&mut d).unwrap();
    assert_eq!(args.minorversion, 1);
    assert_eq!(args.argarray.len(), 2, "CB_SEQUENCE + CB_LAYOUTRECALL");
    let p::nfs_cb_argop4::OP_CB_SEQUENCE(seq) = &args.argarray[0] else { panic!("first op is CB_SEQUENCE") };
    assert_eq!(seq.csa_sessionid, s.id);
    assert_eq!(seq.csa_highest_slotid, 0, "one back-channel slot negotiated");
    assert!(seq.csa_referring_call_lists.is_empty());
    let p::nfs_cb_argop4::OP_CB_LAYOUTRECALL(lr) = &args.argarray[1] else { panic!("second op is CB_LAYOUTRECALL") };
    assert_eq!(lr.clora_type as i32, want.layout_type as i32);
    assert_eq!(lr.clora_iomode as i32, want.iomode as i32);
    assert_eq!(lr.clora_changed, want.changed);
    match (&lr.clora_recall, &want.kind) {
        (p::layoutrecall4::LAYOUTRECALL4_FILE(f), RecallKind::File { fh, stateid, offset, length }) => {
            assert_eq!(f.lor_fh, &fh.to_bytes()[..]);
            assert_eq!((f.lor_offset, f.lor_length), (*offset, *length));
            assert_eq!((f.lor_stateid.seqid, f.lor_stateid.other), (stateid.seqid, stateid.other));
        }
        (p::layoutrecall4::LAYOUTRECALL4_FSID(f), RecallKind::Fsid { major, minor }) => {
            assert_eq!((f.major, f.minor), (*major, *minor));
        }
        (p::layoutrecall4::LAYOUTRECALL4_ALL, RecallKind::All) => {}
        (got, _) => panic!("recall kind {got:?} differs from {:?}", want.kind),
    }
    SeenCall { xid: w[0], seqid: seq.csa_sequenceid, slot: seq.csa_slotid }
}

/// The client's REPLY to a CB_COMPOUND: CB_SEQUENCE status (OK echoes the
/// call) and, when it succeeded, CB_LAYOUTRECALL's status.
fn cb_reply(seen: &SeenCall, s: &Session, seq_status: i32, recall_status: i32) -> Vec<u8> {
    let mut m = Vec::new();
    let mut b = vec![0u8; 512];
    let mut e = Encoder::new(&mut b);
    for w in [seen.xid, 1, 0, 0, 0, 0] {
        e.u32(w).unwrap();
    }
    let status = if seq_status != p::NFS4_OK { seq_status } else { recall_status };
    e.i32(status).unwrap();
    e.opaque_var(b"").unwrap();
    e.u32(if seq_status != p::NFS4_OK { 1 } else { 2 }).unwrap();
    e.u32(p::OP_CB_SEQUENCE as u32).unwrap();
    if seq_status == p::NFS4_OK {
        p::CB_SEQUENCE4res::NFS4_OK(p::CB_SEQUENCE4resok {
            csr_sessionid: s.id,
            csr_sequenceid: seen.seqid,
            csr_slotid: seen.slot,
            csr_highest_slotid: 0,
            csr_target_highest_slotid: 0,
        })
        .encode(&mut e)
        .unwrap();
        e.u32(p::OP_CB_LAYOUTRECALL as u32).unwrap();
        e.i32(recall_status).unwrap();
    } else {
        e.i32(seq_status).unwrap();
    }
    let n = e.position();
    m.extend_from_slice(&b[..n]);
    m
}

#[test]
fn layout_recall_outcomes_with_interleaved_fore_channel() {
    let srv = start(60);
    let mut c = Conn::open(srv.addr);
    let mut s = create_session(&mut c, b"linux-a", p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN);
    assert_eq!(sequence(&mut c, &mut s), 0, "back channel up: no CB_PATH_DOWN flags");

    // 1. NFS4_OK, with a fore-channel call between the CALL and our reply.
    let want = file_recall();
    let t = srv.cb.layout_recall(s.clientid, want.clone()).unwrap();
    let call = c.next_call();
    let seen = check_call(&call, &s, &want);
    assert_eq!((seen.slot, seen.seqid), (0, 1), "first callback: slot 0, sequence 1");
    assert_eq!(sequence(&mut c, &mut s), 0, "fore channel works while a callback is out");
    assert_eq!(srv.cb.poll(t), None, "not answered yet");
    c.send_raw(&cb_reply(&seen, &s, p::NFS4_OK, p::NFS4_OK));
    assert_eq!(srv.cb.wait(t, WAIT), Some(Ok(RecallOutcome::Accepted)));
    assert_eq!(srv.cb.poll(t), None, "a result is taken once");

    // 2. NFS4ERR_DELAY (I/O in flight on the client), then OK: the server
    //    resends on the next sequence id.
    let want = LayoutRecall { kind: RecallKind::Fsid { major: 1, minor: 2 }, iomode: p::LAYOUTIOMODE4_ANY as u32, changed: false, ..file_recall() };
    let t = srv.cb.layout_recall(s.clientid, want.clone()).unwrap();
    let seen = check_call(&c.next_call(), &s, &want);
    assert_eq!(seen.seqid, 2);
    c.send_raw(&cb_reply(&seen, &s, p::NFS4_OK, p::NFS4ERR_DELAY));
    let again = check_call(&c.next_call(), &s, &want);
    assert_eq!(again.seqid, 3, "the retry is a new request on the slot");
    assert_ne!(again.xid, seen.xid, "new xid");
    assert_eq!(sequence(&mut c, &mut s), 0);
    c.send_raw(&cb_reply(&again, &s, p::NFS4_OK, p::NFS4_OK));
    assert_eq!(srv.cb.wait(t, WAIT), Some(Ok(RecallOutcome::Accepted)));

    // 3. NOMATCHING_LAYOUT, reported through the completion closure.
    let want = LayoutRecall { kind: RecallKind::All, ..file_recall() };
    let (tx, rx) = std::sync::mpsc::channel();
    let t = srv
        .cb
        .layout_recall_notify(s.clientid, want.clone(), Box::new(move |t, r| tx.send((t, r)).unwrap()))
        .unwrap();
    let seen = check_call(&c.next_call(), &s, &want);
    assert_eq!(seen.seqid, 4);
    c.send_raw(&cb_reply(&seen, &s, p::NFS4_OK, p::NFS4ERR_NOMATCHING_LAYOUT));
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), (t, Ok(RecallOutcome::NoMatchingLayout)));

    // 4. CB_SEQUENCE refused: reported, and the sequence id was not used.
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    let seen = check_call(&c.next_call(), &s, &file_recall());
    assert_eq!(seen.seqid, 5);
    c.send_raw(&cb_reply(&seen, &s, p::NFS4ERR_BADSESSION, 0));
    assert_eq!(srv.cb.wait(t, WAIT), Some(Err(CbError::Status(p::NFS4ERR_BADSESSION))));
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    let seen = check_call(&c.next_call(), &s, &file_recall());
    assert_eq!(seen.seqid, 5, "a refused CB_SEQUENCE leaves the slot's sequence id");
    c.send_raw(&cb_reply(&seen, &s, p::NFS4_OK, p::NFS4_OK));
    assert_eq!(srv.cb.wait(t, WAIT), Some(Ok(RecallOutcome::Accepted)));

    // A recall that names no valid layout type is refused up front.
    let bad = LayoutRecall { layout_type: 99, ..file_recall() };
    assert_eq!(srv.cb.layout_recall(s.clientid, bad), Err(CbError::Invalid));
    assert_eq!(srv.cb.pending(), (0, 0), "nothing left in flight or queued");
}

#[test]
fn hostile_replies_are_dropped_and_the_connection_keeps_working() {
    let srv = start(60);
    let mut c = Conn::open(srv.addr);
    let mut s = create_session(&mut c, b"linux-b", p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN);
    // A REPLY nobody asked for, a truncated one, one that is not even a reply header.
    c.send_raw(&[0xdead_beefu32, 1, 0, 0, 0, 0, 0, 0, 0].iter().flat_map(|w| w.to_be_bytes()).collect::<Vec<u8>>());
    c.send_raw(&[0x1234_5678u32, 1].iter().flat_map(|w| w.to_be_bytes()).collect::<Vec<u8>>());
    c.send_raw(&[0x1234_5679u32, 1, 7].iter().flat_map(|w| w.to_be_bytes()).collect::<Vec<u8>>());
    assert_eq!(sequence(&mut c, &mut s), 0, "connection still served after unknown-xid replies");

    // A garbage body for a real callback: that callback fails, nothing else.
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    let seen = check_call(&c.next_call(), &s, &file_recall());
    let mut garbage = [seen.xid, 1, 0, 0, 0, 0].iter().flat_map(|w| w.to_be_bytes()).collect::<Vec<u8>>();
    garbage.extend_from_slice(&[0xff; 7]);
    c.send_raw(&garbage);
    assert_eq!(srv.cb.wait(t, WAIT), Some(Err(CbError::BadReply)));
    // The same xid again is now unknown: dropped.
    c.send_raw(&cb_reply(&seen, &s, p::NFS4_OK, p::NFS4_OK));
    assert_eq!(sequence(&mut c, &mut s), 0);
    // An RPC-level refusal (PROC_UNAVAIL) from the client's callback service.
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    let seen2 = check_call(&c.next_call(), &s, &file_recall());
    c.send_raw(&[seen2.xid, 1, 0, 0, 0, 3].iter().flat_map(|w| w.to_be_bytes()).collect::<Vec<u8>>());
    assert_eq!(srv.cb.wait(t, WAIT), Some(Err(CbError::BadReply)));
    // And the back channel still works.
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    let seen3 = check_call(&c.next_call(), &s, &file_recall());
    c.send_raw(&cb_reply(&seen3, &s, p::NFS4_OK, p::NFS4_OK));
    assert_eq!(srv.cb.wait(t, WAIT), Some(Ok(RecallOutcome::Accepted)));
    assert_eq!(sequence(&mut c, &mut s), 0);
}

#[test]
fn no_back_channel_until_bound_and_gone_with_its_connection() {
    let srv = start(60);
    let mut c = Conn::open(srv.addr);
    let mut s = create_session(&mut c, b"linux-c", 0);
    let down = p::SEQ4_STATUS_CB_PATH_DOWN | p::SEQ4_STATUS_CB_PATH_DOWN_SESSION;
    assert_eq!(sequence(&mut c, &mut s), down, "no back channel: the client is told");
    assert_eq!(srv.cb.layout_recall(s.clientid, file_recall()), Err(CbError::NoBackChannel));
    assert_eq!(srv.cb.layout_recall(0xdead, file_recall()), Err(CbError::NoBackChannel), "unknown client");

    // What the Linux client does on CB_PATH_DOWN: bind this connection.
    let bind = p::BIND_CONN_TO_SESSION4args {
        bctsa_sessid: s.id,
        bctsa_dir: p::channel_dir_from_client4::CDFC4_FORE_OR_BOTH,
        bctsa_use_conn_in_rdma_mode: false,
    };
    let r = c.compound(Req::new().op(p::OP_BIND_CONN_TO_SESSION, &bind));
    assert_eq!(res_status(&r).0, p::NFS4_OK);
    assert_eq!(sequence(&mut c, &mut s), 0, "bound: flags clear");
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    let seen = check_call(&c.next_call(), &s, &file_recall());
    c.send_raw(&cb_reply(&seen, &s, p::NFS4_OK, p::NFS4_OK));
    assert_eq!(srv.cb.wait(t, WAIT), Some(Ok(RecallOutcome::Accepted)));

    // A fore-only binding takes the connection off the back channel.
    let fore = p::BIND_CONN_TO_SESSION4args { bctsa_dir: p::channel_dir_from_client4::CDFC4_FORE, ..bind };
    let r = c.compound(Req::new().op(p::OP_BIND_CONN_TO_SESSION, &fore));
    assert_eq!(res_status(&r).0, p::NFS4_OK);
    assert_eq!(sequence(&mut c, &mut s), down);
    let r = c.compound(Req::new().op(p::OP_BIND_CONN_TO_SESSION, &bind));
    assert_eq!(res_status(&r).0, p::NFS4_OK);
    assert_eq!(sequence(&mut c, &mut s), 0);

    // The connection closes: its back channel goes with it. The client
    // comes back on a new connection and is told again.
    drop(c);
    let mut c2 = Conn::open(srv.addr);
    let end = Instant::now() + WAIT;
    let mut pending = Vec::new();
    loop {
        match srv.cb.layout_recall(s.clientid, file_recall()) {
            Err(CbError::NoBackChannel) => break,
            // The close had not reached the server yet: the call is lost
            // with the connection and waits (within its deadline) for the
            // client to bind a back channel again.
            Ok(t) => pending.push(t),
            Err(e) => panic!("{e:?}"),
        }
        assert!(Instant::now() < end, "the closed connection still carries the back channel");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sequence(&mut c2, &mut s), down);
    // BACKCHANNEL_CTL offering only RPCSEC_GSS is refused; AUTH_NONE is fine.
    s.seq += 1;
    let seq = p::SEQUENCE4args { sa_sessionid: s.id, sa_sequenceid: s.seq, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false };
    let gss = p::BACKCHANNEL_CTL4args {
        bca_cb_program: CB_PROG,
        bca_sec_parms: vec![p::callback_sec_parms4::RPCSEC_GSS(p::gss_cb_handles4 {
            gcbp_service: p::rpc_gss_svc_t::RPC_GSS_SVC_NONE,
            gcbp_handle_from_server: b"x",
            gcbp_handle_from_client: b"y",
        })],
    };
    let r = c2.compound(Req::new().op(p::OP_SEQUENCE, &seq).op(p::OP_BACKCHANNEL_CTL, &gss));
    assert_eq!(res_status(&r).0, p::NFS4ERR_ENCR_ALG_UNSUPP);
    s.seq += 1;
    let seq = p::SEQUENCE4args { sa_sequenceid: s.seq, ..seq };
    let none = p::BACKCHANNEL_CTL4args { bca_cb_program: CB_PROG, bca_sec_parms: vec![p::callback_sec_parms4::AUTH_NONE] };
    let r = c2.compound(Req::new().op(p::OP_SEQUENCE, &seq).op(p::OP_BACKCHANNEL_CTL, &none));
    assert_eq!(res_status(&r).0, p::NFS4_OK);
    // The client binds its new connection: a recall lost with the old one
    // is delivered now, then new ones flow (with AUTH_NONE from now on).
    let back = p::BIND_CONN_TO_SESSION4args { bctsa_dir: p::channel_dir_from_client4::CDFC4_BACK_OR_BOTH, ..bind };
    let r = c2.compound(Req::new().op(p::OP_BIND_CONN_TO_SESSION, &back));
    assert_eq!(res_status(&r).0, p::NFS4_OK);
    assert_eq!(sequence(&mut c2, &mut s), 0);
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    pending.push(t);
    // One slot: the calls come one after the other, in whichever order the
    // server picks; answer as many as there are tickets, then check each.
    for _ in 0..pending.len() {
        let call = c2.next_call();
        assert_eq!(words(&call[..32])[6..8], [0, 0], "AUTH_NONE after BACKCHANNEL_CTL");
        let xid = words(&call[..4])[0];
        let mut d = Decoder::new(&call[40..]);
        let args = p::CB_COMPOUND4args::decode(&mut d).unwrap();
        let p::nfs_cb_argop4::OP_CB_SEQUENCE(seq) = &args.argarray[0] else { panic!("CB_SEQUENCE first") };
        let seen = SeenCall { xid, seqid: seq.csa_sequenceid, slot: seq.csa_slotid };
        c2.send_raw(&cb_reply(&seen, &s, p::NFS4_OK, p::NFS4_OK));
    }
    for t in pending {
        assert_eq!(srv.cb.wait(t, WAIT), Some(Ok(RecallOutcome::Accepted)));
    }
    assert_eq!(srv.cb.pending(), (0, 0));
}

#[test]
fn unanswered_call_times_out_and_the_slot_resynchronises() {
    // Lease 2 s: the call times out after 2 s; the client renews meanwhile.
    let srv = start(2);
    let mut c = Conn::open(srv.addr);
    let mut s = create_session(&mut c, b"linux-d", p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN);
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    let lost = check_call(&c.next_call(), &s, &file_recall());
    assert_eq!(lost.seqid, 1);
    let started = Instant::now();
    let r = loop {
        sequence(&mut c, &mut s);
        if let Some(r) = srv.cb.wait(t, Duration::from_millis(300)) {
            break r;
        }
        assert!(started.elapsed() < WAIT, "no timeout reported");
    };
    assert_eq!(r, Err(CbError::Timeout));
    assert!(started.elapsed() >= Duration::from_millis(1500), "timed out after about one lease");
    // The client never saw sequence 1 (as if the call was lost): it answers
    // the next call's sequence 2 with SEQ_MISORDERED; the server steps back
    // and resends on sequence 1.
    let t = srv.cb.layout_recall(s.clientid, file_recall()).unwrap();
    let next = check_call(&c.next_call(), &s, &file_recall());
    assert_eq!(next.seqid, 2);
    c.send_raw(&cb_reply(&next, &s, p::NFS4ERR_SEQ_MISORDERED, 0));
    let resent = check_call(&c.next_call(), &s, &file_recall());
    assert_eq!(resent.seqid, 1, "resynchronised on the sequence the client expects");
    c.send_raw(&cb_reply(&resent, &s, p::NFS4_OK, p::NFS4_OK));
    assert_eq!(srv.cb.wait(t, WAIT), Some(Ok(RecallOutcome::Accepted)));
}
