//! The cork guard returned by [`SmcStream::cork`](crate::SmcStream::cork).

use std::fmt;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::smc::conn::SmcConn;
use crate::sys;

/// Holds back small writes until it is dropped (Nagle's opposite, as `TCP_CORK`).
///
/// While any guard of a stream lives, writes fill the receive ring (on SMC) or the socket's
/// send queue (on TCP, through `TCP_CORK`) without being pushed to the peer. The push happens
/// when the last guard drops, directly in that call (no timer, no task), when the ring fills, or
/// on [`flush`](tokio::io::AsyncWriteExt::flush).
///
/// Dropping a guard never blocks. On SMC the push is a CDC message in shared memory; if the
/// peer's CDC queue happens to be full, the message goes out as soon as the peer frees a slot,
/// without waiting for the stream to be polled. On TCP, clearing `TCP_CORK` sends at once.
///
/// # Examples
///
/// ```
/// use smc_tokio::{SmcListener, SmcStream};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = SmcListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// tokio::spawn(async move {
///     let (mut conn, _) = listener.accept().await?;
///     let cork = conn.cork();
///     conn.write_all(b"HTTP/1.1 200 OK\r\n").await?;
///     conn.write_all(b"content-length: 2\r\n\r\n").await?;
///     conn.write_all(b"hi").await?;
///     drop(cork); // one push for all three writes
///     std::io::Result::Ok(())
/// });
/// let mut s = SmcStream::connect(addr).await?;
/// let mut resp = vec![0u8; 40];
/// s.read_exact(&mut resp).await?;
/// assert!(resp.ends_with(b"hi"));
/// # Ok(())
/// # }
/// ```
#[must_use = "the cork is released as soon as the guard is dropped"]
pub struct CorkGuard {
    inner: Inner,
}

enum Inner {
    Smc(Arc<SmcConn>),
    Tcp { tcp: Arc<TcpStream>, corks: Arc<AtomicUsize> },
}

impl fmt::Debug for CorkGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = match &self.inner {
            Inner::Smc(_) => "smc",
            Inner::Tcp { .. } => "tcp",
        };
        f.debug_struct("CorkGuard").field("transport", &on).finish()
    }
}

impl CorkGuard {
    pub(crate) fn smc(conn: Arc<SmcConn>) -> CorkGuard {
        conn.cork();
        CorkGuard { inner: Inner::Smc(conn) }
    }

    pub(crate) fn tcp(tcp: Arc<TcpStream>, corks: Arc<AtomicUsize>) -> CorkGuard {
        if corks.fetch_add(1, Ordering::AcqRel) == 0 {
            // A socket that cannot take the option still works, only uncorked.
            if let Err(e) = sys::set_tcp_cork(tcp.as_fd(), true) {
                tracing::debug!(error = %e, "TCP_CORK");
            }
        }
        CorkGuard { inner: Inner::Tcp { tcp, corks } }
    }
}

impl Drop for CorkGuard {
    fn drop(&mut self) {
        match &self.inner {
            Inner::Smc(conn) => conn.uncork(),
            Inner::Tcp { tcp, corks } => {
                if corks.fetch_sub(1, Ordering::AcqRel) == 1 {
                    if let Err(e) = sys::set_tcp_cork(tcp.as_fd(), false) {
                        tracing::debug!(error = %e, "TCP_CORK");
                    }
                }
            }
        }
    }
}

/// On TCP, a flush under a cork pushes what is queued: clear and set `TCP_CORK` again.
pub(crate) fn tcp_push(tcp: &TcpStream, corks: &AtomicUsize) -> std::io::Result<()> {
    if corks.load(Ordering::Acquire) > 0 {
        sys::set_tcp_cork(tcp.as_fd(), false)?;
        sys::set_tcp_cork(tcp.as_fd(), true)?;
    }
    Ok(())
}
