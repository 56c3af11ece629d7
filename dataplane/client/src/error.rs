//! Every way a call can fail, each variant naming what happened so a caller
//! (the fio engine, the FUSE sidecar) can log it and choose: retry, reconnect
//! or give the application an errno.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// TCP connect to `addr` failed or timed out.
    Connect { addr: String, reason: String },
    /// The connection broke (reset, send/receive error); every call in
    /// flight on it fails with this.
    ConnectionLost(String),
    /// The server closed the connection with calls in flight.
    Closed,
    /// No reply to call `xid` (procedure `proc_num`) within `after`.
    Timeout { xid: u32, proc_num: u32, after: Duration },
    /// A record mark announced more bytes than the bound allows.
    ReplyTooLarge { len: usize, max: usize },
    /// A call's encoding exceeds the call buffer bound.
    CallTooLarge { max: usize },
    /// More calls than the in-flight bound allows: reap completions first.
    TooManyInFlight { max: usize },
    /// `queued` bytes of calls still wait for the socket: reap (which
    /// sends) first.
    SendQueueFull { queued: usize, max: usize },
    /// A reply whose xid matches no call in flight (and none that timed out).
    UnexpectedXid(u32),
    /// The reply's bytes do not decode (this call fails; the connection
    /// stays usable, its records are still framed).
    Malformed(String),
    /// MSG_DENIED, RPC_MISMATCH: the server speaks RPC versions low..=high.
    RpcMismatch { low: u32, high: u32 },
    /// MSG_DENIED, AUTH_ERROR with this auth_stat (name, number).
    AuthError { stat: &'static str, code: u32 },
    /// MSG_ACCEPTED but not SUCCESS: PROG_UNAVAIL, PROC_UNAVAIL, GARBAGE_ARGS,
    /// SYSTEM_ERR, or PROG_MISMATCH (with the versions the server has).
    Accept { stat: &'static str, code: u32, low: u32, high: u32 },
    /// MOUNT answered with this mountstat3.
    Mount { stat: String, code: u32 },
    /// NFSv3 answered with this nfsstat3.
    Nfs3 { stat: String, code: u32 },
    /// NFSv4 operation `op` answered with this nfsstat4.
    Nfs4 { op: String, stat: String, code: u32 },
    /// The write verifier changed between WRITE and COMMIT (the server
    /// restarted and lost unstable data): these (offset, length) ranges must
    /// be written again. `resendable` is true when the library still holds
    /// all their data (`resend_uncommitted`).
    VerifierChanged { ranges: Vec<(u64, u32)>, resendable: bool },
    /// The caller asked for something the library does not do.
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The connection is unusable after this error (the caller reconnects).
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. }
                | Error::ConnectionLost(_)
                | Error::Closed
                | Error::ReplyTooLarge { .. }
                | Error::UnexpectedXid(_)
        )
    }
}

impl Error {
    /// The errno a POSIX caller (the FUSE sidecar, the fio engine) reports
    /// for this error. NFS status codes below 63 are the classic errno
    /// values, the same on Linux; 63..=71 are the BSD numbers (NFS3ERR_STALE
    /// is 70, Linux ESTALE 116) and are translated, as is everything else.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Nfs3 { code, .. } | Error::Nfs4 { code, .. } | Error::Mount { code, .. } if *code > 0 && *code < 63 => {
                *code as i32
            }
            Error::Nfs3 { code, .. } | Error::Nfs4 { code, .. } | Error::Mount { code, .. } => match *code {
                63 => libc::ENAMETOOLONG,
                66 => libc::ENOTEMPTY,
                69 => libc::EDQUOT,
                70 | 10001 | 10014 => libc::ESTALE, // STALE, BADHANDLE, FHEXPIRED
                71 => libc::EREMOTE,
                10004 => libc::EOPNOTSUPP,      // NOTSUPP
                10005 => libc::EINVAL,          // TOOSMALL
                10008 => libc::EAGAIN,          // JUKEBOX / DELAY
                _ => libc::EIO,
            },
            Error::Timeout { .. } => libc::ETIMEDOUT,
            Error::Connect { .. } => libc::ECONNREFUSED,
            Error::ConnectionLost(_) | Error::Closed => libc::ECONNRESET,
            Error::TooManyInFlight { .. } | Error::SendQueueFull { .. } => libc::EAGAIN,
            Error::CallTooLarge { .. } | Error::Invalid(_) => libc::EINVAL,
            Error::AuthError { .. } => libc::EACCES,
            Error::VerifierChanged { .. } => libc::EIO,
            Error::ReplyTooLarge { .. } | Error::UnexpectedXid(_) | Error::Malformed(_) => libc::EPROTO,
            Error::RpcMismatch { .. } | Error::Accept { .. } => libc::EPROTONOSUPPORT,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connect { addr, reason } => write!(f, "connect to {addr}: {reason}"),
            Error::ConnectionLost(m) => write!(f, "connection lost: {m}"),
            Error::Closed => write!(f, "server closed the connection"),
            Error::Timeout { xid, proc_num, after } => {
                write!(f, "timeout: no reply to xid {xid:#x} (procedure {proc_num}) in {} ms", after.as_millis())
            }
            Error::ReplyTooLarge { len, max } => write!(f, "reply record of {len} bytes exceeds {max} bytes"),
            Error::CallTooLarge { max } => write!(f, "call exceeds {max} bytes"),
            Error::TooManyInFlight { max } => write!(f, "{max} calls already in flight"),
            Error::SendQueueFull { queued, max } => write!(f, "{queued} bytes of calls wait for the socket (bound {max} bytes)"),
            Error::UnexpectedXid(x) => write!(f, "reply with xid {x:#x} matches no call in flight"),
            Error::Malformed(m) => write!(f, "malformed reply: {m}"),
            Error::RpcMismatch { low, high } => write!(f, "RPC_MISMATCH: server speaks RPC {low}..{high}"),
            Error::AuthError { stat, code } => write!(f, "AUTH_ERROR {stat} ({code})"),
            Error::Accept { stat, code, low, high } => {
                if *code == 2 {
                    write!(f, "{stat} ({code}): server has versions {low}..{high}")
                } else {
                    write!(f, "{stat} ({code})")
                }
            }
            Error::Mount { stat, code } => write!(f, "MOUNT {stat} ({code})"),
            Error::Nfs3 { stat, code } => write!(f, "{stat} ({code})"),
            Error::Nfs4 { op, stat, code } => write!(f, "{op}: {stat} ({code})"),
            Error::VerifierChanged { ranges, resendable } => write!(
                f,
                "write verifier changed: {} uncommitted range(s) must be resent ({})",
                ranges.len(),
                if *resendable { "data held, resend_uncommitted() can" } else { "some data no longer held" }
            ),
            Error::Invalid(m) => write!(f, "invalid request: {m}"),
        }
    }
}

impl std::error::Error for Error {}

pub(crate) fn xdr(e: proto::xdr::XdrError) -> Error {
    Error::Malformed(format!("xdr: {e:?}"))
}
