//! A loopback TCP port that refuses connections, held for as long as its
//! descriptor lives: the "port nobody listens on" of tests, without the
//! bind-and-close guess (another process may take a closed port at once).
//! Shared by path (`#[path]`) with the crate's unit tests and rpcbench's.

/// A loopback TCP port bound with SO_REUSEPORT and not listening: the
/// kernel refuses connections to it, no other user's socket can bind it
/// while the descriptor lives, and a chimerad of this user (which binds
/// its listeners with SO_REUSEPORT) can listen on it later.
pub fn held_port() -> (std::os::fd::OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns, with
    // correctly sized arguments.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let one: libc::c_int = 1;
        let rc = libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, &one as *const _ as *const libc::c_void, 4);
        assert_eq!(rc, 0, "SO_REUSEPORT: {}", std::io::Error::last_os_error());
        let mut a: libc::sockaddr_in = std::mem::zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(libc::bind(fd, &a as *const _ as *const libc::sockaddr, len), 0, "bind: {}", std::io::Error::last_os_error());
        let mut got: libc::sockaddr_in = std::mem::zeroed();
        let mut glen = len;
        assert_eq!(libc::getsockname(fd, &mut got as *mut _ as *mut libc::sockaddr, &mut glen), 0);
        (owned, u16::from_be(got.sin_port))
    }
}
