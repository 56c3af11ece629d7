//! Free space: per device, a map of free runs (start → length). Not stored
//! on disk: recovery rebuilds it as "every data block no file maps".

use std::collections::BTreeMap;

use crate::meta::{phys, phys_dev, phys_lba, Phys};

#[derive(Debug, Default)]
pub struct Alloc {
    devs: Vec<BTreeMap<u64, u64>>,
    free: u64,
    total: u64,
    /// Device the next allocation starts on (data spreads over all).
    next_dev: usize,
}

impl Alloc {
    /// Every block of `ranges[d]` (start, end) free on device `d`.
    pub fn new(ranges: &[(u64, u64)]) -> Alloc {
        let mut a = Alloc::default();
        for &(s, e) in ranges {
            let mut m = BTreeMap::new();
            if e > s {
                m.insert(s, e - s);
                a.free += e - s;
                a.total += e - s;
            }
            a.devs.push(m);
        }
        a
    }

    pub fn free_blocks(&self) -> u64 {
        self.free
    }
    pub fn total_blocks(&self) -> u64 {
        self.total
    }

    /// Take `p` out of the free map (recovery: it is mapped). False if it
    /// was not free (mapped twice, or outside the data area).
    pub fn take(&mut self, p: Phys) -> bool {
        let (d, lba) = (phys_dev(p) as usize, phys_lba(p));
        let Some(m) = self.devs.get_mut(d) else { return false };
        let Some((&s, &len)) = m.range(..=lba).next_back() else { return false };
        if lba >= s + len {
            return false;
        }
        m.remove(&s);
        if lba > s {
            m.insert(s, lba - s);
        }
        if lba + 1 < s + len {
            m.insert(lba + 1, s + len - lba - 1);
        }
        self.free -= 1;
        true
    }

    /// `n` blocks, as few runs as it can (first fit from a rotating
    /// device); `None` (nothing taken) when fewer than `n` are free.
    pub fn alloc(&mut self, n: u64) -> Option<Vec<(Phys, u64)>> {
        if n > self.free {
            return None;
        }
        let mut out = Vec::new();
        let mut left = n;
        let ndev = self.devs.len();
        for k in 0..ndev {
            let d = (self.next_dev + k) % ndev;
            let m = &mut self.devs[d];
            while left > 0 {
                // Prefer a run that holds everything left, else the first.
                let pick = m.iter().find(|(_, &len)| len >= left).or_else(|| m.iter().next()).map(|(&s, &l)| (s, l));
                let Some((s, len)) = pick else { break };
                let take = len.min(left);
                m.remove(&s);
                if take < len {
                    m.insert(s + take, len - take);
                }
                out.push((phys(d as u16, s), take));
                left -= take;
            }
            if left == 0 {
                break;
            }
        }
        self.next_dev = (self.next_dev + 1) % ndev.max(1);
        self.free -= n;
        Some(out)
    }

    /// Give one block back, merging with its neighbours.
    pub fn free(&mut self, p: Phys) {
        let (d, lba) = (phys_dev(p) as usize, phys_lba(p));
        let m = &mut self.devs[d];
        let mut start = lba;
        let mut len = 1;
        if let Some((&s, &l)) = m.range(..lba).next_back() {
            debug_assert!(s + l <= lba, "double free of device {d} block {lba}");
            if s + l == lba {
                m.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(&l) = m.get(&(lba + 1)) {
            m.remove(&(lba + 1));
            len += l;
        }
        m.insert(start, len);
        self.free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_take() {
        let mut a = Alloc::new(&[(10, 20), (1, 5)]);
        assert_eq!(a.free_blocks(), 14);
        let r = a.alloc(12).unwrap();
        assert_eq!(r.iter().map(|x| x.1).sum::<u64>(), 12);
        assert!(a.alloc(3).is_none());
        for (p, n) in r {
            for k in 0..n {
                a.free(p + k);
            }
        }
        assert_eq!(a.free_blocks(), 14);
        assert!(a.take(phys(0, 15)));
        assert!(!a.take(phys(0, 15)));
        assert!(!a.take(phys(0, 25)));
        a.free(phys(0, 15));
        assert_eq!(a.alloc(10).unwrap().iter().map(|x| x.1).sum::<u64>(), 10);
    }
}
