//! Record marking for RPC over byte streams (RFC 5531 §11).
//!
//! Each fragment starts with a 4-byte big-endian word: the high bit marks the
//! last fragment of a record, the low 31 bits are the fragment's length. A
//! record is the concatenation of its fragments. Clients almost always send
//! one fragment per record; for the rare multi-fragment record we join the
//! fragments in place (moving the later fragments' bytes over the headers) so
//! the record is one contiguous slice for the zero-copy decoders.

/// Outcome of looking for the next record in a receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// A complete record occupies `buf[start..end]` (header-free, contiguous);
    /// the caller consumes through `consumed` (an offset into the buffer).
    Record { start: usize, end: usize, consumed: usize },
    /// More bytes are needed. `need` is the total buffer length (from the
    /// parse position) that would let progress happen, when known.
    Incomplete { need: usize },
    /// The record (announced or accumulated) is longer than allowed: the
    /// connection must be closed.
    TooLong { len: u64 },
}

const LAST_FRAGMENT: u32 = 0x8000_0000;

/// Parse the next record from `buf[pos..filled]`, joining fragments in place.
///
/// `record_bytes_max` bounds the record's payload (all fragments together);
/// a fragment header announcing more is rejected before any of it is read.
pub fn next_record(buf: &mut [u8], pos: usize, filled: usize, record_bytes_max: usize) -> Next {
    assert!(pos <= filled && filled <= buf.len());
    // First pass: walk the fragment headers without moving anything, so an
    // incomplete record can be parsed again from scratch when more arrives.
    let mut joined = 0usize;
    let mut cursor = pos;
    let mut fragments = 0usize;
    loop {
        if filled - cursor < 4 {
            return Next::Incomplete { need: cursor + 4 - pos };
        }
        let word = u32::from_be_bytes(buf[cursor..cursor + 4].try_into().unwrap());
        let frag_len = (word & !LAST_FRAGMENT) as usize;
        let total = joined as u64 + frag_len as u64;
        if total > record_bytes_max as u64 {
            return Next::TooLong { len: total };
        }
        let frag_start = cursor + 4;
        if filled - frag_start < frag_len {
            return Next::Incomplete { need: frag_start + frag_len - pos };
        }
        joined += frag_len;
        fragments += 1;
        cursor = frag_start + frag_len;
        if word & LAST_FRAGMENT != 0 {
            break;
        }
    }
    let start = pos + 4;
    let consumed = cursor;
    if fragments > 1 {
        // Second pass: move each later fragment down over the header before
        // it. The destination always lies below the source, and every header
        // is read before anything is written over it.
        let mut out = start + u32_len(buf, pos);
        let mut at = out;
        for _ in 1..fragments {
            let len = u32_len(buf, at);
            buf.copy_within(at + 4..at + 4 + len, out);
            out += len;
            at += 4 + len;
        }
        debug_assert_eq!(out, start + joined);
    }
    Next::Record { start, end: start + joined, consumed }
}

#[inline]
fn u32_len(buf: &[u8], at: usize) -> usize {
    (u32::from_be_bytes(buf[at..at + 4].try_into().unwrap()) & !LAST_FRAGMENT) as usize
}

/// Write a single-fragment record header for a payload of `len` bytes.
#[inline]
pub fn header(len: usize) -> [u8; 4] {
    assert!(len < LAST_FRAGMENT as usize, "record too long for one fragment");
    (LAST_FRAGMENT | len as u32).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(last: bool, data: &[u8]) -> Vec<u8> {
        let mut v = ((if last { LAST_FRAGMENT } else { 0 }) | data.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn single_fragment() {
        let mut b = frag(true, b"hello");
        b.extend_from_slice(&[0x80, 0, 0]); // start of the next record
        let n = b.len();
        match next_record(&mut b, 0, n, 100) {
            Next::Record { start, end, consumed } => {
                assert_eq!(&b[start..end], b"hello");
                assert_eq!(consumed, 9);
                assert_eq!(next_record(&mut b, consumed, n, 100), Next::Incomplete { need: 4 });
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn multi_fragment_joined_in_place() {
        let mut b = frag(false, b"abc");
        b.extend(frag(false, b"defg"));
        b.extend(frag(true, b"hi"));
        let n = b.len();
        match next_record(&mut b, 0, n, 100) {
            Next::Record { start, end, consumed } => {
                assert_eq!(&b[start..end], b"abcdefghi");
                assert_eq!(consumed, n);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn partial_and_oversize() {
        let mut b = frag(true, b"hello");
        assert_eq!(next_record(&mut b, 0, 6, 100), Next::Incomplete { need: 9 });
        assert_eq!(next_record(&mut b, 0, 2, 100), Next::Incomplete { need: 4 });
        let mut huge = 0x7fff_ffffu32.to_be_bytes().to_vec();
        let n = huge.len();
        assert_eq!(next_record(&mut huge, 0, n, 1 << 20), Next::TooLong { len: 0x7fff_ffff });
        // Fragments that add up past the limit are rejected too.
        let mut b = frag(false, &[1; 60]);
        b.extend(frag(true, &[2; 60]));
        let n = b.len();
        assert_eq!(next_record(&mut b, 0, n, 100), Next::TooLong { len: 120 });
    }
}
