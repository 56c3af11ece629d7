//! Server-initiated calls (the NFSv4.1 back channel, RFC 8881 §2.10.3.1):
//! the server sends RPC CALLs on a connection the client opened and gets the
//! REPLYs back on it, interleaved with the client's own calls.
//!
//! This module is transport-free like the rest of the crate: it encodes the
//! call header, parses a reply header, allocates xids, and names the two
//! seams — [`CallSender`] (implemented by the transport: put a record on a
//! connection) and [`ReplySink`] (implemented by the program that made the
//! call: the dispatcher hands it every REPLY record and every connection
//! close). A connection is named by its `conn_id` ([`crate::ConnInfo`]),
//! unique for the process life.

use crate::ConnInfo;
use proto::xdr::{Decoder, Encoder, XdrError};
use std::sync::atomic::{AtomicU32, Ordering};

const CALL: u32 = 0;
const REPLY: u32 = 1;
const RPC_VERSION: u32 = 2;
const MSG_ACCEPTED: u32 = 0;
const MSG_DENIED: u32 = 1;
const AUTH_NONE: u32 = 0;
const AUTH_SYS: u32 = 1;
/// RFC 5531: opaque_auth bodies are at most 400 bytes.
const AUTH_BODY_MAX: u32 = 400;
/// Largest machine name we put in an AUTH_SYS credential (RFC 5531 says 255).
pub const MACHINE_NAME_MAX: usize = 255;

/// Why a record could not be queued on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// No such connection (closed, or never existed).
    NoConnection,
    /// The transport's outgoing queue for that connection's core is full.
    QueueFull,
    /// The transport is shutting down.
    Stopped,
    /// The record is larger than the transport will send.
    TooLarge,
}

/// Implemented by the transport: queue one complete record (record mark
/// included) for sending on connection `conn_id`. Never blocks; the record
/// goes out from the connection's own core, between its replies.
pub trait CallSender: Send + Sync {
    fn send(&self, conn_id: u64, record: Vec<u8>) -> Result<(), SendError>;
}

/// Implemented by whoever makes server-initiated calls; registered with
/// [`crate::Dispatcher::set_reply_sink`].
pub trait ReplySink: Send + Sync {
    /// A REPLY record arrived on `conn`; `msg` is the whole RPC message
    /// (xid first). Runs on the connection's data-path core: must not block.
    fn reply(&self, conn: &ConnInfo, xid: u32, msg: &[u8]);
    /// `conn_id` closed: calls in flight on it will get no reply.
    fn conn_closed(&self, conn_id: u64);
}

/// Transaction ids for outgoing calls. Seeded from the clock so a restarted
/// server does not reuse the previous instance's xids on a client's cache.
pub struct XidAllocator(AtomicU32);

impl Default for XidAllocator {
    fn default() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
            .unwrap_or(1);
        XidAllocator(AtomicU32::new(seed))
    }
}

impl XidAllocator {
    pub fn next(&self) -> u32 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// The credential of an outgoing call (what the client asked for in
/// csa_sec_parms / BACKCHANNEL_CTL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallCred {
    None,
    Sys { stamp: u32, machine_name: Vec<u8>, uid: u32, gid: u32, gids: Vec<u32> },
}

/// Write a record mark placeholder and the call header (RFC 5531 §9:
/// xid, CALL, rpcvers 2, prog, vers, proc, cred, null verifier). The
/// caller encodes the arguments, then calls [`finish_record`].
pub fn start_call(e: &mut Encoder<'_>, xid: u32, prog: u32, vers: u32, proc_num: u32, cred: &CallCred) -> Result<(), XdrError> {
    e.reserve(4)?;
    for w in [xid, CALL, RPC_VERSION, prog, vers, proc_num] {
        e.u32(w)?;
    }
    match cred {
        CallCred::None => {
            e.u32(AUTH_NONE)?;
            e.u32(0)?;
        }
        CallCred::Sys { stamp, machine_name, uid, gid, gids } => {
            assert!(machine_name.len() <= MACHINE_NAME_MAX && gids.len() <= 16, "AUTH_SYS credential too large");
            let len_at = e.reserve(8)?;
            let body_at = e.position();
            e.u32(*stamp)?;
            e.opaque_var(machine_name)?;
            e.u32(*uid)?;
            e.u32(*gid)?;
            e.u32(gids.len() as u32)?;
            for g in gids {
                e.u32(*g)?;
            }
            let body = (e.position() - body_at) as u32;
            e.patch_u32(len_at, AUTH_SYS);
            e.patch_u32(len_at + 4, body);
        }
    }
    e.u32(AUTH_NONE)?;
    e.u32(0)
}

/// Patch the record mark of a record started at position 0 of `e`.
pub fn finish_record(e: &mut Encoder<'_>) -> usize {
    let len = e.position();
    e.patch_u32(0, u32::from_be_bytes(crate::record::header(len - 4)));
    len
}

/// A parsed reply header (RFC 5531 §9 reply_body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// MSG_ACCEPTED + SUCCESS: the procedure's results follow.
    Success(&'a [u8]),
    /// MSG_ACCEPTED with another accept_stat (PROG_UNAVAIL, GARBAGE_ARGS ...).
    Accepted(u32),
    /// MSG_DENIED (RPC_MISMATCH or AUTH_ERROR) with its reject_stat.
    Denied(u32),
}

/// Parse a REPLY message (xid first). Err: not a well-formed reply header.
pub fn parse_reply(msg: &[u8]) -> Result<(u32, Reply<'_>), XdrError> {
    let mut d = Decoder::new(msg);
    let xid = d.u32()?;
    if d.u32()? != REPLY {
        return Err(XdrError::BadEnum { name: "msg_type", value: CALL as i32 });
    }
    match d.u32()? {
        MSG_ACCEPTED => {
            let _verf_flavor = d.u32()?;
            let _verf = d.opaque_var(AUTH_BODY_MAX)?;
            match d.u32()? {
                0 => Ok((xid, Reply::Success(d.rest()))),
                stat => Ok((xid, Reply::Accepted(stat))),
            }
        }
        MSG_DENIED => Ok((xid, Reply::Denied(d.u32()?))),
        other => Err(XdrError::BadEnum { name: "reply_stat", value: other as i32 }),
    }
}

#[cfg(test)]
mod tests {
    //! Proves the call header encodes as RFC 5531 lays it out (AUTH_SYS
    //! body length patched) and that reply parsing accepts every reply_stat
    //! and rejects truncated or mistyped messages.
    use super::*;

    fn words(b: &[u8]) -> Vec<u32> {
        b.chunks_exact(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn call_header_layout() {
        let mut buf = [0u8; 256];
        let mut e = Encoder::new(&mut buf);
        let cred = CallCred::Sys { stamp: 7, machine_name: b"abc".to_vec(), uid: 0, gid: 0, gids: vec![5] };
        start_call(&mut e, 0x1234, 0x4000_0000, 1, 1, &cred).unwrap();
        e.u32(0xdead).unwrap();
        let n = finish_record(&mut e);
        let w = words(&buf[..n]);
        assert_eq!(w[0], 0x8000_0000 | (n as u32 - 4));
        assert_eq!(&w[1..7], &[0x1234, CALL, 2, 0x4000_0000, 1, 1]);
        // AUTH_SYS, body: stamp, "abc" (len + padded word), uid, gid, 1 gid.
        assert_eq!(&w[7..9], &[AUTH_SYS, 28]);
        assert_eq!(&w[9..11], &[7, 3]);
        assert_eq!(&w[12..16], &[0, 0, 1, 5]);
        assert_eq!(&w[16..19], &[AUTH_NONE, 0, 0xdead]);
    }

    #[test]
    fn reply_parsing() {
        let ok = [1u32, REPLY, MSG_ACCEPTED, 0, 0, 0, 42];
        let b: Vec<u8> = ok.iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(parse_reply(&b).unwrap(), (1, Reply::Success(&42u32.to_be_bytes()[..])));
        let b: Vec<u8> = [2u32, REPLY, MSG_ACCEPTED, 0, 0, 4].iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(parse_reply(&b).unwrap(), (2, Reply::Accepted(4)));
        let b: Vec<u8> = [3u32, REPLY, MSG_DENIED, 1, 5].iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(parse_reply(&b).unwrap(), (3, Reply::Denied(1)));
        for bad in [&[1u32, CALL, 0][..], &[1, REPLY][..], &[1, REPLY, 7][..], &[1, REPLY, MSG_ACCEPTED, 0, 500][..]] {
            let b: Vec<u8> = bad.iter().flat_map(|w| w.to_be_bytes()).collect();
            assert!(parse_reply(&b).is_err(), "{bad:?} must not parse");
        }
    }
}
