//! One function per NFSv4.1 operation (RFC 8881 §18), as methods of the
//! COMPOUND context. Each decodes its arguments with the generated type,
//! does what its RFC section says, and encodes its result body (the op
//! number and status are written by the COMPOUND loop).

mod dir;
mod fh;
mod io;
mod layout;
mod lock;
mod open;
mod session;
mod v42;
#[cfg(test)]
pub(crate) use v42::COPY_BYTES_MAX;
mod xattr;

use crate::compound::Compound;
use crate::error::{fail, OpResult};
use crate::state::{Conflict, LockKind, Stateid};
use proto::nfs4 as p;
use proto::xdr::{Encoder, Result as XdrResult};
use vfs::{Attr, FileHandle, FileType};

pub(crate) fn sid_in(s: &p::stateid4) -> Stateid {
    Stateid { seqid: s.seqid, other: s.other }
}

pub(crate) fn sid_out(s: Stateid) -> p::stateid4 {
    p::stateid4 { seqid: s.seqid, other: s.other }
}

pub(crate) fn lock_kind(t: &p::nfs_lock_type4) -> LockKind {
    match t {
        p::nfs_lock_type4::READ_LT | p::nfs_lock_type4::READW_LT => LockKind::Read,
        p::nfs_lock_type4::WRITE_LT | p::nfs_lock_type4::WRITEW_LT => LockKind::Write,
    }
}

/// LOCK4denied (RFC 8881 §18.10.2), the body of NFS4ERR_DENIED.
pub(crate) fn encode_denied(c: &Conflict, e: &mut Encoder<'_>) -> XdrResult<()> {
    e.u64(c.offset)?;
    e.u64(c.length)?;
    e.u32(match c.kind {
        LockKind::Read => p::READ_LT as u32,
        LockKind::Write => p::WRITE_LT as u32,
    })?;
    e.u64(c.clientid)?;
    e.opaque_var(&c.owner)
}

/// change_info4 of a directory around a change. `atomic` is false: the two
/// getattrs bracket the change but are not taken under one lock.
pub(crate) fn cinfo(before: &Attr, after: &Attr) -> p::change_info4 {
    p::change_info4 { atomic: false, before: before.change, after: after.change }
}

/// Validate a component4 (RFC 8881 §14.5): non-empty UTF-8 without '/' or
/// NUL, not "." or "..", at most NAME_MAX bytes.
pub(crate) fn check_component(name: &[u8]) -> OpResult {
    if name.is_empty() {
        return fail(p::NFS4ERR_INVAL);
    }
    if name.len() > vfs::NAME_MAX {
        return fail(p::NFS4ERR_NAMETOOLONG);
    }
    if core::str::from_utf8(name).is_err() {
        return fail(p::NFS4ERR_INVAL);
    }
    if name.iter().any(|&c| c == b'/' || c == 0) {
        return fail(p::NFS4ERR_BADCHAR);
    }
    if name == b"." || name == b".." {
        return fail(p::NFS4ERR_BADNAME);
    }
    Ok(())
}

impl Compound<'_> {
    /// Attributes of the current filehandle, which must be a directory
    /// (NFS4ERR_NOTDIR, or NFS4ERR_SYMLINK for a symlink: §15.1.2.8).
    pub(crate) fn cur_dir(&self) -> OpResult<(FileHandle, Attr)> {
        let fh = self.cur_fh()?;
        let a = self.prog.vfs.getattr(&fh)?;
        match a.ftype {
            FileType::Directory => Ok((fh, a)),
            FileType::Symlink => fail(p::NFS4ERR_SYMLINK),
            _ => fail(p::NFS4ERR_NOTDIR),
        }
    }

    /// Fail with NFS4ERR_ACCESS unless the caller has all `bits` on `a`.
    pub(crate) fn require_access(&self, a: &Attr, bits: u32) -> OpResult {
        if vfs::check_access(a, &self.cred(), bits) != bits {
            return fail(p::NFS4ERR_ACCESS);
        }
        Ok(())
    }
}
