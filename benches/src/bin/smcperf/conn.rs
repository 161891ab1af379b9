//! Where the client connects, the stream it connects with (smc-tokio, tokio TCP or a Unix socket), and the servers `local` and `server` start.

use super::*;

/// Where the client connects.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) tcp: SocketAddr,
    pub(crate) unix: Option<PathBuf>,
    pub(crate) shm: ShmConfig,
    /// The file server: over an `SmcListener`, and over a tokio `TcpListener`.
    pub(crate) file_smc: SocketAddr,
    pub(crate) file_tcp: SocketAddr,
    /// The http and grpc servers.
    pub(crate) web: web::WebAddrs,
}

/// The `file` scenario's rows: transport and how the server writes the response.
pub(crate) const FILE_VARIANTS: [(Kind, &str); 4] =
    [(Kind::Smc, "cork-sendfile"), (Kind::Smc, "write"), (Kind::Smc, "sendfile"), (Kind::Tcp, "write")];

// ---------------------------------------------------------------------------------------------
// A stream of any of the three kinds.

pub(crate) enum Conn {
    Smc(SmcStream),
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    pub(crate) fn negotiated(&self) -> &'static str {
        match self {
            Conn::Smc(s) => s.transport().as_str(),
            Conn::Tcp(_) => "tcp",
            Conn::Unix(_) => "unix",
        }
    }
}

impl AsyncRead for Conn {
    // Inlined into the scenario loops (`workload.rs`, another codegen unit): the dispatch is
    // part of every measured operation.
    #[inline]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Smc(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    // Inlined into the scenario loops (`workload.rs`, another codegen unit): the dispatch is
    // part of every measured operation.
    #[inline]
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Smc(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    // Inlined into the scenario loops (`workload.rs`, another codegen unit): the dispatch is
    // part of every measured operation.
    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Smc(s) => Pin::new(s).poll_flush(cx),
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
    // Inlined into the scenario loops (`workload.rs`, another codegen unit): the dispatch is
    // part of every measured operation.
    #[inline]
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Smc(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

pub(crate) async fn connect(kind: Kind, target: &Target) -> io::Result<Conn> {
    Ok(match kind {
        Kind::Smc | Kind::Ksmc => {
            let kernel = if kind == Kind::Ksmc { KernelMode::On } else { KernelMode::Off };
            let s = SmcStream::builder()
                .policy(Policy::Auto)
                .shm(target.shm.clone())
                .kernel(kernel)
                .connect(target.tcp)
                .await?;
            s.set_nodelay(true)?;
            Conn::Smc(s)
        }
        Kind::Tcp => {
            let s = TcpStream::connect(target.tcp).await?;
            s.set_nodelay(true)?;
            Conn::Tcp(s)
        }
        Kind::Unix => {
            let path = target.unix.as_ref().ok_or_else(|| io::Error::other("no --unix path for the unix transport"))?;
            Conn::Unix(UnixStream::connect(path).await?)
        }
        Kind::Mem => return Err(io::Error::other("mem runs only the http, http-close and grpc scenarios")),
    })
}

// ---------------------------------------------------------------------------------------------
// Server

/// A stream that can be read in place (`AsyncBufRead`), as its users would: smc-tokio's
/// stream itself (it lends its receive ring), tokio's through a `BufReader`.
pub(crate) trait ReadInPlace: AsyncRead + AsyncWrite + Unpin {
    fn in_place(&mut self) -> impl tokio::io::AsyncBufRead + Unpin + '_;
}

impl ReadInPlace for SmcStream {
    fn in_place(&mut self) -> impl tokio::io::AsyncBufRead + Unpin + '_ {
        self
    }
}

impl ReadInPlace for TcpStream {
    fn in_place(&mut self) -> impl tokio::io::AsyncBufRead + Unpin + '_ {
        tokio::io::BufReader::with_capacity(65536, self)
    }
}

impl ReadInPlace for UnixStream {
    fn in_place(&mut self) -> impl tokio::io::AsyncBufRead + Unpin + '_ {
        tokio::io::BufReader::with_capacity(65536, self)
    }
}

/// Every byte of `b` added up: the stand-in for a parser that looks at each byte once.
/// Written to run near memory speed with baseline SSE2 (about 30 GB/s on the development VM
/// from L2, where a plain `u8` sum ran at 10): 8 bytes at a time into four 16-bit lanes, folded
/// every 1 KiB, before a lane could overflow (128 words x 510).
#[inline]
pub(crate) fn byte_sum(b: &[u8]) -> u64 {
    const LOW: u64 = 0x00ff_00ff_00ff_00ff;
    let fold = |acc: u64| (acc & 0xffff) + ((acc >> 16) & 0xffff) + ((acc >> 32) & 0xffff) + (acc >> 48);
    let mut total = 0u64;
    let mut blocks = b.chunks_exact(1024);
    for block in &mut blocks {
        let mut acc = 0u64;
        for w in block.chunks_exact(8) {
            let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
            acc += (w & LOW) + ((w >> 8) & LOW);
        }
        total += fold(acc);
    }
    total + blocks.remainder().iter().map(|&x| u64::from(x)).sum::<u64>()
}

pub(crate) async fn serve_conn<S: ReadInPlace>(mut s: S) -> io::Result<()> {
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr).await?;
    let mode = u32::from_le_bytes(hdr[..4].try_into().unwrap_or_default());
    let size = u32::from_le_bytes(hdr[4..].try_into().unwrap_or_default()) as usize;
    if size == 0 || size > 64 << 20 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad size"));
    }
    match mode {
        MODE_RR => {
            // Exactly one message: a zeroed 64 KiB per connection cost the server about a fifth
            // of its CPU in crr (perf), the same for every transport, and diluted their ratios.
            let mut buf = PageBuf::message(size, 0);
            loop {
                match s.read_exact(&mut buf).await {
                    Ok(_) => s.write_all(&buf).await?,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        MODE_STREAM | MODE_STREAM_READ_SUM => {
            let mut buf = PageBuf::message(size.max(65536), 0);
            let (mut total, mut sum) = (0u64, 0u64);
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                if mode == MODE_STREAM_READ_SUM {
                    sum = sum.wrapping_add(byte_sum(&buf[..n]));
                }
            }
            s.write_all(&total.to_le_bytes()).await?;
            if mode == MODE_STREAM_READ_SUM {
                s.write_all(&sum.to_le_bytes()).await?;
            }
            s.shutdown().await
        }
        MODE_STREAM_BUF_SUM => {
            use tokio::io::AsyncBufReadExt;
            let (mut total, mut sum) = (0u64, 0u64);
            let mut rd = s.in_place();
            loop {
                let buf = rd.fill_buf().await?;
                if buf.is_empty() {
                    break;
                }
                sum = sum.wrapping_add(byte_sum(buf));
                let n = buf.len();
                total += n as u64;
                rd.consume(n);
            }
            drop(rd);
            s.write_all(&total.to_le_bytes()).await?;
            s.write_all(&sum.to_le_bytes()).await?;
            s.shutdown().await
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "bad mode")),
    }
}

pub(crate) struct ServerHandles {
    pub(crate) tcp_addr: SocketAddr,
    pub(crate) unix: Option<PathBuf>,
    pub(crate) file_smc: SocketAddr,
    pub(crate) file_tcp: SocketAddr,
    pub(crate) web: web::WebAddrs,
}

/// The directory the file server serves: files `f<size>` of random bytes.
pub(crate) fn file_sizes(o: &Opts) -> Vec<usize> {
    cases(o).iter().filter(|c| c.scenario == Scenario::File).map(|c| c.size).collect()
}

pub(crate) fn www_root() -> PathBuf {
    std::env::temp_dir().join(format!("smcperf-www-{}", std::process::id()))
}

pub(crate) fn make_files(sizes: &[usize]) -> io::Result<()> {
    let root = www_root();
    std::fs::create_dir_all(&root)?;
    for &n in sizes {
        let data: Vec<u8> = (0..n).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        std::fs::write(root.join(format!("f{n}")), data)?;
    }
    Ok(())
}

/// Serves the raw scenarios on a listener (an `SmcListener` or a tokio `TcpListener`: the same
/// calls, no common trait) until the runtime ends; an accept error is printed and retried 5 ms
/// later.
macro_rules! serve_raw {
    ($listener:expr) => {{
        let listener = $listener;
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((s, _)) => {
                        let _ = s.set_nodelay(true);
                        tokio::spawn(serve_conn(s));
                    }
                    Err(e) => {
                        eprintln!("smcperf server: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        })
    }};
}

/// A tokio `TcpListener` for the tcp baseline, with `SmcListener`'s backlog
/// ([`smc_tokio::net::LISTEN_BACKLOG`], 1024) rather than `TcpListener::bind`'s 128 (mio's): with
/// hundreds of concurrent connects the smaller queue overflows, and the comparison would
/// measure the backlogs, not the transports.
pub(crate) fn tcp_listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(smc_tokio::net::LISTEN_BACKLOG)
}

/// Raises this process's descriptor limit to its hard limit, so that runs with thousands of
/// concurrent connections (both ends in one process for `local`) have the descriptors they
/// need. Returns the soft limit now in force.
pub(crate) fn raise_nofile() -> u64 {
    // SAFETY: rlimit is plain data; getrlimit and setrlimit read or write only it.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
        r.rlim_cur
    }
}

/// Starts the listeners on the current runtime: an `SmcListener` (which also serves the plain
/// `tcp` clients, over TCP), a tokio `TcpListener` on the next port for the tcp baseline, and a
/// `UnixListener`.
pub(crate) async fn start_server(
    listen: &str,
    unix: Option<PathBuf>,
    shm: ShmConfig,
) -> io::Result<(ServerHandles, SocketAddr)> {
    let smc = SmcListener::builder().shm(shm.clone()).bind(listen).await?;
    let smc_addr = smc.local_addr()?;
    serve_raw!(smc);
    let tcp = tcp_listen(SocketAddr::new(smc_addr.ip(), 0))?;
    let tcp_addr = tcp.local_addr()?;
    serve_raw!(tcp);
    // The file server, on the next two ports when the main one is fixed.
    let port = |k: u16| if smc_addr.port() == 0 || listen.ends_with(":0") { 0 } else { smc_addr.port() + k };
    let file_smc = SmcListener::builder().shm(shm.clone()).bind(SocketAddr::new(smc_addr.ip(), port(1))).await?;
    let file_tcp = tcp_listen(SocketAddr::new(smc_addr.ip(), port(2)))?;
    let (file_smc_addr, file_tcp_addr) = (file_smc.local_addr()?, file_tcp.local_addr()?);
    let root = Arc::new(www_root());
    let r = root.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = file_smc.accept().await {
            let _ = s.set_nodelay(true);
            let r = r.clone();
            tokio::spawn(async move { examples::serve_smc(s, &r, examples::ServeMode::CORK_SENDFILE).await });
        }
    });
    tokio::spawn(async move {
        while let Ok((s, _)) = file_tcp.accept().await {
            let _ = s.set_nodelay(true);
            let r = root.clone();
            tokio::spawn(async move { examples::serve_plain(s, &r).await });
        }
    });
    if let Some(path) = &unix {
        let _ = std::fs::remove_file(path);
        let ul = UnixListener::bind(path)?;
        tokio::spawn(async move {
            while let Ok((s, _)) = ul.accept().await {
                tokio::spawn(serve_conn(s));
            }
        });
    }
    let web = web::start(smc_addr.ip(), shm, |k| if port(1) == 0 { 0 } else { port(3 + k) }).await?;
    Ok((ServerHandles { tcp_addr, unix, file_smc: file_smc_addr, file_tcp: file_tcp_addr, web }, smc_addr))
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_sum_adds_up_every_byte() {
        for n in [0, 1, 7, 8, 1023, 1024, 1025, 65536 + 13] {
            let b: Vec<u8> = (0..n).map(|i| (i * 131 + 7) as u8).collect();
            let want: u64 = b.iter().map(|&x| u64::from(x)).sum();
            assert_eq!(super::byte_sum(&b), want, "{n} bytes");
        }
        assert_eq!(super::byte_sum(&[0xff; 4096]), 4096 * 255);
    }
}
