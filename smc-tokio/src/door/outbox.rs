//! The frames waiting to go out on one door connection, gathered into messages.
//!
//! Whoever has something to say on a door connection (a registration, a handshake's message,
//! a "no", a cancel) adds its frame to the connection's [`Outbox`], and the connection's
//! sender (a task of its own, `door::send_loop`) takes the messages out in order and sends each
//! with one system call. The first frame of a batch wakes the sender, and a runtime runs a
//! woken task after those that were ready before it (a current-thread runtime in order; the
//! sender yields once on a multi-threaded one, whose next task would be the one woken last),
//! so the frames that one turn of the runtime's tasks produced go out together: with 64
//! connection-per-request clients, one message instead of one per connection, each saving the
//! sender a send, the peer a read and, when it sleeps, a wake-up.
//!
//! Nothing here does I/O: the sender reports each message's fate ([`Outbox::sent`]), and the
//! frames' authors wait for the fate of the message their frame went into
//! ([`Outbox::poll_over`]). A message that could not be sent fails with every message after
//! it, queued then or later: the connection is of no more use for sending. Each message keeps
//! the time its first frame came ([`Taken::born`], which the authors pass in: the outbox reads
//! no clock), so that the sender bounds how long that frame's author waits, whatever waited
//! before it.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use tokio::time::Instant;

use crate::proto::door::{DOOR_BATCH_FRAMES, DOOR_MSG_MAX};

/// Messages an outbox holds unsent, at most. A peer that reads keeps a door connection's queue
/// short (a client's window of 64 registrations draws 128 answers, which the kernel's send
/// buffer holds), so the sender finds room at once and the outbox holds what one turn of the
/// runtime said, up to three messages (a window's Registers, Connected frames and Cancels). More
/// waits only behind a peer that stopped reading: the frame that would start a ninth message
/// fails the connection, as a message that finds no room for a second does, instead of holding
/// whatever a peer makes us say (a client that registers without reading draws a "no" per
/// registration).
const MAX_QUEUED: usize = 8;

/// How long a message takes frames after its first while the sender waits for room for an
/// earlier one: the sender bounds a message's send by its first frame's time (door's
/// `SEND_WAIT`, 1 s, after it), so a frame that joined a message later would have less of that
/// time; a quarter of it leaves each such author three quarters. Only while a send waits: a
/// sender that has not had its turn yet (its runtime busy) takes the message whole when it
/// does, and splitting by age then would only fill the [`MAX_QUEUED`] bound on time alone.
pub(crate) const GATHER_MAX: std::time::Duration = std::time::Duration::from_millis(250);

/// What the sender of an outbox is to do next ([`Outbox::poll_work`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// Send the messages waiting ([`Outbox::take`]).
    Send,
    /// Nothing more can be sent: a send failed, or the outbox overflowed (the peer stopped
    /// reading), for this reason.
    Broken(io::ErrorKind),
    /// The connection's owner is gone.
    Closed,
}

/// The frames of one door connection not sent yet (see the module's documentation).
#[derive(Default)]
pub(crate) struct Outbox(Mutex<State>);

#[derive(Default)]
struct State {
    /// Messages the sender has not taken yet, oldest first; the last takes more frames while it
    /// has room for them.
    queue: VecDeque<Message>,
    /// The number of the first message in `queue` (messages are numbered from 0, in order).
    front: u64,
    /// Every message numbered below this is over: sent, or failed (see `broken`).
    over_below: u64,
    /// The first message that could not be sent, and why: it and every one after it failed.
    broken: Option<(u64, io::ErrorKind)>,
    /// The sender took a message and has not said how its send went.
    in_flight: bool,
    /// Its connection's owner closed it.
    closed: bool,
    /// The sender, waiting for a message.
    sender: Option<Waker>,
    /// Authors waiting for their message's fate, by message, in the messages' order: a sent
    /// message wakes its own authors only (woken all at once, the authors of the up to
    /// [`MAX_QUEUED`] later messages, up to 64 frames each, came back for nothing on every
    /// send, and each one's check for its waker already registered went through all of them).
    waiters: VecDeque<(u64, Vec<Waker>)>,
    /// A sent message's buffer, kept for the next one.
    spare: Vec<u8>,
}

struct Message {
    bytes: Vec<u8>,
    frames: usize,
    /// When its first frame came.
    born: Instant,
}

/// A message the sender took ([`Outbox::take`]).
#[derive(Debug)]
pub(crate) struct Taken {
    /// Its number, for [`Outbox::sent`].
    pub(crate) n: u64,
    /// The message.
    pub(crate) bytes: Vec<u8>,
    /// How many frames it carries.
    pub(crate) frames: usize,
    /// When its first frame came: its authors have waited since (at the longest).
    pub(crate) born: Instant,
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds the frame `encode` appends to the message being gathered (or to a new one, when
    /// that one has [`DOOR_BATCH_FRAMES`] frames, was started [`GATHER_MAX`] or longer ago
    /// while a send waits, or the frame would take it past [`DOOR_MSG_MAX`]) and returns the
    /// number of the message it went into. Fails at once once a send failed (nothing more goes
    /// out on the connection), and fails the connection when [`MAX_QUEUED`] messages wait
    /// unsent. `now`: the time, the birth of a message the frame starts.
    pub(crate) fn push(&self, now: Instant, encode: impl FnOnce(&mut Vec<u8>)) -> io::Result<u64> {
        let waker = {
            let mut st = self.lock();
            if let Some((_, kind)) = st.broken {
                return Err(kind.into());
            }
            let was_empty = st.queue.is_empty();
            let waiting = st.in_flight;
            let full = |m: &Message| {
                m.frames >= DOOR_BATCH_FRAMES || (waiting && now.saturating_duration_since(m.born) >= GATHER_MAX)
            };
            if st.queue.back().is_none_or(full) {
                if st.queue.len() >= MAX_QUEUED {
                    return Err(Self::overflow(st));
                }
                let bytes = std::mem::take(&mut st.spare);
                st.queue.push_back(Message { bytes, frames: 0, born: now });
            }
            let Some(last) = st.queue.back_mut() else { unreachable!("a message was just made") };
            // An author that read the clock before the one that started the message (another
            // thread's) waits from its own time.
            last.born = last.born.min(now);
            let start = last.bytes.len();
            encode(&mut last.bytes);
            last.frames += 1;
            if last.bytes.len() > DOOR_MSG_MAX && last.frames > 1 {
                // No room in this one: the frame starts the next, if one more may wait.
                let bytes = last.bytes.split_off(start);
                last.frames -= 1;
                if st.queue.len() >= MAX_QUEUED {
                    return Err(Self::overflow(st));
                }
                st.queue.push_back(Message { bytes, frames: 1, born: now });
            }
            let n = st.front + st.queue.len() as u64 - 1;
            (was_empty.then(|| st.sender.take()).flatten(), n)
        };
        if let Some(w) = waker.0 {
            w.wake();
        }
        Ok(waker.1)
    }

    /// Sends the frame `encode` appends now, as a message of its own, with `send` (one
    /// non-blocking send), when nothing is queued or being sent before it: for a frame whose
    /// author knows that no other task has anything to say on the connection (its
    /// registration is the only one open), so that waiting for the turn's others would only
    /// cost it the sender's turn. Otherwise, or when the send finds no room, the frame is
    /// queued as [`push`](Self::push) queues it. `Ok(None)`: sent; `Ok(Some(n))`: queued in
    /// message `n`; an error: the connection can send no more.
    pub(crate) fn send_now(
        &self,
        now: Instant,
        encode: impl FnOnce(&mut Vec<u8>),
        send: impl FnOnce(&[u8]) -> io::Result<()>,
    ) -> io::Result<Option<u64>> {
        let mut st = self.lock();
        if st.broken.is_some() || !st.queue.is_empty() || st.in_flight {
            drop(st);
            return self.push(now, encode).map(Some);
        }
        let mut bytes = std::mem::take(&mut st.spare);
        encode(&mut bytes);
        match send(&bytes) {
            Ok(()) => {
                bytes.clear();
                st.spare = bytes;
                Ok(None)
            }
            Err(e) => {
                // Queued for the sender, which waits for room or reports the failure.
                let n = st.front;
                st.queue.push_back(Message { bytes, frames: 1, born: now });
                let sender = st.sender.take();
                drop(st);
                if let Some(w) = sender {
                    w.wake();
                }
                tracing::trace!(error = %e, "door frame queued for the sender");
                Ok(Some(n))
            }
        }
    }

    /// Fails the outbox for a peer that does not read: [`MAX_QUEUED`] messages wait unsent.
    fn overflow(mut st: std::sync::MutexGuard<'_, State>) -> io::Error {
        let first = st.front;
        let wake = Self::fail_all(&mut st, first, io::ErrorKind::WouldBlock);
        drop(st);
        wake.into_iter().for_each(Waker::wake);
        io::ErrorKind::WouldBlock.into()
    }

    /// Fails message `first` and every later one, queued or to come, and returns whom to wake
    /// (the sender and every author), for after the lock.
    fn fail_all(st: &mut State, first: u64, kind: io::ErrorKind) -> Vec<Waker> {
        Self::fail_from(st, first, kind);
        st.queue.clear();
        st.sender.take().into_iter().chain(std::mem::take(&mut st.waiters).into_iter().flat_map(|(_, w)| w)).collect()
    }

    /// Fails message `n` and every later one (an earlier failure stands, with its reason).
    fn fail_from(st: &mut State, n: u64, kind: io::ErrorKind) {
        match st.broken {
            Some((from, _)) if from <= n => {}
            _ => st.broken = Some((n, kind)),
        }
    }

    /// For the sender: what to do, once there is something to do.
    pub(crate) fn poll_work(&self, cx: &mut Context<'_>) -> Poll<Work> {
        let mut st = self.lock();
        if st.closed {
            return Poll::Ready(Work::Closed);
        }
        if let Some((_, kind)) = st.broken {
            return Poll::Ready(Work::Broken(kind));
        }
        if !st.queue.is_empty() {
            return Poll::Ready(Work::Send);
        }
        match &st.sender {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.sender = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// For the sender: the oldest message. Frames added from now on go into a later one.
    pub(crate) fn take(&self) -> Option<Taken> {
        let mut st = self.lock();
        if st.broken.is_some() {
            return None;
        }
        let m = st.queue.pop_front()?;
        let n = st.front;
        st.front += 1;
        st.in_flight = true;
        Some(Taken { n, bytes: m.bytes, frames: m.frames, born: m.born })
    }

    /// For the sender: message `n` (the last one taken) was sent, or could not be (`failed`,
    /// and why), which fails every later one too. `buf` is its buffer, kept for reuse.
    pub(crate) fn sent(&self, n: u64, failed: Option<io::ErrorKind>, mut buf: Vec<u8>) {
        let waiters = {
            let mut st = self.lock();
            st.in_flight = false;
            st.over_below = st.over_below.max(n + 1);
            if st.spare.capacity() < buf.capacity() {
                buf.clear();
                st.spare = buf;
            }
            match failed {
                // Also when the outbox broke already from a later message on (it overflowed
                // while this one was out): this one failed too, and every later one.
                Some(kind) => Self::fail_all(&mut st, n, kind),
                None => {
                    let over = st.waiters.partition_point(|(m, _)| *m <= n);
                    st.waiters.drain(..over).flat_map(|(_, w)| w).collect()
                }
            }
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Ends the outbox (its connection is gone): what waits fails as not sent, and the sender
    /// stops.
    pub(crate) fn close(&self) {
        let wake = {
            let mut st = self.lock();
            st.closed = true;
            let first = st.front;
            Self::fail_all(&mut st, first, io::ErrorKind::BrokenPipe)
        };
        wake.into_iter().for_each(Waker::wake);
    }

    /// Ends the outbox because its sender is gone (its task dropped, with its runtime, before
    /// or while it sent): what waits fails, the message it had out too, since nobody will say
    /// how its send went.
    pub(crate) fn abandon(&self) {
        let wake = {
            let mut st = self.lock();
            st.closed = true;
            let first = if st.in_flight { st.front - 1 } else { st.front };
            st.in_flight = false;
            Self::fail_all(&mut st, first, io::ErrorKind::BrokenPipe)
        };
        wake.into_iter().for_each(Waker::wake);
    }

    /// For an author: ready once message `n` is over, with its fate.
    pub(crate) fn poll_over(&self, n: u64, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.lock();
        match st.broken {
            Some((from, kind)) if n >= from => return Poll::Ready(Err(kind.into())),
            _ if n < st.over_below => return Poll::Ready(Ok(())),
            _ => {}
        }
        let at = st.waiters.partition_point(|(m, _)| *m < n);
        match st.waiters.get_mut(at) {
            Some((m, ws)) if *m == n => {
                if !ws.iter().any(|w| w.will_wake(cx.waker())) {
                    ws.push(cx.waker().clone());
                }
            }
            _ => st.waiters.insert(at, (n, vec![cx.waker().clone()])),
        }
        Poll::Pending
    }

    /// Waits for message `n`'s fate (see [`poll_over`](Self::poll_over)).
    pub(crate) async fn over(&self, n: u64) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_over(n, cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::door::{frames, DoorFrame, DoorKind, DOOR_FRAME_MAX};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// The time of every frame of these tests but those about a message's age: one instant, so
    /// that no message stops taking frames because the test ran slowly.
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    fn cancel(out: &mut Vec<u8>, id: u64) {
        DoorFrame { kind: DoorKind::Cancel, reason: 0, id }.encode_into(out, &[]);
    }

    fn ids(msg: &[u8]) -> Vec<u64> {
        frames(msg).unwrap().map(|(f, _)| f.id).collect()
    }

    /// Frames added before the sender looks go out as one message, in order; the sender is
    /// woken by the first of them only; their authors learn the fate once it was sent.
    #[test]
    fn frames_added_together_go_out_as_one_message() {
        let out = Outbox::default();
        let (sender_wakes, sender) = counter();
        assert_eq!(out.poll_work(&mut Context::from_waker(&sender)), Poll::Pending);
        let ns: Vec<u64> = (1..=3).map(|id| out.push(t0(), |b| cancel(b, id)).unwrap()).collect();
        assert_eq!(ns, [0, 0, 0], "one message");
        assert_eq!(sender_wakes.0.load(Ordering::Relaxed), 1, "woken by the first frame only");
        let (author_wakes, author) = counter();
        assert!(out.poll_over(0, &mut Context::from_waker(&author)).is_pending());
        assert_eq!(out.poll_work(&mut Context::from_waker(&sender)), Poll::Ready(Work::Send));
        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        assert_eq!((n, ids(&msg)), (0, vec![1, 2, 3]));
        // A frame added while the first message is out goes into the next one.
        assert_eq!(out.push(t0(), |b| cancel(b, 4)).unwrap(), 1);
        out.sent(0, None, msg);
        assert_eq!(author_wakes.0.load(Ordering::Relaxed), 1);
        assert!(matches!(out.poll_over(0, &mut Context::from_waker(&author)), Poll::Ready(Ok(()))));
        assert!(out.poll_over(1, &mut Context::from_waker(&author)).is_pending());
        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        assert_eq!((n, ids(&msg)), (1, vec![4]));
        assert!(out.take().is_none());
    }

    /// A sent message wakes its own authors, not those of the messages after it; a failed one
    /// wakes everyone, since every later message failed with it. An author polled again is
    /// registered once.
    #[test]
    fn a_sent_message_wakes_its_authors_only() {
        let out = Outbox::default();
        let first = out.push(t0(), |b| cancel(b, 1)).unwrap();
        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        let second = out.push(t0(), |b| cancel(b, 2)).unwrap();
        let (first_wakes, a) = counter();
        let (later_wakes, b) = counter();
        // The later message's author first: the earlier one's goes in before it.
        for _ in 0..3 {
            assert!(out.poll_over(second, &mut Context::from_waker(&b)).is_pending());
            assert!(out.poll_over(first, &mut Context::from_waker(&a)).is_pending());
        }
        out.sent(n, None, msg);
        assert_eq!(first_wakes.0.load(Ordering::Relaxed), 1, "the sent message's author, once");
        assert_eq!(later_wakes.0.load(Ordering::Relaxed), 0, "the next message's author slept on");
        assert!(matches!(out.poll_over(first, &mut Context::from_waker(&a)), Poll::Ready(Ok(()))));

        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        let third = out.push(t0(), |b| cancel(b, 3)).unwrap();
        let (third_wakes, c) = counter();
        assert!(out.poll_over(third, &mut Context::from_waker(&c)).is_pending());
        out.sent(n, Some(io::ErrorKind::BrokenPipe), msg);
        assert_eq!(later_wakes.0.load(Ordering::Relaxed), 1);
        assert_eq!(third_wakes.0.load(Ordering::Relaxed), 1, "a failure ends every later message");
        for (m, w) in [(second, &b), (third, &c)] {
            assert!(matches!(out.poll_over(m, &mut Context::from_waker(w)), Poll::Ready(Err(_))), "message {m}");
        }

        // Failing everything (a close; an overflow and an abandoned sender share it) wakes
        // every author, of every message.
        let out = Outbox::default();
        let counters: Vec<_> = (0..3u64)
            .map(|id| {
                let m = out.push(t0(), |b| cancel(b, id)).unwrap();
                let (wakes, w) = counter();
                assert!(out.poll_over(m, &mut Context::from_waker(&w)).is_pending());
                if id < 2 {
                    let Taken { .. } = out.take().unwrap();
                    out.sent(m, None, Vec::new());
                    assert_eq!(wakes.0.load(Ordering::Relaxed), 1);
                }
                (m, wakes, w)
            })
            .collect();
        let (m, wakes, w) = &counters[2];
        let (also, w2) = counter();
        let next = out.push(t0(), |b| cancel(b, 9)).unwrap();
        assert!(out.poll_over(next, &mut Context::from_waker(&w2)).is_pending());
        out.close();
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1);
        assert_eq!(also.0.load(Ordering::Relaxed), 1);
        assert!(matches!(out.poll_over(*m, &mut Context::from_waker(w)), Poll::Ready(Err(_))));
    }

    /// A message never holds more frames or bytes than a receiver takes.
    #[test]
    fn a_full_message_starts_the_next() {
        let out = Outbox::default();
        for id in 0..DOOR_BATCH_FRAMES as u64 + 1 {
            let n = out.push(t0(), |b| cancel(b, id)).unwrap();
            assert_eq!(n, u64::from(id == DOOR_BATCH_FRAMES as u64));
        }
        let long = vec![7u8; crate::proto::clc::CLC_MAX_LEN];
        let clc = |b: &mut Vec<u8>| DoorFrame { kind: DoorKind::Clc, reason: 0, id: 9 }.encode_into(b, &long);
        let mut last = 1;
        for _ in 0..40 {
            last = out.push(t0(), clc).unwrap();
        }
        let mut seen = 0;
        while let Some(Taken { n, bytes: msg, frames: frames_in, .. }) = out.take() {
            assert!(msg.len() <= DOOR_MSG_MAX, "message {n} is {} bytes", msg.len());
            assert_eq!(frames(&msg).unwrap().count(), frames_in, "message {n}'s frame count");
            seen += frames_in;
            assert!(n <= last);
            out.sent(n, None, msg);
        }
        assert_eq!(seen, DOOR_BATCH_FRAMES + 1 + 40);
        assert!(last >= 3, "40 frames of {} bytes fill more than two messages", DOOR_FRAME_MAX);
    }

    /// A failed send fails its message and every later one, queued or added later, and stops
    /// the sender; messages sent before it keep their fate. Closing fails what waits.
    #[test]
    fn a_failed_send_fails_what_follows() {
        let out = Outbox::default();
        let (_, w) = counter();
        let cx = &mut Context::from_waker(&w);
        let first = out.push(t0(), |b| cancel(b, 1)).unwrap();
        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        out.sent(n, None, msg);
        let second = out.push(t0(), |b| cancel(b, 2)).unwrap();
        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        let third = out.push(t0(), |b| cancel(b, 3)).unwrap();
        out.sent(n, Some(io::ErrorKind::WouldBlock), msg);
        assert!(matches!(out.poll_over(first, cx), Poll::Ready(Ok(()))));
        for n in [second, third] {
            match out.poll_over(n, cx) {
                Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
                other => panic!("message {n}: {other:?}"),
            }
        }
        assert_eq!(out.push(t0(), |b| cancel(b, 4)).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert_eq!(out.poll_work(cx), Poll::Ready(Work::Broken(io::ErrorKind::WouldBlock)));
        assert!(out.take().is_none());

        let out = Outbox::default();
        let (sender_wakes, sender) = counter();
        assert!(out.poll_work(&mut Context::from_waker(&sender)).is_pending());
        let n = out.push(t0(), |b| cancel(b, 1)).unwrap();
        out.close();
        assert!(sender_wakes.0.load(Ordering::Relaxed) >= 1);
        assert!(matches!(out.poll_over(n, cx), Poll::Ready(Err(_))));
        assert_eq!(out.poll_work(cx), Poll::Ready(Work::Closed));

        // A sender that went away with a message out: that message fails too, and later
        // frames fail at once.
        let out = Outbox::default();
        let first = out.push(t0(), |b| cancel(b, 1)).unwrap();
        let Taken { n: taken, .. } = out.take().unwrap();
        assert_eq!(taken, first);
        let queued = out.push(t0(), |b| cancel(b, 2)).unwrap();
        out.abandon();
        for n in [taken, queued] {
            assert!(matches!(out.poll_over(n, cx), Poll::Ready(Err(_))), "message {n}");
        }
        assert!(out.push(t0(), |b| cancel(b, 3)).is_err());
    }

    /// A frame sent now goes out at once as a message of its own while nothing is queued or out;
    /// otherwise it queues behind what is, in order; a send that finds no room queues it.
    #[test]
    fn a_frame_alone_goes_out_at_once_and_never_ahead_of_others() {
        let out = Outbox::default();
        let sent = std::cell::RefCell::new(Vec::new());
        let send = |m: &[u8]| {
            sent.borrow_mut().push(ids(m));
            Ok(())
        };
        assert_eq!(out.send_now(t0(), |b| cancel(b, 1), send).unwrap(), None);
        assert_eq!(sent.borrow().as_slice(), [vec![1]]);
        // Something queued: the next frame goes after it.
        assert_eq!(out.push(t0(), |b| cancel(b, 2)).unwrap(), 0);
        assert_eq!(out.send_now(t0(), |b| cancel(b, 3), send).unwrap(), Some(0));
        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        assert_eq!(ids(&msg), [2, 3]);
        // Something out: the same.
        assert_eq!(out.send_now(t0(), |b| cancel(b, 4), send).unwrap(), Some(1));
        out.sent(n, None, msg);
        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        assert_eq!((n, ids(&msg)), (1, vec![4]));
        out.sent(n, None, msg);
        // No room: queued for the sender, which waits for it.
        let full = |_: &[u8]| Err(io::ErrorKind::WouldBlock.into());
        assert_eq!(out.send_now(t0(), |b| cancel(b, 5), full).unwrap(), Some(2));
        let Taken { n, bytes: msg, .. } = out.take().unwrap();
        assert_eq!((n, ids(&msg)), (2, vec![5]));
        assert_eq!(sent.borrow().len(), 1, "only the first went out at once");
    }

    /// Frames that pile up behind a peer that does not read fail the connection at the bound,
    /// instead of being held: the sender learns it is broken, and every author its fate.
    #[test]
    fn an_outbox_the_peer_does_not_drain_is_bounded() {
        let out = Outbox::default();
        let (sender_wakes, sender) = counter();
        let (_, w) = counter();
        let cx = &mut Context::from_waker(&w);
        assert!(out.poll_work(&mut Context::from_waker(&sender)).is_pending());
        // The sender took the first message and waits for room; the rest pile up.
        out.push(t0(), |b| cancel(b, 0)).unwrap();
        let Taken { n: taken, bytes: msg, .. } = out.take().unwrap();
        let mut last = 0;
        for id in 1..=(MAX_QUEUED * DOOR_BATCH_FRAMES) as u64 {
            last = out.push(t0(), |b| cancel(b, id)).unwrap();
        }
        assert_eq!(last, MAX_QUEUED as u64);
        assert!(out.poll_over(last, cx).is_pending());
        let err = out.push(t0(), |b| cancel(b, u64::MAX)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(sender_wakes.0.load(Ordering::Relaxed) >= 1);
        assert_eq!(out.poll_work(cx), Poll::Ready(Work::Broken(io::ErrorKind::WouldBlock)));
        assert!(matches!(out.poll_over(last, cx), Poll::Ready(Err(_))));
        assert!(out.take().is_none());
        // The message out when it broke keeps the fate its send gets: failed here (the
        // connection is shut behind it), which fails it, though the outbox broke after it.
        assert!(out.poll_over(taken, cx).is_pending());
        out.sent(taken, Some(io::ErrorKind::BrokenPipe), msg);
        match out.poll_over(taken, cx) {
            Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::BrokenPipe),
            other => panic!("the message out when the outbox broke: {other:?}"),
        }
        assert!(matches!(out.poll_over(last, cx), Poll::Ready(Err(_))));

        // Messages that fill on bytes count as much as those that fill on frames.
        let out = Outbox::default();
        let long = vec![7u8; crate::proto::clc::CLC_MAX_LEN];
        let clc = |b: &mut Vec<u8>| DoorFrame { kind: DoorKind::Clc, reason: 0, id: 9 }.encode_into(b, &long);
        let mut pushed = 0;
        while out.push(t0(), clc).is_ok() {
            pushed += 1;
            assert!(pushed < 16 * MAX_QUEUED, "unbounded");
        }
        let mut queued = 0;
        while out.take().is_some() {
            queued += 1;
        }
        assert_eq!(queued, 0, "what was queued failed with the outbox");
        assert!(pushed >= MAX_QUEUED * 15 - 1, "{pushed} frames taken before the bound");
    }

    /// While a send waits, a message takes frames for GATHER_MAX after its first, then the
    /// next frame starts another; otherwise it takes them whatever its age. The sender learns
    /// when each message's first frame came (the earliest clock reading of its authors).
    #[test]
    fn a_message_gathers_for_a_quarter_of_the_wait_while_a_send_waits() {
        let out = Outbox::default();
        let t0 = Instant::now();
        // Nothing out: age does not split.
        assert_eq!(out.push(t0, |b| cancel(b, 0)).unwrap(), 0);
        assert_eq!(out.push(t0 + GATHER_MAX * 2, |b| cancel(b, 1)).unwrap(), 0, "split with no send waiting");
        let first = out.take().unwrap();
        assert_eq!((first.n, first.frames, first.born), (0, 2, t0));
        // Message 0 is out and waits for room.
        let t1 = t0 + GATHER_MAX * 3;
        assert_eq!(out.push(t1, |b| cancel(b, 2)).unwrap(), 1);
        assert_eq!(out.push(t1 - GATHER_MAX / 4, |b| cancel(b, 3)).unwrap(), 1, "an earlier reading joins");
        assert_eq!(out.push(t1 + GATHER_MAX / 2, |b| cancel(b, 4)).unwrap(), 1);
        assert_eq!(out.push(t1 + GATHER_MAX, |b| cancel(b, 5)).unwrap(), 2, "an old message took a frame");
        out.sent(first.n, None, first.bytes);
        let second = out.take().unwrap();
        assert_eq!((second.n, second.frames, second.born), (1, 3, t1 - GATHER_MAX / 4));
        assert_eq!(ids(&second.bytes), [2, 3, 4]);
        let third = out.take().unwrap();
        assert_eq!((third.n, third.frames, third.born), (2, 1, t1 + GATHER_MAX));
    }
}
