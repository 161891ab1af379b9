//! loom models of the shared-memory doorbell protocol (link/shm/region.rs): the arm/ring
//! handshake between a sleeping receiver and a sender, and the publication of CDC frames through
//! the lap mark in each frame's first word. loom explores every interleaving the C11 memory model allows; a lost wake-up shows
//! as a deadlock (the receiver sleeps while a frame waits), a read of unpublished data as a
//! failed assertion.
//!
//! The model mirrors the protocol step for step with loom's atomics (the real code runs on raw
//! shared memory, which loom cannot instrument):
//! - a frame is two words here: its body, and its first word, which holds the lap mark;
//! - receiver, before sleeping: `armed = epoch` (SeqCst), fence(SeqCst), re-check the next
//!   frame's first word for its mark (every load of the peer's read-only region is relaxed, with
//!   an acquire fence after it);
//! - sender: the body (relaxed), then the first word with the mark (Release), fence(SeqCst),
//!   load `armed`, ring the eventfd when it sees an epoch it has not rung for;
//! - the eventfd is a counter under a mutex with a condition variable.

use loom::sync::atomic::{fence, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// The lap mark of every frame here: both lie in the ring's first lap.
const MARK: u64 = 1;

struct Shared {
    /// The frames' bodies.
    frames: [AtomicU64; 2],
    /// The frames' first words: `MARK` once written.
    heads: [AtomicU64; 2],
    armed: AtomicU64,
    doorbell: Mutex<u64>,
    rung: Condvar,
}

fn receiver(s: &Shared, frames: u64) -> Vec<u64> {
    let mut consumed = 0;
    let mut epoch = 0;
    let mut got = Vec::new();
    while consumed < frames {
        // The peer's region is read-only here: a relaxed load, then an acquire fence.
        let head = s.heads[consumed as usize].load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if head == MARK {
            // Written before the first word (Release/Acquire): must be the written value.
            got.push(s.frames[consumed as usize].load(Ordering::Relaxed));
            consumed += 1;
            continue;
        }
        // Arm, then re-check; sleep only if nothing arrived meanwhile.
        epoch += 1;
        s.armed.store(epoch, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let head = s.heads[consumed as usize].load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if head == MARK {
            s.armed.store(0, Ordering::SeqCst);
            continue;
        }
        let mut count = s.doorbell.lock().unwrap();
        while *count == 0 {
            count = s.rung.wait(count).unwrap();
        }
        *count = 0;
        drop(count);
        s.armed.store(0, Ordering::Relaxed);
    }
    got
}

fn sender(s: &Shared, frames: u64) {
    let mut rung_epoch = 0;
    for n in 0..frames {
        s.frames[n as usize].store(100 + n, Ordering::Relaxed);
        s.heads[n as usize].store(MARK, Ordering::Release);
        fence(Ordering::SeqCst);
        let epoch = s.armed.load(Ordering::Relaxed);
        if epoch != 0 && epoch != rung_epoch {
            rung_epoch = epoch;
            *s.doorbell.lock().unwrap() += 1;
            s.rung.notify_one();
        }
    }
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        frames: [AtomicU64::new(0), AtomicU64::new(0)],
        heads: [AtomicU64::new(0), AtomicU64::new(0)],
        armed: AtomicU64::new(0),
        doorbell: Mutex::new(0),
        rung: Condvar::new(),
    })
}

#[test]
fn one_frame_is_never_missed() {
    loom::model(|| {
        let s = shared();
        let s2 = s.clone();
        let t = thread::spawn(move || sender(&s2, 1));
        assert_eq!(receiver(&s, 1), vec![100]);
        t.join().unwrap();
    });
}

#[test]
fn two_frames_one_doorbell_per_sleep() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let s = shared();
        let s2 = s.clone();
        let t = thread::spawn(move || sender(&s2, 2));
        assert_eq!(receiver(&s, 2), vec![100, 101]);
        t.join().unwrap();
    });
}
