//! The parts of the NVMe base specification (2.0) this driver uses:
//! controller registers, submission/completion queue entries, opcodes,
//! Identify fields and status codes. Nothing here touches hardware.

/// Controller registers (offsets into BAR0).
pub const REG_CAP: usize = 0x00;
pub const REG_VS: usize = 0x08;
pub const REG_CC: usize = 0x14;
pub const REG_CSTS: usize = 0x1c;
pub const REG_AQA: usize = 0x24;
pub const REG_ASQ: usize = 0x28;
pub const REG_ACQ: usize = 0x30;
/// Doorbells start here; their stride is `4 << CAP.DSTRD`.
pub const REG_DOORBELLS: usize = 0x1000;

pub const CC_EN: u32 = 1;
/// CC.IOSQES = 6 (64-byte entries), CC.IOCQES = 4 (16-byte), CSS = NVM,
/// MPS = 0 (4 KiB pages), round-robin arbitration.
pub const CC_IO_ENTRY_SIZES: u32 = (6 << 16) | (4 << 20);
pub const CSTS_RDY: u32 = 1;
pub const CSTS_CFS: u32 = 2;

pub const SQE_BYTES: usize = 64;
pub const CQE_BYTES: usize = 16;
pub const PAGE_BYTES: usize = 4096;

/// Fields of CAP.
#[derive(Debug, Clone, Copy)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum entries per queue (MQES is 0-based).
    pub fn mqes(self) -> u32 {
        (self.0 & 0xffff) as u32 + 1
    }
    /// Worst-case time for CSTS.RDY to change, in milliseconds (TO is in
    /// 500 ms units).
    pub fn timeout_ms(self) -> u64 {
        ((self.0 >> 24) & 0xff).max(1) * 500
    }
    /// Doorbell stride in bytes.
    pub fn doorbell_stride(self) -> usize {
        4 << ((self.0 >> 32) & 0xf)
    }
    /// Whether the NVM command set is supported (CSS bit 0).
    pub fn nvm_command_set(self) -> bool {
        (self.0 >> 37) & 1 == 1
    }
    /// Smallest memory page size, bytes.
    pub fn mps_min_bytes(self) -> u64 {
        1 << (12 + ((self.0 >> 48) & 0xf))
    }
}

/// Admin opcodes.
pub const ADM_DELETE_SQ: u8 = 0x00;
pub const ADM_CREATE_SQ: u8 = 0x01;
pub const ADM_DELETE_CQ: u8 = 0x04;
pub const ADM_CREATE_CQ: u8 = 0x05;
pub const ADM_IDENTIFY: u8 = 0x06;
pub const ADM_ABORT: u8 = 0x08;
pub const ADM_SET_FEATURES: u8 = 0x09;
/// Feature: number of queues.
pub const FEAT_NUM_QUEUES: u32 = 0x07;
/// Identify CNS values.
pub const CNS_NAMESPACE: u32 = 0x00;
pub const CNS_CONTROLLER: u32 = 0x01;
pub const CNS_ACTIVE_NS_LIST: u32 = 0x02;

/// NVM I/O opcodes.
pub const IO_FLUSH: u8 = 0x00;
pub const IO_WRITE: u8 = 0x01;
pub const IO_READ: u8 = 0x02;
pub const IO_WRITE_ZEROES: u8 = 0x08;
pub const IO_DSM: u8 = 0x09;

/// ONCS (optional NVM command support) bits of Identify Controller.
pub const ONCS_DSM: u16 = 1 << 2;
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

/// A submission queue entry (64 bytes).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct Sqe {
    pub cdw0: u32,
    pub nsid: u32,
    pub rsvd: [u32; 2],
    pub mptr: u64,
    pub prp1: u64,
    pub prp2: u64,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

impl Sqe {
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        Sqe { cdw0: opcode as u32 | (cid as u32) << 16, ..Sqe::default() }
    }
    pub fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }
    pub fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }
    /// Starting LBA of an I/O command (CDW10-11).
    pub fn slba(&self) -> u64 {
        self.cdw10 as u64 | (self.cdw11 as u64) << 32
    }
    /// Number of logical blocks of an I/O command (NLB is 0-based).
    pub fn nlb(&self) -> u32 {
        (self.cdw12 & 0xffff) + 1
    }
}

/// A completion queue entry (16 bytes).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct Cqe {
    pub result: u32,
    pub rsvd: u32,
    /// SQ head pointer (15:0) and SQ identifier (31:16).
    pub sq: u32,
    /// Command identifier (15:0), phase tag (16), status (31:17).
    pub status_cid: u32,
}

impl Cqe {
    pub fn cid(&self) -> u16 {
        self.status_cid as u16
    }
    pub fn phase(&self) -> bool {
        (self.status_cid >> 16) & 1 == 1
    }
    /// Status field without the phase tag: SC (7:0), SCT (10:8), ...
    pub fn status(&self) -> u16 {
        (self.status_cid >> 17) as u16
    }
    pub fn sq_head(&self) -> u16 {
        self.sq as u16
    }
}

pub fn status_sct(status: u16) -> u8 {
    ((status >> 8) & 0x7) as u8
}
pub fn status_sc(status: u16) -> u8 {
    status as u8
}

/// Status codes the driver itself reports in place of a device's answer.
pub const STATUS_SUCCESS: u16 = 0;
/// Generic: command abort requested (also used for commands failed back
/// by a controller reset, with the timeout error in front of it).
pub const SC_ABORT_REQUESTED: u8 = 0x07;
pub const SC_INVALID_OPCODE: u8 = 0x01;
pub const SC_INVALID_FIELD: u8 = 0x02;
pub const SC_DATA_TRANSFER_ERROR: u8 = 0x04;
pub const SC_INTERNAL: u8 = 0x06;
pub const SC_INVALID_NAMESPACE: u8 = 0x0b;
pub const SC_LBA_OUT_OF_RANGE: u8 = 0x80;
pub const SC_CAPACITY_EXCEEDED: u8 = 0x81;
/// Command specific (SCT 1).
pub const SC_INVALID_QUEUE_ID: u8 = 0x01;
pub const SC_INVALID_QUEUE_SIZE: u8 = 0x02;

/// What the specification calls a status (the ones worth naming).
pub fn status_text(status: u16) -> &'static str {
    match (status_sct(status), status_sc(status)) {
        (0, 0x00) => "successful completion",
        (0, 0x01) => "invalid command opcode",
        (0, 0x02) => "invalid field in command",
        (0, 0x03) => "command ID conflict",
        (0, 0x04) => "data transfer error",
        (0, 0x05) => "commands aborted due to power loss notification",
        (0, 0x06) => "internal error",
        (0, 0x07) => "command abort requested",
        (0, 0x08) => "command aborted due to SQ deletion",
        (0, 0x0b) => "invalid namespace or format",
        (0, 0x80) => "LBA out of range",
        (0, 0x81) => "capacity exceeded",
        (0, 0x82) => "namespace not ready",
        (1, 0x01) => "invalid queue identifier",
        (1, 0x02) => "invalid queue size",
        (2, 0x80) => "write fault",
        (2, 0x81) => "unrecovered read error",
        (2, 0x86) => "access denied",
        (2, 0x87) => "deallocated or unwritten logical block",
        (7, _) => "path related status",
        _ => "other status",
    }
}

/// Identify Controller fields used here (byte offsets in the 4 KiB page).
pub mod idc {
    pub const SN: std::ops::Range<usize> = 4..24;
    pub const MN: std::ops::Range<usize> = 24..64;
    pub const FR: std::ops::Range<usize> = 64..72;
    pub const MDTS: usize = 77;
    pub const NN: usize = 516;
    pub const ONCS: usize = 520;
    pub const VWC: usize = 525;
    pub const SGLS: usize = 536;
}

/// Identify Namespace fields used here.
pub mod idn {
    pub const NSZE: usize = 0;
    pub const NLBAF: usize = 25;
    pub const FLBAS: usize = 26;
    pub const LBAF0: usize = 128;
}

pub fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// An ASCII identify field without its padding.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).trim_start().to_string()
}
