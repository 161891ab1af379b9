//! The networking types: [`SmcListener`] and [`SmcStream`] with their halves.

#[cfg(feature = "axum")]
mod axum;
mod cork;
mod listener;
pub(crate) mod split;
pub(crate) mod split_owned;
mod stream;

pub use cork::CorkGuard;
pub use listener::{SmcListener, SmcListenerBuilder};
pub use split::{ReadHalf, WriteHalf};
pub use split_owned::{OwnedReadHalf, OwnedWriteHalf, ReuniteError};
pub use stream::{SmcStream, SmcStreamBuilder};
