//! The sans-IO protocol core: no sockets, no clocks, no tokio.
//!
//! Everything here is driven by explicit inputs (bytes, the current time, the driver's
//! decisions) and returns explicit outputs, in the style of `quinn-proto`, so that it can be
//! tested deterministically and fuzzed.
//!
//! - [`clc`]: the handshake messages and their codec.
//! - [`handshake`]: the client and server handshake state machines.
//! - [`cdc`]: the connection data control messages that travel over a link.
//! - [`door`]: the frames of a listener's door, where same-host clients register their
//!   connections and run the handshake beside them.
//! - [`handback`]: the exchange that moves a connection's byte stream back to its TCP socket
//!   mid-stream.
//! - [`side`]: the shared-memory link's side-channel messages (JOIN and WELCOME).
//! - [`cursor`]: ring cursors and their wrap arithmetic.
//! - [`engine`]: per-connection flow control and CDC decisions.
//! - [`pair`]: a test harness that wires two machines back to back on a manual clock.

pub mod cdc;
pub mod clc;
pub mod cursor;
pub mod door;
pub mod engine;
pub mod handback;
pub mod handshake;
pub mod pair;
pub mod side;
