//! What [`AsyncBufRead`](tokio::io::AsyncBufRead) needs on a stream or a read half: the bytes
//! of the last `poll_fill_buf`, and where they came from, so that `consume` takes them off the
//! right queue.
//!
//! Over shared memory with a peer of our own uid, `poll_fill_buf` lends the receive ring's
//! bytes where they lie (no copy), and `consume` moves the consumer cursor. Anywhere else it
//! peeks into a buffer of the handle's (the bytes stay queued: the receive ring, or the TCP
//! socket with its in-band guard) and `consume` takes them off the queue. Either way the queue
//! stays the one place the bytes are, so every other read of the stream, before or after,
//! sees the stream as it is.

use std::io;
use std::task::{ready, Context, Poll};

use tokio::io::ReadBuf;

use crate::net::stream::SmcStream;
use crate::smc::conn::{Lent, SCRATCH_LEN};

/// A handle's `AsyncBufRead` state.
#[derive(Debug, Default)]
pub(crate) struct ReadLend {
    /// Where copied or peeked bytes go; allocated at the first fill that copies.
    scratch: Vec<u8>,
    /// What the last fill handed out and `consume` has not taken yet.
    last: Last,
    /// Peeked bytes a `consume` could not take off the socket at once (it cannot wait): the
    /// next fill takes them first.
    discard: usize,
    /// Why that `consume` could not: the next fill reports it.
    failed: Option<io::Error>,
}

#[derive(Debug, Default, Clone, Copy)]
enum Last {
    #[default]
    Nothing,
    /// Bytes of the SMC connection's ring (lent or copied).
    Smc(usize),
    /// Bytes peeked at on the TCP path.
    Tcp(usize),
}

impl ReadLend {
    /// Waits for bytes and hands out the first run of them (see the module documentation);
    /// `may_lend` says whether ring bytes may be lent where they lie: only by a handle through
    /// which alone the stream can be read while the caller's borrow lasts.
    pub(crate) fn poll_fill(
        &mut self,
        stream: &SmcStream,
        cx: &mut Context<'_>,
        may_lend: bool,
    ) -> Poll<io::Result<Lent>> {
        self.last = Last::Nothing;
        if let Some(e) = self.failed.take() {
            return Poll::Ready(Err(e));
        }
        if let Some(r) = stream.poll_lend(cx, &mut self.scratch, may_lend) {
            let lent = ready!(r)?;
            self.last = Last::Smc(match lent {
                Lent::Ring { len, .. } => len,
                Lent::Copied(n) => n,
            });
            return Poll::Ready(Ok(lent));
        }
        if self.scratch.len() < SCRATCH_LEN {
            self.scratch.resize(SCRATCH_LEN, 0);
        }
        while self.discard > 0 {
            let mut rb = ReadBuf::new(&mut self.scratch[..self.discard.min(SCRATCH_LEN)]);
            ready!(stream.poll_read_priv(cx, &mut rb))?;
            if rb.filled().is_empty() {
                // The bytes were peeked: only a stream that ended under us has none.
                self.discard = 0;
                break;
            }
            self.discard -= rb.filled().len();
        }
        let mut rb = ReadBuf::new(&mut self.scratch);
        let n = ready!(stream.poll_peek(cx, &mut rb))?;
        self.last = Last::Tcp(n);
        Poll::Ready(Ok(Lent::Copied(n)))
    }

    /// Whether it holds bytes of the stream: handed out by the last fill and not consumed, or
    /// consumed but still to be taken off the socket.
    pub(crate) fn holds(&self) -> bool {
        !matches!(self.last, Last::Nothing) || self.discard > 0
    }

    /// The bytes of `lent`.
    ///
    /// # Safety
    ///
    /// `lent` is what the last [`poll_fill`](Self::poll_fill) on this state returned, with no
    /// `consume` or other read of the stream since; the caller's handle keeps the stream alive,
    /// and while the returned borrow (of this state) lasts, nothing can read the stream, so
    /// that ring bytes stay unconsumed (and the peer does not write them).
    pub(crate) unsafe fn bytes(&self, lent: Lent) -> &[u8] {
        match lent {
            // SAFETY: by the caller's contract: the span lies in the link's mapping of the
            // peer's region, which the connection (kept by the stream) keeps mapped; it holds
            // unconsumed bytes, which a peer of our uid does not write until we consume them or
            // tell it the ring is free (an abort or its answer), and the connection holds both
            // back while they are lent; after a move to TCP the peer never reuses the ring.
            Lent::Ring { ptr, len } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) },
            Lent::Copied(n) => &self.scratch[..n.min(self.scratch.len())],
        }
    }

    /// Takes `amt` of the bytes the last fill handed out off the stream (at most as many as
    /// are left of them).
    pub(crate) fn consume(&mut self, stream: &SmcStream, amt: usize) {
        match self.last {
            Last::Nothing => {}
            Last::Smc(len) => {
                let n = amt.min(len);
                stream.consume_lent(n);
                self.last = if n < len { Last::Smc(len - n) } else { Last::Nothing };
            }
            Last::Tcp(len) => {
                // The peeked bytes are queued (in the socket or the guard): taking them cannot
                // wait, and on plain TCP copies nothing. `scratch` holds at least `len` bytes
                // (the peek went there).
                let want = amt.min(len);
                let mut left = want;
                while left > 0 {
                    match stream.try_discard(left, &mut self.scratch) {
                        Ok(0) => break,
                        Ok(k) => left -= k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            // Readiness cleared under us, or a real error: the bytes are still
                            // queued, and the next fill takes them first (and reports the error).
                            if e.kind() != io::ErrorKind::WouldBlock {
                                self.failed = Some(e);
                            }
                            self.discard += left;
                            left = 0;
                        }
                    }
                }
                self.last = if want < len { Last::Tcp(len - want) } else { Last::Nothing };
            }
        }
    }
}
