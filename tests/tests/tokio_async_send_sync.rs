//! The `net` part of tokio's own `tests/async_send_sync.rs`, on our types: each type is `Send`,
//! `Sync` and `Unpin` as tokio's counterpart is, and each future of our public API listed below
//! can be spawned on a multi-threaded runtime (`Send`) and shared (`Sync`), as tokio's can. A future that held
//! something that is neither (a cooperative-budget guard across an await, say) fails to
//! compile here. The futures are made on a real pair and dropped unpolled.

use std::net::SocketAddr;

use smc_tokio::net::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, WriteHalf};
use smc_tokio::{SmcListener, SmcListenerBuilder, SmcSocket, SmcStream, SmcStreamBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};

fn value<T: Send + Sync + Unpin>() {}

/// Takes a future that is `Send` and `Sync`, and drops it unpolled.
fn future<F: std::future::Future + Send + Sync>(_: F) {}

#[test]
fn types_are_send_sync_and_unpin_as_tokios() {
    value::<SmcListener>();
    value::<SmcStream>();
    value::<SmcSocket>();
    value::<OwnedReadHalf>();
    value::<OwnedWriteHalf>();
    value::<ReadHalf<'_>>();
    value::<WriteHalf<'_>>();
    value::<ReuniteError>();
    value::<SmcStreamBuilder>();
    value::<SmcListenerBuilder>();
    value::<smc_tokio::net::CorkGuard>();
    value::<tokio::io::BufReader<SmcStream>>();
    value::<tokio::io::BufStream<SmcStream>>();
    value::<tokio::io::BufWriter<SmcStream>>();
    value::<tokio::io::ReadHalf<SmcStream>>();
    value::<tokio::io::WriteHalf<SmcStream>>();
}

#[tokio::test]
async fn futures_are_send_and_sync_as_tokios() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    future(SmcListener::bind(any));
    future(SmcListener::builder().bind(any));
    let l = SmcListener::bind(any).await.unwrap();
    let addr = l.local_addr().unwrap();
    future(SmcStream::connect(addr));
    future(SmcStream::builder().connect(addr));
    future(SmcSocket::new_v4().unwrap().connect(addr));
    future(l.accept());
    let (c, s) = tokio::join!(SmcStream::connect(addr), l.accept());
    let (mut c, (mut s, _)) = (c.unwrap(), s.unwrap());
    let mut buf = [0u8; 8];
    future(c.peek(&mut buf));
    future(c.readable());
    future(c.writable());
    future(c.ready(Interest::READABLE | Interest::WRITABLE));
    future(c.hand_back());
    future(c.async_io(Interest::READABLE, || Ok(())));
    let file = std::fs::File::open("/dev/null").unwrap();
    future(c.sendfile(&file, 0, 0));
    future(c.read(&mut buf));
    future(c.write_all(b"x"));
    future(tokio::io::copy_bidirectional(&mut c, &mut s));
    // The halves, borrowed and owned: the same methods on different types.
    macro_rules! halves {
        ($r:ident, $w:ident) => {
            future($r.peek(&mut buf));
            future($r.readable());
            future($r.ready(Interest::READABLE));
            future($w.writable());
            future($w.ready(Interest::WRITABLE));
            future($w.sendfile(&file, 0, 0));
        };
    }
    {
        let (mut r, mut w) = c.split();
        halves!(r, w);
    }
    let (mut r, mut w) = c.into_split();
    halves!(r, w);
}
