//! Property and hostile-input tests of the generated protocol code.
//!
//! What they prove, for every type of every specification:
//! - round trip: seeded random valid encodings decode, consume every byte,
//!   re-encode to identical bytes, and `encoded_len` equals that length
//!   (`check_*` also asserts `decode(encode(v)) == v`);
//! - truncation: every strict prefix of a valid encoding is an error, never
//!   a success and never a panic;
//! - mutation: corrupted encodings (flipped bytes, huge lengths) decode to an
//!   error or to a value that round-trips consistently, never a panic.
//! Then hand-written hostile cases: lengths over a maximum, counts larger
//! than the record, bad enum/bool/union values, deep nesting, long lists.
//! Everything is seeded and bounded (a few seconds in total).

use crate::xdr::testgen::{Proc, Rng, TypeCheck};
use crate::xdr::{self, Decoder, Encoder, Xdr, XdrError};
use crate::{flexfiles, mount3, nfs3, nfs4, portmap, rpc};

/// Random values per type in the round-trip test.
const SAMPLES_PER_TYPE: u64 = 48;
/// Values per type whose every prefix is tried.
const TRUNCATION_SAMPLES_PER_TYPE: u64 = 4;
/// Corruptions per type in the mutation test.
const MUTATIONS_PER_TYPE: u64 = 48;

fn specs() -> Vec<(&'static str, &'static [TypeCheck], &'static [Proc])> {
    vec![
        ("rpc", rpc::testgen::TYPES, rpc::testgen::PROCEDURES),
        ("portmap", portmap::testgen::TYPES, portmap::testgen::PROCEDURES),
        ("mount3", mount3::testgen::TYPES, mount3::testgen::PROCEDURES),
        ("nfs3", nfs3::testgen::TYPES, nfs3::testgen::PROCEDURES),
        ("nfs4", nfs4::testgen::TYPES, nfs4::testgen::PROCEDURES),
        ("flexfiles", flexfiles::testgen::TYPES, flexfiles::testgen::PROCEDURES),
    ]
}

fn sample(t: &TypeCheck, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut out = Vec::new();
    (t.gen)(&mut r, 0, &mut out);
    out
}

#[test]
fn every_type_round_trips() {
    let mut checked = 0;
    for (spec, types, _) in specs() {
        assert!(!types.is_empty(), "{spec}: no types generated");
        for t in types {
            for seed in 0..SAMPLES_PER_TYPE {
                let buf = sample(t, seed);
                let (used, again) = (t.check)(&buf)
                    .unwrap_or_else(|e| panic!("{spec}::{} seed {seed}: valid encoding rejected: {e}", t.name));
                assert_eq!(used, buf.len(), "{spec}::{} seed {seed}: decode left bytes", t.name);
                assert_eq!(again, buf, "{spec}::{} seed {seed}: re-encoding differs", t.name);
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "too few values checked: {checked}");
}

#[test]
fn every_procedure_round_trips() {
    for (spec, _, procs) in specs() {
        for p in procs {
            for seed in 0..SAMPLES_PER_TYPE {
                for (what, gen, check) in [("args", p.gen_args, p.check_args), ("res", p.gen_res, p.check_res)] {
                    let mut out = Vec::new();
                    gen(&mut Rng::new(seed), 0, &mut out);
                    let (used, again) = check(&out)
                        .unwrap_or_else(|e| panic!("{spec} {} {what} seed {seed}: rejected: {e}", p.name));
                    assert_eq!((used, &again), (out.len(), &out), "{spec} {} {what} seed {seed}", p.name);
                }
            }
        }
    }
}

#[test]
fn every_strict_prefix_is_an_error() {
    for (spec, types, _) in specs() {
        for t in types {
            for seed in 0..TRUNCATION_SAMPLES_PER_TYPE {
                let buf = sample(t, seed);
                for cut in 0..buf.len() {
                    if let Ok((used, _)) = (t.check)(&buf[..cut]) {
                        panic!("{spec}::{} seed {seed}: prefix of {cut}/{} bytes decoded ({used} used)", t.name, buf.len());
                    }
                }
            }
        }
    }
}

#[test]
fn corrupted_encodings_never_panic() {
    let mut rejected = 0u64;
    for (_, types, _) in specs() {
        for t in types {
            for seed in 0..MUTATIONS_PER_TYPE {
                let mut buf = sample(t, seed);
                if buf.is_empty() {
                    continue;
                }
                let mut r = Rng::new(seed ^ 0x5eed);
                let at = (r.below(buf.len() as u64) as usize) & !3;
                match r.below(3) {
                    // A huge length or count where a word was.
                    0 => {
                        let end = (at + 4).min(buf.len());
                        buf[at..end].fill(0xff)
                    }
                    1 => buf[at] ^= 1 << r.below(8),
                    _ => buf.truncate(at),
                }
                // check_* panics on an inconsistent round trip; an error is fine.
                if (t.check)(&buf).is_err() {
                    rejected += 1;
                }
            }
        }
    }
    assert!(rejected > 100, "corruption was almost never detected ({rejected})");
}

#[test]
fn oversize_file_handle_is_rejected_both_ways() {
    let mut buf = vec![0, 0, 0, 65];
    buf.extend_from_slice(&[7u8; 68]);
    assert_eq!(xdr::from_bytes::<nfs3::nfs_fh3>(&buf), Err(XdrError::TooLong { len: 65, max: 64 }));
    let fh = nfs3::nfs_fh3 { data: &[1u8; 65] };
    let mut out = [0u8; 128];
    assert_eq!(fh.encode(&mut Encoder::new(&mut out)), Err(XdrError::TooLong { len: 65, max: 64 }));
    let ok = nfs3::nfs_fh3 { data: &[1u8; 64] };
    assert_eq!(ok.encoded_len(), 68);
    assert!(ok.encode(&mut Encoder::new(&mut out)).is_ok());
}

#[test]
fn standalone_typedefs_keep_their_maximum() {
    // MOUNTPROC3_MNT's argument is a bare `dirpath` (string<MNTPATHLEN>).
    let mut long = vec![0, 0, 0x04, 0x01]; // 1025 bytes
    long.resize(4 + 1028, b'a');
    let mut d = Decoder::new(&long);
    assert_eq!(mount3::decode_dirpath(&mut d), Err(XdrError::TooLong { len: 1025, max: 1024 }));
    let mnt = mount3::testgen::PROCEDURES.iter().find(|p| p.proc == mount3::MOUNTPROC3_MNT).unwrap();
    assert!(matches!((mnt.check_args)(&long), Err(XdrError::TooLong { .. })));
    let ok = [0, 0, 0, 2, b'/', b'x', 0, 0];
    assert_eq!(mount3::decode_dirpath(&mut Decoder::new(&ok)), Ok(&b"/x"[..]));
    let mut out = [0u8; 8];
    assert!(mount3::encode_dirpath(&&[b'a'; 1025][..], &mut Encoder::new(&mut out)).is_err());
}

#[test]
fn hostile_counts_fail_before_allocating() {
    // mountres3 MNT3_OK, 0-byte handle, then 2^32-1 auth flavors in 4 bytes.
    let buf = [0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1];
    assert!(matches!(xdr::from_bytes::<mount3::mountres3>(&buf), Err(XdrError::Short { .. })));
    // authsys_parms: more than 16 gids.
    let mut a = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17];
    a.resize(a.len() + 17 * 4, 0);
    assert_eq!(xdr::from_bytes::<rpc::authsys_parms>(&a), Err(XdrError::TooLong { len: 17, max: 16 }));
}

#[test]
fn bad_discriminants_are_named_errors() {
    // An nfsstat3 that does not exist, in a union with a default arm.
    let buf = [0, 0, 0x30, 0x39];
    assert_eq!(
        xdr::from_bytes::<nfs3::GETATTR3res>(&buf),
        Err(XdrError::BadEnum { name: "nfsstat3", value: 12345 })
    );
    // A msg_type that does not exist, in a union without default.
    let buf = [0, 0, 0, 1, 0, 0, 0, 7];
    assert_eq!(xdr::from_bytes::<rpc::rpc_msg>(&buf), Err(XdrError::BadUnion { name: "rpc_msg_body", value: 7 }));
    // A boolean discriminant of 2.
    assert_eq!(xdr::from_bytes::<nfs3::post_op_attr>(&[0, 0, 0, 2]), Err(XdrError::BadBool(2)));
    // Encoding a default arm with a discriminant that has its own arm.
    let mut out = [0u8; 8];
    let v = nfs3::GETATTR3res::default(nfs3::NFS3_OK);
    assert!(matches!(v.encode(&mut Encoder::new(&mut out)), Err(XdrError::BadUnion { .. })));
    let v = nfs3::GETATTR3res::default(nfs3::NFS3ERR_STALE);
    assert!(v.encode(&mut Encoder::new(&mut out)).is_ok());
    assert_eq!(out[..4], [0, 0, 0, 70]);
}

#[test]
fn encoder_overflow_is_an_error_not_a_panic() {
    let v = nfs3::READ3args { file: nfs3::nfs_fh3 { data: b"handle" }, offset: 1, count: 2 };
    let n = v.encoded_len();
    assert_eq!(n, 4 + 8 + 8 + 4);
    for size in 0..n {
        let mut out = vec![0u8; size];
        assert!(matches!(v.encode(&mut Encoder::new(&mut out)), Err(XdrError::Overflow { .. })), "size {size}");
    }
}

fn entry_list(n: usize) -> Vec<u8> {
    let mut buf = Vec::new();
    for i in 0..n {
        buf.extend_from_slice(&(i as u64).to_be_bytes()); // fileid
        buf.extend_from_slice(&[0, 0, 0, 1, b'x', 0, 0, 0]); // name "x"
        buf.extend_from_slice(&(i as u64 + 1).to_be_bytes()); // cookie
        buf.extend_from_slice(&[0, 0, 0, (i + 1 < n) as u8]); // nextentry follows?
    }
    buf
}

#[test]
fn long_directory_listings_decode_without_deep_recursion() {
    // Far more entries than DEPTH_MAX: lists are decoded iteratively.
    let n = xdr::LIST_MAX;
    let buf = entry_list(n);
    let head = xdr::from_bytes::<nfs3::entry3>(&buf).expect("a list of LIST_MAX entries decodes");
    assert_eq!(head.encoded_len(), buf.len());
    assert_eq!(xdr::to_vec(&head).unwrap(), buf);
    let mut count = 0;
    let mut cur = Some(&head);
    while let Some(e) = cur {
        assert_eq!(e.cookie, count as u64 + 1);
        count += 1;
        cur = e.nextentry.as_deref();
    }
    assert_eq!(count, n);
    drop(head); // dropping recurses once per node: LIST_MAX must fit the test thread's stack.
    let too_long = entry_list(n + 1);
    assert!(matches!(xdr::from_bytes::<nfs3::entry3>(&too_long), Err(XdrError::TooLong { .. })));
}

#[test]
fn nested_optional_data_is_bounded() {
    // A self-nesting optional (not a list): depth beyond DEPTH_MAX is refused.
    fn nest<'a>(d: &mut Decoder<'a>) -> xdr::Result<u32> {
        Ok(match xdr::decode_opt(d, nest)? {
            Some(inner) => *inner + 1,
            None => 0,
        })
    }
    let deep = vec![0, 0, 0, 1].repeat(xdr::DEPTH_MAX as usize + 1);
    let mut buf = deep.clone();
    buf.extend_from_slice(&[0, 0, 0, 0]);
    assert_eq!(nest(&mut Decoder::new(&buf)), Err(XdrError::TooDeep));
    let ok = [vec![0, 0, 0, 1].repeat(xdr::DEPTH_MAX as usize), vec![0, 0, 0, 0]].concat();
    assert_eq!(nest(&mut Decoder::new(&ok)), Ok(xdr::DEPTH_MAX));
}

#[test]
fn program_numbers_and_names() {
    assert_eq!((nfs3::NFS_PROGRAM, nfs3::NFS_V3, nfs3::NFSPROC3_READ, nfs3::NFSPROC3_COMMIT), (100003, 3, 6, 21));
    assert_eq!(nfs3::NFS_V3_PROCEDURES.len(), 22);
    assert_eq!(nfs3::testgen::PROCEDURES.len(), 22);
    assert_eq!((mount3::MOUNT_PROGRAM, mount3::MOUNT_V3, mount3::MOUNTPROC3_EXPORT), (100005, 3, 5));
    assert_eq!((portmap::PMAP_PROG, portmap::PMAP_VERS, portmap::PMAPPROC_GETPORT), (100000, 2, 3));
    assert_eq!(nfs3::nfsstat3::NFS3ERR_JUKEBOX as i32, nfs3::NFS3ERR_JUKEBOX);
    assert_eq!(nfs3::nfsstat3::from_i32(70), Some(nfs3::nfsstat3::NFS3ERR_STALE));
    assert_eq!(nfs3::nfsstat3::from_i32(3), None);
}

#[test]
fn rpc_call_header_decodes_from_known_bytes() {
    // A CALL to NFSv3 GETATTR with AUTH_SYS (uid 1000, gid 100, no gids) and AUTH_NONE verifier.
    let mut buf = Vec::new();
    for w in [0x1234u32, 0, 2, 100003, 3, 1, 1, 24, 7] {
        buf.extend_from_slice(&w.to_be_bytes());
    }
    buf.extend_from_slice(&[0, 0, 0, 4, b'h', b'o', b's', b't', 0, 0, 0x03, 0xe8, 0, 0, 0, 100, 0, 0, 0, 0]);
    buf.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
    let m = xdr::from_bytes::<rpc::rpc_msg>(&buf).unwrap();
    assert_eq!(m.xid, 0x1234);
    let rpc::rpc_msg_body::CALL(c) = &m.body else { panic!("not a call: {m:?}") };
    assert_eq!((c.rpcvers, c.prog, c.vers, c.proc), (rpc::RPC_VERS, nfs3::NFS_PROGRAM, 3, nfs3::NFSPROC3_GETATTR));
    assert_eq!(c.cred.flavor, rpc::AUTH_SYS as u32);
    let sys = xdr::from_bytes::<rpc::authsys_parms>(c.cred.body).unwrap();
    assert_eq!((sys.stamp, sys.machinename, sys.uid, sys.gid, sys.gids.len()), (7, &b"host"[..], 1000, 100, 0));
    assert_eq!(m.encoded_len(), buf.len());
    assert_eq!(xdr::to_vec(&m).unwrap(), buf);
}

#[test]
fn nfs41_compound_with_pnfs_ops_round_trips_and_has_rfc_layout() {
    use nfs4::*;
    let sessionid = [9u8; 16];
    let fh = [0xabu8; 20];
    let args = COMPOUND4args {
        tag: b"t",
        minorversion: 1,
        argarray: vec![
            nfs_argop4::OP_SEQUENCE(SEQUENCE4args {
                sa_sessionid: sessionid,
                sa_sequenceid: 5,
                sa_slotid: 0,
                sa_highest_slotid: 0,
                sa_cachethis: false,
            }),
            nfs_argop4::OP_PUTFH(PUTFH4args { object: &fh }),
            nfs_argop4::OP_LAYOUTGET(LAYOUTGET4args {
                loga_signal_layout_avail: false,
                loga_layout_type: layouttype4::LAYOUT4_FLEX_FILES,
                loga_iomode: layoutiomode4::LAYOUTIOMODE4_RW,
                loga_offset: 0,
                loga_length: NFS4_UINT64_MAX,
                loga_minlength: 4096,
                loga_stateid: stateid4 { seqid: 1, other: [3; 12] },
                loga_maxcount: 65536,
            }),
            nfs_argop4::OP_GETFH,
        ],
    };
    let bytes = xdr::to_vec(&args).unwrap();
    // tag (4 + 4 padded), minorversion, count, then the first opcode.
    assert_eq!(&bytes[..20], &[0, 0, 0, 1, b't', 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, OP_SEQUENCE as u8]);
    assert_eq!(xdr::from_bytes::<COMPOUND4args>(&bytes).unwrap(), args);
    // A server decodes operation by operation: the header by hand, then each op.
    let mut d = Decoder::new(&bytes);
    let _tag = d.opaque_var(NFS4_OPAQUE_LIMIT).unwrap();
    assert_eq!(d.u32().unwrap(), 1);
    let count = d.array_len(u32::MAX, nfs_argop4::MIN_LEN).unwrap();
    let ops: Vec<nfs_argop4> = (0..count).map(|_| nfs_argop4::decode(&mut d).unwrap()).collect();
    assert_eq!(ops, args.argarray);
    // An operation number that does not exist is a decode error the server maps to OP_ILLEGAL.
    assert_eq!(
        xdr::from_bytes::<nfs_argop4>(&[0, 0, 0, 99]),
        Err(XdrError::BadUnion { name: "nfs_argop4", value: 99 })
    );
}

#[test]
fn flex_files_layout_travels_inside_layoutget_reply() {
    use flexfiles::*;
    use nfs4::*;
    let ds_fh = [0x11u8; 12];
    let ff = ff_layout4 {
        ffl_stripe_unit: 1 << 20,
        ffl_mirrors: vec![ff_mirror4 {
            ffm_data_servers: vec![ff_data_server4 {
                ffds_deviceid: [7; 16],
                ffds_efficiency: 1,
                ffds_stateid: stateid4 { seqid: 0, other: [0; 12] },
                ffds_fh_vers: vec![&ds_fh[..]],
                ffds_user: b"1000",
                ffds_group: b"1000",
            }],
        }],
        ffl_flags: FF_FLAGS_NO_LAYOUTCOMMIT,
        ffl_stats_collect_hint: 0,
    };
    let body = xdr::to_vec(&ff).unwrap();
    let res = LAYOUTGET4res::NFS4_OK(LAYOUTGET4resok {
        logr_return_on_close: true,
        logr_stateid: stateid4 { seqid: 1, other: [1; 12] },
        logr_layout: vec![layout4 {
            lo_offset: 0,
            lo_length: NFS4_UINT64_MAX,
            lo_iomode: layoutiomode4::LAYOUTIOMODE4_RW,
            lo_content: layout_content4 { loc_type: layouttype4::LAYOUT4_FLEX_FILES, loc_body: &body },
        }],
    });
    let wire = xdr::to_vec(&res).unwrap();
    let LAYOUTGET4res::NFS4_OK(ok) = xdr::from_bytes::<LAYOUTGET4res>(&wire).unwrap() else { panic!("not OK") };
    let inner = xdr::from_bytes::<ff_layout4>(ok.logr_layout[0].lo_content.loc_body).unwrap();
    assert_eq!(inner, ff);
    // Device address: RDMA first, TCP fallback, NFSv3 loosely coupled.
    let addr = ff_device_addr4 {
        ffda_netaddrs: vec![
            netaddr4 { na_r_netid: b"rdma", na_r_addr: b"10.0.0.1.78.81" },
            netaddr4 { na_r_netid: b"tcp", na_r_addr: b"10.0.0.1.8.1" },
        ],
        ffda_versions: vec![ff_device_versions4 {
            ffdv_version: 3,
            ffdv_minorversion: 0,
            ffdv_rsize: 1 << 20,
            ffdv_wsize: 1 << 20,
            ffdv_tightly_coupled: false,
        }],
    };
    let a = xdr::to_vec(&addr).unwrap();
    assert_eq!(addr.encoded_len(), a.len());
    assert_eq!(xdr::from_bytes::<ff_device_addr4>(&a).unwrap(), addr);
}
