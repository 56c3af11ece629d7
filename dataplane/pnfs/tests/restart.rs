//! The pNFS MDS on diskfs across restarts: placements (which data servers
//! hold a file's data files, their handles, stripe unit, mirrors, fencing
//! epoch, stale copies) come back from the MDS's own backend, so data
//! written before a restart reads back after it. Three real data servers
//! (chimerad, role `ds`) run in this process on 127.0.0.1 and stay up; the
//! MDS is a `Pnfs` + `PnfsVfs` over a `DiskFs` on a memory block device,
//! "restarted" by dropping all of it and opening the same device again
//! with a new `Pnfs` whose DS list is in another order (so every DS gets
//! another id). I/O goes through the MDS (`PnfsVfs`), as a client without
//! a layout does; layouts are asked of `Pnfs` directly.

use block::mem::MemDevice;
use chimerad::config::Config;
use chimerad::serve::{self, Running};
use diskfs::{DiskFs, Options};
use nfs4::layout::{DeviceError, IoMode, LayoutGetArgs, LayoutServer};
use nfs4::state::Stateid;
use pnfs::client3::Client3;
use pnfs::{DsSpec, Netid, Pnfs, PnfsConfig, PnfsVfs};
use proto::nfs4 as p;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vfs::{CreateMode, Cred, FileHandle, NodeKind, Stability, Vfs, VfsError};

const EXPORT: u32 = 3;
const SU: u64 = 64 * 1024;
const SYNTH_UID: u32 = 1_000_000;
const TIMEOUT: Duration = Duration::from_secs(10);

struct Dses(Vec<Option<Running>>);

impl Drop for Dses {
    fn drop(&mut self) {
        for d in self.0.iter_mut().filter_map(Option::take) {
            d.shutdown();
        }
    }
}

fn start_dses(n: usize) -> Dses {
    let v = json!({
        "common": { "log_level": "warn" },
        "server": { "role": "ds", "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0 },
        "metrics": { "enabled": false }
    });
    Dses((0..n).map(|_| Some(serve::start(&Config::parse(&v.to_string()).unwrap()).expect("start DS"))).collect())
}

impl Dses {
    fn port(&self, i: usize) -> u16 {
        self.0[i].as_ref().unwrap().nfs_addr.unwrap().port()
    }
    /// DS `i` as the MDS lists it: named "ds-<i>".
    fn spec(&self, i: usize) -> DsSpec {
        let port = self.port(i);
        DsSpec {
            name: format!("ds-{i}"),
            host: "127.0.0.1".into(),
            port,
            netid: Netid::Tcp,
            tcp_port: port,
            backing_path: None,
            ready: true,
            draining: false,
        }
    }
    fn specs(&self, order: &[usize]) -> Vec<DsSpec> {
        order.iter().map(|&i| self.spec(i)).collect()
    }
    fn index_of_name(name: &str) -> usize {
        name.strip_prefix("ds-").unwrap().parse().unwrap()
    }
    /// A root NFSv3 client of DS `i` and the handle of its data directory.
    fn dir(&self, i: usize) -> (Client3, Vec<u8>) {
        let mut c = Client3::new(&format!("127.0.0.1:{}", self.port(i)), TIMEOUT);
        let pseudo = vfs::router::PSEUDO_ROOT.to_bytes().to_vec();
        let first = c.first_entry(&pseudo).unwrap().expect("the DS has a mount");
        let dir = c.lookup(&pseudo, &first).unwrap();
        (c, dir)
    }
}

/// An MDS on `dev`: the backend, the pNFS state and the wrapper.
struct Mds {
    fs: Arc<DiskFs>,
    pn: Arc<Pnfs>,
    v: PnfsVfs,
}

fn open_mds(dev: &block::Device, dses: Vec<DsSpec>, mirrors: u32) -> Mds {
    let fs = Arc::new(DiskFs::open(vec![dev.clone()], &Options::new(EXPORT, true)).unwrap());
    let vfs: Arc<dyn Vfs> = fs.clone();
    let cfg = PnfsConfig { stripe_unit_bytes: SU, mirrors, ds_timeout_ms: 2000, ..Default::default() };
    let pn = Pnfs::new(cfg, vfs, dses).unwrap();
    let v = PnfsVfs::new(pn.clone());
    Mds { fs, pn, v }
}

impl Mds {
    /// Stop: nothing of this instance may keep the device open.
    fn stop(self) {
        let Mds { fs, pn, v } = self;
        drop(v);
        drop(pn);
        let deadline = Instant::now() + TIMEOUT;
        while Arc::strong_count(&fs) > 1 {
            assert!(Instant::now() < deadline, "the old MDS still holds its backend");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    fn root(&self) -> FileHandle {
        self.v.root(EXPORT).unwrap()
    }
    fn create(&self, name: &str) -> FileHandle {
        self.v.create(&self.root(), name.as_bytes(), NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0
    }
    fn lookup(&self, name: &str) -> FileHandle {
        self.v.lookup(&self.root(), name.as_bytes()).unwrap().0
    }
    fn read(&self, fh: &FileHandle, offset: u64, len: usize) -> Result<Vec<u8>, VfsError> {
        let mut b = vec![0u8; len];
        let (n, _) = self.v.read(fh, offset, &mut b)?;
        b.truncate(n);
        Ok(b)
    }
    fn write(&self, fh: &FileHandle, offset: u64, data: &[u8]) {
        assert_eq!(self.v.write(fh, offset, data, Stability::Unstable).unwrap().0, data.len());
    }
    fn layout(&self, fh: &FileHandle, iomode: IoMode) -> Result<nfs4::layout::Layout, i32> {
        self.pn.layoutget(&LayoutGetArgs {
            clientid: 1,
            fh: *fh,
            fsid: EXPORT as u64,
            iomode,
            offset: 0,
            length: u64::MAX,
            minlength: 0,
            stateid: Stateid { seqid: 1, other: [1; 12] },
            layout_stateid: false,
            maxcount: 4096,
            peer: None,
        })
    }
    /// Files per DS name, from the registry.
    fn files(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self.pn.ds_states().into_iter().map(|s| (s.name, s.files)).collect();
        v.sort();
        v
    }
}

fn pattern(seed: u8, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((offset + i) as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// What the first mirror of a flex-files layout body names: its device id,
/// and the synthetic uid it hands out.
fn first_mirror(body: &[u8]) -> ([u8; 16], u32) {
    let u32_at = |at: usize| u32::from_be_bytes(body[at..at + 4].try_into().unwrap());
    assert!(u32_at(8) >= 1 && u32_at(12) == 1, "mirrors, one DS each");
    let dev: [u8; 16] = body[16..32].try_into().unwrap();
    // efficiency (4), stateid (16), one handle (count, length, bytes padded).
    let fh_len = u32_at(32 + 4 + 16 + 4) as usize;
    let user_at = 32 + 4 + 16 + 4 + 4 + fh_len.next_multiple_of(4);
    let user_len = u32_at(user_at) as usize;
    let user = std::str::from_utf8(&body[user_at + 4..user_at + 4 + user_len]).unwrap();
    (dev, user.parse().unwrap())
}

/// The TCP port GETDEVICEINFO gives for a device (uaddr "h.h.h.h.p1.p2").
fn port_of_device(pn: &Pnfs, dev: &[u8; 16]) -> u16 {
    let b = pn.getdeviceinfo(dev).unwrap();
    let len_at = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let netid_len = len_at(4);
    let uaddr_at = 8 + netid_len.next_multiple_of(4);
    let uaddr = std::str::from_utf8(&b[uaddr_at + 4..uaddr_at + 4 + len_at(uaddr_at)]).unwrap();
    let parts: Vec<u16> = uaddr.rsplitn(3, '.').take(2).map(|x| x.parse().unwrap()).collect();
    parts[1] * 256 + parts[0]
}

/// Proves placements survive an MDS restart on diskfs: a file striped over
/// three DSes (9 stripe units, written through the MDS), a file placed by
/// LAYOUTGET and then fenced (epoch 1), and a sparse file read back byte
/// for byte after the MDS is stopped and reopened on the same device with
/// its DS list in reverse order; nothing is in memory until first use (the
/// placement is restored on it, with the same DS names and data-file
/// handles); the restored fenced file's layout names the DS that holds its
/// data (by the new ids) and the epoch-1 owner; per-DS file counts match
/// the first run once the files are used; a write after the restart and a
/// second restart (through a checkpoint) keep everything; removing a file,
/// and deleting a tree, after a restart removes their data files from the
/// DSes.
#[test]
fn placements_survive_mds_restarts_with_the_ds_list_reordered() {
    let dses = start_dses(3);
    let dev: block::Device = Arc::new(MemDevice::new("mds", 16384));
    let names = ["striped", "fenced", "sparse", "empty"];
    let striped = pattern(1, 0, (9 * SU) as usize);
    let sparse = pattern(3, 70_000, 5000);
    let (before, files_before, fenced_owner) = {
        let m = open_mds(&dev, dses.specs(&[0, 1, 2]), 1);
        let fhs: Vec<FileHandle> = names.iter().map(|n| m.create(n)).collect();
        for (k, chunk) in striped.chunks(20_000).enumerate() {
            m.write(&fhs[0], k as u64 * 20_000, chunk);
        }
        m.layout(&fhs[1], IoMode::Rw).expect("RW layout places the file");
        m.write(&fhs[1], 0, &pattern(2, 0, 100_000));
        m.pn.fence(&fhs[1]);
        let (_, owner) = first_mirror(&m.layout(&fhs[1], IoMode::Read).unwrap().body);
        m.write(&fhs[2], 70_000, &sparse);
        let before: Vec<_> = fhs.iter().map(|f| m.pn.placement_of(f)).collect();
        assert_eq!(before[0].as_ref().map(|p| p.len()), Some(3), "striped over all three DSes");
        assert!(before[3].is_none(), "an empty file is never placed");
        let files = m.files();
        // A tree (an admin-API volume) to delete after the restart; its file
        // is left out of the counts above.
        let vol = m.v.create(&m.root(), b"vol", NodeKind::Directory, 0o755, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        let sub = m.v.create(&vol, b"sub", NodeKind::Directory, 0o755, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        let deep = m.v.create(&sub, b"deep", NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        m.write(&deep, 0, b"inside a tree deleted after the restart");
        m.stop();
        (before, files, owner)
    };
    assert_eq!(fenced_owner, SYNTH_UID + 1, "fenced once");

    let m = open_mds(&dev, dses.specs(&[2, 1, 0]), 1);
    let fhs: Vec<FileHandle> = names.iter().map(|n| m.lookup(n)).collect();
    assert_eq!(m.pn.files_placed(), 0, "nothing restored before first use");
    assert!(m.read(&fhs[0], 0, (9 * SU) as usize).unwrap() == striped, "the striped file reads back");
    assert!(m.read(&fhs[1], 0, 100_000).unwrap() == pattern(2, 0, 100_000), "the fenced file reads back");
    let got = m.read(&fhs[2], 0, 75_000).unwrap();
    assert!(got[..70_000].iter().all(|&b| b == 0) && got[70_000..] == sparse[..], "the sparse file reads back, hole and all");
    assert_eq!(m.read(&fhs[3], 0, 10).unwrap(), b"", "the empty file is still empty");
    let after: Vec<_> = fhs.iter().map(|f| m.pn.placement_of(f)).collect();
    assert_eq!(after, before, "same DS names and data-file handles");
    assert_eq!(m.files(), files_before, "per-DS file counts as before the restart");
    assert_eq!(m.pn.metrics.placements_restored.load(std::sync::atomic::Ordering::Relaxed), 3);
    // The fenced file's layout: the restored epoch, and its data's DS by its new id.
    let (dev_id, owner) = first_mirror(&m.layout(&fhs[1], IoMode::Read).unwrap().body);
    assert_eq!(owner, SYNTH_UID + 1, "the fencing epoch survived");
    let holder = Dses::index_of_name(&after[1].as_ref().unwrap()[0].0);
    assert_eq!(port_of_device(&m.pn, &dev_id), dses.port(holder), "the layout's device is the DS holding the data");
    // Write after the restart, checkpoint, restart again.
    m.write(&fhs[0], 3 * SU + 10, b"after the restart");
    m.fs.checkpoint().unwrap();
    m.stop();

    let m = open_mds(&dev, dses.specs(&[1, 0, 2]), 1);
    let mut want = striped.clone();
    want[(3 * SU + 10) as usize..][..17].copy_from_slice(b"after the restart");
    assert!(m.read(&fhs[0], 0, (9 * SU) as usize).unwrap() == want, "the second restart keeps the later write");
    assert_eq!(m.pn.placement_of(&fhs[0]), before[0]);
    // Removing a file restored from storage removes its data files.
    let data_name = pnfs::data_file_name(&fhs[0]);
    let holders: Vec<usize> = before[0].as_ref().unwrap().iter().map(|(n, _)| Dses::index_of_name(n)).collect();
    for &i in &holders {
        let (mut c, dir) = dses.dir(i);
        c.lookup(&dir, data_name.as_bytes()).expect("data file on its DS");
    }
    m.v.remove(&m.root(), b"striped").unwrap();
    let deadline = Instant::now() + TIMEOUT;
    for &i in &holders {
        let (mut c, dir) = dses.dir(i);
        while c.lookup(&dir, data_name.as_bytes()).is_ok() {
            assert!(Instant::now() < deadline, "data file on ds-{i} not removed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Deleting a tree (an admin-API volume) whose files were not used since
    // the restart removes their data files too.
    let deep = m.v.lookup(&m.v.lookup(&m.lookup("vol"), b"sub").unwrap().0, b"deep").unwrap().0;
    let deep_name = pnfs::data_file_name(&deep);
    assert!(m.pn.placement_of(&deep).is_none(), "not used since the restart");
    for i in 0..3 {
        let (mut c, dir) = dses.dir(i);
        c.lookup(&dir, deep_name.as_bytes()).expect("striped over all three DSes");
    }
    m.v.remove_tree(&m.root(), b"vol").unwrap();
    for i in 0..3 {
        let (mut c, dir) = dses.dir(i);
        while c.lookup(&dir, deep_name.as_bytes()).is_ok() {
            assert!(Instant::now() < deadline, "data file of the deleted tree on ds-{i} not removed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    m.stop();
}

/// Proves stale copies and missing DSes across restarts (mirrors = 2): a
/// copy reported failed (LAYOUTERROR) is stale and misses the next write;
/// after a restart the stale flag is still there — reads come from the
/// good copy even though the stale one is the first mirror and still holds
/// the old bytes, and a READ layout leaves it out. Restarted with the good
/// copy's DS no longer listed, the file fails with Io (its only usable copy
/// is unavailable; no layout) while the DS list is missing it, and reads
/// back once that DS is listed again.
#[test]
fn stale_copies_and_unlisted_dses_survive_restarts() {
    let dses = start_dses(3);
    let dev: block::Device = Arc::new(MemDevice::new("mds", 16384));
    let old = pattern(5, 0, 8192);
    let new = pattern(6, 0, 8192);
    let (fh, names) = {
        let m = open_mds(&dev, dses.specs(&[0, 1, 2]), 2);
        let fh = m.create("mirrored");
        m.write(&fh, 0, &old);
        let names: Vec<String> = m.pn.placement_of(&fh).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names.len(), 2);
        let l = m.layout(&fh, IoMode::Rw).unwrap();
        // Ids of the first run are list positions + 1.
        let first = Pnfs::device_id(Dses::index_of_name(&names[0]) as u64 + 1);
        let err = DeviceError { deviceid: first, status: p::NFS4ERR_NXIO, opnum: p::OP_WRITE };
        m.pn.layouterror(1, &fh, &l.stateid, &[err]).unwrap();
        m.write(&fh, 0, &new);
        assert!(m.read(&fh, 0, 8192).unwrap() == new);
        m.stop();
        (fh, names)
    };
    let (stale_i, good_i) = (Dses::index_of_name(&names[0]), Dses::index_of_name(&names[1]));
    {
        // The stale copy still holds the old bytes: reading it would show them.
        let (mut c, dir) = dses.dir(stale_i);
        let h = c.lookup(&dir, pnfs::data_file_name(&fh).as_bytes()).unwrap();
        let mut got = Vec::new();
        c.read(&h, 0, 8192, &mut got).unwrap();
        assert!(got == old, "the stale copy missed the second write");
    }
    let m = open_mds(&dev, dses.specs(&[2, 1, 0]), 2);
    assert!(m.read(&fh, 0, 8192).unwrap() == new, "read from the good copy, not the stale first mirror");
    let l = m.layout(&fh, IoMode::Read).unwrap();
    let (dev_id, _) = first_mirror(&l.body);
    assert_eq!(u32::from_be_bytes(l.body[8..12].try_into().unwrap()), 1, "one usable mirror");
    assert_eq!(port_of_device(&m.pn, &dev_id), dses.port(good_i), "the layout names the good copy's DS");
    m.stop();

    let listed: Vec<usize> = (0..3).filter(|&i| i != good_i).collect();
    let m = open_mds(&dev, dses.specs(&listed), 2);
    assert_eq!(m.read(&fh, 0, 8192), Err(VfsError::Io), "the only good copy is on a DS not listed");
    assert_eq!(m.layout(&fh, IoMode::Read).unwrap_err(), p::NFS4ERR_LAYOUTUNAVAILABLE);
    assert_eq!(m.pn.ds_states().len(), 2, "the unlisted DS is not shown");
    m.pn.set_data_servers(dses.specs(&[0, 1, 2])).unwrap();
    assert!(m.read(&fh, 0, 8192).unwrap() == new, "listed again, the copy is back");
    m.stop();
}
