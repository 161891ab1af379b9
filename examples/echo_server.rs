//! An echo server on an `SmcListener`.
//!
//! ```text
//! cargo run -p examples --example echo_server -- 127.0.0.1:7000
//! cargo run -p examples --example echo_client -- 127.0.0.1:7000 "hello there"
//! ```

use smc_tokio::SmcListener;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:7000".to_string());
    let listener = SmcListener::bind(&addr).await?;
    eprintln!("echo_server listening on {}", listener.local_addr()?);
    loop {
        let (stream, peer) = listener.accept().await?;
        eprintln!("{peer} connected over {}", stream.transport());
        tokio::spawn(async move {
            let (mut rd, mut wr) = stream.into_split();
            match tokio::io::copy(&mut rd, &mut wr).await {
                Ok(n) => eprintln!("{peer} done after {n} bytes"),
                Err(e) => eprintln!("{peer}: {e}"),
            }
        });
    }
}
