//! nfsstat4 as an error type, and the one place each lower-layer error maps
//! to it (RFC 8881 §15).

use crate::attrs::SetError;
use crate::state::StateError;
use proto::nfs4 as p;
use proto::xdr::XdrError;
use vfs::VfsError;

/// A non-OK nfsstat4 an operation ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nfs4Error(pub i32);

pub type OpResult<T = ()> = Result<T, Nfs4Error>;

impl Nfs4Error {
    pub fn code(self) -> u32 {
        debug_assert_ne!(self.0, p::NFS4_OK, "NFS4_OK is not an error");
        self.0 as u32
    }
}

/// Shorthand for failing an operation with a status.
pub fn fail<T>(status: i32) -> OpResult<T> {
    Err(Nfs4Error(status))
}

/// Backend errors (RFC 8881 §15.1 per error).
pub fn vfs_status(e: VfsError) -> i32 {
    match e {
        VfsError::NoEnt => p::NFS4ERR_NOENT,
        VfsError::Exist => p::NFS4ERR_EXIST,
        VfsError::NotDir => p::NFS4ERR_NOTDIR,
        VfsError::IsDir => p::NFS4ERR_ISDIR,
        VfsError::NotEmpty => p::NFS4ERR_NOTEMPTY,
        VfsError::NoSpace => p::NFS4ERR_NOSPC,
        VfsError::QuotaExceeded => p::NFS4ERR_DQUOT,
        VfsError::Stale => p::NFS4ERR_STALE,
        VfsError::BadHandle => p::NFS4ERR_BADHANDLE,
        VfsError::Inval => p::NFS4ERR_INVAL,
        VfsError::NameTooLong => p::NFS4ERR_NAMETOOLONG,
        VfsError::Perm => p::NFS4ERR_PERM,
        VfsError::Access => p::NFS4ERR_ACCESS,
        VfsError::FileTooBig => p::NFS4ERR_FBIG,
        VfsError::ReadOnly => p::NFS4ERR_ROFS,
        VfsError::TooManyLinks => p::NFS4ERR_MLINK,
        VfsError::CrossDevice => p::NFS4ERR_XDEV,
        VfsError::NotSupported => p::NFS4ERR_NOTSUPP,
        // NFSv4 SETATTR has no ctime guard; a backend saying so is a bug.
        VfsError::NotSync => p::NFS4ERR_SERVERFAULT,
        VfsError::ExistVerifierMismatch => p::NFS4ERR_EXIST,
        VfsError::Io => p::NFS4ERR_IO,
    }
}

/// State-machine errors.
pub fn state_status(e: StateError) -> i32 {
    match e {
        StateError::BadSession => p::NFS4ERR_BADSESSION,
        StateError::BadSlot => p::NFS4ERR_BADSLOT,
        StateError::SeqMisordered => p::NFS4ERR_SEQ_MISORDERED,
        StateError::Delay => p::NFS4ERR_DELAY,
        StateError::RetryUncachedRep => p::NFS4ERR_RETRY_UNCACHED_REP,
        StateError::StaleClientId => p::NFS4ERR_STALE_CLIENTID,
        StateError::ClientIdBusy => p::NFS4ERR_CLIENTID_BUSY,
        StateError::BadStateid => p::NFS4ERR_BAD_STATEID,
        StateError::OldStateid => p::NFS4ERR_OLD_STATEID,
        StateError::StaleStateid => p::NFS4ERR_STALE_STATEID,
        StateError::Expired => p::NFS4ERR_EXPIRED,
        StateError::ShareDenied => p::NFS4ERR_SHARE_DENIED,
        StateError::OpenMode => p::NFS4ERR_OPENMODE,
        StateError::LocksHeld => p::NFS4ERR_LOCKS_HELD,
        StateError::Grace => p::NFS4ERR_GRACE,
        StateError::NoGrace => p::NFS4ERR_NO_GRACE,
        StateError::CompleteAlready => p::NFS4ERR_COMPLETE_ALREADY,
        StateError::Inval => p::NFS4ERR_INVAL,
        StateError::Resource => p::NFS4ERR_RESOURCE,
        StateError::NoEnt => p::NFS4ERR_NOENT,
        StateError::NotSame => p::NFS4ERR_NOT_SAME,
        StateError::LockRange => p::NFS4ERR_LOCK_RANGE,
        StateError::ClidInUse => p::NFS4ERR_CLID_INUSE,
        StateError::Perm => p::NFS4ERR_PERM,
        StateError::TooSmall => p::NFS4ERR_TOOSMALL,
        StateError::DelegRevoked => p::NFS4ERR_DELEG_REVOKED,
    }
}

impl From<VfsError> for Nfs4Error {
    fn from(e: VfsError) -> Self {
        Nfs4Error(vfs_status(e))
    }
}

impl From<StateError> for Nfs4Error {
    fn from(e: StateError) -> Self {
        Nfs4Error(state_status(e))
    }
}

impl From<SetError> for Nfs4Error {
    fn from(e: SetError) -> Self {
        Nfs4Error(match e {
            SetError::NotSupported => p::NFS4ERR_ATTRNOTSUPP,
            SetError::Inval => p::NFS4ERR_INVAL,
            SetError::BadOwner => p::NFS4ERR_BADOWNER,
            SetError::BadXdr => p::NFS4ERR_BADXDR,
        })
    }
}

/// Decoding failures are the client's (BADXDR); running out of reply room
/// is ours to report as REP_TOO_BIG.
impl From<XdrError> for Nfs4Error {
    fn from(e: XdrError) -> Self {
        Nfs4Error(match e {
            XdrError::Overflow { .. } => p::NFS4ERR_REP_TOO_BIG,
            _ => p::NFS4ERR_BADXDR,
        })
    }
}
