//! A peer process for the integration tests (so a test can kill it with SIGKILL, or run it in
//! another network namespace).
//!
//! ```text
//! smc-test-peer serve          listen on 127.0.0.1:0, print "PORT <n>", echo every connection
//! smc-test-peer hold           listen, print "PORT <n>", accept and never read
//! smc-test-peer client ADDR    connect, print "TRANSPORT <t>", echo-check 64 KiB, print "OK"
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
        _ => Err(std::io::Error::other("usage: smc-test-peer serve|hold|client ADDR|settings")),
    }
}
