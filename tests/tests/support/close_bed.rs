//! What the tests of how a shared-memory connection's TCP connection ends share: a listener and
//! clients in contexts of their own, and the kernel's table of TCP sockets.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use smc_tokio::{Context, SmcListener, SmcStream, Transport};
use tests::bounded;
use tokio::io::AsyncReadExt;

/// TCP states of /proc/net/tcp (include/net/tcp_states.h).
pub const ESTABLISHED: u8 = 0x01;
pub const FIN_WAIT2: u8 = 0x05;
pub const TIME_WAIT: u8 = 0x06;

/// The states of the IPv4 TCP sockets of connections between `clients` (local ports) and
/// `port`, either end, from /proc/net/tcp. (Only our connections: sockets of other tests may
/// sit in `TIME_WAIT` on the same port, a listener's port being reusable over them.) Each
/// socket once: the file is made a page at a time, and a table that changes between two pages
/// (other tests open and close sockets all the while) can show a socket twice; one was read as
/// a third established socket of a connection. A socket can be missed the same way, so the
/// table is read until two readings agree (at most five times).
pub fn states_on(port: u16, clients: &[u16]) -> Vec<u8> {
    let mut last = states_once(port, clients);
    for _ in 0..4 {
        let now = states_once(port, clients);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

fn states_once(port: u16, clients: &[u16]) -> Vec<u8> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port_of = |field: &str| u16::from_str_radix(field.rsplit(':').next().unwrap(), 16).unwrap();
    let mut seen = std::collections::HashSet::new();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, remote) = (port_of(f[1]), port_of(f[2]));
            let ours = (local == port && clients.contains(&remote)) || (remote == port && clients.contains(&local));
            // A socket is its two addresses (one socket per pair in a namespace).
            (ours && seen.insert((f[1].to_string(), f[2].to_string()))).then(|| u8::from_str_radix(f[3], 16).unwrap())
        })
        .collect()
}

/// The states of those sockets once the held sockets of `ctxs` are gone (waits up to 10 s for
/// the peers' closes to be taken in).
pub async fn settled_states(port: u16, clients: &[u16], ctxs: &[&Context]) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held: u64 = ctxs.iter().map(|c| c.stats().tcp_held).sum();
        let states = states_on(port, clients);
        if (held == 0 && states.is_empty()) || tokio::time::Instant::now() > deadline {
            assert_eq!(held, 0, "sockets still held for peers' closes");
            return states;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A listener in a context of its own, and clients in another.
pub struct Bed {
    pub cctx: Context,
    pub sctx: Context,
    pub listener: SmcListener,
    pub port: u16,
}

impl Bed {
    pub async fn new() -> Bed {
        let (cctx, sctx) = (Context::new(), Context::new());
        let listener = SmcListener::builder().context(&sctx).bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        Bed { cctx, sctx, listener, port }
    }

    /// One SMC-D connection: the client's end, the server's, and the client's port.
    pub async fn pair(&self) -> (SmcStream, SmcStream, u16) {
        let connect = SmcStream::builder().context(&self.cctx);
        let (c, s) = tokio::join!(connect.connect(("127.0.0.1", self.port)), self.listener.accept());
        let (c, (s, _)) = (c.unwrap(), s.unwrap());
        assert_eq!((c.transport(), s.transport()), (Transport::SmcD, Transport::SmcD));
        let port = c.local_addr().unwrap().port();
        (c, s, port)
    }

    /// A connection whose server let go first, and whose client read the end: the client's
    /// end and its port.
    pub async fn server_gone(&self) -> (SmcStream, u16) {
        let (mut c, s, port) = self.pair().await;
        drop(s);
        assert_eq!(bounded(10, c.read(&mut [0u8; 8])).await.unwrap(), 0);
        (c, port)
    }
}

/// Waits up to 10 s for `done`, looking every 10 ms.
pub async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
