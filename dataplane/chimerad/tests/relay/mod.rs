//! A pausable TCP relay for tests that need a server to stall (shared by
//! the pNFS and `nfs` module tests).

use std::time::Duration;

/// A TCP relay to one address that can be paused: while paused it holds
/// what it reads instead of forwarding it (a data server that stalls).
pub struct Relay {
    pub addr: std::net::SocketAddr,
    pub paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

pub fn relay(to: std::net::SocketAddr) -> Relay {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let p = paused.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let Ok(up) = std::net::TcpStream::connect(to) else { return };
            for (mut from, mut into) in [(c.try_clone().unwrap(), up.try_clone().unwrap()), (up, c)] {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        while p.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        if into.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    Relay { addr, paused }
}
