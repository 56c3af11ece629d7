//! Extended attributes (RFC 8276, an extension of NFSv4.2): GETXATTR
//! (§8.4.1), SETXATTR (§8.4.2), LISTXATTRS (§8.4.3), REMOVEXATTR (§8.4.4).
//! Names are the user namespace without its `user.` prefix (the client
//! adds and strips it); the backend keeps them (`Vfs::getxattr` & co.) and
//! bounds names, values and their number. A backend without them answers
//! NFS4ERR_NOTSUPP, and xattr_support tells clients so beforehand.

use crate::compound::Compound;
use crate::error::{fail, vfs_status, Nfs4Error, OpResult};
use crate::ops::cinfo;
use proto::nfs4 as p;
use proto::xdr::{pad, Decoder, Encoder, Xdr};
use vfs::{access, VfsError, XattrSet};

/// LISTXATTRS4resok bytes besides the names: cookie, name count, eof.
const LIST_OVERHEAD_BYTES: usize = 8 + 4 + 4;

/// Backend errors as RFC 8276 names them: a missing attribute is
/// NFS4ERR_NOXATTR, a value too large NFS4ERR_XATTR2BIG.
fn xattr_status(e: VfsError) -> Nfs4Error {
    Nfs4Error(match e {
        VfsError::NoEnt => p::NFS4ERR_NOXATTR,
        VfsError::FileTooBig => p::NFS4ERR_XATTR2BIG,
        other => vfs_status(other),
    })
}

impl Compound<'_> {
    /// GETXATTR (RFC 8276 §8.4.1): needs read access to the object.
    pub(crate) fn op_getxattr(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::GETXATTR4args::decode(d)?;
        let fh = self.cur_fh()?;
        let attr = self.prog.vfs.getattr(&fh)?;
        self.require_access(&attr, access::READ)?;
        let value = self.prog.vfs.getxattr(&fh, a.gxa_name).map_err(xattr_status)?;
        if 4 + value.len() + pad(value.len()) > self.reply_room(e) {
            // The value does not fit the reply the session allows.
            return fail(p::NFS4ERR_XATTR2BIG);
        }
        e.opaque_var(&value)?;
        Ok(())
    }

    /// SETXATTR (RFC 8276 §8.4.2): SETXATTR4_CREATE of an existing name is
    /// NFS4ERR_EXIST, SETXATTR4_REPLACE of a missing one NFS4ERR_NOXATTR.
    pub(crate) fn op_setxattr(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::SETXATTR4args::decode(d)?;
        let how = match a.sxa_option {
            p::setxattr_option4::SETXATTR4_EITHER => XattrSet::Either,
            p::setxattr_option4::SETXATTR4_CREATE => XattrSet::Create,
            p::setxattr_option4::SETXATTR4_REPLACE => XattrSet::Replace,
        };
        let fh = self.cur_fh()?;
        let before = self.prog.vfs.getattr(&fh)?;
        self.require_modify(&before)?;
        self.deleg_wait(&fh, true)?;
        let after = self.prog.vfs.setxattr(&fh, a.sxa_key, a.sxa_value, how).map_err(xattr_status)?;
        cinfo(&before, &after).encode(e)?;
        Ok(())
    }

    /// LISTXATTRS (RFC 8276 §8.4.3): names from the cookie on, as many as
    /// fit `lxa_maxcount` (and the reply); NFS4ERR_TOOSMALL when not even
    /// one does. The cookie is the count of names listed before.
    pub(crate) fn op_listxattrs(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::LISTXATTRS4args::decode(d)?;
        let fh = self.cur_fh()?;
        let attr = self.prog.vfs.getattr(&fh)?;
        self.require_access(&attr, access::READ)?;
        let limit = (a.lxa_maxcount as usize).min(self.reply_room(e));
        if limit < LIST_OVERHEAD_BYTES {
            return fail(p::NFS4ERR_TOOSMALL);
        }
        let start = e.position();
        let cookie_at = e.reserve(8)?;
        let count_at = e.reserve(4)?;
        let mut listed = 0u32;
        let mut used = LIST_OVERHEAD_BYTES;
        let eof = self
            .prog
            .vfs
            .listxattrs(&fh, a.lxa_cookie, &mut |name| {
                let need = 4 + name.len() + pad(name.len());
                if used + need > limit || e.opaque_var(name).is_err() {
                    return false;
                }
                used += need;
                listed += 1;
                true
            })
            .map_err(xattr_status);
        let eof = match eof {
            Ok(eof) => eof,
            Err(err) => {
                e.truncate(start);
                return Err(err);
            }
        };
        if listed == 0 && !eof {
            e.truncate(start);
            return fail(p::NFS4ERR_TOOSMALL);
        }
        let next = a.lxa_cookie.saturating_add(listed as u64);
        e.patch_u32(cookie_at, (next >> 32) as u32);
        e.patch_u32(cookie_at + 4, next as u32);
        e.patch_u32(count_at, listed);
        e.bool(eof)?;
        Ok(())
    }

    /// REMOVEXATTR (RFC 8276 §8.4.4).
    pub(crate) fn op_removexattr(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::REMOVEXATTR4args::decode(d)?;
        let fh = self.cur_fh()?;
        let before = self.prog.vfs.getattr(&fh)?;
        self.require_modify(&before)?;
        self.deleg_wait(&fh, true)?;
        let after = self.prog.vfs.removexattr(&fh, a.rxa_name).map_err(xattr_status)?;
        cinfo(&before, &after).encode(e)?;
        Ok(())
    }

    /// Changing an object's extended attributes takes write access to it
    /// (the owner may always, as with its mode).
    fn require_modify(&self, a: &vfs::Attr) -> OpResult {
        if self.uid == 0 || self.uid == a.uid {
            return Ok(());
        }
        self.require_access(a, access::MODIFY)
    }
}
