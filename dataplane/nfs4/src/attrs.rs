//! fattr4 (RFC 8881 §5): the attribute bitmap and the hand-written encoding
//! of attribute values in bitmap order, plus decoding of the settable ones.
//!
//! attrlist4 is an opaque whose contents depend on the bitmap, so no
//! generated type can describe it: values are written straight into the reply
//! with the XDR runtime, and read back the same way for SETATTR/CREATE/OPEN.

use proto::xdr::{Decoder, Encoder, Result as XdrResult, XdrError};
use vfs::{Attr, FileHandle, FileType, FsStat, SetAttr, SetTime, Time};

// Attribute numbers (RFC 8881 §5.6, §5.7, §5.8).
pub const SUPPORTED_ATTRS: u32 = 0;
pub const TYPE: u32 = 1;
pub const FH_EXPIRE_TYPE: u32 = 2;
pub const CHANGE: u32 = 3;
pub const SIZE: u32 = 4;
pub const LINK_SUPPORT: u32 = 5;
pub const SYMLINK_SUPPORT: u32 = 6;
pub const NAMED_ATTR: u32 = 7;
pub const FSID: u32 = 8;
pub const UNIQUE_HANDLES: u32 = 9;
pub const LEASE_TIME: u32 = 10;
pub const RDATTR_ERROR: u32 = 11;
pub const ACLSUPPORT: u32 = 13;
pub const CANSETTIME: u32 = 15;
pub const CASE_INSENSITIVE: u32 = 16;
pub const CASE_PRESERVING: u32 = 17;
pub const CHOWN_RESTRICTED: u32 = 18;
pub const FILEHANDLE: u32 = 19;
pub const FILEID: u32 = 20;
pub const FILES_AVAIL: u32 = 21;
pub const FILES_FREE: u32 = 22;
pub const FILES_TOTAL: u32 = 23;
pub const HOMOGENEOUS: u32 = 26;
pub const MAXFILESIZE: u32 = 27;
pub const MAXLINK: u32 = 28;
pub const MAXNAME: u32 = 29;
pub const MAXREAD: u32 = 30;
pub const MAXWRITE: u32 = 31;
pub const MODE: u32 = 33;
pub const NO_TRUNC: u32 = 34;
pub const NUMLINKS: u32 = 35;
pub const OWNER: u32 = 36;
pub const OWNER_GROUP: u32 = 37;
pub const RAWDEV: u32 = 41;
pub const SPACE_AVAIL: u32 = 42;
pub const SPACE_FREE: u32 = 43;
pub const SPACE_TOTAL: u32 = 44;
pub const SPACE_USED: u32 = 45;
pub const TIME_ACCESS: u32 = 47;
pub const TIME_ACCESS_SET: u32 = 48;
pub const TIME_DELTA: u32 = 51;
pub const TIME_METADATA: u32 = 52;
pub const TIME_MODIFY: u32 = 53;
pub const TIME_MODIFY_SET: u32 = 54;
pub const MOUNTED_ON_FILEID: u32 = 55;
pub const FS_LAYOUT_TYPES: u32 = 62;
pub const LAYOUT_BLKSIZE: u32 = 65;
pub const SUPPATTR_EXCLCREAT: u32 = 75;
/// NFSv4.2 extended attributes (RFC 8276 §8.2): whether the object's file
/// system has them.
pub const XATTR_SUPPORT: u32 = 82;
/// NFSv4.2 (RFC 7862 §12.2.1): the alignment CLONE needs (0: none).
pub const CLONE_BLKSIZE: u32 = 77;

/// Bitmap words we understand; bits beyond are never supported.
pub const BITMAP_WORDS: usize = 3;
/// Longest bitmap4 accepted from a client (words beyond ours must be zero-or-ignored).
pub const BITMAP_WORDS_MAX: u32 = 8;

/// Longest link count we advertise.
pub const MAXLINK_VALUE: u32 = 65_000;
/// Preferred layout I/O size advertised (layout_blksize).
pub const LAYOUT_BLKSIZE_BYTES: u32 = 1024 * 1024;

/// An attribute bitmap restricted to the attributes numbered below 96.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bitmap(pub [u32; BITMAP_WORDS]);

impl Bitmap {
    pub const fn of(attrs: &[u32]) -> Bitmap {
        let mut w = [0u32; BITMAP_WORDS];
        let mut i = 0;
        while i < attrs.len() {
            w[(attrs[i] / 32) as usize] |= 1 << (attrs[i] % 32);
            i += 1;
        }
        Bitmap(w)
    }

    /// From the words of a bitmap4 as received (extra words dropped: every
    /// bit in them names an attribute we do not support).
    pub fn from_words(words: &[u32]) -> Bitmap {
        let mut w = [0u32; BITMAP_WORDS];
        for (i, v) in words.iter().take(BITMAP_WORDS).enumerate() {
            w[i] = *v;
        }
        Bitmap(w)
    }

    /// Whether `words` names any attribute outside our bitmap range.
    pub fn has_bits_beyond(words: &[u32]) -> bool {
        words.iter().skip(BITMAP_WORDS).any(|w| *w != 0)
    }

    pub fn decode(d: &mut Decoder<'_>) -> XdrResult<(Bitmap, bool)> {
        let n = d.array_len(BITMAP_WORDS_MAX, 4)?;
        let mut w = [0u32; BITMAP_WORDS];
        let mut beyond = false;
        for i in 0..n {
            let v = d.u32()?;
            match w.get_mut(i) {
                Some(word) => *word = v,
                None => beyond |= v != 0,
            }
        }
        Ok((Bitmap(w), beyond))
    }

    pub fn contains(&self, attr: u32) -> bool {
        attr < 32 * BITMAP_WORDS as u32 && self.0[(attr / 32) as usize] & (1 << (attr % 32)) != 0
    }

    pub fn insert(&mut self, attr: u32) {
        self.0[(attr / 32) as usize] |= 1 << (attr % 32);
    }

    pub fn and(&self, o: &Bitmap) -> Bitmap {
        Bitmap([self.0[0] & o.0[0], self.0[1] & o.0[1], self.0[2] & o.0[2]])
    }

    pub fn minus(&self, o: &Bitmap) -> Bitmap {
        Bitmap([self.0[0] & !o.0[0], self.0[1] & !o.0[1], self.0[2] & !o.0[2]])
    }

    pub fn is_empty(&self) -> bool {
        self.0 == [0; BITMAP_WORDS]
    }

    /// Words to send: trailing zero words trimmed.
    pub fn words(&self) -> &[u32] {
        let n = self.0.iter().rposition(|w| *w != 0).map_or(0, |i| i + 1);
        &self.0[..n]
    }

    pub fn to_vec(&self) -> Vec<u32> {
        self.words().to_vec()
    }

    pub fn encode(&self, e: &mut Encoder<'_>) -> XdrResult<()> {
        let w = self.words();
        e.u32(w.len() as u32)?;
        for v in w {
            e.u32(*v)?;
        }
        Ok(())
    }

    /// Attribute numbers set, ascending (the order values appear on the wire).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..32 * BITMAP_WORDS as u32).filter(move |a| self.contains(*a))
    }
}

/// Every attribute GETATTR answers.
pub const SUPPORTED: Bitmap = Bitmap::of(&[
    SUPPORTED_ATTRS, TYPE, FH_EXPIRE_TYPE, CHANGE, SIZE, LINK_SUPPORT, SYMLINK_SUPPORT, NAMED_ATTR,
    FSID, UNIQUE_HANDLES, LEASE_TIME, RDATTR_ERROR, ACLSUPPORT, CANSETTIME, CASE_INSENSITIVE,
    CASE_PRESERVING, CHOWN_RESTRICTED, FILEHANDLE, FILEID, FILES_AVAIL, FILES_FREE, FILES_TOTAL,
    HOMOGENEOUS, MAXFILESIZE, MAXLINK, MAXNAME, MAXREAD, MAXWRITE, MODE, NO_TRUNC, NUMLINKS, OWNER,
    OWNER_GROUP, RAWDEV, SPACE_AVAIL, SPACE_FREE, SPACE_TOTAL, SPACE_USED, TIME_ACCESS,
    TIME_ACCESS_SET, TIME_DELTA, TIME_METADATA, TIME_MODIFY, TIME_MODIFY_SET, MOUNTED_ON_FILEID,
    FS_LAYOUT_TYPES, LAYOUT_BLKSIZE, SUPPATTR_EXCLCREAT, CLONE_BLKSIZE, XATTR_SUPPORT,
]);

/// Attributes SETATTR (and create) may set.
pub const SETTABLE: Bitmap = Bitmap::of(&[SIZE, MODE, OWNER, OWNER_GROUP, TIME_ACCESS_SET, TIME_MODIFY_SET]);

/// Write-only attributes: never returned by GETATTR.
const WRITE_ONLY: Bitmap = Bitmap::of(&[TIME_ACCESS_SET, TIME_MODIFY_SET]);

/// Attributes an EXCLUSIVE4_1 create may carry (suppattr_exclcreat).
pub const EXCLCREAT: Bitmap = Bitmap::of(&[SIZE, MODE, OWNER, OWNER_GROUP]);

/// Attributes whose values come from `Vfs::fsstat`.
const FSSTAT_ATTRS: Bitmap =
    Bitmap::of(&[FILES_AVAIL, FILES_FREE, FILES_TOTAL, SPACE_AVAIL, SPACE_FREE, SPACE_TOTAL]);

/// Everything an attribute value may come from.
pub struct Source<'a> {
    pub attr: &'a Attr,
    pub fh: &'a FileHandle,
    /// Present whenever `needs_fsstat` said so.
    pub fsstat: Option<&'a FsStat>,
    pub lease_time_s: u32,
    pub read_bytes_max: u32,
    pub write_bytes_max: u32,
    /// rdattr_error value (NFS4_OK unless READDIR could not get attributes).
    pub rdattr_error: u32,
    /// fs_layout_types: the pNFS layout type served (0: none, not pNFS).
    pub layout_type: u32,
    /// layout_blksize (the stripe unit when pNFS is on).
    pub layout_blksize: u32,
    /// xattr_support: the backend keeps extended attributes for the object.
    pub xattr_support: bool,
    /// clone_blksize: the backend's CLONE alignment (0: it cannot clone).
    pub clone_blksize: u32,
}

pub fn needs_fsstat(req: &Bitmap) -> bool {
    !req.and(&FSSTAT_ATTRS).is_empty()
}

fn ftype4(t: FileType) -> u32 {
    // nfs_ftype4 (RFC 8881 §3.3.6)
    match t {
        FileType::Regular => 1,
        FileType::Directory => 2,
        FileType::BlockDevice => 3,
        FileType::CharDevice => 4,
        FileType::Symlink => 5,
        FileType::Socket => 6,
        FileType::Fifo => 7,
    }
}

fn time4(e: &mut Encoder<'_>, t: Time) -> XdrResult<()> {
    e.i64(t.sec)?;
    e.u32(t.nsec)
}

/// A u32 as a decimal string without allocating ("Only numeric owners").
fn numeric(e: &mut Encoder<'_>, v: u32) -> XdrResult<()> {
    let mut buf = [0u8; 10];
    let mut i = buf.len();
    let mut n = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    e.opaque_var(&buf[i..])
}

/// Encode a whole fattr4 answering `req`: the bitmap of what is returned
/// (requested ∩ supported, minus write-only) and the values in bit order.
pub fn encode_fattr(req: &Bitmap, src: &Source<'_>, e: &mut Encoder<'_>) -> XdrResult<()> {
    let mut ret = req.and(&SUPPORTED).minus(&WRITE_ONLY);
    if src.fsstat.is_none() {
        // The caller could not get space figures: leave them out rather than lie.
        ret = ret.minus(&FSSTAT_ATTRS);
    }
    ret.encode(e)?;
    let len_at = e.reserve(4)?;
    let start = e.position();
    for a in ret.iter() {
        encode_one(a, src, e)?;
    }
    let len = e.position() - start;
    debug_assert_eq!(len % 4, 0, "attribute values are each XDR-aligned");
    e.patch_u32(len_at, len as u32);
    Ok(())
}

fn encode_one(a: u32, s: &Source<'_>, e: &mut Encoder<'_>) -> XdrResult<()> {
    let at = s.attr;
    let fs = s.fsstat;
    let fsv = |f: fn(&FsStat) -> u64| fs.map_or(0, f);
    match a {
        SUPPORTED_ATTRS => SUPPORTED.encode(e),
        TYPE => e.u32(ftype4(at.ftype)),
        FH_EXPIRE_TYPE => e.u32(0), // FH4_PERSISTENT
        CHANGE => e.u64(at.change),
        SIZE => e.u64(at.size),
        LINK_SUPPORT | SYMLINK_SUPPORT | UNIQUE_HANDLES | CANSETTIME | CASE_PRESERVING
        | CHOWN_RESTRICTED | HOMOGENEOUS | NO_TRUNC => e.bool(true),
        NAMED_ATTR | CASE_INSENSITIVE => e.bool(false),
        FSID => {
            e.u64(at.fsid)?;
            e.u64(0)
        }
        LEASE_TIME => e.u32(s.lease_time_s),
        RDATTR_ERROR => e.u32(s.rdattr_error),
        ACLSUPPORT => e.u32(0),
        FILEHANDLE => e.opaque_var(&s.fh.to_bytes()),
        FILEID | MOUNTED_ON_FILEID => e.u64(at.fileid),
        FILES_AVAIL => e.u64(fsv(|f| f.avail_files)),
        FILES_FREE => e.u64(fsv(|f| f.free_files)),
        FILES_TOTAL => e.u64(fsv(|f| f.total_files)),
        MAXFILESIZE => e.u64(i64::MAX as u64),
        MAXLINK => e.u32(MAXLINK_VALUE),
        MAXNAME => e.u32(vfs::NAME_MAX as u32),
        MAXREAD => e.u64(s.read_bytes_max as u64),
        MAXWRITE => e.u64(s.write_bytes_max as u64),
        MODE => e.u32(at.mode & 0o7777),
        NUMLINKS => e.u32(at.nlink),
        OWNER => numeric(e, at.uid),
        OWNER_GROUP => numeric(e, at.gid),
        RAWDEV => {
            e.u32(at.rdev.0)?;
            e.u32(at.rdev.1)
        }
        SPACE_AVAIL => e.u64(fsv(|f| f.avail_bytes)),
        SPACE_FREE => e.u64(fsv(|f| f.free_bytes)),
        SPACE_TOTAL => e.u64(fsv(|f| f.total_bytes)),
        SPACE_USED => e.u64(at.used),
        TIME_ACCESS => time4(e, at.atime),
        TIME_DELTA => time4(e, Time { sec: 0, nsec: 1 }),
        TIME_METADATA => time4(e, at.ctime),
        TIME_MODIFY => time4(e, at.mtime),
        FS_LAYOUT_TYPES => {
            // An array: empty without pNFS, else the one type served.
            if s.layout_type == 0 {
                e.u32(0)
            } else {
                e.u32(1)?;
                e.u32(s.layout_type)
            }
        }
        LAYOUT_BLKSIZE => e.u32(s.layout_blksize),
        SUPPATTR_EXCLCREAT => EXCLCREAT.encode(e),
        XATTR_SUPPORT => e.bool(s.xattr_support),
        CLONE_BLKSIZE => e.u32(s.clone_blksize),
        other => unreachable!("attribute {other} is in SUPPORTED but has no encoder"),
    }
}

/// Attributes VERIFY and NVERIFY may not name (RFC 8881 §18.15.3,
/// §18.31.3): rdattr_error and the write-only ones (NFS4ERR_INVAL).
pub const NOT_COMPARABLE: Bitmap = Bitmap::of(&[RDATTR_ERROR, TIME_ACCESS_SET, TIME_MODIFY_SET]);

/// The boolean attributes (XDR bool: 0 or 1, anything else is BADXDR).
const BOOLS: Bitmap = Bitmap::of(&[
    LINK_SUPPORT, SYMLINK_SUPPORT, NAMED_ATTR, UNIQUE_HANDLES, CANSETTIME, CASE_INSENSITIVE,
    CASE_PRESERVING, CHOWN_RESTRICTED, HOMOGENEOUS, NO_TRUNC, XATTR_SUPPORT,
]);

/// Longest filehandle (NFS4_FHSIZE) and owner string accepted in a fattr4.
const FHSIZE: u32 = 128;
const OWNER_BYTES_MAX: u32 = 1024;
/// Layout types accepted in a client's fs_layout_types.
const LAYOUT_TYPES_MAX: u32 = 16;

/// VERIFY / NVERIFY (RFC 8881 §18.31, §18.15): does the client's fattr4
/// (`words` its attrmask, `vals` its attr_vals) equal the object's
/// attributes, every one it names? Unsupported attributes (bits beyond ours
/// included) are `NotSupported` (ATTRNOTSUPP), rdattr_error and write-only
/// ones `Inval`, values that do not decode per the mask (short, trailing
/// bytes, a bool neither 0 nor 1, an over-long opaque) `BadXdr`. Values are
/// compared as values, not bytes: a bitmap with trailing zero words equals
/// one without. `src.fsstat` must be present when the mask names a space
/// or file-count attribute (`needs_fsstat`).
pub fn same(words: &[u32], vals: &[u8], src: &Source<'_>) -> Result<bool, SetError> {
    if Bitmap::has_bits_beyond(words) {
        return Err(SetError::NotSupported);
    }
    let mask = Bitmap::from_words(words);
    if !mask.minus(&SUPPORTED).is_empty() {
        return Err(SetError::NotSupported);
    }
    if !mask.and(&NOT_COMPARABLE).is_empty() {
        return Err(SetError::Inval);
    }
    debug_assert!(!needs_fsstat(&mask) || src.fsstat.is_some(), "caller fetches fsstat");
    let mut theirs = Decoder::new(vals);
    let mut equal = true;
    // Ours, one value at a time: the largest is a filehandle (4 + 24 bytes).
    let mut buf = [0u8; 64];
    for a in mask.iter() {
        let mut e = Encoder::new(&mut buf);
        encode_one(a, src, &mut e).expect("one attribute value fits 64 bytes");
        let n = e.position();
        equal &= value_eq(a, &buf[..n], &mut theirs)?;
    }
    if theirs.remaining() != 0 {
        return Err(SetError::BadXdr);
    }
    Ok(equal)
}

/// Decode the client's value of attribute `a` and compare it with ours
/// (`mine`, as `encode_one` wrote it).
fn value_eq(a: u32, mine: &[u8], theirs: &mut Decoder<'_>) -> Result<bool, SetError> {
    let mut ours = Decoder::new(mine);
    Ok(match a {
        SUPPORTED_ATTRS | SUPPATTR_EXCLCREAT => {
            let (t, beyond) = Bitmap::decode(theirs)?;
            let (o, _) = Bitmap::decode(&mut ours)?;
            !beyond && t == o
        }
        _ if BOOLS.contains(a) => theirs.bool()? == ours.bool()?,
        FILEHANDLE => theirs.opaque_var(FHSIZE)? == ours.opaque_var(FHSIZE)?,
        OWNER | OWNER_GROUP => theirs.opaque_var(OWNER_BYTES_MAX)? == ours.opaque_var(OWNER_BYTES_MAX)?,
        FS_LAYOUT_TYPES => {
            let n = theirs.array_len(LAYOUT_TYPES_MAX, 4)?;
            let m = ours.u32()? as usize;
            let mut eq = n == m;
            for i in 0..n {
                let t = theirs.u32()?;
                eq &= i < m && t == ours.u32()?;
            }
            eq
        }
        // Every other value has a fixed size: ours tells it.
        _ => {
            let t = theirs.rest().get(..mine.len()).ok_or(SetError::BadXdr)?;
            theirs.skip(mine.len())?;
            t == mine
        }
    })
}

/// Why a client's fattr4 could not be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetError {
    /// An attribute we do not support (NFS4ERR_ATTRNOTSUPP).
    NotSupported,
    /// A read-only attribute, or a value out of range (NFS4ERR_INVAL).
    Inval,
    /// An owner that is not a numeric id (NFS4ERR_BADOWNER).
    BadOwner,
    /// The values do not decode per the bitmap (NFS4ERR_BADXDR).
    BadXdr,
}

impl From<XdrError> for SetError {
    fn from(_: XdrError) -> Self {
        SetError::BadXdr
    }
}

/// Parse a numeric owner string ("1000"); names are not mapped.
pub fn parse_numeric_owner(s: &[u8]) -> Result<u32, SetError> {
    if s.is_empty() || s.len() > 10 || !s.iter().all(u8::is_ascii_digit) {
        return Err(SetError::BadOwner);
    }
    let v: u64 = s.iter().fold(0u64, |acc, c| acc * 10 + (c - b'0') as u64);
    u32::try_from(v).map_err(|_| SetError::BadOwner)
}

fn settime(d: &mut Decoder<'_>) -> Result<SetTime, SetError> {
    match d.u32()? {
        0 => Ok(SetTime::ServerNow), // SET_TO_SERVER_TIME4
        1 => {
            let sec = d.i64()?;
            let nsec = d.u32()?;
            if nsec >= 1_000_000_000 {
                return Err(SetError::Inval);
            }
            Ok(SetTime::Client(Time { sec, nsec }))
        }
        _ => Err(SetError::BadXdr),
    }
}

/// Decode the settable attributes of a client's fattr4 (`words` is its
/// attrmask, `vals` its attr_vals). Returns what to set and the bitmap of
/// attributes it names (the "attrsset" of the reply).
pub fn decode_set(words: &[u32], vals: &[u8]) -> Result<(SetAttr, Bitmap), SetError> {
    if Bitmap::has_bits_beyond(words) {
        return Err(SetError::NotSupported);
    }
    let mask = Bitmap::from_words(words);
    let unsupported = mask.minus(&SUPPORTED);
    if !unsupported.is_empty() {
        return Err(SetError::NotSupported);
    }
    if !mask.minus(&SETTABLE).is_empty() {
        // Supported but read-only (RFC 8881 §18.30.4: NFS4ERR_INVAL).
        return Err(SetError::Inval);
    }
    let mut d = Decoder::new(vals);
    let mut set = SetAttr::default();
    for a in mask.iter() {
        match a {
            SIZE => set.size = Some(d.u64()?),
            MODE => {
                let m = d.u32()?;
                if m & !0o7777 != 0 {
                    return Err(SetError::Inval);
                }
                set.mode = Some(m);
            }
            OWNER => set.uid = Some(parse_numeric_owner(d.opaque_var(1024)?)?),
            OWNER_GROUP => set.gid = Some(parse_numeric_owner(d.opaque_var(1024)?)?),
            TIME_ACCESS_SET => set.atime = settime(&mut d)?,
            TIME_MODIFY_SET => set.mtime = settime(&mut d)?,
            _ => unreachable!("SETTABLE checked above"),
        }
    }
    if d.remaining() != 0 {
        return Err(SetError::BadXdr);
    }
    Ok((set, mask))
}

#[cfg(test)]
mod tests {
    //! Proves the bitmap/value layout: values appear in bit order, lengths are
    //! patched, owners are numeric strings, write-only and unsupported bits
    //! are never returned, and hostile SETATTR inputs are rejected by kind.
    use super::*;

    fn attr() -> Attr {
        Attr {
            ftype: FileType::Regular,
            mode: 0o644,
            nlink: 1,
            uid: 1000,
            gid: 50,
            size: 12345,
            used: 16384,
            rdev: (0, 0),
            fsid: 7,
            fileid: 99,
            atime: Time { sec: 1, nsec: 2 },
            mtime: Time { sec: 3, nsec: 4 },
            ctime: Time { sec: 5, nsec: 6 },
            change: 42,
        }
    }

    #[test]
    fn encodes_in_bit_order_with_numeric_owner() {
        let a = attr();
        let fh = FileHandle { export_id: 1, ino: 99, generation: 1 };
        let src = Source { attr: &a, fh: &fh, fsstat: None, lease_time_s: 90, read_bytes_max: 1 << 20, write_bytes_max: 1 << 20, rdattr_error: 0, layout_type: 0, layout_blksize: LAYOUT_BLKSIZE_BYTES, xattr_support: true, clone_blksize: 4096 };
        // size(4), owner(36), time_modify_set(54, write-only), bit 90 (unsupported), space_total (no fsstat)
        let req = Bitmap::of(&[OWNER, SIZE, TIME_MODIFY_SET, 90, SPACE_TOTAL]);
        let mut buf = [0u8; 256];
        let mut e = Encoder::new(&mut buf);
        encode_fattr(&req, &src, &mut e).unwrap();
        let n = e.position();
        let mut d = Decoder::new(&buf[..n]);
        let (got, beyond) = Bitmap::decode(&mut d).unwrap();
        assert!(!beyond);
        assert_eq!(got, Bitmap::of(&[SIZE, OWNER]));
        let vals = d.opaque_var(1024).unwrap();
        let mut v = Decoder::new(vals);
        assert_eq!(v.u64().unwrap(), 12345);
        assert_eq!(v.opaque_var(16).unwrap(), b"1000");
        assert_eq!(v.remaining(), 0);
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn every_supported_attribute_encodes() {
        let a = attr();
        let fh = FileHandle { export_id: 1, ino: 99, generation: 1 };
        let fs = FsStat { total_bytes: 1, free_bytes: 2, avail_bytes: 3, total_files: 4, free_files: 5, avail_files: 6 };
        let src = Source { attr: &a, fh: &fh, fsstat: Some(&fs), lease_time_s: 90, read_bytes_max: 1, write_bytes_max: 1, rdattr_error: 0, layout_type: 0, layout_blksize: LAYOUT_BLKSIZE_BYTES, xattr_support: true, clone_blksize: 4096 };
        let mut buf = [0u8; 1024];
        let mut e = Encoder::new(&mut buf);
        encode_fattr(&SUPPORTED, &src, &mut e).unwrap();
        let n = e.position();
        let mut d = Decoder::new(&buf[..n]);
        let (got, _) = Bitmap::decode(&mut d).unwrap();
        assert_eq!(got, SUPPORTED.minus(&WRITE_ONLY));
        assert!(got.contains(FILEHANDLE) && got.contains(SUPPATTR_EXCLCREAT) && got.contains(SPACE_AVAIL));
    }

    #[test]
    fn decode_set_accepts_and_rejects() {
        let mut buf = [0u8; 64];
        let mut e = Encoder::new(&mut buf);
        e.u64(10).unwrap(); // size
        e.u32(0o600).unwrap(); // mode
        e.opaque_var(b"1001").unwrap(); // owner
        e.u32(1).unwrap(); // time_modify_set: client time
        e.i64(100).unwrap();
        e.u32(5).unwrap();
        let n = e.position();
        let words = Bitmap::of(&[SIZE, MODE, OWNER, TIME_MODIFY_SET]).to_vec();
        let (set, mask) = decode_set(&words, &buf[..n]).unwrap();
        assert_eq!(set.size, Some(10));
        assert_eq!(set.mode, Some(0o600));
        assert_eq!(set.uid, Some(1001));
        assert_eq!(set.mtime, SetTime::Client(Time { sec: 100, nsec: 5 }));
        assert_eq!(mask.words(), &words[..]);
        // Trailing garbage, short values, read-only, unsupported, named owner.
        assert_eq!(decode_set(&words, &buf[..n - 4]), Err(SetError::BadXdr));
        let mut long = buf[..n].to_vec();
        long.extend_from_slice(&[0; 4]);
        assert_eq!(decode_set(&words, &long), Err(SetError::BadXdr));
        assert_eq!(decode_set(&Bitmap::of(&[FILEID]).to_vec(), &[0; 8]), Err(SetError::Inval));
        assert_eq!(decode_set(&Bitmap::of(&[12]).to_vec(), &[]), Err(SetError::NotSupported));
        assert_eq!(decode_set(&[0, 0, 0, 1], &[]), Err(SetError::NotSupported));
        assert_eq!(parse_numeric_owner(b"alice@example"), Err(SetError::BadOwner));
        assert_eq!(parse_numeric_owner(b"4294967296"), Err(SetError::BadOwner));
        assert_eq!(parse_numeric_owner(b"4294967295"), Ok(u32::MAX));
        assert_eq!(decode_set(&Bitmap::of(&[MODE]).to_vec(), &0o10000u32.to_be_bytes()), Err(SetError::Inval));
    }
}
