//! `nvme`: a userspace NVMe driver over VFIO, as a block device of the
//! block layer (`block::BlockDevice`). No kernel block layer, no system
//! call per I/O: one I/O queue pair per queue (per core), polled
//! completions, PRP lists into buffer pools mapped once for DMA.
//!
//! - `vfio` — the container/group/device setup and DMA mapping, with the
//!   start-up checks (not bound to vfio-pci, not present, group not viable,
//!   in use) each naming the address and what to do.
//! - `device` — controller bring-up, queues, commands (READ, WRITE, FLUSH,
//!   WRITE ZEROES), command timeouts (abort, then reset, failing every
//!   command in flight back as an I/O error).
//! - `sim` — a software controller for tests without VFIO.
//! - `spec` — register offsets, entries, opcodes, statuses.
//!
//! Knows nothing of files or NFS.

pub mod bus;
pub mod device;
pub mod sim;
pub mod spec;
pub mod vfio;

pub use device::{Identity, NvmeDevice, Options};

use std::sync::Arc;

/// The sysfs name of a PCI address given as the reference config's short
/// form (`01:00.0` means domain 0: `0000:01:00.0`); full forms unchanged.
pub fn sysfs_address(addr: &str) -> String {
    if addr.matches(':').count() == 1 {
        format!("0000:{addr}")
    } else {
        addr.to_string()
    }
}

/// Open the NVMe controller at PCI address `pci` (`DDDD:BB:DD.F`) through
/// VFIO and bring it up.
pub fn open_pci(pci: &str, opts: &Options) -> Result<NvmeDevice, block::BlockError> {
    let bus = vfio::VfioBus::open(pci).map_err(|why| {
        block::BlockError::new(&Arc::from(pci), block::OpKind::Open, None, block::ErrorKind::Unusable { why })
    })?;
    NvmeDevice::open(Arc::new(bus), opts)
}
