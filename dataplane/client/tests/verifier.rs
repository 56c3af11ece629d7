//! COMMIT verifier tracking against a scripted NFSv3 server that answers
//! UNSTABLE WRITEs as UNSTABLE (chimerad's memfs always answers FILE_SYNC): it keeps the
//! bytes written, and a NULL call "restarts" it — new verifier, data lost.

use client::nfs3::{Nfs3, Stable};
use client::{Auth, Error, Limits, RpcConn};
use proto::nfs3 as p;
use proto::xdr::{Decoder, Xdr};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

type Store = Arc<Mutex<BTreeMap<u64, Vec<u8>>>>;

fn serve(mut s: TcpStream, store: Store) {
    let mut verf = [1u8; 8];
    loop {
        let mut m = [0u8; 4];
        if s.read_exact(&mut m).is_err() {
            return;
        }
        let mut call = vec![0u8; (u32::from_be_bytes(m) & 0x7fff_ffff) as usize];
        s.read_exact(&mut call).unwrap();
        let mut d = Decoder::new(&call);
        let xid = d.u32().unwrap();
        d.skip(12).unwrap(); // type, rpcvers, prog
        let _vers = d.u32().unwrap();
        let proc_num = d.u32().unwrap();
        for _ in 0..2 {
            d.u32().unwrap();
            d.opaque_var(400).unwrap();
        }
        let wcc = || p::wcc_data { before: p::pre_op_attr::FALSE, after: p::post_op_attr::FALSE };
        let body = match proc_num {
            0 => {
                verf[0] += 1; // restart: new verifier, unstable data gone
                store.lock().unwrap().clear();
                Vec::new()
            }
            7 => {
                let a = p::WRITE3args::decode(&mut d).unwrap();
                store.lock().unwrap().insert(a.offset, a.data.to_vec());
                let ok = p::WRITE3resok { file_wcc: wcc(), count: a.count, committed: a.stable, verf };
                proto::xdr::to_vec(&p::WRITE3res::NFS3_OK(ok)).unwrap()
            }
            21 => proto::xdr::to_vec(&p::COMMIT3res::NFS3_OK(p::COMMIT3resok { file_wcc: wcc(), verf })).unwrap(),
            _ => proto::xdr::to_vec(&p::GETATTR3res::default(10004)).unwrap(),
        };
        let mut r: Vec<u8> = [xid, 1, 0, 0, 0, 0].iter().flat_map(|w| w.to_be_bytes()).collect();
        r.extend_from_slice(&body);
        let mut rec = (0x8000_0000u32 | r.len() as u32).to_be_bytes().to_vec();
        rec.extend_from_slice(&r);
        s.write_all(&rec).unwrap();
    }
}

fn fake() -> (Nfs3, Store) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap().to_string();
    let store: Store = Arc::default();
    let st = store.clone();
    thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        serve(s, st);
    });
    let lim = Limits { timeout: Duration::from_secs(5), ..Limits::default() };
    (Nfs3::over(RpcConn::connect(&a, &Auth::sys(0, 0), lim).unwrap()), store)
}

const FH: &[u8] = b"fh-1";

#[test]
fn same_verifier_commit_clears_writes() {
    let (mut c, _store) = fake();
    let w = c.write(FH, 0, &[7; 1000], Stable::Unstable).unwrap();
    assert!(!w.stable);
    assert_eq!(w.verf, [1; 8]);
    c.write(FH, 1000, &[8; 500], Stable::Unstable).unwrap();
    assert_eq!(c.uncommitted(FH), vec![(0, 1000), (1000, 500)]);
    assert_eq!(c.commit(FH).unwrap(), [1; 8]);
    assert!(c.uncommitted(FH).is_empty());
}

#[test]
fn verifier_change_is_reported_and_held_data_resent() {
    let (mut c, store) = fake();
    c.write(FH, 0, &[7; 1000], Stable::Unstable).unwrap();
    c.write(FH, 4096, &[9; 3000], Stable::Unstable).unwrap();
    c.null().unwrap(); // the server restarts: verifier changes, data lost
    assert!(store.lock().unwrap().is_empty());
    let e = c.commit(FH).unwrap_err();
    assert_eq!(e, Error::VerifierChanged { ranges: vec![(0, 1000), (4096, 3000)], resendable: true });
    assert!(e.to_string().contains("2 uncommitted range(s)"), "{e}");
    assert_eq!(c.resend_uncommitted(FH).unwrap(), vec![(0, 1000), (4096, 3000)]);
    // The server got the same bytes again.
    let st = store.lock().unwrap().clone();
    assert_eq!(st.get(&0), Some(&vec![7u8; 1000]));
    assert_eq!(st.get(&4096), Some(&vec![9u8; 3000]));
    let mut v2 = [1u8; 8];
    v2[0] = 2;
    assert_eq!(c.commit(FH).unwrap(), v2);
    assert!(c.uncommitted(FH).is_empty());
}

#[test]
fn data_over_the_hold_bound_is_reported_not_resendable() {
    let (mut c, store) = fake();
    c.set_held_bytes_max(4096);
    c.write(FH, 0, &[1; 4096], Stable::Unstable).unwrap();
    c.write(FH, 4096, &[2; 4096], Stable::Unstable).unwrap(); // over the bound: range only
    c.null().unwrap();
    let e = c.commit(FH).unwrap_err();
    assert_eq!(e, Error::VerifierChanged { ranges: vec![(0, 4096), (4096, 4096)], resendable: false });
    // The held one is resent; the other stays for the caller to supply.
    assert_eq!(c.resend_uncommitted(FH).unwrap(), vec![(0, 4096)]);
    assert_eq!(store.lock().unwrap().get(&0), Some(&vec![1u8; 4096]));
    let e = c.commit(FH).unwrap_err();
    assert_eq!(e, Error::VerifierChanged { ranges: vec![(4096, 4096)], resendable: false });
    // The caller writes it again FILE_SYNC: nothing is left to commit.
    c.write(FH, 4096, &[2; 4096], Stable::FileSync).unwrap();
    assert!(c.uncommitted(FH).is_empty());
}
