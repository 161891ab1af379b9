//! Thousands of concurrent short connections from this process to a server in another process,
//! with the machine loaded by two busy loops and the server SIGSTOPped for half a second in the
//! middle of the largest storm. Each connection writes 1 KiB, reads its echo, checks it and
//! closes. Nothing may fail, nothing may differ, and no Proposal may reach the server's
//! application; how many connections got shared memory is reported (it falls when the server
//! is stopped or swamped: overload turns into TCP, never into errors). Alone in its binary.

use std::time::{Duration, Instant};

use smc_tokio::SmcStream;
use tests::{bounded, Rng};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

struct Busy(Vec<std::process::Child>);

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn storm(addr: std::net::SocketAddr, n: usize, stop: Option<u32>) -> (usize, usize) {
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tasks.push(tokio::spawn(async move {
            let data = Rng::new(i as u64 + 1).bytes(1024);
            let mut s = SmcStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
            s.write_all(&data).await.map_err(|e| format!("write: {e}"))?;
            let mut back = vec![0u8; 1024];
            s.read_exact(&mut back).await.map_err(|e| format!("read: {e}"))?;
            if back != data {
                return Err("echo differs".to_string());
            }
            Ok::<_, String>(s.transport().is_smc())
        }));
    }
    if let Some(pid) = stop {
        // Mid-storm: stop the server for half a second.
        tokio::time::sleep(Duration::from_millis(100)).await;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        tokio::time::sleep(Duration::from_millis(500)).await;
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }
    let mut smc = 0;
    let mut failures = Vec::new();
    for t in tasks {
        match bounded(120, t).await.unwrap() {
            Ok(true) => smc += 1,
            Ok(false) => {}
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{} of {n} connections failed, first: {}", failures.len(), failures[0]);
    (smc, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_short_connections_to_another_process_under_load_and_a_stopped_server() {
    tests::raise_fd_limit();
    let busy = Busy(
        (0..2).map(|_| std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap()).collect(),
    );
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
        .arg("storm-serve")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = server.id().unwrap();
    let mut stdin = server.stdin.take().unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let port: u16 = bounded(10, lines.next_line()).await.unwrap().unwrap()[5..].parse().unwrap();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut report = Vec::new();
    for (n, stop) in [(200, None), (1000, None), (3000, Some(pid))] {
        let t = Instant::now();
        let (smc, total) = storm(addr, n, stop).await;
        report.push(format!(
            "{n} concurrent{}: {smc} of {total} over smc-d ({:.0}%), {:.1} s",
            if stop.is_some() { ", server stopped 0.5 s" } else { "" },
            100.0 * smc as f64 / total as f64,
            t.elapsed().as_secs_f64()
        ));
    }
    stdin.write_all(b"report\n").await.unwrap();
    let line = bounded(10, lines.next_line()).await.unwrap().unwrap();
    drop(busy);
    eprintln!("STORM {}\nSTORM server: {line}", report.join("\nSTORM "));
    let f: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    let (conns, proposals) = (f[0], f[2]);
    assert_eq!(proposals, 0, "no proposal reached the server's application");
    assert_eq!(conns, 4200, "the server accepted every connection once: {line}");
}
