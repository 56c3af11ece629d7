//! The interface the NFSv4.1 server calls for pNFS (RFC 8881 §12): the
//! protocol side (decoding, stateid rules that need the open state,
//! encoding) lives in `ops::layout`; what a layout *is* — placement, data
//! servers, device addresses, layout state — belongs to whoever implements
//! `LayoutServer` (the `pnfs` crate; `chimerad` wires it with
//! `Nfs4Program::with_layouts`). This crate knows no data server.

use crate::state::Stateid;
use vfs::{FileHandle, Time};

/// deviceid4 (RFC 8881 §3.3.14).
pub type DeviceId = [u8; 16];

/// NFS4_UINT64_MAX: a length reaching the end of the file.
pub const LENGTH_TO_EOF: u64 = u64::MAX;

/// layoutiomode4 without ANY (ANY is only valid when returning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    Read,
    Rw,
}

impl IoMode {
    pub fn wire(self) -> u32 {
        match self {
            IoMode::Read => 1,
            IoMode::Rw => 2,
        }
    }
}

/// LAYOUTGET (§18.43) after the protocol checks: the range is valid
/// (length ≥ minlength, no overflow), the file is a regular file, and
/// `stateid` is either one of the provider's layout stateids
/// (`is_layout_stateid`) or an open/lock stateid of this client for this
/// file already validated by the NFSv4.1 state.
#[derive(Debug, Clone, Copy)]
pub struct LayoutGetArgs {
    pub clientid: u64,
    pub fh: FileHandle,
    pub fsid: u64,
    pub iomode: IoMode,
    pub offset: u64,
    pub length: u64,
    pub minlength: u64,
    pub stateid: Stateid,
    pub layout_stateid: bool,
    /// Bytes the client accepts for the layout body.
    pub maxcount: u32,
    /// The client's address on this call (export rules are per address:
    /// a rule change recalls the layouts of the clients it narrows).
    pub peer: Option<std::net::IpAddr>,
}

/// One granted layout segment (the Linux client takes exactly one per reply).
#[derive(Debug, Clone)]
pub struct Layout {
    pub stateid: Stateid,
    pub return_on_close: bool,
    pub offset: u64,
    pub length: u64,
    pub iomode: IoMode,
    /// The layout-type-specific body (loc_body: ff_layout4 for flex files).
    pub body: Vec<u8>,
}

/// What LAYOUTRETURN returns (§18.44).
#[derive(Debug, Clone, Copy)]
pub enum Return<'a> {
    File { fh: FileHandle, offset: u64, length: u64, stateid: Stateid, body: &'a [u8] },
    Fsid { fsid: u64 },
    All,
}

/// LAYOUTCOMMIT (§18.42) for the current file.
#[derive(Debug, Clone, Copy)]
pub struct Commit<'a> {
    pub clientid: u64,
    pub fh: FileHandle,
    pub offset: u64,
    pub length: u64,
    pub reclaim: bool,
    pub stateid: Stateid,
    pub last_write_offset: Option<u64>,
    pub mtime: Option<Time>,
    pub body: &'a [u8],
}

/// device_error4 (RFC 7862 §15.6).
#[derive(Debug, Clone, Copy)]
pub struct DeviceError {
    pub deviceid: DeviceId,
    pub status: i32,
    pub opnum: i32,
}

/// The layout provider. Errors are nfsstat4 values (NFS4ERR_*).
pub trait LayoutServer: Send + Sync {
    /// The one layout type served (LAYOUT4_FLEX_FILES = 4).
    fn layout_type(&self) -> u32;
    /// layout_blksize (§5.12.2): the preferred I/O size.
    fn blksize(&self) -> u32;
    /// Whether `sid` has this provider's layout-stateid shape (then the
    /// provider, not the open state, decides whether it is valid).
    fn is_layout_stateid(&self, sid: &Stateid) -> bool;
    fn layoutget(&self, a: &LayoutGetArgs) -> Result<Layout, i32>;
    /// da_addr_body of a device, or NFS4ERR_NOENT; NFS4ERR_TOOSMALL is
    /// reported by the caller from the body's length.
    fn getdeviceinfo(&self, id: &DeviceId) -> Result<Vec<u8>, i32>;
    fn getdevicelist(&self) -> Vec<DeviceId>;
    /// Returns the layout stateid left (None: no layout left for the file).
    fn layoutreturn(&self, clientid: u64, iomode: Option<IoMode>, r: &Return<'_>) -> Result<Option<Stateid>, i32>;
    /// Applies the new size (and mtime) on the MDS; returns the new size.
    fn layoutcommit(&self, c: &Commit<'_>) -> Result<Option<u64>, i32>;
    fn layouterror(&self, clientid: u64, fh: &FileHandle, stateid: &Stateid, errors: &[DeviceError]) -> Result<(), i32>;
    fn layoutstats(&self, clientid: u64, fh: &FileHandle, stateid: &Stateid, deviceid: &DeviceId, body: &[u8]) -> Result<(), i32>;
}
