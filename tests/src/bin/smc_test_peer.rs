//! A peer process for the integration tests (so a test can kill it with SIGKILL, or run it in
//! another network namespace).
//!
//! ```text
//! smc-test-peer serve          listen on 127.0.0.1:0, print "PORT <n>", echo every connection
//! smc-test-peer hold           listen, print "PORT <n>", accept and never read
//! smc-test-peer client ADDR    connect, print "TRANSPORT <t>", echo-check 64 KiB, print "OK"
//! smc-test-peer blast ADDR     connect, print "TRANSPORT <t>", write forever (until killed)
//! smc-test-peer sink ADDR      connect, print "TRANSPORT <t>", read slowly forever (until killed)
//! smc-test-peer reset ADDR     connect A and B (one link group), print "TRANSPORT <t>", reset A's
//!                              TCP connection (connect(AF_UNSPEC): an RST), echo-check 1 MiB on
//!                              B, print "B OK", then stay alive (the side channel stays open)
//! smc-test-peer hold-clients ADDR N   open N connections, print "READY", hold them until killed
//! smc-test-peer storm-serve   listen, print "PORT <n>", echo 1 KiB per connection; on each
//!                              stdin line print "CONNS c SMC s PROPOSALS p" (p: connections
//!                              whose first bytes reached the application as a CLC eyecatcher)
//! smc-test-peer squat NAME SECS        bind the abstract SOCK_SEQPACKET name NAME (a door's),
//!                              accept for SECS, print "SQUAT conns=C bytes=B fds=F"
//! smc-test-peer squat-linger SECS NAME...  as squat, on every NAME, and queue a lingering TCP
//!                              socket (SO_LINGER 3600 s, unsent data towards a peer that never
//!                              reads) into every connection that arrives; print "SQUATTING",
//!                              then "SQUAT conns=C bytes=B fds=F queued=Q"
//! smc-test-peer knock-linger NAME N SECS   connect N times to the abstract name NAME (a door
//!                              or a side channel), queue a lingering TCP socket in each and
//!                              close our copies; print "KNOCKED k", hold the sockets' peers for
//!                              SECS (so their closes would block all that time), then exit
//! smc-test-peer side-hold NAME N [silent]   open N connections to the side channel NAME at
//!                              once, each with a lingering socket queued (silent: nothing sent);
//!                              after 1 s print "SIDE opened=O
//!                              queued=Q open_after=A" (A: connections the server still holds)
//! smc-test-peer claim ADDR PORT COOKIE SECS   as a door attacker: try to bind PORT (the
//!                              victim's) with SO_REUSEPORT, register PORT and COOKIE (the
//!                              victim's socket's) at ADDR's door, print "CLAIM victim_port=<errno|ok>
//!                              registered=<ok|err>", then wait SECS for a verdict and print
//!                              "VERDICT <kind|none>"
//! smc-test-peer squat-full NAME [stream]   bind the abstract name NAME: a SOCK_SEQPACKET
//!                              listener with a full queue (backlog 0, one connection queued,
//!                              the next refused), or with `stream` a listening SOCK_STREAM
//!                              socket; print "SQUATTING", hold it until stdin ends
//! smc-test-peer write-exit ADDR BYTES HOW   connect, print "TRANSPORT <t>", write BYTES bytes of
//!                              `tests::pattern`, flush, print "WROTE", then end without a
//!                              shutdown: HOW = return (return from main: the stream is dropped),
//!                              exit (std::process::exit: nothing is dropped), kill (sleep until
//!                              the test's SIGKILL)
//! ```

use std::io::Write;

use smc_tokio::proto::door::RegisterHead;
use smc_tokio::{SmcListener, SmcStream};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some(mode @ ("serve" | "hold")) => {
            let bind = args.get(1).map_or("127.0.0.1:0", String::as_str);
            let l = SmcListener::bind(bind).await?;
            println!("PORT {}", l.local_addr()?.port());
            std::io::stdout().flush()?;
            let mut held = Vec::new();
            loop {
                let (s, _) = l.accept().await?;
                if mode == "hold" {
                    held.push(s);
                    continue;
                }
                tokio::spawn(async move {
                    let (mut rd, mut wr) = s.into_split();
                    let _ = tokio::io::copy(&mut rd, &mut wr).await;
                });
            }
        }
        Some("write-exit") => {
            let addr = args.get(1).ok_or_else(|| std::io::Error::other("write-exit needs ADDR"))?;
            let n: usize = args.get(2).and_then(|v| v.parse().ok()).ok_or_else(|| std::io::Error::other("BYTES"))?;
            let how = args.get(3).map_or("return", String::as_str);
            let mut s = SmcStream::connect(addr.as_str()).await?;
            println!("TRANSPORT {}", s.transport());
            std::io::stdout().flush()?;
            s.write_all(&tests::pattern(n)).await?;
            s.flush().await?;
            println!("WROTE");
            std::io::stdout().flush()?;
            match how {
                "exit" => std::process::exit(0),
                "kill" => loop {
                    tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                },
                _ => Ok(()),
            }
        }
        Some("client") => {
            let addr = args.get(1).ok_or_else(|| std::io::Error::other("client needs ADDR"))?;
            let mut s = SmcStream::connect(addr.as_str()).await?;
            println!("TRANSPORT {}", s.transport());
            let data: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
            let (mut rd, mut wr) = s.split();
            let (w, r) = tokio::join!(wr.write_all(&data), async {
                let mut back = vec![0u8; data.len()];
                rd.read_exact(&mut back).await.map(|_| back)
            });
            w?;
            if r? != data {
                return Err(std::io::Error::other("echo differs"));
            }
            println!("OK");
            Ok(())
        }
        Some("client-per-line") => {
            // A connection, then one more for each line read from stdin, all from this
            // runtime (so on the door connection the first one opened, while it lives): each
            // echoes four bytes and says its transport.
            let addr = args.get(1).ok_or_else(|| std::io::Error::other("needs ADDR"))?;
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            let mut held = Vec::new();
            loop {
                let mut s = SmcStream::connect(addr.as_str()).await?;
                s.write_all(b"ping").await?;
                let mut back = [0u8; 4];
                s.read_exact(&mut back).await?;
                println!("TRANSPORT {}", s.transport());
                std::io::stdout().flush()?;
                held.push(s);
                if lines.next_line().await?.is_none() {
                    return Ok(());
                }
            }
        }
        Some(mode @ ("blast" | "sink")) => {
            let addr = args.get(1).ok_or_else(|| std::io::Error::other("needs ADDR"))?;
            let mut s = SmcStream::connect(addr.as_str()).await?;
            println!("TRANSPORT {}", s.transport());
            std::io::stdout().flush()?;
            if mode == "blast" {
                let chunk: Vec<u8> = (0..65536u32).map(|i| (i * 13) as u8).collect();
                loop {
                    s.write_all(&chunk).await?;
                }
            }
            let mut buf = vec![0u8; 4096];
            loop {
                if s.read(&mut buf).await? == 0 {
                    return Ok(());
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        Some("reset") => {
            let addr = args.get(1).ok_or_else(|| std::io::Error::other("reset needs ADDR"))?;
            let mut a = SmcStream::connect(addr.as_str()).await?;
            let b = SmcStream::connect(addr.as_str()).await?;
            println!("TRANSPORT {} {}", a.transport(), b.transport());
            println!("GROUPS {:?} {:?}", a.link_group(), b.link_group());
            a.write_all(b"a").await?;
            let mut one = [0u8; 1];
            a.read_exact(&mut one).await?;
            // An RST on A's TCP connection, with A's SMC connection and its link group untouched.
            let unspec = libc::sockaddr { sa_family: libc::AF_UNSPEC as libc::sa_family_t, sa_data: [0; 14] };
            // SAFETY: connect(2) with a valid sockaddr on the stream's own socket.
            let r = unsafe {
                libc::connect(
                    std::os::fd::AsRawFd::as_raw_fd(&a),
                    &unspec,
                    std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
                )
            };
            println!("RESET {r}");
            std::io::stdout().flush()?;
            let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 31 + 7) as u8).collect();
            let mut b = b;
            let (mut rd, mut wr) = b.split();
            let (w, r) = tokio::join!(wr.write_all(&data), async {
                let mut back = vec![0u8; data.len()];
                rd.read_exact(&mut back).await.map(|_| back)
            });
            w?;
            if r? != data {
                return Err(std::io::Error::other("echo on B differs"));
            }
            println!("B OK");
            std::io::stdout().flush()?;
            let mut buf = [0u8; 16];
            let ra = tokio::time::timeout(std::time::Duration::from_secs(10), a.read(&mut buf)).await;
            println!("A READ {ra:?}");
            std::io::stdout().flush()?;
            // Stay alive: the link group (and its side channel) must not be what ends A.
            std::future::pending::<()>().await;
            Ok(())
        }
        Some("hold-clients") => {
            let addr = args.get(1).ok_or_else(|| std::io::Error::other("needs ADDR"))?;
            let n: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(1);
            let mut held = Vec::new();
            for _ in 0..n {
                let mut s = SmcStream::connect(addr.as_str()).await?;
                s.write_all(b"x").await?;
                let mut one = [0u8; 1];
                s.read_exact(&mut one).await?;
                held.push(s);
            }
            println!("READY {}", held.iter().filter(|s| s.transport().is_smc()).count());
            std::io::stdout().flush()?;
            std::future::pending::<()>().await;
            Ok(())
        }
        Some("lowfd") => {
            // Connect repeatedly under a tight descriptor limit: every attempt ends in a stream
            // (SMC or TCP) or a clear error, never a panic or a hang.
            let addr = args.get(1).ok_or_else(|| std::io::Error::other("lowfd needs ADDR"))?.clone();
            let spare: u64 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(4);
            let open = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(16);
            let lim = libc::rlimit { rlim_cur: open + spare, rlim_max: open + spare + 64 };
            // SAFETY: setrlimit with a valid struct for this process.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut held = Vec::new();
            for i in 0..24 {
                match SmcStream::connect(addr.as_str()).await {
                    Ok(mut s) => {
                        let t = s.transport();
                        let ok = s.write_all(b"ping").await.is_ok();
                        println!("CONN {i} {t} write_ok={ok}");
                        held.push(s);
                    }
                    Err(e) => println!("ERR {i} {:?} {e}", e.kind()),
                }
            }
            println!("DONE");
            Ok(())
        }
        Some("settings") => {
            // The process-wide settings (from SMC_TOKIO_*), a builder's override of two of them,
            // and a listener's run-time change.
            println!("GLOBAL {:?}", smc_tokio::config::global().get());
            let b = SmcStream::builder()
                .max_pending_handshakes(7)
                .handshake_timeout(std::time::Duration::from_millis(1234));
            println!("BUILDER {:?}", b.settings());
            let l = SmcListener::builder().limit_handshake(false).bind("127.0.0.1:0").await?;
            println!("LISTENER {:?}", l.settings());
            l.set_max_pending_handshakes(3);
            l.set_limit_handshake(true);
            println!("CHANGED {:?}", l.settings());
            smc_tokio::config::global().update(|s| s.max_pending_handshakes = 99);
            println!("RUNTIME {:?}", SmcStream::builder().settings());
            // A builder that sets one shared-memory field keeps the process-wide others, and
            // a connection made with it (to a listener of such a builder) honours them.
            let shm = smc_tokio::config::ShmConfig::default().rmb_size(64 << 10);
            let b = SmcStream::builder().shm(shm.clone());
            println!("SHM_BUILDER {:?}", b.settings());
            let l = SmcListener::builder().shm(shm).bind("127.0.0.1:0").await?;
            let addr = l.local_addr()?;
            let accept = tokio::spawn(async move { l.accept().await.map(|(s, _)| s.transport()) });
            let c = b.connect(addr).await?;
            println!("SHM_CONNECT client={} server={}", c.transport(), accept.await.map_err(std::io::Error::other)??);
            Ok(())
        }
        Some("storm-serve") => {
            use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
            static CONNS: AtomicU64 = AtomicU64::new(0);
            static SMC: AtomicU64 = AtomicU64::new(0);
            static PROPOSALS: AtomicU64 = AtomicU64::new(0);
            let l = SmcListener::bind("127.0.0.1:0").await?;
            println!("PORT {}", l.local_addr()?.port());
            std::io::stdout().flush()?;
            tokio::spawn(async move {
                while let Ok((mut s, _)) = l.accept().await {
                    CONNS.fetch_add(1, Relaxed);
                    if s.transport().is_smc() {
                        SMC.fetch_add(1, Relaxed);
                    }
                    tokio::spawn(async move {
                        let mut buf = [0u8; 1024];
                        if s.read_exact(&mut buf).await.is_err() {
                            return;
                        }
                        if buf[..4] == smc_tokio::proto::clc::CLC_EYECATCHER {
                            PROPOSALS.fetch_add(1, Relaxed);
                        }
                        let _ = s.write_all(&buf).await;
                        let _ = s.read(&mut buf).await;
                    });
                }
            });
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while lines.next_line().await?.is_some() {
                println!("CONNS {} SMC {} PROPOSALS {}", CONNS.load(Relaxed), SMC.load(Relaxed), PROPOSALS.load(Relaxed));
                std::io::stdout().flush()?;
            }
            Ok(())
        }
        Some("squat-full") => {
            let name = args.get(1).ok_or_else(|| std::io::Error::other("squat-full needs NAME"))?.as_bytes().to_vec();
            let stream = args.get(2).is_some_and(|a| a == "stream");
            let ty = if stream { libc::SOCK_STREAM } else { libc::SOCK_SEQPACKET };
            let (addr, len) = abstract_addr(&name);
            // SAFETY: plain syscalls on sockets of ours; `addr` is a valid sockaddr_un of `len`
            // bytes.
            let l = cvt(unsafe { libc::socket(libc::AF_UNIX, ty, 0) })?;
            // SAFETY: as above.
            cvt(unsafe { libc::bind(l, (&addr as *const libc::sockaddr_un).cast(), len) })?;
            // SAFETY: as above.
            cvt(unsafe { libc::listen(l, if stream { 1 } else { 0 }) })?;
            if !stream {
                // One connection fills a backlog of 0 (raw descriptors, open until the process
                // ends); the next finds it full. Non-blocking both: whoever connected first,
                // nothing waits.
                let connect = || -> std::io::Result<()> {
                    // SAFETY: as above.
                    let d = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK, 0) })?;
                    // SAFETY: as above.
                    cvt(unsafe { libc::connect(d, (&addr as *const libc::sockaddr_un).cast(), len) }).map(drop)
                };
                connect()?;
                match connect() {
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                    other => return Err(std::io::Error::other(format!("the queue is not full: {other:?}"))),
                }
            }
            println!("SQUATTING");
            let _ = std::io::stdout().flush();
            let mut rest = String::new();
            let _ = tokio::io::BufReader::new(tokio::io::stdin()).read_to_string(&mut rest).await;
            Ok(())
        }
        Some("squat") => {
            let name = args.get(1).ok_or_else(|| std::io::Error::other("squat needs NAME"))?.clone();
            let secs: u64 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(2);
            let s = tokio::task::spawn_blocking(move || squat(&[name], secs, false)).await??;
            println!("SQUAT conns={} bytes={} fds={}", s.conns, s.bytes, s.fds);
            Ok(())
        }
        Some("squat-linger") => {
            let secs: u64 = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(2);
            let names = args[2.min(args.len())..].to_vec();
            let s = tokio::task::spawn_blocking(move || squat(&names, secs, true)).await??;
            println!("SQUAT conns={} bytes={} fds={} queued={}", s.conns, s.bytes, s.fds, s.queued);
            Ok(())
        }
        Some("knock-linger") => {
            let name = args.get(1).ok_or_else(|| std::io::Error::other("knock-linger needs NAME"))?.clone();
            let n: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(1);
            let secs: u64 = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(2);
            tokio::task::spawn_blocking(move || knock_linger(name.as_bytes(), n, secs)).await??;
            Ok(())
        }
        Some("side-hold") => {
            let name = args.get(1).ok_or_else(|| std::io::Error::other("side-hold needs NAME"))?.clone();
            let n: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(1);
            let silent = args.get(3).is_some_and(|a| a == "silent");
            tokio::task::spawn_blocking(move || side_hold(name.as_bytes(), n, silent)).await??;
            Ok(())
        }
        Some("claim") => {
            let addr: std::net::SocketAddr =
                args.get(1).ok_or_else(|| std::io::Error::other("claim needs ADDR"))?.parse().map_err(std::io::Error::other)?;
            let port: u16 = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
            let cookie: u64 = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(0);
            let secs: u64 = args.get(4).and_then(|n| n.parse().ok()).unwrap_or(2);
            tokio::task::spawn_blocking(move || claim(addr, port, cookie, secs)).await?;
            Ok(())
        }
        _ => Err(std::io::Error::other("usage: smc-test-peer serve|hold|client ADDR|blast ADDR|sink ADDR|reset ADDR|hold-clients ADDR N|lowfd ADDR N|settings|squat NAME SECS|squat-full NAME [stream]|squat-linger SECS NAME...|knock-linger NAME N SECS|side-hold NAME N [silent]|claim ADDR PORT SECS")),
    }
}

// ----- door attacks, by hand (raw syscalls; of the crate only its public wire formats) ---------

fn cvt(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn abstract_addr(name: &[u8]) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path[1..].iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    (addr, (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t)
}

/// What a squatter saw.
struct Squat {
    conns: usize,
    bytes: usize,
    fds: usize,
    /// Lingering sockets it managed to queue into connections.
    queued: usize,
}

fn seqpacket_listen(name: &[u8]) -> std::io::Result<libc::c_int> {
    // SAFETY: plain syscalls on a socket this function owns.
    let l = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK, 0) })?;
    let (addr, len) = abstract_addr(name);
    // SAFETY: as above, with a valid address.
    cvt(unsafe { libc::bind(l, (&addr as *const libc::sockaddr_un).cast(), len) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::listen(l, 64) })?;
    Ok(l)
}

fn seqpacket_connect(name: &[u8]) -> std::io::Result<libc::c_int> {
    // SAFETY: plain syscalls on a socket this function owns.
    let d = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0) })?;
    let (a, len) = abstract_addr(name);
    // SAFETY: valid address.
    cvt(unsafe { libc::connect(d, (&a as *const libc::sockaddr_un).cast(), len) })?;
    Ok(d)
}

/// Sends `data` on the Unix socket `d` with descriptor `fd` attached (SCM_RIGHTS).
fn send_with_fd(d: libc::c_int, data: &[u8], fd: libc::c_int) -> std::io::Result<()> {
    let mut data = data.to_vec();
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data; CMSG macros stay within `cbuf` (CMSG_SPACE(4) is 24 bytes).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(4) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as _;
        libc::CMSG_DATA(c).cast::<libc::c_int>().write_unaligned(fd);
        cvt(libc::sendmsg(d, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) as libc::c_int)?;
    }
    Ok(())
}

fn set_int(fd: libc::c_int, level: libc::c_int, name: libc::c_int, v: libc::c_int) {
    // SAFETY: valid option value of the size given.
    unsafe { libc::setsockopt(fd, level, name, (&v as *const libc::c_int).cast(), 4) };
}

/// A listener whose connections are accepted and never read, with small buffers: a socket
/// connected to it and filled holds unsent data, so a lingering close of it waits.
struct Tarpit {
    listener: std::net::TcpListener,
    /// The accepted ends, held (never read) while the attack lasts.
    held: Vec<std::net::TcpStream>,
}

impl Tarpit {
    fn new() -> std::io::Result<Tarpit> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        use std::os::fd::AsRawFd;
        set_int(listener.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 4096);
        Ok(Tarpit { listener, held: Vec::new() })
    }

    /// A TCP socket whose last close blocks for an hour: SO_LINGER {1, 3600} with unsent data
    /// towards a peer that never reads.
    fn lingering(&mut self) -> std::io::Result<libc::c_int> {
        let addr = self.listener.local_addr()?;
        // SAFETY: plain syscalls on a socket this function owns.
        let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) })?;
        set_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF, 4096);
        let sin = match addr {
            std::net::SocketAddr::V4(a) => libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                sin_zero: [0; 8],
            },
            std::net::SocketAddr::V6(_) => return Err(std::io::Error::other("v4 only")),
        };
        // SAFETY: valid sockaddr_in.
        cvt(unsafe { libc::connect(s, (&sin as *const libc::sockaddr_in).cast(), 16) })?;
        let (peer, _) = self.listener.accept()?;
        self.held.push(peer);
        // SAFETY: plain fcntl on our socket.
        unsafe { libc::fcntl(s, libc::F_SETFL, libc::O_NONBLOCK) };
        let chunk = [0x55u8; 65536];
        // SAFETY: `chunk` is a valid buffer of its length.
        while unsafe { libc::send(s, chunk.as_ptr().cast(), chunk.len(), libc::MSG_NOSIGNAL) } > 0 {}
        set_linger(s, Some(3600));
        Ok(s)
    }
}

/// `SO_LINGER` on `fd`: on for `secs`, or off.
fn set_linger(fd: libc::c_int, secs: Option<i32>) {
    let l = libc::linger { l_onoff: i32::from(secs.is_some()), l_linger: secs.unwrap_or(0) };
    // SAFETY: valid option value of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

fn close(fd: libc::c_int) {
    // SAFETY: the caller owns `fd` and does not use it again.
    unsafe { libc::close(fd) };
}

/// Queues the lingering socket `s` into the Unix socket `d` and closes our copy of it; when
/// the victim closed `d` first (the send failed), turns the linger off before closing, since
/// then our close is its last. Whether it was queued.
fn queue_lingering(d: libc::c_int, data: &[u8], s: libc::c_int) -> bool {
    let queued = send_with_fd(d, data, s).is_ok();
    if !queued {
        set_linger(s, None);
    }
    close(s);
    queued
}

/// Squats on door names: accepts whatever connects for `secs` and counts what it is given;
/// with `linger`, first queues a lingering socket into every connection (and closes its copy,
/// so that the victim's close of its end is the socket's last).
fn squat(names: &[String], secs: u64, linger: bool) -> std::io::Result<Squat> {
    let listeners = names.iter().map(|n| seqpacket_listen(n.as_bytes())).collect::<std::io::Result<Vec<_>>>()?;
    println!("SQUATTING");
    std::io::stdout().flush()?;
    let mut tarpit = Tarpit::new()?;
    let mut out = Squat { conns: 0, bytes: 0, fds: 0, queued: 0 };
    let mut open = Vec::new();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        let mut idle = true;
        for &l in &listeners {
            // SAFETY: plain syscall on our listening socket.
            let c = unsafe { libc::accept4(l, std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_NONBLOCK) };
            if c >= 0 {
                idle = false;
                out.conns += 1;
                if linger {
                    let s = tarpit.lingering()?;
                    out.queued += usize::from(queue_lingering(c, b"SQUAT", s));
                }
                open.push(c);
            }
        }
        for &c in &open {
            let mut buf = [0u8; 256];
            let mut cbuf = [0u64; 16];
            let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
            // SAFETY: msghdr is plain data; the buffers outlive the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
            // SAFETY: as above.
            let n = unsafe { libc::recvmsg(c, &mut msg, 0) };
            if n > 0 {
                out.bytes += n as usize;
                if msg.msg_controllen > 0 {
                    out.fds += 1;
                }
            }
        }
        if idle {
            // Wait for the next connection on any name (a probe may last only microseconds).
            let mut pfds: Vec<libc::pollfd> =
                listeners.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
            // SAFETY: `pfds` is a valid array of its length for the call.
            unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 5) };
        }
    }
    Ok(out)
}

/// Knocks `n` times on the abstract name `name`, each time queueing a lingering socket (and
/// closing our copies of it and of the connection), then holds the sockets' peers for `secs`.
fn knock_linger(name: &[u8], n: usize, secs: u64) -> std::io::Result<()> {
    let mut tarpit = Tarpit::new()?;
    let mut knocked = 0;
    for _ in 0..n {
        let s = tarpit.lingering()?;
        let Ok(d) = seqpacket_connect(name) else {
            queue_lingering(-1, b"", s);
            continue;
        };
        knocked += usize::from(queue_lingering(d, b"SMCd knock", s));
        close(d);
    }
    println!("KNOCKED {knocked}");
    std::io::stdout().flush()?;
    std::thread::sleep(std::time::Duration::from_secs(secs));
    Ok(())
}

/// Opens `n` side-channel connections at once, a lingering socket queued in each (`silent`:
/// nothing sent at all), and says after a second how many the server still holds open.
fn side_hold(name: &[u8], n: usize, silent: bool) -> std::io::Result<()> {
    let mut tarpit = Tarpit::new()?;
    let (mut conns, mut queued) = (Vec::new(), 0);
    for _ in 0..n {
        let Ok(d) = seqpacket_connect(name) else { continue };
        if !silent {
            let s = tarpit.lingering()?;
            queued += usize::from(queue_lingering(d, b"JOIN?", s));
        }
        conns.push(d);
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    let open_after = conns
        .iter()
        .filter(|&&d| {
            let mut b = [0u8; 64];
            // SAFETY: `b` is a valid buffer of its length.
            let r = unsafe { libc::recv(d, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
            r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
        })
        .count();
    println!("SIDE opened={} queued={queued} open_after={open_after}", conns.len());
    std::io::stdout().flush()?;
    Ok(())
}

/// Tries to claim another process's connection at a door: bind the victim's `port`, then
/// register that port and the victim socket's `cookie` (anyone can read cookies from
/// `sock_diag`) and wait `secs` for a verdict.
fn claim(addr: std::net::SocketAddr, port: u16, cookie: u64, secs: u64) {
    let victim = (|| -> std::io::Result<()> {
        // SAFETY: plain syscall with constant arguments.
        let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) })?;
        let one: libc::c_int = 1;
        // SAFETY: valid option value of the size given.
        cvt(unsafe {
            libc::setsockopt(s, libc::SOL_SOCKET, libc::SO_REUSEPORT, (&one as *const libc::c_int).cast(), 4)
        })?;
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: 0 },
            sin_zero: [0; 8],
        };
        // SAFETY: valid sockaddr_in.
        cvt(unsafe { libc::bind(s, (&sin as *const libc::sockaddr_in).cast(), 16) })?;
        Ok(())
    })();
    let victim = match victim {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("errno{}", e.raw_os_error().unwrap_or(-1)),
    };
    let name = format!("smc-tokio/d{}/{addr}/solo", smc_tokio::proto::door::DOOR_VERSION);
    let registered = (|| -> std::io::Result<libc::c_int> {
        let d = seqpacket_connect(name.as_bytes())?;
        let p = smc_tokio::proto::clc::ClcMessage::Proposal(smc_tokio::proto::clc::Proposal {
            secret: smc_tokio::proto::clc::Secret([7; 16]),
            rmb_size: 64 << 10,
            shm: Some(smc_tokio::proto::clc::ShmOffer { link_group: 0 }),
            rdma: None,
        });
        let head = RegisterHead { instance: 1, cookie, port };
        let frame = head.encode_frame(1, &p.encode().map_err(std::io::Error::other)?);
        // SAFETY: `frame` is a valid buffer of its length.
        cvt(unsafe { libc::send(d, frame.as_ptr().cast(), frame.len(), libc::MSG_NOSIGNAL) as libc::c_int })?;
        Ok(d)
    })();
    println!("CLAIM victim_port={victim} registered={}", if registered.is_ok() { "ok" } else { "err" });
    let _ = std::io::stdout().flush();
    let recv = |d: libc::c_int, secs: u64| -> Option<Vec<u8>> {
        let tv = libc::timeval { tv_sec: secs as libc::time_t, tv_usec: 0 };
        // SAFETY: valid option value of the size given.
        unsafe {
            libc::setsockopt(
                d,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        let mut b = [0u8; 2048];
        // SAFETY: `b` is a valid buffer of its length.
        let n = unsafe { libc::recv(d, b.as_mut_ptr().cast(), b.len(), 0) };
        (n > 0).then(|| b[..n as usize].to_vec())
    };
    // A listener answers a registration at a solo door at once, for the registrant's own
    // proposal: an Accept is no verdict on anyone's connection. The claim is the Confirm that
    // names the victim's connection, once the victim has connected.
    let clc =
        |m: &[u8]| match smc_tokio::proto::door::DoorFrame::decode(m).map(|(_, p)| smc_tokio::proto::clc::decode(p)) {
            Ok(Ok(smc_tokio::proto::clc::Decoded::Message(m, _))) => Some(m),
            _ => None,
        };
    let verdict = match registered {
        Ok(d) => match recv(d, secs) {
            None => "none".to_string(),
            Some(m) => match clc(&m) {
                Some(smc_tokio::proto::clc::ClcMessage::Accept(a)) => {
                    std::thread::sleep(std::time::Duration::from_secs(secs));
                    let smc_tokio::proto::clc::LinkInfo::Shm(info) = a.link else { return };
                    let confirm = smc_tokio::proto::clc::ClcMessage::Confirm(smc_tokio::proto::clc::Confirm {
                        secret: a.secret,
                        link: smc_tokio::proto::clc::LinkInfo::Shm(smc_tokio::proto::clc::ShmLinkInfo {
                            link_group: info.link_group,
                            rmb_slot: 0,
                            rmb_size: 64 << 10,
                            socket_name: Vec::new(),
                        }),
                    });
                    let t = smc_tokio::proto::door::ConnectedTuple {
                        local: std::net::SocketAddr::new(addr.ip(), port),
                        peer: addr,
                    };
                    let frame = t.encode_frame(1, &confirm.encode().unwrap_or_default());
                    // SAFETY: `frame` is a valid buffer of its length.
                    unsafe { libc::send(d, frame.as_ptr().cast(), frame.len(), libc::MSG_NOSIGNAL) };
                    match recv(d, secs).as_deref().and_then(clc) {
                        Some(smc_tokio::proto::clc::ClcMessage::Commit(_)) => "accept-then-commit".into(),
                        Some(smc_tokio::proto::clc::ClcMessage::Decline(_)) => "accept-then-decline".into(),
                        other => format!("accept-then-{other:?}"),
                    }
                }
                _ => format!("{}", m[5]),
            },
        },
        Err(_) => "none".into(),
    };
    println!("VERDICT {verdict}");
    let _ = std::io::stdout().flush();
}
