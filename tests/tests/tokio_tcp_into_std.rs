//! tokio 1.54.1's `tests/tcp_into_std.rs`, ported onto the smc types: the imports alias `SmcListener`
//! and `SmcStream` to tokio's names, and the crate-feature `cfg` is dropped (it names tokio's
//! features).
//!
//! One semantic difference: an SMC connection cannot become a `std::net::TcpStream`, because its
//! bytes do not travel on the TCP socket (over `smc-d` they are in shared memory). So
//! `SmcStream::into_std` on an `smc-d` connection fails with `io::ErrorKind::Unsupported`, and
//! the stream is dropped (the connection is closed). The original test `tcp_into_std` is
//! therefore kept with one change in its setup only: the client connects with
//! `Policy::TcpOnly`, which keeps the connection on TCP, where `into_std` has tokio's meaning; it
//! also asserts that the accepted stream is not smc before `into_std`. Every assertion of the
//! original is kept as it is. `into_std_of_an_smc_connection_is_unsupported` is new: it checks
//! the `Unsupported` error on an `smc-d` connection, and that the peer then sees the connection
//! closed (end of stream or an error), never data.
#![warn(rust_2018_idioms)]

use smc_tokio::{SmcListener as TcpListener, SmcStream as TcpStream, Transport};
use std::io::Read;
use std::io::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn tcp_into_std() -> Result<()> {
    let mut data = [0u8; 12];
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr().unwrap().to_string();

    let handle = tokio::spawn(async {
        // `Policy::TcpOnly` keeps this connection on TCP (the client does not propose SMC), so the
        // accepted stream's bytes are on its TCP socket and `into_std` has tokio's meaning. A
        // same-host connection made with the default policy would be `smc-d` instead, which
        // cannot become a `std::net::TcpStream` (see the next test).
        let stream: TcpStream =
            smc_tokio::SmcStream::builder().policy(smc_tokio::Policy::TcpOnly).connect(addr).await.unwrap();
        stream
    });

    let (tokio_tcp_stream, _) = listener.accept().await?;
    assert!(!tokio_tcp_stream.transport().is_smc());
    let mut std_tcp_stream = tokio_tcp_stream.into_std()?;
    std_tcp_stream.set_nonblocking(false).expect("set_nonblocking call failed");

    let mut client = handle.await.expect("The task being joined has panicked");
    client.write_all(b"Hello world!").await?;

    std_tcp_stream.read_exact(&mut data).expect("std TcpStream read failed!");
    assert_eq!(b"Hello world!", &data);

    // test back to tokio stream
    std_tcp_stream.set_nonblocking(true).expect("set_nonblocking call failed");
    let mut tokio_tcp_stream = TcpStream::from_std(std_tcp_stream)?;
    client.write_all(b"Hello tokio!").await?;
    let _size = tokio_tcp_stream.read_exact(&mut data).await?;
    assert_eq!(b"Hello tokio!", &data);

    Ok(())
}

#[tokio::test]
async fn into_std_of_an_smc_connection_is_unsupported() -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;

    let (mut client, (server, _)) = tokio::try_join!(TcpStream::connect(addr), listener.accept())?;
    assert_eq!((client.transport(), server.transport()), (Transport::SmcD, Transport::SmcD));

    // The accepted stream's bytes are in shared memory, not on its TCP socket: it cannot become
    // a `std::net::TcpStream`. `into_std` fails, and the stream is dropped.
    let err = server.into_std().expect_err("into_std of an smc-d connection must fail");
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);

    // The client sees the connection closed: end of stream or an error, never data. The timeout
    // is a bound against a hang, not a timing assertion.
    let mut buf = [0u8; 16];
    match tokio::time::timeout(std::time::Duration::from_secs(10), client.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("the client read {n} bytes from a connection whose peer was dropped"),
        Err(_) => panic!("the client did not see the connection closed within 10 s"),
    }

    Ok(())
}
