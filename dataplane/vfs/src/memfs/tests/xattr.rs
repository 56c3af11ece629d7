//! Extended attributes (NFSv4.2 GETXATTR & co., RFC 8276) in memfs: the
//! create / replace rules, bounds, listing by cookie, and their space.

use super::*;
use crate::{XattrSet, XATTR_NAME_MAX, XATTR_VALUE_BYTES_MAX};

fn list(fs: &MemFs, fh: &FileHandle, cookie: u64, max: usize) -> (Vec<Vec<u8>>, bool) {
    let mut out = Vec::new();
    let eof = fs
        .listxattrs(fh, cookie, &mut |n| {
            if out.len() == max {
                return false;
            }
            out.push(n.to_vec());
            true
        })
        .unwrap();
    (out, eof)
}

#[test]
fn xattrs_set_get_list_remove_with_rules_and_bounds() {
    // CREATE of an existing name is Exist, REPLACE of a missing one NoEnt,
    // EITHER does both; values read back; names list in order and resume
    // from a cookie; every change moves the change attribute; names and
    // values past their bounds are refused; directories and symlinks have
    // them too; a removed object's handle is Stale.
    let fs = fs();
    let r = root(&fs);
    let fh = mkfile(&fs, &r, b"x");
    assert!(fs.xattrs_supported(&fh));
    assert_eq!(fs.getxattr(&fh, b"a"), Err(VfsError::NoEnt));
    let c0 = fs.getattr(&fh).unwrap().change;
    fs.setxattr(&fh, b"b", b"two", XattrSet::Create).unwrap();
    assert_eq!(fs.setxattr(&fh, b"b", b"again", XattrSet::Create), Err(VfsError::Exist));
    assert_eq!(fs.setxattr(&fh, b"a", b"one", XattrSet::Replace), Err(VfsError::NoEnt));
    fs.setxattr(&fh, b"a", b"one", XattrSet::Either).unwrap();
    fs.setxattr(&fh, b"a", b"uno", XattrSet::Replace).unwrap();
    fs.setxattr(&fh, b"c", b"", XattrSet::Either).unwrap();
    assert!(fs.getattr(&fh).unwrap().change > c0, "the change attribute moved");
    assert_eq!(fs.getxattr(&fh, b"a").unwrap(), b"uno");
    assert_eq!(fs.getxattr(&fh, b"c").unwrap(), b"");
    assert_eq!(list(&fs, &fh, 0, 10), (vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()], true));
    assert_eq!(list(&fs, &fh, 0, 2), (vec![b"a".to_vec(), b"b".to_vec()], false));
    assert_eq!(list(&fs, &fh, 2, 10), (vec![b"c".to_vec()], true));
    assert_eq!(list(&fs, &fh, u64::MAX, 10), (vec![], true));
    fs.removexattr(&fh, b"b").unwrap();
    assert_eq!(fs.removexattr(&fh, b"b"), Err(VfsError::NoEnt));
    assert_eq!(fs.getxattr(&fh, b"b"), Err(VfsError::NoEnt));
    // Bounds.
    assert_eq!(fs.setxattr(&fh, b"", b"v", XattrSet::Either), Err(VfsError::Inval));
    assert_eq!(fs.setxattr(&fh, b"a\0b", b"v", XattrSet::Either), Err(VfsError::Inval));
    assert_eq!(fs.setxattr(&fh, &[b'n'; XATTR_NAME_MAX + 1], b"v", XattrSet::Either), Err(VfsError::NameTooLong));
    fs.setxattr(&fh, &[b'n'; XATTR_NAME_MAX], b"v", XattrSet::Either).unwrap();
    assert_eq!(fs.setxattr(&fh, b"big", &vec![1; XATTR_VALUE_BYTES_MAX + 1], XattrSet::Either), Err(VfsError::FileTooBig));
    fs.setxattr(&fh, b"big", &vec![1; XATTR_VALUE_BYTES_MAX], XattrSet::Either).unwrap();
    assert_eq!(fs.getxattr(&fh, b"big").unwrap().len(), XATTR_VALUE_BYTES_MAX);
    // Other object types.
    let d = mkdir(&fs, &r, b"d");
    fs.setxattr(&d, b"k", b"dir", XattrSet::Either).unwrap();
    assert_eq!(fs.getxattr(&d, b"k").unwrap(), b"dir");
    fs.remove(&r, b"x").unwrap();
    assert_eq!(fs.getxattr(&fh, b"a"), Err(VfsError::Stale));
    assert_eq!(fs.setxattr(&fh, b"a", b"v", XattrSet::Either), Err(VfsError::Stale));
}

#[test]
fn xattrs_are_charged_and_given_back() {
    // Each attribute charges name + value + XATTR_CHARGE_BYTES to the
    // object's volume and the backend; replacing charges the difference;
    // a set that does not fit is DQUOT / NOSPC with nothing changed;
    // removing the attribute, or the object, gives it all back.
    let fs = fs_with(64 * MIB);
    let r = root(&fs);
    let v = mkdir(&fs, &r, b"vol");
    fs.set_quota(&v, 96 << 10).unwrap();
    let fh = mkfile(&fs, &v, b"f");
    let base = fs.used_bytes();
    let vbase = fs.quota(&fh).unwrap().unwrap().used_bytes;
    fs.setxattr(&fh, b"k", &[7; 1000], XattrSet::Either).unwrap();
    assert_eq!(fs.used_bytes(), base + XATTR_CHARGE_BYTES + 1 + 1000);
    fs.setxattr(&fh, b"k", &[7; 10], XattrSet::Either).unwrap();
    assert_eq!(fs.used_bytes(), base + XATTR_CHARGE_BYTES + 1 + 10, "a smaller value gives the difference back");
    fs.setxattr(&fh, b"big", &vec![1; XATTR_VALUE_BYTES_MAX], XattrSet::Either).unwrap();
    let used = fs.used_bytes();
    assert_eq!(fs.setxattr(&fh, b"big2", &vec![1; XATTR_VALUE_BYTES_MAX], XattrSet::Either), Err(VfsError::QuotaExceeded));
    assert_eq!(fs.used_bytes(), used);
    assert_eq!(fs.getxattr(&fh, b"big2"), Err(VfsError::NoEnt), "nothing set");
    fs.removexattr(&fh, b"big").unwrap();
    assert_eq!(fs.used_bytes(), base + XATTR_CHARGE_BYTES + 11);
    assert_eq!(fs.quota(&fh).unwrap().unwrap().used_bytes, vbase + XATTR_CHARGE_BYTES + 11);
    fs.setxattr(&fh, b"big", &vec![1; 4096], XattrSet::Either).unwrap();
    fs.remove(&v, b"f").unwrap();
    assert_eq!(fs.used_bytes(), base - file_charge(b"f"), "the object's xattrs go with it");
    // The backend itself short.
    let small = fs_with(INODE_CHARGE_BYTES * 4 + 2048);
    let sr = root(&small);
    let sf = mkfile(&small, &sr, b"f");
    let used = small.used_bytes();
    assert_eq!(small.setxattr(&sf, b"k", &[0; 4096], XattrSet::Either), Err(VfsError::NoSpace));
    assert_eq!(small.used_bytes(), used);
}
