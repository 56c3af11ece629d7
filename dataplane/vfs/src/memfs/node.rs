//! In-memory objects: the inode, its attributes and its body (file chunks,
//! directory entries, symlink target).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::space::Volume;
use super::{CHUNK_BYTES, CHUNK_CHARGE_BYTES, DIRENT_CHARGE_BYTES, EXTENT_BYTES, XATTR_CHARGE_BYTES};
use crate::idhash::SeededIdHashMap;
use crate::{FileType, Ino, LendSink, Shared, Time};

/// One object. `ino` and `generation` never change; everything else lives
/// behind the per-inode lock.
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) ino: Ino,
    pub(crate) generation: u64,
    state: RwLock<State>,
}

impl Inode {
    pub(crate) fn new(ino: Ino, generation: u64, state: State) -> Inode {
        Inode { ino, generation, state: RwLock::new(state) }
    }

    /// A poisoned lock means a panic mid-mutation: the object may be
    /// inconsistent, so stop loudly rather than serve it.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().expect("memfs inode lock poisoned")
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().expect("memfs inode lock poisoned")
    }
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) ftype: FileType,
    pub(crate) mode: u32,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) size: u64,
    pub(crate) rdev: (u32, u32),
    pub(crate) atime: Time,
    pub(crate) mtime: Time,
    pub(crate) ctime: Time,
    pub(crate) change: u64,
    /// Set when the object is destroyed (its last link went away while
    /// unpinned, or its last pin while unlinked); every later access is
    /// `Stale`.
    pub(crate) dead: bool,
    /// Open references (`Vfs::pin`): while non-zero, losing the last link
    /// leaves the object alive with `nlink` 0.
    pub(crate) pins: u32,
    /// The volume this object is charged to and reports space from.
    pub(crate) volume: Option<Arc<Volume>>,
    /// Bytes this inode charges to its volume and the backend: the inode
    /// overhead, data chunks, symlink target. Directory entries are charged
    /// separately (to the directory's volume) and are not included.
    pub(crate) charged_bytes: u64,
    pub(crate) body: Body,
    /// Extended attributes (their charge is part of `charged_bytes`).
    pub(crate) xattrs: Xattrs,
}

/// Extended attributes of one object, by name (sorted, so a listing cookie
/// is a position). Boxed: most objects have none and pay one word.
#[derive(Debug, Default)]
pub(crate) struct Xattrs {
    map: Option<Box<XattrMap>>,
    /// What they charge (included in the object's `charged_bytes`).
    pub(crate) charged_bytes: u64,
}

/// Extended attribute values by name.
type XattrMap = BTreeMap<Box<[u8]>, Box<[u8]>>;

/// What one extended attribute charges: name, value, and its share of the
/// map node and allocator overhead.
pub(crate) fn xattr_charge(name: &[u8], value: &[u8]) -> u64 {
    XATTR_CHARGE_BYTES + name.len() as u64 + value.len() as u64
}

impl Xattrs {
    pub(crate) fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.map.as_ref()?.get(name).map(|v| &v[..])
    }

    pub(crate) fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// Names from position `skip` on, in order.
    pub(crate) fn names(&self, skip: usize) -> impl Iterator<Item = &[u8]> {
        self.map.iter().flat_map(|m| m.keys()).skip(skip).map(|k| &k[..])
    }

    /// Insert or replace; the caller has charged the difference.
    pub(crate) fn set(&mut self, name: &[u8], value: &[u8]) {
        let charge = xattr_charge(name, value);
        let old = self.map.get_or_insert_with(Default::default).insert(name.into(), value.into());
        self.charged_bytes = self.charged_bytes + charge - old.map_or(0, |v| xattr_charge(name, &v));
    }

    /// Remove `name`; the charge released, if it existed.
    pub(crate) fn remove(&mut self, name: &[u8]) -> Option<u64> {
        let map = self.map.as_mut()?;
        let v = map.remove(name)?;
        if map.is_empty() {
            self.map = None;
        }
        let charge = xattr_charge(name, &v);
        self.charged_bytes -= charge;
        Some(charge)
    }
}

impl State {
    /// Record a change to data or attributes (ctime and change attribute).
    pub(crate) fn touch_ctime(&mut self, now: Time) {
        self.ctime = now;
        self.change += 1;
    }

    /// Record a change to the contents (data or entries): mtime and ctime.
    pub(crate) fn touch_mtime(&mut self, now: Time) {
        self.mtime = now;
        self.touch_ctime(now);
    }
}

#[derive(Debug)]
pub(crate) enum Body {
    File(FileData),
    Dir(Dir),
    Symlink(Box<[u8]>),
    /// Devices, fifos, sockets: attributes only.
    Special,
}

/// Sparse file data: pages of `CHUNK_BYTES`, grouped in extents of
/// `EXTENT_BYTES`; a missing page is a hole and reads as zeros.
///
/// Space is allocated and charged by the page, so a small or sparse file
/// costs what it holds. An extent whose every page is present is kept as one
/// buffer in `full`, keyed by extent index: a large READ lends it as one
/// piece instead of sixteen, a large WRITE allocates once per extent, and a
/// laid-out file's map is sixteen times smaller. The pages of other extents
/// live in `pages`, keyed by page index, one buffer each, as sparse as the
/// file. An extent is never in both.
///
/// Hash maps, not trees: a 4 KiB READ or WRITE finds its buffer with one
/// hash (two in a sparse extent) and usually one cache miss, where a B-tree
/// over a large file took a descent of several nodes (the two lookups of a
/// 4 KiB WRITE were ~20 % of the server's samples under fio, perf).
/// Truncation visits the whole maps (rare, and bounded by the file). The
/// keys are seeded per process (clients choose offsets).
///
/// Buffers are shared so a zero-copy READ can lend them to replies in
/// flight; a write to a buffer still lent copies it first (`chunk_mut`).
#[derive(Debug, Default)]
pub(crate) struct FileData {
    full: SeededIdHashMap<u64, Shared>,
    pages: SeededIdHashMap<u64, Shared>,
    /// Pages allocated, a full extent counting all of its pages: what the
    /// file's data is charged.
    npages: u64,
    /// Verifier of the exclusive create that made this file, if any.
    pub(crate) create_verifier: Option<[u8; 8]>,
}

/// Pages per extent.
const PAGES: u64 = (EXTENT_BYTES / CHUNK_BYTES) as u64;
const PAGE: u64 = CHUNK_BYTES as u64;
const EXTENT: u64 = EXTENT_BYTES as u64;
const _: () = assert!(PAGES >= 2 && EXTENT_BYTES % CHUNK_BYTES == 0);

/// The part of `data` (written at file `offset`) that lands in the span
/// `start..start + span` of the file: (offset within the span, bytes).
fn part(offset: u64, data: &[u8], start: u64, span: u64) -> (usize, &[u8]) {
    let from = start.max(offset);
    let to = (start + span).min(offset + data.len() as u64);
    ((from - start) as usize, &data[(from - offset) as usize..(to - offset) as usize])
}

impl FileData {
    /// An empty file; `create_verifier` if an exclusive create made it.
    pub(crate) fn new(create_verifier: Option<[u8; 8]>) -> FileData {
        FileData { create_verifier, ..FileData::default() }
    }

    /// How many pages a write of `len` bytes at `offset` would allocate.
    pub(crate) fn chunks_missing(&self, offset: u64, len: usize) -> u64 {
        debug_assert!(len > 0);
        let end = offset + len as u64;
        let mut missing = 0;
        for idx in offset / EXTENT..=(end - 1) / EXTENT {
            if self.full.contains_key(&idx) {
                continue;
            }
            let first = (idx * EXTENT).max(offset) / PAGE;
            let last = ((idx + 1) * EXTENT).min(end).div_ceil(PAGE);
            missing += (first..last).filter(|p| !self.pages.contains_key(p)).count() as u64;
        }
        missing
    }

    /// Copy `data` in at `offset`. The caller has charged the pages that
    /// `chunks_missing` reported.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) {
        let first = offset / EXTENT;
        let last = (offset + data.len() as u64 - 1) / EXTENT;
        for idx in first..=last {
            let (at, src) = part(offset, data, idx * EXTENT, EXTENT);
            if src.len() == EXTENT_BYTES {
                // The whole extent: one new buffer replaces whatever was
                // there (a lent one stays with its reply).
                let had = if self.full.insert(idx, Shared::from(src)).is_some() {
                    PAGES
                } else if self.pages.is_empty() {
                    // A file written in whole extents has no pages to drop.
                    0
                } else {
                    (idx * PAGES..(idx + 1) * PAGES).filter(|p| self.pages.remove(p).is_some()).count() as u64
                };
                self.npages += PAGES - had;
                continue;
            }
            if let Some(buf) = self.full.get_mut(&idx) {
                chunk_mut(buf)[at..at + src.len()].copy_from_slice(src);
                continue;
            }
            let base = idx * EXTENT;
            let mut created = false;
            for p in (base + at as u64) / PAGE..=(base + (at + src.len()) as u64 - 1) / PAGE {
                let (in_page, bytes) = part(base + at as u64, src, p * PAGE, PAGE);
                match self.pages.entry(p) {
                    std::collections::hash_map::Entry::Occupied(mut o) => {
                        chunk_mut(o.get_mut())[in_page..in_page + bytes.len()].copy_from_slice(bytes)
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(new_chunk(in_page, bytes));
                        self.npages += 1;
                        created = true;
                    }
                }
            }
            if created {
                self.promote_if_complete(idx);
            }
        }
    }

    /// Extent `idx` kept as pages: when every page is present, one buffer
    /// from now on (a one-time copy of the extent).
    fn promote_if_complete(&mut self, idx: u64) {
        // The extent's last page first: a file filled in order misses it
        // until the extent is complete.
        if !(idx * PAGES..(idx + 1) * PAGES).rev().all(|p| self.pages.contains_key(&p)) {
            return;
        }
        let mut whole = Vec::with_capacity(EXTENT_BYTES);
        for p in idx * PAGES..(idx + 1) * PAGES {
            whole.extend_from_slice(&self.pages.remove(&p).expect("present, checked above"));
        }
        self.full.insert(idx, Shared::from(whole));
    }

    /// Whether the page holding byte `pos` is allocated.
    fn has_page(&self, pos: u64) -> bool {
        self.full.contains_key(&(pos / EXTENT)) || self.pages.contains_key(&(pos / PAGE))
    }

    /// The first allocated byte at or after `offset`, if any (it may lie
    /// past the size in the last page; the caller clamps). Probes the pages
    /// that follow `offset` one by one for a while (a short hole costs a
    /// few lookups), then scans the maps (a long hole costs what the file
    /// holds, not what it spans).
    pub(crate) fn next_data(&self, offset: u64) -> Option<u64> {
        const PROBES_MAX: u64 = 64;
        let mut pos = offset;
        for _ in 0..PROBES_MAX {
            if self.has_page(pos) {
                return Some(pos);
            }
            pos = (pos / PAGE + 1).checked_mul(PAGE)?;
        }
        let from_full = self.full.keys().filter(|&&i| (i + 1) * EXTENT > pos).map(|&i| (i * EXTENT).max(pos)).min();
        let from_pages = self.pages.keys().filter(|&&p| (p + 1) * PAGE > pos).map(|&p| (p * PAGE).max(pos)).min();
        match (from_full, from_pages) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The first byte at or after `offset` in no allocated page. Walks the
    /// allocated run from `offset` (a full extent in one step).
    pub(crate) fn next_hole(&self, offset: u64) -> u64 {
        let mut pos = offset;
        loop {
            if self.full.contains_key(&(pos / EXTENT)) {
                pos = (pos / EXTENT + 1) * EXTENT;
            } else if self.pages.contains_key(&(pos / PAGE)) {
                pos = (pos / PAGE + 1) * PAGE;
            } else {
                return pos;
            }
        }
    }

    /// How many pages of `[offset, end)` are missing, without visiting them
    /// when the range is much larger than the file's allocation: at least
    /// the range's pages minus every page the file has.
    pub(crate) fn pages_missing_at_least(&self, offset: u64, end: u64) -> u64 {
        let span = end.div_ceil(PAGE) - offset / PAGE;
        span.saturating_sub(self.npages)
    }

    /// Allocate every missing page of `[offset, end)` as zeros. The caller
    /// has charged the pages `chunks_missing` reported. The new pages share
    /// one zero buffer until written (`chunk_mut` copies it then), but are
    /// charged as allocated: the space is reserved.
    pub(crate) fn allocate(&mut self, offset: u64, end: u64) {
        debug_assert!(offset < end);
        for idx in offset / EXTENT..=(end - 1) / EXTENT {
            if self.full.contains_key(&idx) {
                continue;
            }
            let first = (idx * EXTENT).max(offset) / PAGE;
            let last = ((idx + 1) * EXTENT).min(end).div_ceil(PAGE);
            let mut created = false;
            for p in first..last {
                if let std::collections::hash_map::Entry::Vacant(v) = self.pages.entry(p) {
                    v.insert(zero_chunk().clone());
                    self.npages += 1;
                    created = true;
                }
            }
            if created {
                self.promote_if_complete(idx);
            }
        }
    }

    /// Punch `[offset, end)`: pages wholly inside are freed (a full extent
    /// partly inside is split into pages first), the bytes of partly
    /// covered pages are zeroed. Returns the bytes of charge released.
    pub(crate) fn punch(&mut self, offset: u64, end: u64) -> u64 {
        debug_assert!(offset < end);
        let before = self.npages;
        // Pages wholly inside the range.
        let (whole_first, whole_end) = (offset.div_ceil(PAGE), end / PAGE);
        let (ext_first, ext_last) = (offset / EXTENT, (end - 1) / EXTENT);
        let extents = keys_in(&self.full, ext_first, ext_last);
        for idx in extents {
            let (pf, pe) = (idx * PAGES, (idx + 1) * PAGES);
            let (inside_first, inside_end) = (whole_first.max(pf), whole_end.min(pe));
            if inside_first >= inside_end {
                continue; // no whole page inside: zeroed below
            }
            let buf = self.full.remove(&idx).expect("listed above");
            for p in pf..pe {
                if p < inside_first || p >= inside_end {
                    let from = ((p - pf) * PAGE) as usize;
                    self.pages.insert(p, Shared::from(&buf[from..from + CHUNK_BYTES]));
                }
            }
            self.npages -= inside_end - inside_first;
        }
        if whole_first < whole_end {
            for p in keys_in(&self.pages, whole_first, whole_end - 1) {
                self.pages.remove(&p);
                self.npages -= 1;
            }
        }
        // The partly covered pages at either edge.
        if !offset.is_multiple_of(PAGE) {
            self.zero(offset, end.min((offset / PAGE + 1) * PAGE));
        }
        if !end.is_multiple_of(PAGE) {
            self.zero(offset.max(end / PAGE * PAGE), end);
        }
        shrink_if_sparse(&mut self.full);
        shrink_if_sparse(&mut self.pages);
        (before - self.npages) * CHUNK_CHARGE_BYTES
    }

    /// The allocated buffers of `[offset, end)` (`offset` page-aligned) to
    /// share with a clone, at their offsets from `offset`: a full extent the
    /// range covers whole as one piece, pages as pages (a page of a full
    /// extent the range covers only in part is copied out: only whole
    /// buffers can be shared). Holes are simply absent.
    pub(crate) fn pieces(&self, offset: u64, end: u64) -> Vec<(u64, Piece)> {
        debug_assert!(offset < end && offset.is_multiple_of(PAGE));
        let mut out = Vec::new();
        for idx in keys_in(&self.full, offset / EXTENT, (end - 1) / EXTENT) {
            let buf = &self.full[&idx];
            let (from, to) = (idx * EXTENT, (idx + 1) * EXTENT);
            if from >= offset && to <= end {
                out.push((from - offset, Piece::Extent(buf.clone())));
                continue;
            }
            for p in (from.max(offset) / PAGE)..to.min(end).div_ceil(PAGE) {
                let at = ((p * PAGE) - from) as usize;
                out.push((p * PAGE - offset, Piece::Page(Shared::from(&buf[at..at + CHUNK_BYTES]))));
            }
        }
        for p in keys_in(&self.pages, offset / PAGE, (end - 1) / PAGE) {
            out.push((p * PAGE - offset, Piece::Page(self.pages[&p].clone())));
        }
        out
    }

    /// Pages allocated in `[offset, end)`, a page counting when any of it is.
    pub(crate) fn pages_in(&self, offset: u64, end: u64) -> u64 {
        let (first, last) = (offset / PAGE, (end - 1) / PAGE);
        let mut n = 0;
        for idx in keys_in(&self.full, offset / EXTENT, (end - 1) / EXTENT) {
            n += last.min((idx + 1) * PAGES - 1) + 1 - first.max(idx * PAGES);
        }
        n + keys_in(&self.pages, first, last).len() as u64
    }

    /// Put `pieces` (from `pieces`) in at `offset` (page-aligned), whose
    /// range the caller has punched and charged: an extent lands whole
    /// where it is extent-aligned, else as pages.
    pub(crate) fn install(&mut self, offset: u64, pieces: Vec<(u64, Piece)>) {
        debug_assert!(offset.is_multiple_of(PAGE));
        for (rel, piece) in pieces {
            let at = offset + rel;
            match piece {
                Piece::Extent(buf) if at.is_multiple_of(EXTENT) => {
                    let idx = at / EXTENT;
                    debug_assert!(!(idx * PAGES..(idx + 1) * PAGES).any(|p| self.pages.contains_key(&p)));
                    if self.full.insert(idx, buf).is_none() {
                        self.npages += PAGES;
                    }
                }
                Piece::Extent(buf) => {
                    for i in 0..PAGES {
                        let from = (i * PAGE) as usize;
                        self.put_page(at / PAGE + i, Shared::from(&buf[from..from + CHUNK_BYTES]));
                    }
                }
                Piece::Page(buf) => self.put_page(at / PAGE, buf),
            }
        }
    }

    fn put_page(&mut self, p: u64, buf: Shared) {
        debug_assert!(!self.full.contains_key(&(p / PAGES)), "the caller punched the range");
        if self.pages.insert(p, buf).is_none() {
            self.npages += 1;
        }
    }

    /// Zero `[from, to)`, which lies within one page, where it is allocated.
    fn zero(&mut self, from: u64, to: u64) {
        debug_assert!(from < to && from / PAGE == (to - 1) / PAGE);
        if let Some(buf) = self.full.get_mut(&(from / EXTENT)) {
            chunk_mut(buf)[(from % EXTENT) as usize..((to - 1) % EXTENT + 1) as usize].fill(0);
        } else if let Some(page) = self.pages.get_mut(&(from / PAGE)) {
            chunk_mut(page)[(from % PAGE) as usize..((to - 1) % PAGE + 1) as usize].fill(0);
        }
    }

    /// Visit `len` bytes from `offset` in file order, a piece per buffer:
    /// `f(buffer, offset within it, bytes)`, with `None` for a hole (at most
    /// `EXTENT_BYTES` at a time).
    fn walk(&self, offset: u64, len: usize, mut f: impl FnMut(Option<&Shared>, usize, usize)) {
        let end = offset + len as u64;
        let mut pos = offset;
        while pos < end {
            let at = (pos % EXTENT) as usize;
            let n = ((end - pos) as usize).min(EXTENT_BYTES - at);
            if let Some(buf) = self.full.get(&(pos / EXTENT)) {
                f(Some(buf), at, n);
            } else {
                let stop = pos + n as u64;
                while pos < stop {
                    let in_page = (pos % PAGE) as usize;
                    let m = ((stop - pos) as usize).min(CHUNK_BYTES - in_page);
                    f(self.pages.get(&(pos / PAGE)), in_page, m);
                    pos += m as u64;
                }
                continue;
            }
            pos += n as u64;
        }
    }

    /// Fill `buf` from `offset`; holes read as zeros. The caller bounds
    /// `buf` by the file size.
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) {
        let mut done = 0;
        self.walk(offset, buf.len(), |chunk, at, n| {
            let out = &mut buf[done..done + n];
            match chunk {
                Some(c) => out.copy_from_slice(&c[at..at + n]),
                None => out.fill(0),
            }
            done += n;
        });
    }

    /// Lend `len` bytes from `offset` to `sink`, a piece per buffer; holes
    /// lend the zero buffer. The caller bounds `len` by the file size.
    pub(crate) fn lend(&self, offset: u64, len: usize, sink: &mut dyn LendSink) {
        self.walk(offset, len, |chunk, at, n| match chunk {
            Some(c) => sink.lend(c, at, n),
            None => sink.lend(zero_chunk(), 0, n),
        });
    }

    /// Drop data at and beyond `size`: whole pages are freed, the tail of
    /// the last partial page is zeroed so a later extension reads zeros.
    /// Returns the bytes of charge released.
    pub(crate) fn truncate(&mut self, size: u64) -> u64 {
        let before = self.npages;
        let keep_extents = size.div_ceil(EXTENT);
        let keep_pages = size.div_ceil(PAGE);
        let (full_before, pages_before) = (self.full.len(), self.pages.len());
        self.full.retain(|&idx, _| idx < keep_extents);
        self.pages.retain(|&p, _| p < keep_pages);
        self.npages -= (full_before - self.full.len()) as u64 * PAGES + (pages_before - self.pages.len()) as u64;
        // The extent the new end falls in: a full one keeps only the pages
        // below the end.
        let idx = size / EXTENT;
        if size % EXTENT != 0 && keep_pages < (idx + 1) * PAGES {
            if let Some(buf) = self.full.remove(&idx) {
                for p in idx * PAGES..keep_pages {
                    let from = ((p - idx * PAGES) * PAGE) as usize;
                    self.pages.insert(p, Shared::from(&buf[from..from + CHUNK_BYTES]));
                }
                self.npages -= (idx + 1) * PAGES - keep_pages;
            }
        }
        // A table much larger than what it holds gives its memory back.
        shrink_if_sparse(&mut self.full);
        shrink_if_sparse(&mut self.pages);
        let in_page = (size % PAGE) as usize;
        if in_page != 0 {
            if let Some(buf) = self.full.get_mut(&idx) {
                chunk_mut(buf)[(size % EXTENT) as usize..].fill(0);
            } else if let Some(page) = self.pages.get_mut(&(size / PAGE)) {
                chunk_mut(page)[in_page..].fill(0);
            }
        }
        (before - self.npages) * CHUNK_CHARGE_BYTES
    }

    pub(crate) fn charged_bytes(&self) -> u64 {
        self.npages * CHUNK_CHARGE_BYTES
    }
}

/// A buffer shared by a clone (`FileData::pieces`).
pub(crate) enum Piece {
    Extent(Shared),
    Page(Shared),
}

/// The keys of `map` in `first..=last`: by probing the range when it is
/// no larger than the map, else by scanning the map.
fn keys_in(map: &SeededIdHashMap<u64, Shared>, first: u64, last: u64) -> Vec<u64> {
    if last - first < map.len() as u64 {
        (first..=last).filter(|k| map.contains_key(k)).collect()
    } else {
        map.keys().copied().filter(|k| (first..=last).contains(k)).collect()
    }
}

/// Shrink a table much larger than what it holds.
fn shrink_if_sparse(map: &mut SeededIdHashMap<u64, Shared>) {
    if map.capacity() > 4 * map.len().max(64) {
        map.shrink_to_fit();
    }
}

/// A new page holding `src` at `in_page`, zeros elsewhere. A page the
/// write covers whole is not zeroed first.
fn new_chunk(in_page: usize, src: &[u8]) -> Shared {
    if src.len() == CHUNK_BYTES {
        return Shared::from(src);
    }
    let mut b = vec![0u8; CHUNK_BYTES];
    b[in_page..in_page + src.len()].copy_from_slice(src);
    Shared::from(b)
}

/// A buffer to write into: copied first if a reply in flight still holds it
/// (the reply keeps the bytes it was lent).
fn chunk_mut(chunk: &mut Shared) -> &mut [u8] {
    if std::sync::Arc::get_mut(chunk).is_none() {
        *chunk = Shared::from(&chunk[..]);
    }
    std::sync::Arc::get_mut(chunk).expect("unique after the copy")
}

/// All zeros, lent for holes: `walk` hands out a hole a page at a time (a
/// hole is a missing page; a full extent has none).
fn zero_chunk() -> &'static Shared {
    static ZERO: std::sync::OnceLock<Shared> = std::sync::OnceLock::new();
    ZERO.get_or_init(|| Shared::from(vec![0u8; CHUNK_BYTES]))
}

/// A directory entry as stored. The name allocation is shared with the
/// `Dir::by_name` key, so a name is held (and charged) once.
#[derive(Debug, Clone)]
pub(crate) struct Dirent {
    pub(crate) name: Arc<[u8]>,
    pub(crate) ino: Ino,
    pub(crate) generation: u64,
}

/// First cookie handed out: 0 starts a listing, 1 and 2 are left to the
/// protocol layers for "." and "..".
pub(crate) const COOKIE_FIRST: u64 = 3;

/// Directory entries indexed two ways: by name for lookup and by cookie for
/// listing. A cookie is assigned once per entry and never reused within the
/// directory, and cookies only grow, so a listing resumed from any cookie
/// sees every entry that existed throughout exactly once, whatever was added
/// or removed meanwhile.
#[derive(Debug)]
pub(crate) struct Dir {
    pub(crate) parent_ino: Ino,
    pub(crate) parent_generation: u64,
    pub(crate) by_cookie: BTreeMap<u64, Dirent>,
    pub(crate) by_name: HashMap<Arc<[u8]>, u64>,
    pub(crate) cookie_next: u64,
    /// Set when this directory is a quota root.
    pub(crate) volume_root: Option<Arc<Volume>>,
}

impl Dir {
    pub(crate) fn new(parent_ino: Ino, parent_generation: u64) -> Dir {
        Dir {
            parent_ino,
            parent_generation,
            by_cookie: BTreeMap::new(),
            by_name: HashMap::new(),
            cookie_next: COOKIE_FIRST,
            volume_root: None,
        }
    }

    pub(crate) fn get(&self, name: &[u8]) -> Option<&Dirent> {
        self.by_name.get(name).map(|c| &self.by_cookie[c])
    }

    pub(crate) fn insert(&mut self, name: &[u8], ino: Ino, generation: u64) {
        let cookie = self.cookie_next;
        self.cookie_next += 1;
        let name: Arc<[u8]> = name.into();
        let previous = self.by_name.insert(name.clone(), cookie);
        assert!(previous.is_none(), "directory entry inserted twice");
        self.by_cookie.insert(cookie, Dirent { name, ino, generation });
    }

    pub(crate) fn remove(&mut self, name: &[u8]) -> Option<Dirent> {
        let cookie = self.by_name.remove(name)?;
        let ent = self.by_cookie.remove(&cookie);
        assert!(ent.is_some(), "directory indexes disagree");
        ent
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_cookie.is_empty()
    }
}

/// Charge of one directory entry named `name` (charged to the directory's volume).
pub(crate) fn dirent_charge(name: &[u8]) -> u64 {
    DIRENT_CHARGE_BYTES + name.len() as u64
}
