//! Sending to a peer that closed must not raise SIGPIPE: the fio engine
//! runs inside a C program that does not ignore it. Alone in its binary
//! because it resets SIGPIPE to its default action (death) for the process.

use client::{Auth, Error, Limits, RpcConn};
use std::net::TcpListener;
use std::thread;
use std::time::Duration;

#[test]
fn closed_peer_gives_an_error_not_sigpipe() {
    // SAFETY: setting a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap().to_string();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        drop(s);
    });
    let lim = Limits { timeout: Duration::from_secs(2), ..Limits::default() };
    let mut c = RpcConn::connect(&a, &Auth::None, lim).unwrap();
    h.join().unwrap();
    thread::sleep(Duration::from_millis(100));
    let payload = vec![1u8; 256 << 10];
    let mut last = None;
    for _ in 0..64 {
        match c.submit(7, 1, 3, &|e| e.opaque_var(&payload)) {
            Ok(xid) => last = Some(xid),
            Err(e) => {
                assert!(e.is_connection(), "{e}");
                return;
            }
        }
    }
    // Every submit was queued: the failure shows on the reply.
    let e = c.wait(last.unwrap()).unwrap_err();
    assert!(matches!(e, Error::ConnectionLost(_) | Error::Closed), "{e}");
}
