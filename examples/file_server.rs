//! An nginx-style HTTP/1.1 keep-alive static file server: headers written under a cork guard,
//! the body sent with `sendfile`, one push per response.
//!
//! ```text
//! cargo run --release -p examples --example file_server -- [ADDR] [--root DIR] [--plain-writes] [--no-cork] [--tcp]
//! curl http://127.0.0.1:8081/index.html
//! wrk -c 100 -d 10 http://127.0.0.1:8081/index.html
//! ```
//!
//! `--plain-writes` reads the file and writes the body with `write_all` (nginx `sendfile off`);
//! `--no-cork` sends headers and body without a cork (nginx `tcp_nopush off`); `--tcp` serves
//! over plain tokio TCP with plain writes, the baseline. A request may also pick the mode with
//! `?mode=cork-sendfile|sendfile|write`.

use std::path::PathBuf;
use std::sync::Arc;

use examples::{serve_plain, serve_smc, ServeMode};
use smc_tokio::SmcListener;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut addr = "127.0.0.1:8081".to_string();
    let mut root = std::env::current_dir()?;
    let mut mode = ServeMode::CORK_SENDFILE;
    let mut tcp = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--root" => root = PathBuf::from(args.next().ok_or_else(|| std::io::Error::other("--root needs DIR"))?),
            "--plain-writes" => mode.sendfile = false,
            "--no-cork" => mode.cork = false,
            "--tcp" => tcp = true,
            other if !other.starts_with('-') => addr = other.to_string(),
            other => return Err(std::io::Error::other(format!("unknown argument {other}"))),
        }
    }
    let root = Arc::new(root);
    if tcp {
        let l = tokio::net::TcpListener::bind(&addr).await?;
        eprintln!("file_server (plain tcp, plain writes) on http://{} serving {}", l.local_addr()?, root.display());
        loop {
            let (s, _) = l.accept().await?;
            let root = root.clone();
            tokio::spawn(async move { serve_plain(s, &root).await });
        }
    }
    let l = SmcListener::bind(&addr).await?;
    eprintln!("file_server ({mode:?}) on http://{} serving {}", l.local_addr()?, root.display());
    loop {
        let (s, peer) = match l.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let root = root.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_smc(s, &root, mode).await {
                if e.kind() != std::io::ErrorKind::ConnectionReset {
                    eprintln!("{peer}: {e}");
                }
            }
        });
    }
}
