//! The on-disk structures (FORMAT.md describes them for people): the block
//! header every metadata block carries, the superblock, and CRC-32C.

use block::BLOCK_BYTES;

/// "CHMD": every metadata block starts with it.
pub const MAGIC: u32 = 0x4348_4d44;
pub const FORMAT_VERSION: u16 = 1;
pub const HEADER_BYTES: usize = 56;
/// Payload bytes per metadata block.
pub const PAYLOAD_BYTES: usize = BLOCK_BYTES - HEADER_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    Super = 1,
    Log = 2,
    Checkpoint = 3,
}

impl Kind {
    fn from_u16(v: u16) -> Option<Kind> {
        match v {
            1 => Some(Kind::Super),
            2 => Some(Kind::Log),
            3 => Some(Kind::Checkpoint),
            _ => None,
        }
    }
}

/// The header of a metadata block. `lba` and `device` are the block's own
/// address (a misdirected write is detected); `epoch` is the checkpoint
/// generation the block belongs to; `seq` its position in its stream (log
/// or checkpoint); a unit of `unit_blocks` blocks is written and recovered
/// whole, `unit_index` is this block's place in it; `prev` is the CRC of
/// the block before it in the stream (0 for the first), which chains the
/// log so a stale block left from an earlier run is never taken as next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub device: u32,
    pub lba: u64,
    pub epoch: u64,
    pub seq: u64,
    pub unit_index: u32,
    pub unit_blocks: u32,
    pub payload_len: u32,
    pub prev: u32,
}

/// Why a block is not a valid metadata block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFault {
    /// No magic: never written as metadata (or zeroed).
    NotMetadata,
    /// Magic present, checksum wrong: corruption (or a torn write).
    Checksum,
    /// Checksum right, but the block names another address: misdirected.
    Misplaced { device: u32, lba: u64 },
    /// Version or kind this build does not know.
    Unknown,
}

impl std::fmt::Display for BlockFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockFault::NotMetadata => f.write_str("not a metadata block (no magic)"),
            BlockFault::Checksum => f.write_str("checksum mismatch"),
            BlockFault::Misplaced { device, lba } => write!(f, "block claims to be device {device} block {lba} (misdirected write)"),
            BlockFault::Unknown => f.write_str("unknown format version or block kind"),
        }
    }
}

pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
pub fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
pub fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Seal a block: write `h` and the CRC over the whole block (CRC field
/// zero while computing). Returns the CRC.
pub fn seal(block: &mut [u8], h: &Header) -> u32 {
    assert_eq!(block.len(), BLOCK_BYTES);
    put_u32(block, 0, MAGIC);
    put_u16(block, 4, h.kind as u16);
    put_u16(block, 6, FORMAT_VERSION);
    put_u32(block, 8, 0);
    put_u32(block, 12, h.device);
    put_u64(block, 16, h.lba);
    put_u64(block, 24, h.epoch);
    put_u64(block, 32, h.seq);
    put_u32(block, 40, h.unit_index);
    put_u32(block, 44, h.unit_blocks);
    put_u32(block, 48, h.payload_len);
    put_u32(block, 52, h.prev);
    let crc = crc32c(block);
    put_u32(block, 8, crc);
    crc
}

/// Check a block read from `device`/`lba`: magic, checksum, own address.
/// Returns the header and the block's CRC.
pub fn open(block: &[u8], device: u32, lba: u64) -> Result<(Header, u32), BlockFault> {
    if block.len() != BLOCK_BYTES || get_u32(block, 0) != MAGIC {
        return Err(BlockFault::NotMetadata);
    }
    let stored = get_u32(block, 8);
    let mut c = Crc::new();
    c.update(&block[..8]);
    c.update(&[0; 4]);
    c.update(&block[12..]);
    if c.finish() != stored {
        return Err(BlockFault::Checksum);
    }
    let kind = Kind::from_u16(get_u16(block, 4)).ok_or(BlockFault::Unknown)?;
    if get_u16(block, 6) != FORMAT_VERSION {
        return Err(BlockFault::Unknown);
    }
    let h = Header {
        kind,
        device: get_u32(block, 12),
        lba: get_u64(block, 16),
        epoch: get_u64(block, 24),
        seq: get_u64(block, 32),
        unit_index: get_u32(block, 40),
        unit_blocks: get_u32(block, 44),
        payload_len: get_u32(block, 48),
        prev: get_u32(block, 52),
    };
    if h.device != device || h.lba != lba {
        return Err(BlockFault::Misplaced { device: h.device, lba: h.lba });
    }
    if h.payload_len as usize > PAYLOAD_BYTES {
        return Err(BlockFault::Unknown);
    }
    Ok((h, stored))
}

/// The superblock (block 0 of every device). Written once, at format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Super {
    pub cluster_uuid: [u8; 16],
    pub device_uuid: [u8; 16],
    pub device_index: u32,
    pub device_count: u32,
    pub device_blocks: u64,
    /// Log and checkpoint areas (device 0 only; 0 elsewhere).
    pub log_start: u64,
    pub log_blocks: u64,
    pub ckpt_start: [u64; 2],
    pub ckpt_blocks: u64,
    /// First data block; data runs to `device_blocks`.
    pub data_start: u64,
    pub export_id: u32,
    pub created_sec: u64,
}

impl Super {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES];
        let p = HEADER_BYTES;
        b[p..p + 16].copy_from_slice(&self.cluster_uuid);
        b[p + 16..p + 32].copy_from_slice(&self.device_uuid);
        put_u32(&mut b, p + 32, self.device_index);
        put_u32(&mut b, p + 36, self.device_count);
        put_u64(&mut b, p + 40, self.device_blocks);
        put_u64(&mut b, p + 48, self.log_start);
        put_u64(&mut b, p + 56, self.log_blocks);
        put_u64(&mut b, p + 64, self.ckpt_start[0]);
        put_u64(&mut b, p + 72, self.ckpt_start[1]);
        put_u64(&mut b, p + 80, self.ckpt_blocks);
        put_u64(&mut b, p + 88, self.data_start);
        put_u32(&mut b, p + 96, self.export_id);
        put_u64(&mut b, p + 104, self.created_sec);
        let h = Header {
            kind: Kind::Super,
            device: self.device_index,
            lba: 0,
            epoch: 0,
            seq: 0,
            unit_index: 0,
            unit_blocks: 1,
            payload_len: 112,
            prev: 0,
        };
        seal(&mut b, &h);
        b
    }

    /// Decode block 0 of the device at config position `device`. The
    /// header's own device index is checked by the caller against the
    /// position (devices may be listed in another order than formatted).
    pub fn decode(b: &[u8]) -> Result<Super, BlockFault> {
        if b.len() != BLOCK_BYTES || get_u32(b, 0) != MAGIC {
            return Err(BlockFault::NotMetadata);
        }
        let claimed = get_u32(b, 12);
        let (h, _) = open(b, claimed, 0)?;
        if h.kind != Kind::Super {
            return Err(BlockFault::Unknown);
        }
        let p = HEADER_BYTES;
        Ok(Super {
            cluster_uuid: b[p..p + 16].try_into().unwrap(),
            device_uuid: b[p + 16..p + 32].try_into().unwrap(),
            device_index: get_u32(b, p + 32),
            device_count: get_u32(b, p + 36),
            device_blocks: get_u64(b, p + 40),
            log_start: get_u64(b, p + 48),
            log_blocks: get_u64(b, p + 56),
            ckpt_start: [get_u64(b, p + 64), get_u64(b, p + 72)],
            ckpt_blocks: get_u64(b, p + 80),
            data_start: get_u64(b, p + 88),
            export_id: get_u32(b, p + 96),
            created_sec: get_u64(b, p + 104),
        })
    }
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = Crc::new();
    c.update(data);
    c.finish()
}

pub struct Crc(u32);

const fn make_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}
static TABLE: [u32; 256] = make_table();

impl Crc {
    pub fn new() -> Crc {
        Crc(!0)
    }
    pub fn update(&mut self, data: &[u8]) {
        let mut c = self.0;
        for &b in data {
            c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
        }
        self.0 = c;
    }
    pub fn finish(&self) -> u32 {
        !self.0
    }
}

impl Default for Crc {
    fn default() -> Self {
        Crc::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_value() {
        // The check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn seal_and_open() {
        let mut b = vec![0u8; BLOCK_BYTES];
        let h = Header { kind: Kind::Log, device: 0, lba: 9, epoch: 3, seq: 2, unit_index: 0, unit_blocks: 1, payload_len: 5, prev: 7 };
        seal(&mut b, &h);
        assert_eq!(open(&b, 0, 9).unwrap().0, h);
        assert_eq!(open(&b, 0, 10), Err(BlockFault::Misplaced { device: 0, lba: 9 }));
        b[100] ^= 1;
        assert_eq!(open(&b, 0, 9), Err(BlockFault::Checksum));
        assert_eq!(open(&[0u8; BLOCK_BYTES], 0, 9), Err(BlockFault::NotMetadata));
    }
}
