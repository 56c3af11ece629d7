//! Zero-copy replies. A program may lend shared, immutable buffers to its
//! reply instead of copying them into the reply buffer (NFS READ lends the
//! backend's file chunks): the pieces go on the wire at one position of the
//! reply, and the transport holds them until the reply is sent.
//!
//! One [`Lender`] per event loop collects the pieces of the call being
//! handled; the transport takes them with the reply ([`Lender::take`]) and
//! hands the emptied list back ([`Lender::recycle`]), so lending allocates
//! nothing per call once warm.
//!
//! A reply that copies its bulk data instead (a READ too small to lend, a
//! backend that cannot) marks where that data sits ([`Lender::mark_ddp`]):
//! RPC-over-RDMA moves exactly that item with RDMA Writes (RFC 8267's
//! DDP-eligible items: READ and READLINK data); TCP ignores the mark.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// Emptied piece lists kept for reuse, per event loop.
const SPARE_LISTS_MAX: usize = 256;

/// `len` bytes of `buf` from `at`.
#[derive(Debug, Clone)]
pub struct Piece {
    pub buf: Arc<[u8]>,
    pub at: usize,
    pub len: usize,
}

/// What one reply lent: `pieces`, `len` bytes in all, go on the wire at byte
/// `pos` of the reply record as the program wrote it (record mark included).
#[derive(Debug, Default)]
pub struct Lent {
    pub pos: usize,
    pub len: usize,
    pub pieces: Vec<Piece>,
}

/// Collects what the call being handled lends. Used from one thread.
#[derive(Debug, Default)]
pub struct Lender {
    cur: RefCell<Lent>,
    open: Cell<bool>,
    spare: RefCell<Vec<Vec<Piece>>>,
    ddp: Cell<Option<(usize, usize)>>,
}

impl Lender {
    pub fn new() -> Self {
        Self::default()
    }

    /// Start lending at byte `pos` of the reply being written. A call lends
    /// at one position at most.
    pub fn begin(&self, pos: usize) {
        assert!(!self.open.get(), "a reply lends at one position at most");
        let mut cur = self.cur.borrow_mut();
        debug_assert!(cur.pieces.is_empty());
        cur.pos = pos;
        cur.len = 0;
        self.open.set(true);
    }

    /// Lend `len` bytes of `buf` from `at` (after `begin`).
    pub fn push(&self, buf: &Arc<[u8]>, at: usize, len: usize) {
        assert!(self.open.get(), "push before begin");
        assert!(at.checked_add(len).is_some_and(|end| end <= buf.len()), "piece out of its buffer");
        if len == 0 {
            return;
        }
        let mut cur = self.cur.borrow_mut();
        cur.len += len;
        cur.pieces.push(Piece { buf: buf.clone(), at, len });
    }

    /// Bytes lent by the call being handled.
    pub fn lent_len(&self) -> usize {
        if self.open.get() {
            self.cur.borrow().len
        } else {
            0
        }
    }

    /// Drop what the call lent (it failed, or fell back to copying).
    pub fn discard(&self) {
        let mut cur = self.cur.borrow_mut();
        cur.pieces.clear();
        cur.len = 0;
        self.open.set(false);
    }

    /// The transport takes what the handled call lent, if anything.
    pub fn take(&self) -> Option<Lent> {
        if !self.open.replace(false) {
            return None;
        }
        let mut cur = self.cur.borrow_mut();
        let fresh = self.spare.borrow_mut().pop().unwrap_or_default();
        let lent = Lent { pos: cur.pos, len: cur.len, pieces: std::mem::replace(&mut cur.pieces, fresh) };
        cur.len = 0;
        Some(lent)
    }

    /// The reply being written holds its DDP-eligible data item (the bytes
    /// of a READ's or READLINK's opaque data, without the length word or the
    /// XDR pad) at `pos..pos + len` of the reply record.
    pub fn mark_ddp(&self, pos: usize, len: usize) {
        self.ddp.set(Some((pos, len)));
    }

    /// The transport takes the mark of the call just handled, if any.
    pub fn take_ddp(&self) -> Option<(usize, usize)> {
        self.ddp.take()
    }

    /// Give back a list taken with `take` once its reply was sent.
    pub fn recycle(&self, mut pieces: Vec<Piece>) {
        pieces.clear();
        let mut spare = self.spare.borrow_mut();
        if spare.len() < SPARE_LISTS_MAX {
            spare.push(pieces);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lend_take_recycle() {
        let l = Lender::new();
        assert!(l.take().is_none());
        let a: Arc<[u8]> = Arc::from(&b"hello world"[..]);
        l.begin(40);
        l.push(&a, 6, 5);
        l.push(&a, 0, 0);
        l.push(&a, 0, 5);
        assert_eq!(l.lent_len(), 10);
        let t = l.take().unwrap();
        assert_eq!((t.pos, t.len, t.pieces.len()), (40, 10, 2));
        assert_eq!(Arc::strong_count(&a), 3);
        assert!(l.take().is_none() && l.lent_len() == 0);
        l.recycle(t.pieces);
        assert_eq!(Arc::strong_count(&a), 1);
        l.begin(8);
        l.push(&a, 0, 1);
        l.discard();
        assert!(l.take().is_none());
        assert_eq!(Arc::strong_count(&a), 1);
        assert_eq!(l.take_ddp(), None);
        l.mark_ddp(120, 4096);
        assert_eq!((l.take_ddp(), l.take_ddp()), (Some((120, 4096)), None));
    }

    #[test]
    #[should_panic(expected = "piece out of its buffer")]
    fn pieces_stay_inside_their_buffer() {
        let l = Lender::new();
        let a: Arc<[u8]> = Arc::from(&b"abc"[..]);
        l.begin(0);
        l.push(&a, 2, 2);
    }
}
