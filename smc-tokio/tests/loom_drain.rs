//! loom model of drain-before-fail (smc/group.rs `LinkGroup::drain` and `fail`, link/shm's
//! side channel): when the peer process goes away, every CDC message it published before
//! reaches its connection before the connection learns the end, however the dispatching
//! tasks interleave.
//!
//! The model mirrors the code step for step with loom's primitives:
//! - the peer publishes frames (a frame's body relaxed, then its first word with the lap mark
//!   Release, as `CdcTx::push`)
//!   and then exits: its side channel closes (Release here; in the kernel, the close of a dead
//!   process's descriptors happens after all its stores, and our read of the EOF is a system
//!   call that synchronizes with it);
//! - an application task takes the fast path (`LinkGroup::progress`; before it, a look at the
//!   next frame without a lock may skip it, which only leaves more to the driver): `try_lock` on
//!   the dispatch lock, pop what is published (each frame's first word relaxed, then an acquire
//!   fence once it holds the mark, as `CdcRx::pop`), and dispatch each frame to the connection
//!   under that same lock;
//! - or an application task that holds its connection's lock takes its own frame
//!   (`SmcConn::take_own_frame`, `LinkGroup::dispatch_own`): `try_lock` on the dispatch lock,
//!   pop the next frame if it is there and apply it under the connection lock it holds, then
//!   let both go and dispatch what is behind as above;
//! - the driver sees the side channel's EOF, drains (`LinkGroup::drain`: the dispatch lock
//!   taken blocking, pop and dispatch until empty), then fails the group (`fail`: the
//!   connection is marked ended).
//!
//! The dispatch lock is a flag taken with a compare-exchange here (Acquire, let go with a Release
//! store; waited for by yielding), as a mutex is underneath: loom 0.7's own mutex takes a
//! `try_lock` that fails, in a thread that holds another lock, for a deadlock.
//!
//! The assertion: when the connection is marked ended, it has received every frame the peer
//! published, in order. The variant that drains with `try_lock` (as `progress` does) misses
//! frames popped by a concurrent dispatcher that has not delivered them yet; loom finds that
//! interleaving.

use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

const FRAMES: u64 = 2;

struct Conn {
    /// Frames delivered (their payloads, in order).
    got: Vec<u64>,
    ended: bool,
}

/// The lap mark of every frame here: all lie in the ring's first lap.
const MARK: u64 = 1;

struct Shared {
    /// The frames' bodies.
    frames: [AtomicU64; FRAMES as usize],
    /// The frames' first words: `MARK` once written.
    heads: [AtomicU64; FRAMES as usize],
    side_closed: AtomicBool,
    /// The dispatch lock (`true`: held), which guards our consumer count (`cons`), as
    /// `LinkGroup::dispatch` guards `CdcRx`.
    dispatch: AtomicBool,
    cons: AtomicU64,
    conn: Mutex<Conn>,
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        frames: [AtomicU64::new(0), AtomicU64::new(0)],
        heads: [AtomicU64::new(0), AtomicU64::new(0)],
        side_closed: AtomicBool::new(false),
        dispatch: AtomicBool::new(false),
        cons: AtomicU64::new(0),
        conn: Mutex::new(Conn { got: Vec::new(), ended: false }),
    })
}

/// Takes the dispatch lock if it is free.
fn try_dispatch(s: &Shared) -> bool {
    s.dispatch.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
}

/// Takes the dispatch lock, waiting for it.
fn lock_dispatch(s: &Shared) {
    while !try_dispatch(s) {
        thread::yield_now();
    }
}

fn unlock_dispatch(s: &Shared) {
    s.dispatch.store(false, Ordering::Release);
}

/// Pops the next published frame, with the dispatch lock held.
fn pop_one(s: &Shared) -> Option<u64> {
    let cons = s.cons.load(Ordering::Relaxed);
    if cons < FRAMES && s.heads[cons as usize].load(Ordering::Relaxed) == MARK {
        fence(Ordering::Acquire);
        s.cons.store(cons + 1, Ordering::Relaxed);
        return Some(s.frames[cons as usize].load(Ordering::Relaxed));
    }
    None
}

/// Pops every published frame and dispatches it, with the dispatch lock held.
fn pop_and_dispatch(s: &Shared) {
    while let Some(v) = pop_one(s) {
        // Dispatch: the connection's state under its own lock (`SmcConn::on_cdc`).
        let mut c = s.conn.lock().unwrap();
        if !c.ended {
            c.got.push(v);
        }
    }
}

fn peer(s: &Shared) {
    for i in 0..FRAMES {
        s.frames[i as usize].store(100 + i, Ordering::Relaxed);
        s.heads[i as usize].store(MARK, Ordering::Release);
    }
    // The process exits: its side channel closes.
    s.side_closed.store(true, Ordering::Release);
}

fn app_fast_path(s: &Shared) {
    if try_dispatch(s) {
        pop_and_dispatch(s);
        unlock_dispatch(s);
    }
}

fn app_own_frame(s: &Shared) {
    let mut c = s.conn.lock().unwrap();
    if try_dispatch(s) {
        if let Some(v) = pop_one(s) {
            if !c.ended {
                c.got.push(v);
            }
        }
        unlock_dispatch(s);
    }
    drop(c);
    app_fast_path(s);
}

fn driver(s: &Shared, blocking_drain: bool) {
    // Wait for the side channel's EOF (the reactor's readiness; a spin in the model).
    while !s.side_closed.load(Ordering::Acquire) {
        thread::yield_now();
    }
    if blocking_drain {
        lock_dispatch(s);
        pop_and_dispatch(s);
        unlock_dispatch(s);
    } else if try_dispatch(s) {
        pop_and_dispatch(s);
        unlock_dispatch(s);
    }
    // fail(): the connection learns the end.
    let mut c = s.conn.lock().unwrap();
    c.ended = true;
    assert_eq!(c.got, vec![100, 101], "the connection ended before every published frame reached it");
}

fn model(blocking_drain: bool, own_frame: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let s = shared();
        let (p, a) = (s.clone(), s.clone());
        let peer_t = thread::spawn(move || peer(&p));
        let app_t = thread::spawn(move || if own_frame { app_own_frame(&a) } else { app_fast_path(&a) });
        driver(&s, blocking_drain);
        peer_t.join().unwrap();
        app_t.join().unwrap();
    });
}

#[test]
fn a_connection_ends_only_after_every_published_frame_reached_it() {
    model(true, false);
}

/// The same with a reader that takes its own frame under its connection's lock: its order
/// (connection lock, then the dispatch lock without waiting) cannot deadlock with the drain's,
/// and no frame overtakes another.
#[test]
fn a_reader_taking_its_own_frame_keeps_the_order_and_the_drain() {
    model(true, true);
}

/// The model can fail: draining the way the fast path dispatches (giving up when another task
/// holds the dispatch lock) ends the connection while that task still holds popped frames.
#[test]
#[should_panic(expected = "the connection ended before every published frame reached it")]
fn a_drain_that_skips_a_busy_dispatcher_loses_frames() {
    model(false, false);
}
