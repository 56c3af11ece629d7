//! Blocking helpers for tools and tests (mkfs, fsck, test setup): one
//! operation at a time through the same queue the core loops use. Never
//! call them on a core loop.

use crate::error::{BlockError, ErrorKind};
use crate::{BlockQueue, BufPool, Completion, Op, Rejected, BLOCK_BYTES};

/// Submit `op` and wait for its completion. The queue must be idle, so the
/// completion that comes back is this one.
pub fn run(q: &mut dyn BlockQueue, op: Op) -> Completion {
    assert_eq!(q.inflight(), 0, "sync helpers need an idle queue");
    let token = u64::MAX;
    if let Err(r) = q.submit(op, token) {
        return match r {
            Rejected::Invalid(op, e) => Completion { token, result: Err(e), buf: op.into_buf() },
            Rejected::Busy(_) => unreachable!("an idle queue has room"),
        };
    }
    let mut done = Vec::with_capacity(1);
    while done.is_empty() {
        q.wait(&mut done);
    }
    assert_eq!(done.len(), 1);
    done.pop().expect("one completion")
}

fn chunks(q: &dyn BlockQueue, pool: &BufPool, lba: u64, bytes: usize) -> Result<usize, BlockError> {
    let info = q.info();
    let offset = Some(lba.saturating_mul(BLOCK_BYTES as u64));
    if bytes % BLOCK_BYTES != 0 {
        return Err(BlockError::new(&info.name, crate::OpKind::Read, offset, ErrorKind::BadRequest { why: "length not a multiple of 4096" }));
    }
    if pool.bufs_free() == 0 {
        return Err(BlockError::new(&info.name, crate::OpKind::Read, offset, ErrorKind::BadRequest { why: "no free buffer in the pool" }));
    }
    Ok(pool.buf_bytes())
}

/// Read `out.len()` bytes (whole blocks) from block `lba`.
pub fn read(q: &mut dyn BlockQueue, pool: &BufPool, lba: u64, out: &mut [u8]) -> Result<(), BlockError> {
    let step = chunks(q, pool, lba, out.len())?;
    for (i, part) in out.chunks_mut(step).enumerate() {
        let buf = pool.get().expect("checked free above; one at a time");
        let blocks = (part.len() / BLOCK_BYTES) as u32;
        let at = lba + (i * step / BLOCK_BYTES) as u64;
        let c = run(q, Op::Read { lba: at, blocks, buf });
        c.result?;
        part.copy_from_slice(&c.buf.expect("a read returns its buffer")[..part.len()]);
    }
    Ok(())
}

/// Write `data` (whole blocks) at block `lba`.
pub fn write(q: &mut dyn BlockQueue, pool: &BufPool, lba: u64, data: &[u8]) -> Result<(), BlockError> {
    let step = chunks(q, pool, lba, data.len())?;
    for (i, part) in data.chunks(step).enumerate() {
        let mut buf = pool.get().expect("checked free above; one at a time");
        buf[..part.len()].copy_from_slice(part);
        let blocks = (part.len() / BLOCK_BYTES) as u32;
        let at = lba + (i * step / BLOCK_BYTES) as u64;
        run(q, Op::Write { lba: at, blocks, buf }).result?;
    }
    Ok(())
}

pub fn flush(q: &mut dyn BlockQueue) -> Result<(), BlockError> {
    run(q, Op::Flush).result
}

pub fn write_zeroes(q: &mut dyn BlockQueue, lba: u64, blocks: u64) -> Result<(), BlockError> {
    run(q, Op::WriteZeroes { lba, blocks }).result
}
