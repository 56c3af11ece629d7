//! NFSv3 calls answered by a server that sends a valid RPC header and then
//! seeded random bytes, or a valid status followed by garbage: every call
//! ends in Ok or a named error, never a panic or a hang.

use client::nfs3::{Nfs3, Stable};
use client::{Auth, Error, Limits, RpcConn};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::Duration;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const CALLS: usize = 400;

#[test]
fn random_result_bodies_give_errors_not_panics() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap().to_string();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..CALLS {
            let mut m = [0u8; 4];
            if s.read_exact(&mut m).is_err() {
                return;
            }
            let mut call = vec![0u8; (u32::from_be_bytes(m) & 0x7fff_ffff) as usize];
            s.read_exact(&mut call).unwrap();
            let mut r: Vec<u8> = call[..4].to_vec();
            r.extend([1u32, 0, 0, 0, 0].iter().flat_map(|w| w.to_be_bytes()));
            // Half: status 0 and garbage; half: all garbage. Lengths up to 600
            // bytes, words often small so lengths and counts look plausible.
            if rng.next() & 1 == 0 {
                r.extend(0u32.to_be_bytes());
            }
            let n = (rng.next() % 150) as usize;
            for _ in 0..n {
                let w = match rng.next() % 4 {
                    0 => 0,
                    1 => 1,
                    2 => (rng.next() % 300) as u32,
                    _ => rng.next() as u32,
                };
                r.extend(w.to_be_bytes());
            }
            let mut rec = (0x8000_0000u32 | r.len() as u32).to_be_bytes().to_vec();
            rec.extend_from_slice(&r);
            if s.write_all(&rec).is_err() {
                return;
            }
        }
    });
    let lim = Limits { timeout: Duration::from_secs(5), ..Limits::default() };
    let mut c = Nfs3::over(RpcConn::connect(&a, &Auth::sys(0, 0), lim).unwrap());
    let fh = b"handle".to_vec();
    let (mut ok, mut errs) = (0, 0);
    let mut out = Vec::new();
    for i in 0..CALLS {
        let r: Result<(), Error> = match i % 7 {
            0 => c.getattr(&fh).map(|_| ()),
            1 => c.read(&fh, 0, 4096, &mut out).map(|_| ()),
            2 => c.readdirplus(&fh, 0, [0; 8], 4096).map(|_| ()),
            3 => c.lookup(&fh, b"x").map(|_| ()),
            4 => c.write(&fh, 0, &[1; 64], Stable::Unstable).map(|_| ()),
            5 => c.commit(&fh).map(|_| ()),
            _ => c.create(&fh, b"y", 0o644, false).map(|_| ()),
        };
        match r {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                // Garbage inside a well-framed reply fails the call only.
                assert!(!e.is_connection(), "call {i}: {e}");
                errs += 1;
            }
        }
        // The reply bound holds: nothing grows beyond one reply record.
        assert!(out.len() <= 4096);
    }
    assert_eq!(ok + errs, CALLS);
    assert!(errs > CALLS / 2, "random bodies mostly fail to decode ({ok} decoded)");
    drop(c);
    h.join().unwrap();
}
