//! In-memory objects: the inode, its attributes and its body (file chunks,
//! directory entries, symlink target).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::space::Volume;
use super::{CHUNK_BYTES, CHUNK_CHARGE_BYTES, DIRENT_CHARGE_BYTES};
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
    /// Set when the last link went away; every later access is `Stale`.
    pub(crate) dead: bool,
    /// The volume this object is charged to and reports space from.
    pub(crate) volume: Option<Arc<Volume>>,
    /// Bytes this inode charges to its volume and the backend: the inode
    /// overhead, data chunks, symlink target. Directory entries are charged
    /// separately (to the directory's volume) and are not included.
    pub(crate) charged_bytes: u64,
    pub(crate) body: Body,
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

/// Sparse file data: `CHUNK_BYTES` chunks keyed by chunk index; a missing
/// chunk is a hole and reads as zeros.
///
/// A hash map, not a tree: a 4 KiB READ or WRITE finds its chunk with one
/// hash and usually one cache miss, where a B-tree over a large file took a
/// descent of several nodes (the two lookups of a 4 KiB WRITE were ~20 % of
/// the server's samples under fio, perf). Reads of many chunks look each up
/// in turn; truncation visits the whole map (rare, and bounded by the file).
/// The key is seeded per process (clients choose offsets).
#[derive(Debug, Default)]
pub(crate) struct FileData {
    /// Shared so a zero-copy READ can lend them to replies in flight; a
    /// write to a chunk still lent copies it first (`chunk_mut`).
    pub(crate) chunks: SeededIdHashMap<u64, Shared>,
    /// Verifier of the exclusive create that made this file, if any.
    pub(crate) create_verifier: Option<[u8; 8]>,
}

const CHUNK: u64 = CHUNK_BYTES as u64;

impl FileData {
    /// How many chunks a write of `len` bytes at `offset` would allocate.
    pub(crate) fn chunks_missing(&self, offset: u64, len: usize) -> u64 {
        debug_assert!(len > 0);
        let first = offset / CHUNK;
        let last = (offset + len as u64 - 1) / CHUNK;
        (first..=last).filter(|i| !self.chunks.contains_key(i)).count() as u64
    }

    /// Copy `data` in at `offset`. The caller has charged the chunks that
    /// `chunks_missing` reported.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) {
        let first = offset / CHUNK;
        let last = (offset + data.len() as u64 - 1) / CHUNK;
        for idx in first..=last {
            let (in_chunk, src) = chunk_part(offset, data, idx);
            match self.chunks.entry(idx) {
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    chunk_mut(o.get_mut())[in_chunk..in_chunk + src.len()].copy_from_slice(src)
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(new_chunk(in_chunk, src));
                }
            }
        }
    }

    /// Visit `len` bytes from `offset` chunk by chunk, in file order:
    /// `f(chunk, offset within it, bytes)`, with `None` for a hole.
    fn walk(&self, offset: u64, len: usize, mut f: impl FnMut(Option<&Shared>, usize, usize)) {
        let end = offset + len as u64;
        let mut pos = offset;
        while pos < end {
            let in_chunk = (pos % CHUNK) as usize;
            let n = ((end - pos) as usize).min(CHUNK_BYTES - in_chunk);
            f(self.chunks.get(&(pos / CHUNK)), in_chunk, n);
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

    /// Lend `len` bytes from `offset` to `sink`, a piece per chunk; holes
    /// lend the zero chunk. The caller bounds `len` by the file size.
    pub(crate) fn lend(&self, offset: u64, len: usize, sink: &mut dyn LendSink) {
        self.walk(offset, len, |chunk, at, n| match chunk {
            Some(c) => sink.lend(c, at, n),
            None => sink.lend(zero_chunk(), 0, n),
        });
    }

    /// Drop data at and beyond `size`: whole chunks are freed, the tail of
    /// the last partial chunk is zeroed so a later extension reads zeros.
    /// Returns the bytes of charge released.
    pub(crate) fn truncate(&mut self, size: u64) -> u64 {
        let keep_chunks = size.div_ceil(CHUNK);
        let before = self.chunks.len();
        self.chunks.retain(|&idx, _| idx < keep_chunks);
        let dropped = (before - self.chunks.len()) as u64;
        // A table much larger than what it holds gives its memory back.
        if self.chunks.capacity() > 4 * self.chunks.len().max(64) {
            self.chunks.shrink_to_fit();
        }
        let in_chunk = (size % CHUNK) as usize;
        if in_chunk != 0 {
            if let Some(chunk) = self.chunks.get_mut(&(size / CHUNK)) {
                chunk_mut(chunk)[in_chunk..].fill(0);
            }
        }
        dropped * CHUNK_CHARGE_BYTES
    }

    pub(crate) fn charged_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK_CHARGE_BYTES
    }
}

/// The part of a write of `data` at `offset` that lands in chunk `idx`:
/// (offset within the chunk, bytes).
fn chunk_part(offset: u64, data: &[u8], idx: u64) -> (usize, &[u8]) {
    let chunk_start = idx * CHUNK;
    let from = chunk_start.max(offset);
    let to = (chunk_start + CHUNK).min(offset + data.len() as u64);
    ((from - chunk_start) as usize, &data[(from - offset) as usize..(to - offset) as usize])
}

/// A new chunk holding `src` at `in_chunk`, zeros elsewhere. A chunk the
/// write covers whole is not zeroed first.
fn new_chunk(in_chunk: usize, src: &[u8]) -> Shared {
    if src.len() == CHUNK_BYTES {
        return Shared::from(src);
    }
    let mut b = vec![0u8; CHUNK_BYTES];
    b[in_chunk..in_chunk + src.len()].copy_from_slice(src);
    Shared::from(b)
}

/// A chunk to write into: copied first if a reply in flight still holds it
/// (the reply keeps the bytes it was lent).
fn chunk_mut(chunk: &mut Shared) -> &mut [u8] {
    if std::sync::Arc::get_mut(chunk).is_none() {
        *chunk = Shared::from(&chunk[..]);
    }
    std::sync::Arc::get_mut(chunk).expect("unique after the copy")
}

/// All zeros, lent for holes.
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
