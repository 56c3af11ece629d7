//! Metadata durability that completes later: a protocol lets the backend
//! apply a change now and make it durable after the call returns, so a
//! core never waits for a log flush.
//!
//! NFSv3 metadata procedures and NFSv4 COMPOUNDs must not answer before
//! their changes are on the device (RFC 1813 §3.3; RFC 8881 §18). A backend
//! with an intent log (diskfs) applies a change in memory, appends it to
//! the log and, called inline, waits for the log's flush before it returns.
//! Inside [`deferring`], it instead records what must be flushed
//! ([`defer`]) and returns at once; the protocol then parks the call with
//! the reply it wrote and hands the [`Pending`] to a worker
//! ([`Pending::sync_later`]); the reply leaves when the flush is done. One
//! flush covers every change logged before it, so changes that wait
//! together are flushed together (group commit).
//!
//! A caller that cannot park (the call's transport keeps no parked calls, a
//! reply too large to keep) flushes inline with [`Pending::sync_now`]. A
//! `Pending` dropped unsynced flushes inline: nothing deferred is ever left
//! unflushed. Outside `deferring` (the admin API, NFSv4 internals, tests)
//! backends flush inline as before. The scope is per thread: a core's loop
//! runs one call at a time.

use crate::{VfsError, VfsResult};
use std::cell::RefCell;
use std::sync::Arc;

/// A backend's log: flushes everything up to a point, now or on a worker.
pub trait Durability: Send + Sync {
    /// Make every change up to `token` durable, waiting for it.
    fn sync_now(&self, token: u64) -> VfsResult<()>;
    /// Whether every change up to `token` is durable already (another
    /// call's flush covered it).
    fn is_durable(&self, token: u64) -> bool;
    /// Make every change up to `token` durable without waiting on this
    /// thread; `done` is called exactly once, from any thread.
    fn sync_later(&self, token: u64, done: Box<dyn FnOnce(VfsResult<()>) + Send>);
}

/// What a deferring call left to flush: the backend's log and the newest
/// change it logged.
pub struct Pending {
    log: Option<Arc<dyn Durability>>,
    token: u64,
}

impl Pending {
    /// Flush now, on this thread.
    pub fn sync_now(mut self) -> VfsResult<()> {
        let log = self.log.take().expect("a pending flush has its log");
        log.sync_now(self.token)
    }

    /// Flush on a worker; `done` gets the outcome, once.
    pub fn sync_later(mut self, done: Box<dyn FnOnce(VfsResult<()>) + Send>) {
        let log = self.log.take().expect("a pending flush has its log");
        log.sync_later(self.token, done)
    }

    /// Already flushed (by another call's flush): `sync_now` returns at
    /// once, nothing to park for.
    pub fn is_durable(&self) -> bool {
        self.log.as_ref().is_some_and(|l| l.is_durable(self.token))
    }

    /// The newest change it covers (for tests and logs).
    pub fn token(&self) -> u64 {
        self.token
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(log) = self.log.take() {
            if log.sync_now(self.token).is_err() {
                eprintln!("vfs: a deferred metadata flush failed after its call had ended");
            }
        }
    }
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pending {{ token: {} }}", self.token)
    }
}

enum Scope {
    /// No `deferring` on this thread: backends flush inline.
    Off,
    /// Inside `deferring`, nothing deferred yet.
    Open,
    Deferred(Pending),
}

thread_local! {
    static SCOPE: RefCell<Scope> = const { RefCell::new(Scope::Off) };
}

/// Restores the outer scope even if the closure panics.
struct Restore(Option<Scope>);

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(outer) = self.0.take() {
            SCOPE.with(|s| *s.borrow_mut() = outer);
        }
    }
}

/// Run `f` with metadata flushes deferred on this thread; returns its
/// result and what it left to flush (`None`: nothing, or the backend
/// flushed inline). Nested scopes each collect their own.
pub fn deferring<R>(f: impl FnOnce() -> R) -> (R, Option<Pending>) {
    let outer = SCOPE.with(|s| std::mem::replace(&mut *s.borrow_mut(), Scope::Open));
    let mut restore = Restore(Some(outer));
    let r = f();
    let outer = restore.0.take().expect("restored once");
    let mine = SCOPE.with(|s| std::mem::replace(&mut *s.borrow_mut(), outer));
    match mine {
        Scope::Deferred(p) => (r, Some(p)),
        _ => (r, None),
    }
}

/// Whether this thread is inside `deferring` (a backend may skip building
/// what `defer` needs when not).
pub fn active() -> bool {
    SCOPE.with(|s| !matches!(*s.borrow(), Scope::Off))
}

/// A backend's change up to `token` must be flushed before the call
/// answers. Inside `deferring`: recorded, `Ok(())` at once. Otherwise (or
/// when the scope already holds another backend's flush, which is flushed
/// first) the flush happens here and its outcome is returned.
pub fn defer(log: impl FnOnce() -> Arc<dyn Durability>, token: u64) -> VfsResult<()> {
    enum Then {
        Done,
        Inline(Arc<dyn Durability>),
    }
    let then = SCOPE.with(|s| {
        let mut s = s.borrow_mut();
        match &mut *s {
            Scope::Off => Then::Inline(log()),
            Scope::Open => {
                *s = Scope::Deferred(Pending { log: Some(log()), token });
                Then::Done
            }
            Scope::Deferred(p) => {
                let l = log();
                let same = p.log.as_ref().is_some_and(|have| std::ptr::addr_eq(Arc::as_ptr(have), Arc::as_ptr(&l)));
                if same {
                    p.token = p.token.max(token);
                    Then::Done
                } else {
                    // One call touching two logs (rare: the router keeps a
                    // call inside one mount): this one waits inline.
                    Then::Inline(l)
                }
            }
        }
    });
    match then {
        Then::Done => Ok(()),
        Then::Inline(l) => l.sync_now(token),
    }
}

/// The result a `sync_later` completion sends through a park ticket, from
/// the payload handed back: a missing payload (the ticket was cancelled)
/// or one of another type is an I/O error.
pub fn synced(payload: Option<&(dyn std::any::Any + Send)>) -> VfsResult<()> {
    match payload.and_then(|p| p.downcast_ref::<VfsResult<()>>()) {
        Some(r) => *r,
        None => Err(VfsError::Io),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log {
        now: Mutex<Vec<u64>>,
        later: Mutex<Vec<u64>>,
    }

    impl Durability for Log {
        fn sync_now(&self, token: u64) -> VfsResult<()> {
            self.now.lock().unwrap().push(token);
            if token == 666 {
                return Err(VfsError::Io);
            }
            Ok(())
        }
        fn is_durable(&self, token: u64) -> bool {
            self.now.lock().unwrap().iter().chain(self.later.lock().unwrap().iter()).any(|t| *t >= token)
        }
        fn sync_later(&self, token: u64, done: Box<dyn FnOnce(VfsResult<()>) + Send>) {
            self.later.lock().unwrap().push(token);
            done(Ok(()))
        }
    }

    #[test]
    fn outside_a_scope_flushes_inline_and_reports_the_outcome() {
        let log = Arc::new(Log::default());
        assert!(!active());
        assert_eq!(defer(|| log.clone(), 3), Ok(()));
        assert_eq!(defer(|| log.clone(), 666), Err(VfsError::Io));
        assert_eq!(*log.now.lock().unwrap(), vec![3, 666]);
    }

    #[test]
    fn a_scope_collects_the_newest_token_and_flushes_once() {
        let log = Arc::new(Log::default());
        let (r, p) = deferring(|| {
            assert!(active());
            defer(|| log.clone(), 5).unwrap();
            defer(|| log.clone(), 9).unwrap();
            defer(|| log.clone(), 7).unwrap();
            42
        });
        assert!(!active(), "the scope ends with the call");
        assert_eq!(r, 42);
        let p = p.expect("something to flush");
        assert_eq!(p.token(), 9);
        assert!(log.now.lock().unwrap().is_empty(), "nothing flushed inside the scope");
        let got = Arc::new(Mutex::new(None));
        let g = got.clone();
        p.sync_later(Box::new(move |r| *g.lock().unwrap() = Some(r)));
        assert_eq!(*log.later.lock().unwrap(), vec![9]);
        assert_eq!(*got.lock().unwrap(), Some(Ok(())));
        assert!(log.now.lock().unwrap().is_empty(), "handed on, not dropped");
    }

    #[test]
    fn a_second_log_in_one_scope_flushes_inline() {
        let (a, b) = (Arc::new(Log::default()), Arc::new(Log::default()));
        let (_, p) = deferring(|| {
            defer(|| a.clone(), 1).unwrap();
            defer(|| b.clone(), 2).unwrap();
        });
        assert_eq!(*b.now.lock().unwrap(), vec![2]);
        assert_eq!(p.unwrap().sync_now(), Ok(()));
        assert_eq!(*a.now.lock().unwrap(), vec![1]);
    }

    #[test]
    fn a_dropped_pending_flushes_and_nested_scopes_are_separate() {
        let log = Arc::new(Log::default());
        let (_, outer) = deferring(|| {
            defer(|| log.clone(), 1).unwrap();
            let (_, inner) = deferring(|| defer(|| log.clone(), 2).unwrap());
            assert_eq!(inner.expect("the inner scope's own").token(), 2);
            defer(|| log.clone(), 3).unwrap();
        });
        // The inner Pending was dropped unsynced: it flushed inline.
        assert_eq!(*log.now.lock().unwrap(), vec![2]);
        assert_eq!(outer.expect("the outer scope's").token(), 3);
        assert_eq!(*log.now.lock().unwrap(), vec![2, 3], "dropped: flushed inline");
        let (_, none) = deferring(|| ());
        assert!(none.is_none());
    }

    #[test]
    fn a_panic_inside_the_scope_ends_it() {
        let r = std::panic::catch_unwind(|| deferring(|| panic!("boom")));
        assert!(r.is_err());
        assert!(!active());
    }

    #[test]
    fn synced_reads_the_payload() {
        let ok: Box<dyn std::any::Any + Send> = Box::new(VfsResult::<()>::Ok(()));
        let bad: Box<dyn std::any::Any + Send> = Box::new(VfsResult::<()>::Err(VfsError::NoSpace));
        let other: Box<dyn std::any::Any + Send> = Box::new(7u32);
        assert_eq!(synced(Some(&*ok)), Ok(()));
        assert_eq!(synced(Some(&*bad)), Err(VfsError::NoSpace));
        assert_eq!(synced(Some(&*other)), Err(VfsError::Io));
        assert_eq!(synced(None), Err(VfsError::Io));
    }
}
