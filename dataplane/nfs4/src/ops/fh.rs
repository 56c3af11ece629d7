//! Filehandle, attribute and security-information operations (RFC 8881
//! §18.1, §18.7, §18.8, §18.14, §18.15, §18.19–§18.21, §18.24, §18.27–§18.30,
//! §18.45).

use crate::attrs::{self, Bitmap, Source};
use crate::compound::Compound;
use crate::error::{fail, OpResult};
use crate::ops::{check_component, sid_in};
use crate::state::SHARE_WRITE;
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder, Xdr};
use vfs::{access, Attr, FileHandle, FileType, SetTime};

/// Security flavors offered by SECINFO: AUTH_SYS first (what we map to
/// identities), then AUTH_NONE.
const FLAVORS: [u32; 2] = [1, 0];
/// ACCESS4_XAREAD, _XAWRITE, _XALIST (RFC 8276 §8.4.1.1; not in the XDR we generate from).
const XAREAD: u32 = 0x40;
const XAWRITE: u32 = 0x80;
const XALIST: u32 = 0x100;

impl Compound<'_> {
    /// A new current filehandle from a PUT*FH/LOOKUP: the current stateid
    /// no longer applies to it (§16.2.3.1.2).
    fn set_cur(&mut self, fh: FileHandle) {
        self.cur = Some(fh);
        self.cur_sid = None;
    }

    /// PUTFH (RFC 8881 §18.19): a handle we could not have issued is
    /// NFS4ERR_BADHANDLE, one naming a removed object NFS4ERR_STALE.
    pub(crate) fn op_putfh(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::PUTFH4args::decode(d)?;
        let fh = FileHandle::from_bytes(a.object)?;
        self.prog.vfs.getattr(&fh)?;
        self.set_cur(fh);
        Ok(())
    }

    /// PUTROOTFH (RFC 8881 §18.21).
    pub(crate) fn op_putrootfh(&mut self, _d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let fh = self.prog.vfs.root(self.prog.cfg.root_export)?;
        self.set_cur(fh);
        Ok(())
    }

    /// PUTPUBFH (RFC 8881 §18.20): our public filehandle is the root.
    pub(crate) fn op_putpubfh(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        self.op_putrootfh(d, e)
    }

    /// GETFH (RFC 8881 §18.8).
    pub(crate) fn op_getfh(&mut self, _d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let fh = self.cur_fh()?;
        p::GETFH4resok { object: &fh.to_bytes() }.encode(e)?;
        Ok(())
    }

    /// SAVEFH (RFC 8881 §18.28).
    pub(crate) fn op_savefh(&mut self, _d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        self.saved = Some(self.cur_fh()?);
        self.saved_sid = self.cur_sid;
        Ok(())
    }

    /// RESTOREFH (RFC 8881 §18.27).
    pub(crate) fn op_restorefh(&mut self, _d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let Some(fh) = self.saved else { return fail(p::NFS4ERR_RESTOREFH) };
        self.cur = Some(fh);
        self.cur_sid = self.saved_sid;
        Ok(())
    }

    /// LOOKUP (RFC 8881 §18.15).
    pub(crate) fn op_lookup(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::LOOKUP4args::decode(d)?;
        let (dir, da) = self.cur_dir()?;
        check_component(a.objname)?;
        self.require_access(&da, access::LOOKUP)?;
        let (fh, _) = self.prog.vfs.lookup(&dir, a.objname)?;
        self.set_cur(fh);
        Ok(())
    }

    /// LOOKUPP (RFC 8881 §18.14): the parent of the root does not exist.
    pub(crate) fn op_lookupp(&mut self, _d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let (dir, da) = self.cur_dir()?;
        if dir == self.prog.vfs.root(self.prog.cfg.root_export)? {
            return fail(p::NFS4ERR_NOENT);
        }
        self.require_access(&da, access::LOOKUP)?;
        let (fh, _) = self.prog.vfs.lookup_parent(&dir)?;
        self.set_cur(fh);
        Ok(())
    }

    /// Where the attribute values of `fh` come from.
    fn source<'s>(&self, fh: &'s FileHandle, a: &'s Attr, fs: Option<&'s vfs::FsStat>) -> Source<'s> {
        let cfg = &self.prog.cfg;
        Source {
            attr: a,
            fh,
            fsstat: fs,
            lease_time_s: cfg.lease_time_s,
            read_bytes_max: cfg.read_bytes_max,
            write_bytes_max: cfg.write_bytes_max,
            rdattr_error: p::NFS4_OK as u32,
            layout_type: self.prog.layout_type(),
            layout_blksize: self.prog.layout_blksize(),
            xattr_support: self.prog.vfs.xattrs_supported(fh),
            clone_blksize: self.prog.vfs.clone_block_bytes(fh),
        }
    }

    /// Encode the fattr4 of `fh` answering `req`.
    pub(crate) fn encode_attrs(&self, req: &Bitmap, fh: &FileHandle, a: &Attr, e: &mut Encoder<'_>) -> OpResult {
        let fs = if attrs::needs_fsstat(req) { Some(self.prog.vfs.fsstat(fh)?) } else { None };
        attrs::encode_fattr(req, &self.source(fh, a, fs.as_ref()), e)?;
        Ok(())
    }

    /// Whether the client's fattr4 equals the current object's attributes
    /// (VERIFY and NVERIFY; see `attrs::same` for the errors).
    fn attrs_same(&self, f: &p::fattr4<'_>) -> OpResult<bool> {
        let fh = self.cur_fh()?;
        let a = self.prog.vfs.getattr(&fh)?;
        let mask = Bitmap::from_words(&f.attrmask);
        let supported = mask.minus(&attrs::SUPPORTED).is_empty() && !Bitmap::has_bits_beyond(&f.attrmask);
        let fs = if supported && attrs::needs_fsstat(&mask) { Some(self.prog.vfs.fsstat(&fh)?) } else { None };
        Ok(attrs::same(&f.attrmask, f.attr_vals, &self.source(&fh, &a, fs.as_ref()))?)
    }

    /// VERIFY (RFC 8881 §18.31): go on only if every attribute given
    /// equals the object's; NFS4ERR_NOT_SAME otherwise.
    pub(crate) fn op_verify(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::VERIFY4args::decode(d)?;
        if !self.attrs_same(&a.obj_attributes)? {
            return fail(p::NFS4ERR_NOT_SAME);
        }
        Ok(())
    }

    /// NVERIFY (RFC 8881 §18.15): go on only if some attribute given
    /// differs from the object's; NFS4ERR_SAME otherwise.
    pub(crate) fn op_nverify(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::NVERIFY4args::decode(d)?;
        if self.attrs_same(&a.obj_attributes)? {
            return fail(p::NFS4ERR_SAME);
        }
        Ok(())
    }

    /// GETATTR (RFC 8881 §18.7). The bitmap is read straight off the wire
    /// (same bytes as GETATTR4args) so this frequent op allocates nothing.
    pub(crate) fn op_getattr(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let (req, _beyond) = Bitmap::decode(d)?;
        let fh = self.cur_fh()?;
        // Another client's write delegation may hide a newer size and times.
        self.deleg_wait(&fh, false)?;
        let a = self.prog.vfs.getattr(&fh)?;
        self.encode_attrs(&req, &fh, &a, e)
    }

    /// SETATTR (RFC 8881 §18.30). A size change is I/O and needs a stateid
    /// allowing writes; ownership changes follow POSIX (only root gives a
    /// file away; the owner may change its group to one of theirs).
    pub(crate) fn op_setattr(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::SETATTR4args::decode(d)?;
        let fh = self.cur_fh()?;
        let (set, mask) = attrs::decode_set(&a.obj_attributes.attrmask, a.obj_attributes.attr_vals)?;
        let cur = self.prog.vfs.getattr(&fh)?;
        if set.size.is_some() {
            if cur.ftype == FileType::Directory {
                return fail(p::NFS4ERR_ISDIR);
            }
            if cur.ftype != FileType::Regular {
                return fail(p::NFS4ERR_INVAL);
            }
            let sid = self.resolve_sid(sid_in(&a.stateid))?;
            let clientid = self.seq.map(|s| s.clientid);
            let v = self.prog.state().check_io(clientid, &sid, &fh, self.now_ms)?;
            if v.access & SHARE_WRITE == 0 {
                return fail(p::NFS4ERR_OPENMODE);
            }
            if v.key.is_none() {
                self.require_access(&cur, access::MODIFY)?;
            }
        }
        self.check_setattr_perm(&cur, &set)?;
        self.deleg_wait(&fh, true)?;
        self.prog.vfs.setattr(&fh, &set, None)?;
        mask.encode(e)?;
        Ok(())
    }

    fn check_setattr_perm(&self, cur: &Attr, set: &vfs::SetAttr) -> OpResult {
        if self.uid == 0 {
            return Ok(());
        }
        let owner = self.uid == cur.uid;
        if let Some(uid) = set.uid {
            if uid != cur.uid {
                return fail(p::NFS4ERR_PERM);
            }
        }
        if let Some(gid) = set.gid {
            let member = gid == self.gid || self.cred().gids.contains(&gid);
            if gid != cur.gid && !(owner && member) {
                return fail(p::NFS4ERR_PERM);
            }
        }
        if set.mode.is_some() && !owner {
            return fail(p::NFS4ERR_PERM);
        }
        let client_time = |t: SetTime| matches!(t, SetTime::Client(_));
        if (client_time(set.atime) || client_time(set.mtime)) && !owner {
            return fail(p::NFS4ERR_PERM);
        }
        if (set.atime == SetTime::ServerNow || set.mtime == SetTime::ServerNow) && !owner {
            self.require_access(cur, access::MODIFY)?;
        }
        Ok(())
    }

    /// ACCESS (RFC 8881 §18.1).
    pub(crate) fn op_access(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::ACCESS4args::decode(d)?;
        let fh = self.cur_fh()?;
        let attr = self.prog.vfs.getattr(&fh)?;
        let mut supported = a.access & access::ALL;
        let mut granted = vfs::check_access(&attr, &self.cred(), supported);
        // RFC 8276 §8.4.1.1: in 4.2, the extended-attribute bits. Reading
        // and listing need read permission, writing needs write permission
        // (the Linux client checks these before GETXATTR / SETXATTR).
        if self.minor >= 2 {
            for (bit, needs) in [(XAREAD, access::READ), (XALIST, access::READ), (XAWRITE, access::MODIFY)] {
                if a.access & bit != 0 {
                    supported |= bit;
                    if vfs::check_access(&attr, &self.cred(), needs) == needs {
                        granted |= bit;
                    }
                }
            }
        }
        p::ACCESS4resok { supported, access: granted }.encode(e)?;
        Ok(())
    }

    fn encode_flavors(e: &mut Encoder<'_>) -> OpResult {
        e.u32(FLAVORS.len() as u32)?;
        for f in FLAVORS {
            e.u32(f)?;
        }
        Ok(())
    }

    /// SECINFO (RFC 8881 §18.29): consumes the current filehandle (§2.6.3.1.1.8).
    pub(crate) fn op_secinfo(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::SECINFO4args::decode(d)?;
        let (dir, _) = self.cur_dir()?;
        check_component(a.name)?;
        self.prog.vfs.lookup(&dir, a.name)?;
        Self::encode_flavors(e)?;
        self.cur = None;
        Ok(())
    }

    /// SECINFO_NO_NAME (RFC 8881 §18.45): consumes the current filehandle.
    pub(crate) fn op_secinfo_no_name(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let style = p::secinfo_style4::decode(d)?;
        let fh = self.cur_fh()?;
        if matches!(style, p::secinfo_style4::SECINFO_STYLE4_PARENT) {
            let (dir, _) = self.cur_dir()?;
            if dir == self.prog.vfs.root(self.prog.cfg.root_export)? {
                return fail(p::NFS4ERR_NOENT);
            }
            self.prog.vfs.lookup_parent(&fh)?;
        }
        Self::encode_flavors(e)?;
        self.cur = None;
        Ok(())
    }

    /// READLINK (RFC 8881 §18.24).
    pub(crate) fn op_readlink(&mut self, _d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let fh = self.cur_fh()?;
        let a = self.prog.vfs.getattr(&fh)?;
        if a.ftype != FileType::Symlink {
            return fail(p::NFS4ERR_INVAL);
        }
        let target = self.prog.vfs.readlink(&fh)?;
        e.opaque_var(&target)?;
        Ok(())
    }
}
