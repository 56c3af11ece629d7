//! `seek`, `allocate` and `deallocate` (NFSv4.2 SEEK, ALLOCATE, DEALLOCATE)
//! against a flat model of the file: its bytes and which pages hold space.

use super::*;

const PAGE: usize = CHUNK_BYTES;

/// A file as a byte array plus one flag per page: allocated or a hole.
struct Model {
    bytes: Vec<u8>,
    allocated: Vec<bool>,
    size: usize,
}

impl Model {
    fn seek(&self, off: usize, what: Content) -> Option<(bool, u64)> {
        if off >= self.size {
            return None;
        }
        let want = what == Content::Data;
        let at = (off / PAGE..self.allocated.len()).find(|&p| self.allocated[p] == want).map_or(usize::MAX, |p| (p * PAGE).max(off));
        Some(if at >= self.size { (true, self.size as u64) } else { (false, at as u64) })
    }

    fn charge(&self) -> u64 {
        self.allocated.iter().filter(|&&a| a).count() as u64 * CHUNK_CHARGE_BYTES
    }
}

#[test]
fn seek_allocate_deallocate_match_a_flat_model() {
    // Writes, ALLOCATEs and DEALLOCATEs of every shape (inside a page,
    // page and extent aligned, across full extents, past the end), checked
    // after each against the model: contents read back, space charged to
    // the file and the backend (a punch gives whole pages back, an
    // allocation charges them), size (ALLOCATE may grow it, DEALLOCATE
    // never does) and SEEK for data and holes from random offsets.
    let fs = fs();
    let r = root(&fs);
    let fh = mkfile(&fs, &r, b"sparse");
    let span = 5 * EXTENT_BYTES / 2;
    let mut m = Model { bytes: vec![0; span], allocated: vec![false; span / PAGE], size: 0 };
    let mut seed = 0x2545_f491_u64;
    let mut next = |n: usize| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    let base_used = fs.used_bytes();
    for round in 0..500 {
        let len = match next(5) {
            0 => 1 + next(100),
            1 => PAGE,
            2 => EXTENT_BYTES,
            3 => 1 + next(2 * EXTENT_BYTES),
            _ => 1 + next(5 * PAGE),
        };
        let off = match next(3) {
            0 => next(span - len) / PAGE * PAGE,
            1 => next(span - len) / EXTENT_BYTES * EXTENT_BYTES,
            _ => next(span - len),
        };
        let end = off + len;
        match next(3) {
            0 => {
                let data: Vec<u8> = (0..len).map(|i| (i + round) as u8 | 1).collect();
                fs.write(&fh, off as u64, &data, Stability::FileSync).unwrap();
                m.bytes[off..end].copy_from_slice(&data);
                m.allocated[off / PAGE..=(end - 1) / PAGE].fill(true);
                m.size = m.size.max(end);
            }
            1 => {
                let a = fs.allocate(&fh, off as u64, len as u64).unwrap();
                m.allocated[off / PAGE..=(end - 1) / PAGE].fill(true);
                m.size = m.size.max(end);
                assert_eq!(a.size, m.size as u64, "round {round}: ALLOCATE grows the size");
            }
            _ => {
                let a = fs.deallocate(&fh, off as u64, len as u64).unwrap();
                let end = end.min(m.size);
                if off < end {
                    m.bytes[off..end].fill(0);
                    // Whole pages inside, the last page whole when the
                    // range reaches the end of file.
                    let last = if end == m.size { end.div_ceil(PAGE) } else { end / PAGE };
                    if off.div_ceil(PAGE) < last {
                        m.allocated[off.div_ceil(PAGE)..last].fill(false);
                    }
                }
                assert_eq!(a.size, m.size as u64, "round {round}: DEALLOCATE keeps the size");
            }
        }
        let all = read_all(&fs, &fh);
        assert!(all == m.bytes[..m.size], "round {round}: contents differ after op at {off}+{len}");
        assert_eq!(data_charge(&fs, &fh), m.charge(), "round {round}: pages charged");
        assert_eq!(fs.used_bytes(), base_used + m.charge(), "round {round}: backend space");
        for _ in 0..4 {
            let from = next(m.size + 2);
            for what in [Content::Data, Content::Hole] {
                assert_eq!(fs.seek(&fh, from as u64, what).unwrap(), m.seek(from, what), "round {round}: seek {what:?} from {from}");
            }
        }
    }
}

#[test]
fn allocate_is_all_or_nothing_at_quota_and_capacity() {
    // A volume of 64 pages: an ALLOCATE one page too large fails DQUOT and
    // changes nothing (size, space, contents); one that fits succeeds and
    // uses the volume's space; a punch gives it back. A backend too small
    // fails NOSPC the same way. Huge ranges (up to 2^64) fail fast with
    // the right error, zero lengths are Inval, and a directory is IsDir.
    let fs = fs_with(64 * MIB);
    let r = root(&fs);
    let v = mkdir(&fs, &r, b"vol");
    let cap = 64 * CHUNK_CHARGE_BYTES + 4096;
    fs.set_quota(&v, cap).unwrap();
    let fh = mkfile(&fs, &v, b"f");
    let before = fs.quota(&fh).unwrap().unwrap();
    let free_pages = (cap - before.used_bytes) / CHUNK_CHARGE_BYTES;
    let used_backend = fs.used_bytes();
    let too_many = (free_pages + 1) * PAGE as u64;
    assert_eq!(fs.allocate(&fh, 0, too_many), Err(VfsError::QuotaExceeded));
    assert_eq!(fs.getattr(&fh).unwrap().size, 0);
    assert_eq!(fs.quota(&fh).unwrap().unwrap().used_bytes, before.used_bytes);
    assert_eq!(fs.used_bytes(), used_backend);
    assert_eq!(fs.allocate(&fh, 0, u64::MAX), Err(VfsError::FileTooBig));
    assert_eq!(fs.allocate(&fh, 1 << 62, 1 << 62), Err(VfsError::FileTooBig));
    assert_eq!(fs.allocate(&fh, 0, FILE_SIZE_MAX_BYTES), Err(VfsError::QuotaExceeded));
    assert_eq!(fs.allocate(&fh, 0, 0), Err(VfsError::Inval));
    assert_eq!(fs.deallocate(&fh, 0, 0), Err(VfsError::Inval));
    assert_eq!(fs.allocate(&v, 0, 1), Err(VfsError::IsDir));
    assert_eq!(fs.seek(&v, 0, Content::Data), Err(VfsError::IsDir));
    let fits = free_pages * PAGE as u64;
    let a = fs.allocate(&fh, 0, fits).unwrap();
    assert_eq!(a.size, fits);
    assert_eq!(fs.quota(&fh).unwrap().unwrap().used_bytes, before.used_bytes + free_pages * CHUNK_CHARGE_BYTES);
    assert_eq!(fs.seek(&fh, 0, Content::Data).unwrap(), Some((false, 0)), "allocated space is data");
    assert_eq!(fs.seek(&fh, 0, Content::Hole).unwrap(), Some((true, fits)), "only the virtual hole at the end");
    // Now full: one more page anywhere fails; a punch of 8 pages makes room
    // for exactly 8.
    assert_eq!(fs.allocate(&fh, fits, 1), Err(VfsError::QuotaExceeded));
    fs.deallocate(&fh, 8 * PAGE as u64, 8 * PAGE as u64).unwrap();
    assert_eq!(fs.seek(&fh, 0, Content::Hole).unwrap(), Some((false, 8 * PAGE as u64)));
    assert_eq!(fs.seek(&fh, 8 * PAGE as u64, Content::Data).unwrap(), Some((false, 16 * PAGE as u64)));
    fs.allocate(&fh, fits, 8 * PAGE as u64).unwrap();
    assert_eq!(fs.allocate(&fh, 0, fits + 9 * PAGE as u64), Err(VfsError::QuotaExceeded), "the hole refills at most");
    // A punch past the end does nothing; a huge one clamps to the size.
    fs.deallocate(&fh, 1 << 40, u64::MAX).unwrap();
    assert_eq!(fs.getattr(&fh).unwrap().size, fits + 8 * PAGE as u64);
    fs.deallocate(&fh, 0, u64::MAX).unwrap();
    assert_eq!(fs.quota(&fh).unwrap().unwrap().used_bytes, before.used_bytes, "everything given back");
    assert_eq!(fs.seek(&fh, 0, Content::Data).unwrap(), Some((true, fits + 8 * PAGE as u64)), "all holes now");
    assert_eq!(fs.seek(&fh, fits + 8 * PAGE as u64, Content::Hole).unwrap(), None, "at the end");

    // The backend itself short: NoSpace, nothing changed.
    let small = fs_with(INODE_CHARGE_BYTES * 4 + 16 * CHUNK_CHARGE_BYTES);
    let sr = root(&small);
    let sf = mkfile(&small, &sr, b"f");
    let used = small.used_bytes();
    let free = (small.capacity_bytes() - used) / CHUNK_CHARGE_BYTES;
    assert_eq!(small.allocate(&sf, 0, (free + 1) * PAGE as u64), Err(VfsError::NoSpace));
    assert_eq!(small.used_bytes(), used);
    assert_eq!(small.getattr(&sf).unwrap().size, 0);
    small.allocate(&sf, 0, free * PAGE as u64).unwrap();
    assert_eq!(small.write(&sf, free * PAGE as u64, b"x", Stability::FileSync).map(|w| w.0), Err(VfsError::NoSpace));
    // Writing into allocated space needs no more.
    small.write(&sf, 0, &vec![7u8; free as usize * PAGE], Stability::FileSync).unwrap();
    assert_eq!(small.used_bytes(), used + free * CHUNK_CHARGE_BYTES);
}

#[test]
fn seek_in_a_huge_sparse_file_is_bounded_by_what_it_holds() {
    // Two bytes 2^43 apart: SEEK finds the far one without walking the
    // hole page by page (this test would take minutes if it did).
    let fs = fs();
    let r = root(&fs);
    let fh = mkfile(&fs, &r, b"huge");
    let far = 1u64 << 43;
    fs.write(&fh, 0, b"a", Stability::FileSync).unwrap();
    fs.write(&fh, far, b"b", Stability::FileSync).unwrap();
    assert_eq!(fs.seek(&fh, 1, Content::Data).unwrap(), Some((false, 1)), "the rest of the first page is data");
    assert_eq!(fs.seek(&fh, 1, Content::Hole).unwrap(), Some((false, PAGE as u64)));
    assert_eq!(fs.seek(&fh, PAGE as u64, Content::Data).unwrap(), Some((false, far)));
    assert_eq!(fs.seek(&fh, far, Content::Hole).unwrap(), Some((true, far + 1)), "the virtual hole at the end");
    let t = std::time::Instant::now();
    fs.deallocate(&fh, 0, far + 1).unwrap();
    assert!(t.elapsed() < std::time::Duration::from_secs(5), "a punch over a huge sparse range visits the map, not the range");
    assert_eq!(fs.seek(&fh, 0, Content::Data).unwrap(), Some((true, far + 1)));
    assert_eq!(data_charge(&fs, &fh), 0);
}

#[test]
fn copy_range_copies_inside_the_backend_and_stops_short_at_the_end_or_when_full() {
    // 300,000 bytes copied from an offset to an offset of another file read
    // back the same; a copy past the source's end is short; a copy that
    // runs out of space returns what it copied (the error when nothing);
    // a directory is IsDir, an offset past the largest file FileTooBig.
    let fs = fs_with(2 * MIB);
    let r = root(&fs);
    let a = mkfile(&fs, &r, b"a");
    let b = mkfile(&fs, &r, b"b");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    fs.write(&a, 0, &data, Stability::FileSync).unwrap();
    assert_eq!(fs.copy_range(&a, 1000, &b, 5, 200_000).unwrap(), 200_000);
    let got = read_all(&fs, &b);
    assert_eq!(got.len(), 200_005);
    assert!(got[5..] == data[1000..201_000] && got[..5] == [0; 5]);
    assert_eq!(fs.copy_range(&a, 250_000, &b, 0, 1 << 20).unwrap(), 50_000, "short at the source's end");
    assert_eq!(fs.copy_range(&a, 400_000, &b, 0, 10).unwrap(), 0, "past the end: nothing");
    assert_eq!(fs.copy_range(&r, 0, &b, 0, 10), Err(VfsError::IsDir));
    assert_eq!(fs.copy_range(&a, 0, &r, 0, 10), Err(VfsError::IsDir));
    assert_eq!(fs.copy_range(&a, 0, &b, FILE_SIZE_MAX_BYTES, 10), Err(VfsError::FileTooBig));
    // Space runs out partway: what fitted is copied and counted.
    let c = mkfile(&fs, &r, b"c");
    let free = fs.capacity_bytes() - fs.used_bytes();
    let room = free / CHUNK_CHARGE_BYTES * CHUNK_BYTES as u64;
    let big = mkfile(&fs, &r, b"big");
    fs.write(&big, 0, &vec![9u8; room as usize / 2], Stability::FileSync).unwrap();
    let n = fs.copy_range(&big, 0, &c, 0, room).unwrap();
    assert!(n > 0 && n < room / 2 + 1, "partial copy of {n} bytes");
    assert!(read_all(&fs, &c).iter().all(|&x| x == 9));
    assert_eq!(fs.copy_range(&big, 0, &c, n, room), Err(VfsError::NoSpace), "full: nothing copied is the error");
}

#[test]
fn clone_range_shares_buffers_copy_on_write_and_accounts_space() {
    // A clone of a whole file (full extents, pages, a hole, a short tail)
    // reads back the source and shares its buffers (no copy: the source's
    // extent is referenced twice); writing either file afterwards leaves
    // the other unchanged. A clone to an unaligned offset is Inval, as is a
    // source range past its end or a short tail into the middle of the
    // destination; a clone over existing data replaces it and the charge
    // follows the pages held; one that does not fit the volume changes
    // nothing (DQUOT).
    let fs = fs();
    let r = root(&fs);
    let a = mkfile(&fs, &r, b"a");
    let b = mkfile(&fs, &r, b"b");
    let mut data = vec![0u8; 3 * EXTENT_BYTES + 5000];
    for (i, x) in data.iter_mut().enumerate() {
        *x = (i % 251) as u8 | 1;
    }
    data[EXTENT_BYTES..EXTENT_BYTES + 2 * PAGE].fill(0);
    fs.write(&a, 0, &data[..EXTENT_BYTES], Stability::FileSync).unwrap();
    fs.write(&a, (EXTENT_BYTES + 2 * PAGE) as u64, &data[EXTENT_BYTES + 2 * PAGE..], Stability::FileSync).unwrap();
    let size = data.len() as u64;
    let used = fs.used_bytes();
    fs.clone_range(&a, 0, &b, 0, size).unwrap();
    assert!(read_all(&fs, &b) == data, "the clone reads as the source");
    assert_eq!(fs.used_bytes() - used, data_charge(&fs, &a), "charged as the source's pages");
    let shared = {
        let (ia, ib) = (fs.get(&a).unwrap(), fs.get(&b).unwrap());
        let (sa, sb) = (ia.read(), ib.read());
        let (Body::File(fa), Body::File(fb)) = (&sa.body, &sb.body) else { panic!() };
        let (pa, pb) = (fa.pieces(0, EXTENT_BYTES as u64), fb.pieces(0, EXTENT_BYTES as u64));
        match (&pa[0].1, &pb[0].1) {
            (node::Piece::Extent(x), node::Piece::Extent(y)) => std::sync::Arc::ptr_eq(x, y),
            _ => false,
        }
    };
    assert!(shared, "the first extent is one buffer in both files");
    // Copy on write, both ways.
    fs.write(&b, 10, b"BBBB", Stability::FileSync).unwrap();
    fs.write(&a, 20, b"AAAA", Stability::FileSync).unwrap();
    let (ra, rb) = (read_all(&fs, &a), read_all(&fs, &b));
    assert_eq!(&ra[10..14], &data[10..14]);
    assert_eq!(&rb[10..14], b"BBBB");
    assert_eq!(&rb[20..24], &data[20..24]);
    // Misaligned and out-of-range clones.
    assert_eq!(fs.clone_range(&a, 1, &b, 0, PAGE as u64).map(|_| ()), Err(VfsError::Inval));
    assert_eq!(fs.clone_range(&a, 0, &b, 7, PAGE as u64).map(|_| ()), Err(VfsError::Inval));
    assert_eq!(fs.clone_range(&a, 0, &b, 0, size + PAGE as u64).map(|_| ()), Err(VfsError::Inval));
    assert_eq!(fs.clone_range(&a, 0, &b, 0, 100).map(|_| ()), Err(VfsError::Inval), "short tail not at the source's end");
    let tail = size - size % PAGE as u64;
    assert_eq!(fs.clone_range(&a, tail, &b, 0, size - tail).map(|_| ()), Err(VfsError::Inval), "short tail into the destination");
    // Over existing data, within one file: the second extent's first page
    // gets a copy of the first page.
    fs.clone_range(&a, 0, &a, 2 * EXTENT_BYTES as u64, PAGE as u64).unwrap();
    let ra2 = read_all(&fs, &a);
    assert!(ra2[2 * EXTENT_BYTES..2 * EXTENT_BYTES + PAGE] == ra[..PAGE]);
    assert!(ra2[2 * EXTENT_BYTES + PAGE..] == ra[2 * EXTENT_BYTES + PAGE..]);
    // A volume too small: nothing changes.
    let v = mkdir(&fs, &r, b"vol");
    fs.set_quota(&v, 8 * CHUNK_CHARGE_BYTES + 4096).unwrap();
    let c = mkfile(&fs, &v, b"c");
    let before = fs.used_bytes();
    assert_eq!(fs.clone_range(&a, 0, &c, 0, size).map(|_| ()), Err(VfsError::QuotaExceeded));
    assert_eq!((fs.used_bytes(), fs.getattr(&c).unwrap().size), (before, 0));
    fs.clone_range(&a, 0, &c, 0, 4 * PAGE as u64).unwrap();
    assert!(read_all(&fs, &c) == ra2[..4 * PAGE]);
}
