//! The real bus: a PCI function bound to `vfio-pci`, reached through the
//! VFIO container/group/device interface (Linux `include/uapi/linux/vfio.h`,
//! type-1 IOMMU). Opening checks, in order, everything an operator can get
//! wrong, and each refusal names the address and what to do.
//!
//! IOVAs are allocated here (from 4 GiB up, 2 MiB aligned) rather than using
//! virtual addresses, so the IOMMU's address width (39 bits on many
//! machines) never matters.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::bus::Bus;

const VFIO_API_VERSION: i32 = 0;
const VFIO_TYPE1_IOMMU: libc::c_ulong = 1;
const VFIO_TYPE1V2_IOMMU: libc::c_ulong = 3;
// _IO(';', 100 + n)
const fn vfio_io(n: u64) -> libc::c_ulong {
    ((b';' as u64) << 8 | (100 + n)) as libc::c_ulong
}
const VFIO_GET_API_VERSION: libc::c_ulong = vfio_io(0);
const VFIO_CHECK_EXTENSION: libc::c_ulong = vfio_io(1);
const VFIO_SET_IOMMU: libc::c_ulong = vfio_io(2);
const VFIO_GROUP_GET_STATUS: libc::c_ulong = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = vfio_io(4);
const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = vfio_io(6);
const VFIO_DEVICE_GET_REGION_INFO: libc::c_ulong = vfio_io(8);
const VFIO_DEVICE_GET_IRQ_INFO: libc::c_ulong = vfio_io(9);
const VFIO_DEVICE_SET_IRQS: libc::c_ulong = vfio_io(10);
const VFIO_PCI_MSIX_IRQ_INDEX: u32 = 2;
const VFIO_IRQ_SET_DATA_NONE: u32 = 1 << 0;
const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
const VFIO_DEVICE_RESET: libc::c_ulong = vfio_io(11);
const VFIO_IOMMU_MAP_DMA: libc::c_ulong = vfio_io(13);
const VFIO_IOMMU_UNMAP_DMA: libc::c_ulong = vfio_io(14);
const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
const VFIO_REGION_INFO_FLAG_MMAP: u32 = 4;
const VFIO_DMA_MAP_FLAG_READ: u32 = 1;
const VFIO_DMA_MAP_FLAG_WRITE: u32 = 2;
const VFIO_PCI_BAR0_REGION_INDEX: u32 = 0;
const VFIO_PCI_CONFIG_REGION_INDEX: u32 = 7;
/// PCI command register: memory space and bus master enable.
const PCI_COMMAND: u64 = 4;
const PCI_COMMAND_MEMORY_MASTER: u16 = 0x2 | 0x4;
/// NVMe: class 01 (mass storage), subclass 08 (non-volatile memory).
const NVME_CLASS_PREFIX: &str = "0x0108";

const IOVA_BASE: u64 = 1 << 32;
const IOVA_ALIGN: u64 = 2 << 20;

#[repr(C)]
#[derive(Default)]
struct GroupStatus {
    argsz: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

#[repr(C)]
#[derive(Default)]
struct IrqInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    count: u32,
}

/// `struct vfio_irq_set` followed by its eventfds.
#[repr(C)]
struct IrqSet<const N: usize> {
    argsz: u32,
    flags: u32,
    index: u32,
    start: u32,
    count: u32,
    fds: [i32; N],
}

/// Most MSI-X vectors taken (vector 0 for the admin queue, one per I/O
/// queue pair after it).
pub const IRQ_VECTORS_MAX: usize = 65;

#[repr(C)]
struct DmaMap {
    argsz: u32,
    flags: u32,
    vaddr: u64,
    iova: u64,
    size: u64,
}

#[repr(C)]
struct DmaUnmap {
    argsz: u32,
    flags: u32,
    iova: u64,
    size: u64,
}

/// Where the kernel's interfaces are (tests point these at a fake tree).
#[derive(Debug, Clone)]
pub struct Paths {
    /// `/sys/bus/pci/devices`
    pub pci_devices: PathBuf,
    /// `/sys/kernel/iommu_groups`
    pub iommu_groups: PathBuf,
    /// `/dev/vfio`
    pub dev_vfio: PathBuf,
}

impl Default for Paths {
    fn default() -> Paths {
        Paths {
            pci_devices: "/sys/bus/pci/devices".into(),
            iommu_groups: "/sys/kernel/iommu_groups".into(),
            dev_vfio: "/dev/vfio".into(),
        }
    }
}

pub struct VfioBus {
    name: String,
    // Field order is drop order: BAR unmapped (in Drop), then the device,
    // the group and the container closed.
    bar: NonNull<u8>,
    bar_len: usize,
    device: OwnedFd,
    _group: OwnedFd,
    container: OwnedFd,
    next_iova: Mutex<u64>,
    /// One eventfd per MSI-X vector enabled (`enable_irqs`).
    irqs: Mutex<Vec<OwnedFd>>,
}

// SAFETY: the BAR mapping is only accessed through `Regs` (volatile
// accesses); the descriptors are plain fds.
unsafe impl Send for VfioBus {}
unsafe impl Sync for VfioBus {}

fn driver_of(dev: &Path) -> Option<String> {
    fs::read_link(dev.join("driver")).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn open_rw(path: &Path) -> Result<OwnedFd, std::io::Error> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl VfioBus {
    /// Open the NVMe controller at `pci` (canonical `DDDD:BB:DD.F`).
    pub fn open(pci: &str) -> Result<VfioBus, String> {
        VfioBus::open_at(pci, &Paths::default())
    }

    pub fn open_at(pci: &str, paths: &Paths) -> Result<VfioBus, String> {
        let fail = |what: String| Err(format!("NVMe device {pci}: {what}"));
        let dev = paths.pci_devices.join(pci);
        if !dev.exists() {
            return fail(format!(
                "no such PCI device ({} does not exist); check the address with `lspci -D` and that the device is passed to this host or pod",
                dev.display()
            ));
        }
        let class = fs::read_to_string(dev.join("class")).unwrap_or_default();
        if !class.trim().starts_with(NVME_CLASS_PREFIX) {
            return fail(format!("is not an NVMe controller (PCI class {}); name an NVMe controller's address", class.trim()));
        }
        let bind_hint = format!(
            "bind it to vfio-pci: echo {pci} > {d}/driver/unbind; echo vfio-pci > {d}/driver_override; echo {pci} > /sys/bus/pci/drivers_probe",
            d = dev.display()
        );
        match driver_of(&dev) {
            Some(d) if d == "vfio-pci" => {}
            Some(d) => return fail(format!("is bound to the {d} driver, not vfio-pci (the kernel is using it); {bind_hint}")),
            None => return fail(format!("is not bound to any driver; {bind_hint}")),
        }
        let Some(group) = fs::read_link(dev.join("iommu_group")).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        else {
            return fail("has no IOMMU group: enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line)".into());
        };
        // Every other function in the group must be unbound or bound to
        // vfio-pci (PCIe bridges excepted), or the group is not viable.
        let mut blockers = Vec::new();
        if let Ok(rd) = fs::read_dir(paths.iommu_groups.join(&group).join("devices")) {
            for e in rd.flatten() {
                let other = e.file_name().to_string_lossy().into_owned();
                if other == pci {
                    continue;
                }
                match driver_of(&paths.pci_devices.join(&other)) {
                    None => {}
                    Some(d) if d == "vfio-pci" || d == "pcieport" || d == "pci-stub" => {}
                    Some(d) => blockers.push(format!("{other} (bound to {d})")),
                }
            }
        }
        blockers.sort();
        if !blockers.is_empty() {
            return fail(format!(
                "IOMMU group {group} also holds {}: every device of the group must be bound to vfio-pci (or unbound) before any can be used",
                blockers.join(", ")
            ));
        }
        let container_path = paths.dev_vfio.join("vfio");
        let container = match open_rw(&container_path) {
            Ok(fd) => fd,
            Err(e) => {
                return fail(format!(
                    "cannot open {} ({e}); the process needs /dev/vfio (in a pod: the device plugin's /dev/vfio devices)",
                    container_path.display()
                ))
            }
        };
        let group_path = paths.dev_vfio.join(&group);
        let group_fd = match open_rw(&group_path) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return fail(format!("IOMMU group {group} ({}) is in use by another process (is another chimerad running on it?)", group_path.display()))
            }
            Err(e) => return fail(format!("cannot open {} ({e})", group_path.display())),
        };
        // SAFETY: ioctls on descriptors we own, with the structures vfio.h
        // defines; results checked.
        unsafe {
            if libc::ioctl(container.as_raw_fd(), VFIO_GET_API_VERSION) != VFIO_API_VERSION {
                return fail("the kernel's VFIO API version is not 0".into());
            }
            let iommu_type = if libc::ioctl(container.as_raw_fd(), VFIO_CHECK_EXTENSION, VFIO_TYPE1V2_IOMMU) > 0 {
                VFIO_TYPE1V2_IOMMU
            } else if libc::ioctl(container.as_raw_fd(), VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU) > 0 {
                VFIO_TYPE1_IOMMU
            } else {
                return fail("the kernel offers no type-1 IOMMU for VFIO (vfio_iommu_type1 not loaded?)".into());
            };
            let mut st = GroupStatus { argsz: std::mem::size_of::<GroupStatus>() as u32, flags: 0 };
            if libc::ioctl(group_fd.as_raw_fd(), VFIO_GROUP_GET_STATUS, &mut st) < 0 {
                return fail(format!("VFIO_GROUP_GET_STATUS on group {group}: {}", errno()));
            }
            if st.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
                return fail(format!(
                    "IOMMU group {group} is not viable: another device in it is bound to a kernel driver; bind every device of the group to vfio-pci"
                ));
            }
            let cfd = container.as_raw_fd();
            if libc::ioctl(group_fd.as_raw_fd(), VFIO_GROUP_SET_CONTAINER, &cfd) < 0 {
                return fail(format!("cannot attach IOMMU group {group} to a VFIO container: {}", errno()));
            }
            if libc::ioctl(container.as_raw_fd(), VFIO_SET_IOMMU, iommu_type) < 0 {
                return fail(format!("cannot set the VFIO IOMMU type: {}", errno()));
            }
            let cname = CString::new(pci).map_err(|_| format!("NVMe device {pci}: bad address"))?;
            let dfd = libc::ioctl(group_fd.as_raw_fd(), VFIO_GROUP_GET_DEVICE_FD, cname.as_ptr());
            if dfd < 0 {
                let e = errno();
                if e.raw_os_error() == Some(libc::EBUSY) {
                    return fail("is in use by another process (is another chimerad running on it?)".into());
                }
                return fail(format!("VFIO_GROUP_GET_DEVICE_FD: {e}"));
            }
            let device = OwnedFd::from_raw_fd(dfd);
            // A controller left running by a killed process still has
            // queues pointing at memory that is gone: reset the function
            // (best effort; the controller reset that follows is the one
            // the driver relies on).
            let _ = libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_RESET);
            let mut bar = RegionInfo { argsz: std::mem::size_of::<RegionInfo>() as u32, index: VFIO_PCI_BAR0_REGION_INDEX, ..Default::default() };
            if libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_GET_REGION_INFO, &mut bar) < 0 {
                return fail(format!("cannot read BAR0's region: {}", errno()));
            }
            if bar.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || bar.size < 0x2000 {
                return fail(format!("BAR0 cannot be mapped (flags {:#x}, {} bytes)", bar.flags, bar.size));
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                bar.size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                device.as_raw_fd(),
                bar.offset as libc::off_t,
            );
            if p == libc::MAP_FAILED {
                return fail(format!("cannot map BAR0 ({} bytes): {}", bar.size, errno()));
            }
            let bus = VfioBus {
                name: pci.to_string(),
                bar: NonNull::new(p as *mut u8).expect("mmap returned null"),
                bar_len: bar.size as usize,
                device,
                _group: group_fd,
                container,
                next_iova: Mutex::new(IOVA_BASE),
                irqs: Mutex::new(Vec::new()),
            };
            bus.enable_bus_master().map_err(|e| format!("NVMe device {pci}: {e}"))?;
            Ok(bus)
        }
    }

    fn enable_bus_master(&self) -> Result<(), String> {
        let mut cfg = RegionInfo { argsz: std::mem::size_of::<RegionInfo>() as u32, index: VFIO_PCI_CONFIG_REGION_INDEX, ..Default::default() };
        // SAFETY: ioctl and pread/pwrite on our device fd with sized buffers.
        unsafe {
            if libc::ioctl(self.device.as_raw_fd(), VFIO_DEVICE_GET_REGION_INFO, &mut cfg) < 0 {
                return Err(format!("cannot read the PCI config region: {}", errno()));
            }
            let at = (cfg.offset + PCI_COMMAND) as libc::off_t;
            let mut cmd = [0u8; 2];
            if libc::pread(self.device.as_raw_fd(), cmd.as_mut_ptr() as *mut libc::c_void, 2, at) != 2 {
                return Err(format!("cannot read the PCI command register: {}", errno()));
            }
            let v = (u16::from_le_bytes(cmd) | PCI_COMMAND_MEMORY_MASTER).to_le_bytes();
            if libc::pwrite(self.device.as_raw_fd(), v.as_ptr() as *const libc::c_void, 2, at) != 2 {
                return Err(format!("cannot enable bus mastering: {}", errno()));
            }
        }
        Ok(())
    }
}

impl Bus for VfioBus {
    fn name(&self) -> &str {
        &self.name
    }

    /// MSI-X through VFIO: an eventfd per vector, signalled by the kernel
    /// when the controller raises it. Fewer than asked when the function
    /// has fewer; 0 (and polling) when it has none or VFIO refuses.
    fn enable_irqs(&self, want: usize) -> Result<usize, String> {
        let mut info = IrqInfo { argsz: std::mem::size_of::<IrqInfo>() as u32, index: VFIO_PCI_MSIX_IRQ_INDEX, ..Default::default() };
        // SAFETY: the structure vfio.h defines, on our device fd.
        if unsafe { libc::ioctl(self.device.as_raw_fd(), VFIO_DEVICE_GET_IRQ_INFO, &mut info) } < 0 {
            return Err(format!("cannot read the MSI-X capability: {}", errno()));
        }
        let n = want.min(info.count as usize).min(IRQ_VECTORS_MAX);
        if n == 0 {
            return Ok(0);
        }
        let mut fds = Vec::with_capacity(n);
        for _ in 0..n {
            // SAFETY: a new eventfd, owned at once.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(format!("cannot create an eventfd for MSI-X: {}", errno()));
            }
            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let mut set = IrqSet::<IRQ_VECTORS_MAX> {
            argsz: (std::mem::size_of::<IrqSet<0>>() + 4 * n) as u32,
            flags: VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            index: VFIO_PCI_MSIX_IRQ_INDEX,
            start: 0,
            count: n as u32,
            fds: [-1; IRQ_VECTORS_MAX],
        };
        for (i, f) in fds.iter().enumerate() {
            set.fds[i] = f.as_raw_fd();
        }
        // SAFETY: argsz covers the header and the n descriptors given.
        if unsafe { libc::ioctl(self.device.as_raw_fd(), VFIO_DEVICE_SET_IRQS, &set) } < 0 {
            return Err(format!("cannot enable {n} MSI-X vectors: {}", errno()));
        }
        *self.irqs.lock().unwrap_or_else(|e| e.into_inner()) = fds;
        Ok(n)
    }

    fn irq_fd(&self, vector: usize) -> Option<std::os::fd::RawFd> {
        self.irqs.lock().unwrap_or_else(|e| e.into_inner()).get(vector).map(|f| f.as_raw_fd())
    }

    fn bar0(&self) -> (NonNull<u8>, usize) {
        (self.bar, self.bar_len)
    }

    fn map_dma(&self, vaddr: *const u8, len: usize) -> Result<u64, String> {
        let mut next = self.next_iova.lock().unwrap_or_else(|e| e.into_inner());
        let iova = *next;
        let m = DmaMap {
            argsz: std::mem::size_of::<DmaMap>() as u32,
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: vaddr as u64,
            iova,
            size: len as u64,
        };
        // SAFETY: the map structure vfio.h defines; the kernel pins the pages.
        if unsafe { libc::ioctl(self.container.as_raw_fd(), VFIO_IOMMU_MAP_DMA, &m) } < 0 {
            let e = errno();
            let hint = if e.raw_os_error() == Some(libc::ENOMEM) {
                "; the memlock limit is too low (ulimit -l; in a pod: IPC_LOCK and a memlock limit that covers the I/O buffers)"
            } else {
                ""
            };
            return Err(format!("NVMe device {}: cannot map {len} bytes for DMA: {e}{hint}", self.name));
        }
        *next = (iova + len as u64).div_ceil(IOVA_ALIGN) * IOVA_ALIGN;
        Ok(iova)
    }

    fn unmap_dma(&self, iova: u64, len: usize) {
        let u = DmaUnmap { argsz: std::mem::size_of::<DmaUnmap>() as u32, flags: 0, iova, size: len as u64 };
        // SAFETY: as above.
        unsafe { libc::ioctl(self.container.as_raw_fd(), VFIO_IOMMU_UNMAP_DMA, &u) };
    }
}

impl Drop for VfioBus {
    fn drop(&mut self) {
        if !self.irqs.get_mut().map(|v| v.is_empty()).unwrap_or(true) {
            let off = IrqSet::<0> {
                argsz: std::mem::size_of::<IrqSet<0>>() as u32,
                flags: VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                index: VFIO_PCI_MSIX_IRQ_INDEX,
                start: 0,
                count: 0,
                fds: [],
            };
            // SAFETY: disables the vectors (count 0) before their eventfds close.
            unsafe { libc::ioctl(self.device.as_raw_fd(), VFIO_DEVICE_SET_IRQS, &off) };
        }
        // SAFETY: the BAR mapping made in `open_at`, unmapped once.
        unsafe { libc::munmap(self.bar.as_ptr() as *mut libc::c_void, self.bar_len) };
    }
}
