//! A fixed number of 14-byte round trips with both ends on one current-thread runtime
//! (`write_all`, `read_exact`, then back), for instruction counts: the path's own cost, with
//! no wait and no line crossing between CPUs. Run it under callgrind twice with different
//! counts; the difference over the difference in round trips is the marginal cost of one.
//!
//! ```text
//! cargo build --release -p benches --bin rrprof
//! valgrind --tool=callgrind --callgrind-out-file=cg.a target/release/rrprof 20000
//! valgrind --tool=callgrind --callgrind-out-file=cg.b target/release/rrprof 70000
//! ```
//!
//! (`callgrind_annotate --inclusive=yes cg.b` then gives each function's share.) A second
//! argument measures another operation the same way: `flush` (a flush with nothing written
//! since the last) or `empty` (a `poll_read` of a stream with nothing to read, then a yield),
//! the two operations an HTTP/2 connection's task makes at each of its polls.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn main() -> std::io::Result<()> {
    let n: usize = match std::env::args().nth(1) {
        Some(s) => s.parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        None => 50_000,
    };
    let mode = std::env::args().nth(2);
    if !matches!(mode.as_deref(), None | Some("flush" | "empty")) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("unknown operation {mode:?}: none (round trips), `flush` or `empty`"),
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let l = smc_tokio::SmcListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let (a, b) = tokio::join!(smc_tokio::SmcStream::connect(addr), l.accept());
        let (mut a, mut b) = (a?, b?.0);
        if !a.transport().is_smc() {
            return Err(std::io::Error::other(format!("the pair is {}, not smc", a.transport())));
        }
        if mode.as_deref() == Some("flush") {
            // Flushes with nothing written since the last: what an HTTP/2 connection's task
            // does at each of its polls.
            for _ in 0..n {
                b.flush().await?;
            }
            return Ok(());
        }
        if mode.as_deref() == Some("empty") {
            // Reads that find nothing: each poll of an empty stream, as a reader that reads until
            // `Pending` makes after every message.
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let mut buf = [0u8; 14];
            for _ in 0..n {
                let mut rb = tokio::io::ReadBuf::new(&mut buf);
                let r = tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut b), &mut cx, &mut rb);
                if r.is_ready() {
                    return Err(std::io::Error::other("a read of an empty stream was ready"));
                }
                tokio::task::yield_now().await;
            }
            return Ok(());
        }
        let msg = [0x5au8; 14];
        let mut buf = [0u8; 14];
        for _ in 0..n {
            a.write_all(&msg).await?;
            b.read_exact(&mut buf).await?;
            b.write_all(&buf).await?;
            a.read_exact(&mut buf).await?;
        }
        Ok(())
    })
}
