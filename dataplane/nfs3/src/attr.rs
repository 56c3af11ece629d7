//! Conversions between backend attributes and NFSv3 wire attributes
//! (RFC 1813 §2.5–§2.6), and the permission checks the procedures share.

use proto::nfs3::*;
use vfs::{Attr, Cred, FileType, SetAttr, SetTime, Time, VfsError, VfsResult};

/// Encoded size of fattr3.
pub(crate) const FATTR3_LEN: usize = 84;

fn time3(t: Time) -> nfstime3 {
    nfstime3 { seconds: t.sec.clamp(0, u32::MAX as i64) as u32, nseconds: t.nsec }
}

pub(crate) fn ftype(t: FileType) -> ftype3 {
    match t {
        FileType::Regular => ftype3::NF3REG,
        FileType::Directory => ftype3::NF3DIR,
        FileType::BlockDevice => ftype3::NF3BLK,
        FileType::CharDevice => ftype3::NF3CHR,
        FileType::Symlink => ftype3::NF3LNK,
        FileType::Socket => ftype3::NF3SOCK,
        FileType::Fifo => ftype3::NF3FIFO,
    }
}

pub(crate) fn fattr(a: &Attr) -> fattr3 {
    fattr3 {
        r#type: ftype(a.ftype),
        mode: a.mode & 0o7777,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        used: a.used,
        rdev: specdata3 { specdata1: a.rdev.0, specdata2: a.rdev.1 },
        fsid: a.fsid,
        fileid: a.fileid,
        atime: time3(a.atime),
        mtime: time3(a.mtime),
        ctime: time3(a.ctime),
    }
}

pub(crate) fn post_attr(a: Option<Attr>) -> post_op_attr {
    match a {
        Some(a) => post_op_attr::TRUE(fattr(&a)),
        None => post_op_attr::FALSE,
    }
}

pub(crate) fn pre_attr(a: Option<Attr>) -> pre_op_attr {
    match a {
        Some(a) => pre_op_attr::TRUE(wcc_attr { size: a.size, mtime: time3(a.mtime), ctime: time3(a.ctime) }),
        None => pre_op_attr::FALSE,
    }
}

pub(crate) fn empty_wcc() -> wcc_data {
    wcc_data { before: pre_op_attr::FALSE, after: post_op_attr::FALSE }
}

fn set_time(t: &set_atime) -> SetTime {
    match t {
        set_atime::SET_TO_CLIENT_TIME(t) => SetTime::Client(Time { sec: t.seconds as i64, nsec: t.nseconds }),
        set_atime::SET_TO_SERVER_TIME => SetTime::ServerNow,
        _ => SetTime::DontChange,
    }
}

fn set_mtime_(t: &set_mtime) -> SetTime {
    match t {
        set_mtime::SET_TO_CLIENT_TIME(t) => SetTime::Client(Time { sec: t.seconds as i64, nsec: t.nseconds }),
        set_mtime::SET_TO_SERVER_TIME => SetTime::ServerNow,
        _ => SetTime::DontChange,
    }
}

pub(crate) fn sattr(s: &sattr3) -> SetAttr {
    SetAttr {
        mode: match s.mode {
            set_mode3::TRUE(m) => Some(m & 0o7777),
            _ => None,
        },
        uid: match s.uid {
            set_uid3::TRUE(u) => Some(u),
            _ => None,
        },
        gid: match s.gid {
            set_gid3::TRUE(g) => Some(g),
            _ => None,
        },
        size: match s.size {
            set_size3::TRUE(n) => Some(n),
            _ => None,
        },
        atime: set_time(&s.atime),
        mtime: set_mtime_(&s.mtime),
    }
}

/// Fail with `Access` unless `cred` holds every bit of `want` on `a`.
pub(crate) fn require(a: &Attr, cred: &Cred<'_>, want: u32) -> VfsResult<()> {
    if vfs::check_access(a, cred, want) == want {
        Ok(())
    } else {
        Err(VfsError::Access)
    }
}

/// POSIX rules for SETATTR: only the owner (or root) changes mode, times to
/// arbitrary values and group (to one of its groups); only root changes the
/// owner; size changes need write permission.
pub(crate) fn may_setattr(a: &Attr, cred: &Cred<'_>, set: &SetAttr) -> VfsResult<()> {
    if cred.uid == 0 {
        return Ok(());
    }
    let owner = cred.uid == a.uid;
    if set.uid.is_some_and(|u| u != a.uid) {
        return Err(VfsError::Perm);
    }
    if let Some(g) = set.gid {
        if g != a.gid && !(owner && (cred.gid == g || cred.gids.contains(&g))) {
            return Err(VfsError::Perm);
        }
    }
    if set.mode.is_some() && !owner {
        return Err(VfsError::Perm);
    }
    let client_times = matches!(set.atime, SetTime::Client(_)) || matches!(set.mtime, SetTime::Client(_));
    if client_times && !owner {
        return Err(VfsError::Perm);
    }
    let now_times = matches!(set.atime, SetTime::ServerNow) || matches!(set.mtime, SetTime::ServerNow);
    if now_times && !owner {
        require(a, cred, vfs::access::MODIFY)?;
    }
    if set.size.is_some() && !owner {
        require(a, cred, vfs::access::MODIFY)?;
    }
    Ok(())
}
