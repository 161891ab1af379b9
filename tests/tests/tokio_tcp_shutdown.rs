//! tokio 1.54.1's `tests/tcp_shutdown.rs`, ported onto the smc types: the imports alias `SmcListener`
//! and `SmcStream` to tokio's names, the crate-feature `cfg` is dropped (it names tokio's
//! features), and since both ends are smc types each test also asserts, on the client after its
//! connect and on the accepted stream, that the connection went over shared memory (`smc-d`).
//! Every assertion of the original is kept as it is.
#![warn(rust_2018_idioms)]

use smc_tokio::{SmcListener as TcpListener, SmcStream as TcpStream, Transport};
use tokio::io::{self, AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot::channel;
use tokio_test::assert_ok;

#[tokio::test]
async fn shutdown() {
    let srv = assert_ok!(TcpListener::bind("127.0.0.1:0").await);
    let addr = assert_ok!(srv.local_addr());

    let handle = tokio::spawn(async move {
        let mut stream = assert_ok!(TcpStream::connect(&addr).await);
        assert_eq!(stream.transport(), Transport::SmcD);

        assert_ok!(AsyncWriteExt::shutdown(&mut stream).await);

        let mut buf = [0u8; 1];
        let n = assert_ok!(stream.read(&mut buf).await);
        assert_eq!(n, 0);
    });

    let (mut stream, _) = assert_ok!(srv.accept().await);
    assert_eq!(stream.transport(), Transport::SmcD);
    let (mut rd, mut wr) = stream.split();

    let n = assert_ok!(io::copy(&mut rd, &mut wr).await);
    assert_eq!(n, 0);
    assert_ok!(AsyncWriteExt::shutdown(&mut stream).await);
    handle.await.unwrap()
}

#[tokio::test]
#[cfg_attr(miri, ignore = "Miri doesn't support `SO_LINGER`")]
async fn shutdown_after_tcp_reset() {
    let srv = assert_ok!(TcpListener::bind("127.0.0.1:0").await);
    let addr = assert_ok!(srv.local_addr());

    let (connected_tx, connected_rx) = channel();
    let (dropped_tx, dropped_rx) = channel();

    let handle = tokio::spawn(async move {
        let mut stream = assert_ok!(TcpStream::connect(&addr).await);
        assert_eq!(stream.transport(), Transport::SmcD);
        connected_tx.send(()).unwrap();

        dropped_rx.await.unwrap();

        // After the peer's RST (linger = 0), `shutdown` returns `Ok(())` on most
        // platforms, but FreeBSD can surface the reset as `ConnectionReset` when
        // the kernel processed it before `shutdown` ran. Both are valid for an
        // already-reset connection.
        match AsyncWriteExt::shutdown(&mut stream).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("unexpected error after reset: {e:?}"),
        }
    });

    let (stream, _) = assert_ok!(srv.accept().await);
    assert_eq!(stream.transport(), Transport::SmcD);
    // By setting linger to 0 we will trigger a TCP reset
    stream.set_zero_linger().unwrap();
    connected_rx.await.unwrap();

    drop(stream);
    dropped_tx.send(()).unwrap();

    handle.await.unwrap();
}

#[tokio::test]
async fn shutdown_multiple_calls() {
    let srv = assert_ok!(TcpListener::bind("127.0.0.1:0").await);
    let addr = assert_ok!(srv.local_addr());

    let (connected_tx, connected_rx) = channel();

    let handle = tokio::spawn(async move {
        let mut stream = assert_ok!(TcpStream::connect(&addr).await);
        assert_eq!(stream.transport(), Transport::SmcD);
        connected_tx.send(()).unwrap();
        assert_ok!(AsyncWriteExt::shutdown(&mut stream).await);
        assert_ok!(AsyncWriteExt::shutdown(&mut stream).await);
        assert_ok!(AsyncWriteExt::shutdown(&mut stream).await);
    });

    let (mut stream, _) = assert_ok!(srv.accept().await);
    assert_eq!(stream.transport(), Transport::SmcD);
    connected_rx.await.unwrap();

    assert_ok!(AsyncWriteExt::shutdown(&mut stream).await);
    handle.await.unwrap();
}
