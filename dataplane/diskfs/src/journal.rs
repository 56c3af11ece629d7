//! Format, recovery and the intent log's writer.
//!
//! Device 0 holds the log and two checkpoint areas (FORMAT.md). A
//! checkpoint is the whole metadata state as records, written into the
//! area of its epoch's parity; the log after it holds that epoch's
//! changes, one unit (one or more blocks, written and recovered whole)
//! per group commit. Recovery takes the newest complete checkpoint and
//! replays its epoch's log until the first unit that is missing, torn,
//! stale (another epoch) or not chained to the one before.

use block::BLOCK_BYTES;

use crate::dev::{Devs, BUF_BLOCKS};
use crate::format::{self, BlockFault, Header, Kind, Super, PAYLOAD_BYTES};
use crate::meta::{self, Rec, State};

/// Smallest device 0 (superblock, log, checkpoints and some data).
pub const DEV0_BLOCKS_MIN: u64 = 512;
/// Smallest further device.
pub const DEV_BLOCKS_MIN: u64 = 16;

/// Why a set of devices cannot be mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// No diskfs format on any device (blank): format it.
    Blank,
    /// A structure fails its checks: the device, the byte offset, what.
    Corrupt { device: String, offset: u64, what: String },
    Other(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Blank => f.write_str("no diskfs format on the devices"),
            LoadError::Corrupt { device, offset, what } => write!(f, "device {device}, byte offset {offset}: {what}"),
            LoadError::Other(s) => f.write_str(s),
        }
    }
}

fn corrupt(devs: &Devs, d: usize, lba: u64, what: impl Into<String>) -> LoadError {
    LoadError::Corrupt { device: devs.name(d).to_string(), offset: lba * BLOCK_BYTES as u64, what: what.into() }
}

fn io(devs: &Devs, d: usize, e: block::BlockError) -> LoadError {
    let _ = devs;
    let _ = d;
    LoadError::Other(format!("diskfs: {e}"))
}

pub fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&vfs::random_verifier());
    b[8..].copy_from_slice(&vfs::random_verifier());
    b
}

pub fn uuid_str(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// Read every device's superblock: `Ok(None)` for a device with none.
pub fn read_supers(devs: &Devs) -> Result<Vec<Option<Super>>, LoadError> {
    let mut out = Vec::new();
    for d in 0..devs.devs.len() {
        let mut b = vec![0u8; BLOCK_BYTES];
        devs.read(d, 0, &mut b).map_err(|e| io(devs, d, e))?;
        match Super::decode(&b) {
            Ok(s) => out.push(Some(s)),
            Err(BlockFault::NotMetadata) => out.push(None),
            Err(f) => return Err(corrupt(devs, d, 0, format!("superblock: {f}"))),
        }
    }
    Ok(out)
}

/// Check the superblocks describe exactly these devices, in this order.
pub fn check_supers(devs: &Devs, supers: &[Option<Super>]) -> Result<Vec<Super>, LoadError> {
    if supers.iter().all(|s| s.is_none()) {
        return Err(LoadError::Blank);
    }
    let first = supers.iter().flatten().next().copied().expect("one is formatted");
    for (d, s) in supers.iter().enumerate() {
        if let Some(s) = s.filter(|s| s.cluster_uuid != first.cluster_uuid) {
            return Err(LoadError::Other(format!(
                "diskfs: device {} holds another file system (cluster {}, not {}); \
                 format it with `chimera-mkfs --force` only if its data may be destroyed",
                devs.name(d),
                uuid_str(&s.cluster_uuid),
                uuid_str(&first.cluster_uuid)
            )));
        }
    }
    let mut out = Vec::new();
    for (d, s) in supers.iter().enumerate() {
        let name = devs.name(d);
        let Some(s) = s else {
            return Err(LoadError::Other(format!(
                "diskfs: device {name} (position {d}) holds no diskfs format while the others do (cluster {}); \
                 list the devices this file system was formatted with, or format them all together",
                uuid_str(&first.cluster_uuid)
            )));
        };
        if s.device_count as usize != supers.len() || s.device_index as usize != d {
            return Err(LoadError::Other(format!(
                "diskfs: device {name} was formatted as device {} of {}, but is listed at position {d} of {}; list the devices in their format order",
                s.device_index,
                s.device_count,
                supers.len()
            )));
        }
        let blocks = devs.devs[d].info().blocks;
        if s.device_blocks > blocks {
            return Err(LoadError::Other(format!(
                "diskfs: device {name} was formatted with {} blocks but has only {blocks} now",
                s.device_blocks
            )));
        }
        out.push(*s);
    }
    Ok(out)
}

/// Lay out and write a new, empty file system (root directory only).
pub fn format(devs: &Devs, export_id: u32, force: bool) -> Result<Vec<Super>, String> {
    let n = devs.devs.len();
    if n == 0 {
        return Err("diskfs: no devices".into());
    }
    if n > u16::MAX as usize {
        return Err("diskfs: too many devices".into());
    }
    let supers = match read_supers(devs) {
        Ok(s) => s,
        Err(LoadError::Corrupt { .. }) if force => vec![None; n],
        Err(e) => return Err(format!("diskfs: {e} (format with --force to overwrite it)")),
    };
    if !force {
        if let Some((d, s)) = supers.iter().enumerate().find_map(|(d, s)| s.map(|s| (d, s))) {
            return Err(format!(
                "diskfs: device {} already holds a diskfs file system (cluster {}); refusing to format it (--force destroys its data)",
                devs.name(d),
                uuid_str(&s.cluster_uuid)
            ));
        }
    }
    let blocks0 = devs.devs[0].info().blocks;
    if blocks0 < DEV0_BLOCKS_MIN {
        return Err(format!(
            "diskfs: device {} holds {} bytes; the first device needs at least {} bytes",
            devs.name(0),
            blocks0 * BLOCK_BYTES as u64,
            DEV0_BLOCKS_MIN * BLOCK_BYTES as u64
        ));
    }
    for d in 1..n {
        let b = devs.devs[d].info().blocks;
        if b < DEV_BLOCKS_MIN {
            return Err(format!("diskfs: device {} holds {} bytes; at least {} needed", devs.name(d), b * BLOCK_BYTES as u64, DEV_BLOCKS_MIN * BLOCK_BYTES as u64));
        }
        if devs.devs[d].info().read_only {
            return Err(format!("diskfs: device {} is read-only", devs.name(d)));
        }
    }
    if devs.devs[0].info().read_only {
        return Err(format!("diskfs: device {} is read-only", devs.name(0)));
    }
    let log_blocks = (blocks0 / 32).clamp(64, 16384);
    let ckpt_blocks = (blocks0 / 16).clamp(64, 65536);
    let cluster = random16();
    let now = vfs::Time::now().sec as u64;
    let mut out = Vec::new();
    for d in 0..n {
        let blocks = devs.devs[d].info().blocks;
        let s = if d == 0 {
            Super {
                cluster_uuid: cluster,
                device_uuid: random16(),
                device_index: 0,
                device_count: n as u32,
                device_blocks: blocks,
                log_start: 1,
                log_blocks,
                ckpt_start: [1 + log_blocks, 1 + log_blocks + ckpt_blocks],
                ckpt_blocks,
                data_start: 1 + log_blocks + 2 * ckpt_blocks,
                export_id,
                created_sec: now,
            }
        } else {
            Super {
                cluster_uuid: cluster,
                device_uuid: random16(),
                device_index: d as u32,
                device_count: n as u32,
                device_blocks: blocks,
                log_start: 0,
                log_blocks: 0,
                ckpt_start: [0, 0],
                ckpt_blocks: 0,
                data_start: 1,
                export_id,
                created_sec: now,
            }
        };
        out.push(s);
    }
    let s0 = out[0];
    // Clear what an earlier format may have left where the log and the
    // checkpoint headers start, so none of it is taken for ours.
    let zero = vec![0u8; BLOCK_BYTES];
    for lba in [s0.log_start, s0.ckpt_start[0], s0.ckpt_start[1]] {
        devs.write(0, lba, &zero).map_err(|e| format!("diskfs: {e}"))?;
    }
    let mut st = State::new();
    let now = vfs::Time::now();
    let root = meta::InodeRec {
        ino: meta::ROOT_INO,
        gen: meta::ROOT_GEN,
        ftype: vfs::FileType::Directory,
        mode: 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        size: 0,
        rdev: (0, 0),
        atime: now,
        mtime: now,
        ctime: now,
        change: 1,
        volume: 0,
        quota: 0,
        parent: meta::ROOT_INO,
        tree: 0,
        verf: [0; 8],
        target: Vec::new(),
    };
    st.apply(&Rec::InodePut(root), &mut Vec::new()).expect("root fits an empty state");
    let mut bytes = Vec::new();
    st.snapshot(&mut bytes);
    write_checkpoint(devs, &s0, 1, &bytes).map_err(|e| format!("diskfs: {e}"))?;
    for (d, s) in out.iter().enumerate() {
        devs.write(d, 0, &s.encode()).map_err(|e| format!("diskfs: {e}"))?;
    }
    devs.flush_all().map_err(|e| format!("diskfs: {e}"))?;
    Ok(out)
}

fn blocks_for(bytes: usize) -> u64 {
    (bytes.div_ceil(PAYLOAD_BYTES)).max(1) as u64
}

/// Seal `payload` into `n` blocks of a stream starting at `lba`.
fn seal_stream(kind: Kind, lba: u64, epoch: u64, seq: u64, prev: u32, payload: &[u8]) -> (Vec<u8>, u32) {
    let n = blocks_for(payload.len());
    let mut out = vec![0u8; n as usize * BLOCK_BYTES];
    let mut prev = prev;
    for i in 0..n as usize {
        let part = &payload[(i * PAYLOAD_BYTES).min(payload.len())..((i + 1) * PAYLOAD_BYTES).min(payload.len())];
        let b = &mut out[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES];
        b[format::HEADER_BYTES..format::HEADER_BYTES + part.len()].copy_from_slice(part);
        let h = Header {
            kind,
            device: 0,
            lba: lba + i as u64,
            epoch,
            seq: seq + i as u64,
            unit_index: i as u32,
            unit_blocks: n as u32,
            payload_len: part.len() as u32,
            prev,
        };
        prev = format::seal(b, &h);
    }
    (out, prev)
}

/// Write checkpoint `epoch` (the whole state as `bytes`) into its area and
/// flush. The metadata area is full when it does not fit.
pub fn write_checkpoint(devs: &Devs, s0: &Super, epoch: u64, bytes: &[u8]) -> Result<(), String> {
    let n = blocks_for(bytes.len());
    if n > s0.ckpt_blocks {
        return Err(format!(
            "metadata ({} bytes) no longer fits a checkpoint area ({} bytes)",
            bytes.len(),
            s0.ckpt_blocks * PAYLOAD_BYTES as u64
        ));
    }
    let lba = s0.ckpt_start[(epoch % 2) as usize];
    let (blocks, _) = seal_stream(Kind::Checkpoint, lba, epoch, 0, 0, bytes);
    devs.write(0, lba, &blocks).map_err(|e| e.to_string())?;
    devs.flush(0).map_err(|e| e.to_string())
}

/// The log's write position.
#[derive(Debug, Clone, Copy)]
pub struct LogPos {
    pub epoch: u64,
    /// Next block of the log to write (0-based).
    pub pos: u64,
    /// CRC of the last block written (0 at the start of an epoch).
    pub prev: u32,
}

/// Append one unit (records of one or more transactions) and flush.
/// `Ok(false)`: it does not fit the log's remaining room (checkpoint).
pub fn append(devs: &Devs, s0: &Super, lp: &mut LogPos, payload: &[u8]) -> Result<bool, String> {
    let n = blocks_for(payload.len());
    if lp.pos + n > s0.log_blocks {
        return Ok(false);
    }
    let lba = s0.log_start + lp.pos;
    let (blocks, last) = seal_stream(Kind::Log, lba, lp.epoch, lp.pos, lp.prev, payload);
    devs.write(0, lba, &blocks).map_err(|e| e.to_string())?;
    devs.flush(0).map_err(|e| e.to_string())?;
    lp.pos += n;
    lp.prev = last;
    Ok(true)
}

/// What recovery found.
pub struct Loaded {
    pub st: State,
    pub log: LogPos,
    /// Log units replayed, and the checkpoint's size in blocks.
    pub units: u64,
    pub ckpt_blocks: u64,
}

fn read_blocks(devs: &Devs, lba: u64, n: u64) -> Result<Vec<u8>, LoadError> {
    let mut b = vec![0u8; n as usize * BLOCK_BYTES];
    devs.read(0, lba, &mut b).map_err(|e| io(devs, 0, e))?;
    Ok(b)
}

/// Blocks of device 0's log read ahead in one request while recovering.
struct Window<'a> {
    devs: &'a Devs,
    /// First block past the log.
    end: u64,
    start: u64,
    buf: Vec<u8>,
}

impl Window<'_> {
    /// `n` blocks at `lba` (read ahead up to `SCAN_BLOCKS` at a time).
    fn get(&mut self, lba: u64, n: u64) -> Result<&[u8], LoadError> {
        let have = (self.buf.len() / BLOCK_BYTES) as u64;
        if lba < self.start || lba + n > self.start + have {
            let len = n.max(SCAN_BLOCKS as u64).min(self.end.saturating_sub(lba)).max(n);
            self.buf = read_blocks(self.devs, lba, len)?;
            self.start = lba;
        }
        let off = ((lba - self.start) as usize) * BLOCK_BYTES;
        Ok(&self.buf[off..off + n as usize * BLOCK_BYTES])
    }
}

/// Check a stream unit of `n` blocks read at `lba` (`raw`); `Ok(None)`
/// when any block is not this unit's (missing, stale, torn); corruption is
/// an error.
#[allow(clippy::too_many_arguments)]
fn read_unit(devs: &Devs, raw: &[u8], kind: Kind, lba: u64, epoch: u64, seq: u64, prev: u32, first: &Header) -> Result<Option<(Vec<u8>, u32)>, LoadError> {
    let n = first.unit_blocks as u64;
    let mut payload = Vec::with_capacity(n as usize * PAYLOAD_BYTES);
    let mut prev = prev;
    for i in 0..n {
        let b = &raw[i as usize * BLOCK_BYTES..(i as usize + 1) * BLOCK_BYTES];
        let (h, crc) = match format::open(b, 0, lba + i) {
            Ok(x) => x,
            Err(BlockFault::Checksum) if kind == Kind::Checkpoint => {
                return Err(corrupt(devs, 0, lba + i, format!("checkpoint block {i}: checksum mismatch")))
            }
            Err(_) => return Ok(None),
        };
        if h.kind != kind || h.epoch != epoch || h.seq != seq + i || h.unit_index != i as u32 || h.unit_blocks != n as u32 || h.prev != prev {
            return Ok(None);
        }
        payload.extend_from_slice(&b[format::HEADER_BYTES..format::HEADER_BYTES + h.payload_len as usize]);
        prev = crc;
    }
    Ok(Some((payload, prev)))
}

/// Recover: newest complete checkpoint, then its epoch's log.
pub fn load(devs: &Devs, s0: &Super) -> Result<Loaded, LoadError> {
    let mut cands = Vec::new();
    for area in 0..2 {
        let lba = s0.ckpt_start[area];
        let b = read_blocks(devs, lba, 1)?;
        match format::open(&b, 0, lba) {
            Ok((h, _)) if h.kind == Kind::Checkpoint && h.seq == 0 && h.unit_index == 0 && h.epoch % 2 == area as u64 => {
                if h.unit_blocks as u64 > s0.ckpt_blocks {
                    return Err(corrupt(devs, 0, lba, "checkpoint longer than its area"));
                }
                cands.push((h, lba))
            }
            Ok(_) | Err(BlockFault::NotMetadata) => {}
            Err(f) => return Err(corrupt(devs, 0, lba, format!("checkpoint header: {f}"))),
        }
    }
    cands.sort_by_key(|(h, _)| std::cmp::Reverse(h.epoch));
    let mut chosen = None;
    for (h, lba) in &cands {
        let raw = read_blocks(devs, *lba, h.unit_blocks as u64)?;
        if let Some((payload, _)) = read_unit(devs, &raw, Kind::Checkpoint, *lba, h.epoch, 0, 0, h)? {
            chosen = Some((*h, *lba, payload));
            break;
        }
    }
    let Some((ch, clba, payload)) = chosen else {
        return Err(corrupt(devs, 0, s0.ckpt_start[0], "no complete checkpoint in either area"));
    };
    let mut st = State::new();
    let recs = meta::decode_all(&payload).map_err(|e| corrupt(devs, 0, clba, format!("checkpoint: {e}")))?;
    let mut freed = Vec::new();
    for r in &recs {
        st.apply(r, &mut freed).map_err(|e| corrupt(devs, 0, clba, format!("checkpoint: {e}")))?;
    }
    // The log of this epoch.
    let epoch = ch.epoch;
    let mut pos = 0u64;
    let mut prev = 0u32;
    let mut units = 0u64;
    let mut win = Window { devs, end: s0.log_start + s0.log_blocks, start: 0, buf: Vec::new() };
    while pos < s0.log_blocks {
        let lba = s0.log_start + pos;
        let h = match format::open(win.get(lba, 1)?, 0, lba) {
            Ok((h, _)) => h,
            Err(BlockFault::Checksum) => {
                // Torn tail, or corruption in the middle: the latter has a
                // valid block of this epoch right after it.
                if pos + 1 < s0.log_blocks {
                    if let Ok((nh, _)) = format::open(win.get(lba + 1, 1)?, 0, lba + 1) {
                        if nh.kind == Kind::Log && nh.epoch == epoch && nh.seq == pos + 1 {
                            return Err(corrupt(devs, 0, lba, "log record block: checksum mismatch (valid log follows it)"));
                        }
                    }
                }
                break;
            }
            Err(_) => break,
        };
        if h.kind != Kind::Log || h.epoch != epoch || h.seq != pos || h.unit_index != 0 || h.prev != prev {
            break;
        }
        if pos + h.unit_blocks as u64 > s0.log_blocks || h.unit_blocks == 0 {
            break;
        }
        let raw = win.get(lba, h.unit_blocks as u64)?.to_vec();
        let Some((payload, last)) = read_unit(devs, &raw, Kind::Log, lba, epoch, pos, prev, &h)? else { break };
        let recs = meta::decode_all(&payload).map_err(|e| corrupt(devs, 0, lba, format!("log unit: {e}")))?;
        for r in &recs {
            st.apply(r, &mut freed).map_err(|e| corrupt(devs, 0, lba, format!("log unit: {e}")))?;
        }
        units += 1;
        pos += h.unit_blocks as u64;
        prev = last;
    }
    // Extents replayed are logged by definition.
    Ok(Loaded { st, log: LogPos { epoch, pos, prev }, units, ckpt_blocks: ch.unit_blocks as u64 })
}

/// Blocks per read while scanning the log at recovery.
pub const SCAN_BLOCKS: usize = BUF_BLOCKS;
