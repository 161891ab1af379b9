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

/// One slot used for two laps: the writer reuses it only once the reader's consumer count says
/// the first frame was read (the count stored with Release after the copy, loaded relaxed with
/// an acquire fence, as `CdcRx::pop` and `CdcTx::push` do), and the reader takes the slot for
/// the second frame only when it holds the second lap's mark. So the reader never takes the
/// first frame twice, and never gets the second lap's body under the first lap's mark.
#[test]
fn a_slot_is_reused_only_after_its_frame_was_read() {
    struct Slot {
        head: AtomicU64,
        body: AtomicU64,
        cons: AtomicU64,
    }
    // In a ring of one slot, frame `n` is lap `n`: its mark is `n % 255 + 1`.
    let mark = |n: u64| n % 255 + 1;
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let s = Arc::new(Slot { head: AtomicU64::new(0), body: AtomicU64::new(0), cons: AtomicU64::new(0) });
        let w = s.clone();
        let t = thread::spawn(move || {
            for n in 0..2u64 {
                // One slot: frame n needs the reader to have consumed n frames.
                while w.cons.load(Ordering::Relaxed) < n {
                    thread::yield_now();
                }
                fence(Ordering::Acquire);
                w.body.store(100 + n, Ordering::Relaxed);
                w.head.store(mark(n), Ordering::Release);
            }
        });
        let mut got = Vec::new();
        let mut cons = 0;
        while cons < 2 {
            if s.head.load(Ordering::Relaxed) == mark(cons) {
                fence(Ordering::Acquire);
                got.push(s.body.load(Ordering::Relaxed));
                cons += 1;
                s.cons.store(cons, Ordering::Release);
            } else {
                thread::yield_now();
            }
        }
        assert_eq!(got, vec![100, 101]);
        t.join().unwrap();
    });
}
