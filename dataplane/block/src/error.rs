//! Errors that say which device, which operation and which byte offset.

use std::fmt;
use std::sync::Arc;

/// What a request or an open was doing when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Open,
    Read,
    Write,
    Flush,
    WriteZeroes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The device answered an errno (EIO, ENOSPC, ...).
    Io { errno: i32 },
    /// A read or write moved fewer bytes than asked (never resubmitted).
    Short { bytes: u64, bytes_asked: u64 },
    /// The request reaches past the device's last block.
    OutOfRange { blocks: u64 },
    /// A write or write-zeroes to a device opened (or made) read-only, or a
    /// device that cannot be opened for writing (EROFS, EACCES, EPERM).
    ReadOnly { errno: Option<i32> },
    /// A request that no device could serve: zero blocks, a buffer smaller
    /// than the request.
    BadRequest { why: &'static str },
    NotFound,
    /// Neither a regular file nor a block device (a directory, a FIFO, ...).
    NotFileOrBlockDevice,
    TooSmall { bytes: u64, bytes_min: u64 },
    /// The file system under the file refuses O_DIRECT (tmpfs, some
    /// overlays): open it where direct I/O works, or in buffered test mode.
    DirectIoUnsupported { errno: i32 },
    /// A block device whose logical block does not divide 4 KiB.
    BlockSizeUnsupported { logical_bytes: u32 },
    /// The device answered a command with an error status (NVMe: status
    /// code type and code, and what the specification calls it).
    DeviceStatus { sct: u8, sc: u8, what: &'static str },
    /// The device did not complete the command within the command timeout
    /// (it was aborted, or failed back by a controller reset).
    TimedOut { ms: u64 },
    /// The device cannot be used at all (not bound to the right driver,
    /// failed, ...): what happened and what to do.
    Unusable { why: String },
}

/// An error naming the device (its path), the operation and, where there is
/// one, the byte offset on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockError {
    pub device: Arc<str>,
    pub op: OpKind,
    pub offset_bytes: Option<u64>,
    pub kind: ErrorKind,
}

impl BlockError {
    pub fn new(device: &Arc<str>, op: OpKind, offset_bytes: Option<u64>, kind: ErrorKind) -> BlockError {
        BlockError { device: device.clone(), op, offset_bytes, kind }
    }

    /// The errno this error maps to (for callers that answer NFS3ERR_IO,
    /// EROFS, ...).
    pub fn errno(&self) -> i32 {
        match self.kind {
            ErrorKind::Io { errno } | ErrorKind::DirectIoUnsupported { errno } => errno,
            ErrorKind::ReadOnly { errno } => errno.unwrap_or(libc::EROFS),
            ErrorKind::Short { .. } | ErrorKind::DeviceStatus { .. } | ErrorKind::Unusable { .. } => libc::EIO,
            ErrorKind::TimedOut { .. } => libc::EIO,
            ErrorKind::OutOfRange { .. } | ErrorKind::BadRequest { .. } | ErrorKind::BlockSizeUnsupported { .. } => libc::EINVAL,
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::NotFileOrBlockDevice => libc::ENODEV,
            ErrorKind::TooSmall { .. } => libc::ENOSPC,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Io { errno } => write!(f, "{}", std::io::Error::from_raw_os_error(*errno)),
            ErrorKind::Short { bytes, bytes_asked } => write!(f, "short transfer: {bytes} of {bytes_asked} bytes"),
            ErrorKind::OutOfRange { blocks } => write!(f, "beyond the end of the device ({blocks} blocks of 4096 bytes)"),
            ErrorKind::ReadOnly { errno: None } => write!(f, "device is read-only"),
            ErrorKind::ReadOnly { errno: Some(e) } => {
                write!(f, "cannot be opened for writing: {}", std::io::Error::from_raw_os_error(*e))
            }
            ErrorKind::BadRequest { why } => write!(f, "bad request: {why}"),
            ErrorKind::NotFound => write!(f, "no such file or block device"),
            ErrorKind::NotFileOrBlockDevice => write!(f, "neither a regular file nor a block device"),
            ErrorKind::TooSmall { bytes, bytes_min } => write!(f, "too small: {bytes} bytes, at least {bytes_min} needed"),
            ErrorKind::DirectIoUnsupported { errno } => write!(
                f,
                "O_DIRECT is not supported here ({}); put the device file on a file system with direct I/O (not tmpfs)",
                std::io::Error::from_raw_os_error(*errno)
            ),
            ErrorKind::BlockSizeUnsupported { logical_bytes } => {
                write!(f, "logical block of {logical_bytes} bytes does not divide 4096")
            }
            ErrorKind::DeviceStatus { sct, sc, what } => {
                write!(f, "I/O error: the device answered status type {sct:#x} code {sc:#04x} ({what})")
            }
            ErrorKind::TimedOut { ms } => write!(f, "I/O error: no completion within {ms} ms (command aborted or failed by a controller reset)"),
            ErrorKind::Unusable { why } => write!(f, "{why}"),
        }
    }
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            OpKind::Open => "open",
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::WriteZeroes => "write-zeroes",
        };
        match self.offset_bytes {
            Some(o) => write!(f, "device {}: {op} at byte offset {o}: {}", self.device, self.kind),
            None => write!(f, "device {}: {op}: {}", self.device, self.kind),
        }
    }
}

impl std::error::Error for BlockError {}
