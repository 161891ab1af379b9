//! tokio 1.54.1's `tests/tcp_echo.rs`, ported onto the smc types: the imports alias `SmcListener`
//! and `SmcStream` to tokio's names, the crate-feature `cfg` is dropped (it names tokio's
//! features), and since both ends are smc types the test also asserts that the connection went
//! over shared memory (`smc-d`). Every assertion of the original is kept as it is.
#![warn(rust_2018_idioms)]

use smc_tokio::{SmcListener as TcpListener, SmcStream as TcpStream, Transport};
use tokio::io::{self, AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio_test::assert_ok;

#[tokio::test]
async fn echo_server() {
    const BYTES: &[u8] = b"foo bar baz";
    #[cfg(not(miri))]
    const ITER: usize = 1024;
    #[cfg(miri)] // Use a lower iteration count with Miri because it's too slow otherwise.
    const ITER: usize = 32;

    let (tx, rx) = oneshot::channel();

    let srv = assert_ok!(TcpListener::bind("127.0.0.1:0").await);
    let addr = assert_ok!(srv.local_addr());

    tokio::spawn(async move {
        let mut stream = assert_ok!(TcpStream::connect(&addr).await);

        for _ in 0..ITER {
            // write
            assert_ok!(stream.write_all(BYTES).await);

            // read
            let mut buf = [0; BYTES.len()];
            assert_ok!(stream.read_exact(&mut buf).await);
            assert_eq!(&buf[..], BYTES);
        }

        assert_ok!(tx.send(()));
    });

    let (mut stream, _) = assert_ok!(srv.accept().await);
    assert_eq!(stream.transport(), Transport::SmcD);
    let (mut rd, mut wr) = stream.split();

    let n = assert_ok!(io::copy(&mut rd, &mut wr).await);
    assert_eq!(n, (ITER * BYTES.len()) as u64);

    assert_ok!(rx.await);
}
