//! ONC RPC (RFC 5531) server side, independent of any transport's I/O: record
//! marking, call-header parsing, authentication flavors, reply headers, the
//! duplicate-request cache, and dispatch to the programs registered with it.
//!
//! The transport (TCP today, RPC-over-RDMA later) hands this crate complete
//! records and a reply buffer (and, for zero-copy replies, a [`lend::Lender`]); programs (NFSv3, MOUNT3, NFSv4.1, portmap) plug
//! in through [`Program`]. Nothing here allocates per call.

use proto::xdr::Encoder;
use std::net::SocketAddr;

/// Identity attached to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth<'a> {
    /// AUTH_NONE.
    None,
    /// AUTH_SYS (RFC 5531 appendix A). `gids` holds at most 16 entries.
    Sys { stamp: u32, machine_name: &'a [u8], uid: u32, gid: u32, gids: &'a [u8] },
}

impl<'a> Auth<'a> {
    /// Supplementary gids of an AUTH_SYS credential (decoded lazily: no
    /// allocation).
    pub fn gids(&self) -> impl Iterator<Item = u32> + 'a {
        let raw: &'a [u8] = match self {
            Auth::Sys { gids, .. } => gids,
            Auth::None => &[],
        };
        raw.chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// Everything a program needs to know about one call.
#[derive(Debug, Clone, Copy)]
pub struct CallContext<'a> {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_num: u32,
    pub auth: Auth<'a>,
    /// Transport connection the call arrived on (unique for the process life).
    pub conn_id: u64,
    pub peer: SocketAddr,
    /// Index of the core (event loop) running the call.
    pub core: usize,
    /// Where the reply may lend buffers instead of copying them (see
    /// [`lend`]); `None` when the transport cannot send lent buffers or
    /// the reply is kept by the duplicate-request cache.
    pub lend: Option<&'a lend::Lender>,
    /// Where the call may park when its backend must wait (see [`park`]);
    /// `None` when the transport cannot keep calls (complete inline).
    pub park: Option<&'a park::Parking<'a>>,
    /// Set when a parked call runs again with its completion.
    pub resumed: Option<park::Resumed<'a>>,
}

/// Why a program could not produce a normal reply. Each maps to an RPC-level
/// reply (RFC 5531 accept_stat) or to dropping the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// accept_stat PROC_UNAVAIL.
    ProcUnavail,
    /// accept_stat GARBAGE_ARGS: the arguments did not decode.
    GarbageArgs,
    /// accept_stat SYSTEM_ERR.
    SystemErr,
    /// auth_stat: the credential flavor is not acceptable to this procedure.
    AuthTooWeak,
}

/// A versioned RPC program served by this process.
pub trait Program: Send + Sync {
    /// RPC program number (e.g. 100003 for NFS).
    fn program(&self) -> u32;
    /// The one version this handler serves (register one handler per version).
    fn version(&self) -> u32;
    /// Whether a procedure may be replayed safely. Non-idempotent procedures
    /// (NFSv3 CREATE, REMOVE, RENAME, ...) go through the duplicate-request
    /// cache.
    fn idempotent(&self, proc_num: u32) -> bool {
        let _ = proc_num;
        true
    }
    /// An upper bound on the result bytes this call can write (after the
    /// RPC reply header), when the program knows one cheaply from the
    /// procedure and its arguments; `None` (the default): up to the
    /// transport's largest reply. A bound lets the transport write a small
    /// reply straight into a connection's small buffer instead of a scratch
    /// buffer it copies from; a program writing past its bound gets an
    /// encoder overflow (SYSTEM_ERR), never a corrupt reply.
    fn reply_bytes_bound(&self, proc_num: u32, args: &[u8]) -> Option<usize> {
        let _ = (proc_num, args);
        None
    }
    /// Decode `args`, execute, and encode the procedure's result into `reply`
    /// (the RPC reply header is already written). On error the partially
    /// written result is discarded by the caller.
    fn call(&self, ctx: &CallContext<'_>, args: &[u8], reply: &mut Encoder<'_>) -> Result<(), CallError>;
}

pub mod backchannel;
pub mod drc;
pub mod lend;
pub mod metrics;
pub mod park;
pub mod poller;
pub mod record;

mod dispatch;
pub use dispatch::{ConnInfo, Dispatcher, Limits, Outcome};
