//! NFSv4.2 (RFC 7862) on the wire: minor version 2 served alongside 4.1,
//! every 4.2 operation number answered (implemented, or NFS4ERR_NOTSUPP —
//! never a decode error), 4.2-only operations in a 4.1 COMPOUND
//! (NFS4ERR_OP_ILLEGAL), SEEK, ALLOCATE, DEALLOCATE and READ_PLUS with
//! their status codes, LAYOUTERROR / LAYOUTSTATS in a 4.2 COMPOUND, and
//! hostile arguments to each.

use super::*;
use crate::layout::{self as lo, LayoutServer};
use std::sync::atomic::{AtomicU32, Ordering};

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;

/// EXCHANGE_ID, CREATE_SESSION (with a back channel) and
/// RECLAIM_COMPLETE, all in minor version `minor` (1 or 2).
pub(super) fn connect_minor(s: &Server, owner: &[u8], minor: u32) -> Client {
    let args = p::EXCHANGE_ID4args {
        eia_clientowner: p::client_owner4 { co_verifier: [4; 8], co_ownerid: owner },
        eia_flags: 0,
        eia_state_protect: p::state_protect4_a::SP4_NONE,
        eia_client_impl_id: vec![],
    };
    let mut r = s.call(Req::new(minor).op(p::OP_EXCHANGE_ID, &args));
    assert_eq!(r.status, p::NFS4_OK, "EXCHANGE_ID in minor version {minor}");
    let x: p::EXCHANGE_ID4resok<'_> = r.ok(p::OP_EXCHANGE_ID);
    let (clientid, sequence) = (x.eir_clientid, x.eir_sequenceid);
    let cs = p::CREATE_SESSION4args {
        csa_clientid: clientid,
        csa_sequence: sequence,
        csa_flags: p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
        csa_fore_chan_attrs: chan(16, 8),
        csa_back_chan_attrs: chan(2, 1),
        csa_cb_program: 0x4000_0000,
        csa_sec_parms: vec![p::callback_sec_parms4::AUTH_NONE],
    };
    let mut r = s.call(Req::new(minor).op(p::OP_CREATE_SESSION, &cs));
    let ok: p::CREATE_SESSION4resok = r.ok(p::OP_CREATE_SESSION);
    let mut c = Client { clientid, session: ok.csr_sessionid, seq: 0 };
    let req = if minor == 2 { seq42(&mut c) } else { c.seq_req(false) };
    let mut r = s.call(req.op(p::OP_RECLAIM_COMPLETE, &p::RECLAIM_COMPLETE4args { rca_one_fs: false }));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_RECLAIM_COMPLETE);
    c
}

fn connect42(s: &Server, owner: &[u8]) -> Client {
    connect_minor(s, owner, 2)
}

/// A minor version 2 COMPOUND starting with SEQUENCE on slot 0.
pub(super) fn seq42(c: &mut Client) -> Req {
    c.seq += 1;
    Req::new(2).op(
        p::OP_SEQUENCE,
        &p::SEQUENCE4args { sa_sessionid: c.session, sa_sequenceid: c.seq, sa_slotid: 0, sa_highest_slotid: 0, sa_cachethis: false },
    )
}

/// SEQUENCE, PUTFH, then one operation given raw, in minor version 2:
/// the operation's status and the reply positioned at its body.
pub(super) fn on_fh42(s: &Server, c: &mut Client, fh: &[u8], opnum: u32, args: &[u8]) -> (i32, Reply) {
    let mut r = s.call(seq42(c).op(p::OP_PUTFH, &putfh(fh)).raw(opnum, args));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    let st = r.next(opnum as i32);
    (st, r)
}

pub(super) fn xdr<'a, T: Xdr<'a>>(v: &T) -> Vec<u8> {
    proto::xdr::to_vec(v).unwrap()
}

/// OPEN (create) `name` in a minor version 2 COMPOUND: stateid and handle.
pub(super) fn open42(s: &Server, c: &mut Client, name: &[u8], access: u32) -> (p::stateid4, Vec<u8>) {
    let (mask, vals) = fattr_mode(0o644);
    let args = p::OPEN4args {
        seqid: 0,
        share_access: access,
        share_deny: 0,
        owner: p::state_owner4 { clientid: 0, owner: b"v42" },
        openhow: p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 { attrmask: mask, attr_vals: &vals })),
        claim: p::open_claim4::CLAIM_NULL(name),
    };
    let mut r = s.call(seq42(c).raw(p::OP_PUTROOTFH as u32, &[]).op(p::OP_OPEN, &args).raw(p::OP_GETFH as u32, &[]));
    assert_eq!(r.status, p::NFS4_OK, "open {name:?} in minor version 2");
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTROOTFH);
    let o: p::OPEN4resok = r.ok(p::OP_OPEN);
    let sid = o.stateid.clone();
    let fh: p::GETFH4resok = r.ok(p::OP_GETFH);
    (sid, fh.object.to_vec())
}

pub(super) fn write42(s: &Server, c: &mut Client, fh: &[u8], sid: &p::stateid4, offset: u64, data: &[u8]) {
    let w = p::WRITE4args { stateid: sid.clone(), offset, stable: p::stable_how4::FILE_SYNC4, data };
    let (st, _) = on_fh42(s, c, fh, p::OP_WRITE as u32, &xdr(&w));
    assert_eq!(st, p::NFS4_OK, "WRITE at {offset}");
}

fn seek42(s: &Server, c: &mut Client, fh: &[u8], sid: &p::stateid4, offset: u64, what: p::data_content4) -> Result<(bool, u64), i32> {
    let a = p::SEEK4args { sa_stateid: sid.clone(), sa_offset: offset, sa_what: what };
    match on_fh42(s, c, fh, p::OP_SEEK as u32, &xdr(&a)) {
        (p::NFS4_OK, r) => {
            let res = p::seek_res4::decode(&mut r.body()).unwrap();
            Ok((res.sr_eof, res.sr_offset))
        }
        (st, _) => Err(st),
    }
}

fn space_op(s: &Server, c: &mut Client, fh: &[u8], op: i32, sid: &p::stateid4, offset: u64, length: u64) -> i32 {
    let args = if op == p::OP_ALLOCATE {
        xdr(&p::ALLOCATE4args { aa_stateid: sid.clone(), aa_offset: offset, aa_length: length })
    } else {
        xdr(&p::DEALLOCATE4args { da_stateid: sid.clone(), da_offset: offset, da_length: length })
    };
    on_fh42(s, c, fh, op as u32, &args).0
}

/// A READ_PLUS reply as (eof, segments), a segment being
/// (offset, Some(data)) or (offset, None) with the hole's length.
type Segments = (bool, Vec<(u64, Result<Vec<u8>, u64>)>);

fn read_plus42(s: &Server, c: &mut Client, fh: &[u8], sid: &p::stateid4, offset: u64, count: u32) -> Result<Segments, i32> {
    let a = p::READ_PLUS4args { rpa_stateid: sid.clone(), rpa_offset: offset, rpa_count: count };
    match on_fh42(s, c, fh, p::OP_READ_PLUS as u32, &xdr(&a)) {
        (p::NFS4_OK, r) => {
            let res = p::read_plus_res4::decode(&mut r.body()).unwrap();
            let segs = res
                .rpr_contents
                .iter()
                .map(|seg| match seg {
                    p::read_plus_content::NFS4_CONTENT_DATA(d) => (d.d_offset, Ok(d.d_data.to_vec())),
                    p::read_plus_content::NFS4_CONTENT_HOLE(h) => (h.di_offset, Err(h.di_length)),
                })
                .collect();
            Ok((res.rpr_eof, segs))
        }
        (st, _) => Err(st),
    }
}

/// The bytes a READ_PLUS reply stands for (holes as zeros), checking that
/// its segments are contiguous from `offset`.
fn flatten(offset: u64, segs: &[(u64, Result<Vec<u8>, u64>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (at, seg) in segs {
        assert_eq!(*at, offset + out.len() as u64, "segments contiguous and in order");
        match seg {
            Ok(data) => out.extend_from_slice(data),
            Err(len) => out.resize(out.len() + *len as usize, 0),
        }
    }
    out
}

fn size_of(s: &Server, c: &mut Client, fh: &[u8]) -> u64 {
    links_and_size(s, c, fh).unwrap().1
}

#[test]
fn minor_version_2_is_served_alongside_4_1_rfc7862() {
    // Sessions, OPEN, WRITE, READ and CLOSE work in minor version 2 as in
    // 4.1; a session made in one minor version serves COMPOUNDs of the
    // other; minor versions 0 and 3+ are NFS4ERR_MINOR_VERS_MISMATCH with
    // no operation evaluated (RFC 8881 §16.2.3).
    let s = server();
    for minor in [0u32, 3, 4, u32::MAX] {
        let r = s.call(Req::new(minor).raw(p::OP_PUTROOTFH as u32, &[]));
        assert_eq!((r.status, r.count), (p::NFS4ERR_MINOR_VERS_MISMATCH, 0), "minor version {minor}");
    }
    let mut c = connect42(&s, b"v42-client");
    let (sid, fh) = open42(&s, &mut c, b"f", 3);
    write42(&s, &mut c, &fh, &sid, 0, b"hello 4.2");
    let rd = p::READ4args { stateid: sid.clone(), offset: 0, count: 100 };
    let (st, r) = on_fh42(&s, &mut c, &fh, p::OP_READ as u32, &xdr(&rd));
    assert_eq!(st, p::NFS4_OK);
    assert_eq!(p::READ4resok::decode(&mut r.body()).unwrap().data, b"hello 4.2");
    // The same session in a 4.1 COMPOUND.
    assert_eq!(read_via(&s, &mut c, &fh, &sid, 100), Ok(b"hello 4.2".to_vec()));
    // A 4.1 session in a 4.2 COMPOUND.
    let mut c41 = connect(&s, b"v41-client");
    let mut r = s.call(seq42(&mut c41).raw(p::OP_PUTROOTFH as u32, &[]));
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    let (st, _) = on_fh42(&s, &mut c, &fh, p::OP_CLOSE as u32, &xdr(&p::CLOSE4args { seqid: 0, open_stateid: sid }));
    assert_eq!(st, p::NFS4_OK);
}

#[test]
fn callbacks_use_the_minor_version_of_the_session() {
    // A CB_COMPOUND's minorversion must be the session's (RFC 8881 §20.9
    // via §2.10.3.1; the Linux client matches a callback's session by
    // sessionid and minor version): a session created in 4.2 gets 4.2
    // callbacks, one created in 4.1 gets 4.1 callbacks.
    let s = server();
    let c2 = connect_minor(&s, b"cb-42", 2);
    let c1 = connect_minor(&s, b"cb-41", 1);
    let mut st = s.prog.state();
    let call2 = st.cb_begin(c2.clientid).expect("4.2 back channel usable");
    let call1 = st.cb_begin(c1.clientid).expect("4.1 back channel usable");
    assert_eq!((call2.session, call2.minor), (c2.session, 2));
    assert_eq!((call1.session, call1.minor), (c1.session, 1));
}

#[test]
fn every_4_2_operation_number_is_answered_rfc7862_rfc8276() {
    // In a 4.2 COMPOUND every operation number 59..=75 gets a result of
    // its own number: the implemented ones decode their arguments (absent
    // arguments are NFS4ERR_BADXDR, as for any operation), the others are
    // NFS4ERR_NOTSUPP whatever follows them — never OP_ILLEGAL or a decode
    // error. 76 and up are OP_ILLEGAL. In a 4.1 COMPOUND the 4.2-only
    // operations are not operations of that minor version: OP_ILLEGAL —
    // except LAYOUTERROR and LAYOUTSTATS, which the flex-files layout uses
    // from 4.1 (no layout server here: NFS4ERR_LAYOUTUNAVAILABLE).
    let s = server();
    let mut c = connect42(&s, b"opnums");
    let implemented = [
        p::OP_ALLOCATE,
        p::OP_CLONE,
        p::OP_COPY,
        p::OP_DEALLOCATE,
        p::OP_READ_PLUS,
        p::OP_SEEK,
        p::OP_GETXATTR,
        p::OP_SETXATTR,
        p::OP_LISTXATTRS,
        p::OP_REMOVEXATTR,
        p::OP_OFFLOAD_STATUS,
        p::OP_OFFLOAD_CANCEL,
    ];
    let layout = [p::OP_LAYOUTERROR, p::OP_LAYOUTSTATS];
    for op in 59u32..=75 {
        let mut r = s.call(seq42(&mut c).raw(p::OP_PUTROOTFH as u32, &[]).raw(op, &[0xff; 7]));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        let st = r.next(op as i32);
        let want = if implemented.contains(&(op as i32)) || layout.contains(&(op as i32)) {
            p::NFS4ERR_BADXDR
        } else {
            p::NFS4ERR_NOTSUPP
        };
        assert_eq!(st, want, "op {op} in minor version 2 with garbage arguments");
        assert_eq!(r.status, want);
        // The unimplemented ones say NOTSUPP with well-formed arguments too
        // (and with none at all).
        if want == p::NFS4ERR_NOTSUPP {
            let mut r = s.call(seq42(&mut c).raw(p::OP_PUTROOTFH as u32, &[]).raw(op, &[]));
            r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
            r.ok0(p::OP_PUTROOTFH);
            assert_eq!(r.next(op as i32), p::NFS4ERR_NOTSUPP, "op {op} without arguments");
        }
    }
    for op in [76u32, 99, 10043] {
        let mut r = s.call(seq42(&mut c).raw(op, &[]));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        assert_eq!(r.next(p::OP_ILLEGAL), p::NFS4ERR_OP_ILLEGAL, "op {op}");
    }
    // Minor version 1.
    for op in 59u32..=75 {
        let mut r = s.call(c.seq_req(false).raw(p::OP_PUTROOTFH as u32, &[]).raw(op, &[]));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTROOTFH);
        if layout.contains(&(op as i32)) {
            assert_eq!(r.next(op as i32), p::NFS4ERR_BADXDR, "op {op} (no arguments) in 4.1");
        } else {
            assert_eq!(r.next(p::OP_ILLEGAL), p::NFS4ERR_OP_ILLEGAL, "4.2-only op {op} in 4.1");
        }
    }
    // The server still answers.
    let mut r = s.call(seq42(&mut c).raw(p::OP_PUTROOTFH as u32, &[]));
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
}

#[test]
fn seek_finds_data_and_holes_rfc7862_15_11() {
    // A file with data at [0, 4 KiB) and [1 MiB, 1 MiB + 4 KiB) and a hole
    // between: SEEK answers the next data / hole from each offset, the
    // virtual hole at the end with sr_eof, data not found with sr_eof and
    // the size, NFS4ERR_NXIO at or past the end (offsets past 2^63 too).
    // The stateid is checked (BAD_STATEID), a directory is NFS4ERR_ISDIR,
    // truncated arguments and an unknown sa_what are NFS4ERR_BADXDR.
    let s = server();
    let mut c = connect42(&s, b"seek");
    let (sid, fh) = open42(&s, &mut c, b"sparse", 3);
    write42(&s, &mut c, &fh, &sid, 0, &[1; PAGE as usize]);
    write42(&s, &mut c, &fh, &sid, MIB, &[2; PAGE as usize]);
    let (data, hole) = (p::data_content4::NFS4_CONTENT_DATA, p::data_content4::NFS4_CONTENT_HOLE);
    let end = MIB + PAGE;
    assert_eq!(seek42(&s, &mut c, &fh, &sid, 0, data), Ok((false, 0)));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, 100, data), Ok((false, 100)));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, 0, hole), Ok((false, PAGE)));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, PAGE, data), Ok((false, MIB)));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, PAGE + 1, hole), Ok((false, PAGE + 1)));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, MIB, hole), Ok((true, end)), "the virtual hole at the end");
    assert_eq!(seek42(&s, &mut c, &fh, &sid, end, data), Err(p::NFS4ERR_NXIO));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, end, hole), Err(p::NFS4ERR_NXIO));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, 1 << 63, data), Err(p::NFS4ERR_NXIO));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, u64::MAX, hole), Err(p::NFS4ERR_NXIO));
    // Extend with a hole: data past the last data byte is not found.
    let sa = p::SETATTR4args { stateid: sid.clone(), obj_attributes: size_attr(4 * MIB) };
    let (st, _) = on_fh42(&s, &mut c, &fh, p::OP_SETATTR as u32, &xdr(&sa));
    assert_eq!(st, p::NFS4_OK);
    assert_eq!(seek42(&s, &mut c, &fh, &sid, end, data), Ok((true, 4 * MIB)), "only holes follow");
    assert_eq!(seek42(&s, &mut c, &fh, &sid, end, hole), Ok((false, end)));
    // Stateids and types.
    // A forged stateid is another instance's (STALE); a seqid from the
    // future of a real one is BAD_STATEID (RFC 8881 §8.2.3).
    let forged = p::stateid4 { seqid: 1, other: [9; 12] };
    let future = p::stateid4 { seqid: sid.seqid + 5, other: sid.other };
    assert_eq!(seek42(&s, &mut c, &fh, &forged, 0, data), Err(p::NFS4ERR_STALE_STATEID));
    assert_eq!(seek42(&s, &mut c, &fh, &future, 0, data), Err(p::NFS4ERR_BAD_STATEID));
    let root = s.fs.root(EXPORT).unwrap().to_bytes();
    assert_eq!(seek42(&s, &mut c, &root, &stateid0(), 0, data), Err(p::NFS4ERR_ISDIR));
    let mut bad = xdr(&p::SEEK4args { sa_stateid: sid.clone(), sa_offset: 0, sa_what: data });
    let n = bad.len();
    bad[n - 4..].copy_from_slice(&7u32.to_be_bytes());
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_SEEK as u32, &bad).0, p::NFS4ERR_BADXDR, "sa_what 7");
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_SEEK as u32, &bad[..n - 4]).0, p::NFS4ERR_BADXDR, "truncated");
    // Without a current filehandle.
    let a = p::SEEK4args { sa_stateid: sid.clone(), sa_offset: 0, sa_what: data };
    let mut r = s.call(seq42(&mut c).op(p::OP_SEEK, &a));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    assert_eq!(r.next(p::OP_SEEK), p::NFS4ERR_NOFILEHANDLE);
}

fn size_attr(size: u64) -> p::fattr4<'static> {
    let vals: &'static [u8] = Box::leak(size.to_be_bytes().to_vec().into_boxed_slice());
    p::fattr4 { attrmask: crate::attrs::Bitmap::of(&[crate::attrs::SIZE]).to_vec(), attr_vals: vals }
}

#[test]
fn allocate_and_deallocate_account_space_rfc7862_15_1_15_4() {
    // ALLOCATE reserves space (the backend's used bytes go up by the pages
    // it allocates, the size grows to the range's end) and the range reads
    // as zeros and SEEKs as data; DEALLOCATE punches a hole (space back,
    // zeros, size kept). An ALLOCATE the backend cannot hold is
    // NFS4ERR_NOSPC and changes nothing; in a volume, NFS4ERR_DQUOT. A
    // read-only open is NFS4ERR_OPENMODE; a zero length NFS4ERR_INVAL; a
    // range past 2^63 NFS4ERR_FBIG.
    let s = server_with(Config { grace_time_s: 0, ..Config::default() }, 8 * MIB);
    let mut c = connect42(&s, b"space");
    let (sid, fh) = open42(&s, &mut c, b"prealloc", 3);
    let used0 = s.fs.used_bytes();
    let charge = vfs::memfs::CHUNK_CHARGE_BYTES;
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, 0, 64 * PAGE), p::NFS4_OK);
    assert_eq!(s.fs.used_bytes(), used0 + 64 * charge);
    assert_eq!(size_of(&s, &mut c, &fh), 64 * PAGE);
    assert_eq!(read_via(&s, &mut c, &fh, &sid, 1 << 20), Ok(vec![0; 64 * PAGE as usize]));
    assert_eq!(seek42(&s, &mut c, &fh, &sid, 0, p::data_content4::NFS4_CONTENT_HOLE), Ok((true, 64 * PAGE)));
    // Allocating again what is allocated costs nothing.
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, PAGE, 8 * PAGE), p::NFS4_OK);
    assert_eq!(s.fs.used_bytes(), used0 + 64 * charge);
    // Data written, then a hole punched through the middle of it.
    write42(&s, &mut c, &fh, &sid, 0, &[5; 64 * PAGE as usize]);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_DEALLOCATE, &sid, 8 * PAGE + 10, 16 * PAGE), p::NFS4_OK);
    assert_eq!(s.fs.used_bytes(), used0 + 49 * charge, "15 whole pages given back");
    assert_eq!(size_of(&s, &mut c, &fh), 64 * PAGE, "size kept");
    let got = read_via(&s, &mut c, &fh, &sid, 1 << 20).unwrap();
    let mut want = vec![5u8; 64 * PAGE as usize];
    want[(8 * PAGE + 10) as usize..(24 * PAGE + 10) as usize].fill(0);
    assert!(got == want, "the punched range reads as zeros, the rest is kept");
    assert_eq!(seek42(&s, &mut c, &fh, &sid, 0, p::data_content4::NFS4_CONTENT_HOLE), Ok((false, 9 * PAGE)));
    // Too much for the backend: NOSPC, nothing changed.
    let used = s.fs.used_bytes();
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, 0, 16 * MIB), p::NFS4ERR_NOSPC);
    assert_eq!((s.fs.used_bytes(), size_of(&s, &mut c, &fh)), (used, 64 * PAGE));
    // Hostile ranges and modes.
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, 0, 0), p::NFS4ERR_INVAL);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_DEALLOCATE, &sid, 0, 0), p::NFS4ERR_INVAL);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, u64::MAX, 2), p::NFS4ERR_FBIG);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, 1 << 63, 1), p::NFS4ERR_FBIG);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_DEALLOCATE, &sid, 1 << 63, 1 << 62), p::NFS4ERR_FBIG);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, 1 << 50, 1), p::NFS4ERR_FBIG, "past the backend's largest file");
    // A forged stateid is another instance's (STALE); a seqid from the
    // future of a real one is BAD_STATEID (RFC 8881 §8.2.3).
    let forged = p::stateid4 { seqid: 1, other: [9; 12] };
    let future = p::stateid4 { seqid: sid.seqid + 5, other: sid.other };
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &forged, 0, 1), p::NFS4ERR_STALE_STATEID);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &future, 0, 1), p::NFS4ERR_BAD_STATEID);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_DEALLOCATE, &future, 0, 1), p::NFS4ERR_BAD_STATEID);
    let (rsid, rfh) = open42(&s, &mut c, b"readonly", 1);
    assert_eq!(space_op(&s, &mut c, &rfh, p::OP_ALLOCATE, &rsid, 0, 1), p::NFS4ERR_OPENMODE);
    assert_eq!(space_op(&s, &mut c, &rfh, p::OP_DEALLOCATE, &rsid, 0, 1), p::NFS4ERR_OPENMODE);
    let root = s.fs.root(EXPORT).unwrap().to_bytes();
    assert_eq!(space_op(&s, &mut c, &root, p::OP_ALLOCATE, &stateid0(), 0, 1), p::NFS4ERR_ISDIR);
    // A volume: DQUOT, nothing changed.
    let (vol, _) = s.fs.create(&s.fs.root(EXPORT).unwrap(), b"vol", vfs::NodeKind::Directory, 0o777, &vfs::Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
    s.fs.set_quota(&vol, 32 * charge).unwrap();
    let (qf, _) = s.fs.create(&vol, b"q", vfs::NodeKind::File, 0o666, &vfs::Cred::ROOT, vfs::CreateMode::Guarded).unwrap();
    let qfh = qf.to_bytes();
    let used = s.fs.used_bytes();
    assert_eq!(space_op(&s, &mut c, &qfh, p::OP_ALLOCATE, &stateid0(), 0, 32 * PAGE), p::NFS4ERR_DQUOT);
    assert_eq!((s.fs.used_bytes(), size_of(&s, &mut c, &qfh)), (used, 0));
    assert_eq!(space_op(&s, &mut c, &qfh, p::OP_ALLOCATE, &stateid0(), 0, 16 * PAGE), p::NFS4_OK);
    assert_eq!(s.fs.used_bytes(), used + 16 * charge);
}

#[test]
fn read_plus_returns_data_and_hole_segments_rfc7862_15_10() {
    // Data [0, 4 KiB), a hole to 512 KiB, data [512 KiB, 512 KiB + 6000): one
    // READ_PLUS of everything is DATA, HOLE, DATA with eof, and stands for
    // exactly the bytes READ returns; from inside the hole it starts with
    // the rest of the hole; a count ending inside a segment cuts it there
    // (no eof); past the end it is eof with no segments; a file extended by
    // SETATTR ends in a hole segment. Bad stateids, directories and
    // truncated arguments get their errors.
    let s = server();
    // Past the hole: within one READ_PLUS (read_bytes_max, 1 MiB).
    const AT: u64 = 512 << 10;
    let mut c = connect42(&s, b"readplus");
    let (sid, fh) = open42(&s, &mut c, b"rp", 3);
    let a: Vec<u8> = (0..PAGE).map(|i| (i % 200) as u8 + 1).collect();
    let b: Vec<u8> = (0..6000u32).map(|i| (i % 99) as u8 + 7).collect();
    write42(&s, &mut c, &fh, &sid, 0, &a);
    write42(&s, &mut c, &fh, &sid, AT, &b);
    let end = AT + 6000;
    let (eof, segs) = read_plus42(&s, &mut c, &fh, &sid, 0, 1 << 20).unwrap();
    assert!(eof);
    assert_eq!(segs.len(), 3, "data, hole, data");
    assert_eq!(segs[0], (0, Ok(a.clone())));
    assert_eq!(segs[1], (PAGE, Err(AT - PAGE)));
    assert_eq!(segs[2], (AT, Ok(b.clone())));
    let flat = flatten(0, &segs);
    assert_eq!(flat.len() as u64, end);
    assert!(Ok(flat) == read_via(&s, &mut c, &fh, &sid, 1 << 20), "READ_PLUS stands for READ's bytes");
    // From inside the hole.
    let (eof, segs) = read_plus42(&s, &mut c, &fh, &sid, 8192, 1 << 20).unwrap();
    assert!(eof);
    assert_eq!(segs, vec![(8192, Err(AT - 8192)), (AT, Ok(b.clone()))]);
    // A count ending inside data, then inside the hole.
    let (eof, segs) = read_plus42(&s, &mut c, &fh, &sid, AT + 10, 100).unwrap();
    assert!(!eof);
    assert_eq!(segs, vec![(AT + 10, Ok(b[10..110].to_vec()))]);
    let (eof, segs) = read_plus42(&s, &mut c, &fh, &sid, 100, 8000).unwrap();
    assert!(!eof);
    assert_eq!(segs, vec![(100, Ok(a[100..].to_vec())), (PAGE, Err(8100 - PAGE))]);
    // Past the end; at 2^63 and beyond.
    for off in [end, end + 1, 1 << 63, u64::MAX] {
        assert_eq!(read_plus42(&s, &mut c, &fh, &sid, off, 4096), Ok((true, vec![])), "offset {off}");
    }
    // A file that ends in a hole.
    let sa = p::SETATTR4args { stateid: sid.clone(), obj_attributes: size_attr(AT + (256 << 10)) };
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_SETATTR as u32, &xdr(&sa)).0, p::NFS4_OK);
    let (eof, segs) = read_plus42(&s, &mut c, &fh, &sid, AT, 1 << 20).unwrap();
    assert!(eof);
    // Space is allocated by the page: the zeros after the written bytes in
    // the last page are data (as after a write on a local file system).
    let mut page_tail = b.clone();
    page_tail.resize(2 * PAGE as usize, 0);
    assert_eq!(segs, vec![(AT, Ok(page_tail)), (AT + 2 * PAGE, Err(256 * 1024 - 2 * PAGE))]);
    // Errors.
    // A forged stateid is another instance's (STALE); a seqid from the
    // future of a real one is BAD_STATEID (RFC 8881 §8.2.3).
    let forged = p::stateid4 { seqid: 1, other: [9; 12] };
    let future = p::stateid4 { seqid: sid.seqid + 5, other: sid.other };
    assert_eq!(read_plus42(&s, &mut c, &fh, &forged, 0, 10), Err(p::NFS4ERR_STALE_STATEID));
    assert_eq!(read_plus42(&s, &mut c, &fh, &future, 0, 10), Err(p::NFS4ERR_BAD_STATEID));
    let root = s.fs.root(EXPORT).unwrap().to_bytes();
    assert_eq!(read_plus42(&s, &mut c, &root, &stateid0(), 0, 10), Err(p::NFS4ERR_ISDIR));
    let args = xdr(&p::READ_PLUS4args { rpa_stateid: sid.clone(), rpa_offset: 0, rpa_count: 10 });
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_READ_PLUS as u32, &args[..args.len() - 2]).0, p::NFS4ERR_BADXDR);
}

#[test]
fn read_plus_of_a_page_striped_file_is_bounded_and_resumable() {
    // Data on every other page: a READ_PLUS of the whole file stops after
    // SEGMENTS_MAX segments without eof; asking again from where it
    // stopped, segment after segment, rebuilds exactly the file.
    let s = server();
    let mut c = connect42(&s, b"striped");
    let (sid, fh) = open42(&s, &mut c, b"stripes", 3);
    let pages = 200u64;
    for p in (0..pages).step_by(2) {
        write42(&s, &mut c, &fh, &sid, p * PAGE, &vec![p as u8 + 1; PAGE as usize]);
    }
    let size = (pages - 1) * PAGE;
    let mut all = Vec::new();
    let mut rounds = 0;
    loop {
        let (eof, segs) = read_plus42(&s, &mut c, &fh, &sid, all.len() as u64, 4 << 20).unwrap();
        assert!(segs.len() <= 64, "bounded segments per reply");
        all.extend(flatten(all.len() as u64, &segs));
        rounds += 1;
        if eof {
            break;
        }
        assert!(!segs.is_empty(), "progress");
    }
    assert!(rounds >= 3, "200 alternating pages need more than one reply");
    assert_eq!(all.len() as u64, size);
    assert!(Ok(all) == read_via(&s, &mut c, &fh, &sid, 4 << 20));
}

/// A layout server that accepts one stateid and counts the reports.
struct Counting {
    errors: AtomicU32,
    stats: AtomicU32,
}

const LAYOUT_SID_OTHER: [u8; 12] = [0x4c; 12];

impl LayoutServer for Counting {
    fn layout_type(&self) -> u32 {
        p::LAYOUT4_FLEX_FILES as u32
    }
    fn blksize(&self) -> u32 {
        4096
    }
    fn is_layout_stateid(&self, sid: &crate::state::Stateid) -> bool {
        sid.other == LAYOUT_SID_OTHER
    }
    fn layoutget(&self, _: &lo::LayoutGetArgs) -> Result<lo::Layout, i32> {
        Err(p::NFS4ERR_LAYOUTUNAVAILABLE)
    }
    fn getdeviceinfo(&self, _: &lo::DeviceId) -> Result<Vec<u8>, i32> {
        Err(p::NFS4ERR_NOENT)
    }
    fn getdevicelist(&self) -> Vec<lo::DeviceId> {
        vec![]
    }
    fn layoutreturn(&self, _: u64, _: Option<lo::IoMode>, _: &lo::Return<'_>) -> Result<Option<crate::state::Stateid>, i32> {
        Ok(None)
    }
    fn layoutcommit(&self, _: &lo::Commit<'_>) -> Result<Option<u64>, i32> {
        Ok(None)
    }
    fn layouterror(&self, _: u64, _: &vfs::FileHandle, _: &crate::state::Stateid, errors: &[lo::DeviceError]) -> Result<(), i32> {
        self.errors.fetch_add(errors.len() as u32, Ordering::Relaxed);
        Ok(())
    }
    fn layoutstats(&self, _: u64, _: &vfs::FileHandle, _: &crate::state::Stateid, _: &lo::DeviceId, _: &[u8]) -> Result<(), i32> {
        self.stats.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[test]
fn layouterror_and_layoutstats_in_minor_version_2_rfc7862_15_6_15_7() {
    // The flex-files reports as 4.2 operations: a layout stateid the
    // layout server knows is accepted and the report handed on (counted);
    // another stateid is NFS4ERR_BAD_STATEID and nothing is reported; a
    // range that wraps is NFS4ERR_INVAL; a wrong layout type in
    // LAYOUTSTATS NFS4ERR_UNKNOWN_LAYOUTTYPE; truncated arguments
    // NFS4ERR_BADXDR.
    let fs = Arc::new(MemFs::new(MemFsConfig { export_id: EXPORT, capacity_bytes: 64 << 20 }));
    let counting = Arc::new(Counting { errors: AtomicU32::new(0), stats: AtomicU32::new(0) });
    let cfg = Config { root_export: EXPORT, grace_time_s: 0, ..Config::default() };
    let prog = Nfs4Program::new_without_reaper(fs.clone(), cfg).with_layouts(counting.clone());
    let s = Server { prog, fs };
    let mut c = connect42(&s, b"layouts");
    let (_, fh) = open42(&s, &mut c, b"laid-out", 3);
    let good = p::stateid4 { seqid: 1, other: LAYOUT_SID_OTHER };
    let bad = p::stateid4 { seqid: 1, other: [3; 12] };
    let err = |sid: &p::stateid4, offset: u64, length: u64| {
        xdr(&p::LAYOUTERROR4args {
            lea_offset: offset,
            lea_length: length,
            lea_stateid: sid.clone(),
            lea_errors: vec![p::device_error4 { de_deviceid: [1; 16], de_status: p::nfsstat4::NFS4ERR_NXIO, de_opnum: p::nfs_opnum4::OP_READ }],
        })
    };
    let stats = |sid: &p::stateid4, ltype: u32| {
        let mut v = Vec::new();
        v.extend_from_slice(&0u64.to_be_bytes());
        v.extend_from_slice(&u64::MAX.to_be_bytes());
        v.extend_from_slice(&xdr(sid));
        for n in [1u64, 4096, 2, 8192] {
            v.extend_from_slice(&n.to_be_bytes());
        }
        v.extend_from_slice(&[1; 16]);
        v.extend_from_slice(&ltype.to_be_bytes());
        v.extend_from_slice(&0u32.to_be_bytes());
        v
    };
    let ff = p::LAYOUT4_FLEX_FILES as u32;
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_LAYOUTERROR as u32, &err(&good, 0, 4096)).0, p::NFS4_OK);
    assert_eq!(counting.errors.load(Ordering::Relaxed), 1);
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_LAYOUTERROR as u32, &err(&bad, 0, 4096)).0, p::NFS4ERR_BAD_STATEID);
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_LAYOUTERROR as u32, &err(&good, u64::MAX - 1, 10)).0, p::NFS4ERR_INVAL);
    let e = err(&good, 0, 1);
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_LAYOUTERROR as u32, &e[..e.len() - 3]).0, p::NFS4ERR_BADXDR);
    assert_eq!(counting.errors.load(Ordering::Relaxed), 1, "refused reports are not handed on");
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_LAYOUTSTATS as u32, &stats(&good, ff)).0, p::NFS4_OK);
    assert_eq!(counting.stats.load(Ordering::Relaxed), 1);
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_LAYOUTSTATS as u32, &stats(&bad, ff)).0, p::NFS4ERR_BAD_STATEID);
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_LAYOUTSTATS as u32, &stats(&good, 1)).0, p::NFS4ERR_UNKNOWN_LAYOUTTYPE);
    let st = stats(&good, ff);
    assert_eq!(on_fh42(&s, &mut c, &fh, p::OP_LAYOUTSTATS as u32, &st[..40]).0, p::NFS4ERR_BADXDR);
    assert_eq!(counting.stats.load(Ordering::Relaxed), 1);
}

fn xattr_op(s: &Server, c: &mut Client, fh: &[u8], op: i32, args: &[u8]) -> (i32, Reply) {
    on_fh42(s, c, fh, op as u32, args)
}

fn setxattr<'a>(name: &'a [u8], value: &'a [u8], option: p::setxattr_option4) -> Vec<u8> {
    xdr(&p::SETXATTR4args { sxa_option: option, sxa_key: name, sxa_value: value })
}

fn listxattrs(s: &Server, c: &mut Client, fh: &[u8], cookie: u64, maxcount: u32) -> Result<(u64, Vec<Vec<u8>>, bool), i32> {
    let args = xdr(&p::LISTXATTRS4args { lxa_cookie: cookie, lxa_maxcount: maxcount });
    match xattr_op(s, c, fh, p::OP_LISTXATTRS, &args) {
        (p::NFS4_OK, r) => {
            let ok = p::LISTXATTRS4resok::decode(&mut r.body()).unwrap();
            Ok((ok.lxr_cookie, ok.lxr_names.iter().map(|n| n.to_vec()).collect(), ok.lxr_eof))
        }
        (st, _) => Err(st),
    }
}

#[test]
fn extended_attributes_rfc8276() {
    // xattr_support is true over memfs; SETXATTR CREATE / REPLACE / EITHER
    // follow §8.4.2 (NFS4ERR_EXIST, NFS4ERR_NOXATTR) and answer a
    // change_info4 whose change moved; GETXATTR returns the value or
    // NFS4ERR_NOXATTR; LISTXATTRS pages by cookie within lxa_maxcount
    // (NFS4ERR_TOOSMALL when not one name fits); REMOVEXATTR removes once.
    // Hostile: a value over 64 KiB is NFS4ERR_XATTR2BIG, a name over 255
    // bytes NFS4ERR_NAMETOOLONG, an empty one NFS4ERR_INVAL, an unknown
    // option or truncated arguments NFS4ERR_BADXDR; another user may read
    // a 0644 file's attributes but not change them (NFS4ERR_ACCESS).
    let s = server();
    let mut c = connect42(&s, b"xattrs");
    let (_, fh) = open42(&s, &mut c, b"xf", 3);
    let req = crate::attrs::Bitmap::of(&[crate::attrs::XATTR_SUPPORT]);
    let ga = p::GETATTR4args { attr_request: req.to_vec() };
    let (st, r) = on_fh42(&s, &mut c, &fh, p::OP_GETATTR as u32, &xdr(&ga));
    assert_eq!(st, p::NFS4_OK);
    let g = p::GETATTR4resok::decode(&mut r.body()).unwrap();
    assert_eq!(g.obj_attributes.attrmask, req.to_vec(), "xattr_support is answered");
    assert_eq!(g.obj_attributes.attr_vals, &1u32.to_be_bytes(), "and true");

    use p::setxattr_option4::{SETXATTR4_CREATE as CREATE, SETXATTR4_EITHER as EITHER, SETXATTR4_REPLACE as REPLACE};
    let (st, r) = xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"color", b"blue", CREATE));
    assert_eq!(st, p::NFS4_OK);
    let ci = p::change_info4::decode(&mut r.body()).unwrap();
    assert!(ci.after > ci.before, "change_info4 shows the change");
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"color", b"red", CREATE)).0, p::NFS4ERR_EXIST);
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"shape", b"round", REPLACE)).0, p::NFS4ERR_NOXATTR);
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"color", b"green", REPLACE)).0, p::NFS4_OK);
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"a", b"", EITHER)).0, p::NFS4_OK);
    let get = |name: &[u8]| xdr(&p::GETXATTR4args { gxa_name: name });
    let (st, r) = xattr_op(&s, &mut c, &fh, p::OP_GETXATTR, &get(b"color"));
    assert_eq!(st, p::NFS4_OK);
    assert_eq!(r.body().opaque_var(1 << 20).unwrap(), b"green");
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_GETXATTR, &get(b"shape")).0, p::NFS4ERR_NOXATTR);
    // Listing: everything, then one name at a time by cookie.
    assert_eq!(listxattrs(&s, &mut c, &fh, 0, 4096), Ok((2, vec![b"a".to_vec(), b"color".to_vec()], true)));
    assert_eq!(listxattrs(&s, &mut c, &fh, 0, 16 + 8), Ok((1, vec![b"a".to_vec()], false)));
    assert_eq!(listxattrs(&s, &mut c, &fh, 1, 16 + 12), Ok((2, vec![b"color".to_vec()], true)));
    assert_eq!(listxattrs(&s, &mut c, &fh, 1, 16 + 8), Err(p::NFS4ERR_TOOSMALL), "\"color\" needs 12 bytes");
    assert_eq!(listxattrs(&s, &mut c, &fh, 0, 10), Err(p::NFS4ERR_TOOSMALL));
    assert_eq!(listxattrs(&s, &mut c, &fh, u64::MAX, 4096), Ok((u64::MAX, vec![], true)));
    // Removal.
    let rm = |name: &[u8]| xdr(&p::REMOVEXATTR4args { rxa_name: name });
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_REMOVEXATTR, &rm(b"a")).0, p::NFS4_OK);
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_REMOVEXATTR, &rm(b"a")).0, p::NFS4ERR_NOXATTR);
    assert_eq!(listxattrs(&s, &mut c, &fh, 0, 4096), Ok((1, vec![b"color".to_vec()], true)));
    // Hostile.
    let big = vec![7u8; vfs::XATTR_VALUE_BYTES_MAX + 1];
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"big", &big, EITHER)).0, p::NFS4ERR_XATTR2BIG);
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(&[b'n'; 256], b"v", EITHER)).0, p::NFS4ERR_NAMETOOLONG);
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"", b"v", EITHER)).0, p::NFS4ERR_INVAL);
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_GETXATTR, &get(&[b'n'; 300])).0, p::NFS4ERR_NAMETOOLONG);
    let mut bad = setxattr(b"k", b"v", EITHER);
    bad[..4].copy_from_slice(&9u32.to_be_bytes());
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &bad).0, p::NFS4ERR_BADXDR, "option 9");
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &bad[4..]).0, p::NFS4ERR_BADXDR, "truncated");
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_LISTXATTRS, &[0; 9]).0, p::NFS4ERR_BADXDR);
    // Another user: may read, may not change.
    let other = Auth::Sys { stamp: 0, machine_name: b"t", uid: 1000, gid: 1000, gids: &[] };
    let call_other = |c: &mut Client, op: i32, args: &[u8]| {
        let req = seq42(c).op(p::OP_PUTFH, &putfh(&fh)).raw(op as u32, args);
        let mut r = Reply::parse(s.call_as(other, 1, &req.bytes()));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTFH);
        r.next(op)
    };
    assert_eq!(call_other(&mut c, p::OP_GETXATTR, &get(b"color")), p::NFS4_OK);
    assert_eq!(call_other(&mut c, p::OP_SETXATTR, &setxattr(b"color", b"x", EITHER)), p::NFS4ERR_ACCESS);
    assert_eq!(call_other(&mut c, p::OP_REMOVEXATTR, &rm(b"color")), p::NFS4ERR_ACCESS);
    // In a 4.1 COMPOUND they are not operations.
    let mut r = s.call(c.seq_req(false).op(p::OP_PUTFH, &putfh(&fh)).raw(p::OP_GETXATTR as u32, &get(b"color")));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_ILLEGAL), p::NFS4ERR_OP_ILLEGAL);
}

pub(super) fn copy_args(src: &p::stateid4, dst: &p::stateid4, from: u64, to: u64, count: u64) -> p::COPY4args<'static> {
    p::COPY4args {
        ca_src_stateid: src.clone(),
        ca_dst_stateid: dst.clone(),
        ca_src_offset: from,
        ca_dst_offset: to,
        ca_count: count,
        ca_consecutive: true,
        ca_synchronous: true,
        ca_source_server: vec![],
    }
}

/// SEQUENCE, PUTFH src, SAVEFH, PUTFH dst, COPY: the COPY's status, or
/// its whole result (synchronous or not).
pub(super) fn copy42_res(s: &Server, c: &mut Client, src: &[u8], dst: &[u8], args: &p::COPY4args<'_>) -> Result<p::COPY4resok, i32> {
    let mut r = s.call(
        seq42(c).op(p::OP_PUTFH, &putfh(src)).raw(p::OP_SAVEFH as u32, &[]).op(p::OP_PUTFH, &putfh(dst)).op(p::OP_COPY, args),
    );
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    r.ok0(p::OP_SAVEFH);
    r.ok0(p::OP_PUTFH);
    match r.next(p::OP_COPY) {
        p::NFS4_OK => Ok(p::COPY4resok::decode(&mut r.body()).unwrap()),
        st => Err(st),
    }
}

/// `copy42_res` of a copy done synchronously: the write_response4.
fn copy42(s: &Server, c: &mut Client, src: &[u8], dst: &[u8], args: &p::COPY4args<'_>) -> Result<p::write_response4, i32> {
    match copy42_res(s, c, src, dst, args) {
        Ok(ok) => {
            assert!(ok.cr_requirements.cr_synchronous && ok.cr_requirements.cr_consecutive);
            assert!(ok.cr_response.wr_callback_id.is_empty(), "done synchronously: no callback id");
            assert_eq!(ok.cr_response.wr_committed, p::stable_how4::FILE_SYNC4);
            assert_eq!(ok.cr_response.wr_writeverf, s.fs.write_verifier());
            Ok(ok.cr_response)
        }
        Err(st) => Err(st),
    }
}

#[test]
fn copy_inside_the_server_rfc7862_15_2() {
    // COPY from the saved to the current filehandle: the destination reads
    // back the source's bytes (count 0: to the source's end; offsets on
    // both sides); a copy larger than COPY_BYTES_MAX is answered short and
    // the client's next COPY does the rest; an asynchronous request is
    // done synchronously. Errors: a range past the source's end or
    // overlapping in one file NFS4ERR_INVAL, a copy from another server
    // NFS4ERR_NOTSUPP, a read-only destination open NFS4ERR_OPENMODE, a bad
    // source stateid NFS4ERR_BAD_STATEID, no saved filehandle
    // NFS4ERR_NOFILEHANDLE, a directory NFS4ERR_ISDIR.
    let s = server();
    let mut c = connect42(&s, b"copier");
    let (ssid, src) = open42(&s, &mut c, b"src", 3);
    let (dsid, dst) = open42(&s, &mut c, b"dst", 3);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
    write42(&s, &mut c, &src, &ssid, 0, &data);
    assert_eq!(copy42(&s, &mut c, &src, &dst, &copy_args(&ssid, &dsid, 0, 0, 0)).unwrap().wr_count, 100_000);
    assert_eq!(read_via(&s, &mut c, &dst, &dsid, 1 << 20), Ok(data.clone()));
    assert_eq!(copy42(&s, &mut c, &src, &dst, &copy_args(&ssid, &dsid, 1000, 200_000, 5000)).unwrap().wr_count, 5000);
    let got = read_via(&s, &mut c, &dst, &dsid, 1 << 20).unwrap();
    assert_eq!(got.len(), 205_000);
    assert!(got[200_000..] == data[1000..6000] && got[100_000..200_000].iter().all(|&b| b == 0));
    let mut a = copy_args(&ssid, &dsid, 0, 0, 10);
    a.ca_synchronous = false;
    assert_eq!(copy42(&s, &mut c, &src, &dst, &a).unwrap().wr_count, 10, "asked async, done sync");
    // Ranges.
    assert_eq!(copy42(&s, &mut c, &src, &dst, &copy_args(&ssid, &dsid, 99_000, 0, 1001)), Err(p::NFS4ERR_INVAL));
    assert_eq!(copy42(&s, &mut c, &src, &dst, &copy_args(&ssid, &dsid, 100_001, 0, 0)), Err(p::NFS4ERR_INVAL));
    assert_eq!(copy42(&s, &mut c, &src, &dst, &copy_args(&ssid, &dsid, u64::MAX, 0, 2)), Err(p::NFS4ERR_INVAL));
    assert_eq!(copy42(&s, &mut c, &src, &dst, &copy_args(&ssid, &dsid, 0, u64::MAX - 5, 10)), Err(p::NFS4ERR_FBIG));
    assert_eq!(copy42(&s, &mut c, &src, &src, &copy_args(&ssid, &ssid, 0, 500, 1000)), Err(p::NFS4ERR_INVAL), "overlap");
    assert_eq!(copy42(&s, &mut c, &src, &src, &copy_args(&ssid, &ssid, 0, 50_000, 1000)).unwrap().wr_count, 1000);
    // Stateids, opens, handles.
    let (rsid, ro) = open42(&s, &mut c, b"ro", 1);
    assert_eq!(copy42(&s, &mut c, &src, &ro, &copy_args(&ssid, &rsid, 0, 0, 10)), Err(p::NFS4ERR_OPENMODE));
    let future = p::stateid4 { seqid: ssid.seqid + 5, other: ssid.other };
    assert_eq!(copy42(&s, &mut c, &src, &dst, &copy_args(&future, &dsid, 0, 0, 10)), Err(p::NFS4ERR_BAD_STATEID));
    let root = s.fs.root(EXPORT).unwrap().to_bytes();
    assert_eq!(copy42(&s, &mut c, &root, &dst, &copy_args(&stateid0(), &dsid, 0, 0, 10)), Err(p::NFS4ERR_ISDIR));
    let mut a = copy_args(&ssid, &dsid, 0, 0, 10);
    a.ca_source_server = vec![p::netloc4::NL4_NAME(b"other.example")];
    assert_eq!(copy42(&s, &mut c, &src, &dst, &a), Err(p::NFS4ERR_NOTSUPP), "inter-server copy");
    let mut r = s.call(seq42(&mut c).op(p::OP_PUTFH, &putfh(&dst)).op(p::OP_COPY, &copy_args(&ssid, &dsid, 0, 0, 10)));
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    assert_eq!(r.next(p::OP_COPY), p::NFS4ERR_NOFILEHANDLE, "no saved filehandle");
    // Larger than one COPY does: short, then the rest.
    let total = super::super::ops::COPY_BYTES_MAX + 300_000;
    let (bsid, big) = open42(&s, &mut c, b"big", 3);
    let chunk = vec![0x5au8; 1 << 20];
    let mut off = 0;
    while off < total {
        let n = (total - off).min(chunk.len() as u64) as usize;
        write42(&s, &mut c, &big, &bsid, off, &chunk[..n]);
        off += n as u64;
    }
    let (csid, copy) = open42(&s, &mut c, b"copy", 3);
    let first = copy42(&s, &mut c, &big, &copy, &copy_args(&bsid, &csid, 0, 0, 0)).unwrap().wr_count;
    assert_eq!(first, super::super::ops::COPY_BYTES_MAX, "a bounded copy per operation");
    let rest = copy42(&s, &mut c, &big, &copy, &copy_args(&bsid, &csid, first, first, total - first)).unwrap().wr_count;
    assert_eq!(first + rest, total);
    assert_eq!(size_of(&s, &mut c, &copy), total);
    assert_eq!(s.fs.read(&vfs::FileHandle::from_bytes(&copy).unwrap(), total - 1, &mut [0u8; 1]).unwrap(), (1, true));
}

#[test]
fn read_only_exports_refuse_4_2_changes_and_allow_reads() {
    // Under an `ro` rule: ALLOCATE, DEALLOCATE, COPY into the export,
    // SETXATTR and REMOVEXATTR are NFS4ERR_ROFS and change nothing; SEEK,
    // READ_PLUS, GETXATTR and LISTXATTRS work. With no matching rule, every
    // one of them is NFS4ERR_ACCESS.
    use vfs::clients::{AccessTable, AccessType, Squash};
    let table = Arc::new(AccessTable::new());
    let Server { prog, fs } = server();
    let s = Server { prog: prog.with_access(table.clone()), fs };
    from_peer("10.0.0.1:900");
    let mut c = connect42(&s, b"ro-42");
    let (sid, fh) = open42(&s, &mut c, b"f", 3);
    write42(&s, &mut c, &fh, &sid, 0, b"kept");
    use p::setxattr_option4::SETXATTR4_EITHER as EITHER;
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"k", b"v", EITHER)).0, p::NFS4_OK);
    table.set(EXPORT, Some(vec![super::access_rule(&["10.0.0.1"], AccessType::ReadOnly, Squash::NoRootSquash)]));
    let used = s.fs.used_bytes();
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, 0, 1 << 20), p::NFS4ERR_ROFS);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_DEALLOCATE, &sid, 0, 4), p::NFS4ERR_ROFS);
    assert_eq!(copy42(&s, &mut c, &fh, &fh, &copy_args(&sid, &sid, 0, 100, 4)), Err(p::NFS4ERR_ROFS));
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_SETXATTR, &setxattr(b"k", b"w", EITHER)).0, p::NFS4ERR_ROFS);
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_REMOVEXATTR, &xdr(&p::REMOVEXATTR4args { rxa_name: b"k" })).0, p::NFS4ERR_ROFS);
    assert_eq!(s.fs.used_bytes(), used, "nothing changed");
    assert_eq!(seek42(&s, &mut c, &fh, &sid, 0, p::data_content4::NFS4_CONTENT_HOLE), Ok((true, 4)));
    assert_eq!(read_plus42(&s, &mut c, &fh, &sid, 0, 100), Ok((true, vec![(0, Ok(b"kept".to_vec()))])));
    let (st, r) = xattr_op(&s, &mut c, &fh, p::OP_GETXATTR, &xdr(&p::GETXATTR4args { gxa_name: b"k" }));
    assert_eq!(st, p::NFS4_OK);
    assert_eq!(r.body().opaque_var(16).unwrap(), b"v");
    assert_eq!(listxattrs(&s, &mut c, &fh, 0, 4096), Ok((1, vec![b"k".to_vec()], true)));
    // No rule for this peer at all.
    from_peer("10.0.0.9:900");
    assert_eq!(seek42(&s, &mut c, &fh, &sid, 0, p::data_content4::NFS4_CONTENT_DATA), Err(p::NFS4ERR_ACCESS));
    assert_eq!(read_plus42(&s, &mut c, &fh, &sid, 0, 100), Err(p::NFS4ERR_ACCESS));
    assert_eq!(xattr_op(&s, &mut c, &fh, p::OP_GETXATTR, &xdr(&p::GETXATTR4args { gxa_name: b"k" })).0, p::NFS4ERR_ACCESS);
    assert_eq!(space_op(&s, &mut c, &fh, p::OP_ALLOCATE, &sid, 0, 1), p::NFS4ERR_ACCESS);
    from_peer("127.0.0.1:700");
}

#[test]
fn hostile_4_2_arguments_are_answered_and_the_server_keeps_working() {
    // Every 4.2 operation number, after a valid PUTFH, with seeded random
    // arguments of every length from 0 to 80 bytes and with huge lengths
    // inside: each COMPOUND gets an answer whose result for the operation
    // carries its own number, the
    // session goes on, and the file's data is untouched.
    let s = server();
    let mut c = connect42(&s, b"hostile-42");
    let (sid, fh) = open42(&s, &mut c, b"victim", 3);
    write42(&s, &mut c, &fh, &sid, 0, b"still here");
    let mut seed = 0x51ed_270b_u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    for op in 59u32..=75 {
        for len in 0..80usize {
            let mut args: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Sometimes a plausible shape: the victim's stateid, then a
            // length word of 0xffffffff where an opaque would start.
            if len >= 24 && next() % 2 == 0 {
                args[..16].copy_from_slice(&xdr(&sid));
                args[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
            }
            let mut r = s.call(seq42(&mut c).op(p::OP_PUTFH, &putfh(&fh)).raw(op, &args));
            r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
            r.ok0(p::OP_PUTFH);
            let _ = r.next(op as i32);
        }
    }
    // Still serving, and the data survived: the plausible shapes put
    // offsets past 2^63 (FBIG / NXIO), the rest fail to decode or name no
    // valid state.
    assert_eq!(read_via(&s, &mut c, &fh, &sid, 100), Ok(b"still here".to_vec()));
    let mut r = s.call(seq42(&mut c).raw(p::OP_PUTROOTFH as u32, &[]));
    assert_eq!(r.status, p::NFS4_OK);
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
}

/// SEQUENCE, PUTFH src, SAVEFH, PUTFH dst, CLONE: its status.
fn clone42(s: &Server, c: &mut Client, src: &[u8], dst: &[u8], args: &p::CLONE4args) -> i32 {
    let mut r = s.call(
        seq42(c).op(p::OP_PUTFH, &putfh(src)).raw(p::OP_SAVEFH as u32, &[]).op(p::OP_PUTFH, &putfh(dst)).op(p::OP_CLONE, args),
    );
    r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
    r.ok0(p::OP_PUTFH);
    r.ok0(p::OP_SAVEFH);
    r.ok0(p::OP_PUTFH);
    r.next(p::OP_CLONE)
}

fn clone_args(src: &p::stateid4, dst: &p::stateid4, from: u64, to: u64, count: u64) -> p::CLONE4args {
    p::CLONE4args { cl_src_stateid: src.clone(), cl_dst_stateid: dst.clone(), cl_src_offset: from, cl_dst_offset: to, cl_count: count }
}

#[test]
fn clone_shares_data_rfc7862_15_13() {
    // clone_blksize is 4096 over memfs; CLONE of a whole file (count 0)
    // makes the destination read as the source, and the backend's space
    // grows by the source's pages (memfs shares the buffers but charges
    // them); a later write to the clone leaves the source alone. Unaligned
    // offsets, a range past the source's end and overlapping ranges of one
    // file are NFS4ERR_INVAL; a read-only destination NFS4ERR_OPENMODE; a
    // bad source stateid NFS4ERR_BAD_STATEID; a destination past 2^63
    // NFS4ERR_FBIG.
    let s = server();
    let mut c = connect42(&s, b"cloner");
    let (ssid, src) = open42(&s, &mut c, b"csrc", 3);
    let (dsid, dst) = open42(&s, &mut c, b"cdst", 3);
    let req = crate::attrs::Bitmap::of(&[crate::attrs::CLONE_BLKSIZE]);
    let (st, r) = on_fh42(&s, &mut c, &src, p::OP_GETATTR as u32, &xdr(&p::GETATTR4args { attr_request: req.to_vec() }));
    assert_eq!(st, p::NFS4_OK);
    assert_eq!(p::GETATTR4resok::decode(&mut r.body()).unwrap().obj_attributes.attr_vals, &4096u32.to_be_bytes());
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 239) as u8).collect();
    write42(&s, &mut c, &src, &ssid, 0, &data);
    let used = s.fs.used_bytes();
    assert_eq!(clone42(&s, &mut c, &src, &dst, &clone_args(&ssid, &dsid, 0, 0, 0)), p::NFS4_OK);
    assert_eq!(read_via(&s, &mut c, &dst, &dsid, 1 << 20), Ok(data.clone()));
    assert_eq!(s.fs.used_bytes() - used, 49 * vfs::memfs::CHUNK_CHARGE_BYTES, "the clone holds the source's 49 pages");
    write42(&s, &mut c, &dst, &dsid, 0, b"changed");
    assert_eq!(read_via(&s, &mut c, &src, &ssid, 1 << 20), Ok(data.clone()), "the source is unchanged");
    // Into the middle of the destination, aligned.
    assert_eq!(clone42(&s, &mut c, &src, &dst, &clone_args(&ssid, &dsid, 4096, 8192, 4096)), p::NFS4_OK);
    let got = read_via(&s, &mut c, &dst, &dsid, 1 << 20).unwrap();
    assert!(got[8192..12288] == data[4096..8192] && got[..7] == *b"changed");
    // Errors.
    assert_eq!(clone42(&s, &mut c, &src, &dst, &clone_args(&ssid, &dsid, 1, 0, 4096)), p::NFS4ERR_INVAL, "unaligned");
    assert_eq!(clone42(&s, &mut c, &src, &dst, &clone_args(&ssid, &dsid, 0, 0, 100)), p::NFS4ERR_INVAL, "short count mid-file");
    assert_eq!(clone42(&s, &mut c, &src, &dst, &clone_args(&ssid, &dsid, 196_608, 0, 8192)), p::NFS4ERR_INVAL, "past the end");
    assert_eq!(clone42(&s, &mut c, &src, &src, &clone_args(&ssid, &ssid, 0, 4096, 8192)), p::NFS4ERR_INVAL, "overlap");
    assert_eq!(clone42(&s, &mut c, &src, &dst, &clone_args(&ssid, &dsid, 0, 1 << 63, 4096)), p::NFS4ERR_FBIG);
    let (rsid, ro) = open42(&s, &mut c, b"cro", 1);
    assert_eq!(clone42(&s, &mut c, &src, &ro, &clone_args(&ssid, &rsid, 0, 0, 4096)), p::NFS4ERR_OPENMODE);
    let future = p::stateid4 { seqid: ssid.seqid + 5, other: ssid.other };
    assert_eq!(clone42(&s, &mut c, &src, &dst, &clone_args(&future, &dsid, 0, 0, 4096)), p::NFS4ERR_BAD_STATEID);
    assert_eq!(read_via(&s, &mut c, &src, &ssid, 1 << 20), Ok(data), "the source survived it all");
}

#[test]
fn access_answers_the_xattr_bits_in_4_2_rfc8276_8_4_1_1() {
    // The Linux 4.2 client asks ACCESS for XAREAD / XAWRITE / XALIST before
    // it sends GETXATTR / SETXATTR / LISTXATTRS: unsupported bits made it
    // refuse setxattr with EACCES. Reading and listing follow read
    // permission, writing write permission; in 4.1 the bits do not exist.
    const XA: u32 = 0x40 | 0x80 | 0x100;
    let s = server();
    let mut c = connect42(&s, b"xa");
    let (_, fh) = open42(&s, &mut c, b"xa", p::OPEN4_SHARE_ACCESS_BOTH); // 0644, owned by uid 0
    let access = |c: &mut Client, uid: u32, minor: u32| -> (u32, u32) {
        let req = if minor == 2 { seq42(c) } else { c.seq_req(false) };
        let req = req.op(p::OP_PUTFH, &putfh(&fh)).op(p::OP_ACCESS, &p::ACCESS4args { access: XA | access_bits::READ });
        let mut r = Reply::parse(s.call_as(sys(uid), 1, &req.bytes()));
        r.ok::<p::SEQUENCE4resok>(p::OP_SEQUENCE);
        r.ok0(p::OP_PUTFH);
        let ok: p::ACCESS4resok = r.ok(p::OP_ACCESS);
        (ok.supported, ok.access)
    };
    assert_eq!(access(&mut c, 0, 2), (XA | access_bits::READ, XA | access_bits::READ), "the owner may do all");
    assert_eq!(access(&mut c, 1000, 2), (XA | access_bits::READ, 0x40 | 0x100 | access_bits::READ), "others read and list, not write");
    let mut c1 = connect(&s, b"xa41");
    assert_eq!(access(&mut c1, 0, 1).0 & XA, 0, "no xattr bits in 4.1");
}

use vfs::access as access_bits;
