//! End-to-end tests of the NFSv4.1 program: COMPOUND requests built with the
//! generated encoders go through `Nfs4Program::call` over a real `MemFs`,
//! and the replies are decoded op by op and checked — session setup, the
//! sequencing rules, open/write/read/close, locks between two clients, lease
//! expiry, the grace period, the replay cache, and the errors for bad
//! sessions, stateids and handles, quota and space.

use crate::{instance_epoch, Config, Nfs4Program};
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder, Xdr};
use rpc::{Auth, CallContext, Program};
use std::sync::Arc;
use vfs::memfs::{MemFs, MemFsConfig};
use vfs::Vfs;

const REPLY_BYTES_MAX: usize = 2 * 1024 * 1024;

thread_local! {
    /// The peer address calls come from (each test runs on its own thread).
    static PEER: std::cell::Cell<std::net::SocketAddr> = std::cell::Cell::new("127.0.0.1:700".parse().unwrap());
}

fn from_peer(addr: &str) {
    PEER.with(|p| p.set(addr.parse().unwrap()));
}
const EXPORT: u32 = 1;

/// A COMPOUND under construction.
struct Req {
    buf: Vec<u8>,
    ops: u32,
}

impl Req {
    fn new(minorversion: u32) -> Req {
        let mut r = Req { buf: Vec::new(), ops: 0 };
        r.put(&|e| {
            e.opaque_var(b"test")?;
            e.u32(minorversion)?;
            e.u32(0)
        });
        r
    }

    fn put(&mut self, f: &dyn Fn(&mut Encoder<'_>) -> proto::xdr::Result<()>) {
        let mut tmp = [0u8; 64];
        let mut e = Encoder::new(&mut tmp);
        f(&mut e).unwrap();
        let n = e.position();
        self.buf.extend_from_slice(&tmp[..n]);
    }

    /// An operation whose arguments are a generated type.
    fn op<'a, T: Xdr<'a>>(mut self, opnum: i32, args: &T) -> Req {
        self.ops += 1;
        self.buf.extend_from_slice(&(opnum as u32).to_be_bytes());
        self.buf.extend_from_slice(&proto::xdr::to_vec(args).unwrap());
        self
    }

    /// An operation without arguments, or one given raw.
    fn raw(mut self, opnum: u32, args: &[u8]) -> Req {
        self.ops += 1;
        self.buf.extend_from_slice(&opnum.to_be_bytes());
        self.buf.extend_from_slice(args);
        self
    }

    fn bytes(mut self) -> Vec<u8> {
        // numops sits after the tag ("test": 4 + 4) and the minor version.
        self.buf[12..16].copy_from_slice(&self.ops.to_be_bytes());
        self.buf
    }
}

/// A decoded COMPOUND4res, walked op by op.
struct Reply {
    bytes: Vec<u8>,
    pos: usize,
    status: i32,
    count: u32,
}

impl Reply {
    fn parse(bytes: Vec<u8>) -> Reply {
        let mut d = Decoder::new(&bytes);
        let status = d.i32().unwrap();
        assert_eq!(d.opaque_var(1024).unwrap(), b"test", "tag echoed");
        let count = d.u32().unwrap();
        let pos = d.position();
        Reply { bytes, pos, status, count }
    }

    /// Next result: check its op number, return its status.
    fn next(&mut self, op: i32) -> i32 {
        let mut d = Decoder::new(&self.bytes[self.pos..]);
        assert_eq!(d.i32().unwrap(), op, "result op number");
        let st = d.i32().unwrap();
        self.pos += d.position();
        st
    }

    /// Next result must be NFS4_OK; decode its body as `T`.
    fn ok<'a, T: Xdr<'a>>(&'a mut self, op: i32) -> T {
        let st = self.next(op);
        assert_eq!(st, p::NFS4_OK, "op {op} failed with {st}");
        let mut d = Decoder::new(&self.bytes[self.pos..]);
        let v = T::decode(&mut d).unwrap();
        self.pos += d.position();
        v
    }

    /// Next result must be NFS4_OK with no body.
    fn ok0(&mut self, op: i32) {
        let st = self.next(op);
        assert_eq!(st, p::NFS4_OK, "op {op} failed with {st}");
    }

    fn body(&self) -> Decoder<'_> {
        Decoder::new(&self.bytes[self.pos..])
    }

    /// The bytes `body` decodes.
    fn body_bytes(&self) -> &[u8] {
        &self.bytes[self.pos..]
    }
}

struct Server {
    prog: Nfs4Program,
    fs: Arc<MemFs>,
}

fn server_with(cfg: Config, capacity_bytes: u64) -> Server {
    let fs = Arc::new(MemFs::new(MemFsConfig { export_id: EXPORT, capacity_bytes }));
    let cfg = Config { root_export: EXPORT, ..cfg };
    Server { prog: Nfs4Program::new_without_reaper(fs.clone(), cfg), fs }
}

fn server() -> Server {
    server_with(Config { grace_time_s: 0, ..Config::default() }, 64 << 20)
}

impl Server {
    fn call_raw(&self, conn: u64, args: &[u8]) -> Vec<u8> {
        self.call_as(Auth::Sys { stamp: 0, machine_name: b"t", uid: 0, gid: 0, gids: &[] }, conn, args)
    }

    fn call_as(&self, auth: Auth<'_>, conn: u64, args: &[u8]) -> Vec<u8> {
        let ctx = CallContext {
            xid: 1,
            prog: p::NFS4_PROGRAM,
            vers: 4,
            proc_num: 1,
            auth,
            conn_id: conn,
            peer: PEER.with(|p| p.get()),
            core: 0,
            lend: None,
            park: None,
            resumed: None,
        };
        let mut buf = vec![0u8; REPLY_BYTES_MAX];
        let mut e = Encoder::new(&mut buf);
        self.prog.call(&ctx, args, &mut e).expect("COMPOUND answered");
        let n = e.position();
        buf.truncate(n);
        buf
    }

    fn call(&self, req: Req) -> Reply {
        Reply::parse(self.call_raw(1, &req.bytes()))
    }
}

fn chan(ops: u32, slots: u32) -> p::channel_attrs4 {
    p::channel_attrs4 {
        ca_headerpadsize: 0,
        ca_maxrequestsize: 1 << 20 | 8192,
        ca_maxresponsesize: 1 << 20 | 8192,
        ca_maxresponsesize_cached: 4096,
        ca_maxoperations: ops,
        ca_maxrequests: slots,
        ca_rdma_ird: vec![],
    }
}

/// A client with a confirmed session, tracking its slot-0 sequence id.
struct Client {
    clientid: u64,
    session: [u8; 16],
    seq: u32,
}

fn exchange_id(s: &Server, owner: &[u8]) -> p::EXCHANGE_ID4resok<'static> {
    let args = p::EXCHANGE_ID4args {
        eia_clientowner: p::client_owner4 { co_verifier: [7; 8], co_ownerid: owner },
        eia_flags: 0,
        eia_state_protect: p::state_protect4_a::SP4_NONE,
        eia_client_impl_id: vec![],
    };
    let mut r = s.call(Req::new(1).op(p::OP_EXCHANGE_ID, &args));
    assert_eq!(r.status, p::NFS4_OK);
    let x: p::EXCHANGE_ID4resok<'_> = r.ok(p::OP_EXCHANGE_ID);
    // Detach from the reply buffer: the tests only need the numbers.
    p::EXCHANGE_ID4resok {
        eir_clientid: x.eir_clientid,
        eir_sequenceid: x.eir_sequenceid,
        eir_flags: x.eir_flags,
        eir_state_protect: p::state_protect4_r::SP4_NONE,
        eir_server_owner: p::server_owner4 { so_minor_id: 0, so_major_id: b"" },
        eir_server_scope: b"",
        eir_server_impl_id: vec![],
    }
}

fn connect(s: &Server, owner: &[u8]) -> Client {
    connect_with(s, owner, 16)
}

fn connect_with(s: &Server, owner: &[u8], ops: u32) -> Client {
    let x = exchange_id(s, owner);
    assert_eq!(x.eir_flags & p::EXCHGID4_FLAG_CONFIRMED_R, 0, "new client is unconfirmed");
    let args = p::CREATE_SESSION4args {
        csa_clientid: x.eir_clientid,
        csa_sequence: x.eir_sequenceid,
        csa_flags: p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
        csa_fore_chan_attrs: chan(ops, 8),
        csa_back_chan_attrs: chan(2, 1),
        csa_cb_program: 0x4000_0000,
        csa_sec_parms: vec![],
    };
    let mut r = s.call(Req::new(1).op(p::OP_CREATE_SESSION, &args));
    let cs: p::CREATE_SESSION4resok = r.ok(p::OP_CREATE_SESSION);
    assert_eq!(cs.csr_fore_chan_attrs.ca_maxrequests, 8);
    assert_eq!(cs.csr_fore_chan_attrs.ca_maxoperations, ops.min(Config::default().ops_per_compound_max));
    assert_eq!(cs.csr_flags, p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN, "back channel accepted");
    let mut c = Client { clientid: x.eir_clientid, session: cs.csr_sessionid, seq: 0 };
    let mut r = s.call(c.seq_req(false).op(p::OP_RECLAIM_COMPLETE, &p::RECLAIM_COMPLETE4args { rca_one_fs: false }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_RECLAIM_COMPLETE);
    c
}

impl Client {
    /// A COMPOUND starting with SEQUENCE on slot 0 (next sequence id).
    fn seq_req(&mut self, cachethis: bool) -> Req {
        self.seq += 1;
        Req::new(1).op(
            p::OP_SEQUENCE,
            &p::SEQUENCE4args {
                sa_sessionid: self.session,
                sa_sequenceid: self.seq,
                sa_slotid: 0,
                sa_highest_slotid: 0,
                sa_cachethis: cachethis,
            },
        )
    }
}

fn stateid0() -> p::stateid4 {
    p::stateid4 { seqid: 0, other: [0; 12] }
}

fn fattr_mode(mode: u32) -> (Vec<u32>, [u8; 4]) {
    (crate::attrs::Bitmap::of(&[crate::attrs::MODE]).to_vec(), mode.to_be_bytes())
}

/// OPEN (create unchecked) `name` under the root: returns stateid and handle.
fn open_create(s: &Server, c: &mut Client, owner: &[u8], name: &[u8], access: u32) -> (p::stateid4, Vec<u8>) {
    let (sid, fh, _) = open_create_rflags(s, c, owner, name, access);
    (sid, fh)
}

/// `open_create`, with the OPEN's rflags.
fn open_create_rflags(s: &Server, c: &mut Client, owner: &[u8], name: &[u8], access: u32) -> (p::stateid4, Vec<u8>, u32) {
    let (mask, vals) = fattr_mode(0o644);
    let args = p::OPEN4args {
        seqid: 0,
        share_access: access,
        share_deny: 0,
        owner: p::state_owner4 { clientid: c.clientid, owner },
        openhow: p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 {
            attrmask: mask,
            attr_vals: &vals,
        })),
        claim: p::open_claim4::CLAIM_NULL(name),
    };
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &args).raw(p::OP_GETFH as u32, &[]));
    assert_eq!(r.status, p::NFS4_OK, "open {name:?}");
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    let o: p::OPEN4resok = r.ok(p::OP_OPEN);
    let (sid, rflags) = (o.stateid.clone(), o.rflags);
    assert!(matches!(o.delegation, p::open_delegation4::OPEN_DELEGATE_NONE));
    let fh: p::GETFH4resok = r.ok(p::OP_GETFH);
    (sid, fh.object.to_vec(), rflags)
}

fn putfh(fh: &[u8]) -> p::PUTFH4args<'_> {
    p::PUTFH4args { object: fh }
}

#[test]
fn session_setup_and_minor_version_mismatch() {
    let s = server();
    for minor in [0u32, 3, u32::MAX] {
        let r = s.call(Req::new(minor).raw(p::OP_PUTROOTFH as u32, &[]));
        assert_eq!(r.status, p::NFS4ERR_MINOR_VERS_MISMATCH);
        assert_eq!(r.count, 0, "no operation evaluated");
    }
    let mut c = connect(&s, b"linux");
    // The same owner and verifier again: the confirmed record is returned.
    let x = exchange_id(&s, b"linux");
    assert_eq!(x.eir_clientid, c.clientid);
    assert_ne!(x.eir_flags & p::EXCHGID4_FLAG_CONFIRMED_R, 0);
    // A second RECLAIM_COMPLETE is an error.
    let mut r = s.call(c.seq_req(false).op(p::OP_RECLAIM_COMPLETE, &p::RECLAIM_COMPLETE4args { rca_one_fs: false }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_RECLAIM_COMPLETE), p::NFS4ERR_COMPLETE_ALREADY);
    // BIND_CONN_TO_SESSION from another connection.
    let args = p::BIND_CONN_TO_SESSION4args {
        bctsa_sessid: c.session,
        bctsa_dir: p::channel_dir_from_client4::CDFC4_FORE_OR_BOTH,
        bctsa_use_conn_in_rdma_mode: false,
    };
    let mut r = Reply::parse(s.call_raw(2, &Req::new(1).op(p::OP_BIND_CONN_TO_SESSION, &args).bytes()));
    let b: p::BIND_CONN_TO_SESSION4resok = r.ok(p::OP_BIND_CONN_TO_SESSION);
    assert!(matches!(b.bctsr_dir, p::channel_dir_from_server4::CDFS4_BOTH));
    // DESTROY_CLIENTID refuses while a session exists; works after DESTROY_SESSION.
    let dc = p::DESTROY_CLIENTID4args { dca_clientid: c.clientid };
    let mut r = s.call(Req::new(1).op(p::OP_DESTROY_CLIENTID, &dc));
    assert_eq!(r.next(p::OP_DESTROY_CLIENTID), p::NFS4ERR_CLIENTID_BUSY);
    let mut r = s.call(Req::new(1).op(p::OP_DESTROY_SESSION, &p::DESTROY_SESSION4args { dsa_sessionid: c.session }));
    r.ok0(p::OP_DESTROY_SESSION);
    let mut r = s.call(c.seq_req(false));
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_BADSESSION);
    let mut r = s.call(Req::new(1).op(p::OP_DESTROY_CLIENTID, &dc));
    r.ok0(p::OP_DESTROY_CLIENTID);
}

#[test]
fn sequence_rules_and_illegal_ops() {
    let s = server();
    let mut c = connect(&s, b"rules");
    let mut r = s.call(Req::new(1).raw(p::OP_PUTROOTFH as u32, &[]));
    assert_eq!((r.status, r.next(p::OP_PUTROOTFH)), (p::NFS4ERR_OP_NOT_IN_SESSION, p::NFS4ERR_OP_NOT_IN_SESSION));
    let seq = p::SEQUENCE4args { sa_sessionid: c.session, sa_sequenceid: 99, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false };
    let mut r = s.call(c.seq_req(false).op(p::OP_SEQUENCE, &seq));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_SEQUENCE_POS);
    // Unknown op numbers: OP_ILLEGAL result; v4.0-only ops: NOTSUPP.
    let mut r = s.call(c.seq_req(false).raw(99, &[]));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_ILLEGAL), p::NFS4ERR_OP_ILLEGAL);
    let mut r = s.call(c.seq_req(false).raw(p::OP_OPEN_CONFIRM as u32, &[]));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_OPEN_CONFIRM), p::NFS4ERR_NOTSUPP);
    // EXCHANGE_ID must be alone when not in a session.
    let x = exchange_id(&s, b"other");
    let _ = x;
    let args = p::DESTROY_CLIENTID4args { dca_clientid: 1 };
    let mut r = s.call(Req::new(1).op(p::OP_DESTROY_CLIENTID, &args).raw(p::OP_PUTROOTFH as u32, &[]));
    assert_eq!(r.next(p::OP_DESTROY_CLIENTID), p::NFS4ERR_NOT_ONLY_OP);
    // Slot misuse.
    let bad = p::SEQUENCE4args { sa_sessionid: c.session, sa_sequenceid: 1, sa_slotid: 8, sa_highest_slotid: 8, sa_cachethis: false };
    let mut r = s.call(Req::new(1).op(p::OP_SEQUENCE, &bad));
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_BADSLOT);
    let skip = p::SEQUENCE4args { sa_sessionid: c.session, sa_sequenceid: c.seq + 5, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false };
    let mut r = s.call(Req::new(1).op(p::OP_SEQUENCE, &skip));
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_SEQ_MISORDERED);
    // Operations past the negotiated count.
    let mut c8 = connect_with(&s, b"eight", 8);
    let mut req = c8.seq_req(false);
    for _ in 0..8 {
        req = req.raw(p::OP_PUTROOTFH as u32, &[]);
    }
    let mut r = s.call(req);
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_TOO_MANY_OPS);
    // A truncated argument list: BADXDR, the COMPOUND still answers.
    let mut bytes = c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).bytes();
    bytes[12..16].copy_from_slice(&3u32.to_be_bytes());
    let mut r = Reply::parse(s.call_raw(1, &bytes));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_ILLEGAL), p::NFS4ERR_BADXDR);
}

#[test]
fn open_write_read_close() {
    let s = server();
    let mut c = connect(&s, b"io");
    let (sid, fh) = open_create(&s, &mut c, b"owner", b"data", 3);
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let w = p::WRITE4args { stateid: sid.clone(), offset: 5, stable: p::stable_how4::FILE_SYNC4, data: &payload };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_WRITE, &w));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let wr: p::WRITE4resok = r.ok(p::OP_WRITE);
    assert_eq!(wr.count, 10_000);
    assert_eq!(wr.writeverf, s.fs.write_verifier());
    // Read it back, past the end too.
    let rd = p::READ4args { stateid: sid.clone(), offset: 0, count: 20_000 };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_READ, &rd));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let rr: p::READ4resok = r.ok(p::OP_READ);
    assert!(rr.eof);
    assert_eq!(rr.data.len(), 10_005);
    assert_eq!(&rr.data[..5], &[0; 5]);
    assert_eq!(&rr.data[5..], &payload[..]);
    // GETATTR size and owner.
    let ga = p::GETATTR4args {
        attr_request: crate::attrs::Bitmap::of(&[crate::attrs::SIZE, crate::attrs::OWNER]).to_vec(),
    };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_GETATTR, &ga));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let g: p::GETATTR4resok = r.ok(p::OP_GETATTR);
    let mut v = Decoder::new(g.obj_attributes.attr_vals);
    assert_eq!(v.u64().unwrap(), 10_005);
    assert_eq!(v.opaque_var(16).unwrap(), b"0");
    // CLOSE gives the invalid stateid; the old one is dead afterwards.
    let cl = p::CLOSE4args { seqid: 0, open_stateid: sid.clone() };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_CLOSE, &cl));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let closed: p::stateid4 = r.ok(p::OP_CLOSE);
    assert_eq!((closed.seqid, closed.other), (u32::MAX, [0; 12]));
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_READ, &rd));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_READ), p::NFS4ERR_BAD_STATEID);
    // The anonymous stateid reads outside grace.
    let anon = p::READ4args { stateid: stateid0(), offset: 5, count: 3 };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_READ, &anon));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let rr: p::READ4resok = r.ok(p::OP_READ);
    assert_eq!(rr.data, &payload[..3]);
}

#[test]
fn write_needs_write_access_and_current_stateid_works() {
    let s = server();
    let mut c = connect(&s, b"modes");
    let (sid, fh) = open_create(&s, &mut c, b"o", b"ro", 1);
    let w = p::WRITE4args { stateid: sid, offset: 0, stable: p::stable_how4::UNSTABLE4, data: b"x" };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_WRITE, &w));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_WRITE), p::NFS4ERR_OPENMODE);
    // OPEN then WRITE with the special "current stateid" in one COMPOUND.
    let (mask, vals) = fattr_mode(0o600);
    let open = p::OPEN4args {
        seqid: 0,
        share_access: 2,
        share_deny: 0,
        owner: p::state_owner4 { clientid: c.clientid, owner: b"o2" },
        openhow: p::openflag4::OPEN4_CREATE(p::createhow4::GUARDED4(p::fattr4 { attrmask: mask, attr_vals: &vals })),
        claim: p::open_claim4::CLAIM_NULL(b"cur"),
    };
    let current = p::stateid4 { seqid: 1, other: [0; 12] };
    let w = p::WRITE4args { stateid: current.clone(), offset: 0, stable: p::stable_how4::UNSTABLE4, data: b"hello" };
    let cl = p::CLOSE4args { seqid: 0, open_stateid: current };
    let r = s.call(
        c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &open).op(p::OP_WRITE, &w).op(p::OP_CLOSE, &cl),
    );
    assert_eq!(r.status, p::NFS4_OK);
    assert_eq!(r.count, 5);
    // GUARDED on an existing name fails.
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &open));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_EXIST);
}

#[test]
fn locks_conflict_between_clients() {
    let s = server();
    let mut a = connect(&s, b"a");
    let mut b = connect(&s, b"b");
    let (sa, fh) = open_create(&s, &mut a, b"oa", b"locked", 3);
    let (sb, _) = open_create(&s, &mut b, b"ob", b"locked", 3);
    let lock = |sid: &p::stateid4, clientid: u64, owner: &'static [u8], lt: p::nfs_lock_type4, off: u64| p::LOCK4args {
        locktype: lt,
        reclaim: false,
        offset: off,
        length: 100,
        locker: p::locker4::TRUE(p::open_to_lock_owner4 {
            open_seqid: 0,
            open_stateid: sid.clone(),
            lock_seqid: 0,
            lock_owner: p::state_owner4 { clientid, owner },
        }),
    };
    let mut r = s.call(a.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCK, &lock(&sa, a.clientid, b"la", p::nfs_lock_type4::WRITE_LT, 0)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let la: p::LOCK4resok = r.ok(p::OP_LOCK);
    // b conflicts; the denial names a's owner and range.
    let mut r = s.call(b.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCK, &lock(&sb, b.clientid, b"lb", p::nfs_lock_type4::READ_LT, 50)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_LOCK), p::NFS4ERR_DENIED);
    let denied = p::LOCK4denied::decode(&mut r.body()).unwrap();
    assert_eq!((denied.offset, denied.length, denied.owner.clientid, denied.owner.owner), (0, 100, a.clientid, &b"la"[..]));
    // LOCKT agrees; a non-overlapping range is free.
    let b_id = b.clientid;
    let t = |off: u64| p::LOCKT4args {
        locktype: p::nfs_lock_type4::WRITE_LT,
        offset: off,
        length: 10,
        owner: p::state_owner4 { clientid: b_id, owner: b"lb" },
    };
    let mut r = s.call(b.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCKT, &t(95)).op(p::OP_LOCKT, &t(100)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_LOCKT), p::NFS4ERR_DENIED);
    // a unlocks; b gets it.
    let u = p::LOCKU4args { locktype: p::nfs_lock_type4::WRITE_LT, seqid: 0, lock_stateid: la.lock_stateid.clone(), offset: 0, length: u64::MAX };
    let mut r = s.call(a.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCKU, &u));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let after: p::stateid4 = r.ok(p::OP_LOCKU);
    assert_eq!(after.seqid, la.lock_stateid.seqid + 1);
    let mut r = s.call(b.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCK, &lock(&sb, b.clientid, b"lb", p::nfs_lock_type4::READ_LT, 50)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    r.ok::<p::LOCK4resok>(p::OP_LOCK);
    // The old lock stateid (seqid 1) is now OLD_STATEID; the current one frees.
    let test = p::TEST_STATEID4args { ts_stateids: vec![la.lock_stateid.clone(), after.clone(), stateid0()] };
    let mut r = s.call(a.seq_req(false).op(p::OP_TEST_STATEID, &test));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_TEST_STATEID), p::NFS4_OK);
    let mut d = r.body();
    assert_eq!(d.u32().unwrap(), 3);
    assert_eq!(d.i32().unwrap(), p::NFS4ERR_OLD_STATEID);
    assert_eq!(d.i32().unwrap(), p::NFS4_OK);
    assert_eq!(d.i32().unwrap(), p::NFS4ERR_BAD_STATEID);
    let mut r = s.call(a.seq_req(false).op(p::OP_FREE_STATEID, &p::FREE_STATEID4args { fsa_stateid: after }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_FREE_STATEID);
    // DELEGRETURN: we never delegate.
    let mut r = s.call(a.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_DELEGRETURN, &p::DELEGRETURN4args { deleg_stateid: sa }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_DELEGRETURN), p::NFS4ERR_BAD_STATEID);
}

#[test]
fn lease_expiry_frees_state() {
    let s = server_with(Config { grace_time_s: 0, lease_time_s: 5, ..Config::default() }, 64 << 20);
    let mut a = connect(&s, b"sleepy");
    let mut b = connect(&s, b"awake");
    // a holds the file open denying writes to others.
    let (_, fh) = open_create(&s, &mut b, b"creator", b"f", 1);
    let open = |c: &Client, access: u32, deny: u32, owner: &'static [u8]| p::OPEN4args {
        seqid: 0,
        share_access: access,
        share_deny: deny,
        owner: p::state_owner4 { clientid: c.clientid, owner },
        openhow: p::openflag4::default(p::OPEN4_NOCREATE),
        claim: p::open_claim4::CLAIM_FH,
    };
    let args = open(&a, 1, 2, b"denier");
    let mut r = s.call(a.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &args));
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let a_open = r.ok::<p::OPEN4resok>(p::OP_OPEN).stateid;
    let args = open(&b, 2, 0, b"writer");
    let mut r = s.call(b.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &args));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_SHARE_DENIED);
    // Time passes; b renews, a does not. Nothing expires before one lease.
    s.prog.advance_clock_ms(4_000);
    assert_eq!(s.call(b.seq_req(false)).status, p::NFS4_OK);
    assert_eq!(s.prog.reap_now(), 0);
    s.prog.advance_clock_ms(2_000);
    assert_eq!(s.prog.reap_now(), 1, "a's lease ran out");
    let mut r = s.call(a.seq_req(false));
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_BADSESSION);
    // a comes back as a new client: its old stateid is reported expired.
    let mut a2 = connect(&s, b"sleepy");
    assert_ne!(a2.clientid, a.clientid);
    let rd = p::READ4args { stateid: a_open, offset: 0, count: 1 };
    let mut r = s.call(a2.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_READ, &rd));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_READ), p::NFS4ERR_EXPIRED);
    // a's share reservation went with it: b may now open for writing.
    let args = open(&b, 2, 0, b"writer");
    let mut r = s.call(b.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &args));
    assert_eq!(r.status, p::NFS4_OK, "b's lease lives on and the deny is gone");
    let _ = r.next(p::OP_SEQUENCE);
}

#[test]
fn replay_cache_returns_the_cached_reply() {
    let s = server();
    let mut c = connect(&s, b"replay");
    let mkdir = p::CREATE4args {
        objtype: p::createtype4::NF4DIR,
        objname: b"dir",
        createattrs: p::fattr4 { attrmask: vec![], attr_vals: b"" },
    };
    let req = c.seq_req(true).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_CREATE, &mkdir).bytes();
    let first = s.call_raw(1, &req);
    assert_eq!(Reply::parse(first.clone()).status, p::NFS4_OK);
    // Executing again would say EXIST: the cache answers with the same bytes.
    let again = s.call_raw(1, &req);
    assert_eq!(again, first);
    // Not cached: a retransmission is refused.
    let req = c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).bytes();
    assert_eq!(Reply::parse(s.call_raw(1, &req)).status, p::NFS4_OK);
    let mut r = Reply::parse(s.call_raw(1, &req));
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_RETRY_UNCACHED_REP);
}

#[test]
fn bad_session_handle_and_stateid() {
    let s = server();
    let mut c = connect(&s, b"bad");
    let mut forged_session = c.session;
    forged_session[0] ^= 0xff;
    let seq = p::SEQUENCE4args { sa_sessionid: forged_session, sa_sequenceid: 1, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false };
    let mut r = s.call(Req::new(1).op(p::OP_SEQUENCE, &seq));
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_BADSESSION);
    // Forged handle bytes.
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(b"not a handle at all")));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_PUTFH), p::NFS4ERR_BADHANDLE);
    // A handle to a removed file is stale.
    let (sid, fh) = open_create(&s, &mut c, b"o", b"gone", 3);
    let cl = p::CLOSE4args { seqid: 0, open_stateid: sid.clone() };
    let rm = p::REMOVE4args { target: b"gone" };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_CLOSE, &cl).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_REMOVE, &rm));
    assert_eq!(r.status, p::NFS4_OK);
    let _ = r.next(p::OP_SEQUENCE);
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_PUTFH), p::NFS4ERR_STALE);
    // Stateids: made up, from another server instance, and seqid from the future.
    let (sid, fh) = open_create(&s, &mut c, b"o", b"live", 3);
    let mut other = sid.other;
    other[11] ^= 0x55;
    let mut epoch = sid.other;
    epoch[0] ^= 0x55;
    for (bad, want) in [
        (p::stateid4 { seqid: 1, other }, p::NFS4ERR_BAD_STATEID),
        (p::stateid4 { seqid: 1, other: epoch }, p::NFS4ERR_STALE_STATEID),
        (p::stateid4 { seqid: sid.seqid + 1, other: sid.other }, p::NFS4ERR_BAD_STATEID),
    ] {
        let rd = p::READ4args { stateid: bad, offset: 0, count: 1 };
        let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_READ, &rd));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTFH);
        assert_eq!(r.next(p::OP_READ), want);
    }
    // No current filehandle.
    let mut r = s.call(c.seq_req(false).raw(p::OP_GETFH as u32, &[]));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_GETFH), p::NFS4ERR_NOFILEHANDLE);
}

#[test]
fn quota_and_space_errors() {
    // A small backend: writing past it is NOSPC.
    let s = server_with(Config { grace_time_s: 0, ..Config::default() }, 256 * 1024);
    let mut c = connect(&s, b"space");
    let (sid, fh) = open_create(&s, &mut c, b"o", b"big", 3);
    let chunk = vec![1u8; 128 * 1024];
    let mut last = p::NFS4_OK;
    for i in 0..4u64 {
        let w = p::WRITE4args { stateid: sid.clone(), offset: i * chunk.len() as u64, stable: p::stable_how4::FILE_SYNC4, data: &chunk };
        let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_WRITE, &w));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTFH);
        last = r.next(p::OP_WRITE);
        if last != p::NFS4_OK {
            break;
        }
    }
    assert_eq!(last, p::NFS4ERR_NOSPC);
    // A volume (quota root) of 64 KiB inside a large backend: DQUOT.
    let s = server();
    let mut c = connect(&s, b"quota");
    let mkdir = p::CREATE4args {
        objtype: p::createtype4::NF4DIR,
        objname: b"vol",
        createattrs: p::fattr4 { attrmask: vec![], attr_vals: b"" },
    };
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_CREATE, &mkdir).raw(p::OP_GETFH as u32, &[]));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    r.ok::<p::CREATE4resok>(p::OP_CREATE);
    let vol: p::GETFH4resok = r.ok(p::OP_GETFH);
    let vol_fh = vfs::FileHandle::from_bytes(vol.object).unwrap();
    s.fs.set_quota(&vol_fh, 64 * 1024).unwrap();
    let (mask, vals) = fattr_mode(0o644);
    let open = p::OPEN4args {
        seqid: 0,
        share_access: 3,
        share_deny: 0,
        owner: p::state_owner4 { clientid: c.clientid, owner: b"q" },
        openhow: p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 { attrmask: mask, attr_vals: &vals })),
        claim: p::open_claim4::CLAIM_NULL(b"file"),
    };
    let w = p::WRITE4args { stateid: p::stateid4 { seqid: 1, other: [0; 12] }, offset: 0, stable: p::stable_how4::FILE_SYNC4, data: &chunk };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&vol_fh.to_bytes())).op(p::OP_OPEN, &open).op(p::OP_WRITE, &w));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    r.ok::<p::OPEN4resok>(p::OP_OPEN);
    assert_eq!(r.next(p::OP_WRITE), p::NFS4ERR_DQUOT);
    // Space attributes report the volume's capacity.
    let ga = p::GETATTR4args { attr_request: crate::attrs::Bitmap::of(&[crate::attrs::SPACE_TOTAL]).to_vec() };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&vol_fh.to_bytes())).op(p::OP_GETATTR, &ga));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let g: p::GETATTR4resok = r.ok(p::OP_GETATTR);
    assert_eq!(Decoder::new(g.obj_attributes.attr_vals).u64().unwrap(), 64 * 1024);
}

#[test]
fn grace_period_only_reclaims() {
    let s = server_with(Config { grace_time_s: 10, ..Config::default() }, 64 << 20);
    // What the admin API shows (a rolling restart waits for 0).
    let grace = s.prog.grace_probe();
    assert!((9_000..=10_000).contains(&grace()), "grace left at start: {} ms", grace());
    // Lay a file out directly in the backend (it existed "before the restart").
    let root = s.fs.root(EXPORT).unwrap();
    let (fh, _) = s.fs.create(&root, b"old", vfs::NodeKind::File, 0o644, &vfs::Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
    let fh = fh.to_bytes();
    let x = exchange_id(&s, b"reclaimer");
    let args = p::CREATE_SESSION4args {
        csa_clientid: x.eir_clientid,
        csa_sequence: x.eir_sequenceid,
        csa_flags: 0,
        csa_fore_chan_attrs: chan(16, 4),
        csa_back_chan_attrs: chan(2, 1),
        csa_cb_program: 0,
        csa_sec_parms: vec![],
    };
    let mut r = s.call(Req::new(1).op(p::OP_CREATE_SESSION, &args));
    let cs: p::CREATE_SESSION4resok = r.ok(p::OP_CREATE_SESSION);
    let mut c = Client { clientid: x.eir_clientid, session: cs.csr_sessionid, seq: 0 };
    let open = |claim: p::open_claim4<'static>, clientid: u64| p::OPEN4args {
        seqid: 0,
        share_access: 1,
        share_deny: 0,
        owner: p::state_owner4 { clientid, owner: b"o" },
        openhow: p::openflag4::default(p::OPEN4_NOCREATE),
        claim,
    };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &open(p::open_claim4::CLAIM_FH, c.clientid)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_GRACE);
    let prev = || p::open_claim4::CLAIM_PREVIOUS(p::open_delegation_type4::OPEN_DELEGATE_NONE);
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &open(prev(), c.clientid)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    r.ok::<p::OPEN4resok>(p::OP_OPEN);
    s.prog.advance_clock_ms(11_000);
    assert_eq!(grace(), 0, "grace over");
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &open(prev(), c.clientid)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_NO_GRACE);
    // Grace is over, but this client has not sent RECLAIM_COMPLETE yet:
    // still NFS4ERR_GRACE (RFC 8881 §18.51.3); after it, the open works.
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &open(p::open_claim4::CLAIM_FH, c.clientid)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_GRACE);
    let mut r = s.call(c.seq_req(false).op(p::OP_RECLAIM_COMPLETE, &p::RECLAIM_COMPLETE4args { rca_one_fs: false }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_RECLAIM_COMPLETE);
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &open(p::open_claim4::CLAIM_FH, c.clientid)));
    assert_eq!(r.status, p::NFS4_OK);
    let _ = r.next(p::OP_SEQUENCE);
}

#[test]
fn namespace_ops_and_getattr_on_root() {
    let s = server();
    let mut c = connect(&s, b"ns");
    // SECINFO_NO_NAME, PUTROOTFH, GETATTR with every supported attribute.
    let all = p::GETATTR4args { attr_request: crate::attrs::SUPPORTED.to_vec() };
    let mut r = s.call(
        c.seq_req(false)
            .raw(p::OP_PUTROOTFH as u32, &[])
            .op(p::OP_SECINFO_NO_NAME, &p::secinfo_style4::SECINFO_STYLE4_CURRENT_FH)
            .raw(p::OP_PUTROOTFH as u32, &[])
            .op(p::OP_GETATTR, &all),
    );
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_SECINFO_NO_NAME), p::NFS4_OK);
    let mut d = r.body();
    assert_eq!((d.u32().unwrap(), d.u32().unwrap(), d.u32().unwrap()), (2, 1, 0), "AUTH_SYS, AUTH_NONE");
    r.pos += d.position();
    r.ok0(p::OP_PUTROOTFH);
    let g: p::GETATTR4resok = r.ok(p::OP_GETATTR);
    let mut v = Decoder::new(g.obj_attributes.attr_vals);
    let (supported, _) = crate::attrs::Bitmap::decode(&mut v).unwrap();
    assert_eq!(supported, crate::attrs::SUPPORTED);
    assert_eq!(v.u32().unwrap(), 2, "type NF4DIR");
    // mkdir, symlink, rename, link, readdir, lookup, lookupp, readlink, remove.
    let mkdir = p::CREATE4args { objtype: p::createtype4::NF4DIR, objname: b"d", createattrs: p::fattr4 { attrmask: vec![], attr_vals: b"" } };
    let link = p::CREATE4args { objtype: p::createtype4::NF4LNK(b"target"), objname: b"l", createattrs: p::fattr4 { attrmask: vec![], attr_vals: b"" } };
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_CREATE, &mkdir).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_CREATE, &link).raw(p::OP_READLINK as u32, &[]));
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    r.ok::<p::CREATE4resok>(p::OP_CREATE);
    r.ok0(p::OP_PUTROOTFH);
    r.ok::<p::CREATE4resok>(p::OP_CREATE);
    let rl: p::READLINK4resok = r.ok(p::OP_READLINK);
    assert_eq!(rl.link, b"target");
    let (_, f1) = open_create(&s, &mut c, b"o", b"f1", 3);
    let rn = p::RENAME4args { oldname: b"f1", newname: b"f2" };
    let ln = p::LINK4args { newname: b"hard" };
    let mut r = s.call(
        c.seq_req(false)
            .raw(p::OP_PUTROOTFH as u32, &[])
            .raw(p::OP_SAVEFH as u32, &[])
            .op(p::OP_RENAME, &rn)
            .op(p::OP_PUTFH, &putfh(&f1))
            .raw(p::OP_SAVEFH as u32, &[])
            .raw(p::OP_PUTROOTFH as u32, &[])
            .op(p::OP_LOOKUP, &p::LOOKUP4args { objname: b"d" })
            .op(p::OP_LINK, &ln),
    );
    assert_eq!(r.status, p::NFS4_OK, "rename + link");
    let _ = r.next(p::OP_SEQUENCE);
    // READDIR of the root with a tiny maxcount resumes by cookie.
    let mut names = Vec::new();
    let mut cookie = 0u64;
    let mut verf = [0u8; 8];
    for _round in 0..10 {
        let rd = p::READDIR4args {
            cookie,
            cookieverf: verf,
            dircount: 100,
            maxcount: 120,
            attr_request: crate::attrs::Bitmap::of(&[crate::attrs::FILEID]).to_vec(),
        };
        let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_READDIR, &rd));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        assert_eq!(r.next(p::OP_READDIR), p::NFS4_OK);
        let mut d = r.body();
        verf = d.opaque_fixed::<8>().unwrap();
        while d.bool().unwrap() {
            cookie = d.u64().unwrap();
            assert!(cookie > 2, "reserved cookies never handed out");
            names.push(d.opaque_var(255).unwrap().to_vec());
            let (_, _) = crate::attrs::Bitmap::decode(&mut d).unwrap();
            d.opaque_var(1024).unwrap();
        }
        if d.bool().unwrap() {
            break;
        }
    }
    names.sort();
    assert_eq!(names, vec![b"d".to_vec(), b"f2".to_vec(), b"l".to_vec()]);
    // LOOKUP of what moved, LOOKUPP back, and the root has no parent.
    let mut r = s.call(
        c.seq_req(false)
            .raw(p::OP_PUTROOTFH as u32, &[])
            .op(p::OP_LOOKUP, &p::LOOKUP4args { objname: b"d" })
            .op(p::OP_LOOKUP, &p::LOOKUP4args { objname: b"hard" })
            .raw(p::OP_GETFH as u32, &[]),
    );
    assert_eq!(r.status, p::NFS4_OK);
    let _ = r.next(p::OP_SEQUENCE);
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).raw(p::OP_LOOKUPP as u32, &[]));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_LOOKUPP), p::NFS4ERR_NOENT);
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_LOOKUP, &p::LOOKUP4args { objname: b"f1" }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_LOOKUP), p::NFS4ERR_NOENT);
    // Hostile names.
    for (name, want) in [(&b""[..], p::NFS4ERR_INVAL), (b"a/b", p::NFS4ERR_BADCHAR), (b"..", p::NFS4ERR_BADNAME), (&[0xff, 0xfe][..], p::NFS4ERR_INVAL)] {
        let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_LOOKUP, &p::LOOKUP4args { objname: name }));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        assert_eq!(r.next(p::OP_LOOKUP), want, "name {name:?}");
    }
    // SETATTR: numeric owner accepted, names refused, read-only attribute refused.
    let (mask, vals) = (crate::attrs::Bitmap::of(&[crate::attrs::OWNER]).to_vec(), {
        let mut v = vec![0, 0, 0, 4];
        v.extend_from_slice(b"1234");
        v
    });
    let sa = p::SETATTR4args { stateid: stateid0(), obj_attributes: p::fattr4 { attrmask: mask.clone(), attr_vals: &vals } };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&f1)).op(p::OP_SETATTR, &sa));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_SETATTR), p::NFS4_OK);
    assert_eq!(s.fs.getattr(&vfs::FileHandle::from_bytes(&f1).unwrap()).unwrap().uid, 1234);
    let mut named = vec![0, 0, 0, 5];
    named.extend_from_slice(b"alice\0\0\0");
    let sa = p::SETATTR4args { stateid: stateid0(), obj_attributes: p::fattr4 { attrmask: mask, attr_vals: &named } };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&f1)).op(p::OP_SETATTR, &sa));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_SETATTR), p::NFS4ERR_BADOWNER);
    assert_eq!(r.body().u32().unwrap(), 0, "attrsset present even on error");
}

/// What a Linux 6.1 mount sends, over the router's namespace: EXCHANGE_ID
/// with an implementation id and the MOVED/BIND_PRINC flags, CREATE_SESSION
/// with an AUTH_SYS back-channel credential and 64 slots, RECLAIM_COMPLETE,
/// SECINFO_NO_NAME, PUTROOTFH + GETATTR with a three-word bitmap naming
/// attributes we lack, LOOKUP into an export (a new fsid), then file I/O.
#[test]
fn linux_like_mount_over_router() {
    let fs = Arc::new(MemFs::new(MemFsConfig { export_id: 7, capacity_bytes: 64 << 20 }));
    let router = vfs::router::Router::new(vec![vfs::router::Mount {
        name: b"share".to_vec(),
        export_id: 7,
        backend: fs.clone(),
    }])
    .unwrap();
    let s = Server {
        prog: Nfs4Program::new_without_reaper(Arc::new(router), Config { grace_time_s: 0, ..Config::default() }),
        fs,
    };
    let impl_id = p::nfs_impl_id4 {
        nii_domain: b"kernel.org",
        nii_name: b"Linux 6.1.0 #1 SMP x86_64",
        nii_date: p::nfstime4 { seconds: 0, nseconds: 0 },
    };
    let args = p::EXCHANGE_ID4args {
        eia_clientowner: p::client_owner4 { co_verifier: [3; 8], co_ownerid: b"Linux NFSv4.1 guest" },
        eia_flags: (p::EXCHGID4_FLAG_SUPP_MOVED_REFER | p::EXCHGID4_FLAG_SUPP_MOVED_MIGR | p::EXCHGID4_FLAG_BIND_PRINC_STATEID),
        eia_state_protect: p::state_protect4_a::SP4_NONE,
        eia_client_impl_id: vec![impl_id],
    };
    let mut r = s.call(Req::new(1).op(p::OP_EXCHANGE_ID, &args));
    let x: p::EXCHANGE_ID4resok = r.ok(p::OP_EXCHANGE_ID);
    assert_ne!(x.eir_flags & p::EXCHGID4_FLAG_MASK_PNFS, 0, "a pNFS role is always stated");
    let (clientid, sequence) = (x.eir_clientid, x.eir_sequenceid);
    let fore = p::channel_attrs4 {
        ca_headerpadsize: 0,
        ca_maxrequestsize: 1_049_620,
        ca_maxresponsesize: 1_049_480,
        ca_maxresponsesize_cached: 7584,
        ca_maxoperations: 8,
        ca_maxrequests: 64,
        ca_rdma_ird: vec![],
    };
    let back = p::channel_attrs4 {
        ca_headerpadsize: 0,
        ca_maxrequestsize: 4096,
        ca_maxresponsesize: 4096,
        ca_maxresponsesize_cached: 0,
        ca_maxoperations: 2,
        ca_maxrequests: 1,
        ca_rdma_ird: vec![],
    };
    let cred = proto::rpc::authsys_parms { stamp: 0, machinename: b"guest", uid: 0, gid: 0, gids: vec![] };
    let cs = p::CREATE_SESSION4args {
        csa_clientid: clientid,
        csa_sequence: sequence,
        csa_flags: (p::CREATE_SESSION4_FLAG_PERSIST | p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN),
        csa_fore_chan_attrs: fore,
        csa_back_chan_attrs: back.clone(),
        csa_cb_program: 0x4000_0000,
        csa_sec_parms: vec![p::callback_sec_parms4::AUTH_SYS(cred)],
    };
    let mut r = s.call(Req::new(1).op(p::OP_CREATE_SESSION, &cs));
    let got: p::CREATE_SESSION4resok = r.ok(p::OP_CREATE_SESSION);
    // What Linux verifies: fore ops >= asked, responses no larger; back
    // channel ops/requests echoed, sizes not smaller.
    assert_eq!(got.csr_fore_chan_attrs.ca_maxoperations, 8);
    assert!(got.csr_fore_chan_attrs.ca_maxresponsesize <= 1_049_480);
    assert_eq!(got.csr_fore_chan_attrs.ca_maxrequests, 64);
    assert_eq!(got.csr_back_chan_attrs.ca_maxoperations, back.ca_maxoperations);
    assert_eq!(got.csr_back_chan_attrs.ca_maxrequests, back.ca_maxrequests);
    assert_eq!(got.csr_back_chan_attrs.ca_maxresponsesize, back.ca_maxresponsesize);
    assert_eq!(got.csr_flags, p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN, "no persistence claimed");
    let mut c = Client { clientid, session: got.csr_sessionid, seq: 0 };
    let mut r = s.call(c.seq_req(true).op(p::OP_RECLAIM_COMPLETE, &p::RECLAIM_COMPLETE4args { rca_one_fs: false }));
    assert_eq!(r.status, p::NFS4_OK);
    let _ = r.next(p::OP_SEQUENCE);
    // PUTROOTFH + GETATTR: type, fsid, fileid, plus bits we do not have
    // (acl 12, fs_locations 24, word 2 bits 80..95 but xattr_support 82).
    let ask = |extra: &[u32]| {
        let mut b = crate::attrs::Bitmap::of(&[crate::attrs::TYPE, crate::attrs::FSID, crate::attrs::FILEID, 12, 24]);
        for a in extra {
            b.insert(*a);
        }
        b.0[2] |= 0xffff_0000 & !(1 << (crate::attrs::XATTR_SUPPORT - 64));
        p::GETATTR4args { attr_request: b.0.to_vec() }
    };
    let mut r = s.call(
        c.seq_req(false)
            .raw(p::OP_PUTROOTFH as u32, &[])
            .op(p::OP_SECINFO_NO_NAME, &p::secinfo_style4::SECINFO_STYLE4_CURRENT_FH)
            .raw(p::OP_PUTROOTFH as u32, &[])
            .op(p::OP_GETATTR, &ask(&[]))
            .op(p::OP_LOOKUP, &p::LOOKUP4args { objname: b"share" })
            .op(p::OP_GETATTR, &ask(&[crate::attrs::MOUNTED_ON_FILEID]))
            .raw(p::OP_GETFH as u32, &[]),
    );
    assert_eq!(r.status, p::NFS4_OK);
    assert_eq!(r.count, 8);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_SECINFO_NO_NAME), p::NFS4_OK);
    let mut d = r.body();
    for _ in 0..3 {
        d.u32().unwrap();
    }
    r.pos += d.position();
    r.ok0(p::OP_PUTROOTFH);
    let root_attrs = {
        let g: p::GETATTR4resok = r.ok(p::OP_GETATTR);
        assert_eq!(g.obj_attributes.attrmask, crate::attrs::Bitmap::of(&[crate::attrs::TYPE, crate::attrs::FSID, crate::attrs::FILEID]).to_vec());
        g.obj_attributes.attr_vals.to_vec()
    };
    r.ok0(p::OP_LOOKUP);
    let share_attrs = {
        let g: p::GETATTR4resok = r.ok(p::OP_GETATTR);
        g.obj_attributes.attr_vals.to_vec()
    };
    let fsid_of = |v: &[u8]| {
        let mut d = Decoder::new(v);
        assert_eq!(d.u32().unwrap(), 2, "a directory");
        (d.u64().unwrap(), d.u64().unwrap())
    };
    assert_ne!(fsid_of(&root_attrs), fsid_of(&share_attrs), "the export is its own file system");
    let share: p::GETFH4resok = r.ok(p::OP_GETFH);
    let share = share.object.to_vec();
    // File I/O inside the export.
    let (mask, vals) = fattr_mode(0o644);
    let open = p::OPEN4args {
        seqid: 0,
        share_access: 3 | 0x0400, // OPEN4_SHARE_ACCESS_WANT_NO_DELEG
        share_deny: 0,
        owner: p::state_owner4 { clientid, owner: b"open id:\0\0\0\x01" },
        openhow: p::openflag4::OPEN4_CREATE(p::createhow4::EXCLUSIVE4_1(p::creatverfattr {
            cva_verf: [9; 8],
            cva_attrs: p::fattr4 { attrmask: mask, attr_vals: &vals },
        })),
        claim: p::open_claim4::CLAIM_NULL(b"file"),
    };
    let cur = p::stateid4 { seqid: 1, other: [0; 12] };
    let w = p::WRITE4args { stateid: cur.clone(), offset: 0, stable: p::stable_how4::UNSTABLE4, data: b"through the router" };
    let rd = p::READ4args { stateid: cur.clone(), offset: 8, count: 100 };
    let mut r = s.call(
        c.seq_req(true)
            .op(p::OP_PUTFH, &putfh(&share))
            .op(p::OP_OPEN, &open)
            .op(p::OP_WRITE, &w)
            .op(p::OP_COMMIT, &p::COMMIT4args { offset: 0, count: 0 })
            .op(p::OP_READ, &rd)
            .op(p::OP_CLOSE, &p::CLOSE4args { seqid: 0, open_stateid: cur }),
    );
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let o: p::OPEN4resok = r.ok(p::OP_OPEN);
    assert_eq!(o.attrset, crate::attrs::Bitmap::of(&[crate::attrs::MODE]).to_vec());
    assert!(o.cinfo.after > o.cinfo.before, "directory changed");
    r.ok::<p::WRITE4resok>(p::OP_WRITE);
    r.ok::<p::COMMIT4resok>(p::OP_COMMIT);
    let data: p::READ4resok = r.ok(p::OP_READ);
    assert_eq!(data.data, b"the router");
    // READDIR of the pseudo-root lists the export.
    let rdir = p::READDIR4args { cookie: 0, cookieverf: [0; 8], dircount: 4096, maxcount: 8192, attr_request: vec![] };
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_READDIR, &rdir));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    let list: p::READDIR4resok = r.ok(p::OP_READDIR);
    let first = list.reply.entries.expect("one entry");
    assert_eq!(first.name, b"share");
    assert!(first.nextentry.is_none());
    assert!(list.reply.eof);
}

/// Hostile input: thousands of mutated and random COMPOUNDs (seeded, so a
/// failure reproduces) never panic, never make the server answer anything
/// but a well-formed COMPOUND4res or GARBAGE_ARGS, and leave it serving.
#[test]
fn hostile_compounds_are_answered_not_fatal() {
    let s = server();
    let mut c = connect(&s, b"fuzz");
    let (sid, fh) = open_create(&s, &mut c, b"o", b"target", 3);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let w = p::WRITE4args { stateid: sid.clone(), offset: 0, stable: p::stable_how4::UNSTABLE4, data: b"abc" };
    let mut answered = 0;
    for round in 0..3000u32 {
        let base = c
            .seq_req(round % 2 == 0)
            .op(p::OP_PUTFH, &putfh(&fh))
            .op(p::OP_WRITE, &w)
            .op(p::OP_GETATTR, &p::GETATTR4args { attr_request: vec![u32::MAX, u32::MAX, u32::MAX] })
            .bytes();
        let mut m = base.clone();
        match next() % 4 {
            0 => m.truncate((next() as usize) % m.len()),
            1 => {
                for _ in 0..1 + next() % 4 {
                    let i = (next() as usize) % m.len();
                    m[i] = next() as u8;
                }
            }
            2 => {
                // A length or count word replaced by something huge.
                let i = 4 * ((next() as usize) % (m.len() / 4));
                m[i..i + 4].copy_from_slice(&(0xffff_fff0u32 | next() as u32 & 0xf).to_be_bytes());
            }
            _ => m = (0..(next() % 200) as usize).map(|_| next() as u8).collect(),
        }
        let ctx = CallContext {
            xid: round,
            prog: p::NFS4_PROGRAM,
            vers: 4,
            proc_num: 1,
            auth: Auth::None,
            conn_id: 9,
            peer: "127.0.0.1:700".parse().unwrap(),
            core: 0,
            lend: None,
            park: None,
            resumed: None,
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut e = Encoder::new(&mut buf);
        match s.prog.call(&ctx, &m, &mut e) {
            Ok(()) => {
                let mut d = Decoder::new(e.written());
                d.i32().unwrap();
                d.opaque_var(crate::compound::TAG_BYTES_MAX).unwrap();
                d.u32().unwrap();
                answered += 1;
            }
            Err(rpc::CallError::GarbageArgs) => {}
            Err(other) => panic!("round {round}: unexpected {other:?}"),
        }
        // Mutations desynchronise our slot-0 sequence: resynchronise on the
        // server's view by probing the next seqid after each round.
        let probe = Reply::parse(s.call_raw(1, &c.seq_req(false).bytes()));
        if probe.status == p::NFS4ERR_SEQ_MISORDERED {
            c.seq += 1;
            let again = Reply::parse(s.call_raw(1, &c.seq_req(false).bytes()));
            assert!(again.status == p::NFS4_OK || again.status == p::NFS4ERR_SEQ_MISORDERED);
        }
    }
    assert!(answered > 1000, "most mutations still reach the COMPOUND loop ({answered})");
    // Still serving: a fresh client does I/O.
    let mut c2 = connect(&s, b"after");
    let (sid2, fh2) = open_create(&s, &mut c2, b"o", b"after", 3);
    let rd = p::READ4args { stateid: sid2, offset: 0, count: 10 };
    let mut r = s.call(c2.seq_req(false).op(p::OP_PUTFH, &putfh(&fh2)).op(p::OP_READ, &rd));
    assert_eq!(r.status, p::NFS4_OK);
    let _ = r.next(p::OP_SEQUENCE);
}

/// The remaining filehandle and open operations: ACCESS as root and as an
/// unprivileged user (who is also refused opens and chown), OPEN_DOWNGRADE,
/// SECINFO by name, PUTPUBFH, SAVEFH/RESTOREFH, LOOKUPP below the root,
/// EXCLUSIVE4_1 retries (same verifier: same file; another: EXIST), and a
/// device node through CREATE.
#[test]
fn access_downgrade_secinfo_and_exclusive_create() {
    let s = server();
    let mut c = connect(&s, b"misc");
    let (sid, fh) = open_create(&s, &mut c, b"o", b"f", 3);
    let acc = p::ACCESS4args { access: 0x3f };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_ACCESS, &acc));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let a: p::ACCESS4resok = r.ok(p::OP_ACCESS);
    assert_eq!((a.supported, a.access), (0x3f, 0x0d), "root on a 0644 file: READ, MODIFY, EXTEND");
    // uid 1000 is "other" on a root-owned 0644 file: read only.
    c.seq += 1;
    let seq = p::SEQUENCE4args { sa_sessionid: c.session, sa_sequenceid: c.seq, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false };
    let user = Auth::Sys { stamp: 0, machine_name: b"t", uid: 1000, gid: 1000, gids: &[] };
    let req = Req::new(1).op(p::OP_SEQUENCE, &seq).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_ACCESS, &acc).bytes();
    let mut r = Reply::parse(s.call_as(user, 1, &req));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let a: p::ACCESS4resok = r.ok(p::OP_ACCESS);
    assert_eq!(a.access, 0x01);
    c.seq += 1;
    let seq = p::SEQUENCE4args { sa_sessionid: c.session, sa_sequenceid: c.seq, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false };
    let open = p::OPEN4args {
        seqid: 0,
        share_access: 2,
        share_deny: 0,
        owner: p::state_owner4 { clientid: c.clientid, owner: b"user" },
        openhow: p::openflag4::default(p::OPEN4_NOCREATE),
        claim: p::open_claim4::CLAIM_NULL(b"f"),
    };
    let req = Req::new(1).op(p::OP_SEQUENCE, &seq).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &open).bytes();
    let mut r = Reply::parse(s.call_as(user, 1, &req));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_ACCESS, "no write permission");
    // OPEN_DOWNGRADE to read only; then an upgrade is not a downgrade.
    let dg = |sid: p::stateid4, access: u32| p::OPEN_DOWNGRADE4args { open_stateid: sid, seqid: 0, share_access: access, share_deny: 0 };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN_DOWNGRADE, &dg(sid.clone(), 1)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let down: p::stateid4 = r.ok(p::OP_OPEN_DOWNGRADE);
    assert_eq!((down.other, down.seqid), (sid.other, sid.seqid + 1));
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN_DOWNGRADE, &dg(down.clone(), 3)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_OPEN_DOWNGRADE), p::NFS4ERR_INVAL);
    let w = p::WRITE4args { stateid: down, offset: 0, stable: p::stable_how4::UNSTABLE4, data: b"x" };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_WRITE, &w));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_WRITE), p::NFS4ERR_OPENMODE, "downgraded open cannot write");
    // SECINFO consumes the current filehandle; PUTPUBFH, SAVEFH/RESTOREFH, LOOKUPP.
    let mkdir = p::CREATE4args { objtype: p::createtype4::NF4DIR, objname: b"sub", createattrs: p::fattr4 { attrmask: vec![], attr_vals: b"" } };
    let fifo = p::CREATE4args { objtype: p::createtype4::NF4FIFO, objname: b"pipe", createattrs: p::fattr4 { attrmask: vec![], attr_vals: b"" } };
    let mut r = s.call(
        c.seq_req(false)
            .raw(p::OP_PUTPUBFH as u32, &[])
            .raw(p::OP_SAVEFH as u32, &[])
            .op(p::OP_CREATE, &fifo)
            .raw(p::OP_RESTOREFH as u32, &[])
            .op(p::OP_CREATE, &mkdir)
            .raw(p::OP_LOOKUPP as u32, &[])
            .raw(p::OP_GETFH as u32, &[])
            .op(p::OP_SECINFO, &p::SECINFO4args { name: b"sub" })
            .raw(p::OP_GETFH as u32, &[]),
    );
    assert_eq!(r.status, p::NFS4ERR_NOFILEHANDLE, "SECINFO cleared the current filehandle");
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTPUBFH);
    r.ok0(p::OP_SAVEFH);
    r.ok::<p::CREATE4resok>(p::OP_CREATE);
    r.ok0(p::OP_RESTOREFH);
    r.ok::<p::CREATE4resok>(p::OP_CREATE);
    r.ok0(p::OP_LOOKUPP);
    let parent: p::GETFH4resok = r.ok(p::OP_GETFH);
    assert_eq!(parent.object, &s.fs.root(EXPORT).unwrap().to_bytes()[..], "LOOKUPP of sub is the root");
    assert_eq!(r.next(p::OP_SECINFO), p::NFS4_OK);
    let mut d = r.body();
    assert_eq!(d.u32().unwrap(), 2);
    // Exclusive create: a retry with the same verifier opens the same file.
    let clientid = c.clientid;
    let excl = |verf: [u8; 8]| p::OPEN4args {
        seqid: 0,
        share_access: 3,
        share_deny: 0,
        owner: p::state_owner4 { clientid, owner: b"excl" },
        openhow: p::openflag4::OPEN4_CREATE(p::createhow4::EXCLUSIVE4_1(p::creatverfattr {
            cva_verf: verf,
            cva_attrs: p::fattr4 { attrmask: vec![], attr_vals: b"" },
        })),
        claim: p::open_claim4::CLAIM_NULL(b"x"),
    };
    let mut handles = Vec::new();
    for _ in 0..2 {
        let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &excl([5; 8])).raw(p::OP_GETFH as u32, &[]));
        assert_eq!(r.status, p::NFS4_OK);
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        r.ok::<p::OPEN4resok>(p::OP_OPEN);
        let h: p::GETFH4resok = r.ok(p::OP_GETFH);
        handles.push(h.object.to_vec());
    }
    assert_eq!(handles[0], handles[1]);
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &excl([6; 8])));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_EXIST);
    // Opening a directory or a FIFO by name is refused by type.
    let named = |name: &'static [u8]| p::OPEN4args {
        seqid: 0,
        share_access: 1,
        share_deny: 0,
        owner: p::state_owner4 { clientid, owner: b"t" },
        openhow: p::openflag4::default(p::OPEN4_NOCREATE),
        claim: p::open_claim4::CLAIM_NULL(name),
    };
    for (name, want) in [(&b"sub"[..], p::NFS4ERR_ISDIR), (b"pipe", p::NFS4ERR_INVAL), (b"missing", p::NFS4ERR_NOENT)] {
        let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &named(name)));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        assert_eq!(r.next(p::OP_OPEN), want);
    }
}

/// Negotiated limits are enforced: a request larger than ca_maxrequestsize
/// fails SEQUENCE with REQ_TOO_BIG; the op that pushes the reply past
/// ca_maxresponsesize fails with REP_TOO_BIG, or REP_TOO_BIG_TO_CACHE when
/// the client asked for caching; a hostile config is refused by name.
#[test]
fn negotiated_sizes_are_enforced() {
    let s = server();
    let x = exchange_id(&s, b"small");
    let small = p::channel_attrs4 {
        ca_headerpadsize: 0,
        ca_maxrequestsize: 600,
        ca_maxresponsesize: 600,
        ca_maxresponsesize_cached: 200,
        ca_maxoperations: 8,
        ca_maxrequests: 1,
        ca_rdma_ird: vec![],
    };
    let args = p::CREATE_SESSION4args {
        csa_clientid: x.eir_clientid,
        csa_sequence: x.eir_sequenceid,
        csa_flags: 0,
        csa_fore_chan_attrs: small,
        csa_back_chan_attrs: chan(2, 1),
        csa_cb_program: 0,
        csa_sec_parms: vec![p::callback_sec_parms4::AUTH_NONE],
    };
    let mut r = s.call(Req::new(1).op(p::OP_CREATE_SESSION, &args));
    let cs: p::CREATE_SESSION4resok = r.ok(p::OP_CREATE_SESSION);
    assert_eq!(cs.csr_fore_chan_attrs.ca_maxresponsesize, 600);
    let mut c = Client { clientid: x.eir_clientid, session: cs.csr_sessionid, seq: 0 };
    let all = p::GETATTR4args { attr_request: crate::attrs::SUPPORTED.to_vec() };
    let req = |c: &mut Client, cache: bool| c.seq_req(cache).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_GETATTR, &all).op(p::OP_GETATTR, &all);
    let mut r = s.call(req(&mut c, false));
    assert_eq!(r.status, p::NFS4ERR_REP_TOO_BIG);
    assert_eq!(r.count, 4);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    r.ok::<p::GETATTR4resok>(p::OP_GETATTR);
    assert_eq!(r.next(p::OP_GETATTR), p::NFS4ERR_REP_TOO_BIG);
    let mut r = s.call(req(&mut c, true));
    assert_eq!(r.status, p::NFS4ERR_REP_TOO_BIG_TO_CACHE);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_GETATTR), p::NFS4ERR_REP_TOO_BIG_TO_CACHE);
    let w = p::WRITE4args { stateid: stateid0(), offset: 0, stable: p::stable_how4::UNSTABLE4, data: &[0; 700] };
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_WRITE, &w));
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_REQ_TOO_BIG);
    // The slot is still usable after all of that (none was left busy).
    c.seq -= 1;
    assert_eq!(s.call(c.seq_req(false)).status, p::NFS4_OK);
    // Config errors name the field.
    let bad = Config { ops_per_compound_max: 4, ..Config::default() };
    assert!(bad.check().unwrap_err().contains("ops_per_compound_max"));
    let bad = Config { response_bytes_max: 1 << 20, ..Config::default() };
    assert!(bad.check().unwrap_err().contains("response_bytes_max"));
    assert_eq!(Config::default().check(), Ok(()));
}

/// Through the RPC layer: registered with `rpc::Dispatcher`, a full ONC RPC
/// call record (AUTH_SYS) reaches COMPOUND and comes back as an accepted
/// reply; NULL answers empty; an unknown procedure is PROC_UNAVAIL.
#[test]
fn through_the_rpc_dispatcher() {
    let s = server();
    let prog: Arc<dyn Program> = Arc::new(s.prog);
    let mut disp = rpc::Dispatcher::new(rpc::Limits::default());
    disp.register(prog, "nfs4", &["null", "compound"]);
    let conn = rpc::ConnInfo { conn_id: 5, peer: "127.0.0.1:800".parse().unwrap(), core: 0 };
    let record = |proc_num: u32, args: &[u8]| {
        let mut r = Vec::new();
        for w in [0x1234u32, 0, 2, p::NFS4_PROGRAM, p::NFS_V4, proc_num, 1] {
            r.extend_from_slice(&w.to_be_bytes()); // xid, CALL, rpcvers, prog, vers, proc, AUTH_SYS
        }
        let cred: [u32; 6] = [0, 4, 0x6775_6573, 0, 0, 0]; // stamp, "gues", uid 0, gid 0, no gids
        r.extend_from_slice(&((cred.len() * 4) as u32).to_be_bytes());
        for w in cred {
            r.extend_from_slice(&w.to_be_bytes());
        }
        r.extend_from_slice(&[0; 8]); // verifier AUTH_NONE
        r.extend_from_slice(args);
        r
    };
    let mut out = vec![0u8; 1 << 20];
    let args = p::EXCHANGE_ID4args {
        eia_clientowner: p::client_owner4 { co_verifier: [1; 8], co_ownerid: b"rpc" },
        eia_flags: 0,
        eia_state_protect: p::state_protect4_a::SP4_NONE,
        eia_client_impl_id: vec![],
    };
    let rec = record(1, &Req::new(1).op(p::OP_EXCHANGE_ID, &args).bytes());
    let rpc::Outcome::Reply(n) = disp.handle(&conn, &rec, &mut out) else { panic!("no reply") };
    let mut d = Decoder::new(&out[4..n]);
    let head: Vec<u32> = (0..6).map(|_| d.u32().unwrap()).collect();
    assert_eq!(head, vec![0x1234, 1, 0, 0, 0, 0], "xid, REPLY, MSG_ACCEPTED, null verifier, SUCCESS");
    let mut r = Reply::parse(d.rest().to_vec());
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::EXCHANGE_ID4resok>(p::OP_EXCHANGE_ID);
    let rpc::Outcome::Reply(n) = disp.handle(&conn, &record(0, &[]), &mut out) else { panic!() };
    assert_eq!(n, 4 + 24, "NULL: header only");
    let rpc::Outcome::Reply(n) = disp.handle(&conn, &record(7, &[]), &mut out) else { panic!() };
    assert_eq!(u32::from_be_bytes(out[n - 4..n].try_into().unwrap()), 3, "PROC_UNAVAIL");
}

/// The background reaper (started by `Nfs4Program::new`) expires a silent
/// client on its own within a bounded time, and dropping the program stops
/// it (the drop joins the thread, so this test would hang otherwise).
#[test]
fn background_reaper_expires_silent_clients() {
    let fs = Arc::new(MemFs::new(MemFsConfig { export_id: EXPORT, capacity_bytes: 1 << 20 }));
    let prog = Nfs4Program::new(fs.clone(), Config { root_export: EXPORT, grace_time_s: 0, lease_time_s: 1, ..Config::default() });
    let s = Server { prog, fs };
    connect(&s, b"silent");
    assert_eq!(s.prog.state().client_count(), 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.prog.state().client_count() != 0 {
        assert!(std::time::Instant::now() < deadline, "reaper did not expire the client within 10 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(s);
}

// ---- RFC 8881 conformance: owners, sessions, EXCHANGE_ID, reclaim first ----

fn sys(uid: u32) -> Auth<'static> {
    Auth::Sys { stamp: 0, machine_name: b"t", uid, gid: uid, gids: &[] }
}

/// EXCHANGE_ID as `uid`: its status and, when OK, (clientid, sequence, flags).
fn exchange_as(s: &Server, uid: u32, owner: &[u8], verifier: u8, flags: u32) -> (i32, u64, u32, u32) {
    let args = p::EXCHANGE_ID4args {
        eia_clientowner: p::client_owner4 { co_verifier: [verifier; 8], co_ownerid: owner },
        eia_flags: flags,
        eia_state_protect: p::state_protect4_a::SP4_NONE,
        eia_client_impl_id: vec![],
    };
    let mut r = Reply::parse(s.call_as(sys(uid), 1, &Req::new(1).op(p::OP_EXCHANGE_ID, &args).bytes()));
    let st = r.next(p::OP_EXCHANGE_ID);
    assert_eq!(st, r.status);
    if st != p::NFS4_OK {
        return (st, 0, 0, 0);
    }
    let x = p::EXCHANGE_ID4resok::decode(&mut r.body()).unwrap();
    (st, x.eir_clientid, x.eir_sequenceid, x.eir_flags)
}

/// CREATE_SESSION as `uid`: its status and, when OK, the session id and
/// the negotiated fore channel.
fn create_session_as(
    s: &Server,
    uid: u32,
    clientid: u64,
    sequence: u32,
    flags: u32,
    fore: p::channel_attrs4,
    back: p::channel_attrs4,
) -> (i32, Option<([u8; 16], p::channel_attrs4)>) {
    let args = p::CREATE_SESSION4args {
        csa_clientid: clientid,
        csa_sequence: sequence,
        csa_flags: flags,
        csa_fore_chan_attrs: fore,
        csa_back_chan_attrs: back,
        csa_cb_program: 0x4000_0000,
        csa_sec_parms: vec![p::callback_sec_parms4::AUTH_NONE],
    };
    let mut r = Reply::parse(s.call_as(sys(uid), 1, &Req::new(1).op(p::OP_CREATE_SESSION, &args).bytes()));
    let st = r.next(p::OP_CREATE_SESSION);
    if st != p::NFS4_OK {
        return (st, None);
    }
    let cs = p::CREATE_SESSION4resok::decode(&mut r.body()).unwrap();
    (st, Some((cs.csr_sessionid, cs.csr_fore_chan_attrs)))
}

/// A confirmed client (uid 0) that has not sent RECLAIM_COMPLETE.
fn session_only(s: &Server, owner: &[u8], verifier: u8) -> Client {
    let (st, clientid, seq, _) = exchange_as(s, 0, owner, verifier, 0);
    assert_eq!(st, p::NFS4_OK);
    let (st, cs) = create_session_as(s, 0, clientid, seq, 0, chan(16, 8), chan(2, 1));
    assert_eq!(st, p::NFS4_OK);
    Client { clientid, session: cs.unwrap().0, seq: 0 }
}

fn reclaim_complete(s: &Server, c: &mut Client) -> i32 {
    let mut r = s.call(c.seq_req(false).op(p::OP_RECLAIM_COMPLETE, &p::RECLAIM_COMPLETE4args { rca_one_fs: false }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.next(p::OP_RECLAIM_COMPLETE)
}

fn open_args<'a>(clientid: u64, owner: &'a [u8], name: &'a [u8], access: u32, deny: u32) -> p::OPEN4args<'a> {
    p::OPEN4args {
        seqid: 0,
        share_access: access,
        share_deny: deny,
        owner: p::state_owner4 { clientid, owner },
        openhow: p::openflag4::default(p::OPEN4_NOCREATE),
        claim: p::open_claim4::CLAIM_NULL(name),
    }
}

fn new_lock<'a>(sid: &p::stateid4, clientid: u64, owner: &'a [u8], offset: u64, reclaim: bool) -> p::LOCK4args<'a> {
    p::LOCK4args {
        locktype: p::nfs_lock_type4::WRITE_LT,
        reclaim,
        offset,
        length: 10,
        locker: p::locker4::TRUE(p::open_to_lock_owner4 {
            open_seqid: 0,
            open_stateid: sid.clone(),
            lock_seqid: 0,
            lock_owner: p::state_owner4 { clientid, owner },
        }),
    }
}

/// Item 1 of issue 17: the clientid inside open_owner4 / lock_owner4 is
/// ignored in minor version 1 (RFC 8881 §18.16.3, §18.10.3, §18.11.3): a
/// client sending 0 there (as independent clients do) opens and locks; a
/// client naming another client's ID there still acts only as itself.
#[test]
fn owner_clientid_is_ignored_rfc8881_18_16_3() {
    let s = server();
    let mut a = connect(&s, b"owner-a");
    let mut b = connect(&s, b"owner-b");
    open_create(&s, &mut a, b"setup", b"shared", 3);
    // a opens with clientid 0 in its open-owner, read+write, denying nothing.
    let mut r = s.call(a.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &open_args(0, b"oa", b"shared", 3, 0)).raw(p::OP_GETFH as u32, &[]));
    assert_eq!(r.status, p::NFS4_OK, "OPEN with owner clientid 0");
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    let sa = r.ok::<p::OPEN4resok>(p::OP_OPEN).stateid.clone();
    let fh = r.ok::<p::GETFH4resok>(p::OP_GETFH).object.to_vec();
    // LOCK for a new lock-owner with clientid 0 (and one with garbage).
    for (owner, cid, off) in [(&b"la"[..], 0u64, 0u64), (b"lz", u64::MAX, 100)] {
        let mut r = s.call(a.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCK, &new_lock(&sa, cid, owner, off, false)));
        assert_eq!(r.status, p::NFS4_OK, "LOCK with lock-owner clientid {cid:#x}");
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTFH);
        r.ok::<p::LOCK4resok>(p::OP_LOCK);
    }
    // LOCKT: "la" of this client is ours whatever clientid is written;
    // another owner of ours conflicts.
    let lockt = |clientid: u64, owner: &'static [u8]| p::LOCKT4args {
        locktype: p::nfs_lock_type4::WRITE_LT,
        offset: 0,
        length: 5,
        owner: p::state_owner4 { clientid, owner },
    };
    let mut r = s.call(
        a.seq_req(false)
            .op(p::OP_PUTFH, &putfh(&fh))
            .op(p::OP_LOCKT, &lockt(0, b"la"))
            .op(p::OP_LOCKT, &lockt(b.clientid, b"la"))
            .op(p::OP_LOCKT, &lockt(0, b"other")),
    );
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    r.ok0(p::OP_LOCKT);
    r.ok0(p::OP_LOCKT);
    assert_eq!(r.next(p::OP_LOCKT), p::NFS4ERR_DENIED);
    let denied = p::LOCK4denied::decode(&mut r.body()).unwrap();
    assert_eq!((denied.owner.clientid, denied.owner.owner), (a.clientid, &b"la"[..]), "the denial names the real client");
    // Hostile: b writes a's client ID and a's owner names. LOCKT still
    // tests as b (a's lock conflicts) ...
    let mut r = s.call(b.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCKT, &lockt(a.clientid, b"la")));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_LOCKT), p::NFS4ERR_DENIED);
    // ... and OPEN is b's own open, not an upgrade of a's: denying WRITE
    // conflicts with a's write access.
    let mut r = s.call(b.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &open_args(a.clientid, b"oa", b"shared", 1, 2)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_SHARE_DENIED);
    // b cannot use a's open stateid for a lock either.
    let mut r = s.call(b.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCK, &new_lock(&sa, a.clientid, b"la", 200, false)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_LOCK), p::NFS4ERR_BAD_STATEID);
    s.prog.state().assert_invariants();
}

fn chan_sized(request: u32, response: u32, cached: u32, ops: u32) -> p::channel_attrs4 {
    p::channel_attrs4 {
        ca_headerpadsize: 0,
        ca_maxrequestsize: request,
        ca_maxresponsesize: response,
        ca_maxresponsesize_cached: cached,
        ca_maxoperations: ops,
        ca_maxrequests: 1,
        ca_rdma_ird: vec![],
    }
}

/// Item 3 of issue 17: CREATE_SESSION (RFC 8881 §18.36) answers
/// NFS4ERR_CLID_INUSE to a principal other than the EXCHANGE_ID's before
/// confirmation (without using up the owner's sequence), NFS4ERR_INVAL for
/// undefined csa_flags, NFS4ERR_TOOSMALL for channels that cannot carry any
/// request, accepts small workable sizes; a failed CREATE_SESSION leaves no
/// session and no reserved replay cache, and its result is what a
/// retransmission gets (§18.36.4). On the session, SEQUENCE (§18.46,
/// §2.10.6.4) enforces the negotiated sizes: REQ_TOO_BIG, REP_TOO_BIG,
/// REP_TOO_BIG_TO_CACHE with sa_cachethis, REP_TOO_BIG past the full size.
#[test]
fn create_session_checks_rfc8881_18_36() {
    let s = server();
    let (st, id, seq, _) = exchange_as(&s, 0, b"sizes", 1, 0);
    assert_eq!(st, p::NFS4_OK);
    let cache_before = s.prog.state().reply_cache_bytes();
    let ok_back = chan(2, 1);
    // Another principal, before confirmation: CLID_INUSE, not consuming seq.
    assert_eq!(create_session_as(&s, 1000, id, seq, 0, chan(16, 8), ok_back.clone()).0, p::NFS4ERR_CLID_INUSE);
    // Undefined flag bits: INVAL; the retransmission gets the cached INVAL.
    assert_eq!(create_session_as(&s, 0, id, seq, 0x8, chan(16, 8), ok_back.clone()).0, p::NFS4ERR_INVAL);
    assert_eq!(create_session_as(&s, 0, id, seq, 0x8, chan(16, 8), ok_back.clone()).0, p::NFS4ERR_INVAL);
    assert_eq!(create_session_as(&s, 0, id, seq + 5, 0, chan(16, 8), ok_back.clone()).0, p::NFS4ERR_SEQ_MISORDERED);
    // Channels that cannot carry a single request.
    let mut n = seq;
    for (fore, back) in [
        (chan_sized(20, 1 << 20, 4096, 16), ok_back.clone()),
        (chan_sized(1 << 20, 20, 4096, 16), ok_back.clone()),
        (chan_sized(1 << 20, 1 << 20, 4096, 0), ok_back.clone()),
        (chan(16, 8), chan_sized(10, 4096, 0, 1)),
        (chan(16, 8), chan_sized(4096, 10, 0, 1)),
        (chan(16, 8), chan_sized(4096, 4096, 0, 0)),
    ] {
        n += 1;
        assert_eq!(create_session_as(&s, 0, id, n, 0, fore, back).0, p::NFS4ERR_TOOSMALL, "sequence {n}");
    }
    // Nothing was reserved by any of that, and the client is still
    // unconfirmed (EXCHANGE_ID does not say CONFIRMED_R).
    assert_eq!(s.prog.state().session_count(), 0);
    assert_eq!(s.prog.state().reply_cache_bytes(), cache_before);
    s.prog.state().assert_invariants();
    // Small but workable: 400-byte requests and replies, 200 cached.
    n += 1;
    let (st, cs) = create_session_as(&s, 0, id, n, 0, chan_sized(400, 400, 200, 16), ok_back.clone());
    assert_eq!(st, p::NFS4_OK, "400-byte channel sizes are accepted");
    let (session, fore) = cs.unwrap();
    assert_eq!((fore.ca_maxrequestsize, fore.ca_maxresponsesize, fore.ca_maxresponsesize_cached), (400, 400, 200));
    let mut c = Client { clientid: id, session, seq: 0 };
    assert_eq!(reclaim_complete(&s, &mut c), p::NFS4_OK);
    let size = p::GETATTR4args { attr_request: crate::attrs::Bitmap::of(&[crate::attrs::SIZE]).to_vec() };
    let all = p::GETATTR4args { attr_request: crate::attrs::SUPPORTED.to_vec() };
    let sizes = |c: &mut Client, cache: bool, n: usize| {
        let mut req = c.seq_req(cache).raw(p::OP_PUTROOTFH as u32, &[]);
        for _ in 0..n {
            req = req.op(p::OP_GETATTR, &size);
        }
        req
    };
    // Fits: ~100 bytes of reply, under the cache size too.
    let r = s.call(sizes(&mut c, true, 1));
    assert_eq!(r.status, p::NFS4_OK);
    // Over ca_maxresponsesize_cached (200 with the RPC header), under 400:
    // REP_TOO_BIG_TO_CACHE with sa_cachethis, fine without.
    let mut r = s.call(sizes(&mut c, true, 4));
    assert_eq!((r.status, r.count), (p::NFS4ERR_REP_TOO_BIG_TO_CACHE, 6));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    for _ in 0..3 {
        r.ok::<p::GETATTR4resok>(p::OP_GETATTR);
    }
    assert_eq!(r.next(p::OP_GETATTR), p::NFS4ERR_REP_TOO_BIG_TO_CACHE);
    assert_eq!(s.call(sizes(&mut c, false, 4)).status, p::NFS4_OK);
    // Over ca_maxresponsesize: REP_TOO_BIG, with or without sa_cachethis.
    for cache in [false, true] {
        let mut r = s.call(c.seq_req(cache).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_GETATTR, &all));
        assert_eq!((r.status, r.count), (p::NFS4ERR_REP_TOO_BIG, 3), "cachethis {cache}");
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        assert_eq!(r.next(p::OP_GETATTR), p::NFS4ERR_REP_TOO_BIG);
    }
    // A request over ca_maxrequestsize (RPC header included): REQ_TOO_BIG.
    let w = p::WRITE4args { stateid: stateid0(), offset: 0, stable: p::stable_how4::UNSTABLE4, data: &[0; 320] };
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_WRITE, &w));
    assert_eq!(r.next(p::OP_SEQUENCE), p::NFS4ERR_REQ_TOO_BIG);
    c.seq -= 1;
    assert_eq!(s.call(c.seq_req(false)).status, p::NFS4_OK, "the slot is free again");
    // The owner's sequence was not used up by the foreign principal, and a
    // replay of the successful request returns the same session.
    let (st, again) = create_session_as(&s, 0, id, n, 0, chan_sized(400, 400, 200, 16), ok_back.clone());
    assert_eq!((st, again.map(|x| x.0)), (p::NFS4_OK, Some(session)));
    // Once confirmed, the session limit: RESOURCE, nothing reserved.
    let s1 = server_with(Config { grace_time_s: 0, sessions_per_client_max: 1, ..Config::default() }, 1 << 20);
    let one = session_only(&s1, b"one", 1);
    let used = s1.prog.state().reply_cache_bytes();
    assert_eq!(create_session_as(&s1, 0, one.clientid, 2, 0, chan(16, 8), ok_back).0, p::NFS4ERR_RESOURCE);
    assert_eq!(s1.prog.state().session_count(), 1);
    assert_eq!(s1.prog.state().reply_cache_bytes(), used);
    s1.prog.state().assert_invariants();
}

/// Item 4 of issue 17: every case of the EXCHANGE_ID table (RFC 8881
/// §18.35.5), principals being AUTH_SYS uids 0 and 1000.
#[test]
fn exchange_id_cases_rfc8881_18_35_5() {
    let s = server();
    const UPD: u32 = p::EXCHGID4_FLAG_UPD_CONFIRMED_REC_A;
    let confirmed = |flags: u32| flags & p::EXCHGID4_FLAG_CONFIRMED_R != 0;
    // Case 1, new owner: an unconfirmed record, sequence 1.
    let (st, id1, seq1, f) = exchange_as(&s, 0, b"table", 1, 0);
    assert_eq!((st, seq1, confirmed(f)), (p::NFS4_OK, 1, false));
    // Case 4, unconfirmed record replaced (even with the same verifier): a
    // new client ID; CREATE_SESSION on the replaced one is STALE_CLIENTID.
    let (st, id2, seq2, f) = exchange_as(&s, 0, b"table", 1, 0);
    assert_eq!((st, confirmed(f)), (p::NFS4_OK, false));
    assert_ne!(id2, id1);
    assert_eq!(create_session_as(&s, 0, id1, seq1, 0, chan(16, 8), chan(2, 1)).0, p::NFS4ERR_STALE_CLIENTID);
    // ... also when replaced by another principal's EXCHANGE_ID.
    let (st, id3, seq3, _) = exchange_as(&s, 1000, b"table", 2, 0);
    assert_eq!(st, p::NFS4_OK);
    assert_ne!(id3, id2);
    assert_eq!(create_session_as(&s, 0, id2, seq2, 0, chan(16, 8), chan(2, 1)).0, p::NFS4ERR_STALE_CLIENTID);
    assert_eq!(s.prog.state().client_count(), 1);
    // uid 1000 confirms its record; it now holds a session.
    let (st, cs) = create_session_as(&s, 1000, id3, seq3, 0, chan(16, 8), chan(2, 1));
    assert_eq!(st, p::NFS4_OK);
    let mut c = Client { clientid: id3, session: cs.unwrap().0, seq: 0 };
    // Case 2, same owner, verifier and principal: the confirmed record.
    let (st, id, _, f) = exchange_as(&s, 1000, b"table", 2, 0);
    assert_eq!((st, id, confirmed(f)), (p::NFS4_OK, id3, true));
    // Case 6, update with the same verifier and principal.
    let (st, id, _, f) = exchange_as(&s, 1000, b"table", 2, UPD);
    assert_eq!((st, id, confirmed(f)), (p::NFS4_OK, id3, true));
    // Case 9, update by another principal: PERM (whatever the verifier).
    assert_eq!(exchange_as(&s, 0, b"table", 2, UPD).0, p::NFS4ERR_PERM);
    assert_eq!(exchange_as(&s, 0, b"table", 3, UPD).0, p::NFS4ERR_PERM);
    // Case 8, update with another verifier: NOT_SAME.
    assert_eq!(exchange_as(&s, 1000, b"table", 3, UPD).0, p::NFS4ERR_NOT_SAME);
    // Case 7, update of a record that does not exist / is not confirmed.
    assert_eq!(exchange_as(&s, 0, b"nobody", 1, UPD).0, p::NFS4ERR_NOENT);
    let (st, _, _, _) = exchange_as(&s, 0, b"pending", 1, 0);
    assert_eq!(st, p::NFS4_OK);
    assert_eq!(exchange_as(&s, 0, b"pending", 1, UPD).0, p::NFS4ERR_NOENT);
    // Case 3, collision: another principal, the confirmed record has state
    // (a session): CLID_INUSE, with any verifier; the record is untouched.
    assert_eq!(exchange_as(&s, 0, b"table", 2, 0).0, p::NFS4ERR_CLID_INUSE);
    assert_eq!(exchange_as(&s, 0, b"table", 9, 0).0, p::NFS4ERR_CLID_INUSE);
    assert_eq!(s.call(c.seq_req(false)).status, p::NFS4_OK);
    // Case 5, client restart (same principal, new verifier): a new
    // unconfirmed client ID; the old one keeps its session until the new
    // one is confirmed, then it and its state are gone.
    let (st, id4, seq4, f) = exchange_as(&s, 1000, b"table", 7, 0);
    assert_eq!((st, confirmed(f)), (p::NFS4_OK, false));
    assert_ne!(id4, id3);
    assert_eq!(s.call(c.seq_req(false)).status, p::NFS4_OK, "old incarnation still served");
    // Retried before confirmation (case 5 again, replacing the unconfirmed).
    let (st, id5, seq5, _) = exchange_as(&s, 1000, b"table", 7, 0);
    assert_eq!(st, p::NFS4_OK);
    assert_ne!(id5, id4);
    assert_eq!(create_session_as(&s, 1000, id4, seq4, 0, chan(16, 8), chan(2, 1)).0, p::NFS4ERR_STALE_CLIENTID);
    assert_eq!(create_session_as(&s, 1000, id5, seq5, 0, chan(16, 8), chan(2, 1)).0, p::NFS4_OK);
    assert_eq!(s.call(c.seq_req(false)).status, p::NFS4ERR_BADSESSION, "restart confirmed: old session gone");
    assert_eq!(create_session_as(&s, 1000, id3, 2, 0, chan(16, 8), chan(2, 1)).0, p::NFS4ERR_STALE_CLIENTID);
    // Case 3 without state: the confirmed record is dropped and another
    // principal gets a new unconfirmed one.
    let (st, lone, lseq, _) = exchange_as(&s, 0, b"stateless", 1, 0);
    assert_eq!(st, p::NFS4_OK);
    let (st, cs) = create_session_as(&s, 0, lone, lseq, 0, chan(16, 8), chan(2, 1));
    assert_eq!(st, p::NFS4_OK);
    let mut r = s.call(Req::new(1).op(p::OP_DESTROY_SESSION, &p::DESTROY_SESSION4args { dsa_sessionid: cs.unwrap().0 }));
    r.ok0(p::OP_DESTROY_SESSION);
    let (st, taken, tseq, f) = exchange_as(&s, 1000, b"stateless", 1, 0);
    assert_eq!((st, confirmed(f)), (p::NFS4_OK, false));
    assert_ne!(taken, lone);
    assert_eq!(create_session_as(&s, 0, lone, lseq + 1, 0, chan(16, 8), chan(2, 1)).0, p::NFS4ERR_STALE_CLIENTID);
    // The new record belongs to its principal: another one gets CLID_INUSE.
    assert_eq!(create_session_as(&s, 0, taken, tseq, 0, chan(16, 8), chan(2, 1)).0, p::NFS4ERR_CLID_INUSE);
    assert_eq!(create_session_as(&s, 1000, taken, tseq, 0, chan(16, 8), chan(2, 1)).0, p::NFS4_OK);
    // Open state counts as state too: a collision with a client holding an
    // open (no session needed to see it) is CLID_INUSE.
    let mut o = connect(&s, b"opener");
    open_create(&s, &mut o, b"o", b"held", 3);
    assert_eq!(exchange_as(&s, 1000, b"opener", 7, 0).0, p::NFS4ERR_CLID_INUSE);
    s.prog.state().assert_invariants();
}

/// Item 5 of issue 17: until a client sends RECLAIM_COMPLETE for its new
/// client ID, non-reclaim OPEN (CLAIM_NULL, CLAIM_FH) and LOCK get
/// NFS4ERR_GRACE (RFC 8881 §18.51.3) outside the server's grace period too,
/// before any file is created or truncated; a reclaim is NO_GRACE there.
/// A restarted client (new client ID) must send it again.
#[test]
fn reclaim_complete_first_rfc8881_18_51_3() {
    let s = server();
    assert!(!s.prog.state().in_grace(0));
    let mut ready = connect(&s, b"ready");
    let (rsid, fh) = open_create(&s, &mut ready, b"o", b"kept", 3);
    let w = p::WRITE4args { stateid: rsid.clone(), offset: 0, stable: p::stable_how4::FILE_SYNC4, data: b"0123456789" };
    assert_eq!(s.call(ready.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_WRITE, &w)).status, p::NFS4_OK);
    let size_of = |fh: &[u8]| {
        let a = s.fs.getattr(&vfs::FileHandle::from_bytes(fh).unwrap()).unwrap();
        a.size
    };
    let mut c = session_only(&s, b"eager", 1);
    let (mask, vals) = fattr_mode(0o644);
    let create = p::OPEN4args {
        openhow: p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 { attrmask: mask.clone(), attr_vals: &vals })),
        ..open_args(0, b"e", b"fresh", 3, 0)
    };
    let size0 = crate::attrs::Bitmap::of(&[crate::attrs::SIZE]).to_vec();
    let zero = 0u64.to_be_bytes();
    let truncate = p::OPEN4args {
        openhow: p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 { attrmask: size0, attr_vals: &zero })),
        ..open_args(0, b"e", b"kept", 3, 0)
    };
    for (what, args) in [("create", &create), ("truncate", &truncate), ("plain", &open_args(0, b"e", b"kept", 1, 0))] {
        let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, args));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_GRACE, "{what} before RECLAIM_COMPLETE");
    }
    let root = s.fs.root(EXPORT).unwrap();
    assert_eq!(s.fs.lookup(&root, b"fresh").err(), Some(vfs::VfsError::NoEnt), "nothing created");
    assert_eq!(size_of(&fh), 10, "nothing truncated");
    let by_fh = p::OPEN4args { claim: p::open_claim4::CLAIM_FH, ..open_args(0, b"e", b"", 1, 0) };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &by_fh));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_GRACE, "CLAIM_FH before RECLAIM_COMPLETE");
    // A reclaim outside grace is NO_GRACE, as always.
    let prev = p::OPEN4args { claim: p::open_claim4::CLAIM_PREVIOUS(p::open_delegation_type4::OPEN_DELEGATE_NONE), ..open_args(0, b"e", b"", 1, 0) };
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_OPEN, &prev));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_NO_GRACE);
    // LOCK (non-reclaim) is GRACE too, whatever stateid it names.
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_LOCK, &new_lock(&rsid, 0, b"l", 0, false)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_LOCK), p::NFS4ERR_GRACE);
    // After RECLAIM_COMPLETE: OPEN and LOCK work.
    assert_eq!(reclaim_complete(&s, &mut c), p::NFS4_OK);
    let current = p::stateid4 { seqid: 1, other: [0; 12] };
    let mut r = s.call(
        c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &create).op(p::OP_LOCK, &new_lock(&current, 0, b"l", 0, false)),
    );
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    r.ok::<p::OPEN4resok>(p::OP_OPEN);
    r.ok::<p::LOCK4resok>(p::OP_LOCK);
    // The client restarts (new verifier, new client ID): again GRACE until
    // its RECLAIM_COMPLETE.
    let mut c2 = session_only(&s, b"eager", 2);
    assert_ne!(c2.clientid, c.clientid);
    let mut r = s.call(c2.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &open_args(0, b"e", b"kept", 1, 0)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_GRACE);
    assert_eq!(reclaim_complete(&s, &mut c2), p::NFS4_OK);
    let mut r = s.call(c2.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &open_args(0, b"e", b"kept", 1, 0)));
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    s.prog.state().assert_invariants();
}

/// Hostile client records: seeded random EXCHANGE_ID / CREATE_SESSION /
/// DESTROY_SESSION traffic from two principals over a few owners (random
/// flags, verifiers, sequences and channel sizes) only ever gets the
/// statuses RFC 8881 §18.35 / §18.36 allow, and the state's cross-table
/// invariants (replay-cache charge included) hold after every call.
#[test]
fn hostile_client_records_keep_invariants() {
    let s = server_with(Config { grace_time_s: 0, sessions_per_client_max: 2, clients_max: 6, ..Config::default() }, 1 << 20);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let owners: [&[u8]; 3] = [b"h0", b"h1", b"h2"];
    let mut ids: Vec<(u64, u32)> = Vec::new();
    let mut sessions: Vec<[u8; 16]> = Vec::new();
    let pick = |v: u64| [0u32, 1, 2, 20, 87, 88, 400, 4096, 1 << 20, u32::MAX][(v % 10) as usize];
    for round in 0..3000 {
        let uid = if next() % 3 == 0 { 1000 } else { 0 };
        match next() % 4 {
            0 | 1 if !ids.is_empty() && next() % 2 == 0 => {
                let (id, seq) = ids[(next() as usize) % ids.len()];
                let seq = seq.wrapping_add((next() % 3) as u32).wrapping_sub(1);
                let fore = chan_sized(pick(next()), pick(next()), pick(next()), pick(next()).min(64));
                let back = chan_sized(pick(next()), pick(next()), 0, pick(next()).min(4));
                let flags = [0, 1, 2, 4, 8, 1 << 31][(next() % 6) as usize];
                let (st, cs) = create_session_as(&s, uid, id, seq, flags, fore, back);
                let allowed = [
                    p::NFS4_OK,
                    p::NFS4ERR_STALE_CLIENTID,
                    p::NFS4ERR_CLID_INUSE,
                    p::NFS4ERR_SEQ_MISORDERED,
                    p::NFS4ERR_INVAL,
                    p::NFS4ERR_TOOSMALL,
                    p::NFS4ERR_RESOURCE,
                ];
                assert!(allowed.contains(&st), "round {round}: CREATE_SESSION answered {st}");
                if let Some((sid, _)) = cs {
                    sessions.push(sid);
                }
            }
            0 | 1 => {
                let flags = if next() % 4 == 0 { p::EXCHGID4_FLAG_UPD_CONFIRMED_REC_A } else { 0 };
                let (st, id, seq, _) = exchange_as(&s, uid, owners[(next() % 3) as usize], (next() % 3) as u8, flags);
                let allowed =
                    [p::NFS4_OK, p::NFS4ERR_NOENT, p::NFS4ERR_NOT_SAME, p::NFS4ERR_PERM, p::NFS4ERR_CLID_INUSE, p::NFS4ERR_RESOURCE];
                assert!(allowed.contains(&st), "round {round}: EXCHANGE_ID answered {st}");
                if st == p::NFS4_OK {
                    ids.push((id, seq));
                }
            }
            2 if !sessions.is_empty() => {
                let sid = sessions.swap_remove((next() as usize) % sessions.len());
                let r = s.call(Req::new(1).op(p::OP_DESTROY_SESSION, &p::DESTROY_SESSION4args { dsa_sessionid: sid }));
                assert!(r.status == p::NFS4_OK || r.status == p::NFS4ERR_BADSESSION);
            }
            _ => {}
        }
        s.prog.state().assert_invariants();
        assert!(s.prog.state().client_count() <= 6);
    }
    assert!(!ids.is_empty() && s.prog.state().session_count() <= 6 * 2);
}

// ---- item 2 of issue 17: open files outlive their names ----

/// One operation on `fh` in its own COMPOUND: SEQUENCE, PUTFH, `op`.
/// Returns the op's status and the reply positioned at its body.
fn on_fh<'a, T: Xdr<'a>>(s: &Server, c: &mut Client, fh: &[u8], opnum: i32, args: &T) -> (i32, Reply) {
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(fh)).op(opnum, args));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    let st = r.next(p::OP_PUTFH);
    if st != p::NFS4_OK {
        return (st, r);
    }
    let st = r.next(opnum);
    (st, r)
}

fn read_via(s: &Server, c: &mut Client, fh: &[u8], sid: &p::stateid4, count: u32) -> Result<Vec<u8>, i32> {
    let rd = p::READ4args { stateid: sid.clone(), offset: 0, count };
    match on_fh(s, c, fh, p::OP_READ, &rd) {
        (p::NFS4_OK, r) => Ok(p::READ4resok::decode(&mut r.body()).unwrap().data.to_vec()),
        (st, _) => Err(st),
    }
}

fn write_via(s: &Server, c: &mut Client, fh: &[u8], sid: &p::stateid4, offset: u64, data: &[u8]) -> i32 {
    let w = p::WRITE4args { stateid: sid.clone(), offset, stable: p::stable_how4::FILE_SYNC4, data };
    on_fh(s, c, fh, p::OP_WRITE, &w).0
}

fn close_via(s: &Server, c: &mut Client, fh: &[u8], sid: &p::stateid4) -> i32 {
    on_fh(s, c, fh, p::OP_CLOSE, &p::CLOSE4args { seqid: 0, open_stateid: sid.clone() }).0
}

/// GETATTR numlinks and size of `fh`, or the status that stopped it.
fn links_and_size(s: &Server, c: &mut Client, fh: &[u8]) -> Result<(u32, u64), i32> {
    use crate::attrs::{Bitmap, NUMLINKS, SIZE};
    let ga = p::GETATTR4args { attr_request: Bitmap::of(&[SIZE, NUMLINKS]).to_vec() };
    match on_fh(s, c, fh, p::OP_GETATTR, &ga) {
        (p::NFS4_OK, r) => {
            let g = p::GETATTR4resok::decode(&mut r.body()).unwrap();
            let mut v = Decoder::new(g.obj_attributes.attr_vals);
            let size = v.u64().unwrap();
            Ok((v.u32().unwrap(), size))
        }
        (st, _) => Err(st),
    }
}

fn remove_via(s: &Server, c: &mut Client, name: &[u8]) -> i32 {
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_REMOVE, &p::REMOVE4args { target: name }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    r.next(p::OP_REMOVE)
}

/// REMOVE of a file two clients hold open (RFC 8881 §18.16.4
/// OPEN4_RESULT_PRESERVE_UNLINKED, §18.25): the name is gone at once, the
/// opens keep READ (the original bytes), WRITE, GETATTR (numlinks 0), LOCK,
/// LOCKU and CLOSE working; the first CLOSE leaves the file to the other
/// opener; the last CLOSE destroys it (its handle is STALE) and the space
/// goes back, in the backend and in fsstat (space_free).
#[test]
fn remove_while_open_keeps_the_file_until_the_last_close() {
    let s = server();
    let mut a = connect(&s, b"holder");
    let mut b = connect(&s, b"other");
    let empty = s.fs.used_bytes();
    let root = s.fs.root(EXPORT).unwrap();
    let free_empty = s.fs.fsstat(&root).unwrap().free_bytes;
    let (sa, fh, rflags) = open_create_rflags(&s, &mut a, b"oa", b"victim", 3);
    assert_eq!(rflags & p::OPEN4_RESULT_PRESERVE_UNLINKED, p::OPEN4_RESULT_PRESERVE_UNLINKED, "advertised");
    assert_ne!(rflags & p::OPEN4_RESULT_LOCKTYPE_POSIX, 0);
    let payload: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(write_via(&s, &mut a, &fh, &sa, 0, &payload), p::NFS4_OK);
    let (sb, _, _) = open_create_rflags(&s, &mut b, b"ob", b"victim", 1);
    let used_open = s.fs.used_bytes();
    assert!(used_open > empty + 50_000);

    assert_eq!(remove_via(&s, &mut b, b"victim"), p::NFS4_OK);
    let lk = p::LOOKUP4args { objname: b"victim" };
    let mut r = s.call(a.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_LOOKUP, &lk));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_LOOKUP), p::NFS4ERR_NOENT, "the name is gone");
    // Both opens still read the original bytes; a writes more.
    assert_eq!(read_via(&s, &mut a, &fh, &sa, 60_000), Ok(payload.clone()));
    assert_eq!(read_via(&s, &mut b, &fh, &sb, 60_000), Ok(payload.clone()));
    assert_eq!(write_via(&s, &mut a, &fh, &sa, 50_000, b"tail"), p::NFS4_OK);
    assert_eq!(links_and_size(&s, &mut a, &fh), Ok((0, 50_004)));
    // LOCK and LOCKU under the open of the nameless file; CLOSE with the
    // lock held is refused as for any file.
    let (st, r) = on_fh(&s, &mut a, &fh, p::OP_LOCK, &new_lock(&sa, 0, b"la", 0, false));
    assert_eq!(st, p::NFS4_OK);
    let lock_sid = p::LOCK4resok::decode(&mut r.body()).unwrap().lock_stateid;
    assert_eq!(close_via(&s, &mut a, &fh, &sa), p::NFS4ERR_LOCKS_HELD);
    let u = p::LOCKU4args { locktype: p::nfs_lock_type4::WRITE_LT, seqid: 0, lock_stateid: lock_sid, offset: 0, length: u64::MAX };
    assert_eq!(on_fh(&s, &mut a, &fh, p::OP_LOCKU, &u).0, p::NFS4_OK);
    // a closes: b's open keeps it; the space is still held.
    assert_eq!(close_via(&s, &mut a, &fh, &sa), p::NFS4_OK);
    let mut expect = payload.clone();
    expect.extend_from_slice(b"tail");
    assert_eq!(read_via(&s, &mut b, &fh, &sb, 60_000), Ok(expect));
    assert!(s.fs.used_bytes() >= used_open - DIRENT_SLACK);
    // The last CLOSE answers OK (not STALE) and frees it.
    assert_eq!(close_via(&s, &mut b, &fh, &sb), p::NFS4_OK);
    assert_eq!(links_and_size(&s, &mut b, &fh), Err(p::NFS4ERR_STALE));
    assert_eq!(s.fs.used_bytes(), empty, "the space is released at the last close");
    assert_eq!(s.fs.fsstat(&root).unwrap().free_bytes, free_empty);
    s.prog.state().assert_invariants();
}

/// What a directory entry may charge (a name up to 16 bytes): the REMOVE
/// released it while the file stayed.
const DIRENT_SLACK: u64 = vfs::memfs::DIRENT_CHARGE_BYTES + 16;

/// RENAME over a file that is open (RFC 8881 §18.26): the replaced file
/// stays readable and writable through its stateid, GETATTR says numlinks
/// 0, and CLOSE answers OK (it used to be NFS4ERR_STALE); then the space
/// goes back. The renamed file is what the name now reads.
#[test]
fn rename_over_an_open_file_keeps_it_until_close() {
    let s = server();
    let mut c = connect(&s, b"renamer");
    let empty = s.fs.used_bytes();
    let (sid, fh) = open_create(&s, &mut c, b"o", b"target", 3);
    assert_eq!(write_via(&s, &mut c, &fh, &sid, 0, b"the old bytes"), p::NFS4_OK);
    let (s2, fh2) = open_create(&s, &mut c, b"o2", b"incoming", 3);
    assert_eq!(write_via(&s, &mut c, &fh2, &s2, 0, b"new"), p::NFS4_OK);
    assert_eq!(close_via(&s, &mut c, &fh2, &s2), p::NFS4_OK);
    let rn = p::RENAME4args { oldname: b"incoming", newname: b"target" };
    let mut r = s.call(
        c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).raw(p::OP_SAVEFH as u32, &[]).op(p::OP_RENAME, &rn),
    );
    assert_eq!(r.status, p::NFS4_OK);
    let _ = r.next(p::OP_SEQUENCE);
    assert_eq!(read_via(&s, &mut c, &fh, &sid, 100), Ok(b"the old bytes".to_vec()));
    assert_eq!(write_via(&s, &mut c, &fh, &sid, 0, b"THE"), p::NFS4_OK);
    assert_eq!(read_via(&s, &mut c, &fh, &sid, 100), Ok(b"THE old bytes".to_vec()));
    assert_eq!(links_and_size(&s, &mut c, &fh), Ok((0, 13)));
    let (target, _) = s.fs.lookup(&s.fs.root(EXPORT).unwrap(), b"target").unwrap();
    assert_eq!(target.to_bytes().to_vec(), fh2, "the name is the renamed file");
    assert_eq!(close_via(&s, &mut c, &fh, &sid), p::NFS4_OK);
    assert_eq!(links_and_size(&s, &mut c, &fh), Err(p::NFS4ERR_STALE));
    s.fs.remove(&s.fs.root(EXPORT).unwrap(), b"target").unwrap();
    assert_eq!(s.fs.used_bytes(), empty);
}

/// An NFSv3 REMOVE (straight to the backend, as the NFSv3 program does)
/// racing a 4.1 open succeeds and the opener keeps using the file. Every
/// other path that drops opens releases the file too: lease expiry by the
/// reaper, and a client restart (EXCHANGE_ID with a new verifier, confirmed
/// by CREATE_SESSION) dropping the old incarnation's opens.
#[test]
fn other_removers_and_every_path_that_drops_opens_release_the_file() {
    let s = server_with(Config { grace_time_s: 0, lease_time_s: 5, ..Config::default() }, 64 << 20);
    let root = s.fs.root(EXPORT).unwrap();
    let empty = s.fs.used_bytes();
    // NFSv3 REMOVE while open, then lease expiry.
    let mut a = connect(&s, b"v4-opener");
    let (sa, fh) = open_create(&s, &mut a, b"o", b"shared", 3);
    assert_eq!(write_via(&s, &mut a, &fh, &sa, 0, b"written over v4"), p::NFS4_OK);
    s.fs.remove(&root, b"shared").expect("the NFSv3 REMOVE succeeds");
    assert_eq!(read_via(&s, &mut a, &fh, &sa, 100), Ok(b"written over v4".to_vec()));
    assert_eq!(write_via(&s, &mut a, &fh, &sa, 15, b"!"), p::NFS4_OK);
    assert!(s.fs.used_bytes() > empty);
    s.prog.advance_clock_ms(6_000);
    assert_eq!(s.prog.reap_now(), 1);
    assert_eq!(s.fs.used_bytes(), empty, "lease expiry released the nameless file");
    let handle = vfs::FileHandle::from_bytes(&fh).unwrap();
    assert_eq!(s.fs.getattr(&handle), Err(vfs::VfsError::Stale));
    // Client restart: the new incarnation's confirmation drops the old opens.
    let mut b = connect(&s, b"restarter");
    let (sb, fh) = open_create(&s, &mut b, b"o", b"f", 3);
    assert_eq!(write_via(&s, &mut b, &fh, &sb, 0, b"data"), p::NFS4_OK);
    s.fs.remove(&root, b"f").unwrap();
    assert!(s.fs.used_bytes() > empty);
    let (st, id, seq, _) = exchange_as(&s, 0, b"restarter", 8, 0);
    assert_eq!(st, p::NFS4_OK);
    assert!(s.fs.used_bytes() > empty, "the old incarnation keeps its opens until the new one is confirmed");
    assert_eq!(create_session_as(&s, 0, id, seq, 0, chan(16, 8), chan(2, 1)).0, p::NFS4_OK);
    assert_eq!(s.fs.used_bytes(), empty, "the replaced client's open released the file");
    // An open of a file that still has its name: CLOSE leaves it alone.
    let mut c = connect(&s, b"plain");
    let (sc, fh) = open_create(&s, &mut c, b"o", b"kept", 3);
    assert_eq!(close_via(&s, &mut c, &fh, &sc), p::NFS4_OK);
    assert_eq!(links_and_size(&s, &mut c, &fh), Ok((1, 0)));
    s.prog.state().assert_invariants();
}

/// A nameless open file may be opened again by handle (CLAIM_FH) by
/// another owner, which also keeps it; once the last of them closes, the
/// handle is STALE and an OPEN by it creates no open state.
#[test]
fn open_by_handle_of_a_destroyed_file_is_stale_and_leaves_no_state() {
    let s = server();
    let mut c = connect(&s, b"late");
    let (sid, fh) = open_create(&s, &mut c, b"o", b"gone", 3);
    assert_eq!(remove_via(&s, &mut c, b"gone"), p::NFS4_OK);
    // While open, another owner may still open it by handle.
    let args = p::OPEN4args { claim: p::open_claim4::CLAIM_FH, ..open_args(0, b"o2", b"", 1, 0) };
    let (st, r) = on_fh(&s, &mut c, &fh, p::OP_OPEN, &args);
    assert_eq!(st, p::NFS4_OK);
    let o = p::OPEN4resok::decode(&mut r.body()).unwrap();
    assert_ne!(o.rflags & p::OPEN4_RESULT_PRESERVE_UNLINKED, 0);
    let s2 = o.stateid.clone();
    assert_eq!(close_via(&s, &mut c, &fh, &sid), p::NFS4_OK);
    assert_eq!(read_via(&s, &mut c, &fh, &s2, 10), Ok(vec![]));
    assert_eq!(close_via(&s, &mut c, &fh, &s2), p::NFS4_OK);
    let before = s.prog.state().stateid_count();
    assert_eq!(on_fh(&s, &mut c, &fh, p::OP_OPEN, &args).0, p::NFS4ERR_STALE, "PUTFH of the destroyed file");
    assert_eq!(s.prog.state().stateid_count(), before);
}

// ---- item 6 of issue 17: every REQUIRED attribute, VERIFY and NVERIFY ----

/// GETATTR `req` of `fh`: the returned mask's words and the values.
fn getattr_raw(s: &Server, c: &mut Client, fh: &[u8], req: &crate::attrs::Bitmap) -> (Vec<u32>, Vec<u8>) {
    let ga = p::GETATTR4args { attr_request: req.to_vec() };
    let (st, r) = on_fh(s, c, fh, p::OP_GETATTR, &ga);
    assert_eq!(st, p::NFS4_OK);
    let g = p::GETATTR4resok::decode(&mut r.body()).unwrap();
    (g.obj_attributes.attrmask.clone(), g.obj_attributes.attr_vals.to_vec())
}

/// VERIFY (or NVERIFY) of `fh` with the fattr4 (`mask`, `vals`), then a
/// GETATTR: the VERIFY's status, and how many results the COMPOUND has
/// (4 when it went on past the check).
fn verify_raw(s: &Server, c: &mut Client, fh: &[u8], not: bool, mask: &[u32], vals: &[u8]) -> (i32, u32) {
    let f = p::fattr4 { attrmask: mask.to_vec(), attr_vals: vals };
    let ga = p::GETATTR4args { attr_request: crate::attrs::Bitmap::of(&[crate::attrs::SIZE]).to_vec() };
    let req = c.seq_req(false).op(p::OP_PUTFH, &putfh(fh));
    let req = if not {
        req.op(p::OP_NVERIFY, &p::NVERIFY4args { obj_attributes: f })
    } else {
        req.op(p::OP_VERIFY, &p::VERIFY4args { obj_attributes: f })
    };
    let mut r = s.call(req.op(p::OP_GETATTR, &ga));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let st = r.next(if not { p::OP_NVERIFY } else { p::OP_VERIFY });
    assert_eq!(r.status, st, "the COMPOUND's status is its last op's");
    (st, r.count)
}

/// RFC 8881 §5.6 table 4: the REQUIRED attributes.
fn required_attrs() -> crate::attrs::Bitmap {
    use crate::attrs::*;
    Bitmap::of(&[
        SUPPORTED_ATTRS, TYPE, FH_EXPIRE_TYPE, CHANGE, SIZE, LINK_SUPPORT, SYMLINK_SUPPORT, NAMED_ATTR, FSID,
        UNIQUE_HANDLES, LEASE_TIME, RDATTR_ERROR, FILEHANDLE,
    ])
}

/// Item 6 of issue 17: GETATTR answers every REQUIRED attribute and every
/// one supported_attrs claims (write-only ones aside); VERIFY of exactly
/// what GETATTR answered — the REQUIRED set, all of it at once, and each
/// attribute alone — succeeds and the COMPOUND goes on, NVERIFY of it is
/// NFS4ERR_SAME and stops it (RFC 8881 §18.31.3, §18.15.3); one differing
/// value makes VERIFY NFS4ERR_NOT_SAME and NVERIFY succeed.
#[test]
fn required_attributes_answered_and_verifiable_rfc8881_5_6() {
    use crate::attrs::*;
    let s = server();
    let mut c = connect(&s, b"attrs");
    let (sid, fh) = open_create(&s, &mut c, b"o", b"f", 3);
    assert_eq!(write_via(&s, &mut c, &fh, &sid, 0, b"twelve bytes"), p::NFS4_OK);
    // The REQUIRED set: all answered, in bit order.
    let required = required_attrs();
    assert!(required.minus(&SUPPORTED).is_empty(), "supported_attrs claims every REQUIRED attribute");
    let (mask, vals) = getattr_raw(&s, &mut c, &fh, &required);
    assert_eq!(Bitmap::from_words(&mask), required);
    let mut v = Decoder::new(&vals);
    let (supported, _) = Bitmap::decode(&mut v).unwrap();
    assert_eq!(supported, SUPPORTED);
    assert_eq!(v.u32().unwrap(), 1, "type NF4REG");
    assert_eq!(v.u32().unwrap(), 0, "fh_expire_type FH4_PERSISTENT");
    let change = v.u64().unwrap();
    assert_eq!(v.u64().unwrap(), 12, "size");
    assert!(v.bool().unwrap() && v.bool().unwrap(), "link and symlink support");
    assert!(!v.bool().unwrap(), "no named attributes");
    assert_eq!((v.u64().unwrap(), v.u64().unwrap()), (u64::from(EXPORT), 0), "fsid");
    assert!(v.bool().unwrap(), "unique_handles");
    assert_eq!(v.u32().unwrap(), Config::default().lease_time_s);
    assert_eq!(v.u32().unwrap(), p::NFS4_OK as u32, "rdattr_error");
    assert_eq!(v.opaque_var(128).unwrap(), &fh[..], "filehandle");
    assert_eq!(v.remaining(), 0);
    // Everything claimed (but the write-only) is answered.
    let write_only = Bitmap::of(&[TIME_ACCESS_SET, TIME_MODIFY_SET]);
    let (mask, _) = getattr_raw(&s, &mut c, &fh, &SUPPORTED);
    assert_eq!(Bitmap::from_words(&mask), SUPPORTED.minus(&write_only));
    // VERIFY / NVERIFY of what GETATTR said: the REQUIRED set (without
    // rdattr_error, which may not be verified), everything, each alone.
    let comparable = SUPPORTED.minus(&NOT_COMPARABLE);
    let mut sets = vec![required.minus(&NOT_COMPARABLE), comparable];
    sets.extend(comparable.iter().map(|a| Bitmap::of(&[a])));
    for set in &sets {
        let (mask, vals) = getattr_raw(&s, &mut c, &fh, set);
        assert_eq!(Bitmap::from_words(&mask), *set);
        assert_eq!(verify_raw(&s, &mut c, &fh, false, &mask, &vals), (p::NFS4_OK, 4), "VERIFY {set:?}");
        assert_eq!(verify_raw(&s, &mut c, &fh, true, &mask, &vals), (p::NFS4ERR_SAME, 3), "NVERIFY {set:?}");
    }
    // One value differs: the change attribute, then the size.
    let one = |a: u32| Bitmap::of(&[a]).to_vec();
    let stale_change = (change - 1).to_be_bytes();
    assert_eq!(verify_raw(&s, &mut c, &fh, false, &one(CHANGE), &stale_change), (p::NFS4ERR_NOT_SAME, 3));
    assert_eq!(verify_raw(&s, &mut c, &fh, true, &one(CHANGE), &stale_change), (p::NFS4_OK, 4));
    let (mask, mut vals) = getattr_raw(&s, &mut c, &fh, &Bitmap::of(&[TYPE, SIZE, MODE]));
    vals[11] += 1; // size 12 -> 13
    assert_eq!(verify_raw(&s, &mut c, &fh, false, &mask, &vals), (p::NFS4ERR_NOT_SAME, 3));
    assert_eq!(verify_raw(&s, &mut c, &fh, true, &mask, &vals), (p::NFS4_OK, 4));
    // Values, not bytes: supported_attrs with a trailing zero word is the same.
    let mut padded = Vec::new();
    padded.extend_from_slice(&(SUPPORTED.words().len() as u32 + 1).to_be_bytes());
    for w in SUPPORTED.words().iter().chain(&[0]) {
        padded.extend_from_slice(&w.to_be_bytes());
    }
    assert_eq!(verify_raw(&s, &mut c, &fh, false, &one(SUPPORTED_ATTRS), &padded), (p::NFS4_OK, 4));
    // A write changes the change attribute: the old value no longer verifies.
    let (mask, vals) = getattr_raw(&s, &mut c, &fh, &Bitmap::of(&[CHANGE]));
    assert_eq!(write_via(&s, &mut c, &fh, &sid, 0, b"T"), p::NFS4_OK);
    assert_eq!(verify_raw(&s, &mut c, &fh, false, &mask, &vals), (p::NFS4ERR_NOT_SAME, 3));
    assert_eq!(verify_raw(&s, &mut c, &fh, true, &mask, &vals), (p::NFS4_OK, 4));
    // The export root (a directory, space and file counts included) too.
    let root = s.fs.root(EXPORT).unwrap().to_bytes().to_vec();
    let (mask, vals) = getattr_raw(&s, &mut c, &root, &comparable);
    assert_eq!(verify_raw(&s, &mut c, &root, false, &mask, &vals), (p::NFS4_OK, 4));
}

/// Hostile VERIFY / NVERIFY: rdattr_error or a write-only attribute in the
/// set is NFS4ERR_INVAL, an attribute we do not support (a bit we do not
/// know, one beyond our words) NFS4ERR_ATTRNOTSUPP, a fattr4 whose values
/// do not decode per its mask NFS4ERR_BADXDR (RFC 8881 §18.15.3, §18.31.3),
/// no current filehandle NFS4ERR_NOFILEHANDLE; random masks and values
/// only ever get those statuses (or the verdicts), never a crash.
#[test]
fn hostile_verify_and_nverify() {
    use crate::attrs::*;
    let s = server();
    let mut c = connect(&s, b"hostile-attrs");
    let (_, fh) = open_create(&s, &mut c, b"o", b"f", 3);
    let one = |a: u32| Bitmap::of(&[a]).to_vec();
    for not in [false, true] {
        let v = |c: &mut Client, mask: &[u32], vals: &[u8]| verify_raw(&s, c, &fh, not, mask, vals).0;
        assert_eq!(v(&mut c, &one(RDATTR_ERROR), &0u32.to_be_bytes()), p::NFS4ERR_INVAL);
        let mut size_and_err = Vec::from(0u64.to_be_bytes());
        size_and_err.extend_from_slice(&0u32.to_be_bytes());
        assert_eq!(v(&mut c, &Bitmap::of(&[SIZE, RDATTR_ERROR]).to_vec(), &size_and_err), p::NFS4ERR_INVAL);
        assert_eq!(v(&mut c, &one(TIME_MODIFY_SET), &0u32.to_be_bytes()), p::NFS4ERR_INVAL);
        assert_eq!(v(&mut c, &one(12), &[0; 4]), p::NFS4ERR_ATTRNOTSUPP, "acl is not supported");
        assert_eq!(v(&mut c, &[0, 0, 0, 1], &[]), p::NFS4ERR_ATTRNOTSUPP, "a bit beyond our words");
        assert_eq!(v(&mut c, &one(SIZE), &[0; 4]), p::NFS4ERR_BADXDR, "short value");
        assert_eq!(v(&mut c, &one(SIZE), &[0; 12]), p::NFS4ERR_BADXDR, "trailing bytes");
        assert_eq!(v(&mut c, &one(LINK_SUPPORT), &2u32.to_be_bytes()), p::NFS4ERR_BADXDR, "bool 2");
        assert_eq!(v(&mut c, &one(OWNER), &5000u32.to_be_bytes()), p::NFS4ERR_BADXDR, "owner longer than allowed");
        assert_eq!(v(&mut c, &one(FILEHANDLE), &[0, 0, 0, 24, 1]), p::NFS4ERR_BADXDR, "opaque cut short");
        assert_eq!(v(&mut c, &one(SUPPORTED_ATTRS), &[0, 0, 0, 9]), p::NFS4ERR_BADXDR, "bitmap longer than allowed");
        assert_eq!(v(&mut c, &one(FS_LAYOUT_TYPES), &[0, 1, 0, 0]), p::NFS4ERR_BADXDR, "65536 layout types");
        // A numeric owner written with a leading zero is another string.
        let mut owner = Vec::new();
        owner.extend_from_slice(&2u32.to_be_bytes());
        owner.extend_from_slice(b"00\0\0");
        let expect_owner = if not { p::NFS4_OK } else { p::NFS4ERR_NOT_SAME };
        assert_eq!(v(&mut c, &one(OWNER), &owner), expect_owner);
        // The empty set: nothing differs.
        assert_eq!(v(&mut c, &[], &[]), if not { p::NFS4ERR_SAME } else { p::NFS4_OK });
    }
    // Without a current filehandle.
    let f = p::fattr4 { attrmask: one(SIZE), attr_vals: &[0; 8] };
    let mut r = s.call(c.seq_req(false).op(p::OP_VERIFY, &p::VERIFY4args { obj_attributes: f }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_VERIFY), p::NFS4ERR_NOFILEHANDLE);
    // The arguments themselves cut short: BADXDR for the op.
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).raw(p::OP_NVERIFY as u32, &[0, 0, 0, 1, 0, 0]));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_NVERIFY), p::NFS4ERR_BADXDR);
    // Random masks over our words (plus some unknown bits) and random
    // values: only the statuses RFC 8881 allows for these.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let allowed = [p::NFS4_OK, p::NFS4ERR_SAME, p::NFS4ERR_NOT_SAME, p::NFS4ERR_BADXDR, p::NFS4ERR_INVAL, p::NFS4ERR_ATTRNOTSUPP];
    let mut seen = std::collections::HashSet::new();
    for i in 0..400 {
        let mut mask = vec![0u32; 3];
        for _ in 0..1 + rnd() % 4 {
            let a = if i % 8 == 0 { (rnd() % 96) as u32 } else { SUPPORTED.iter().nth((rnd() % 48) as usize).unwrap_or(SIZE) };
            mask[(a / 32) as usize] |= 1 << (a % 32);
        }
        let vals: Vec<u8> = (0..rnd() % 48).map(|_| if rnd() % 3 == 0 { 0 } else { rnd() as u8 }).collect();
        let (st, _) = verify_raw(&s, &mut c, &fh, i % 2 == 1, &mask, &vals);
        assert!(allowed.contains(&st), "status {st} for mask {mask:?} vals {vals:?}");
        seen.insert(st);
    }
    assert!(seen.contains(&p::NFS4ERR_BADXDR) && seen.contains(&p::NFS4ERR_ATTRNOTSUPP));
    s.prog.state().assert_invariants();
}

// ---- export access rules -------------------------------------------------

fn access_rule(clients: &[&str], access: vfs::clients::AccessType, squash: vfs::clients::Squash) -> vfs::clients::Rule {
    vfs::clients::Rule {
        clients: clients.iter().map(|c| vfs::clients::Net::parse(c).unwrap()).collect(),
        access,
        squash,
        anon_uid: 4242,
        anon_gid: 4343,
    }
}

fn getattr_via(s: &Server, c: &mut Client, fh: &[u8]) -> i32 {
    let mask = crate::attrs::Bitmap::of(&[crate::attrs::SIZE]).to_vec();
    on_fh(s, c, fh, p::OP_GETATTR, &p::GETATTR4args { attr_request: mask }).0
}

/// Rules on the export of the handle: none / no match → NFS4ERR_ACCESS on
/// the operation using the handle (PUTFH itself succeeds, §2.6.3.1.1), a
/// handle learned while allowed stops working, `ro` → NFS4ERR_ROFS on
/// WRITE, SETATTR, REMOVE, OPEN for write or create, root squash on OPEN
/// create; CLOSE still releases state after access was lost.
#[test]
fn export_access_rules_on_operations() {
    use vfs::clients::{AccessTable, AccessType::*, Squash::*};
    let table = Arc::new(AccessTable::new());
    let Server { prog, fs } = server();
    let s = Server { prog: prog.with_access(table.clone()), fs };
    // Squashed callers create in the root.
    let root = s.fs.root(EXPORT).unwrap();
    s.fs.setattr(&root, &vfs::SetAttr { mode: Some(0o777), ..Default::default() }, Option::None).unwrap();
    from_peer("10.0.0.1:900");
    let mut c = connect(&s, b"rules");
    let (sid, fh) = open_create(&s, &mut c, b"o1", b"f", p::OPEN4_SHARE_ACCESS_BOTH);
    assert_eq!(write_via(&s, &mut c, &fh, &sid, 0, b"hello"), p::NFS4_OK);

    table.set(
        EXPORT,
        Some(vec![
            access_rule(&["10.0.0.1", "::ffff:10.0.0.5"], ReadOnly, NoRootSquash),
            access_rule(&["10.0.0.2"], ReadWrite, RootSquash),
            access_rule(&["10.0.0.3"], None, NoRootSquash),
            access_rule(&["10.0.0.0/8"], ReadWrite, AllSquash),
        ]),
    );
    // Read-only: reads work, every modification is ROFS, nothing changes.
    from_peer("10.0.0.1:900");
    assert_eq!(read_via(&s, &mut c, &fh, &sid, 5), Ok(b"hello".to_vec()));
    assert_eq!(write_via(&s, &mut c, &fh, &sid, 0, b"bye"), p::NFS4ERR_ROFS);
    let (mask, vals) = fattr_mode(0o600);
    let sa = p::SETATTR4args { stateid: stateid0(), obj_attributes: p::fattr4 { attrmask: mask, attr_vals: &vals } };
    assert_eq!(on_fh(&s, &mut c, &fh, p::OP_SETATTR, &sa).0, p::NFS4ERR_ROFS);
    assert_eq!(remove_via(&s, &mut c, b"f"), p::NFS4ERR_ROFS);
    let mut o = open_args(c.clientid, b"o2", b"new", p::OPEN4_SHARE_ACCESS_READ, 0);
    o.openhow = p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 { attrmask: vec![], attr_vals: &[] }));
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &o));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_ROFS, "OPEN create on ro");
    let mut o = open_args(c.clientid, b"o2", b"f", p::OPEN4_SHARE_ACCESS_WRITE, 0);
    o.openhow = p::openflag4::default(p::OPEN4_NOCREATE);
    let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &o));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    assert_eq!(r.next(p::OP_OPEN), p::NFS4ERR_ROFS, "OPEN for write on ro");
    assert!(s.fs.lookup(&root, b"new").is_err());
    assert_eq!(s.fs.lookup(&root, b"f").unwrap().1.size, 5);
    // The v4-mapped form of a rule's address is the same client.
    from_peer("[::ffff:10.0.0.5]:900");
    assert_eq!(write_via(&s, &mut c, &fh, &sid, 0, b"bye"), p::NFS4ERR_ROFS);

    // No access: the handle learned before stops working on every use.
    for peer in ["10.0.0.3:900", "11.0.0.1:900", "[2001:db8::1]:900"] {
        from_peer(peer);
        assert_eq!(getattr_via(&s, &mut c, &fh), p::NFS4ERR_ACCESS, "{peer}");
        assert_eq!(read_via(&s, &mut c, &fh, &sid, 5), Err(p::NFS4ERR_ACCESS));
        assert_eq!(write_via(&s, &mut c, &fh, &sid, 0, b"x"), p::NFS4ERR_ACCESS);
        let mut r = s.call(
            c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_LOOKUP, &p::LOOKUP4args { objname: b"f" }),
        );
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        assert_eq!(r.next(p::OP_LOOKUP), p::NFS4ERR_ACCESS);
        assert_eq!(remove_via(&s, &mut c, b"f"), p::NFS4ERR_ACCESS);
    }
    assert_eq!(s.fs.lookup(&root, b"f").unwrap().1.size, 5);

    // Squash on OPEN create: root from 10.0.0.2 becomes the anonymous uid,
    // any uid from elsewhere in 10/8 too; the file is theirs.
    from_peer("10.0.0.2:900");
    open_create(&s, &mut c, b"o3", b"by-root", p::OPEN4_SHARE_ACCESS_BOTH);
    let a = s.fs.lookup(&root, b"by-root").unwrap().1;
    assert_eq!((a.uid, a.gid), (4242, 4343));
    from_peer("10.7.0.2:900");
    open_create(&s, &mut c, b"o4", b"by-other", p::OPEN4_SHARE_ACCESS_BOTH);
    let a = s.fs.lookup(&root, b"by-other").unwrap().1;
    assert_eq!((a.uid, a.gid), (4242, 4343));

    // A client that lost access still lets go of its open.
    from_peer("10.0.0.3:900");
    assert_eq!(close_via(&s, &mut c, &fh, &sid), p::NFS4_OK);
    // Rules removed: open again.
    table.set(EXPORT, Option::None);
    assert_eq!(getattr_via(&s, &mut c, &fh), p::NFS4_OK);
}

/// A volume's own rules (a quota root with rules in the table) on the
/// operations that use a handle inside it: `ro` makes CREATE, REMOVE,
/// SETATTR ROFS there while a second volume of the export takes them;
/// RENAME from that second volume into the read-only one is ROFS (the
/// target is the current filehandle) and so is the other way (the saved
/// one); `none` / no match is NFS4ERR_ACCESS inside the volume only.
#[test]
fn volume_rules_on_operations() {
    use vfs::clients::{AccessTable, AccessType::*, Squash::*};
    use vfs::{CreateMode, Cred, NodeKind};
    let Server { prog, fs } = server();
    let table = Arc::new(AccessTable::with_volumes(fs.clone()));
    let s = Server { prog: prog.with_access(table.clone()), fs };
    let root = s.fs.root(EXPORT).unwrap();
    let volume = |name: &[u8]| {
        let (d, _) = s.fs.create(&root, name, NodeKind::Directory, 0o777, &Cred::ROOT, CreateMode::Guarded).unwrap();
        s.fs.set_quota(&d, 1 << 20).unwrap();
        s.fs.create(&d, b"f", NodeKind::File, 0o666, &Cred::ROOT, CreateMode::Guarded).unwrap();
        d
    };
    let (ro, rw) = (volume(b"ro"), volume(b"rw"));
    let (rob, rwb) = (ro.to_bytes(), rw.to_bytes());
    from_peer("10.0.0.1:900");
    let mut c = connect(&s, b"volumes");
    table.set_volume(EXPORT, ro.ino, Some(vec![access_rule(&["*"], ReadOnly, NoRootSquash)])).unwrap();

    let mkdir = p::CREATE4args { objtype: p::createtype4::NF4DIR, objname: b"d", createattrs: p::fattr4 { attrmask: vec![], attr_vals: b"" } };
    assert_eq!(on_fh(&s, &mut c, &rob, p::OP_CREATE, &mkdir).0, p::NFS4ERR_ROFS);
    assert_eq!(on_fh(&s, &mut c, &rwb, p::OP_CREATE, &mkdir).0, p::NFS4_OK);
    let (mask, vals) = fattr_mode(0o600);
    let sa = p::SETATTR4args { stateid: stateid0(), obj_attributes: p::fattr4 { attrmask: mask, attr_vals: &vals } };
    assert_eq!(on_fh(&s, &mut c, &rob, p::OP_SETATTR, &sa).0, p::NFS4ERR_ROFS);
    assert_eq!(on_fh(&s, &mut c, &rwb, p::OP_SETATTR, &sa).0, p::NFS4_OK);
    let rename = |from: &[u8], to: &[u8], c: &mut Client| {
        let rn = p::RENAME4args { oldname: b"f", newname: b"moved" };
        let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(from)).raw(p::OP_SAVEFH as u32, &[]).op(p::OP_PUTFH, &putfh(to)).op(p::OP_RENAME, &rn));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTFH);
        r.ok0(p::OP_SAVEFH);
        r.ok0(p::OP_PUTFH);
        r.next(p::OP_RENAME)
    };
    assert_eq!(rename(&rwb, &rob, &mut c), p::NFS4ERR_ROFS, "into the read-only volume");
    assert_eq!(rename(&rob, &rwb, &mut c), p::NFS4ERR_ROFS, "out of it");
    assert_eq!(on_fh(&s, &mut c, &rob, p::OP_REMOVE, &p::REMOVE4args { target: b"f" }).0, p::NFS4ERR_ROFS);
    assert!(s.fs.lookup(&ro, b"f").is_ok() && s.fs.lookup(&ro, b"d").is_err());
    assert_eq!(on_fh(&s, &mut c, &rwb, p::OP_REMOVE, &p::REMOVE4args { target: b"f" }).0, p::NFS4_OK);

    table.set_volume(EXPORT, ro.ino, Some(vec![access_rule(&["10.9.0.0/16"], ReadWrite, NoRootSquash)])).unwrap();
    assert_eq!(getattr_via(&s, &mut c, &rob), p::NFS4ERR_ACCESS);
    assert_eq!(getattr_via(&s, &mut c, &rwb), p::NFS4_OK);
    assert_eq!(getattr_via(&s, &mut c, &root.to_bytes()), p::NFS4_OK, "the export root is in no volume");
    from_peer("10.9.1.1:900");
    assert_eq!(getattr_via(&s, &mut c, &rob), p::NFS4_OK);
}

/// Over the router: LOOKUP from the pseudo-root into an export the client
/// may not use is NFS4ERR_ACCESS (the current filehandle stays the
/// pseudo-root's); another export and an admitted client get through;
/// PUTFH of a forbidden export's handle succeeds and the next operation
/// answers NFS4ERR_ACCESS.
#[test]
fn lookup_into_a_forbidden_export_over_the_router() {
    use vfs::clients::{AccessTable, AccessType::*, Squash::*};
    let open = Arc::new(MemFs::new(MemFsConfig { export_id: 7, capacity_bytes: 16 << 20 }));
    let closed = Arc::new(MemFs::new(MemFsConfig { export_id: 8, capacity_bytes: 16 << 20 }));
    let router = vfs::router::Router::new(vec![
        vfs::router::Mount { name: b"open".to_vec(), export_id: 7, backend: open.clone() },
        vfs::router::Mount { name: b"closed".to_vec(), export_id: 8, backend: closed.clone() },
    ])
    .unwrap();
    let table = Arc::new(AccessTable::new());
    table.set(8, Some(vec![access_rule(&["fd00::/16"], ReadWrite, NoRootSquash)]));
    let s = Server {
        prog: Nfs4Program::new_without_reaper(Arc::new(router), Config { grace_time_s: 0, ..Config::default() })
            .with_access(table),
        fs: open,
    };
    from_peer("192.168.0.9:1");
    let mut c = connect(&s, b"router");
    let look = |s: &Server, c: &mut Client, name: &[u8]| -> (i32, Vec<u8>) {
        let mut r = s.call(
            c.seq_req(false)
                .raw(p::OP_PUTROOTFH as u32, &[])
                .op(p::OP_LOOKUP, &p::LOOKUP4args { objname: name })
                .raw(p::OP_GETFH as u32, &[]),
        );
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        let st = r.next(p::OP_LOOKUP);
        if st != p::NFS4_OK {
            return (st, vec![]);
        }
        let fh: p::GETFH4resok = r.ok(p::OP_GETFH);
        (st, fh.object.to_vec())
    };
    assert_eq!(look(&s, &mut c, b"open").0, p::NFS4_OK);
    assert_eq!(look(&s, &mut c, b"closed").0, p::NFS4ERR_ACCESS);
    // The pseudo-root lists only what the client may use.
    let names = |s: &Server, c: &mut Client| -> Vec<Vec<u8>> {
        let rd = p::READDIR4args { cookie: 0, cookieverf: [0; 8], dircount: 4096, maxcount: 8192, attr_request: vec![] };
        let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_READDIR, &rd));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        let ok: p::READDIR4resok = r.ok(p::OP_READDIR);
        let mut out = Vec::new();
        let mut cur = ok.reply.entries.as_deref();
        while let Some(ent) = cur {
            out.push(ent.name.to_vec());
            cur = ent.nextentry.as_deref();
        }
        out
    };
    assert_eq!(names(&s, &mut c), vec![b"open".to_vec()]);
    from_peer("[fd00:1::2]:1");
    let (st, fh) = look(&s, &mut c, b"closed");
    assert_eq!(st, p::NFS4_OK);
    assert_eq!(names(&s, &mut c), vec![b"open".to_vec(), b"closed".to_vec()]);
    assert_eq!(getattr_via(&s, &mut c, &fh), p::NFS4_OK);
    from_peer("192.168.0.9:1");
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).raw(p::OP_GETFH as u32, &[]));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_GETFH), p::NFS4ERR_ACCESS);
}

/// Proves a restarted server (a new program over the same backend, at once:
/// within the same second) hands out new client IDs and refuses the earlier
/// instance's session and client ID, so clients see the restart.
#[test]
fn restart_within_a_second_refuses_the_old_instances_ids() {
    let a = server();
    let c = connect(&a, b"restarts");
    let b = Server { prog: Nfs4Program::new_without_reaper(a.fs.clone(), Config { root_export: EXPORT, grace_time_s: 0, ..Config::default() }), fs: a.fs.clone() };
    let x = exchange_id(&b, b"restarts");
    assert_ne!(x.eir_clientid, c.clientid, "the new instance's client ID differs");
    let seq = p::SEQUENCE4args { sa_sessionid: c.session, sa_sequenceid: 1, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false };
    let r = b.call(Req::new(1).op(p::OP_SEQUENCE, &seq));
    assert_eq!(r.status, p::NFS4ERR_BADSESSION, "the old session is unknown to the new instance");
    assert!((0..64).map(|_| instance_epoch()).collect::<std::collections::HashSet<_>>().len() == 64, "every instance gets its own epoch");
}

mod v42;
mod deleg;
