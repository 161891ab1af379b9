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
//! ```

use std::io::Write;

use smc_tokio::{SmcListener, SmcStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
            for i in 0..12 {
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
            Ok(())
        }
        _ => Err(std::io::Error::other("usage: smc-test-peer serve|hold|client ADDR|blast ADDR|sink ADDR|reset ADDR|hold-clients ADDR N|lowfd ADDR N|settings")),
    }
}
