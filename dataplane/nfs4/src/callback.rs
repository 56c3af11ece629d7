//! The NFSv4.1 back channel (RFC 8881 §2.10.3.1, §18.33–§18.36, §20):
//! server-initiated CB_COMPOUND calls on a connection the client bound to
//! its session's back channel, and their replies.
//!
//! STATUS: API ONLY. `layout_recall` returns `Err(CbError::NotAttached)`
//! until the body lands (the types and signatures below are the contract
//! `pnfs` codes against and will not change shape).
//!
//! Use: the MDS (a control thread or an op handler) calls
//! [`Callbacks::layout_recall`]; it never blocks: it encodes
//! CB_COMPOUND { CB_SEQUENCE, CB_LAYOUTRECALL }, hands the record to the
//! transport (which sends it on the client's connection from its core) and
//! returns a [`RecallTicket`]. The outcome arrives with the client's reply
//! (or a timeout) and is read with [`Callbacks::poll`] / [`Callbacks::wait`],
//! or pushed to the `on_done` closure given to
//! [`Callbacks::layout_recall_notify`].

use crate::state::{ClientId, Stateid};
use vfs::FileHandle;

/// What a CB_LAYOUTRECALL names (layoutrecall4, RFC 8881 §20.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecallKind {
    /// LAYOUTRECALL4_FILE: the layouts of one file in [offset, offset+length)
    /// (length u64::MAX: to the end of the file); `stateid` is the layout
    /// stateid the server holds for the client on that file.
    File { fh: FileHandle, stateid: Stateid, offset: u64, length: u64 },
    /// LAYOUTRECALL4_FSID: every layout of one file system.
    Fsid { major: u64, minor: u64 },
    /// LAYOUTRECALL4_ALL: every layout the client holds.
    All,
}

/// CB_LAYOUTRECALL4args without the session part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRecall {
    /// layouttype4 (LAYOUT4_FLEX_FILES = 4).
    pub layout_type: u32,
    /// layoutiomode4: LAYOUTIOMODE4_READ 1, _RW 2, _ANY 3.
    pub iomode: u32,
    /// clora_changed: the layout changed (the client must not write through
    /// the old one; RFC 8881 §20.3.3).
    pub changed: bool,
    pub kind: RecallKind,
}

/// Names one callback in flight or done (unique for the process life).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecallTicket(pub u64);

/// How a recall ended when the client answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecallOutcome {
    /// NFS4_OK: the client will LAYOUTRETURN what was recalled.
    Accepted,
    /// NFS4ERR_NOMATCHING_LAYOUT: the client holds none of it (treat the
    /// range as returned, §20.3.4).
    NoMatchingLayout,
}

/// Why a callback could not be delivered or was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CbError {
    /// No transport attached to this program (unit tests, or a role
    /// without the data path).
    NotAttached,
    /// The client has no session with a usable back channel (the client is
    /// told with SEQ4_STATUS_CB_PATH_DOWN on its SEQUENCE replies).
    NoBackChannel,
    /// Too many callbacks queued (`CB_QUEUED_MAX`): try again later.
    Busy,
    /// No reply within the deadline (one lease); the connection may be dead.
    Timeout,
    /// The client kept answering NFS4ERR_DELAY past `CB_DELAY_RETRIES_MAX`.
    DelayExhausted,
    /// The connection carrying the call closed before the reply.
    ConnectionLost,
    /// The client answered with this nfsstat4 (CB_SEQUENCE or the op).
    Status(i32),
    /// The client's reply was not a valid RPC/CB_COMPOUND reply, or the RPC
    /// layer refused the call (accept_stat / reject); logged with details.
    BadReply,
    /// The CB_COMPOUND does not fit the back channel's ca_maxrequestsize.
    TooBig,
}

impl std::fmt::Display for CbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Result of one recall, as `poll`/`wait`/`on_done` report it.
pub type RecallResult = Result<RecallOutcome, CbError>;

/// The back channel of one `Nfs4Program` (see the module doc).
#[derive(Default)]
pub struct Callbacks {
    _private: (),
}

impl Callbacks {
    /// Send CB_COMPOUND { CB_SEQUENCE, CB_LAYOUTRECALL } to `clientid` on a
    /// back channel of one of its sessions. Never blocks. NFS4ERR_DELAY from
    /// the client is retried (bounded); the result is read with
    /// `poll`/`wait`.
    ///
    /// STUB: always `Err(CbError::NotAttached)` for now.
    pub fn layout_recall(&self, clientid: ClientId, recall: LayoutRecall) -> Result<RecallTicket, CbError> {
        let _ = (clientid, recall);
        Err(CbError::NotAttached)
    }

    /// As `layout_recall`, and `on_done` runs once with the result. It runs
    /// on whichever thread sees the outcome (a data-path core for a reply,
    /// the callback timer thread for a timeout): it must be short and must
    /// not block (send to a channel, set a flag).
    pub fn layout_recall_notify(
        &self,
        clientid: ClientId,
        recall: LayoutRecall,
        on_done: Box<dyn FnOnce(RecallTicket, RecallResult) + Send>,
    ) -> Result<RecallTicket, CbError> {
        let _ = on_done;
        self.layout_recall(clientid, recall)
    }

    /// The result of a finished callback (taken: a second poll returns
    /// None), or None while it is in flight.
    pub fn poll(&self, ticket: RecallTicket) -> Option<RecallResult> {
        let _ = ticket;
        None
    }

    /// Block the calling (control or test) thread until the callback ends
    /// or `timeout` passes (None then). Never call it on a data-path core.
    pub fn wait(&self, ticket: RecallTicket, timeout: std::time::Duration) -> Option<RecallResult> {
        let _ = (ticket, timeout);
        None
    }
}
