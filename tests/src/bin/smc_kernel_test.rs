//! smc-tokio against the Linux kernel's own SMC, for the soft-RoCE test bed's `two-kernel` mode
//! (`tests/rdma-vm/run.sh two-kernel`), where both guests run the kernel's SMC-R over `rxe0`
//! and the peer is `ksmc-echo` (C, `AF_SMC`).
//!
//! ```text
//! smc-kernel-test abi                       the kernel layout facts the crate assumes
//! smc-kernel-test server PORT CONNS         an AF_SMC SmcListener; serves CONNS exchanges
//! smc-kernel-test client IP PORT UP DOWN    one exchange through an AF_SMC SmcStream
//! smc-kernel-test limit                     the kernel's global handshake limitation, on and off
//! ```
//!
//! An exchange (the same in `ksmc-echo.c`): the client sends `UP` and `DOWN` as two u64 (little
//! endian), then `UP` pattern bytes; the server checks them and answers with `DOWN` as a u64
//! and `DOWN` pattern bytes. smc-tokio sends its part as a header written under a cork guard
//! and the pattern by `sendfile` (the kernel's `TCP_CORK` and `sendfile(2)` on the `AF_SMC`
//! socket). Each side checks its connection's transport with the kernel's `smc_diag` (through
//! `SmcStream::transport`) and prints one line:
//!
//! ```text
//! KERNEL-INTEROP kernel-client->smc-tokio smc-r
//! KERNEL-INTEROP smc-tokio-client->kernel smc-r
//! ```
//!
//! (`smc-r` is what the guests must show; any other transport is printed as it is, and the
//! exit status is then 1.)

use std::io::{self, Write};
use std::time::Duration;

use smc_tokio::kernel::KernelMode;
use smc_tokio::{SmcListener, SmcStream, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The byte at `i` of every exchange's payload.
fn pattern(i: u64) -> u8 {
    ((i * 7 + 3) % 251) as u8
}

/// A file of `len` pattern bytes, for `sendfile`.
fn pattern_file(len: u64) -> io::Result<std::fs::File> {
    let path = std::env::temp_dir().join(format!("smc-kernel-test-{}-{len}", std::process::id()));
    let mut f = std::fs::File::create(&path)?;
    let mut chunk = Vec::with_capacity(1 << 16);
    let mut at = 0u64;
    while at < len {
        chunk.clear();
        let n = (len - at).min(1 << 16);
        chunk.extend((at..at + n).map(pattern));
        f.write_all(&chunk)?;
        at += n;
    }
    drop(f);
    let f = std::fs::File::open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(f)
}

async fn read_checked(s: &mut SmcStream, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 16];
    let mut at = 0u64;
    while at < len {
        let want = (len - at).min(buf.len() as u64) as usize;
        let n = s.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("EOF after {at} of {len} bytes")));
        }
        if let Some(i) = (0..n).find(|&i| buf[i] != pattern(at + i as u64)) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("wrong byte at {}", at + i as u64)));
        }
        at += n as u64;
    }
    Ok(())
}

/// Sends `len` pattern bytes after `header`: the header under a cork guard, the bytes by
/// sendfile, so they leave together when the guard drops.
async fn send_corked(s: &mut SmcStream, header: &[u8], len: u64) -> io::Result<()> {
    let file = pattern_file(len)?;
    let cork = s.cork();
    s.write_all(header).await?;
    let sent = s.sendfile(&file, 0, len).await?;
    drop(cork);
    if sent != len {
        return Err(io::Error::other(format!("sendfile sent {sent} of {len} bytes")));
    }
    s.flush().await
}

fn verdict(direction: &str, t: Transport) -> bool {
    let name = match t {
        Transport::KernelSmcR => "smc-r".to_string(),
        Transport::KernelSmcD => "smc-d".to_string(),
        other => other.to_string(),
    };
    println!("KERNEL-INTEROP {direction} {name}");
    t == Transport::KernelSmcR
}

async fn server(port: u16, conns: usize) -> io::Result<bool> {
    let listener = SmcListener::builder().kernel(KernelMode::On).bind(("0.0.0.0", port)).await?;
    if !listener.is_kernel_smc() {
        return Err(io::Error::other("the listener is not an AF_SMC socket (no kernel SMC here?)"));
    }
    println!("smc-kernel-test: AF_SMC listener on {}", listener.local_addr()?);
    let mut all = true;
    for i in 0..conns {
        let (mut s, peer) = listener.accept().await?;
        let t = s.transport();
        println!("smc-kernel-test: connection {} from {peer}: {t}", i + 1);
        let mut hdr = [0u8; 16];
        s.read_exact(&mut hdr).await?;
        let up = u64::from_le_bytes(hdr[..8].try_into().unwrap_or_default());
        let down = u64::from_le_bytes(hdr[8..].try_into().unwrap_or_default());
        read_checked(&mut s, up).await?;
        send_corked(&mut s, &down.to_le_bytes(), down).await?;
        // The client closes once it has everything.
        let mut rest = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(60), s.read(&mut rest)).await.map_err(io::Error::other)??;
        if n != 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bytes after the exchange"));
        }
        println!("smc-kernel-test: received {up} bytes intact, sent {down} (cork + sendfile)");
        all &= verdict("kernel-client->smc-tokio", t);
    }
    println!("smc-kernel-test: stats\n{}", smc_tokio::stats());
    Ok(all)
}

async fn client(ip: &str, port: u16, up: u64, down: u64) -> io::Result<bool> {
    let addr = format!("{ip}:{port}");
    // The server guest may not listen yet.
    let mut s = loop {
        match SmcStream::builder().kernel(KernelMode::On).connect(&addr).await {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            Err(e) => return Err(e),
        }
    };
    let t = s.transport();
    println!("smc-kernel-test: connected to {addr}: {t}");
    let mut hdr = up.to_le_bytes().to_vec();
    hdr.extend_from_slice(&down.to_le_bytes());
    send_corked(&mut s, &hdr, up).await?;
    let mut len = [0u8; 8];
    s.read_exact(&mut len).await?;
    if u64::from_le_bytes(len) != down {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the server announced another length"));
    }
    read_checked(&mut s, down).await?;
    s.shutdown().await?;
    println!("smc-kernel-test: sent {up} bytes (cork + sendfile), received {down} intact");
    println!("smc-kernel-test: stats\n{}", smc_tokio::stats());
    Ok(verdict("smc-tokio-client->kernel", t))
}

/// The kernel's global handshake limitation over its generic-netlink family: read, set,
/// read back, restore.
fn limit() -> io::Result<bool> {
    let before = smc_tokio::kernel::limit_handshake()?;
    smc_tokio::kernel::set_limit_handshake(!before)?;
    let flipped = smc_tokio::kernel::limit_handshake()?;
    smc_tokio::kernel::set_limit_handshake(before)?;
    let after = smc_tokio::kernel::limit_handshake()?;
    println!("smc-kernel-test: kernel handshake limitation {before} -> {flipped} -> {after}");
    Ok(flipped != before && after == before)
}

fn usage() -> ! {
    eprintln!("usage: smc-kernel-test abi | server PORT CONNS | client IP PORT UP DOWN | limit");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> u64 { args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| usage()) };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let result = match args.first().map(String::as_str) {
        Some("abi") if args.len() == 1 => {
            print!("{}", smc_tokio::kernel::abi_report());
            Ok(true)
        }
        Some("server") if args.len() == 3 => rt.block_on(server(num(1) as u16, num(2) as usize)),
        Some("client") if args.len() == 5 => rt.block_on(client(&args[1], num(2) as u16, num(3), num(4))),
        Some("limit") if args.len() == 1 => limit(),
        _ => usage(),
    };
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("smc-kernel-test: {e}");
            std::process::exit(1)
        }
    }
}
