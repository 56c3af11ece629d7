//! Unstable writes not yet committed, shared by NFSv3 and NFSv4.1.
//!
//! Each write answered UNSTABLE keeps its range, the verifier it was
//! answered with and — while all files together stay within
//! `held_bytes_max` — a copy of its data. A COMMIT whose verifier differs
//! from a write's means the server restarted after that write and may have
//! lost it: the range is reported, and its held data can be sent again.

use crate::error::{Error, Result};
use std::collections::HashMap;

/// Copies of unstable write data kept for a resend, all files together:
/// beyond this the ranges are still reported but the caller must supply
/// the data again.
pub const HELD_BYTES_MAX_DEFAULT: usize = 64 << 20;

#[derive(Debug, Clone)]
pub(crate) struct Unstable {
    pub offset: u64,
    pub len: u32,
    pub verf: [u8; 8],
    pub data: Option<Vec<u8>>,
}

#[derive(Debug)]
pub(crate) struct Uncommitted {
    files: HashMap<Vec<u8>, Vec<Unstable>>,
    held_bytes: usize,
    pub held_bytes_max: usize,
}

impl Uncommitted {
    pub fn new() -> Uncommitted {
        Uncommitted { files: HashMap::new(), held_bytes: 0, held_bytes_max: HELD_BYTES_MAX_DEFAULT }
    }

    fn held(v: &[Unstable]) -> usize {
        v.iter().map(|u| u.data.as_ref().map_or(0, |d| d.len())).sum()
    }

    /// A WRITE of `data` at `offset` answered with `count`, `stable` and `verf`.
    pub fn written(&mut self, fh: &[u8], offset: u64, data: &[u8], count: u32, stable: bool, verf: [u8; 8]) {
        if count == 0 {
            return;
        }
        if stable {
            // Stored stably: uncommitted writes it covers need no resend.
            let end = offset + count as u64;
            if let Some(list) = self.files.get_mut(fh) {
                let (gone, keep): (Vec<Unstable>, Vec<Unstable>) =
                    std::mem::take(list).into_iter().partition(|u| u.offset >= offset && u.offset + u.len as u64 <= end);
                self.held_bytes -= Self::held(&gone);
                *list = keep;
                if list.is_empty() {
                    self.files.remove(fh);
                }
            }
            return;
        }
        let n = count as usize;
        let data = if self.held_bytes + n <= self.held_bytes_max {
            self.held_bytes += n;
            Some(data[..n].to_vec())
        } else {
            None
        };
        self.files.entry(fh.to_vec()).or_default().push(Unstable { offset, len: count, verf, data });
    }

    pub fn ranges(&self, fh: &[u8]) -> Vec<(u64, u32)> {
        self.files.get(fh).map(|v| v.iter().map(|u| (u.offset, u.len)).collect()).unwrap_or_default()
    }

    pub fn rebind(&mut self, old: &[u8], new: &[u8]) {
        if let Some(v) = self.files.remove(old) {
            self.files.entry(new.to_vec()).or_default().extend(v);
        }
    }

    /// A COMMIT of the whole file answered with `verf`.
    pub fn committed(&mut self, fh: &[u8], verf: [u8; 8]) -> Result<[u8; 8]> {
        let Some(list) = self.files.remove(fh) else { return Ok(verf) };
        // Writes that carried this verifier are committed now; the others
        // were answered by an earlier instance of the server.
        let (done, changed): (Vec<Unstable>, Vec<Unstable>) = list.into_iter().partition(|u| u.verf == verf);
        self.held_bytes -= Self::held(&done);
        if changed.is_empty() {
            return Ok(verf);
        }
        let ranges = changed.iter().map(|u| (u.offset, u.len)).collect();
        let resendable = changed.iter().all(|u| u.data.is_some());
        self.files.insert(fh.to_vec(), changed);
        Err(Error::VerifierChanged { ranges, resendable })
    }

    /// Take the held writes of `fh` out for a resend (ranges without data
    /// stay tracked); `give_back` returns those not sent.
    pub fn take_held(&mut self, fh: &[u8]) -> Vec<Unstable> {
        let Some(list) = self.files.remove(fh) else { return Vec::new() };
        let (held, lost): (Vec<Unstable>, Vec<Unstable>) = list.into_iter().partition(|u| u.data.is_some());
        if !lost.is_empty() {
            self.files.insert(fh.to_vec(), lost);
        }
        // The copies leave the bound now; each WRITE that succeeds holds its
        // data again under the new verifier.
        self.held_bytes -= Self::held(&held);
        held
    }

    pub fn give_back(&mut self, fh: &[u8], rest: Vec<Unstable>) {
        self.held_bytes += Self::held(&rest);
        self.files.entry(fh.to_vec()).or_default().extend(rest);
    }
}
