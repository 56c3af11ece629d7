//! XDR runtime (RFC 4506) used by the generated protocol code.
//!
//! Decoding borrows: variable-length opaques and strings come back as slices of
//! the receive buffer, never copies. Encoding writes into a caller-provided
//! buffer; every type also reports its exact encoded size so callers can size
//! replies before writing them. Every length read from the wire is checked
//! against both the declared maximum and the bytes actually left, so a hostile
//! length can never make us allocate or read past the record.

use core::fmt;

/// Maximum nesting of optional/recursive data we follow while decoding.
pub const DEPTH_MAX: u32 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdrError {
    /// The record ended before the value did.
    Short { needed: usize, left: usize },
    /// A length on the wire exceeds the declared maximum.
    TooLong { len: u32, max: u32 },
    /// An enum value not in the specification.
    BadEnum { name: &'static str, value: i32 },
    /// A union discriminant with no arm and no default.
    BadUnion { name: &'static str, value: i32 },
    /// A boolean that is neither 0 nor 1.
    BadBool(u32),
    /// Recursion deeper than DEPTH_MAX.
    TooDeep,
    /// The encoder ran out of room in the caller's buffer.
    Overflow { needed: usize, left: usize },
}

impl fmt::Display for XdrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdrError::Short { needed, left } => write!(f, "xdr: need {needed} bytes, {left} left"),
            XdrError::TooLong { len, max } => write!(f, "xdr: length {len} exceeds maximum {max}"),
            XdrError::BadEnum { name, value } => write!(f, "xdr: {value} is not a valid {name}"),
            XdrError::BadUnion { name, value } => write!(f, "xdr: {value} is not a valid arm of {name}"),
            XdrError::BadBool(v) => write!(f, "xdr: {v} is not a boolean"),
            XdrError::TooDeep => write!(f, "xdr: nesting deeper than {DEPTH_MAX}"),
            XdrError::Overflow { needed, left } => {
                write!(f, "xdr: encoder needs {needed} bytes, {left} left")
            }
        }
    }
}

impl std::error::Error for XdrError {}

pub type Result<T> = core::result::Result<T, XdrError>;

/// Padding needed to bring `len` to a multiple of four.
#[inline]
pub const fn pad(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

/// Bytes a variable-length opaque/string of `len` bytes occupies on the wire.
#[inline]
pub const fn opaque_var_len(len: usize) -> usize {
    4 + len + pad(len)
}

/// A cursor over a received buffer.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    depth: u32,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0, depth: 0 }
    }

    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The bytes not yet consumed.
    #[inline]
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let left = self.remaining();
        if n > left {
            return Err(XdrError::Short { needed: n, left });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.take(n).map(|_| ())
    }

    #[inline]
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    #[inline]
    pub fn i32(&mut self) -> Result<i32> {
        Ok(self.u32()? as i32)
    }

    #[inline]
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    #[inline]
    pub fn i64(&mut self) -> Result<i64> {
        Ok(self.u64()? as i64)
    }

    #[inline]
    pub fn bool(&mut self) -> Result<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::BadBool(v)),
        }
    }

    /// Fixed-length opaque `opaque x[N]`, copied (these are small: verifiers, ids).
    #[inline]
    pub fn opaque_fixed<const N: usize>(&mut self) -> Result<[u8; N]> {
        let b = self.take(N + pad(N))?;
        let mut a = [0u8; N];
        a.copy_from_slice(&b[..N]);
        Ok(a)
    }

    /// Variable-length opaque or string, borrowed from the buffer.
    #[inline]
    pub fn opaque_var(&mut self, max: u32) -> Result<&'a [u8]> {
        let len = self.u32()?;
        if len > max {
            return Err(XdrError::TooLong { len, max });
        }
        let len = len as usize;
        let b = self.take(len + pad(len))?;
        Ok(&b[..len])
    }

    /// Count of a variable-length array. `elem_min_bytes` is the smallest
    /// encoding of one element: a count that could not fit in what is left is
    /// rejected before any allocation happens.
    #[inline]
    pub fn array_len(&mut self, max: u32, elem_min_bytes: usize) -> Result<usize> {
        let len = self.u32()?;
        if len > max {
            return Err(XdrError::TooLong { len, max });
        }
        let need = (len as usize).saturating_mul(elem_min_bytes.max(1));
        let left = self.remaining();
        if need > left {
            return Err(XdrError::Short { needed: need, left });
        }
        Ok(len as usize)
    }

    /// Enter one level of optional/recursive data.
    #[inline]
    pub fn enter(&mut self) -> Result<()> {
        if self.depth >= DEPTH_MAX {
            return Err(XdrError::TooDeep);
        }
        self.depth += 1;
        Ok(())
    }

    #[inline]
    pub fn leave(&mut self) {
        debug_assert!(self.depth > 0);
        self.depth -= 1;
    }
}

/// A cursor writing into a caller-provided buffer.
#[derive(Debug)]
pub struct Encoder<'b> {
    buf: &'b mut [u8],
    pos: usize,
}

impl<'b> Encoder<'b> {
    pub fn new(buf: &'b mut [u8]) -> Self {
        Encoder { buf, pos: 0 }
    }

    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Everything written so far.
    #[inline]
    pub fn written(&self) -> &[u8] {
        &self.buf[..self.pos]
    }

    #[inline]
    fn room(&mut self, n: usize) -> Result<&mut [u8]> {
        let left = self.remaining();
        if n > left {
            return Err(XdrError::Overflow { needed: n, left });
        }
        let s = &mut self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Reserve `n` bytes to be filled in later (e.g. a length or a status
    /// known only after the body is written); returns their offset.
    #[inline]
    pub fn reserve(&mut self, n: usize) -> Result<usize> {
        let at = self.pos;
        self.room(n)?.fill(0);
        Ok(at)
    }

    /// The unwritten rest of the buffer, for payloads written in place (READ
    /// data goes straight from the backend into the reply this way); follow
    /// with `advance`.
    #[inline]
    pub fn spare(&mut self) -> &mut [u8] {
        &mut self.buf[self.pos..]
    }

    /// What was written and the unwritten rest, at once (a payload written
    /// in place by code that also needs to read the reply so far).
    #[inline]
    pub fn split(&mut self) -> (&[u8], &mut [u8]) {
        let (w, s) = self.buf.split_at_mut(self.pos);
        (w, s)
    }

    /// Commit `n` bytes written through `spare`.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        assert!(n <= self.remaining(), "advance past the end of the buffer");
        self.pos += n;
    }

    /// Overwrite a previously reserved word.
    #[inline]
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        assert!(at + 4 <= self.pos, "patch outside written region");
        self.buf[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Roll back to an earlier position (drop a partially written item).
    #[inline]
    pub fn truncate(&mut self, at: usize) {
        assert!(at <= self.pos);
        self.pos = at;
    }

    #[inline]
    pub fn u32(&mut self, v: u32) -> Result<()> {
        self.room(4)?.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }

    #[inline]
    pub fn i32(&mut self, v: i32) -> Result<()> {
        self.u32(v as u32)
    }

    #[inline]
    pub fn u64(&mut self, v: u64) -> Result<()> {
        self.room(8)?.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }

    #[inline]
    pub fn i64(&mut self, v: i64) -> Result<()> {
        self.u64(v as u64)
    }

    #[inline]
    pub fn bool(&mut self, v: bool) -> Result<()> {
        self.u32(v as u32)
    }

    /// Raw bytes plus zero padding to four (fixed opaque).
    #[inline]
    pub fn opaque_fixed(&mut self, v: &[u8]) -> Result<()> {
        let n = v.len();
        let p = pad(n);
        let s = self.room(n + p)?;
        s[..n].copy_from_slice(v);
        s[n..].fill(0);
        Ok(())
    }

    /// Length word, bytes, zero padding (variable opaque / string).
    #[inline]
    pub fn opaque_var(&mut self, v: &[u8]) -> Result<()> {
        if v.len() > u32::MAX as usize {
            return Err(XdrError::TooLong { len: u32::MAX, max: u32::MAX });
        }
        self.u32(v.len() as u32)?;
        self.opaque_fixed(v)
    }
}

/// Implemented by every generated type (and the primitives).
pub trait Xdr<'a>: Sized {
    /// Smallest number of bytes any value of this type occupies on the wire;
    /// used to reject hostile array counts before allocating.
    const MIN_LEN: usize;
    fn decode(d: &mut Decoder<'a>) -> Result<Self>;
    fn encode(&self, e: &mut Encoder<'_>) -> Result<()>;
    fn encoded_len(&self) -> usize;
}

macro_rules! prim {
    ($t:ty, $get:ident, $n:expr) => {
        impl<'a> Xdr<'a> for $t {
            const MIN_LEN: usize = $n;
            #[inline]
            fn decode(d: &mut Decoder<'a>) -> Result<Self> {
                d.$get()
            }
            #[inline]
            fn encode(&self, e: &mut Encoder<'_>) -> Result<()> {
                e.$get(*self)
            }
            #[inline]
            fn encoded_len(&self) -> usize {
                $n
            }
        }
    };
}
prim!(u32, u32, 4);
prim!(i32, i32, 4);
prim!(u64, u64, 8);
prim!(i64, i64, 8);
prim!(bool, bool, 4);

/// Decode one value from the start of `buf` (trailing bytes are not checked:
/// callers that need a whole-buffer match compare `Decoder::remaining`).
pub fn from_bytes<'a, T: Xdr<'a>>(buf: &'a [u8]) -> Result<T> {
    let mut d = Decoder::new(buf);
    let v = T::decode(&mut d)?;
    Ok(v)
}

/// Encode a value into a fresh Vec (tests and control paths only).
pub fn to_vec<'a, T: Xdr<'a>>(v: &T) -> Result<Vec<u8>> {
    let mut out = vec![0u8; v.encoded_len()];
    let mut e = Encoder::new(&mut out);
    v.encode(&mut e)?;
    let n = e.position();
    debug_assert_eq!(n, out.len(), "encoded_len disagrees with encode");
    out.truncate(n);
    Ok(out)
}


/// Longest linked list (`entry3 *nextentry` and friends) we decode. Lists are
/// decoded with a loop, not recursion, but dropping or cloning a list still
/// recurses once per node, so the count is bounded.
pub const LIST_MAX: usize = 8192;

/// Variable-length array: count (checked against `max` and against what is
/// left, using `elem_min_bytes`) then the elements.
#[inline]
pub fn decode_vec<'a, T>(
    d: &mut Decoder<'a>,
    max: u32,
    elem_min_bytes: usize,
    mut f: impl FnMut(&mut Decoder<'a>) -> Result<T>,
) -> Result<Vec<T>> {
    let n = d.array_len(max, elem_min_bytes)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(f(d)?);
    }
    Ok(v)
}

/// Optional data (`T *x`): a boolean, then the value one nesting level down.
#[inline]
pub fn decode_opt<'a, T>(d: &mut Decoder<'a>, f: impl FnOnce(&mut Decoder<'a>) -> Result<T>) -> Result<Option<Box<T>>> {
    if !d.bool()? {
        return Ok(None);
    }
    d.enter()?;
    let v = f(d)?;
    d.leave();
    Ok(Some(Box::new(v)))
}

/// Fixed-length array of a non-byte type (`T x[N]`).
#[inline]
pub fn decode_array<'a, T, const N: usize>(
    d: &mut Decoder<'a>,
    mut f: impl FnMut(&mut Decoder<'a>) -> Result<T>,
) -> Result<[T; N]> {
    let mut v = Vec::with_capacity(N);
    for _ in 0..N {
        v.push(f(d)?);
    }
    match v.try_into() {
        Ok(a) => Ok(a),
        Err(_) => unreachable!("exactly N elements were pushed"),
    }
}

/// Count word of a variable-length array being encoded, checked against its maximum.
#[inline]
pub fn encode_count(e: &mut Encoder<'_>, len: usize, max: u32) -> Result<()> {
    if len > max as usize {
        return Err(XdrError::TooLong { len: len.min(u32::MAX as usize) as u32, max });
    }
    e.u32(len as u32)
}

/// Variable-length opaque/string being encoded, checked against its maximum.
#[inline]
pub fn encode_opaque_var(e: &mut Encoder<'_>, v: &[u8], max: u32) -> Result<()> {
    if v.len() > max as usize {
        return Err(XdrError::TooLong { len: v.len().min(u32::MAX as usize) as u32, max });
    }
    e.opaque_var(v)
}

/// Turn decoded list nodes (each with `next == None`) into the linked list
/// they came from, without recursion.
pub fn link_list<T>(mut nodes: Vec<T>, next: impl Fn(&mut T) -> &mut Option<Box<T>>) -> T {
    assert!(!nodes.is_empty(), "a list has at least its head");
    let mut tail: Option<Box<T>> = None;
    while nodes.len() > 1 {
        let mut n = nodes.pop().expect("len > 1");
        *next(&mut n) = tail;
        tail = Some(Box::new(n));
    }
    let mut head = nodes.pop().expect("len == 1");
    *next(&mut head) = tail;
    head
}

// Typedefs of variable-length data are Rust aliases (`filename3<'a>` is
// `&'a [u8]`), so these impls exist for values decoded on their own. Inside
// generated types the typedef's own maximum is checked instead; these accept
// up to 2^32 - 1 (still bounded by the bytes left).
impl<'a> Xdr<'a> for &'a [u8] {
    const MIN_LEN: usize = 4;
    fn decode(d: &mut Decoder<'a>) -> Result<Self> {
        d.opaque_var(u32::MAX)
    }
    fn encode(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.opaque_var(self)
    }
    fn encoded_len(&self) -> usize {
        opaque_var_len(self.len())
    }
}

impl<'a, const N: usize> Xdr<'a> for [u8; N] {
    const MIN_LEN: usize = N + pad(N);
    fn decode(d: &mut Decoder<'a>) -> Result<Self> {
        d.opaque_fixed::<N>()
    }
    fn encode(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.opaque_fixed(self)
    }
    fn encoded_len(&self) -> usize {
        N + pad(N)
    }
}

impl<'a, T: Xdr<'a>> Xdr<'a> for Vec<T> {
    const MIN_LEN: usize = 4;
    fn decode(d: &mut Decoder<'a>) -> Result<Self> {
        decode_vec(d, u32::MAX, T::MIN_LEN, T::decode)
    }
    fn encode(&self, e: &mut Encoder<'_>) -> Result<()> {
        encode_count(e, self.len(), u32::MAX)?;
        self.iter().try_for_each(|v| v.encode(e))
    }
    fn encoded_len(&self) -> usize {
        4 + self.iter().map(|v| v.encoded_len()).sum::<usize>()
    }
}

impl<'a, T: Xdr<'a>> Xdr<'a> for Option<Box<T>> {
    const MIN_LEN: usize = 4;
    fn decode(d: &mut Decoder<'a>) -> Result<Self> {
        decode_opt(d, T::decode)
    }
    fn encode(&self, e: &mut Encoder<'_>) -> Result<()> {
        match self {
            Some(v) => {
                e.bool(true)?;
                v.encode(e)
            }
            None => e.bool(false),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + self.as_ref().map_or(0, |v| v.encoded_len())
    }
}

/// `void`: procedures without arguments or results.
impl<'a> Xdr<'a> for () {
    const MIN_LEN: usize = 0;
    fn decode(_: &mut Decoder<'a>) -> Result<Self> {
        Ok(())
    }
    fn encode(&self, _: &mut Encoder<'_>) -> Result<()> {
        Ok(())
    }
    fn encoded_len(&self) -> usize {
        0
    }
}

/// Support for the generated `testgen` modules: a seeded generator of valid
/// encodings, bounded in size so every test is fast and deterministic.
#[cfg(any(test, feature = "testgen"))]
pub mod testgen {
    /// Nesting (optional data, arrays) beyond which generated values stop growing.
    pub const GEN_DEPTH_MAX: u32 = 4;
    /// Largest variable-length array generated.
    pub const GEN_COUNT_MAX: u32 = 3;
    /// Largest variable-length opaque/string generated.
    pub const GEN_OPAQUE_MAX: u32 = 24;

    /// splitmix64: tiny, seedable, good enough to pick shapes.
    #[derive(Debug, Clone)]
    pub struct Rng(u64);

    impl Rng {
        pub fn new(seed: u64) -> Self {
            Rng(seed)
        }
        pub fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        /// Uniform in `0..n` (`n > 0`).
        pub fn below(&mut self, n: u64) -> u64 {
            assert!(n > 0);
            self.next_u64() % n
        }
        pub fn put_u32(&mut self, out: &mut Vec<u8>, v: u32) {
            out.extend_from_slice(&v.to_be_bytes());
        }
        pub fn put_i32(&mut self, out: &mut Vec<u8>, v: i32) {
            out.extend_from_slice(&v.to_be_bytes());
        }
        /// A 32-bit word, biased towards the edges where bugs live.
        pub fn word(&mut self, out: &mut Vec<u8>) {
            let v = match self.below(4) {
                0 => 0,
                1 => u32::MAX,
                _ => self.next_u64() as u32,
            };
            self.put_u32(out, v);
        }
        pub fn hyper(&mut self, out: &mut Vec<u8>) {
            let v = match self.below(4) {
                0 => 0,
                1 => u64::MAX,
                _ => self.next_u64(),
            };
            out.extend_from_slice(&v.to_be_bytes());
        }
        pub fn boolean(&mut self, out: &mut Vec<u8>) {
            let v = self.below(2) as u32;
            self.put_u32(out, v);
        }
        fn bytes(&mut self, out: &mut Vec<u8>, n: usize) {
            for _ in 0..n {
                out.push(self.next_u64() as u8);
            }
            out.resize(out.len() + super::pad(n), 0);
        }
        pub fn opaque_fixed(&mut self, out: &mut Vec<u8>, n: usize) {
            self.bytes(out, n);
        }
        pub fn opaque_var(&mut self, out: &mut Vec<u8>, max: u32) {
            let n = self.below(max.min(GEN_OPAQUE_MAX) as u64 + 1) as u32;
            self.put_u32(out, n);
            self.bytes(out, n as usize);
        }
        /// Writes and returns an array count.
        pub fn count(&mut self, out: &mut Vec<u8>, max: u32, depth: u32) -> u32 {
            let n = if depth >= GEN_DEPTH_MAX { 0 } else { self.below(max.min(GEN_COUNT_MAX) as u64 + 1) as u32 };
            self.put_u32(out, n);
            n
        }
        /// Writes and returns an optional-data flag.
        pub fn present(&mut self, out: &mut Vec<u8>, depth: u32) -> bool {
            let p = depth < GEN_DEPTH_MAX && self.below(2) == 1;
            self.put_u32(out, p as u32);
            p
        }
    }

    /// Generator of random valid encodings of one type.
    pub type GenFn = fn(&mut Rng, u32, &mut Vec<u8>);
    /// Decodes a prefix of the buffer, re-encodes it and checks
    /// `encoded_len`, `decode(encode(v)) == v`; returns (bytes consumed,
    /// re-encoding). Panics when the generated code is inconsistent.
    pub type CheckFn = fn(&[u8]) -> super::Result<(usize, Vec<u8>)>;

    #[derive(Clone, Copy)]
    pub struct TypeCheck {
        pub name: &'static str,
        pub gen: GenFn,
        pub check: CheckFn,
    }

    /// One procedure of one program version, with its argument and result types.
    #[derive(Clone, Copy)]
    pub struct Proc {
        pub program: u32,
        pub version: u32,
        pub proc: u32,
        pub name: &'static str,
        pub gen_args: GenFn,
        pub check_args: CheckFn,
        pub gen_res: GenFn,
        pub check_res: CheckFn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_roundtrip_and_padding() {
        let mut buf = [0xffu8; 16];
        let mut e = Encoder::new(&mut buf);
        e.opaque_var(b"abcde").unwrap();
        assert_eq!(e.position(), 12);
        assert_eq!(&buf[..12], &[0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e', 0, 0, 0]);
        let mut d = Decoder::new(&buf[..12]);
        assert_eq!(d.opaque_var(8).unwrap(), b"abcde");
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn hostile_lengths_rejected() {
        let buf = [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        assert!(matches!(Decoder::new(&buf).opaque_var(1024), Err(XdrError::TooLong { .. })));
        assert!(matches!(Decoder::new(&buf).opaque_var(u32::MAX), Err(XdrError::Short { .. })));
        assert!(matches!(Decoder::new(&buf).array_len(u32::MAX, 4), Err(XdrError::Short { .. })));
        assert!(matches!(Decoder::new(&[0, 0, 0, 2]).bool(), Err(XdrError::BadBool(2))));
    }

    #[test]
    fn encoder_overflow_is_an_error() {
        let mut buf = [0u8; 6];
        let mut e = Encoder::new(&mut buf);
        e.u32(1).unwrap();
        assert!(matches!(e.u32(2), Err(XdrError::Overflow { needed: 4, left: 2 })));
    }
}
