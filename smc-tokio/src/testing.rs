//! Helpers shared by the crate's unit tests.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves `listener` on the current runtime until its accept fails: each connection's first
/// five bytes are written back.
pub(crate) fn spawn_echo_of_five(listener: crate::SmcListener) {
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut b = [0u8; 5];
                if s.read_exact(&mut b).await.is_ok() {
                    let _ = s.write_all(&b).await;
                }
            });
        }
    });
}
