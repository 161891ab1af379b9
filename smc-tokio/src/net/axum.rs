//! `impl axum::serve::Listener for SmcListener` (feature `axum`).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::net::{SmcListener, SmcStream};

/// Errors that concern one connection only (the peer went away before `accept` saw it); the
/// listener itself is fine, so accept again at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// `axum::serve(listener, app)` takes an `SmcListener` directly.
///
/// As axum 0.8's own listeners do, `accept` never fails: per-connection errors are retried at
/// once; others (such as running out of descriptors) are logged and retried after a second.
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// use axum::{routing::get, Router};
///
/// let app = Router::new().route("/", get(|| async { "hello" }));
/// let listener = smc_tokio::SmcListener::bind("0.0.0.0:8080").await?;
/// axum::serve(listener, app).await?;
/// # Ok(()) }
/// ```
impl axum::serve::Listener for SmcListener {
    type Io = SmcStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (SmcStream, SocketAddr) {
        loop {
            match SmcListener::accept(self).await {
                Ok(c) => return c,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "smc listener accept error; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        SmcListener::local_addr(self)
    }
}
