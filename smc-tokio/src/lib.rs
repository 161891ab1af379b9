//! Shared Memory Communications for tokio.
//!
//! `smc-tokio` is a drop-in for tokio's TCP types: swap [`tokio::net::TcpListener`] and
//! [`tokio::net::TcpStream`] for [`SmcListener`] and [`SmcStream`] and change nothing else.
//! Every connection starts as TCP. If both ends speak SMC, they negotiate (the CLC handshake of
//! RFC 7609) and move the byte stream off the TCP stack; when they cannot, the connection stays
//! TCP, on the same socket, and loses nothing. On one host the negotiation runs beside the
//! connection, at the listener's *door* (an abstract Unix socket), so the TCP stream never
//! carries it; across hosts it runs in-band, and only towards destinations the client was told
//! speak SMC. Plain TCP clients (curl, wrk, browsers) and plain TCP servers never see a byte of
//! ours.
//!
//! | transport | when | how |
//! |---|---|---|
//! | SMC-D | both ends on one host, same network namespace | rings in sealed shared memory (memfd), socket doorbells |
//! | SMC-R | across hosts with RDMA (feature `rdma`), to opted-in peers | RDMA WRITE into a registered ring, CDC as inline SEND |
//! | kernel SMC-R / SMC-D | a peer that speaks the Linux kernel's SMC (`AF_SMC`), where this kernel has it | the kernel's `AF_SMC` socket ([`kernel`]) |
//! | TCP | anything else | the connection's own socket |
//!
//! # Example
//!
//! ```
//! use smc_tokio::{SmcListener, SmcStream};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let listener = SmcListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(async move {
//!     loop {
//!         let (mut conn, _) = listener.accept().await?;
//!         tokio::spawn(async move {
//!             let (mut rd, mut wr) = conn.split();
//!             tokio::io::copy(&mut rd, &mut wr).await
//!         });
//!     }
//!     #[allow(unreachable_code)]
//!     std::io::Result::Ok(())
//! });
//!
//! let mut stream = SmcStream::connect(addr).await?;
//! stream.write_all(b"ping").await?;
//! let mut buf = [0u8; 4];
//! stream.read_exact(&mut buf).await?;
//! assert_eq!(&buf, b"ping");
//! println!("{}", stream.transport()); // "smc-d": both ends are in this process
//! # Ok(())
//! # }
//! ```
//!
//! # Parity with tokio
//!
//! [`SmcStream`], [`SmcListener`] and [`SmcSocket`] have the methods of tokio's `TcpStream`,
//! `TcpListener` and `TcpSocket`, with their signatures, and tokio's own `tests/tcp_*.rs` pass
//! on them (ported in this repository's `tests/`). Where a connection moved to SMC, a few things
//! cannot mean what they mean on a TCP socket; each is documented on the method:
//!
//! - Readiness ([`SmcStream::ready`], `readable`, `writable`, `poll_read_ready`,
//!   `poll_write_ready`) and the `try_*` methods follow tokio's model over the SMC rings: a
//!   stream is taken to be readable (writable) until a read (write) finds nothing to do.
//! - The TCP socket under an SMC connection is idle: [`AsFd`](std::os::fd::AsFd) gives it for
//!   socket options, but waiting on its readiness never sees the peer's data, and
//!   [`SmcStream::try_io`]/[`async_io`](SmcStream::async_io) return
//!   [`Unsupported`](std::io::ErrorKind::Unsupported) there.
//! - [`SmcStream::into_std`] of an SMC connection is [`Unsupported`](std::io::ErrorKind::Unsupported)
//!   while its bytes are not on the socket. [`SmcStream::hand_back`] moves them there, in both
//!   directions and losing nothing; from then on the stream is a TCP stream, and `into_std`,
//!   `try_io` and `async_io` are tokio's. A connection whose link fails while both processes
//!   live moves by itself.
//! - `flush` on TCP is done at once (the kernel has the bytes); over SMC it waits until the
//!   bytes written are in the peer's ring (a CDC message announced them; over RDMA, their
//!   writes completed), and reports the connection's error if it ended. A flush after a write
//!   that went through is never needed for the bytes to arrive; it tells when they did.
//! - A zero linger ([`SmcStream::set_zero_linger`]) aborts an SMC connection on drop, as it
//!   resets a TCP one. Whichever read or write meets the end of a connection (the peer's
//!   abort, a failed link) returns it once; reads after that find the end of stream and
//!   writes `BrokenPipe`, as after a TCP reset.
//! - A peer's close is its whole socket's close over SMC, not only a FIN: a write after it
//!   fails at once with `BrokenPipe` (and `ready` says `WRITE_CLOSED`), as on the kernel's
//!   SMC, where TCP takes one more write before the peer's reset.
//! - The listener takes connections from the kernel before `accept` asks (to run their
//!   handshakes without waiting for it), so [`SmcListener::into_std`] resets connections it took
//!   but had not handed out.
//! - The runtime needs its timer as well as its I/O driver (`Builder::enable_all`, which
//!   `#[tokio::main]` and `#[tokio::test]` use, or `enable_io` with `enable_time`): handshakes
//!   and link groups are bounded in time. tokio's `TcpStream::connect` needs only I/O; on a
//!   runtime without timers, a connection between two ends of this crate's panics as tokio's
//!   timers do ("timers are disabled").
//! - Beyond tokio: `&mut SmcStream` and the read halves are
//!   [`AsyncBufRead`](tokio::io::AsyncBufRead). Over shared memory with a peer of the same uid
//!   that could trace this process anyway (the same trust domain), `fill_buf` lends the
//!   receive ring's bytes without a copy (see
//!   [its implementation](SmcStream#impl-AsyncBufRead-for-%26mut+SmcStream)); it is not on
//!   `SmcStream` itself, where `AsyncBufReadExt::split` would shadow [`SmcStream::split`].
//!
//! Link groups are shared by the whole process, whatever runtime made them. A group's driver
//! runs on the runtime that set it up; if that runtime shuts down while the group is alive, the
//! group moves to a rescue thread of this crate's and its connections on other runtimes go on
//! ([`Stats::link_groups_rescued`] counts it). A runtime per request works. Connections that
//! another runtime makes on a shared-memory group are looked after by a task of their own
//! runtime as well ([`Stats::link_group_co_drivers`]), so they need their runtime to run and no
//! other, as tokio's streams do; over RDMA they depend on the group's runtime running too.
//!
//! # Layers
//!
//! - [`proto`]: the sans-IO protocol core (CLC codec and handshake machines, CDC messages,
//!   cursor arithmetic). No sockets, no clocks, no tokio.
//! - links: the backends that move bytes into the peer's receive ring: shared memory (SMC-D,
//!   same host) and, with the `rdma` feature, RDMA verbs (SMC-R, across hosts).
//! - the driver: [`SmcListener`], [`SmcStream`], the handshake tasks and one driver task per
//!   link group.
//!
//! The design, with the memory layout and the security model, is in `docs/design.md`.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub mod config;
mod connect;
mod context;
mod door;
mod error;
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub mod faults;
#[cfg(not(feature = "test-util"))]
mod faults;
#[cfg(any(feature = "fuzzing", test))]
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod hash;
pub mod kernel;
mod link;
mod listen;
mod negative_cache;
pub mod net;
pub mod proto;
mod smc;
mod stats;
mod sys;
#[cfg(test)]
mod testing;
mod transport;

/// RDMA diagnostics (feature `rdma`): what the verbs link sees on this host.
///
/// # Examples
///
/// ```
/// // On a host without RDMA this says why (no libibverbs, or no device).
/// match smc_tokio::rdma::describe_devices() {
///     Ok(ports) => ports.iter().for_each(|p| println!("{p}")),
///     Err(why) => println!("no rdma: {why}"),
/// }
/// ```
#[cfg(feature = "rdma")]
pub mod rdma {
    pub use crate::link::verbs::device::describe_devices;
    pub use crate::link::verbs::ffi::abi_report;
}

pub use config::Policy;
pub use context::Context;
pub use error::SmcError;
pub use net::{
    CorkGuard, OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, SmcListener, SmcListenerBuilder, SmcSocket,
    SmcStream, SmcStreamBuilder, WriteHalf,
};
pub use proto::clc::DeclineReason;
pub use proto::handshake::Side;
pub use stats::{stats, CloserStats, KernelStats, RoleStats, Stats, HANDSHAKE_BUCKETS};
pub use transport::{FallbackReason, HandbackCause, Transport};
