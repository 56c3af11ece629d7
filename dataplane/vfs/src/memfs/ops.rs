//! The `Vfs` operations of `MemFs`. Data-path calls first, then the
//! namespace changes (which hold the `ns` lock; see the module comment of
//! `memfs` for why that is deadlock free).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::*;

impl Vfs for MemFs {
    fn root(&self, export_id: ExportId) -> VfsResult<FileHandle> {
        if export_id != self.export_id {
            return Err(VfsError::Stale);
        }
        Ok(FileHandle { export_id, ino: ROOT_INO, generation: ROOT_GENERATION })
    }

    fn getattr(&self, fh: &FileHandle) -> VfsResult<Attr> {
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        Ok(self.attr(&inode, &st))
    }

    fn setattr(&self, fh: &FileHandle, set: &SetAttr, guard_ctime: Option<Time>) -> VfsResult<Attr> {
        let inode = self.get(fh)?;
        let mut st = inode.write();
        live(&st)?;
        if let Some(guard) = guard_ctime {
            if guard != st.ctime {
                return Err(VfsError::NotSync);
            }
        }
        if let Some(mode) = set.mode {
            if mode & !0o7777 != 0 {
                return Err(VfsError::Inval);
            }
        }
        let now = Time::now();
        if let Some(size) = set.size {
            self.resize(&mut st, size)?;
            if size != st.size {
                st.size = size;
                st.mtime = now;
            }
        }
        // Validation is done: nothing below can fail, so the call is all or nothing.
        if let Some(mode) = set.mode {
            st.mode = mode;
        }
        if let Some(uid) = set.uid {
            st.uid = uid;
        }
        if let Some(gid) = set.gid {
            st.gid = gid;
        }
        if let Some(t) = apply_time(set.atime, now) {
            st.atime = t;
        }
        if let Some(t) = apply_time(set.mtime, now) {
            st.mtime = t;
        }
        st.touch_ctime(now);
        Ok(self.attr(&inode, &st))
    }

    fn lookup(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<(FileHandle, Attr)> {
        check_name(name)?;
        let d = self.get(dir)?;
        let (ino, generation) = {
            let st = d.read();
            live(&st)?;
            let ent = dir_of(&st)?.get(name).ok_or(VfsError::NoEnt)?;
            (ent.ino, ent.generation)
        };
        // The entry may have been removed since we dropped the directory
        // lock: the object is then gone (or dead) and the name is NoEnt.
        let child = self.get_entry(ino, generation).ok_or(VfsError::NoEnt)?;
        let st = child.read();
        if st.dead {
            return Err(VfsError::NoEnt);
        }
        Ok((self.handle(&child), self.attr(&child, &st)))
    }

    fn lookup_parent(&self, dir: &FileHandle) -> VfsResult<(FileHandle, Attr)> {
        let d = self.get(dir)?;
        let (ino, generation) = {
            let st = d.read();
            live(&st)?;
            let dd = dir_of(&st)?;
            (dd.parent_ino, dd.parent_generation)
        };
        // A directory that was moved or removed meanwhile: its old parent
        // may be gone too.
        let parent = self.get_entry(ino, generation).ok_or(VfsError::Stale)?;
        let st = parent.read();
        live(&st)?;
        Ok((self.handle(&parent), self.attr(&parent, &st)))
    }

    fn read(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> VfsResult<(usize, bool)> {
        let inode = self.get(fh)?;
        // Shared lock: concurrent readers of one file do not serialise. Reads
        // do not update atime (as with noatime), which keeps them shared.
        let st = inode.read();
        live(&st)?;
        let data = file_of(&st)?;
        if offset >= st.size {
            return Ok((0, true));
        }
        let n = (st.size - offset).min(buf.len() as u64) as usize;
        data.read(offset, &mut buf[..n]);
        Ok((n, offset + n as u64 >= st.size))
    }

    fn read_lent(&self, fh: &FileHandle, offset: u64, count: usize, sink: &mut dyn crate::LendSink) -> VfsResult<Option<(usize, bool)>> {
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        let data = file_of(&st)?;
        if offset >= st.size {
            return Ok(Some((0, true)));
        }
        let n = (st.size - offset).min(count as u64) as usize;
        data.lend(offset, n, sink);
        Ok(Some((n, offset + n as u64 >= st.size)))
    }

    fn write(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        _stable: Stability,
    ) -> VfsResult<(usize, Stability, Attr)> {
        let inode = self.get(fh)?;
        let mut st = inode.write();
        live(&st)?;
        file_of(&st)?;
        let end = offset.checked_add(data.len() as u64).ok_or(VfsError::FileTooBig)?;
        if end > FILE_SIZE_MAX_BYTES {
            return Err(VfsError::FileTooBig);
        }
        // Memory holds the data as durably as this backend ever will: the
        // verifier changes on restart, so FILE_SYNC is honest and saves the
        // client a COMMIT.
        if data.is_empty() {
            return Ok((0, Stability::FileSync, self.attr(&inode, &st)));
        }
        let missing = file_of(&st)?.chunks_missing(offset, data.len());
        let charge_bytes = missing * CHUNK_CHARGE_BYTES;
        if charge_bytes > 0 {
            self.charge(st.volume.as_ref(), charge_bytes)?;
            st.charged_bytes += charge_bytes;
        }
        let Body::File(f) = &mut st.body else { unreachable!("checked to be a file above") };
        f.write(offset, data);
        debug_assert_eq!(f.charged_bytes() + INODE_CHARGE_BYTES + st.xattrs.charged_bytes, st.charged_bytes);
        st.size = st.size.max(end);
        st.touch_mtime(Time::now());
        Ok((data.len(), Stability::FileSync, self.attr(&inode, &st)))
    }

    fn commit(&self, fh: &FileHandle, _offset: u64, _count: u64) -> VfsResult<()> {
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        file_of(&st)?;
        Ok(())
    }

    fn write_verifier(&self) -> [u8; 8] {
        self.write_verifier
    }

    fn seek(&self, fh: &FileHandle, offset: u64, what: Content) -> VfsResult<Option<(bool, u64)>> {
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        let f = file_of(&st)?;
        if offset >= st.size {
            return Ok(None);
        }
        let at = match what {
            Content::Data => f.next_data(offset).unwrap_or(st.size),
            Content::Hole => f.next_hole(offset),
        };
        Ok(Some(if at >= st.size { (true, st.size) } else { (false, at) }))
    }

    fn allocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        let inode = self.get(fh)?;
        let mut st = inode.write();
        live(&st)?;
        let f = file_of(&st)?;
        if len == 0 {
            return Err(VfsError::Inval);
        }
        let end = offset.checked_add(len).ok_or(VfsError::FileTooBig)?;
        if end > FILE_SIZE_MAX_BYTES {
            return Err(VfsError::FileTooBig);
        }
        // A range far larger than the space left fails before its pages
        // are counted one by one.
        let at_least = f.pages_missing_at_least(offset, end).saturating_mul(CHUNK_CHARGE_BYTES);
        if let Some(v) = &st.volume {
            if at_least > v.space.free_bytes() {
                return Err(VfsError::QuotaExceeded);
            }
        }
        if at_least > self.space.free_bytes() {
            return Err(VfsError::NoSpace);
        }
        let charge_bytes = f.chunks_missing(offset, len as usize) * CHUNK_CHARGE_BYTES;
        if charge_bytes > 0 {
            self.charge(st.volume.as_ref(), charge_bytes)?;
            st.charged_bytes += charge_bytes;
        }
        let Body::File(f) = &mut st.body else { unreachable!("checked to be a file above") };
        f.allocate(offset, end);
        debug_assert_eq!(f.charged_bytes() + INODE_CHARGE_BYTES + st.xattrs.charged_bytes, st.charged_bytes);
        st.size = st.size.max(end);
        st.touch_mtime(Time::now());
        Ok(self.attr(&inode, &st))
    }

    /// Chunk by chunk through a bounded buffer: the source's lock, then the
    /// destination's, never both at once (see the module comment).
    fn copy_range(&self, src: &FileHandle, src_offset: u64, dst: &FileHandle, dst_offset: u64, len: u64) -> VfsResult<u64> {
        const CHUNK: usize = EXTENT_BYTES;
        file_of(&self.get(src)?.read())?;
        file_of(&self.get(dst)?.read())?;
        let end = dst_offset.checked_add(len).ok_or(VfsError::FileTooBig)?;
        if end > FILE_SIZE_MAX_BYTES {
            return Err(VfsError::FileTooBig);
        }
        crate::copy_by_chunks(self, src, src_offset, dst, dst_offset, len, CHUNK)
    }

    fn clone_block_bytes(&self, _fh: &FileHandle) -> u32 {
        CHUNK_BYTES as u32
    }

    /// Shares the source's buffers (copy on write: `chunk_mut` copies a
    /// buffer a reply or another file still holds before writing it).
    /// The source's buffers are taken under its lock, then installed under
    /// the destination's: never both at once. The shared pages are charged
    /// to the destination too (memory is counted as if not shared).
    fn clone_range(&self, src: &FileHandle, src_offset: u64, dst: &FileHandle, dst_offset: u64, len: u64) -> VfsResult<Attr> {
        let page = CHUNK_BYTES as u64;
        if len == 0 || !src_offset.is_multiple_of(page) || !dst_offset.is_multiple_of(page) {
            return Err(VfsError::Inval);
        }
        let (src_end, dst_end) = (src_offset.checked_add(len), dst_offset.checked_add(len));
        let (Some(src_end), Some(dst_end)) = (src_end, dst_end) else { return Err(VfsError::FileTooBig) };
        if dst_end > FILE_SIZE_MAX_BYTES {
            return Err(VfsError::FileTooBig);
        }
        let pieces = {
            let inode = self.get(src)?;
            let st = inode.read();
            live(&st)?;
            let f = file_of(&st)?;
            if src_end > st.size {
                return Err(VfsError::Inval);
            }
            if !len.is_multiple_of(page) && src_end != st.size {
                return Err(VfsError::Inval);
            }
            f.pieces(src_offset, src_end)
        };
        let inode = self.get(dst)?;
        let mut st = inode.write();
        live(&st)?;
        let f = file_of(&st)?;
        // A tail shorter than a page brings the source's page whole: only
        // where nothing of the destination follows it.
        if !len.is_multiple_of(page) && dst_end < st.size {
            return Err(VfsError::Inval);
        }
        let span_end = dst_end.div_ceil(page) * page;
        let new_pages = pieces.iter().map(|(_, p)| if matches!(p, node::Piece::Extent(_)) { (EXTENT_BYTES / CHUNK_BYTES) as u64 } else { 1 }).sum::<u64>();
        let old_pages = f.pages_in(dst_offset, span_end);
        if new_pages > old_pages {
            self.charge(st.volume.as_ref(), (new_pages - old_pages) * CHUNK_CHARGE_BYTES)?;
        }
        let Body::File(f) = &mut st.body else { unreachable!("checked to be a file above") };
        let freed = f.punch(dst_offset, span_end);
        debug_assert_eq!(freed, old_pages * CHUNK_CHARGE_BYTES);
        f.install(dst_offset, pieces);
        if old_pages > new_pages {
            self.release(st.volume.as_ref(), (old_pages - new_pages) * CHUNK_CHARGE_BYTES);
        }
        st.charged_bytes = st.charged_bytes + new_pages * CHUNK_CHARGE_BYTES - old_pages * CHUNK_CHARGE_BYTES;
        let Body::File(f) = &st.body else { unreachable!() };
        debug_assert_eq!(f.charged_bytes() + INODE_CHARGE_BYTES + st.xattrs.charged_bytes, st.charged_bytes);
        st.size = st.size.max(dst_end);
        st.touch_mtime(Time::now());
        Ok(self.attr(&inode, &st))
    }

    fn xattrs_supported(&self, _fh: &FileHandle) -> bool {
        true
    }

    fn getxattr(&self, fh: &FileHandle, name: &[u8]) -> VfsResult<Vec<u8>> {
        check_xattr_name(name)?;
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        st.xattrs.get(name).map(<[u8]>::to_vec).ok_or(VfsError::NoEnt)
    }

    fn setxattr(&self, fh: &FileHandle, name: &[u8], value: &[u8], how: XattrSet) -> VfsResult<Attr> {
        check_xattr_name(name)?;
        if value.len() > XATTR_VALUE_BYTES_MAX {
            return Err(VfsError::FileTooBig);
        }
        let inode = self.get(fh)?;
        let mut st = inode.write();
        live(&st)?;
        let old = st.xattrs.get(name).map(|v| xattr_charge(name, v));
        match (how, old) {
            (XattrSet::Create, Some(_)) => return Err(VfsError::Exist),
            (XattrSet::Replace, None) => return Err(VfsError::NoEnt),
            (_, None) if st.xattrs.len() >= XATTRS_PER_OBJECT_MAX => return Err(VfsError::NoSpace),
            _ => {}
        }
        let (new, old) = (xattr_charge(name, value), old.unwrap_or(0));
        if new > old {
            self.charge(st.volume.as_ref(), new - old)?;
        } else {
            self.release(st.volume.as_ref(), old - new);
        }
        st.charged_bytes = st.charged_bytes + new - old;
        st.xattrs.set(name, value);
        st.touch_ctime(Time::now());
        Ok(self.attr(&inode, &st))
    }

    fn listxattrs(&self, fh: &FileHandle, cookie: u64, visit: &mut dyn FnMut(&[u8]) -> bool) -> VfsResult<bool> {
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        let skip = usize::try_from(cookie).unwrap_or(usize::MAX);
        for name in st.xattrs.names(skip) {
            if !visit(name) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn removexattr(&self, fh: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        check_xattr_name(name)?;
        let inode = self.get(fh)?;
        let mut st = inode.write();
        live(&st)?;
        let freed = st.xattrs.remove(name).ok_or(VfsError::NoEnt)?;
        st.charged_bytes -= freed;
        self.release(st.volume.as_ref(), freed);
        st.touch_ctime(Time::now());
        Ok(self.attr(&inode, &st))
    }

    fn deallocate(&self, fh: &FileHandle, offset: u64, len: u64) -> VfsResult<Attr> {
        let inode = self.get(fh)?;
        let mut st = inode.write();
        live(&st)?;
        file_of(&st)?;
        if len == 0 {
            return Err(VfsError::Inval);
        }
        // Nothing exists past the size: the range is clamped to it.
        let end = offset.saturating_add(len).min(st.size);
        if offset < end {
            // A range reaching the end of file covers its last page whole
            // (nothing lives past the size), so that page is freed too.
            let end = if end == st.size { end.div_ceil(CHUNK_BYTES as u64) * CHUNK_BYTES as u64 } else { end };
            let Body::File(f) = &mut st.body else { unreachable!("checked to be a file above") };
            let freed = f.punch(offset, end);
            st.charged_bytes -= freed;
            self.release(st.volume.as_ref(), freed);
        }
        st.touch_mtime(Time::now());
        Ok(self.attr(&inode, &st))
    }

    fn create(
        &self,
        dir: &FileHandle,
        name: &[u8],
        kind: NodeKind<'_>,
        mode: u32,
        cred: &Cred<'_>,
        how: CreateMode,
    ) -> VfsResult<(FileHandle, Attr)> {
        check_name(name)?;
        let (ftype, rdev, target) = validate_kind(&kind)?;
        if mode & !0o7777 != 0 {
            return Err(VfsError::Inval);
        }
        let mut ns = self.lock_ns();
        let d = self.get(dir)?;
        let mut ds = d.write();
        live(&ds)?;
        if let Some(ent) = dir_of(&ds)?.get(name) {
            let existing = self.get_entry(ent.ino, ent.generation).expect("entry names a live object");
            return self.create_existing(&existing, ftype, how);
        }
        if ftype == FileType::Directory && ds.nlink >= LINK_MAX {
            return Err(VfsError::TooManyLinks);
        }
        let volume = ds.volume.clone();
        let object_bytes = INODE_CHARGE_BYTES + target.map_or(0, |t| t.len() as u64);
        self.charge(volume.as_ref(), object_bytes + dirent_charge(name))?;

        let ino = self.alloc_ino(&mut ns);
        let generation = self.generation_next.fetch_add(1, Ordering::AcqRel);
        let now = Time::now();
        let body = match kind {
            NodeKind::File => Body::File(FileData::new(match how {
                CreateMode::Exclusive(v) => Some(v),
                _ => None,
            })),
            NodeKind::Directory => Body::Dir(Dir::new(d.ino, d.generation)),
            NodeKind::Symlink { target } => Body::Symlink(target.into()),
            NodeKind::Device { .. } => Body::Special,
        };
        let st = State {
            ftype,
            mode,
            nlink: if ftype == FileType::Directory { 2 } else { 1 },
            uid: cred.uid,
            gid: cred.gid,
            size: target.map_or(0, |t| t.len() as u64),
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            change: 1,
            dead: false,
            pins: 0,
            volume,
            charged_bytes: object_bytes,
            body,
            xattrs: Default::default(),
        };
        let inode = Arc::new(Inode::new(ino, generation, st));
        let result = (self.handle(&inode), self.attr(&inode, &inode.read()));
        self.table_insert(inode);
        self.inode_count.fetch_add(1, Ordering::AcqRel);
        dir_of_mut(&mut ds)?.insert(name, ino, generation);
        if ftype == FileType::Directory {
            ds.nlink += 1;
        }
        ds.touch_mtime(now);
        Ok(result)
    }

    fn remove(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        self.unlink(dir, name, false)
    }

    fn rmdir(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        self.unlink(dir, name, true)
    }

    fn rename(&self, from_dir: &FileHandle, from_name: &[u8], to_dir: &FileHandle, to_name: &[u8]) -> VfsResult<()> {
        check_name(from_name)?;
        check_name(to_name)?;
        let mut ns = self.lock_ns();
        let fd = self.get(from_dir)?;
        let td = self.get(to_dir)?;
        if Arc::ptr_eq(&fd, &td) {
            let mut ds = fd.write();
            live(&ds)?;
            self.rename_locked(&mut ns, (&fd, &mut ds), from_name, None, to_name)
        } else {
            let mut fs = fd.write();
            let mut ts = td.write();
            live(&fs)?;
            live(&ts)?;
            self.rename_locked(&mut ns, (&fd, &mut fs), from_name, Some((&td, &mut ts)), to_name)
        }
    }

    fn link(&self, fh: &FileHandle, dir: &FileHandle, name: &[u8]) -> VfsResult<Attr> {
        check_name(name)?;
        let _ns = self.lock_ns();
        let inode = self.get(fh)?;
        let d = self.get(dir)?;
        if Arc::ptr_eq(&inode, &d) {
            // Either a directory (which cannot be linked) or not a directory.
            let is_dir = inode.read().ftype == FileType::Directory;
            return Err(if is_dir { VfsError::IsDir } else { VfsError::NotDir });
        }
        let mut ds = d.write();
        live(&ds)?;
        let mut st = inode.write();
        live(&st)?;
        if st.ftype == FileType::Directory {
            return Err(VfsError::IsDir);
        }
        if st.nlink == 0 {
            // Removed while open: it cannot get a name back (as linkat(2)).
            return Err(VfsError::NoEnt);
        }
        if dir_of(&ds)?.get(name).is_some() {
            return Err(VfsError::Exist);
        }
        if !same_volume(st.volume.as_ref(), ds.volume.as_ref()) {
            return Err(VfsError::CrossDevice);
        }
        if st.nlink >= LINK_MAX {
            return Err(VfsError::TooManyLinks);
        }
        self.charge(ds.volume.as_ref(), dirent_charge(name))?;
        let now = Time::now();
        dir_of_mut(&mut ds)?.insert(name, inode.ino, inode.generation);
        ds.touch_mtime(now);
        st.nlink += 1;
        st.touch_ctime(now);
        Ok(self.attr(&inode, &st))
    }

    fn readlink(&self, fh: &FileHandle) -> VfsResult<Vec<u8>> {
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        match &st.body {
            Body::Symlink(t) => Ok(t.to_vec()),
            _ => Err(VfsError::Inval),
        }
    }

    fn readdir(&self, dir: &FileHandle, cookie: u64, visit: &mut dyn FnMut(DirEntry<'_>) -> bool) -> VfsResult<bool> {
        let d = self.get(dir)?;
        let mut names: Vec<u8> = Vec::new();
        let mut batch: Vec<(u64, usize, usize, Ino, u64)> = Vec::with_capacity(READDIR_BATCH_MAX);
        let mut after = cookie;
        loop {
            // Copy a batch out under the directory lock, then look the
            // children up without it (see the module comment: no second
            // inode lock while holding one).
            names.clear();
            batch.clear();
            let at_end = {
                let st = d.read();
                live(&st)?;
                let dd = dir_of(&st)?;
                // 1 and 2 are what a protocol layer may hand out for "." and
                // "..": resuming after them starts at the first entry.
                if after >= dd.cookie_next {
                    return Err(VfsError::Inval);
                }
                let mut it = dd.by_cookie.range(after + 1..);
                for (&c, ent) in it.by_ref().take(READDIR_BATCH_MAX) {
                    let start = names.len();
                    names.extend_from_slice(&ent.name);
                    batch.push((c, start, names.len(), ent.ino, ent.generation));
                }
                it.next().is_none()
            };
            for &(c, start, end, ino, generation) in &batch {
                after = c;
                // Removed since the batch was taken: not listed, as if the
                // removal had come first.
                let Some(child) = self.get_entry(ino, generation) else { continue };
                let st = child.read();
                if st.dead {
                    continue;
                }
                let attr = self.attr(&child, &st);
                drop(st);
                let entry = DirEntry { cookie: c, name: &names[start..end], fh: self.handle(&child), attr };
                if !visit(entry) {
                    return Ok(false);
                }
            }
            if at_end {
                return Ok(true);
            }
        }
    }

    fn cookie_verifier(&self, dir: &FileHandle) -> VfsResult<[u8; 8]> {
        let d = self.get(dir)?;
        let st = d.read();
        live(&st)?;
        dir_of(&st)?;
        // Cookies never become invalid for the life of a directory, so the
        // verifier only has to tell directories (incarnations) apart.
        Ok(d.generation.to_be_bytes())
    }

    fn fsstat(&self, fh: &FileHandle) -> VfsResult<FsStat> {
        let inode = self.get(fh)?;
        let volume = {
            let st = inode.read();
            live(&st)?;
            st.volume.clone()
        };
        let backend_free_bytes = self.space.free_bytes();
        let (total_bytes, free_bytes) = match &volume {
            Some(v) => (v.space.capacity_bytes(), v.space.free_bytes().min(backend_free_bytes)),
            None => (self.space.capacity_bytes(), backend_free_bytes),
        };
        // Objects are charged in bytes, so file counts are what the bytes
        // could hold if spent on empty objects.
        let free_files = free_bytes / (INODE_CHARGE_BYTES + DIRENT_CHARGE_BYTES);
        Ok(FsStat {
            total_bytes,
            free_bytes,
            avail_bytes: free_bytes,
            total_files: total_bytes / (INODE_CHARGE_BYTES + DIRENT_CHARGE_BYTES),
            free_files,
            avail_files: free_files,
        })
    }

    fn set_quota(&self, dir: &FileHandle, capacity_bytes: u64) -> VfsResult<()> {
        let _ns = self.lock_ns();
        let d = self.get(dir)?;
        let mut st = d.write();
        live(&st)?;
        let volume_now = st.volume.clone();
        let dd = dir_of_mut(&mut st)?;
        if let Some(v) = &dd.volume_root {
            return v.space.set_capacity(capacity_bytes);
        }
        if volume_now.is_some() {
            // Volumes do not nest: a directory inside one cannot become one.
            return Err(VfsError::Inval);
        }
        if !dd.is_empty() {
            // Its contents were charged outside any volume; moving them in
            // is not supported. Volumes start empty.
            return Err(VfsError::NotEmpty);
        }
        if capacity_bytes < st.charged_bytes {
            return Err(VfsError::Inval);
        }
        // The directory's own charge moves into the volume (it is already
        // charged to the backend, so only the volume is charged here).
        let volume = Arc::new(Volume { root_ino: d.ino, space: Space::new(capacity_bytes, st.charged_bytes) });
        st.volume = Some(volume.clone());
        dir_of_mut(&mut st)?.volume_root = Some(volume);
        st.touch_ctime(Time::now());
        Ok(())
    }

    fn quota(&self, fh: &FileHandle) -> VfsResult<Option<QuotaUsage>> {
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        Ok(st
            .volume
            .as_ref()
            .map(|v| QuotaUsage { capacity_bytes: v.space.capacity_bytes(), used_bytes: v.space.used_bytes() }))
    }

    fn volume_of(&self, fh: &FileHandle) -> VfsResult<Option<Ino>> {
        let inode = self.get(fh)?;
        let st = inode.read();
        live(&st)?;
        Ok(st.volume.as_ref().map(|v| v.root_ino))
    }

    fn pin(&self, fh: &FileHandle) -> VfsResult<()> {
        let inode = self.get(fh)?;
        let mut st = inode.write();
        live(&st)?;
        if st.ftype == FileType::Directory {
            return Err(VfsError::IsDir);
        }
        st.pins = st.pins.checked_add(1).ok_or(VfsError::Inval)?;
        Ok(())
    }

    fn unpin(&self, fh: &FileHandle) {
        let Ok(inode) = self.get(fh) else {
            debug_assert!(false, "unpin of a handle that names nothing: {fh:?}");
            return;
        };
        {
            let mut st = inode.write();
            if st.dead || st.pins == 0 {
                debug_assert!(false, "unpin without a pin: {fh:?}");
                return;
            }
            if st.pins > 1 || st.nlink > 0 {
                st.pins -= 1;
                return;
            }
        }
        // Possibly the last reference to an unlinked object: destroying it
        // needs `ns` (the inode number goes back), taken before the inode
        // lock like every namespace change. Another pin may have come in
        // meanwhile; a link cannot (`link` refuses nlink 0).
        let mut ns = self.lock_ns();
        let mut st = inode.write();
        st.pins -= 1;
        if st.pins == 0 && st.nlink == 0 && !st.dead {
            self.destroy(&mut ns, &inode, &mut st);
        }
    }

    fn remove_tree(&self, dir: &FileHandle, name: &[u8]) -> VfsResult<()> {
        check_name(name)?;
        let mut ns = self.lock_ns();
        let d = self.get(dir)?;
        let mut ds = d.write();
        live(&ds)?;
        let ent = dir_of(&ds)?.get(name).ok_or(VfsError::NoEnt)?;
        let top = self.get_entry(ent.ino, ent.generation).expect("entry names a live object");
        if top.read().ftype != FileType::Directory {
            return Err(VfsError::NotDir);
        }
        let now = Time::now();
        self.unlink_entry(&mut ds, name, now);
        ds.nlink -= 1;
        drop(ds);
        // Depth-first with an explicit stack: a hostile, very deep tree
        // cannot overflow the thread's stack.
        let mut stack = vec![top];
        while let Some(dir) = stack.pop() {
            let mut st = dir.write();
            let Body::Dir(dd) = &mut st.body else { unreachable!("only directories are stacked") };
            let entries = std::mem::take(&mut dd.by_cookie);
            dd.by_name.clear();
            for ent in entries.into_values() {
                self.release(st.volume.as_ref(), dirent_charge(&ent.name));
                let child = self.get_entry(ent.ino, ent.generation).expect("entry names a live object");
                let mut cs = child.write();
                if cs.ftype == FileType::Directory {
                    drop(cs);
                    stack.push(child);
                } else {
                    self.drop_link(&mut ns, &child, &mut cs, now);
                }
            }
            self.destroy(&mut ns, &dir, &mut st);
        }
        Ok(())
    }
}

/// An extended attribute name: 1 to XATTR_NAME_MAX bytes, no NUL.
fn check_xattr_name(name: &[u8]) -> VfsResult<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(VfsError::Inval);
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(VfsError::NameTooLong);
    }
    Ok(())
}

fn file_of(st: &State) -> VfsResult<&FileData> {
    match &st.body {
        Body::File(f) => Ok(f),
        Body::Dir(_) => Err(VfsError::IsDir),
        _ => Err(VfsError::Inval),
    }
}

/// What a create asks for, checked: type, device numbers, symlink target.
type Validated<'n> = (FileType, (u32, u32), Option<&'n [u8]>);

fn validate_kind<'n>(kind: &NodeKind<'n>) -> VfsResult<Validated<'n>> {
    Ok(match *kind {
        NodeKind::File => (FileType::Regular, (0, 0), None),
        NodeKind::Directory => (FileType::Directory, (0, 0), None),
        NodeKind::Symlink { target } => {
            if target.is_empty() || target.contains(&0) {
                return Err(VfsError::Inval);
            }
            if target.len() > SYMLINK_TARGET_MAX_BYTES {
                return Err(VfsError::NameTooLong);
            }
            (FileType::Symlink, (0, 0), Some(target))
        }
        NodeKind::Device { ftype, rdev } => match ftype {
            FileType::BlockDevice | FileType::CharDevice => (ftype, rdev, None),
            FileType::Socket | FileType::Fifo => (ftype, (0, 0), None),
            FileType::Regular | FileType::Directory | FileType::Symlink => return Err(VfsError::Inval),
        },
    })
}

impl MemFs {
    /// CREATE of a name that exists: what `how` says to do with it.
    fn create_existing(&self, existing: &Inode, ftype: FileType, how: CreateMode) -> VfsResult<(FileHandle, Attr)> {
        let st = existing.read();
        let verifier = match &st.body {
            Body::File(f) if ftype == FileType::Regular => f.create_verifier,
            _ => return Err(VfsError::Exist),
        };
        match how {
            CreateMode::Unchecked => {}
            CreateMode::Guarded => return Err(VfsError::Exist),
            CreateMode::Exclusive(v) => match verifier {
                Some(stored) if stored == v => {}
                Some(_) => return Err(VfsError::ExistVerifierMismatch),
                None => return Err(VfsError::Exist),
            },
        }
        Ok((self.handle(existing), self.attr(existing, &st)))
    }

    /// Change a regular file's size, freeing or checking space; no change
    /// to `st.size` itself (the caller sets it once everything is checked).
    fn resize(&self, st: &mut State, size: u64) -> VfsResult<()> {
        match &st.body {
            Body::File(_) => {}
            Body::Dir(_) => return Err(VfsError::IsDir),
            _ => return Err(VfsError::Inval),
        }
        if size > FILE_SIZE_MAX_BYTES {
            return Err(VfsError::FileTooBig);
        }
        if size > st.size {
            // Extension is sparse (charges nothing), but no file may be
            // larger than the volume that holds it.
            if let Some(v) = &st.volume {
                if size > v.space.capacity_bytes() {
                    return Err(VfsError::QuotaExceeded);
                }
            }
            return Ok(());
        }
        let Body::File(f) = &mut st.body else { unreachable!("checked above") };
        let freed = f.truncate(size);
        st.charged_bytes -= freed;
        self.release(st.volume.as_ref(), freed);
        Ok(())
    }

    /// Take `name` out of the locked directory `ds` and free its charge.
    fn unlink_entry(&self, ds: &mut State, name: &[u8], now: Time) {
        let dd = dir_of_mut(ds).expect("caller checked a directory");
        dd.remove(name).expect("caller checked the entry exists");
        self.release(ds.volume.as_ref(), dirent_charge(name));
        ds.touch_mtime(now);
    }

    /// One link to a non-directory went away. The last one destroys it,
    /// unless it is pinned: it then lives on without a name until unpinned.
    fn drop_link(&self, ns: &mut Namespace, inode: &Inode, st: &mut State, now: Time) {
        assert!(st.nlink > 0 && st.ftype != FileType::Directory);
        if st.nlink == 1 && st.pins == 0 {
            self.destroy(ns, inode, st);
        } else {
            st.nlink -= 1;
            st.touch_ctime(now);
        }
    }

    /// Rename with the directories locked (`to` is None when it is `from`).
    fn rename_locked(
        &self,
        ns: &mut Namespace,
        from: (&Arc<Inode>, &mut State),
        from_name: &[u8],
        to: Option<(&Arc<Inode>, &mut State)>,
        to_name: &[u8],
    ) -> VfsResult<()> {
        let (fd, fs) = from;
        dir_of(fs)?;
        if let Some((_, ts)) = &to {
            dir_of(ts)?;
        }
        let same_dir = to.is_none();
        let src_ent = dir_of(fs)?.get(from_name).ok_or(VfsError::NoEnt)?.clone();
        if same_dir && from_name == to_name {
            return Ok(());
        }
        let (td_ino, td_parent) = match &to {
            Some((td, ts)) => (td.ino, dir_of(ts)?.parent_ino),
            None => (fd.ino, dir_of(fs)?.parent_ino),
        };
        if src_ent.ino == td_ino {
            // Moving a directory into itself.
            return Err(VfsError::Inval);
        }
        let src = self.get_entry(src_ent.ino, src_ent.generation).expect("entry names a live object");
        let mut ss = src.write();
        let src_is_dir = ss.ftype == FileType::Directory;
        if src_is_dir {
            let locked = [(fd.ino, dir_of(fs)?.parent_ino), (td_ino, td_parent)];
            if self.is_ancestor(src.ino, td_ino, &locked) {
                return Err(VfsError::Inval);
            }
        }
        {
            let to_volume = match &to {
                Some((_, ts)) => ts.volume.as_ref(),
                None => fs.volume.as_ref(),
            };
            if !same_volume(outer_volume(&ss, src.ino), to_volume) {
                return Err(VfsError::CrossDevice);
            }
        }
        let tgt_ent = match &to {
            Some((_, ts)) => dir_of(ts)?.get(to_name).cloned(),
            None => dir_of(fs)?.get(to_name).cloned(),
        };
        let mut tgt = None;
        if let Some(ent) = &tgt_ent {
            if ent.ino == src.ino {
                // Two links to one object: POSIX says do nothing.
                return Ok(());
            }
            if ent.ino == fd.ino {
                // The target is the source's own directory, which holds the
                // source, so it is not empty.
                return Err(if src_is_dir { VfsError::NotEmpty } else { VfsError::IsDir });
            }
            let t = self.get_entry(ent.ino, ent.generation).expect("entry names a live object");
            let tgt_is_dir = t.read().ftype == FileType::Directory;
            match (src_is_dir, tgt_is_dir) {
                (true, false) => return Err(VfsError::NotDir),
                (false, true) => return Err(VfsError::IsDir),
                (true, true) if !dir_of(&t.read())?.is_empty() => return Err(VfsError::NotEmpty),
                _ => {}
            }
            tgt = Some(t);
        }
        let moves_dir_across = src_is_dir && !same_dir;
        if moves_dir_across && tgt.is_none() {
            let tn = to.as_ref().map_or(fs.nlink, |(_, ts)| ts.nlink);
            if tn >= LINK_MAX {
                return Err(VfsError::TooManyLinks);
            }
        }
        // All checks done. Both entries are charged to the same volume (the
        // check above), so only the difference is reserved: a rename to a
        // name no longer than the old one works in a full volume. The
        // reservation is the last thing that can fail; then mutate.
        debug_assert!(same_volume(
            fs.volume.as_ref(),
            to.as_ref().map_or(fs.volume.as_ref(), |(_, ts)| ts.volume.as_ref())
        ));
        let old_bytes = dirent_charge(from_name);
        let new_bytes = if tgt.is_none() { dirent_charge(to_name) } else { 0 };
        if new_bytes > old_bytes {
            self.charge(fs.volume.as_ref(), new_bytes - old_bytes)?;
        }
        let now = Time::now();
        dir_of_mut(fs)?.remove(from_name).expect("source entry exists");
        fs.touch_mtime(now);
        if old_bytes > new_bytes {
            self.release(fs.volume.as_ref(), old_bytes - new_bytes);
        }
        if moves_dir_across {
            fs.nlink -= 1;
        }
        let (td_ino, td_generation, ts): (Ino, u64, &mut State) = match to {
            Some((td, ts)) => (td.ino, td.generation, ts),
            None => (fd.ino, fd.generation, fs),
        };
        if let Some(t) = &tgt {
            let mut tst = t.write();
            dir_of_mut(ts)?.remove(to_name).expect("target entry exists");
            if tst.ftype == FileType::Directory {
                ts.nlink -= 1;
                self.destroy(ns, t, &mut tst);
            } else {
                self.drop_link(ns, t, &mut tst, now);
            }
        }
        dir_of_mut(ts)?.insert(to_name, src.ino, src.generation);
        ts.touch_mtime(now);
        if let Body::Dir(sd) = &mut ss.body {
            sd.parent_ino = td_ino;
            sd.parent_generation = td_generation;
        }
        ss.touch_ctime(now);
        if moves_dir_across {
            ts.nlink += 1;
        }
        Ok(())
    }
}

impl MemFs {
    /// REMOVE and RMDIR share one locking order (namespace, directory,
    /// child); `dir_op` says which kind of child may go.
    fn unlink(&self, dir: &FileHandle, name: &[u8], dir_op: bool) -> VfsResult<()> {
        check_name(name)?;
        let mut ns = self.lock_ns();
        let d = self.get(dir)?;
        let mut ds = d.write();
        live(&ds)?;
        let ent = dir_of(&ds)?.get(name).ok_or(VfsError::NoEnt)?;
        let child = self.get_entry(ent.ino, ent.generation).expect("entry names a live object");
        let mut cs = child.write();
        if dir_op {
            if !dir_of(&cs)?.is_empty() {
                return Err(VfsError::NotEmpty);
            }
        } else if cs.ftype == FileType::Directory {
            return Err(VfsError::IsDir);
        }
        let now = Time::now();
        self.unlink_entry(&mut ds, name, now);
        if dir_op {
            ds.nlink -= 1;
            self.destroy(&mut ns, &child, &mut cs);
        } else {
            self.drop_link(&mut ns, &child, &mut cs, now);
        }
        Ok(())
    }
}
