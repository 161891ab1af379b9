//! The networking types: [`SmcListener`], [`SmcStream`] with its halves, and [`SmcSocket`].

#[cfg(feature = "axum")]
mod axum;
pub(crate) mod buf_read;
mod cork;
pub(crate) mod inband;
pub(crate) mod listener;
pub(crate) mod socket;
pub(crate) mod split;
pub(crate) mod split_owned;
pub(crate) mod stream;
pub(crate) mod tcp_io;

pub use cork::CorkGuard;
pub use listener::{SmcListener, SmcListenerBuilder, LISTEN_BACKLOG};
pub use socket::SmcSocket;
pub use split::{ReadHalf, WriteHalf};
pub use split_owned::{OwnedReadHalf, OwnedWriteHalf, ReuniteError};
pub use stream::{SmcStream, SmcStreamBuilder};
