//! Sends a message to an echo server with an `SmcStream` and prints the echo.
//!
//! ```text
//! cargo run -p examples --example echo_client -- 127.0.0.1:7000 "hello there"
//! ```

use smc_tokio::SmcStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:7000".to_string());
    let msg = args.next().unwrap_or_else(|| "hello over smc-tokio".to_string());
    let mut stream = SmcStream::connect(&addr).await?;
    eprintln!("connected to {addr} over {}", stream.transport());
    stream.write_all(msg.as_bytes()).await?;
    stream.shutdown().await?; // half-close: the server echoes, sees EOF, and closes
    let mut echo = Vec::new();
    stream.read_to_end(&mut echo).await?;
    println!("{}", String::from_utf8_lossy(&echo));
    Ok(())
}
