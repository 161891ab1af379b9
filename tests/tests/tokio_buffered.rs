//! tokio 1.54.1's `tests/buffered.rs`, ported onto the smc types: the imports alias `SmcListener` to
//! tokio's `TcpListener` (the clients stay `std::net::TcpStream`, as in the original), and the
//! crate-feature `cfg` is dropped (it names tokio's features). The clients are plain sockets,
//! which must see plain TCP, so the test also asserts that both accepted streams are not smc.
//! Every assertion of the original is kept as it is.
#![warn(rust_2018_idioms)]

use smc_tokio::SmcListener as TcpListener;
use tokio_test::assert_ok;

use std::io::prelude::*;
use std::net::TcpStream;
use std::thread;

#[tokio::test]
#[cfg_attr(miri, ignore)] // No `socket` on miri.
async fn echo_server() {
    const N: usize = 1024;

    let srv = assert_ok!(TcpListener::bind("127.0.0.1:0").await);
    let addr = assert_ok!(srv.local_addr());

    let msg = "foo bar baz";

    let t = thread::spawn(move || {
        let mut s = assert_ok!(TcpStream::connect(addr));

        let t2 = thread::spawn(move || {
            let mut s = assert_ok!(TcpStream::connect(addr));
            let mut b = vec![0; msg.len() * N];
            assert_ok!(s.read_exact(&mut b));
            b
        });

        let mut expected = Vec::<u8>::new();
        for _i in 0..N {
            expected.extend(msg.as_bytes());
            let res = assert_ok!(s.write(msg.as_bytes()));
            assert_eq!(res, msg.len());
        }

        (expected, t2)
    });

    let (mut a, _) = assert_ok!(srv.accept().await);
    let (mut b, _) = assert_ok!(srv.accept().await);
    assert!(!a.transport().is_smc());
    assert!(!b.transport().is_smc());

    let n = assert_ok!(tokio::io::copy(&mut a, &mut b).await);

    let (expected, t2) = t.join().unwrap();
    let actual = t2.join().unwrap();

    assert!(expected == actual);
    assert_eq!(n, msg.len() as u64 * 1024);
}
