//! A descriptor registered with a tokio reactor that can move to another one: how a link group
//! outlives the runtime that set it up (see `smc::group`'s rescue driver).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// An [`AsyncFd`] behind a slot: [`get`](Self::get) lends it out for one poll,
/// [`rehome`](Self::rehome) re-registers it with the reactor of the runtime it is called on.
#[derive(Debug)]
pub(crate) struct ReactorFd<T: AsRawFd> {
    slot: Mutex<Option<Arc<AsyncFd<T>>>>,
    interest: Interest,
}

impl<T: AsRawFd> ReactorFd<T> {
    pub(crate) fn new(fd: AsyncFd<T>, interest: Interest) -> Self {
        ReactorFd { slot: Mutex::new(Some(Arc::new(fd))), interest }
    }

    /// The registered descriptor, for one poll. `None` only after a failed
    /// [`rehome`](Self::rehome) (the link then fails).
    pub(crate) fn get(&self) -> Option<Arc<AsyncFd<T>>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Moves the registration to the reactor of the current runtime. Called by the rescue
    /// driver once the link's driver task is gone, so nothing else holds the descriptor for
    /// long; a poll that still does is waited out briefly.
    pub(crate) fn rehome(&self) -> io::Result<()> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mut arc) = slot.take() else {
            return Err(io::Error::other("descriptor lost in an earlier move"));
        };
        // A lender finishes its poll in microseconds; bound the wait.
        let mut spins = 0;
        let fd = loop {
            match Arc::try_unwrap(arc) {
                Ok(fd) => break fd,
                Err(back) if spins < 1000 => {
                    arc = back;
                    spins += 1;
                    std::thread::yield_now();
                }
                Err(back) => {
                    *slot = Some(back);
                    return Err(io::Error::new(io::ErrorKind::WouldBlock, "descriptor still in use"));
                }
            }
        };
        // Deregisters from the old reactor (an error there, when it is shut down, is ignored
        // by tokio) and hands the owner back.
        let inner = fd.into_inner();
        // SAFETY: `inner` came out of an AsyncFd, which had the same contract: it owns its
        // descriptor for as long as it lives.
        let fd = unsafe { crate::sys::register(inner, self.interest) }?;
        *slot = Some(Arc::new(fd));
        Ok(())
    }
}
