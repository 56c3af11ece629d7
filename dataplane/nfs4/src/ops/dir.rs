//! Directory operations: CREATE, REMOVE, RENAME, LINK, READDIR (RFC 8881
//! §18.4, §18.25, §18.26, §18.9, §18.23).

use crate::attrs::{self, Bitmap, Source};
use crate::compound::Compound;
use crate::error::{fail, Nfs4Error, OpResult};
use crate::ops::{check_component, cinfo};
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder, Xdr};
use vfs::{access, CreateMode, FileType, NodeKind, SetAttr};

/// READDIR cookies 1 and 2 are reserved (§18.23.3): ours are the backend's + 2.
const COOKIE_BIAS: u64 = 2;
/// dirlist4 bytes besides the entries: cookieverf, the final "no more
/// entries" word and eof.
const READDIR_FIXED_BYTES: usize = 8 + 4 + 4;

impl Compound<'_> {
    /// CREATE (RFC 8881 §18.4): directories, symlinks, devices, sockets,
    /// FIFOs (regular files are created by OPEN).
    pub(crate) fn op_create(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::CREATE4args::decode(d)?;
        let (dir, before) = self.cur_dir()?;
        check_component(a.objname)?;
        let (mut set, mask) = attrs::decode_set(&a.createattrs.attrmask, a.createattrs.attr_vals)?;
        let (kind, mode_default) = match &a.objtype {
            p::createtype4::NF4LNK(target) => (NodeKind::Symlink { target }, 0o777),
            p::createtype4::NF4DIR => (NodeKind::Directory, 0o755),
            p::createtype4::NF4BLK(dev) => {
                (NodeKind::Device { ftype: FileType::BlockDevice, rdev: (dev.specdata1, dev.specdata2) }, 0o644)
            }
            p::createtype4::NF4CHR(dev) => {
                (NodeKind::Device { ftype: FileType::CharDevice, rdev: (dev.specdata1, dev.specdata2) }, 0o644)
            }
            p::createtype4::NF4SOCK => (NodeKind::Device { ftype: FileType::Socket, rdev: (0, 0) }, 0o644),
            p::createtype4::NF4FIFO => (NodeKind::Device { ftype: FileType::Fifo, rdev: (0, 0) }, 0o644),
            _ => return fail(p::NFS4ERR_BADTYPE),
        };
        if set.size.is_some() {
            return fail(p::NFS4ERR_INVAL);
        }
        self.require_access(&before, access::MODIFY)?;
        let mode = set.mode.take().unwrap_or(mode_default);
        let cred = self.cred();
        let (fh, _) = self.prog.vfs.create(&dir, a.objname, kind, mode, &cred, CreateMode::Guarded)?;
        if set != SetAttr::default() {
            self.prog.vfs.setattr(&fh, &set, None)?;
        }
        let after = self.prog.vfs.getattr(&dir)?;
        p::CREATE4resok { cinfo: cinfo(&before, &after), attrset: mask.to_vec() }.encode(e)?;
        self.cur = Some(fh);
        self.cur_sid = None;
        Ok(())
    }

    /// REMOVE (RFC 8881 §18.25): files and empty directories alike.
    pub(crate) fn op_remove(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::REMOVE4args::decode(d)?;
        let (dir, before) = self.cur_dir()?;
        check_component(a.target)?;
        self.require_access(&before, access::MODIFY | access::LOOKUP)?;
        let (target, ta) = self.prog.vfs.lookup(&dir, a.target)?;
        self.deleg_wait(&target, true)?;
        if ta.ftype == FileType::Directory {
            self.prog.vfs.rmdir(&dir, a.target)?;
        } else {
            self.prog.vfs.remove(&dir, a.target)?;
        }
        let after = self.prog.vfs.getattr(&dir)?;
        p::REMOVE4resok { cinfo: cinfo(&before, &after) }.encode(e)?;
        Ok(())
    }

    /// RENAME (RFC 8881 §18.26): saved filehandle = source directory,
    /// current = target directory.
    pub(crate) fn op_rename(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::RENAME4args::decode(d)?;
        let from = self.saved_fh()?;
        let (to, to_before) = self.cur_dir()?;
        let from_before = self.prog.vfs.getattr(&from)?;
        if from_before.ftype != FileType::Directory {
            return fail(p::NFS4ERR_NOTDIR);
        }
        check_component(a.oldname)?;
        check_component(a.newname)?;
        self.require_access(&from_before, access::MODIFY)?;
        self.require_access(&to_before, access::MODIFY)?;
        // The file renamed, and one the new name replaces, change names.
        for (dir, name) in [(&from, a.oldname), (&to, a.newname)] {
            if let Ok((fh, _)) = self.prog.vfs.lookup(dir, name) {
                self.deleg_wait(&fh, true)?;
            }
        }
        self.prog.vfs.rename(&from, a.oldname, &to, a.newname)?;
        let from_after = self.prog.vfs.getattr(&from)?;
        let to_after = self.prog.vfs.getattr(&to)?;
        p::RENAME4resok {
            source_cinfo: cinfo(&from_before, &from_after),
            target_cinfo: cinfo(&to_before, &to_after),
        }
        .encode(e)?;
        Ok(())
    }

    /// LINK (RFC 8881 §18.9): saved filehandle = object, current = directory.
    pub(crate) fn op_link(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::LINK4args::decode(d)?;
        let obj = self.saved_fh()?;
        let (dir, before) = self.cur_dir()?;
        check_component(a.newname)?;
        let oa = self.prog.vfs.getattr(&obj)?;
        if oa.ftype == FileType::Directory {
            return fail(p::NFS4ERR_ISDIR);
        }
        self.require_access(&before, access::MODIFY)?;
        self.deleg_wait(&obj, true)?;
        self.prog.vfs.link(&obj, &dir, a.newname)?;
        let after = self.prog.vfs.getattr(&dir)?;
        p::LINK4resok { cinfo: cinfo(&before, &after) }.encode(e)?;
        Ok(())
    }

    /// READDIR (RFC 8881 §18.23): entries are encoded as the backend visits
    /// them, until `maxcount` (or our reply budget) is reached.
    pub(crate) fn op_readdir(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::READDIR4args::decode(d)?;
        let (dir, da) = self.cur_dir()?;
        self.require_access(&da, access::READ)?;
        if a.cookie == 1 || a.cookie == 2 {
            return fail(p::NFS4ERR_BAD_COOKIE);
        }
        let verf = self.prog.vfs.cookie_verifier(&dir)?;
        if a.cookie != 0 && a.cookieverf != verf {
            return fail(p::NFS4ERR_NOT_SAME);
        }
        let start_cookie = a.cookie.saturating_sub(COOKIE_BIAS);
        let limit = (a.maxcount as usize).min(self.reply_room(e));
        if limit < READDIR_FIXED_BYTES + 16 {
            return fail(p::NFS4ERR_TOOSMALL);
        }
        let req = Bitmap::from_words(&a.attr_request);
        // Space figures are the directory's file system's: fetch them once.
        let fs = if attrs::needs_fsstat(&req) { Some(self.prog.vfs.fsstat(&dir)?) } else { None };
        let cfg = &self.prog.cfg;
        let body_at = e.position();
        e.opaque_fixed(&verf)?;
        let mut entries = 0usize;
        let mut full = false;
        let mut failure: Option<Nfs4Error> = None;
        let (layout_type, layout_blksize) = (self.prog.layout_type(), self.prog.layout_blksize());
        // Entries live in the directory's backend (the pseudo-root's are
        // mount roots: asked per entry).
        let dir_xattrs = self.prog.vfs.xattrs_supported(&dir);
        let dir_clone_blksize = self.prog.vfs.clone_block_bytes(&dir);
        // The pseudo-root lists only the mounts the client may use.
        let (table, peer, pseudo) = (self.prog.access(), self.peer, dir.export_id == vfs::router::PSEUDO_ROOT_EXPORT);
        let eof = self.prog.vfs.readdir(&dir, start_cookie, &mut |ent| {
            if pseudo && table.check(ent.fh.export_id, peer).is_none() {
                return true;
            }
            let entry_at = e.position();
            let xattr_support = if pseudo { self.prog.vfs.xattrs_supported(&ent.fh) } else { dir_xattrs };
            let clone_blksize = if pseudo { self.prog.vfs.clone_block_bytes(&ent.fh) } else { dir_clone_blksize };
            let src = Source {
                attr: &ent.attr,
                fh: &ent.fh,
                fsstat: fs.as_ref(),
                lease_time_s: cfg.lease_time_s,
                read_bytes_max: cfg.read_bytes_max,
                write_bytes_max: cfg.write_bytes_max,
                rdattr_error: p::NFS4_OK as u32,
                layout_type,
                layout_blksize,
                xattr_support,
                clone_blksize,
            };
            let r = e
                .u32(1)
                .and_then(|_| e.u64(ent.cookie + COOKIE_BIAS))
                .and_then(|_| e.opaque_var(ent.name))
                .and_then(|_| attrs::encode_fattr(&req, &src, e));
            let used = e.position() - body_at + 8;
            if r.is_err() || used > limit {
                e.truncate(entry_at);
                full = true;
                if let Err(x) = r {
                    if !matches!(x, proto::xdr::XdrError::Overflow { .. }) {
                        failure = Some(x.into());
                    }
                }
                return false;
            }
            entries += 1;
            true
        })?;
        if let Some(f) = failure {
            return Err(f);
        }
        if entries == 0 && full {
            e.truncate(body_at);
            return fail(p::NFS4ERR_TOOSMALL);
        }
        e.u32(0)?;
        e.bool(eof && !full)?;
        Ok(())
    }
}
