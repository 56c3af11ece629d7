//! A small pNFS test client: an NFSv4.1 session to the MDS (EXCHANGE_ID,
//! CREATE_SESSION, then COMPOUNDs behind SEQUENCE) and NFSv3 to the data
//! servers with the layout's synthetic uid, as the Linux flex-files client
//! does. It also starts in-process clusters (an MDS and N data servers on
//! 127.0.0.1, each on its own port).

#![allow(dead_code)]

use chimerad::config::Config;
use chimerad::serve::{self, Running};
use pnfs::client3::Client3;
use proto::nfs4 as p;
use proto::xdr::{Decoder, Xdr};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

pub const TOKEN: &str = "pnfs-test-token";
pub const TIMEOUT: Duration = Duration::from_secs(10);
pub const SYNTH_UID: u32 = 1_000_000;

/// An MDS and its data servers, all in this process.
pub struct Cluster {
    pub mds: Option<Running>,
    pub ds: Vec<Option<Running>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(m) = self.mds.take() {
            m.shutdown();
        }
        for d in self.ds.iter_mut() {
            if let Some(d) = d.take() {
                d.shutdown();
            }
        }
    }
}

pub fn start_ds() -> Running {
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "role": "ds", "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0 },
        "metrics": { "enabled": false }
    });
    serve::start(&Config::parse(&v.to_string()).unwrap()).expect("start DS")
}

pub fn ds_addr(d: &Running) -> SocketAddr {
    d.nfs_addr.expect("DS listens")
}

/// Start `n` DSes and an MDS listing the first `listed` of them; `pnfs`
/// is merged into `server.pnfs`.
pub fn cluster(n: usize, listed: usize, pnfs: Value) -> Cluster {
    let ds: Vec<Option<Running>> = (0..n).map(|_| Some(start_ds())).collect();
    let list: Vec<Value> = ds[..listed]
        .iter()
        .enumerate()
        .map(|(i, d)| json!({ "name": format!("ds{i}"), "uaddr": ds_addr(d.as_ref().unwrap()).to_string() }))
        .collect();
    let mut pn = json!({ "enabled": true, "stripe_unit_bytes": "64K", "data_servers": list, "ds_timeout_ms": 1000 });
    for (k, v) in pnfs.as_object().unwrap() {
        pn[k] = v.clone();
    }
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "role": "mds", "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0,
                    "grace_time_s": 0, "pnfs": pn },
        "mounts": { "m": { "module": "memfs", "capacity_bytes": "256M" } },
        "exports": { "/m": { "path": "/m" } },
        "admin": { "bind": "127.0.0.1", "port": 0, "token": TOKEN, "tls": false },
        "metrics": { "bind": "127.0.0.1", "port": 0 }
    });
    let mds = serve::start(&Config::parse(&v.to_string()).unwrap()).expect("start MDS");
    Cluster { mds: Some(mds), ds }
}

impl Cluster {
    pub fn mds(&self) -> &Running {
        self.mds.as_ref().unwrap()
    }
    pub fn pnfs(&self) -> &std::sync::Arc<pnfs::Pnfs> {
        self.mds().pnfs.as_ref().expect("pNFS enabled")
    }
    pub fn ds_index_of(&self, addr: SocketAddr) -> usize {
        self.ds.iter().position(|d| d.as_ref().is_some_and(|d| ds_addr(d) == addr)).expect("a DS of this cluster")
    }
}

/// Raw XDR writer for hand-built operation arguments.
#[derive(Default)]
pub struct W(pub Vec<u8>);

impl W {
    pub fn u32(mut self, v: u32) -> W {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> W {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn bytes(mut self, b: &[u8]) -> W {
        self.0.extend_from_slice(b);
        self
    }
    pub fn opaque(mut self, b: &[u8]) -> W {
        self = self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self.0.resize(self.0.len().next_multiple_of(4), 0);
        self
    }
    pub fn sid(self, s: &Sid) -> W {
        self.u32(s.seqid).bytes(&s.other)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sid {
    pub seqid: u32,
    pub other: [u8; 12],
}

/// One operation: number and argument bytes.
pub struct Op(pub u32, pub Vec<u8>);

pub fn op<'a, T: Xdr<'a>>(num: i32, args: &T) -> Op {
    Op(num as u32, proto::xdr::to_vec(args).unwrap())
}

pub fn raw(num: i32, w: W) -> Op {
    Op(num as u32, w.0)
}

pub fn putfh(fh: &[u8]) -> Op {
    raw(p::OP_PUTFH, W::default().opaque(fh))
}

pub fn getattr_size() -> Op {
    raw(p::OP_GETATTR, W::default().u32(1).u32(1 << 4))
}

/// A COMPOUND reply walked op by op.
pub struct Reply {
    pub bytes: Vec<u8>,
    pub pos: usize,
    pub status: i32,
}

impl Reply {
    fn parse(bytes: Vec<u8>) -> Reply {
        let mut d = Decoder::new(&bytes);
        let status = d.i32().unwrap();
        d.opaque_var(1024).unwrap();
        let _count = d.u32().unwrap();
        let pos = d.position();
        Reply { bytes, pos, status }
    }

    /// Status of the next op, which must be `opnum`.
    pub fn next(&mut self, opnum: i32) -> i32 {
        let mut d = Decoder::new(&self.bytes[self.pos..]);
        let got = d.u32().expect("another result");
        assert_eq!(got, opnum as u32, "result op number");
        let st = d.i32().unwrap();
        self.pos += d.position();
        st
    }

    /// Decode the body of the op just read.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut Decoder<'_>) -> R) -> R {
        let mut d = Decoder::new(&self.bytes[self.pos..]);
        let r = f(&mut d);
        self.pos += d.position();
        r
    }

    pub fn ok(&mut self, opnum: i32) {
        let st = self.next(opnum);
        assert_eq!(st, p::NFS4_OK, "op {opnum} status");
    }
}

pub fn sid_of(d: &mut Decoder<'_>) -> Sid {
    Sid { seqid: d.u32().unwrap(), other: d.opaque_fixed::<12>().unwrap() }
}

/// A granted flex-files layout segment, decoded.
#[derive(Debug, Clone)]
pub struct FfLayout {
    pub stateid: Sid,
    pub offset: u64,
    pub length: u64,
    pub iomode: u32,
    pub stripe_unit: u64,
    pub mirrors: Vec<FfDs>,
    pub flags: u32,
}

#[derive(Debug, Clone)]
pub struct FfDs {
    pub deviceid: [u8; 16],
    pub fh: Vec<u8>,
    pub uid: u32,
    pub gid: u32,
}

pub fn decode_layoutget(d: &mut Decoder<'_>) -> FfLayout {
    let _roc = d.bool().unwrap();
    let stateid = sid_of(d);
    assert_eq!(d.u32().unwrap(), 1, "one layout4");
    let offset = d.u64().unwrap();
    let length = d.u64().unwrap();
    let iomode = d.u32().unwrap();
    assert_eq!(d.u32().unwrap(), 4, "LAYOUT4_FLEX_FILES");
    let body = d.opaque_var(1 << 16).unwrap().to_vec();
    let mut b = Decoder::new(&body);
    let stripe_unit = b.u64().unwrap();
    let n = b.u32().unwrap();
    let mut mirrors = Vec::new();
    for _ in 0..n {
        assert_eq!(b.u32().unwrap(), 1, "one data server per mirror (what Linux accepts)");
        let deviceid = b.opaque_fixed::<16>().unwrap();
        let _eff = b.u32().unwrap();
        let _sid = sid_of(&mut b);
        assert_eq!(b.u32().unwrap(), 1, "one fh version");
        let fh = b.opaque_var(128).unwrap().to_vec();
        let uid = std::str::from_utf8(b.opaque_var(64).unwrap()).unwrap().parse().unwrap();
        let gid = std::str::from_utf8(b.opaque_var(64).unwrap()).unwrap().parse().unwrap();
        mirrors.push(FfDs { deviceid, fh, uid, gid });
    }
    let flags = b.u32().unwrap();
    let _hint = b.u32().unwrap();
    assert_eq!(b.remaining(), 0, "whole ff_layout4 decoded");
    FfLayout { stateid, offset, length, iomode, stripe_unit, mirrors, flags }
}

/// An NFSv4.1 client with one session (slot 0).
pub struct V4 {
    pub rpc: Client3,
    /// eir_flags of EXCHANGE_ID.
    pub eir_flags: u32,
    pub clientid: u64,
    pub session: [u8; 16],
    pub seq: u32,
}

fn chan() -> p::channel_attrs4 {
    p::channel_attrs4 {
        ca_headerpadsize: 0,
        ca_maxrequestsize: 1 << 20 | 8192,
        ca_maxresponsesize: 1 << 20 | 8192,
        ca_maxresponsesize_cached: 4096,
        ca_maxoperations: 16,
        ca_maxrequests: 1,
        ca_rdma_ird: vec![],
    }
}

impl V4 {
    pub fn call_raw(&mut self, ops: &[Op], with_seq: bool) -> Reply {
        let mut body = W::default().opaque(b"t").u32(1).u32(ops.len() as u32 + with_seq as u32);
        if with_seq {
            self.seq += 1;
            let s = p::SEQUENCE4args { sa_sessionid: self.session, sa_sequenceid: self.seq, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false };
            body = body.u32(p::OP_SEQUENCE as u32).bytes(&proto::xdr::to_vec(&s).unwrap());
        }
        for o in ops {
            body = body.u32(o.0).bytes(&o.1);
        }
        let bytes = body.0;
        let res = self.rpc.call(100003, 4, 1, &|e| e.opaque_fixed(&bytes)).expect("COMPOUND round trip");
        let mut r = Reply::parse(res);
        if with_seq {
            r.ok(p::OP_SEQUENCE);
            r.with(|d| p::SEQUENCE4resok::decode(d).unwrap());
        }
        r
    }

    pub fn call(&mut self, ops: &[Op]) -> Reply {
        self.call_raw(ops, true)
    }

    pub fn connect(mds: SocketAddr, owner: &[u8]) -> V4 {
        let mut v = V4 { rpc: Client3::new(&mds.to_string(), TIMEOUT), eir_flags: 0, clientid: 0, session: [0; 16], seq: 0 };
        let args = p::EXCHANGE_ID4args {
            eia_clientowner: p::client_owner4 { co_verifier: [7; 8], co_ownerid: owner },
            eia_flags: 0,
            eia_state_protect: p::state_protect4_a::SP4_NONE,
            eia_client_impl_id: vec![],
        };
        let mut r = v.call_raw(&[op(p::OP_EXCHANGE_ID, &args)], false);
        r.ok(p::OP_EXCHANGE_ID);
        let (clientid, seqid, flags) = r.with(|d| {
            let x = p::EXCHANGE_ID4resok::decode(d).unwrap();
            (x.eir_clientid, x.eir_sequenceid, x.eir_flags)
        });
        v.eir_flags = flags;
        let cs = p::CREATE_SESSION4args {
            csa_clientid: clientid,
            csa_sequence: seqid,
            csa_flags: 0,
            csa_fore_chan_attrs: chan(),
            csa_back_chan_attrs: chan(),
            csa_cb_program: 0x4000_0000,
            csa_sec_parms: vec![],
        };
        let mut r = v.call_raw(&[op(p::OP_CREATE_SESSION, &cs)], false);
        r.ok(p::OP_CREATE_SESSION);
        v.session = r.with(|d| p::CREATE_SESSION4resok::decode(d).unwrap().csr_sessionid);
        v.clientid = clientid;
        let mut r = v.call(&[op(p::OP_RECLAIM_COMPLETE, &p::RECLAIM_COMPLETE4args { rca_one_fs: false })]);
        r.ok(p::OP_RECLAIM_COMPLETE);
        v
    }

    /// OPEN (create, unchecked) `/m/<name>` for read+write: (stateid, fh).
    pub fn open(&mut self, path: &[&str], name: &str, access: u32) -> (Sid, Vec<u8>) {
        let mut ops = vec![raw(p::OP_PUTROOTFH, W::default())];
        for c in path {
            ops.push(raw(p::OP_LOOKUP, W::default().opaque(c.as_bytes())));
        }
        let owner = format!("o-{name}");
        let mode = 0o644u32.to_be_bytes();
        let args = p::OPEN4args {
            seqid: 0,
            share_access: access,
            share_deny: 0,
            owner: p::state_owner4 { clientid: self.clientid, owner: owner.as_bytes() },
            openhow: p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 { attrmask: vec![0, 1 << (33 - 32)], attr_vals: &mode })),
            claim: p::open_claim4::CLAIM_NULL(name.as_bytes()),
        };
        ops.push(op(p::OP_OPEN, &args));
        ops.push(raw(p::OP_GETFH, W::default()));
        let mut r = self.call(&ops);
        r.ok(p::OP_PUTROOTFH);
        for _ in path {
            r.ok(p::OP_LOOKUP);
        }
        r.ok(p::OP_OPEN);
        let sid = r.with(|d| {
            let o = p::OPEN4resok::decode(d).unwrap();
            Sid { seqid: o.stateid.seqid, other: o.stateid.other }
        });
        r.ok(p::OP_GETFH);
        let fh = r.with(|d| d.opaque_var(128).unwrap().to_vec());
        (sid, fh)
    }

    /// LAYOUTGET on `fh`: Ok(layout) or Err(status).
    pub fn layoutget(&mut self, fh: &[u8], ltype: u32, iomode: u32, offset: u64, length: u64, minlength: u64, sid: &Sid) -> Result<FfLayout, i32> {
        let args = W::default().u32(0).u32(ltype).u32(iomode).u64(offset).u64(length).u64(minlength).sid(sid).u32(1 << 16);
        let mut r = self.call(&[putfh(fh), raw(p::OP_LAYOUTGET, args)]);
        r.ok(p::OP_PUTFH);
        match r.next(p::OP_LAYOUTGET) {
            0 => Ok(r.with(decode_layoutget)),
            e => Err(e),
        }
    }

    /// GETDEVICEINFO: the netaddrs (netid, uaddr) and the version list.
    pub fn getdeviceinfo(&mut self, id: &[u8; 16]) -> Result<(Vec<(String, String)>, Vec<(u32, u32, u32, u32, bool)>), i32> {
        let args = W::default().bytes(id).u32(4).u32(1 << 16).u32(0);
        let mut r = self.call(&[raw(p::OP_PUTROOTFH, W::default()), raw(p::OP_GETDEVICEINFO, args)]);
        r.ok(p::OP_PUTROOTFH);
        let st = r.next(p::OP_GETDEVICEINFO);
        if st != 0 {
            return Err(st);
        }
        Ok(r.with(|d| {
            assert_eq!(d.u32().unwrap(), 4, "flex files device");
            let body = d.opaque_var(1 << 16).unwrap().to_vec();
            let mut b = Decoder::new(&body);
            let n = b.u32().unwrap();
            let addrs = (0..n)
                .map(|_| {
                    let netid = String::from_utf8(b.opaque_var(64).unwrap().to_vec()).unwrap();
                    let uaddr = String::from_utf8(b.opaque_var(128).unwrap().to_vec()).unwrap();
                    (netid, uaddr)
                })
                .collect();
            let nv = b.u32().unwrap();
            let vers = (0..nv)
                .map(|_| (b.u32().unwrap(), b.u32().unwrap(), b.u32().unwrap(), b.u32().unwrap(), b.bool().unwrap()))
                .collect();
            (addrs, vers)
        }))
    }

    /// The DS address of a device (its first TCP netaddr).
    pub fn ds_of(&mut self, id: &[u8; 16]) -> SocketAddr {
        let (addrs, _) = self.getdeviceinfo(id).expect("GETDEVICEINFO");
        let (_, uaddr) = addrs.iter().find(|(n, _)| n == "tcp").expect("a tcp netaddr");
        uaddr_to_addr(uaddr)
    }

    /// LAYOUTCOMMIT with a last write offset: the new size or Err(status).
    pub fn layoutcommit(&mut self, fh: &[u8], sid: &Sid, last_write: u64) -> Result<Option<u64>, i32> {
        let args = W::default().u64(0).u64(u64::MAX).u32(0).sid(sid).u32(1).u64(last_write).u32(0).u32(4).opaque(&[]);
        let mut r = self.call(&[putfh(fh), raw(p::OP_LAYOUTCOMMIT, args)]);
        r.ok(p::OP_PUTFH);
        match r.next(p::OP_LAYOUTCOMMIT) {
            0 => Ok(r.with(|d| if d.bool().unwrap() { Some(d.u64().unwrap()) } else { None })),
            e => Err(e),
        }
    }

    pub fn size(&mut self, fh: &[u8]) -> u64 {
        let mut r = self.call(&[putfh(fh), getattr_size()]);
        r.ok(p::OP_PUTFH);
        r.ok(p::OP_GETATTR);
        r.with(|d| {
            let n = d.u32().unwrap();
            for _ in 0..n {
                d.u32().unwrap();
            }
            assert_eq!(d.u32().unwrap(), 8);
            d.u64().unwrap()
        })
    }

    /// READ through the MDS: Ok(data) or Err(status).
    pub fn read(&mut self, fh: &[u8], sid: &Sid, offset: u64, count: u32) -> Result<Vec<u8>, i32> {
        let mut r = self.call(&[putfh(fh), raw(p::OP_READ, W::default().sid(sid).u64(offset).u32(count))]);
        r.ok(p::OP_PUTFH);
        match r.next(p::OP_READ) {
            0 => Ok(r.with(|d| {
                let _eof = d.bool().unwrap();
                d.opaque_var(1 << 21).unwrap().to_vec()
            })),
            e => Err(e),
        }
    }

    /// CLOSE an open: its status.
    pub fn close(&mut self, fh: &[u8], sid: &Sid) -> i32 {
        let mut r = self.call(&[putfh(fh), raw(p::OP_CLOSE, W::default().u32(0).sid(sid))]);
        r.ok(p::OP_PUTFH);
        r.next(p::OP_CLOSE)
    }

    /// WRITE through the MDS (FILE_SYNC): Ok(count) or Err(status).
    pub fn write(&mut self, fh: &[u8], sid: &Sid, offset: u64, data: &[u8]) -> Result<u32, i32> {
        let mut r = self.call(&[putfh(fh), raw(p::OP_WRITE, W::default().sid(sid).u64(offset).u32(2).opaque(data))]);
        r.ok(p::OP_PUTFH);
        match r.next(p::OP_WRITE) {
            0 => Ok(r.with(|d| d.u32().unwrap())),
            e => Err(e),
        }
    }
}

pub fn uaddr_to_addr(uaddr: &str) -> SocketAddr {
    let parts: Vec<&str> = uaddr.rsplitn(3, '.').collect();
    let port = parts[1].parse::<u16>().unwrap() * 256 + parts[0].parse::<u16>().unwrap();
    format!("{}:{port}", parts[2]).parse().unwrap()
}

/// An NFSv3 connection to a DS as the given identity.
pub fn ds_client(addr: SocketAddr, uid: u32, gid: u32) -> Client3 {
    Client3::new(&addr.to_string(), TIMEOUT).with_cred(uid, gid)
}

/// Deterministic test data for [offset, offset+len) of a file `seed`.
pub fn pattern(seed: u8, offset: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((offset + i as u64).wrapping_mul(31).wrapping_add(seed as u64 * 7) % 251) as u8).collect()
}

pub fn admin(c: &Cluster, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    use std::io::{Read, Write};
    let addr = c.mds().admin_addr.unwrap();
    let mut s = std::net::TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    let b = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

pub fn metrics(c: &Cluster) -> String {
    use std::io::{Read, Write};
    let addr = c.mds().metrics_addr.unwrap();
    let mut s = std::net::TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

/// The value of one metric line (`name{labels}`), or None.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}
