//! Calls that complete later: the RPC side of asynchronous backends.
//!
//! A program whose backend must wait (a device read, a data server's reply)
//! parks the call instead of blocking the core: [`Parking::park`] hands the
//! transport the call's record and the program's own resume state (for a
//! COMPOUND, its position, filehandles and the reply so far) and returns a
//! [`Ticket`]. The program returns from `Program::call` at once; the core
//! keeps serving other calls. Whoever finishes the work — on any thread —
//! completes the ticket with a payload; the transport routes it back to the
//! core that parked the call, which runs the call again through
//! `Dispatcher::resume` with `CallContext::resumed` set: the program
//! re-reads its arguments from the kept record, takes the payload and
//! writes the reply. Replies of parked calls leave out of order (ONC RPC
//! matches them by xid).
//!
//! The transport bounds what it keeps (calls per connection and per core,
//! record bytes per core) and stops reading connections at those bounds,
//! so a slow backend pushes back on clients instead of growing memory.
//! Nothing here allocates unless a call actually parks.

use std::any::Any;
use std::cell::Cell;
use std::fmt;

/// What a parked call completes with (the program knows the concrete type).
pub type Payload = Box<dyn Any + Send>;

/// The transport's side: keeps parked calls and routes their completions
/// back to the core that parked them.
pub trait ParkSlot {
    /// Keep `record` (the whole call, header included) and `state` until
    /// the returned ticket completes. `None`: this transport cannot keep the
    /// call (the program must complete inline).
    fn park(&self, record: &[u8], state: &[u8]) -> Option<Ticket>;
}

/// Completes one parked call, exactly once, from any thread. Dropping a
/// ticket without completing it completes the call as cancelled (the
/// program answers an I/O error), so a lost completion never leaves a
/// client waiting forever.
pub struct Ticket {
    sink: Option<Box<dyn FnOnce(Option<Payload>) + Send>>,
}

impl Ticket {
    /// A ticket whose completion (or cancellation: `None`) calls `sink`.
    pub fn new(sink: impl FnOnce(Option<Payload>) + Send + 'static) -> Ticket {
        Ticket { sink: Some(Box::new(sink)) }
    }

    pub fn complete(mut self, payload: Payload) {
        let sink = self.sink.take().expect("ticket completes once");
        sink(Some(payload));
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(sink) = self.sink.take() {
            sink(None);
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Ticket")
    }
}

/// The dispatcher's view of one call's chance to park (`CallContext::park`).
pub struct Parking<'a> {
    slot: &'a dyn ParkSlot,
    record: &'a [u8],
    parked: Cell<bool>,
}

impl<'a> Parking<'a> {
    pub(crate) fn new(slot: &'a dyn ParkSlot, record: &'a [u8]) -> Self {
        Parking { slot, record, parked: Cell::new(false) }
    }

    /// Park the call with `state` for its resumption. At most once per
    /// call; once parked, whatever the program writes into the reply is
    /// discarded.
    pub fn park(&self, state: &[u8]) -> Option<Ticket> {
        assert!(!self.parked.get(), "a call parks at most once");
        let t = self.slot.park(self.record, state)?;
        self.parked.set(true);
        Some(t)
    }

    pub fn parked(&self) -> bool {
        self.parked.get()
    }
}

impl fmt::Debug for Parking<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Parking {{ parked: {} }}", self.parked.get())
    }
}

/// A transport's parked calls, bounded in count and in bytes kept: a slab
/// whose entries are named by (index, generation), so a completion that
/// arrives for an entry already gone (or reused) is recognised and dropped.
pub struct Table<T> {
    entries: Vec<Option<(T, usize)>>,
    gens: Vec<u32>,
    free: Vec<usize>,
    count: usize,
    bytes: usize,
    count_max: usize,
    bytes_max: usize,
    /// Set by the transport when it stopped reading at a bound (it reads
    /// again once a call leaves).
    pub stalled: bool,
}

impl<T> Table<T> {
    pub fn new(count_max: usize, bytes_max: usize) -> Self {
        Table { entries: Vec::new(), gens: Vec::new(), free: Vec::new(), count: 0, bytes: 0, count_max, bytes_max, stalled: false }
    }

    /// May another call keeping `bytes` park?
    pub fn has_room(&self, bytes: usize) -> bool {
        self.count < self.count_max && self.bytes + bytes <= self.bytes_max
    }

    /// At the count bound.
    pub fn full(&self) -> bool {
        self.count >= self.count_max
    }

    /// Calls kept now.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Keep `v`, counted as `bytes`; its (index, generation).
    pub fn insert(&mut self, v: T, bytes: usize) -> (usize, u32) {
        debug_assert!(self.count < self.count_max);
        self.count += 1;
        self.bytes += bytes;
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(None);
                self.gens.push(0);
                self.entries.len() - 1
            }
        };
        self.gens[i] = self.gens[i].wrapping_add(1);
        self.entries[i] = Some((v, bytes));
        (i, self.gens[i])
    }

    /// The entry `i` if it is still generation `gen`.
    pub fn get_mut(&mut self, i: usize, gen: u32) -> Option<&mut T> {
        match self.entries.get_mut(i) {
            Some(Some((v, _))) if self.gens[i] == gen => Some(v),
            _ => None,
        }
    }

    /// The entry `i`, whatever its generation.
    pub fn get(&self, i: usize) -> Option<&T> {
        self.entries.get(i).and_then(|e| e.as_ref()).map(|(v, _)| v)
    }

    /// Take entry `i` out (it must be present).
    pub fn remove(&mut self, i: usize) -> T {
        let (v, bytes) = self.entries[i].take().expect("parked entry present");
        self.count -= 1;
        self.bytes -= bytes;
        self.free.push(i);
        v
    }
}

/// A parked call running again with its completion.
#[derive(Clone, Copy)]
pub struct Resumed<'a> {
    /// What the program handed to `Parking::park`.
    pub state: &'a [u8],
    /// The ticket's payload; `None` when the ticket was dropped uncompleted.
    pub payload: Option<&'a (dyn Any + Send)>,
}

impl fmt::Debug for Resumed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Resumed {{ state: {} bytes, payload: {} }}", self.state.len(), self.payload.is_some())
    }
}

impl<'a> Resumed<'a> {
    /// The payload as `T`, or `None` (cancelled, or not a `T`).
    pub fn get<T: 'static>(&self) -> Option<&'a T> {
        self.payload.and_then(|p| p.downcast_ref::<T>())
    }
}

#[cfg(test)]
mod table_tests {
    use super::Table;

    #[test]
    fn bounded_and_generations_name_entries() {
        let mut t: Table<&str> = Table::new(2, 100);
        assert!(t.has_room(60) && !t.has_room(101));
        let (a, ga) = t.insert("a", 60);
        assert!(!t.has_room(41) && t.has_room(40));
        let (b, gb) = t.insert("b", 40);
        assert!(t.full() && !t.has_room(0) && t.len() == 2);
        assert_eq!(t.remove(a), "a");
        assert!(t.get_mut(a, ga).is_none(), "a removed entry is gone");
        let (c, gc) = t.insert("c", 10);
        assert_eq!(c, a, "the slot is reused");
        assert!(t.get_mut(a, ga).is_none(), "a late completion of the old entry misses the new one");
        assert_eq!(t.get_mut(c, gc).copied(), Some("c"));
        assert_eq!(t.get_mut(b, gb).copied(), Some("b"));
        t.remove(b);
        t.remove(c);
        assert!(t.is_empty() && t.has_room(100));
    }
}
