//! Injected stalls at the handshake's decision points, for tests of the commit point (feature
//! `test-util`; without it every hook is an empty inline function). Stalls are keyed by the
//! listener's address, so tests running at once in one process do not disturb each other.

use std::net::SocketAddr;
#[cfg(feature = "test-util")]
use std::time::Duration;

/// A point in the handshake where a stall can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub, dead_code))]
pub enum Point {
    /// Client: once the connection is up, before its side of the handshake goes on (in-band:
    /// before the Proposal goes out; at the door: before it reads the server's answer).
    ClientBeforeHandshake,
    /// Client: after the Accept and its end of the link is set up, before the Confirm goes out.
    ClientBeforeConfirm,
    /// Server: after the Proposal, before it decides.
    ServerBeforeAccept,
    /// Server: after the Confirm, before it checks it and commits.
    ServerBeforeCommit,
}

#[cfg(feature = "test-util")]
fn table() -> &'static std::sync::Mutex<std::collections::HashMap<(SocketAddr, Point), Duration>> {
    static T: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<(SocketAddr, Point), Duration>>> =
        std::sync::OnceLock::new();
    T.get_or_init(Default::default)
}

/// Makes handshakes with the listener at `server` stall for `delay` at `point` (both roles in
/// this process).
#[cfg(feature = "test-util")]
pub fn inject(server: SocketAddr, point: Point, delay: Duration) {
    table().lock().unwrap_or_else(|e| e.into_inner()).insert((crate::sys::unmap(server), point), delay);
}

/// Removes every stall for `server`.
#[cfg(feature = "test-util")]
pub fn clear(server: SocketAddr) {
    let server = crate::sys::unmap(server);
    table().lock().unwrap_or_else(|e| e.into_inner()).retain(|(a, _), _| *a != server);
}

/// Stalls here if a test asked for it.
#[cfg(feature = "test-util")]
pub(crate) async fn stall(server: SocketAddr, point: Point) {
    let d = table().lock().unwrap_or_else(|e| e.into_inner()).get(&(crate::sys::unmap(server), point)).copied();
    if let Some(d) = d {
        tracing::debug!(?point, ?d, "injected stall");
        tokio::time::sleep(d).await;
    }
}

#[cfg(not(feature = "test-util"))]
#[inline(always)]
pub(crate) async fn stall(_server: SocketAddr, _point: Point) {}

/// Makes RDMA links created from now on send their CDC frames from registered buffers instead
/// of inline, as on a device that grants no inline data (`false`: as the device allows). For
/// the soft-RoCE test bed, whose device always grants it.
#[cfg(all(feature = "test-util", feature = "rdma"))]
pub fn rdma_without_inline_sends(on: bool) {
    crate::link::verbs::force_no_inline(on);
}

/// How many blocking RDMA setup calls (creating verbs objects, registering memory, scanning GID
/// tables) ran on a runtime thread instead of a blocking one since the process started: 0 is
/// right. The link logs each at warn.
#[cfg(all(feature = "test-util", feature = "rdma"))]
pub fn rdma_setup_calls_on_runtime() -> u64 {
    crate::link::verbs::device::setup_calls_on_runtime()
}
