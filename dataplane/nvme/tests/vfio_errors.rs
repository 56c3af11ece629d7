//! Start-up refusals of the VFIO bus, against a fake sysfs tree (the
//! ones a machine without VFIO can show; the QEMU guest test shows them on
//! real sysfs too): each names the address and what to do.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nvme::vfio::{Paths, VfioBus};

struct Tree {
    root: PathBuf,
}

impl Tree {
    fn new(name: &str) -> Tree {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("vfio-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for d in ["sys/bus/pci/devices", "sys/bus/pci/drivers/nvme", "sys/bus/pci/drivers/vfio-pci", "sys/bus/pci/drivers/e1000e", "sys/kernel/iommu_groups", "dev/vfio"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        Tree { root }
    }

    fn paths(&self) -> Paths {
        Paths {
            pci_devices: self.root.join("sys/bus/pci/devices"),
            iommu_groups: self.root.join("sys/kernel/iommu_groups"),
            dev_vfio: self.root.join("dev/vfio"),
        }
    }

    /// A PCI function with a class, an optional driver and IOMMU group.
    fn device(&self, addr: &str, class: &str, driver: Option<&str>, group: Option<u32>) {
        let d = self.root.join("sys/bus/pci/devices").join(addr);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("class"), format!("{class}\n")).unwrap();
        if let Some(drv) = driver {
            symlink(self.root.join("sys/bus/pci/drivers").join(drv), d.join("driver")).unwrap();
        }
        if let Some(g) = group {
            let gd = self.root.join("sys/kernel/iommu_groups").join(g.to_string());
            fs::create_dir_all(gd.join("devices")).unwrap();
            symlink(&gd, d.join("iommu_group")).unwrap();
            symlink(&d, gd.join("devices").join(addr)).unwrap();
        }
    }

    fn open(&self, addr: &str) -> String {
        match VfioBus::open_at(addr, &self.paths()) {
            Ok(_) => panic!("{addr} opened"),
            Err(e) => e,
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} lacks {p:?}");
    }
}

#[test]
fn every_refusal_names_the_address_and_what_to_do() {
    let t = Tree::new("errors");
    has(&t.open("0000:01:00.0"), &["NVMe device 0000:01:00.0", "no such PCI device", "lspci -D"]);
    t.device("0000:02:00.0", "0x020000", Some("e1000e"), Some(2));
    has(&t.open("0000:02:00.0"), &["0000:02:00.0", "is not an NVMe controller (PCI class 0x020000)"]);
    t.device("0000:03:00.0", "0x010802", Some("nvme"), Some(3));
    has(&t.open("0000:03:00.0"), &["0000:03:00.0", "bound to the nvme driver, not vfio-pci", "driver_override", "drivers_probe"]);
    t.device("0000:04:00.0", "0x010802", None, Some(4));
    has(&t.open("0000:04:00.0"), &["is not bound to any driver", "vfio-pci"]);
    t.device("0000:05:00.0", "0x010802", Some("vfio-pci"), None);
    has(&t.open("0000:05:00.0"), &["has no IOMMU group", "intel_iommu=on"]);
    // A group shared with a function still on a kernel driver.
    t.device("0000:06:00.0", "0x010802", Some("vfio-pci"), Some(6));
    let other = t.root.join("sys/bus/pci/devices/0000:06:00.1");
    fs::create_dir_all(&other).unwrap();
    symlink(t.root.join("sys/bus/pci/drivers/e1000e"), other.join("driver")).unwrap();
    symlink(&other, t.root.join("sys/kernel/iommu_groups/6/devices/0000:06:00.1")).unwrap();
    has(&t.open("0000:06:00.0"), &["IOMMU group 6 also holds 0000:06:00.1 (bound to e1000e)", "every device of the group"]);
    // Everything right, but no /dev/vfio (a pod without the devices).
    t.device("0000:07:00.0", "0x010802", Some("vfio-pci"), Some(7));
    has(&t.open("0000:07:00.0"), &["0000:07:00.0", "cannot open", "dev/vfio/vfio", "/dev/vfio"]);
    assert!(!Path::new(&t.root).join("dev/vfio/vfio").exists());
}
