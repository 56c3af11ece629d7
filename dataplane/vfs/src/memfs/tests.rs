//! Unit tests of `MemFs`: every `Vfs` method, its error cases, handle
//! staleness, readdir resumption under mutation, exact space accounting for
//! the backend and volumes, and concurrent writers with data verified.

use super::*;

const ROOT: Cred<'static> = Cred::ROOT;
const MIB: u64 = 1 << 20;

fn fs_with(capacity_bytes: u64) -> MemFs {
    MemFs::new(MemFsConfig { export_id: 5, capacity_bytes })
}

fn fs() -> MemFs {
    fs_with(64 * MIB)
}

fn root(fs: &MemFs) -> FileHandle {
    fs.root(5).unwrap()
}

fn mkfile(fs: &MemFs, dir: &FileHandle, name: &[u8]) -> FileHandle {
    fs.create(dir, name, NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).unwrap().0
}

fn mkdir(fs: &MemFs, dir: &FileHandle, name: &[u8]) -> FileHandle {
    fs.create(dir, name, NodeKind::Directory, 0o755, &ROOT, CreateMode::Guarded).unwrap().0
}

fn names(fs: &MemFs, dir: &FileHandle) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let end = fs
        .readdir(dir, 0, &mut |e| {
            out.push(e.name.to_vec());
            true
        })
        .unwrap();
    assert!(end);
    out.sort();
    out
}

fn read_all(fs: &MemFs, fh: &FileHandle) -> Vec<u8> {
    let size = fs.getattr(fh).unwrap().size as usize;
    let mut buf = vec![0xAAu8; size + 10];
    let (n, eof) = fs.read(fh, 0, &mut buf).unwrap();
    assert_eq!(n, size);
    assert!(eof);
    buf.truncate(n);
    buf
}

/// What the backend charges for an empty file named `name` (object + entry).
fn file_charge(name: &[u8]) -> u64 {
    INODE_CHARGE_BYTES + DIRENT_CHARGE_BYTES + name.len() as u64
}

#[test]
fn root_and_export_checks() {
    let fs = fs();
    let r = root(&fs);
    assert_eq!(r, FileHandle { export_id: 5, ino: ROOT_INO, generation: ROOT_GENERATION });
    assert_eq!(fs.root(6), Err(VfsError::Stale));
    let a = fs.getattr(&r).unwrap();
    assert_eq!(a.ftype, FileType::Directory);
    assert_eq!(a.nlink, 2);
    assert_eq!(a.fileid, ROOT_INO);
    assert_eq!(fs.lookup_parent(&r).unwrap().0, r, "the root is its own parent");
    assert_eq!(fs.used_bytes(), INODE_CHARGE_BYTES);
    // Another export's handle is stale here; numbers never issued are forged.
    assert_eq!(fs.getattr(&FileHandle { export_id: 6, ..r }), Err(VfsError::Stale));
    assert_eq!(fs.getattr(&FileHandle { ino: 999, ..r }), Err(VfsError::BadHandle));
    assert_eq!(fs.getattr(&FileHandle { generation: u64::MAX, ..r }), Err(VfsError::BadHandle));
    // A generation of an earlier life (before a restart) is stale.
    assert_eq!(fs.getattr(&FileHandle { generation: 999, ..r }), Err(VfsError::Stale));
    assert_eq!(fs.getattr(&FileHandle { ino: 0, ..r }), Err(VfsError::BadHandle));
    assert_eq!(fs.getattr(&FileHandle { generation: 0, ..r }), Err(VfsError::BadHandle));
}

#[test]
fn create_lookup_read_write_getattr() {
    let fs = fs();
    let r = root(&fs);
    let before = fs.getattr(&r).unwrap();
    let cred = Cred { uid: 1000, gid: 100, gids: &[] };
    let (fh, a) = fs.create(&r, b"f", NodeKind::File, 0o640, &cred, CreateMode::Guarded).unwrap();
    assert_eq!((a.ftype, a.mode, a.nlink, a.uid, a.gid, a.size), (FileType::Regular, 0o640, 1, 1000, 100, 0));
    let after = fs.getattr(&r).unwrap();
    assert!(after.change > before.change && after.mtime >= before.mtime);
    let (fh2, a2) = fs.lookup(&r, b"f").unwrap();
    assert_eq!(fh2, fh);
    assert_eq!(a2, a);
    assert_eq!(fs.lookup(&r, b"nope"), Err(VfsError::NoEnt));
    assert_eq!(fs.lookup(&fh, b"x"), Err(VfsError::NotDir));
    assert_eq!(fs.lookup(&r, b".."), Err(VfsError::Inval));
    assert_eq!(fs.lookup(&r, &[b'n'; 256]), Err(VfsError::NameTooLong));

    let (n, stable, wa) = fs.write(&fh, 10, b"hello", Stability::Unstable).unwrap();
    assert_eq!((n, wa.size), (5, 15));
    assert!(stable >= Stability::Unstable);
    assert!(wa.change > a.change);
    assert_eq!(wa.used, INODE_CHARGE_BYTES + CHUNK_CHARGE_BYTES);
    let mut buf = [0xFFu8; 32];
    let (n, eof) = fs.read(&fh, 0, &mut buf).unwrap();
    assert_eq!((n, eof), (15, true));
    assert_eq!(&buf[..15], b"\0\0\0\0\0\0\0\0\0\0hello");
    let (n, eof) = fs.read(&fh, 11, &mut buf[..2]).unwrap();
    assert_eq!((n, eof), (2, false));
    assert_eq!(&buf[..2], b"el");
    assert_eq!(fs.read(&fh, 15, &mut buf).unwrap(), (0, true));
    assert_eq!(fs.read(&fh, 1 << 40, &mut buf).unwrap(), (0, true));
    assert_eq!(fs.read(&r, 0, &mut buf), Err(VfsError::IsDir));
    assert_eq!(fs.write(&r, 0, b"x", Stability::FileSync).map(|_| ()), Err(VfsError::IsDir));
    assert_eq!(fs.commit(&fh, 0, 0), Ok(()));
    assert_eq!(fs.commit(&r, 0, 0), Err(VfsError::IsDir));
    // Empty write changes nothing.
    let (n, _, a3) = fs.write(&fh, 100, b"", Stability::FileSync).unwrap();
    assert_eq!((n, a3.size, a3.change), (0, 15, wa.change));
}

#[test]
fn write_spanning_chunks_and_holes() {
    let fs = fs();
    let r = root(&fs);
    let fh = mkfile(&fs, &r, b"big");
    let data: Vec<u8> = (0..3 * CHUNK_BYTES + 100).map(|i| (i * 7 % 251) as u8).collect();
    let off = CHUNK_BYTES as u64 - 50;
    fs.write(&fh, off, &data, Stability::FileSync).unwrap();
    // The write touches chunks 0..=4 (offset 4046 .. 16434).
    let a = fs.getattr(&fh).unwrap();
    assert_eq!(a.used, INODE_CHARGE_BYTES + 5 * CHUNK_CHARGE_BYTES);
    let all = read_all(&fs, &fh);
    assert!(all[..off as usize].iter().all(|&b| b == 0));
    assert_eq!(&all[off as usize..], &data[..]);
    // A far write leaves a hole that is not charged and reads as zeros.
    fs.write(&fh, 100 * CHUNK_BYTES as u64, b"z", Stability::FileSync).unwrap();
    assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES + 6 * CHUNK_CHARGE_BYTES);
    let mut buf = vec![1u8; CHUNK_BYTES];
    fs.read(&fh, 50 * CHUNK_BYTES as u64, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    // Rewriting allocated chunks charges nothing more.
    fs.write(&fh, off, &data, Stability::FileSync).unwrap();
    assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES + 6 * CHUNK_CHARGE_BYTES);
    assert_eq!(fs.write(&fh, FILE_SIZE_MAX_BYTES, b"x", Stability::FileSync).map(|_| ()), Err(VfsError::FileTooBig));
    assert_eq!(fs.write(&fh, u64::MAX, b"xy", Stability::FileSync).map(|_| ()), Err(VfsError::FileTooBig));
}

/// What the file's data says it is charged (its page count), as opposed to
/// what the write path charged.
fn data_charge(fs: &MemFs, fh: &FileHandle) -> u64 {
    let inode = fs.get(fh).unwrap();
    let st = inode.read();
    match &st.body {
        Body::File(f) => f.charged_bytes(),
        _ => panic!("not a file"),
    }
}

#[test]
fn writes_of_every_shape_match_a_flat_model() {
    // Small, page, extent-sized and multi-extent writes, aligned and not,
    // over holes, over data and across both, with truncates to page and
    // extent boundaries and between them (which splits a full extent back
    // into pages): the file always reads as a flat byte array would, copied
    // or lent, and the charge is exactly the pages allocated (a page is
    // allocated by a write touching it and freed by a truncate below it).
    let fs = fs();
    let r = root(&fs);
    let fh = mkfile(&fs, &r, b"model");
    let span = 5 * EXTENT_BYTES / 2;
    let pages = span / CHUNK_BYTES;
    let mut model = vec![0u8; span];
    let mut allocated = vec![false; pages];
    let mut size = 0usize;
    let mut seed = 0x9e37_79b9_u64;
    let mut next = |n: usize| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    for round in 0..600 {
        if round % 97 == 96 {
            let to = match next(4) {
                0 => next(span),
                1 => next(span / CHUNK_BYTES) * CHUNK_BYTES,
                2 => next(span / EXTENT_BYTES + 1) * EXTENT_BYTES,
                _ => next(span / EXTENT_BYTES + 1) * EXTENT_BYTES + 1 + next(EXTENT_BYTES - 1),
            }
            .min(span);
            fs.setattr(&fh, &crate::SetAttr { size: Some(to as u64), ..Default::default() }, None).unwrap();
            model[to..].fill(0);
            allocated[to.div_ceil(CHUNK_BYTES)..].fill(false);
            size = to;
        }
        let len = match next(6) {
            0 => 1 + next(100),
            1 => CHUNK_BYTES,
            2 => 1 + next(3 * CHUNK_BYTES),
            3 => EXTENT_BYTES,
            4 => 1 + next(2 * EXTENT_BYTES),
            _ => 1 + next(12 * CHUNK_BYTES),
        };
        let off = match next(3) {
            0 => next(span - len) / CHUNK_BYTES * CHUNK_BYTES,
            1 => next(span - len) / EXTENT_BYTES * EXTENT_BYTES,
            _ => next(span - len),
        };
        let data: Vec<u8> = (0..len).map(|i| (i + round * 31) as u8 | 1).collect();
        fs.write(&fh, off as u64, &data, Stability::FileSync).unwrap();
        model[off..off + len].copy_from_slice(&data);
        allocated[off / CHUNK_BYTES..=(off + len - 1) / CHUNK_BYTES].fill(true);
        size = size.max(off + len);
        let all = read_all(&fs, &fh);
        assert_eq!(all.len(), size, "round {round}");
        assert!(all == model[..size], "round {round}: contents differ after a {len}-byte write at {off}");
        let from = next(size);
        let count = 1 + next(size - from + 10);
        let mut lent = Collect::default();
        let got = fs.read_lent(&fh, from as u64, count, &mut lent).unwrap().expect("memfs lends");
        assert_eq!(got.0, count.min(size - from), "round {round}: read_lent({from}, {count})");
        assert!(lent.bytes() == model[from..from + got.0], "round {round}: lent bytes of read_lent({from}, {count})");
        let charged = allocated.iter().filter(|&&a| a).count() as u64 * CHUNK_CHARGE_BYTES;
        assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES + charged, "round {round}");
        assert_eq!(data_charge(&fs, &fh), charged, "round {round}: the file's own page count");
    }
}

#[test]
fn a_full_extent_is_one_buffer_and_splits_back_on_truncate() {
    let fs = fs();
    let r = root(&fs);
    let fh = mkfile(&fs, &r, b"ext");
    let pieces = |off: u64, count: usize| {
        let mut c = Collect::default();
        fs.read_lent(&fh, off, count, &mut c).unwrap();
        c.0.iter().map(|(b, at, len)| (b.len(), *at, *len)).collect::<Vec<_>>()
    };
    // Three extents in one write: a piece each.
    let big: Vec<u8> = (0..3 * EXTENT_BYTES).map(|i| (i % 253) as u8 | 1).collect();
    fs.write(&fh, 0, &big, Stability::FileSync).unwrap();
    assert_eq!(pieces(0, 3 * EXTENT_BYTES), vec![(EXTENT_BYTES, 0, EXTENT_BYTES); 3]);
    assert_eq!(pieces(100, EXTENT_BYTES), vec![(EXTENT_BYTES, 100, EXTENT_BYTES - 100), (EXTENT_BYTES, 0, 100)]);
    // An extent written page by page, out of order, is pages until the last
    // one arrives, then one buffer; the charge is the same either way.
    let base = 4 * EXTENT_BYTES as u64;
    let page = vec![7u8; CHUNK_BYTES];
    let last = EXTENT_BYTES / CHUNK_BYTES - 1;
    for i in std::iter::once(last).chain(0..last) {
        fs.write(&fh, base + (i * CHUNK_BYTES) as u64, &page, Stability::FileSync).unwrap();
        if i + 1 != last {
            // Holes read as a zero piece per page.
            assert_eq!(pieces(base, EXTENT_BYTES).len(), last + 1, "after page {i}");
        }
    }
    assert_eq!(pieces(base, EXTENT_BYTES), vec![(EXTENT_BYTES, 0, EXTENT_BYTES)]);
    let pages = (3 + 1) * EXTENT_BYTES / CHUNK_BYTES;
    assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES + pages as u64 * CHUNK_CHARGE_BYTES);
    // A truncate into a full extent's last page keeps it whole and zeros
    // the bytes beyond.
    fs.setattr(&fh, &SetAttr { size: Some(3 * EXTENT_BYTES as u64 - 100), ..SetAttr::default() }, None).unwrap();
    fs.setattr(&fh, &SetAttr { size: Some(3 * EXTENT_BYTES as u64), ..SetAttr::default() }, None).unwrap();
    assert_eq!(pieces(2 * EXTENT_BYTES as u64, EXTENT_BYTES), vec![(EXTENT_BYTES, 0, EXTENT_BYTES)]);
    let all = read_all(&fs, &fh);
    assert!(all[..3 * EXTENT_BYTES - 100] == big[..3 * EXTENT_BYTES - 100]);
    assert!(all[3 * EXTENT_BYTES - 100..].iter().all(|&b| b == 0));
    assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES + 3 * (EXTENT_BYTES / CHUNK_BYTES) as u64 * CHUNK_CHARGE_BYTES);
    // A truncate into the middle of a full extent frees the pages beyond,
    // keeps the bytes below, and zeros the rest of the last page.
    let lent_before = pieces(0, 2 * EXTENT_BYTES);
    let cut = EXTENT_BYTES + 5 * CHUNK_BYTES + 10;
    fs.setattr(&fh, &SetAttr { size: Some(cut as u64), ..SetAttr::default() }, None).unwrap();
    assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES + (EXTENT_BYTES / CHUNK_BYTES + 6) as u64 * CHUNK_CHARGE_BYTES);
    assert_eq!(pieces(EXTENT_BYTES as u64, 6 * CHUNK_BYTES).len(), 6, "a page each");
    assert_eq!(lent_before.len(), 2, "what was lent before stays whole");
    fs.setattr(&fh, &SetAttr { size: Some(2 * EXTENT_BYTES as u64), ..SetAttr::default() }, None).unwrap();
    let all = read_all(&fs, &fh);
    assert!(all[..cut] == big[..cut]);
    assert!(all[cut..].iter().all(|&b| b == 0));
    // A truncate at an extent boundary drops whole extents.
    fs.setattr(&fh, &SetAttr { size: Some(EXTENT_BYTES as u64), ..SetAttr::default() }, None).unwrap();
    assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES + (EXTENT_BYTES / CHUNK_BYTES) as u64 * CHUNK_CHARGE_BYTES);
    fs.setattr(&fh, &SetAttr { size: Some(0), ..SetAttr::default() }, None).unwrap();
    assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES);
}

/// Collects lent pieces, holding them as a reply in flight would.
#[derive(Default)]
struct Collect(Vec<(crate::Shared, usize, usize)>);

impl crate::LendSink for Collect {
    fn lend(&mut self, chunk: &crate::Shared, at: usize, len: usize) {
        self.0.push((chunk.clone(), at, len));
    }
}

impl Collect {
    fn bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|(c, at, len)| c[*at..*at + *len].iter().copied()).collect()
    }
}

#[test]
fn lent_reads_equal_copied_reads_and_survive_later_writes() {
    let fs = fs();
    let r = root(&fs);
    let free_at_start = fs.fsstat(&r).unwrap().free_bytes;
    let fh = mkfile(&fs, &r, b"lent");
    // Data, a hole of two chunks, data, unaligned ends.
    let a: Vec<u8> = (0..CHUNK_BYTES + 300).map(|i| (i % 251) as u8 | 1).collect();
    fs.write(&fh, 100, &a, Stability::FileSync).unwrap();
    fs.write(&fh, 4 * CHUNK_BYTES as u64 + 7, &a, Stability::FileSync).unwrap();
    let size = fs.getattr(&fh).unwrap().size;
    for (off, count) in [(0u64, size as usize), (99, 5000), (CHUNK_BYTES as u64, 3 * CHUNK_BYTES), (size - 10, 100), (size, 10), (size + 5, 10)] {
        let mut c = Collect::default();
        let got = fs.read_lent(&fh, off, count, &mut c).unwrap().expect("memfs lends");
        let mut buf = vec![0xeeu8; count];
        let want = fs.read(&fh, off, &mut buf).unwrap();
        assert_eq!(got, want, "read_lent({off}, {count})");
        assert_eq!(c.bytes(), &buf[..want.0], "bytes of read_lent({off}, {count})");
        assert!(c.0.iter().all(|(b, at, len)| at + len <= b.len()), "a piece crosses its buffer");
    }
    // A write, a truncate and a removal after lending leave the lent bytes
    // as they were; the file sees the new data.
    let mut held = Collect::default();
    fs.read_lent(&fh, 0, size as usize, &mut held).unwrap();
    let before = held.bytes();
    fs.write(&fh, 50, &vec![0xaau8; 2 * CHUNK_BYTES], Stability::FileSync).unwrap();
    fs.setattr(&fh, &crate::SetAttr { size: Some(10), ..Default::default() }, None).unwrap();
    assert_eq!(held.bytes(), before);
    assert_eq!(read_all(&fs, &fh), vec![0u8; 10]);
    fs.remove(&r, b"lent").unwrap();
    assert_eq!(held.bytes(), before);
    // The charge went back: lending holds no space.
    assert_eq!(fs.fsstat(&r).unwrap().free_bytes, free_at_start);
}

#[test]
fn setattr_mode_owner_times_size_and_guard() {
    let fs = fs();
    let r = root(&fs);
    let fh = mkfile(&fs, &r, b"f");
    fs.write(&fh, 0, &vec![9u8; 3 * CHUNK_BYTES], Stability::FileSync).unwrap();
    let a0 = fs.getattr(&fh).unwrap();
    let t = Time { sec: 1_000_000, nsec: 5 };
    let set = SetAttr {
        mode: Some(0o4711),
        uid: Some(7),
        gid: Some(8),
        atime: SetTime::Client(t),
        mtime: SetTime::Client(t),
        ..SetAttr::default()
    };
    let a1 = fs.setattr(&fh, &set, Some(a0.ctime)).unwrap();
    assert_eq!((a1.mode, a1.uid, a1.gid, a1.atime, a1.mtime), (0o4711, 7, 8, t, t));
    assert!(a1.ctime >= a0.ctime && a1.change > a0.change);
    // The guard no longer matches once ctime moved (or with any other value).
    let stale_guard = Time { sec: a1.ctime.sec - 1, nsec: 0 };
    assert_eq!(
        fs.setattr(&fh, &SetAttr { uid: Some(1), ..SetAttr::default() }, Some(stale_guard)),
        Err(VfsError::NotSync)
    );
    assert_eq!(fs.getattr(&fh).unwrap().uid, 7, "a failed guard changes nothing");
    assert_eq!(fs.setattr(&fh, &SetAttr { mode: Some(0o10000), ..SetAttr::default() }, None), Err(VfsError::Inval));

    // Shrink mid-chunk: whole chunks beyond are freed, the tail is zeroed.
    let used_before = fs.used_bytes();
    let a2 = fs.setattr(&fh, &SetAttr { size: Some(100), ..SetAttr::default() }, None).unwrap();
    assert_eq!(a2.size, 100);
    assert!(a2.mtime > t);
    assert_eq!(a2.used, INODE_CHARGE_BYTES + CHUNK_CHARGE_BYTES);
    assert_eq!(fs.used_bytes(), used_before - 2 * CHUNK_CHARGE_BYTES);
    // Extend: sparse, no charge; the old bytes past 100 read as zeros.
    let a3 = fs.setattr(&fh, &SetAttr { size: Some(5000), ..SetAttr::default() }, None).unwrap();
    assert_eq!((a3.size, a3.used), (5000, a2.used));
    let all = read_all(&fs, &fh);
    assert!(all[..100].iter().all(|&b| b == 9));
    assert!(all[100..].iter().all(|&b| b == 0));
    fs.setattr(&fh, &SetAttr { size: Some(0), ..SetAttr::default() }, None).unwrap();
    assert_eq!(fs.getattr(&fh).unwrap().used, INODE_CHARGE_BYTES);
    assert_eq!(fs.setattr(&r, &SetAttr { size: Some(0), ..SetAttr::default() }, None), Err(VfsError::IsDir));
    assert_eq!(
        fs.setattr(&fh, &SetAttr { size: Some(FILE_SIZE_MAX_BYTES + 1), ..SetAttr::default() }, None),
        Err(VfsError::FileTooBig)
    );
    let now = fs.setattr(&fh, &SetAttr { atime: SetTime::ServerNow, ..SetAttr::default() }, None).unwrap();
    assert!(now.atime > t);
}

#[test]
fn create_modes_and_exclusive_verifier() {
    let fs = fs();
    let r = root(&fs);
    let (fh, _) = fs.create(&r, b"f", NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).unwrap();
    assert_eq!(
        fs.create(&r, b"f", NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::Exist)
    );
    assert_eq!(fs.create(&r, b"f", NodeKind::File, 0o600, &ROOT, CreateMode::Unchecked).unwrap().0, fh);
    assert_eq!(
        fs.create(&r, b"f", NodeKind::Directory, 0o755, &ROOT, CreateMode::Unchecked).map(|x| x.0),
        Err(VfsError::Exist)
    );
    // Exclusive over a file made without a verifier: plain Exist.
    assert_eq!(
        fs.create(&r, b"f", NodeKind::File, 0o644, &ROOT, CreateMode::Exclusive([1; 8])).map(|x| x.0),
        Err(VfsError::Exist)
    );
    let used = fs.used_bytes();
    let (x, _) = fs.create(&r, b"x", NodeKind::File, 0o644, &ROOT, CreateMode::Exclusive([7; 8])).unwrap();
    assert_eq!(fs.used_bytes(), used + file_charge(b"x"));
    // A retry with the same verifier is the same file and charges nothing.
    assert_eq!(fs.create(&r, b"x", NodeKind::File, 0o644, &ROOT, CreateMode::Exclusive([7; 8])).unwrap().0, x);
    assert_eq!(fs.used_bytes(), used + file_charge(b"x"));
    // ... even after the client set attributes following the create.
    fs.setattr(&x, &SetAttr { mode: Some(0o600), ..SetAttr::default() }, None).unwrap();
    assert_eq!(fs.create(&r, b"x", NodeKind::File, 0o644, &ROOT, CreateMode::Exclusive([7; 8])).unwrap().0, x);
    assert_eq!(
        fs.create(&r, b"x", NodeKind::File, 0o644, &ROOT, CreateMode::Exclusive([8; 8])).map(|x| x.0),
        Err(VfsError::ExistVerifierMismatch)
    );
    // Invalid names and modes are refused before anything happens.
    for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
        assert_eq!(
            fs.create(&r, bad, NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).map(|x| x.0),
            Err(VfsError::Inval)
        );
    }
    assert_eq!(
        fs.create(&r, &[b'a'; 256], NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::NameTooLong)
    );
    assert_eq!(
        fs.create(&r, b"m", NodeKind::File, 0o170000, &ROOT, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::Inval)
    );
    assert_eq!(
        fs.create(&fh, b"m", NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::NotDir)
    );
    assert_eq!(names(&fs, &r), vec![b"f".to_vec(), b"x".to_vec()]);
}

#[test]
fn symlinks_devices_fifos_sockets() {
    let fs = fs();
    let r = root(&fs);
    let used = fs.used_bytes();
    let (l, la) =
        fs.create(&r, b"l", NodeKind::Symlink { target: b"../some/where" }, 0o777, &ROOT, CreateMode::Guarded).unwrap();
    assert_eq!((la.ftype, la.size), (FileType::Symlink, 13));
    assert_eq!(fs.readlink(&l).unwrap(), b"../some/where");
    assert_eq!(fs.used_bytes(), used + file_charge(b"l") + 13);
    assert_eq!(fs.readlink(&r), Err(VfsError::Inval));
    let mut buf = [0u8; 4];
    assert_eq!(fs.read(&l, 0, &mut buf), Err(VfsError::Inval));
    for bad in [&b""[..], b"a\0"] {
        assert_eq!(
            fs.create(&r, b"l2", NodeKind::Symlink { target: bad }, 0o777, &ROOT, CreateMode::Guarded).map(|x| x.0),
            Err(VfsError::Inval)
        );
    }
    let long = vec![b'a'; SYMLINK_TARGET_MAX_BYTES + 1];
    assert_eq!(
        fs.create(&r, b"l2", NodeKind::Symlink { target: &long }, 0o777, &ROOT, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::NameTooLong)
    );
    let dev = |ftype, rdev| NodeKind::Device { ftype, rdev };
    let (_, b) = fs.create(&r, b"blk", dev(FileType::BlockDevice, (8, 1)), 0o660, &ROOT, CreateMode::Guarded).unwrap();
    assert_eq!((b.ftype, b.rdev), (FileType::BlockDevice, (8, 1)));
    let (_, c) = fs.create(&r, b"chr", dev(FileType::CharDevice, (1, 3)), 0o666, &ROOT, CreateMode::Guarded).unwrap();
    assert_eq!((c.ftype, c.rdev), (FileType::CharDevice, (1, 3)));
    let (p, pa) = fs.create(&r, b"fifo", dev(FileType::Fifo, (0, 0)), 0o600, &ROOT, CreateMode::Guarded).unwrap();
    assert_eq!(pa.ftype, FileType::Fifo);
    let (_, sa) = fs.create(&r, b"sock", dev(FileType::Socket, (0, 0)), 0o600, &ROOT, CreateMode::Guarded).unwrap();
    assert_eq!(sa.ftype, FileType::Socket);
    assert_eq!(fs.write(&p, 0, b"x", Stability::FileSync).map(|_| ()), Err(VfsError::Inval));
    for bad in [FileType::Regular, FileType::Directory, FileType::Symlink] {
        assert_eq!(
            fs.create(&r, b"bad", dev(bad, (0, 0)), 0o600, &ROOT, CreateMode::Guarded).map(|x| x.0),
            Err(VfsError::Inval)
        );
    }
    fs.remove(&r, b"l").unwrap();
    fs.remove(&r, b"fifo").unwrap();
    assert_eq!(fs.readlink(&l), Err(VfsError::Stale));
}

#[test]
fn directories_nlink_parent_rmdir() {
    let fs = fs();
    let r = root(&fs);
    let a = mkdir(&fs, &r, b"a");
    let b = mkdir(&fs, &a, b"b");
    assert_eq!(fs.getattr(&r).unwrap().nlink, 3);
    assert_eq!(fs.getattr(&a).unwrap().nlink, 3);
    assert_eq!(fs.getattr(&b).unwrap().nlink, 2);
    assert_eq!(fs.lookup_parent(&b).unwrap().0, a);
    assert_eq!(fs.lookup_parent(&a).unwrap().0, r);
    let f = mkfile(&fs, &b, b"f");
    assert_eq!(fs.lookup_parent(&f), Err(VfsError::NotDir));
    assert_eq!(fs.rmdir(&a, b"b"), Err(VfsError::NotEmpty));
    assert_eq!(fs.rmdir(&b, b"f"), Err(VfsError::NotDir));
    assert_eq!(fs.remove(&a, b"b"), Err(VfsError::IsDir));
    assert_eq!(fs.rmdir(&a, b"zz"), Err(VfsError::NoEnt));
    fs.remove(&b, b"f").unwrap();
    assert_eq!(fs.remove(&b, b"f"), Err(VfsError::NoEnt));
    let before = fs.getattr(&a).unwrap();
    fs.rmdir(&a, b"b").unwrap();
    let after = fs.getattr(&a).unwrap();
    assert_eq!(after.nlink, 2);
    assert!(after.change > before.change);
    assert_eq!(fs.getattr(&b), Err(VfsError::Stale));
    assert_eq!(
        fs.create(&b, b"g", NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::Stale)
    );
    fs.rmdir(&r, b"a").unwrap();
    assert_eq!(fs.getattr(&r).unwrap().nlink, 2);
    assert_eq!(fs.used_bytes(), INODE_CHARGE_BYTES, "everything freed");
    assert_eq!(fs.inode_count(), 1);
}

#[test]
fn hard_links() {
    let fs = fs();
    let r = root(&fs);
    let d = mkdir(&fs, &r, b"d");
    let f = mkfile(&fs, &r, b"f");
    fs.write(&f, 0, b"data", Stability::FileSync).unwrap();
    let used = fs.used_bytes();
    let a = fs.link(&f, &d, b"g").unwrap();
    assert_eq!(a.nlink, 2);
    assert_eq!(fs.used_bytes(), used + DIRENT_CHARGE_BYTES + 1, "a link charges only its entry");
    assert_eq!(fs.lookup(&d, b"g").unwrap().0, f);
    assert_eq!(fs.link(&f, &d, b"g"), Err(VfsError::Exist));
    assert_eq!(fs.link(&d, &r, b"dd"), Err(VfsError::IsDir));
    assert_eq!(fs.link(&f, &f, b"x"), Err(VfsError::NotDir));
    fs.remove(&r, b"f").unwrap();
    assert_eq!(fs.getattr(&f).unwrap().nlink, 1);
    assert_eq!(read_all(&fs, &f), b"data");
    fs.remove(&d, b"g").unwrap();
    assert_eq!(fs.getattr(&f), Err(VfsError::Stale));
    assert_eq!(fs.link(&f, &d, b"h"), Err(VfsError::Stale));
}

#[test]
fn handles_stale_after_inode_reuse() {
    let fs = fs();
    let r = root(&fs);
    let old = mkfile(&fs, &r, b"a");
    fs.remove(&r, b"a").unwrap();
    let new = mkfile(&fs, &r, b"b");
    assert_eq!(new.ino, old.ino, "inode numbers are reused");
    assert_ne!(new.generation, old.generation);
    assert_eq!(fs.getattr(&old), Err(VfsError::Stale));
    let mut buf = [0u8; 1];
    assert_eq!(fs.read(&old, 0, &mut buf), Err(VfsError::Stale));
    assert_eq!(fs.write(&old, 0, b"x", Stability::FileSync).map(|_| ()), Err(VfsError::Stale));
    assert_eq!(fs.setattr(&old, &SetAttr::default(), None), Err(VfsError::Stale));
    assert!(fs.getattr(&new).is_ok());
    // Round trip through the wire form keeps it stale.
    let wire = FileHandle::from_bytes(&old.to_bytes()).unwrap();
    assert_eq!(fs.getattr(&wire), Err(VfsError::Stale));
}

#[test]
fn rename_semantics() {
    let fs = fs();
    let r = root(&fs);
    let a = mkdir(&fs, &r, b"a");
    let b = mkdir(&fs, &r, b"b");
    let f = mkfile(&fs, &a, b"f");
    // Same dir, new name.
    fs.rename(&a, b"f", &a, b"g").unwrap();
    assert_eq!(fs.lookup(&a, b"g").unwrap().0, f);
    assert_eq!(fs.lookup(&a, b"f").map(|x| x.0), Err(VfsError::NoEnt));
    // No-op rename onto itself.
    fs.rename(&a, b"g", &a, b"g").unwrap();
    // Over an existing file: the target is destroyed, its handle stale.
    let victim = mkfile(&fs, &b, b"v");
    fs.write(&victim, 0, b"old", Stability::FileSync).unwrap();
    let used = fs.used_bytes();
    fs.rename(&a, b"g", &b, b"v").unwrap();
    assert_eq!(fs.lookup(&b, b"v").unwrap().0, f);
    assert_eq!(fs.getattr(&victim), Err(VfsError::Stale));
    assert_eq!(
        fs.used_bytes(),
        used - INODE_CHARGE_BYTES - CHUNK_CHARGE_BYTES - DIRENT_CHARGE_BYTES - 1,
        "victim's object, data and the source entry freed"
    );
    // File over dir, dir over file, dir over non-empty dir.
    let d1 = mkdir(&fs, &a, b"d1");
    mkdir(&fs, &a, b"d2");
    mkfile(&fs, &fs.lookup(&a, b"d2").unwrap().0, b"x");
    assert_eq!(fs.rename(&b, b"v", &a, b"d1"), Err(VfsError::IsDir));
    assert_eq!(fs.rename(&a, b"d1", &b, b"v"), Err(VfsError::NotDir));
    assert_eq!(fs.rename(&a, b"d1", &a, b"d2"), Err(VfsError::NotEmpty));
    // Dir over empty dir, across directories: nlink follows.
    let e = mkdir(&fs, &b, b"e");
    assert_eq!(fs.getattr(&a).unwrap().nlink, 4);
    assert_eq!(fs.getattr(&b).unwrap().nlink, 3);
    fs.rename(&a, b"d1", &b, b"e").unwrap();
    assert_eq!(fs.getattr(&e), Err(VfsError::Stale));
    assert_eq!(fs.getattr(&a).unwrap().nlink, 3);
    assert_eq!(fs.getattr(&b).unwrap().nlink, 3);
    assert_eq!(fs.lookup_parent(&d1).unwrap().0, b);
    // Move a dir to a new name in another dir: nlink moves.
    fs.rename(&b, b"e", &a, b"moved").unwrap();
    assert_eq!(fs.getattr(&a).unwrap().nlink, 4);
    assert_eq!(fs.getattr(&b).unwrap().nlink, 2);
    assert_eq!(fs.lookup_parent(&d1).unwrap().0, a);
    // Not into its own subtree (nor onto itself as a directory).
    let deep = mkdir(&fs, &d1, b"deep");
    assert_eq!(fs.rename(&r, b"a", &deep, b"x"), Err(VfsError::Inval));
    assert_eq!(fs.rename(&r, b"a", &a, b"x"), Err(VfsError::Inval));
    assert_eq!(fs.rename(&a, b"moved", &d1, b"x"), Err(VfsError::Inval));
    // Onto the source's own (non-empty) parent.
    assert_eq!(fs.rename(&deep, b"nothing", &d1, b"deep"), Err(VfsError::NoEnt));
    mkdir(&fs, &deep, b"sub");
    assert_eq!(fs.rename(&deep, b"sub", &d1, b"deep"), Err(VfsError::NotEmpty));
    // Hard links to one object: nothing happens.
    fs.link(&f, &b, b"h").unwrap();
    fs.rename(&b, b"v", &b, b"h").unwrap();
    assert_eq!(fs.lookup(&b, b"v").unwrap().0, f);
    assert_eq!(fs.getattr(&f).unwrap().nlink, 2);
    // Errors on names and types.
    assert_eq!(fs.rename(&a, b"nope", &b, b"x"), Err(VfsError::NoEnt));
    assert_eq!(fs.rename(&a, b".", &b, b"x"), Err(VfsError::Inval));
    assert_eq!(fs.rename(&f, b"x", &b, b"x"), Err(VfsError::NotDir));
    assert_eq!(fs.rename(&b, b"h", &f, b"x"), Err(VfsError::NotDir));
    // Times: both directories and the moved object get a new ctime.
    let (ba, aa, fa) = (fs.getattr(&b).unwrap(), fs.getattr(&a).unwrap(), fs.getattr(&f).unwrap());
    fs.rename(&b, b"h", &a, b"h2").unwrap();
    assert!(fs.getattr(&b).unwrap().change > ba.change);
    assert!(fs.getattr(&a).unwrap().change > aa.change);
    assert!(fs.getattr(&f).unwrap().change > fa.change);
}

#[test]
fn readdir_resumes_under_mutation() {
    let fs = fs();
    let r = root(&fs);
    let d = mkdir(&fs, &r, b"d");
    for i in 0..300 {
        mkfile(&fs, &d, format!("f{i:03}").as_bytes());
    }
    // Read the listing in pages of 7 while removing entries already listed
    // and not yet listed, and adding new ones, between pages.
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let mut cookie = 0;
    let mut removed_ahead: Vec<Vec<u8>> = Vec::new();
    let mut page = 0;
    loop {
        let mut got = 0;
        let end = fs
            .readdir(&d, cookie, &mut |e| {
                if got == 7 {
                    return false;
                }
                assert!(e.cookie > cookie);
                cookie = e.cookie;
                seen.push(e.name.to_vec());
                got += 1;
                true
            })
            .unwrap();
        page += 1;
        if end {
            break;
        }
        // Mutate between pages.
        if let Some(last) = seen.last().cloned() {
            fs.remove(&d, &last).unwrap(); // already listed
        }
        let ahead = format!("f{:03}", 299 - page).into_bytes();
        if !seen.contains(&ahead) && fs.remove(&d, &ahead).is_ok() {
            removed_ahead.push(ahead);
        }
        mkfile(&fs, &d, format!("new{page}").as_bytes());
        assert_eq!(fs.cookie_verifier(&d).unwrap(), fs.cookie_verifier(&d).unwrap());
    }
    // Every original entry that was never removed ahead is seen exactly once.
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "no entry listed twice");
    for i in 0..300 {
        let n = format!("f{i:03}").into_bytes();
        assert_eq!(seen.contains(&n), !removed_ahead.contains(&n), "entry {i}");
    }
    assert!(!removed_ahead.is_empty());
    // Entries added during the listing come after the cursor, so they appear.
    assert!(seen.iter().any(|n| n.starts_with(b"new")));
    // A cookie we never issued is refused; a cookie of a removed entry resumes.
    assert_eq!(fs.readdir(&d, u64::MAX, &mut |_| true), Err(VfsError::Inval));
    // Cookies 1 and 2 (a protocol layer's "." and "..") resume at the start.
    let count = |c| {
        let mut n = 0;
        fs.readdir(&d, c, &mut |_| {
            n += 1;
            true
        })
        .unwrap();
        n
    };
    assert_eq!((count(1), count(2)), (count(0), count(0)));
    assert!(count(0) > 200);
    assert_eq!(fs.readdir(&r, 0, &mut |_| false), Ok(false));
    let f = fs.lookup(&d, b"f000").unwrap().0;
    assert_eq!(fs.readdir(&f, 0, &mut |_| true), Err(VfsError::NotDir));
    assert_eq!(fs.cookie_verifier(&f), Err(VfsError::NotDir));
    // Listing entries carry handles and attributes.
    fs.readdir(&d, 0, &mut |e| {
        assert_eq!(fs.lookup(&d, e.name).unwrap(), (e.fh, e.attr));
        true
    })
    .unwrap();
    // A directory that is removed and recreated has a new cookie verifier.
    let e1 = mkdir(&fs, &r, b"e");
    let v1 = fs.cookie_verifier(&e1).unwrap();
    fs.rmdir(&r, b"e").unwrap();
    let e2 = mkdir(&fs, &r, b"e");
    assert_ne!(fs.cookie_verifier(&e2).unwrap(), v1);
    assert_eq!(fs.cookie_verifier(&e1), Err(VfsError::Stale));
}

#[test]
fn readdir_concurrent_with_mutation_threads() {
    // A lister pages through a directory while another thread churns
    // entries: entries that stay present are listed exactly once each time.
    let fs = Arc::new(fs());
    let r = root(&fs);
    let d = mkdir(&fs, &r, b"d");
    for i in 0..200 {
        mkfile(&fs, &d, format!("stay{i}").as_bytes());
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && i < 200_000 {
                let name = format!("tmp{}", i % 50);
                let _ = fs.create(&d, name.as_bytes(), NodeKind::File, 0o644, &ROOT, CreateMode::Guarded);
                let _ = fs.remove(&d, format!("tmp{}", (i + 25) % 50).as_bytes());
                i += 1;
            }
        })
    };
    for _ in 0..50 {
        let mut stay = Vec::new();
        let mut cookie = 0;
        loop {
            let mut n = 0;
            let end = fs
                .readdir(&d, cookie, &mut |e| {
                    if n == 5 {
                        return false;
                    }
                    n += 1;
                    cookie = e.cookie;
                    if e.name.starts_with(b"stay") {
                        stay.push(e.name.to_vec());
                    }
                    true
                })
                .unwrap();
            if end {
                break;
            }
        }
        stay.sort();
        let before = stay.len();
        stay.dedup();
        assert_eq!((before, stay.len()), (200, 200));
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
}

#[test]
fn capacity_exhaustion_exact_and_reusable() {
    // Capacity for the root plus one file with exactly 3 chunks.
    let capacity = INODE_CHARGE_BYTES + file_charge(b"f") + 3 * CHUNK_CHARGE_BYTES;
    let fs = fs_with(capacity);
    let r = root(&fs);
    let f = mkfile(&fs, &r, b"f");
    let chunk = vec![1u8; CHUNK_BYTES];
    // A 4-chunk write does not fit: nothing is written, nothing charged.
    let four = vec![2u8; 4 * CHUNK_BYTES];
    assert_eq!(fs.write(&f, 0, &four, Stability::FileSync).map(|_| ()), Err(VfsError::NoSpace));
    assert_eq!(fs.getattr(&f).unwrap().size, 0);
    assert_eq!(fs.used_bytes(), capacity - 3 * CHUNK_CHARGE_BYTES);
    for i in 0..3 {
        fs.write(&f, i * CHUNK_BYTES as u64, &chunk, Stability::FileSync).unwrap();
    }
    assert_eq!(fs.used_bytes(), capacity);
    assert_eq!(fs.write(&f, 3 * CHUNK_BYTES as u64, b"x", Stability::FileSync).map(|_| ()), Err(VfsError::NoSpace));
    // Overwrite within allocated chunks still works when full.
    fs.write(&f, 10, b"over", Stability::FileSync).unwrap();
    // No room for an object either.
    assert_eq!(
        fs.create(&r, b"g", NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::NoSpace)
    );
    assert_eq!(fs.lookup(&r, b"g").map(|x| x.0), Err(VfsError::NoEnt));
    let st = fs.fsstat(&r).unwrap();
    assert_eq!((st.total_bytes, st.free_bytes, st.avail_bytes), (capacity, 0, 0));
    // Free one chunk by truncation: exactly one chunk's worth is usable again.
    fs.setattr(&f, &SetAttr { size: Some(2 * CHUNK_BYTES as u64), ..SetAttr::default() }, None).unwrap();
    assert_eq!(fs.fsstat(&r).unwrap().free_bytes, CHUNK_CHARGE_BYTES);
    fs.write(&f, 5 * CHUNK_BYTES as u64, &chunk, Stability::FileSync).unwrap();
    assert_eq!(fs.used_bytes(), capacity);
    // Remove everything: back to the root alone, and the space is reusable.
    fs.remove(&r, b"f").unwrap();
    assert_eq!(fs.used_bytes(), INODE_CHARGE_BYTES);
    let g = mkfile(&fs, &r, b"g");
    for i in 0..3 {
        fs.write(&g, i * CHUNK_BYTES as u64, &chunk, Stability::FileSync).unwrap();
    }
    assert_eq!(fs.used_bytes(), capacity);
}

#[test]
fn quota_volume_accounting_and_remove_tree() {
    let fs = fs();
    let r = root(&fs);
    let vols = mkdir(&fs, &r, b"volumes");
    let v = mkdir(&fs, &vols, b"v1");
    let outside = mkfile(&fs, &r, b"outside");
    let cap = 64 * 1024;
    assert_eq!(fs.quota(&v).unwrap(), None);
    fs.set_quota(&v, cap).unwrap();
    assert_eq!(fs.quota(&v).unwrap(), Some(QuotaUsage { capacity_bytes: cap, used_bytes: INODE_CHARGE_BYTES }));
    assert_eq!(fs.quota(&outside).unwrap(), None);
    let backend_used = fs.used_bytes();
    let f = mkfile(&fs, &v, b"f");
    let sub = mkdir(&fs, &v, b"sub");
    let g = mkfile(&fs, &sub, b"g");
    let mut expect = INODE_CHARGE_BYTES + file_charge(b"f") + file_charge(b"sub") + file_charge(b"g");
    assert_eq!(fs.quota(&g).unwrap().unwrap().used_bytes, expect);
    // Fill the volume by writes: the failing write writes nothing.
    let chunks_fit = (cap - expect) / CHUNK_CHARGE_BYTES;
    let data = vec![3u8; (chunks_fit as usize + 1) * CHUNK_BYTES];
    assert_eq!(fs.write(&f, 0, &data, Stability::FileSync).map(|_| ()), Err(VfsError::QuotaExceeded));
    assert_eq!(fs.getattr(&f).unwrap().size, 0);
    fs.write(&f, 0, &data[..chunks_fit as usize * CHUNK_BYTES], Stability::FileSync).unwrap();
    expect += chunks_fit * CHUNK_CHARGE_BYTES;
    assert_eq!(fs.quota(&f).unwrap().unwrap().used_bytes, expect);
    assert_eq!(fs.used_bytes(), backend_used + expect - INODE_CHARGE_BYTES);
    assert_eq!(fs.write(&g, 0, &data[..CHUNK_BYTES], Stability::FileSync).map(|_| ()), Err(VfsError::QuotaExceeded));
    // The volume's fsstat is the volume's; outside it, the backend's.
    let st = fs.fsstat(&g).unwrap();
    assert_eq!((st.total_bytes, st.free_bytes), (cap, cap - expect));
    assert_eq!(fs.fsstat(&outside).unwrap().total_bytes, 64 * MIB);
    // Extending past the volume's capacity is refused; a sparse extension within it is free.
    assert_eq!(
        fs.setattr(&g, &SetAttr { size: Some(cap + 1), ..SetAttr::default() }, None),
        Err(VfsError::QuotaExceeded)
    );
    fs.setattr(&g, &SetAttr { size: Some(cap), ..SetAttr::default() }, None).unwrap();
    // Writes outside the volume are unaffected by it.
    fs.write(&outside, 0, &data, Stability::FileSync).unwrap();
    // Rename and link cannot cross the volume boundary either way.
    assert_eq!(fs.rename(&v, b"f", &r, b"f"), Err(VfsError::CrossDevice));
    assert_eq!(fs.rename(&r, b"outside", &v, b"o"), Err(VfsError::CrossDevice));
    assert_eq!(fs.link(&f, &r, b"l"), Err(VfsError::CrossDevice));
    assert_eq!(fs.link(&outside, &sub, b"l"), Err(VfsError::CrossDevice));
    // ... but within it they work, and the volume root itself may be renamed
    // among its siblings.
    fs.rename(&v, b"f", &sub, b"f2").unwrap();
    expect += 1; // only the entry's name grew by one byte
    assert_eq!(fs.quota(&v).unwrap().unwrap().used_bytes, expect);
    fs.rename(&vols, b"v1", &vols, b"vol1").unwrap();
    // Quotas do not nest and start empty.
    assert_eq!(fs.set_quota(&sub, MIB), Err(VfsError::Inval));
    assert_eq!(fs.set_quota(&vols, MIB), Err(VfsError::NotEmpty));
    assert_eq!(fs.set_quota(&outside, MIB), Err(VfsError::NotDir));
    // Shrinking below use is refused; growing lets the write through.
    assert_eq!(fs.set_quota(&v, expect - 1), Err(VfsError::Inval));
    fs.set_quota(&v, expect).unwrap(); // exactly full is allowed
    fs.set_quota(&v, 4 * cap).unwrap();
    fs.write(&g, 0, &data[..CHUNK_BYTES], Stability::FileSync).unwrap();
    // remove_tree frees everything the volume held, in the backend too.
    // The volume root object is charged inside the volume; its entry outside.
    let outside_used = fs.used_bytes() - fs.quota(&v).unwrap().unwrap().used_bytes - (DIRENT_CHARGE_BYTES + 4);
    assert_eq!(fs.remove_tree(&vols, b"nope"), Err(VfsError::NoEnt));
    assert_eq!(fs.remove_tree(&r, b"outside"), Err(VfsError::NotDir));
    fs.remove_tree(&vols, b"vol1").unwrap();
    assert_eq!(fs.used_bytes(), outside_used);
    for h in [&v, &sub, &f, &g] {
        assert_eq!(fs.getattr(h), Err(VfsError::Stale));
    }
    assert_eq!(fs.getattr(&vols).unwrap().nlink, 2);
    assert_eq!(names(&fs, &vols), Vec::<Vec<u8>>::new());
}

#[test]
fn remove_tree_keeps_hard_links_outside_and_handles_depth() {
    let fs = fs();
    let r = root(&fs);
    let t = mkdir(&fs, &r, b"t");
    let f = mkfile(&fs, &t, b"f");
    fs.link(&f, &r, b"keep").unwrap();
    // A deep chain: no recursion limit in the walk.
    let mut cur = t;
    for _ in 0..10_000 {
        cur = mkdir(&fs, &cur, b"d");
    }
    mkfile(&fs, &cur, b"leaf");
    let count = fs.inode_count();
    fs.remove_tree(&r, b"t").unwrap();
    assert_eq!(fs.inode_count(), count - 10_002);
    assert_eq!(fs.getattr(&f).unwrap().nlink, 1);
    assert_eq!(fs.lookup(&r, b"keep").unwrap().0, f);
    fs.remove(&r, b"keep").unwrap();
    assert_eq!(fs.used_bytes(), INODE_CHARGE_BYTES);
}

#[test]
fn config_too_small_is_a_clear_error() {
    let err = MemFs::try_new(MemFsConfig { export_id: 1, capacity_bytes: CAPACITY_MIN_BYTES - 1 }).unwrap_err();
    assert!(err.0.contains("capacity_bytes") && err.0.contains("below the minimum"), "{err}");
    let fs = MemFs::try_new(MemFsConfig { export_id: 1, capacity_bytes: CAPACITY_MIN_BYTES }).unwrap();
    assert_eq!(fs.used_bytes(), fs.capacity_bytes(), "the root alone fills the minimum");
    assert_eq!(
        fs.create(&fs.root(1).unwrap(), b"f", NodeKind::File, 0o644, &ROOT, CreateMode::Guarded).map(|x| x.0),
        Err(VfsError::NoSpace)
    );
}

#[test]
fn write_verifier_differs_between_instances() {
    let a = fs();
    let b = fs();
    assert_eq!(a.write_verifier(), a.write_verifier());
    assert_ne!(a.write_verifier(), b.write_verifier());
}

#[test]
fn concurrent_writers_and_readers() {
    // Eight threads each write their own file in interleaved random-ish
    // order while also appending to one shared file at disjoint offsets;
    // every byte is verified afterwards and the accounting is exact.
    const THREADS: u64 = 8;
    const BLOCKS: u64 = 256;
    let fs = Arc::new(fs_with(256 * MIB));
    let r = root(&fs);
    let shared = mkfile(&fs, &r, b"shared");
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let name = format!("f{t}");
                let fh = mkfile(&fs, &r, name.as_bytes());
                let mut x = t * 7919 + 1;
                for i in 0..BLOCKS {
                    // Visit blocks in a permuted order (odd multiplier mod power of two).
                    let b = (i * 167 + t) % BLOCKS;
                    let block = vec![(b as u8) ^ (t as u8); CHUNK_BYTES];
                    fs.write(&fh, b * CHUNK_BYTES as u64, &block, Stability::Unstable).unwrap();
                    let off = (b * THREADS + t) * 512;
                    fs.write(&shared, off, &[t as u8 + 1; 512], Stability::Unstable).unwrap();
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let mut buf = [0u8; 512];
                    fs.read(&fh, (x % (BLOCKS * CHUNK_BYTES as u64)) & !511, &mut buf).unwrap();
                }
                fh
            })
        })
        .collect();
    let files: Vec<FileHandle> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (t, fh) in files.iter().enumerate() {
        let all = read_all(&fs, fh);
        assert_eq!(all.len() as u64, BLOCKS * CHUNK_BYTES as u64);
        for (b, block) in all.chunks(CHUNK_BYTES).enumerate() {
            assert!(block.iter().all(|&x| x == (b as u8) ^ (t as u8)), "file {t} block {b}");
        }
    }
    let all = read_all(&fs, &shared);
    for (i, piece) in all.chunks(512).enumerate() {
        let t = i as u64 % THREADS;
        assert!(piece.iter().all(|&x| x == t as u8 + 1), "shared piece {i}");
    }
    let shared_chunks = (BLOCKS * THREADS * 512).div_ceil(CHUNK_BYTES as u64);
    let expect = INODE_CHARGE_BYTES
        + file_charge(b"shared")
        + shared_chunks * CHUNK_CHARGE_BYTES
        + THREADS * (file_charge(b"f0") + BLOCKS * CHUNK_CHARGE_BYTES);
    assert_eq!(fs.used_bytes(), expect);
}

#[test]
fn concurrent_namespace_and_data_ops_stay_consistent() {
    // Threads create, write, rename, link and remove in overlapping
    // directories; afterwards removing everything returns the accounting to
    // the root alone (no leaked or double-freed charge, no deadlock).
    let fs = Arc::new(fs_with(64 * MIB));
    let r = root(&fs);
    let dirs: Vec<FileHandle> = (0..3).map(|i| mkdir(&fs, &r, format!("d{i}").as_bytes())).collect();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (fs, dirs) = (fs.clone(), dirs.clone());
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let a = &dirs[(i % 3) as usize];
                    let b = &dirs[((i + t) % 3) as usize];
                    let name = format!("n{}", i % 17);
                    let _ = fs.create(a, name.as_bytes(), NodeKind::File, 0o644, &ROOT, CreateMode::Unchecked);
                    if let Ok((fh, _)) = fs.lookup(a, name.as_bytes()) {
                        let _ = fs.write(&fh, (i % 5) * 3000, &[t as u8; 3000], Stability::FileSync);
                        let _ = fs.link(&fh, b, format!("l{}", i % 13).as_bytes());
                    }
                    let _ = fs.rename(a, name.as_bytes(), b, format!("m{}", i % 11).as_bytes());
                    let _ = fs.rename(&r, b"d0", &dirs[1], b"x"); // sometimes valid, sometimes not
                    let _ = fs.rename(&dirs[1], b"x", &r, b"d0");
                    if i % 7 == 0 {
                        let _ = fs.remove(b, format!("l{}", i % 13).as_bytes());
                    }
                    let _ = fs.readdir(b, 0, &mut |_| true);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for i in 0..3 {
        let name = format!("d{i}");
        if fs.lookup(&r, name.as_bytes()).is_ok() {
            fs.remove_tree(&r, name.as_bytes()).unwrap();
        } else {
            fs.remove_tree(&dirs[1], b"x").unwrap();
        }
    }
    assert!(names(&fs, &r).is_empty());
    assert_eq!(fs.used_bytes(), INODE_CHARGE_BYTES);
    assert_eq!(fs.inode_count(), 1);
}

#[test]
fn volume_and_backend_limits_combine_without_partial_effects() {
    // A volume larger than what the backend has left: the backend's NoSpace
    // wins, the volume's reservation is rolled back, and fsstat inside the
    // volume reports the smaller of the two free figures.
    let capacity = 4 * INODE_CHARGE_BYTES + 2 * DIRENT_CHARGE_BYTES + 8 + 4 * CHUNK_CHARGE_BYTES;
    let fs = fs_with(capacity);
    let r = root(&fs);
    let v = mkdir(&fs, &r, b"v");
    fs.set_quota(&v, 64 * MIB).unwrap();
    let f = mkfile(&fs, &v, b"f");
    let vol_used = fs.quota(&v).unwrap().unwrap().used_bytes;
    assert_eq!(vol_used, INODE_CHARGE_BYTES + file_charge(b"f"));
    let backend_free = capacity - fs.used_bytes();
    let st = fs.fsstat(&f).unwrap();
    assert_eq!((st.total_bytes, st.free_bytes), (64 * MIB, backend_free));
    let too_much = vec![1u8; (backend_free / CHUNK_CHARGE_BYTES + 1) as usize * CHUNK_BYTES];
    assert_eq!(fs.write(&f, 0, &too_much, Stability::FileSync).map(|_| ()), Err(VfsError::NoSpace));
    assert_eq!(fs.quota(&v).unwrap().unwrap().used_bytes, vol_used, "volume reservation rolled back");
    assert_eq!(capacity - fs.used_bytes(), backend_free);

    // A full volume refuses creates (QuotaExceeded) and leaves no entry.
    fs.set_quota(&v, vol_used).unwrap();
    for kind in [NodeKind::File, NodeKind::Directory, NodeKind::Symlink { target: b"t" }] {
        assert_eq!(
            fs.create(&v, b"g", kind, 0o644, &ROOT, CreateMode::Guarded).map(|x| x.0),
            Err(VfsError::QuotaExceeded)
        );
    }
    assert_eq!(fs.link(&f, &v, b"g"), Err(VfsError::QuotaExceeded));
    assert_eq!(fs.rename(&v, b"f", &v, b"longer-name"), Err(VfsError::QuotaExceeded));
    assert_eq!(names(&fs, &v), vec![b"f".to_vec()]);
    assert_eq!(fs.quota(&v).unwrap().unwrap().used_bytes, vol_used);
    // Renames that need no more space work in a full volume, and a shorter
    // name frees the difference.
    fs.rename(&v, b"f", &v, b"g").unwrap();
    assert_eq!(fs.quota(&v).unwrap().unwrap().used_bytes, vol_used);
    fs.rename(&v, b"g", &v, b"f").unwrap();
    let sub_capacity = vol_used;
    fs.set_quota(&v, sub_capacity + 100).unwrap();
    fs.rename(&v, b"f", &v, b"ffff").unwrap();
    assert_eq!(fs.quota(&v).unwrap().unwrap().used_bytes, vol_used + 3);
    fs.rename(&v, b"ffff", &v, b"f").unwrap();
    assert_eq!(fs.quota(&v).unwrap().unwrap().used_bytes, vol_used);
    fs.remove(&v, b"f").unwrap();
    assert_eq!(fs.quota(&v).unwrap().unwrap().used_bytes, INODE_CHARGE_BYTES);
    assert_eq!(fs.getattr(&f), Err(VfsError::Stale));
    // A removed directory's parent cannot be looked up through its handle.
    let d = mkdir(&fs, &r, b"d");
    fs.rmdir(&r, b"d").unwrap();
    assert_eq!(fs.lookup_parent(&d).map(|x| x.0), Err(VfsError::Stale));
}

/// What a walk of the tree finds: every entry and the charges it implies.
struct Walk {
    /// (parent, name, handle, type) for every entry below the root.
    entries: Vec<(FileHandle, Vec<u8>, FileHandle, FileType)>,
    used_bytes: u64,
    volume_used_bytes: u64,
}

/// Walk everything from the root, checking link counts on the way, and
/// add up what the backend and the volume `vol` should be charged.
fn walk(fs: &MemFs, vol: Option<&FileHandle>) -> Walk {
    use std::collections::{HashMap, HashSet};
    let r = root(fs);
    let mut entries = Vec::new();
    let mut seen: HashSet<FileHandle> = HashSet::new();
    let mut links: HashMap<FileHandle, (u32, Attr)> = HashMap::new();
    let mut subdirs: HashMap<FileHandle, u32> = HashMap::new();
    let mut used_bytes = fs.getattr(&r).unwrap().used;
    let mut volume_used_bytes = 0;
    // (dir, inside the volume)
    let mut stack = vec![(r, false)];
    while let Some((d, in_vol)) = stack.pop() {
        let mut here = Vec::new();
        fs.readdir(&d, 0, &mut |e| {
            here.push((e.name.to_vec(), e.fh, e.attr));
            true
        })
        .unwrap();
        for (name, fh, attr) in here {
            let charge = DIRENT_CHARGE_BYTES + name.len() as u64;
            used_bytes += charge;
            if in_vol {
                volume_used_bytes += charge;
            }
            let child_in_vol = in_vol || Some(&fh) == vol;
            if seen.insert(fh) {
                used_bytes += attr.used;
                if child_in_vol {
                    volume_used_bytes += attr.used;
                }
            }
            links.entry(fh).or_insert((0, attr)).0 += 1;
            if attr.ftype == FileType::Directory {
                *subdirs.entry(d).or_insert(0) += 1;
                stack.push((fh, child_in_vol));
            }
            entries.push((d, name, fh, attr.ftype));
        }
    }
    for (fh, (count, attr)) in &links {
        let expect = if attr.ftype == FileType::Directory { 2 + subdirs.get(fh).copied().unwrap_or(0) } else { *count };
        assert_eq!(fs.getattr(fh).unwrap().nlink, expect, "nlink of {fh:?}");
    }
    assert_eq!(fs.getattr(&r).unwrap().nlink, 2 + subdirs.get(&r).copied().unwrap_or(0));
    assert_eq!(fs.inode_count(), 1 + seen.len() as u64, "live objects");
    Walk { entries, used_bytes, volume_used_bytes }
}

#[test]
fn random_operations_keep_accounting_and_links_exact() {
    // A seeded random mix of every namespace and data operation, against a
    // small backend and a smaller volume so NoSpace and QuotaExceeded
    // happen too. After every operation, a full walk must account for
    // exactly the bytes the backend and the volume report, and every
    // object's link count must match the entries naming it. VFS_SEED=<n>
    // explores other sequences (the limit assertion is tuned for the default).
    let fs = fs_with(160 * 1024);
    let r = root(&fs);
    let vol = mkdir(&fs, &r, b"vol");
    fs.set_quota(&vol, 48 * 1024).unwrap();
    let mut seed = std::env::var("VFS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_u64);
    let mut next = move |n: usize| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    let mut ok = [0u32; 9];
    let mut full = [0u32; 2]; // NoSpace, QuotaExceeded
    let data = vec![0x5au8; 3 * CHUNK_BYTES];
    for _ in 0..3000 {
        let w = walk(&fs, Some(&vol));
        assert_eq!(fs.used_bytes(), w.used_bytes);
        assert_eq!(fs.quota(&vol).unwrap().unwrap().used_bytes, w.volume_used_bytes);
        let dirs: Vec<FileHandle> =
            std::iter::once(r).chain(w.entries.iter().filter(|e| e.3 == FileType::Directory).map(|e| e.2)).collect();
        let dir = dirs[next(dirs.len())];
        let dir2 = dirs[next(dirs.len())];
        let name = format!("n{}", next(12)).into_bytes();
        let any = if w.entries.is_empty() { None } else { Some(&w.entries[next(w.entries.len())]) };
        let op = next(9);
        let result = match (op, any) {
            (0, _) => fs.create(&dir, &name, NodeKind::File, 0o644, &ROOT, CreateMode::Unchecked).map(|_| ()),
            (1, _) => fs.create(&dir, &name, NodeKind::Directory, 0o755, &ROOT, CreateMode::Guarded).map(|_| ()),
            (2, _) => fs
                .create(&dir, &name, NodeKind::Symlink { target: b"target" }, 0o777, &ROOT, CreateMode::Guarded)
                .map(|_| ()),
            (3, Some(e)) => {
                let len = 1 + next(data.len());
                fs.write(&e.2, (next(128) * 1000) as u64, &data[..len], Stability::FileSync).map(|_| ())
            }
            (4, Some(e)) => fs
                .setattr(&e.2, &SetAttr { size: Some((next(40) * 2000) as u64), ..SetAttr::default() }, None)
                .map(|_| ()),
            (5, Some(e)) if e.2 == vol => continue, // keep the volume under test
            (5, Some(e)) if e.3 == FileType::Directory => fs.rmdir(&e.0, &e.1),
            (5, Some(e)) => fs.remove(&e.0, &e.1),
            // The volume under test stays where it is and is not replaced.
            (6, Some(e)) if e.2 == vol || fs.lookup(&dir2, &name).map(|x| x.0) == Ok(vol) => continue,
            (6, Some(e)) => fs.rename(&e.0, &e.1, &dir2, &name),
            (7, Some(e)) => fs.link(&e.2, &dir2, &name).map(|_| ()),
            (8, Some(e)) if e.3 == FileType::Directory && e.2 != vol && next(4) == 0 => fs.remove_tree(&e.0, &e.1),
            _ => continue,
        };
        match result {
            Ok(()) => ok[op] += 1,
            Err(VfsError::NoSpace) => full[0] += 1,
            Err(VfsError::QuotaExceeded) => full[1] += 1,
            Err(_) => {}
        }
    }
    let w = walk(&fs, Some(&vol));
    assert_eq!(fs.used_bytes(), w.used_bytes);
    println!("successful operations by kind: {ok:?}, NoSpace {}, QuotaExceeded {}", full[0], full[1]);
    assert!(ok.iter().all(|&n| n > 0), "every kind of operation succeeded at least once: {ok:?}");
    assert!(full.iter().all(|&n| n > 0), "both limits were hit: {full:?}");
}

/// Proves: reads of every size and alignment return the written bytes and
/// zeros for holes, whichever path serves them (point lookups for one or two
/// chunks, one tree walk for more) — checked against a byte-for-byte model of
/// a file whose chunks alternate between data and holes.
#[test]
fn reads_match_a_model_across_holes() {
    let fs = fs();
    let r = root(&fs);
    let fh = mkfile(&fs, &r, b"holes");
    let size = 9 * CHUNK_BYTES + 123;
    let mut model = vec![0u8; size];
    // Data in chunks 0, 2, 3 (partly) and 8..; chunks 1, 4..=7 stay holes.
    for (off, len) in [(0, CHUNK_BYTES), (2 * CHUNK_BYTES + 10, CHUNK_BYTES), (8 * CHUNK_BYTES, CHUNK_BYTES + 123)] {
        let data: Vec<u8> = (0..len).map(|i| ((off + i) * 13 % 251 + 1) as u8).collect();
        fs.write(&fh, off as u64, &data, Stability::FileSync).unwrap();
        model[off..off + len].copy_from_slice(&data);
    }
    for off in [0, 1, CHUNK_BYTES - 1, CHUNK_BYTES, 2 * CHUNK_BYTES + 5, 7 * CHUNK_BYTES + 4000] {
        for len in [1, 100, CHUNK_BYTES, CHUNK_BYTES + 1, 2 * CHUNK_BYTES, 3 * CHUNK_BYTES + 7, size] {
            let len = len.min(size - off);
            let mut buf = vec![0xeeu8; len];
            let (n, _eof) = fs.read(&fh, off as u64, &mut buf).unwrap();
            assert_eq!(n, len, "read at {off} of {len}");
            assert!(buf == model[off..off + len], "bytes differ reading {len} at {off}");
        }
    }
}

#[test]
fn pinned_file_outlives_its_last_name_until_unpin() {
    let fs = fs();
    let r = root(&fs);
    let empty = fs.used_bytes();
    let f = mkfile(&fs, &r, b"f");
    fs.write(&f, 0, &[7u8; 3 * CHUNK_BYTES], Stability::FileSync).unwrap();
    let with_file = fs.used_bytes();
    // Pins are counted; a directory cannot be pinned; a removed object cannot.
    fs.pin(&f).unwrap();
    fs.pin(&f).unwrap();
    assert_eq!(fs.pin(&r), Err(VfsError::IsDir));
    fs.remove(&r, b"f").unwrap();
    // Nameless but alive: nothing lists or finds it, its handle still works.
    assert_eq!(fs.lookup(&r, b"f"), Err(VfsError::NoEnt));
    assert_eq!(names(&fs, &r), Vec::<Vec<u8>>::new());
    let a = fs.getattr(&f).unwrap();
    assert_eq!((a.nlink, a.size), (0, 3 * CHUNK_BYTES as u64));
    assert_eq!(read_all(&fs, &f), vec![7u8; 3 * CHUNK_BYTES]);
    fs.write(&f, 4 * CHUNK_BYTES as u64, b"more", Stability::FileSync).unwrap();
    fs.setattr(&f, &SetAttr { size: Some(5), ..SetAttr::default() }, None).unwrap();
    fs.write(&f, 5, b"!", Stability::FileSync).unwrap();
    assert_eq!(read_all(&fs, &f), b"\x07\x07\x07\x07\x07!");
    // It cannot get a name back.
    assert_eq!(fs.link(&f, &r, b"back"), Err(VfsError::NoEnt));
    // Its space stays charged (only the entry went) until the last unpin.
    assert_eq!(fs.used_bytes(), with_file - (DIRENT_CHARGE_BYTES + 1) - 2 * CHUNK_CHARGE_BYTES);
    assert_eq!(fs.inode_count(), 2);
    fs.unpin(&f);
    assert_eq!(fs.getattr(&f).unwrap().nlink, 0, "one pin left");
    fs.unpin(&f);
    assert_eq!(fs.getattr(&f), Err(VfsError::Stale));
    assert_eq!(fs.pin(&f), Err(VfsError::Stale));
    assert_eq!(fs.used_bytes(), empty);
    assert_eq!(fs.inode_count(), 1);
    // A pinned file that keeps its name is untouched by pin and unpin.
    let g = mkfile(&fs, &r, b"g");
    fs.pin(&g).unwrap();
    fs.unpin(&g);
    assert_eq!(fs.getattr(&g).unwrap().nlink, 1);
    // Unpinned, the last removal destroys at once (as before).
    fs.remove(&r, b"g").unwrap();
    assert_eq!(fs.getattr(&g), Err(VfsError::Stale));
    assert_eq!(fs.used_bytes(), empty);
}

#[test]
fn pinned_rename_target_hard_links_and_volume_deletion() {
    let fs = fs();
    let r = root(&fs);
    let empty = fs.used_bytes();
    // RENAME over a pinned file: the replaced one lives on under its handle.
    let old = mkfile(&fs, &r, b"target");
    fs.write(&old, 0, b"old bytes", Stability::FileSync).unwrap();
    let new = mkfile(&fs, &r, b"new");
    fs.write(&new, 0, b"new bytes", Stability::FileSync).unwrap();
    fs.pin(&old).unwrap();
    fs.rename(&r, b"new", &r, b"target").unwrap();
    assert_eq!(fs.lookup(&r, b"target").unwrap().0, new);
    assert_eq!(read_all(&fs, &old), b"old bytes");
    assert_eq!(fs.getattr(&old).unwrap().nlink, 0);
    fs.unpin(&old);
    assert_eq!(fs.getattr(&old), Err(VfsError::Stale));
    fs.remove(&r, b"target").unwrap();
    assert_eq!(fs.used_bytes(), empty);
    // With two names, removing one of a pinned file is an ordinary unlink.
    let h = mkfile(&fs, &r, b"h");
    fs.link(&h, &r, b"h2").unwrap();
    fs.pin(&h).unwrap();
    fs.remove(&r, b"h").unwrap();
    assert_eq!(fs.getattr(&h).unwrap().nlink, 1);
    fs.unpin(&h);
    assert_eq!(fs.lookup(&r, b"h2").unwrap().0, h);
    fs.remove(&r, b"h2").unwrap();
    assert_eq!(fs.used_bytes(), empty);
    // A volume deleted while one of its files is open: the volume's space
    // and the backend's are released when that file is unpinned.
    let v = mkdir(&fs, &r, b"v");
    fs.set_quota(&v, MIB).unwrap();
    let f = mkfile(&fs, &v, b"f");
    fs.write(&f, 0, &[1u8; CHUNK_BYTES], Stability::FileSync).unwrap();
    fs.pin(&f).unwrap();
    fs.remove_tree(&r, b"v").unwrap();
    assert_eq!(fs.used_bytes(), empty + INODE_CHARGE_BYTES + CHUNK_CHARGE_BYTES);
    assert_eq!(read_all(&fs, &f), vec![1u8; CHUNK_BYTES]);
    fs.unpin(&f);
    assert_eq!(fs.getattr(&f), Err(VfsError::Stale));
    assert_eq!(fs.used_bytes(), empty);
    assert_eq!(fs.inode_count(), 1);
}

#[test]
fn pin_unpin_racing_removals_never_leak_or_free_early() {
    // Threads pin, check the file is readable, and unpin, while another
    // removes and recreates the name: every pinned handle reads its own
    // bytes, and in the end everything is freed.
    let fs = Arc::new(fs());
    let r = root(&fs);
    let empty = fs.used_bytes();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let remover = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // Written before it gets the name the pinners look up.
                let f = mkfile(&fs, &r, b"tmp");
                fs.write(&f, 0, &i.to_be_bytes(), Stability::FileSync).unwrap();
                fs.rename(&r, b"tmp", &r, b"x").unwrap();
                fs.remove(&r, b"x").unwrap();
                i += 1;
            }
        })
    };
    let pinners: Vec<_> = (0..2)
        .map(|_| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut pinned = 0;
                let t0 = std::time::Instant::now();
                while pinned < 500 && t0.elapsed() < std::time::Duration::from_secs(30) {
                    let Ok((f, _)) = fs.lookup(&r, b"x") else { continue };
                    if fs.pin(&f).is_err() {
                        continue; // removed between lookup and pin
                    }
                    let before = read_all(&fs, &f);
                    std::thread::yield_now();
                    assert_eq!(read_all(&fs, &f), before, "a pinned file keeps its bytes");
                    fs.unpin(&f);
                    pinned += 1;
                }
                pinned
            })
        })
        .collect();
    let pinned: usize = pinners.into_iter().map(|t| t.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    remover.join().unwrap();
    assert_eq!(pinned, 1000, "each pinner pinned 500 live files");
    assert_eq!(fs.used_bytes(), empty);
    assert_eq!(fs.inode_count(), 1);
}

mod sparse;
mod xattr;

/// A new backend (a restart) with the same export: a handle of the old one
/// is stale, even where the new one has an object of the same inode
/// number; the root's handle still works.
#[test]
fn handles_from_before_a_restart_are_stale() {
    let old = fs();
    let f = mkfile(&old, &root(&old), b"a");
    drop(old);
    let new = fs();
    let g = mkfile(&new, &root(&new), b"b");
    assert_eq!(g.ino, f.ino, "the same inode number again");
    assert_ne!(g.generation, f.generation);
    assert_eq!(new.getattr(&f), Err(VfsError::Stale));
    assert!(new.getattr(&g).is_ok());
    assert!(new.getattr(&root(&new)).is_ok());
}
