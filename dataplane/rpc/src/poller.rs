//! Work a core's loop polls beside its sockets: a backend that parked a
//! call on a device queue owned by this core (diskfs's READs) registers a
//! [`Poller`] on the core's thread, and the loop reaps it every turn, so
//! the I/O is submitted and completed on the core that decoded the call —
//! no thread hand-off on the way in or out.
//!
//! Only a thread that declared itself a polling loop ([`serve_on_this_thread`])
//! takes pollers; elsewhere [`available`] is false and a backend completes
//! its call some other way (its worker threads). Everything here is
//! per-thread: a poller is never touched by another thread.

use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::Rc;

/// Pollers one thread may hold (one per backend instance using the core).
pub const POLLERS_PER_THREAD_MAX: usize = 64;

pub trait Poller {
    /// Reap finished work and complete it; how many operations finished.
    /// Never blocks.
    fn poll(&mut self) -> usize;
    /// Whether operations are in flight (the loop must come back).
    fn busy(&self) -> bool;
    /// Descriptors (eventfds) that become readable when completions wait,
    /// for a loop about to sleep; a poller without them is polled by a
    /// loop that keeps spinning while it is busy.
    fn notify_fds(&self, out: &mut Vec<RawFd>);
    /// The poller's owner is gone and nothing is in flight: drop it.
    fn gone(&self) -> bool {
        false
    }
    /// Descriptors to wake the loop whenever it sleeps, busy or not (a
    /// transport's listener and completion channels, which take new work
    /// rather than finish old). The loop waits for them to become readable
    /// (poll, not read): the poller consumes what makes them so.
    fn wake_fds(&self, _out: &mut Vec<RawFd>) {}
    /// The loop is about to sleep: arm what wakes `wake_fds` (a completion
    /// queue's notification) and look once more for work that raced the
    /// arming. Work found: return true after doing it (the loop stays up).
    fn before_sleep(&mut self) -> bool {
        false
    }
}

pub type Shared = Rc<RefCell<dyn Poller>>;

thread_local! {
    static SERVING: Cell<bool> = const { Cell::new(false) };
    static POLLERS: RefCell<Vec<Shared>> = const { RefCell::new(Vec::new()) };
    /// Registered while `poll_all` runs; joined at its next call.
    static ADDED: RefCell<Vec<Shared>> = const { RefCell::new(Vec::new()) };
}

/// Declare the calling thread a loop that calls [`poll_all`] every turn.
pub fn serve_on_this_thread() {
    SERVING.with(|s| s.set(true));
}

/// Whether the calling thread polls pollers (a backend may park on it).
pub fn available() -> bool {
    SERVING.with(|s| s.get())
}

/// Register `p` with the calling thread's loop. Refused (false) when the
/// thread does not poll or already holds `POLLERS_PER_THREAD_MAX`.
pub fn register(p: Shared) -> bool {
    if !available() {
        return false;
    }
    let held = POLLERS.with(|v| v.try_borrow().map(|v| v.len()).unwrap_or(0)) + ADDED.with(|v| v.borrow().len());
    if held >= POLLERS_PER_THREAD_MAX {
        return false;
    }
    ADDED.with(|v| v.borrow_mut().push(p));
    true
}

/// What one turn of [`poll_all`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Operations completed this turn.
    pub completed: usize,
    /// Some poller still has operations in flight.
    pub busy: bool,
    /// A busy poller has no notify descriptor: do not sleep.
    pub spin: bool,
}

/// Poll every poller of the calling thread. `fds` receives the notify
/// descriptors of busy pollers (cleared first).
pub fn poll_all(fds: &mut Vec<RawFd>) -> Turn {
    fds.clear();
    let mut turn = Turn::default();
    let added = ADDED.with(|a| std::mem::take(&mut *a.borrow_mut()));
    POLLERS.with(|v| {
        if !added.is_empty() {
            v.borrow_mut().extend(added);
        }
        let mut gone = false;
        let v_ref = v.borrow();
        for p in v_ref.iter() {
            // A poller already borrowed is running on this thread's stack
            // (it completed a call whose reply re-entered it): skip it.
            let Ok(mut p) = p.try_borrow_mut() else { continue };
            turn.completed += p.poll();
            if p.busy() {
                turn.busy = true;
                let before = fds.len();
                p.notify_fds(fds);
                if fds.len() == before {
                    turn.spin = true;
                }
            } else if p.gone() {
                gone = true;
            }
        }
        drop(v_ref);
        if gone {
            v.borrow_mut().retain(|p| p.try_borrow().map(|p| !p.gone()).unwrap_or(true));
        }
    });
    turn
}

/// The descriptors every poller of the calling thread wants a sleeping
/// loop woken by (`Poller::wake_fds`; cleared first).
pub fn wake_fds_all(fds: &mut Vec<RawFd>) {
    fds.clear();
    POLLERS.with(|v| {
        for p in v.borrow().iter() {
            if let Ok(p) = p.try_borrow() {
                p.wake_fds(fds);
            }
        }
    });
}

/// Tell every poller of the calling thread its loop is about to sleep
/// (`Poller::before_sleep`); true when one of them found work instead.
pub fn before_sleep_all() -> bool {
    POLLERS.with(|v| {
        let mut found = false;
        for p in v.borrow().iter() {
            if let Ok(mut p) = p.try_borrow_mut() {
                found |= p.before_sleep();
            }
        }
        found
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count {
        left: usize,
        fd: Option<RawFd>,
    }

    impl Poller for Count {
        fn poll(&mut self) -> usize {
            if self.left > 0 {
                self.left -= 1;
                1
            } else {
                0
            }
        }
        fn busy(&self) -> bool {
            self.left > 0
        }
        fn notify_fds(&self, out: &mut Vec<RawFd>) {
            out.extend(self.fd);
        }
    }

    #[test]
    fn only_a_polling_thread_takes_pollers() {
        std::thread::spawn(|| {
            assert!(!available());
            assert!(!register(Rc::new(RefCell::new(Count { left: 1, fd: None }))));
            serve_on_this_thread();
            assert!(register(Rc::new(RefCell::new(Count { left: 2, fd: Some(7) }))));
            assert!(register(Rc::new(RefCell::new(Count { left: 1, fd: None }))));
            let mut fds = Vec::new();
            assert_eq!(poll_all(&mut fds), Turn { completed: 2, busy: true, spin: false });
            assert_eq!(fds, vec![7]);
            assert_eq!(poll_all(&mut fds), Turn { completed: 1, busy: false, spin: false });
            assert!(fds.is_empty());
            for _ in 2..POLLERS_PER_THREAD_MAX {
                assert!(register(Rc::new(RefCell::new(Count { left: 0, fd: None }))));
            }
            assert!(!register(Rc::new(RefCell::new(Count { left: 0, fd: None }))), "the bound holds");
        })
        .join()
        .unwrap();
    }

    struct Waker {
        fd: RawFd,
        armed: u32,
        race: bool,
    }

    impl Poller for Waker {
        fn poll(&mut self) -> usize {
            0
        }
        fn busy(&self) -> bool {
            false
        }
        fn notify_fds(&self, _out: &mut Vec<RawFd>) {}
        fn wake_fds(&self, out: &mut Vec<RawFd>) {
            out.push(self.fd);
        }
        fn before_sleep(&mut self) -> bool {
            self.armed += 1;
            std::mem::take(&mut self.race)
        }
    }

    #[test]
    fn an_idle_poller_names_its_wake_descriptors_and_is_told_before_sleep() {
        std::thread::spawn(|| {
            serve_on_this_thread();
            let w = Rc::new(RefCell::new(Waker { fd: 9, armed: 0, race: true }));
            assert!(register(w.clone()));
            let mut fds = vec![1, 2];
            // Joined at the first poll_all.
            assert_eq!(poll_all(&mut fds), Turn::default());
            assert!(fds.is_empty(), "an idle poller has no notify descriptors");
            wake_fds_all(&mut fds);
            assert_eq!(fds, vec![9]);
            assert!(before_sleep_all(), "work that raced the arming keeps the loop up");
            assert!(!before_sleep_all());
            assert_eq!(w.borrow().armed, 2);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_busy_poller_without_a_descriptor_keeps_the_loop_spinning() {
        std::thread::spawn(|| {
            serve_on_this_thread();
            assert!(register(Rc::new(RefCell::new(Count { left: 3, fd: None }))));
            let t = poll_all(&mut Vec::new());
            assert!(t.busy && t.spin);
        })
        .join()
        .unwrap();
    }
}
