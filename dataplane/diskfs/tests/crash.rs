//! Crash states, explored (the CrashMonkey / ALICE technique): a workload
//! runs on a recording device; from the recording, crash images are built
//! at every flush point and, between flush points, from random subsets of
//! the writes in flight (reordered, torn at 4 KiB). Each image is checked
//! by fsck before recovery, recovered, and compared with an oracle: the
//! namespace is the one after some operation between the last one
//! acknowledged durable and the last one started, and every file byte is
//! one some write to that file put there (or zero where nothing durable
//! was). `DISKFS_CRASH_SEEDS` sets the random images per flush point
//! (default 14, over 2,000 images; `make crash` runs more).
//! `DISKFS_CRASH_DEVICE` checks every image on a real device instead of in
//! memory (`vfio:ADDR` or a file / block device path; the guest test
//! `make test-guest-vfio` runs it through the NVMe driver and io_uring).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use block::mem::{Image, MemDevice};
use block::recording::RecordingDevice;
use block::rng::SeededRng;
use block::Device;
use diskfs::{DiskFs, Options};
use vfs::{CreateMode, Cred, FileHandle, FileType, NodeKind, SetAttr, Stability, Vfs};

const EXPORT: u32 = 1;
const BLOCKS: u64 = 2048;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Dir,
    File(u32),
    Link(Vec<u8>),
}

#[derive(Clone, Debug, Default)]
struct FileModel {
    durable: Vec<u8>,
    current: Vec<u8>,
    unstable: Vec<(u64, Vec<u8>)>,
}

#[derive(Clone, Debug, Default)]
struct Model {
    ns: BTreeMap<String, Kind>,
    files: HashMap<u32, FileModel>,
    next_id: u32,
}

/// The model after each operation, and the flush points completed when it
/// was acknowledged.
struct Trace {
    states: Vec<(Model, usize)>,
}

struct Run<'a> {
    fs: &'a DiskFs,
    rec: &'a RecordingDevice,
    m: Model,
    trace: Trace,
    handles: HashMap<String, FileHandle>,
    rng: SeededRng,
}

fn parent_of(p: &str) -> (&str, &str) {
    let i = p.rfind('/').unwrap();
    (&p[..i], &p[i + 1..])
}

impl Run<'_> {
    fn h(&self, path: &str) -> FileHandle {
        if path.is_empty() {
            return self.fs.root(EXPORT).unwrap();
        }
        self.handles[path]
    }

    fn done(&mut self) {
        let k = self.rec.recording().flush_points();
        self.trace.states.push((self.m.clone(), k));
    }

    fn pattern(&mut self, id: u32, len: usize) -> Vec<u8> {
        let salt = self.rng.next_u64();
        (0..len).map(|i| ((salt >> (i % 7 * 8)) as u8 ^ (i / 4096) as u8 ^ id as u8).max(1)).collect()
    }

    fn mkdir(&mut self, path: &str) {
        let (p, n) = parent_of(path);
        let fh = self.fs.create(&self.h(p), n.as_bytes(), NodeKind::Directory, 0o755, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        self.handles.insert(path.into(), fh);
        self.m.ns.insert(path.into(), Kind::Dir);
        self.done();
    }

    fn create(&mut self, path: &str) {
        let (p, n) = parent_of(path);
        let fh = self.fs.create(&self.h(p), n.as_bytes(), NodeKind::File, 0o644, &Cred::ROOT, CreateMode::Guarded).unwrap().0;
        self.handles.insert(path.into(), fh);
        let id = self.m.next_id;
        self.m.next_id += 1;
        self.m.ns.insert(path.into(), Kind::File(id));
        self.m.files.insert(id, FileModel::default());
        self.done();
    }

    fn symlink(&mut self, path: &str, target: &str) {
        let (p, n) = parent_of(path);
        self.fs.create(&self.h(p), n.as_bytes(), NodeKind::Symlink { target: target.as_bytes() }, 0o777, &Cred::ROOT, CreateMode::Guarded).unwrap();
        self.m.ns.insert(path.into(), Kind::Link(target.as_bytes().to_vec()));
        self.done();
    }

    fn id(&self, path: &str) -> u32 {
        match self.m.ns[path] {
            Kind::File(id) => id,
            _ => panic!("{path} is not a file"),
        }
    }

    fn write(&mut self, path: &str, off: u64, len: usize, stable: bool) {
        let id = self.id(path);
        let data = self.pattern(id, len);
        let how = if stable { Stability::FileSync } else { Stability::Unstable };
        self.fs.write(&self.h(path), off, &data, how).unwrap();
        let f = self.m.files.get_mut(&id).unwrap();
        let end = off as usize + len;
        if f.current.len() < end {
            f.current.resize(end, 0);
        }
        f.current[off as usize..end].copy_from_slice(&data);
        if stable {
            f.durable = f.current.clone();
            f.unstable.clear();
        } else {
            f.unstable.push((off, data));
        }
        self.done();
    }

    fn commit(&mut self, path: &str) {
        let id = self.id(path);
        self.fs.commit(&self.h(path), 0, 0).unwrap();
        let f = self.m.files.get_mut(&id).unwrap();
        f.durable = f.current.clone();
        f.unstable.clear();
        self.done();
    }

    fn truncate(&mut self, path: &str, size: u64) {
        let id = self.id(path);
        assert!(self.m.files[&id].unstable.is_empty(), "the oracle truncates committed files only");
        self.fs.setattr(&self.h(path), &SetAttr { size: Some(size), ..Default::default() }, None).unwrap();
        let f = self.m.files.get_mut(&id).unwrap();
        f.current.resize(size as usize, 0);
        f.durable = f.current.clone();
        self.done();
    }

    fn chmod(&mut self, path: &str) {
        self.fs.setattr(&self.h(path), &SetAttr { mode: Some(0o600), ..Default::default() }, None).unwrap();
        self.done();
    }

    fn remove(&mut self, path: &str) {
        let (p, n) = parent_of(path);
        self.fs.remove(&self.h(p), n.as_bytes()).unwrap();
        self.m.ns.remove(path);
        self.handles.remove(path);
        self.done();
    }

    fn rmdir(&mut self, path: &str) {
        let (p, n) = parent_of(path);
        self.fs.rmdir(&self.h(p), n.as_bytes()).unwrap();
        self.m.ns.remove(path);
        self.done();
    }

    fn rename(&mut self, from: &str, to: &str) {
        let (fp, fname) = parent_of(from);
        let (tp, tname) = parent_of(to);
        self.fs.rename(&self.h(fp), fname.as_bytes(), &self.h(tp), tname.as_bytes()).unwrap();
        let moved: Vec<(String, Kind)> =
            self.m.ns.iter().filter(|(k, _)| *k == from || k.starts_with(&format!("{from}/"))).map(|(k, v)| (k.clone(), v.clone())).collect();
        self.m.ns.remove(to);
        for (k, v) in moved {
            self.m.ns.remove(&k);
            let nk = format!("{to}{}", &k[from.len()..]);
            if let Some(h) = self.handles.remove(&k) {
                self.handles.insert(nk.clone(), h);
            }
            self.m.ns.insert(nk, v);
        }
        self.done();
    }

    fn link(&mut self, from: &str, to: &str) {
        let (tp, tname) = parent_of(to);
        self.fs.link(&self.h(from), &self.h(tp), tname.as_bytes()).unwrap();
        let k = self.m.ns[from].clone();
        self.handles.insert(to.into(), self.h(from));
        self.m.ns.insert(to.into(), k);
        self.done();
    }

    fn volume(&mut self, path: &str) {
        self.mkdir(path);
        self.fs.set_quota(&self.h(path), 1 << 20).unwrap();
        self.done();
    }

    fn remove_tree(&mut self, path: &str) {
        let (p, n) = parent_of(path);
        self.fs.remove_tree(&self.h(p), n.as_bytes()).unwrap();
        let pre = format!("{path}/");
        self.m.ns.retain(|k, _| k != path && !k.starts_with(&pre));
        self.handles.retain(|k, _| k != path && !k.starts_with(&pre));
        self.done();
    }
}

fn workload(run: &mut Run) {
    for r in 0..4 {
        let d = format!("/d{r}");
        run.mkdir(&d);
        run.create(&format!("{d}/a"));
        run.create(&format!("{d}/b"));
        run.write(&format!("{d}/a"), 0, 10_000, true);
        run.write(&format!("{d}/b"), 4096 * (r as u64), 9000, false);
        run.write(&format!("{d}/b"), 100, 300, false);
        run.commit(&format!("{d}/b"));
        run.write(&format!("{d}/a"), 5000, 20_000, false);
        run.create(&format!("{d}/c"));
        run.write(&format!("{d}/c"), 0, 12_288, true);
        // Rename over an existing file: b's blocks go, c's name goes.
        run.rename(&format!("{d}/c"), &format!("{d}/b"));
        run.commit(&format!("{d}/a"));
        run.truncate(&format!("{d}/a"), 4500);
        run.write(&format!("{d}/a"), 8192, 4096, true);
        run.chmod(&format!("{d}/a"));
        run.link(&format!("{d}/a"), &format!("{d}/hard"));
        run.symlink(&format!("{d}/sym"), "a");
        run.mkdir(&format!("{d}/sub"));
        run.create(&format!("{d}/sub/x"));
        run.write(&format!("{d}/sub/x"), 0, 5000, false);
        run.remove(&format!("{d}/sub/x"));
        run.rmdir(&format!("{d}/sub"));
        run.remove(&format!("{d}/a"));
        run.write(&format!("{d}/hard"), 0, 4096, true);
        // Freed blocks are reused by a new file: it must never show the
        // old owners' bytes.
        run.create(&format!("{d}/reuse"));
        run.write(&format!("{d}/reuse"), 0, 40_960, false);
        if r % 2 == 0 {
            run.commit(&format!("{d}/reuse"));
        }
        let v = format!("/vol{r}");
        run.volume(&v);
        run.create(&format!("{v}/f"));
        run.write(&format!("{v}/f"), 0, 16_384, true);
        run.mkdir(&format!("{v}/in"));
        run.create(&format!("{v}/in/g"));
        run.write(&format!("{v}/in/g"), 0, 8192, false);
        if r > 0 {
            run.remove_tree(&format!("/vol{}", r - 1));
        }
        run.rename(&format!("{d}/reuse"), &format!("/moved{r}"));
    }
}

/// What a recovered file system holds: path → kind, and file contents by
/// inode, with hard links as groups.
fn walk(fs: &DiskFs) -> (BTreeMap<String, (FileType, u64)>, HashMap<u64, Vec<u8>>, HashMap<String, Vec<u8>>) {
    let mut ns = BTreeMap::new();
    let mut data = HashMap::new();
    let mut links = HashMap::new();
    let mut stack = vec![(String::new(), fs.root(EXPORT).unwrap())];
    while let Some((path, dir)) = stack.pop() {
        let mut ents = Vec::new();
        fs.readdir(&dir, 0, &mut |e| {
            ents.push((String::from_utf8(e.name.to_vec()).unwrap(), e.fh, e.attr));
            true
        })
        .unwrap();
        for (name, fh, a) in ents {
            let p = format!("{path}/{name}");
            ns.insert(p.clone(), (a.ftype, a.fileid));
            match a.ftype {
                FileType::Directory => stack.push((p, fh)),
                FileType::Regular => {
                    let mut b = vec![0u8; a.size as usize];
                    let (n, _) = fs.read(&fh, 0, &mut b).unwrap();
                    assert_eq!(n, b.len());
                    data.insert(a.fileid, b);
                }
                FileType::Symlink => {
                    links.insert(p, fs.readlink(&fh).unwrap());
                }
                _ => {}
            }
        }
    }
    (ns, data, links)
}

/// Canonical hard-link groups: each path → the smallest path of its group.
fn groups<K: std::hash::Hash + Eq + Clone>(paths: impl Iterator<Item = (String, K)>) -> BTreeMap<String, String> {
    let mut by: HashMap<K, Vec<String>> = HashMap::new();
    for (p, k) in paths {
        by.entry(k).or_default().push(p);
    }
    let mut out = BTreeMap::new();
    for (_, mut ps) in by {
        ps.sort();
        for p in &ps {
            out.insert(p.clone(), ps[0].clone());
        }
    }
    out
}

fn namespace_matches(m: &Model, ns: &BTreeMap<String, (FileType, u64)>, links: &HashMap<String, Vec<u8>>) -> bool {
    if m.ns.len() != ns.len() {
        return false;
    }
    for (p, k) in &m.ns {
        let Some((t, _)) = ns.get(p) else { return false };
        let ok = match k {
            Kind::Dir => *t == FileType::Directory,
            Kind::File(_) => *t == FileType::Regular,
            Kind::Link(target) => *t == FileType::Symlink && links.get(p) == Some(target),
        };
        if !ok {
            return false;
        }
    }
    let mg = groups(m.ns.iter().filter_map(|(p, k)| if let Kind::File(id) = k { Some((p.clone(), *id)) } else { None }));
    let rg = groups(ns.iter().filter(|(_, (t, _))| *t == FileType::Regular).map(|(p, (_, ino))| (p.clone(), *ino)));
    mg == rg
}

/// Every byte of `got` is one the model allows for file `id` across states
/// `lo..=hi`: durable then, or written to it unstably, or zero past what
/// was durable.
fn content_ok(states: &[(Model, usize)], lo: usize, hi: usize, id: u32, got: &[u8]) -> Result<(), String> {
    let fms: Vec<&FileModel> = states[lo..=hi].iter().filter_map(|(m, _)| m.files.get(&id)).collect();
    let len_min = fms.iter().map(|f| f.durable.len()).min().unwrap_or(0);
    let len_max = fms.iter().map(|f| f.current.len().max(f.durable.len())).max().unwrap_or(0);
    if got.len() < len_min.min(got.len()) || got.len() > len_max {
        return Err(format!("file {id}: size {} outside {len_min}..={len_max}", got.len()));
    }
    for (i, &b) in got.iter().enumerate() {
        let ok = fms.iter().any(|f| {
            (i < f.durable.len() && f.durable[i] == b)
                || (b == 0 && i >= f.durable.len())
                || f.unstable.iter().any(|(o, d)| i as u64 >= *o && (i as u64) < o + d.len() as u64 && d[i - *o as usize] == b)
        });
        if !ok {
            return Err(format!("file {id}: byte {i} is {b:#x}, which nothing wrote there"));
        }
    }
    Ok(())
}

/// `DISKFS_CRASH_DEVICE`: check every image on a real device instead of in
/// memory (`vfio:ADDR` through the userspace NVMe driver, or a file or block
/// device through io_uring) — the same states, recovered from a device type's
/// own I/O path. The device's first `BLOCKS` blocks are overwritten.
fn real_device() -> Option<&'static (Device, block::BufPool)> {
    static DEV: std::sync::OnceLock<Option<(Device, block::BufPool)>> = std::sync::OnceLock::new();
    DEV.get_or_init(|| {
        let spec = std::env::var("DISKFS_CRASH_DEVICE").ok().filter(|s| !s.is_empty())?;
        let dev: Device = match spec.strip_prefix("vfio:") {
            Some(addr) => Arc::new(nvme::open_pci(addr, &nvme::Options::default()).unwrap_or_else(|e| panic!("DISKFS_CRASH_DEVICE: {e}"))),
            None => Arc::new(
                block::uring::UringDevice::open(&block::uring::UringOptions::new(&spec)).unwrap_or_else(|e| panic!("DISKFS_CRASH_DEVICE: {e}")),
            ),
        };
        assert!(dev.info().blocks >= BLOCKS, "DISKFS_CRASH_DEVICE {spec}: fewer than {BLOCKS} blocks");
        let pool = block::BufPool::new(block::PoolConfig { buf_bytes: 4096, bufs_max: 2, hugepages: block::Hugepages::Off }).unwrap();
        println!("crash states are checked on {spec} ({})", dev.info().name);
        Some((dev, pool))
    })
    .as_ref()
}

/// The device to recover `img` from: in memory, or the real device with the
/// image written onto it (zeroed first, then every non-zero block).
fn image_device(img: &Image) -> Device {
    let Some((dev, pool)) = real_device() else { return Arc::new(MemDevice::from_image("crash", img.clone())) };
    let mut q = dev.queue(0, 4).unwrap();
    block::sync::write_zeroes(&mut *q, 0, BLOCKS).unwrap();
    for (lba, data) in img.nonzero_blocks() {
        block::sync::write(&mut *q, pool, lba, data).unwrap();
    }
    block::sync::flush(&mut *q).unwrap();
    dev.clone()
}

fn check_image(img: Image, states: &[(Model, usize)], k: usize, label: &str) {
    let dev = image_device(&img);
    let rep = diskfs::fsck::check(vec![dev]).unwrap();
    assert!(rep.clean(), "{label}: fsck: {:?}", rep.violations);
    let dev = image_device(&img);
    let fs = DiskFs::open(vec![dev], &Options { io_buffers: 4, ..Options::new(EXPORT, false) }).unwrap_or_else(|e| panic!("{label}: recovery: {e}"));
    let (ns, data, links) = walk(&fs);
    // Operations acknowledged durable at flush point k must be there;
    // operations after the one that saw flush k+1 cannot be.
    let lo = states.iter().rposition(|(_, f)| *f <= k).unwrap_or(0);
    let hi = states.iter().position(|(_, f)| *f > k).unwrap_or(states.len() - 1);
    let j = (lo..=hi).find(|&j| namespace_matches(&states[j].0, &ns, &links));
    let Some(j) = j else {
        panic!("{label}: recovered namespace matches no state between operations {lo} and {hi}:\n{ns:?}");
    };
    for (p, k) in &states[j].0.ns {
        if let Kind::File(id) = k {
            let ino = ns[p].1;
            content_ok(states, lo, hi, *id, &data[&ino]).unwrap_or_else(|e| panic!("{label}: {p}: {e}"));
        }
    }
}

#[test]
fn crash_states_recover_to_what_was_acknowledged() {
    let seeds: u64 = std::env::var("DISKFS_CRASH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(14);
    let mem = Arc::new(MemDevice::new("crash", BLOCKS));
    diskfs::format(vec![mem.clone() as Device], EXPORT, false).unwrap();
    let base = mem.snapshot();
    let rec = Arc::new(RecordingDevice::new(mem.clone()));
    let fs = DiskFs::open(vec![rec.clone() as Device], &Options { io_buffers: 4, ..Options::new(EXPORT, false) }).unwrap();
    let mut run = Run { fs: &fs, rec: &rec, m: Model::default(), trace: Trace { states: Vec::new() }, handles: HashMap::new(), rng: SeededRng::new(42) };
    run.m.ns.clear();
    run.done();
    workload(&mut run);
    let states = run.trace.states;
    drop(fs);
    let recording = rec.recording();
    let points = recording.flush_points();
    assert!(points > 100, "the workload flushed only {points} times");
    let mut images = 0u64;
    for k in 0..=points {
        check_image(recording.image_at_flush(&base, k), &states, k, &format!("flush point {k}"));
        images += 1;
        for s in 0..seeds {
            let seed = k as u64 * 1_000_003 + s;
            check_image(recording.crash_image(&base, k, seed), &states, k, &format!("flush point {k}, seed {seed}"));
            images += 1;
        }
    }
    println!("crash states: {images} images from {points} flush points ({} operations), all recovered to an acknowledged state", states.len() - 1);
    assert!(images >= 2000 || seeds < 14, "only {images} crash images");
}
