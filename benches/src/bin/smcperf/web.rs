//! The `http`, `http-close` and `grpc` scenarios: what the crate's users run on top of it.
//!
//! - `http`: hyper-util's client through smc-tower's `SmcConnector` against an axum app served
//!   on an `SmcListener`, HTTP/1.1 keep-alive, `--conns` concurrent clients each fetching a
//!   `--size`-byte body again and again. `http-close`: the same with `Connection: close`, a new
//!   connection per request.
//! - `grpc`: tonic unary calls (the examples' `Greeter`, a `--size`-byte name) through a channel
//!   per client connected with `SmcConnector`, against the service on `SmcIncoming`.
//!
//! The tcp rows run the same clients with hyper-util's `HttpConnector` (and tonic's own
//! connector) against the same apps on tokio's `TcpListener`, `TCP_NODELAY` on both ends as
//! on the smc rows. The mem rows (in `local` only) run them over tokio's in-process pipe
//! (`tokio::io::duplex`), handed from the client's connector to the server's listener through
//! a channel: no kernel and no transport protocol between the two threads, only the stack
//! itself, a pipe's lock and copy, and the wake-ups between the runtimes. What the stack reaches
//! there is the ceiling of any transport's row on this machine.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use smc_tokio::config::ShmConfig;
use smc_tokio::SmcListener;
use smc_tower::{SmcConnectInfo, SmcConnector, SmcIncoming};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codegen::tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use crate::{measure, Case, Kind, Measure, Seen};

#[allow(clippy::all, missing_docs, unreachable_pub, dead_code)]
mod pb {
    include!("../../../../examples/greeter_proto.rs");
}

use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// Largest body the http app serves (the `--size` bound).
const MAX_BODY: usize = 64 << 20;

/// Where the web servers listen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WebAddrs {
    pub(crate) http_smc: SocketAddr,
    pub(crate) http_tcp: SocketAddr,
    pub(crate) grpc_smc: SocketAddr,
    pub(crate) grpc_tcp: SocketAddr,
}

impl WebAddrs {
    /// The addresses of a server whose first web port is `base` (client mode: the server's
    /// smc port + 3 ..= + 6).
    pub(crate) fn at(ip: IpAddr, base: u16) -> WebAddrs {
        let a = |k: u16| SocketAddr::new(ip, base + k);
        WebAddrs { http_smc: a(0), http_tcp: a(1), grpc_smc: a(2), grpc_tcp: a(3) }
    }
}

fn app() -> axum::Router {
    let body = Bytes::from(vec![b'x'; MAX_BODY]);
    axum::Router::new().route(
        "/bytes/{n}",
        axum::routing::get(move |Path(n): Path<usize>| {
            let body = body.clone();
            async move { body.slice(..n.min(MAX_BODY)) }
        }),
    )
}

#[derive(Debug, Default)]
struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let transport = match req.extensions().get::<SmcConnectInfo>() {
            Some(i) => i.transport.as_str(),
            None if req.extensions().get::<MemConnectInfo>().is_some() => "mem",
            None => "tcp",
        };
        let name = req.into_inner().name;
        Ok(Response::new(HelloReply { message: name, transport: transport.to_string() }))
    }
}

/// Bytes a mem pipe buffers each way: a TCP socket's default send buffer on Linux
/// (`net.ipv4.tcp_wmem`'s middle value, 16 KiB) would make large bodies take turns; 256 KiB
/// holds every body these scenarios send at their default sizes many times over.
const MEM_PIPE: usize = 256 << 10;

/// One end of a mem connection.
struct MemIo(DuplexStream);

impl AsyncRead for MemIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for MemIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connection for MemIo {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// What the grpc mem server finds in a request's extensions: its calls came over a pipe.
#[derive(Debug, Clone, Copy)]
struct MemConnectInfo;

impl tonic::transport::server::Connected for MemIo {
    type ConnectInfo = MemConnectInfo;
    fn connect_info(&self) -> MemConnectInfo {
        MemConnectInfo
    }
}

/// Where mem connections go: the server ends of new pipes, to the http and the grpc server.
struct MemDoors {
    http: mpsc::UnboundedSender<MemIo>,
    grpc: mpsc::UnboundedSender<MemIo>,
}

/// Set by [`start`]: only a client in the servers' process can reach them.
static MEM_DOORS: OnceLock<MemDoors> = OnceLock::new();

/// Whether mem servers run in this process (`local`).
pub(crate) fn mem_available() -> bool {
    MEM_DOORS.get().is_some()
}

/// A connector (hyper-util's and tonic's) whose connections are new pipes to a mem server.
#[derive(Clone)]
struct MemConnector(mpsc::UnboundedSender<MemIo>);

impl MemConnector {
    fn new(pick: impl Fn(&MemDoors) -> &mpsc::UnboundedSender<MemIo>) -> io::Result<MemConnector> {
        let doors = MEM_DOORS.get().ok_or_else(|| io::Error::other("mem runs only in `local`"))?;
        Ok(MemConnector(pick(doors).clone()))
    }
}

impl tonic::codegen::Service<hyper::Uri> for MemConnector {
    type Response = TokioIo<MemIo>;
    type Error = io::Error;
    type Future = std::future::Ready<io::Result<TokioIo<MemIo>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper::Uri) -> Self::Future {
        let (ours, theirs) = tokio::io::duplex(MEM_PIPE);
        std::future::ready(match self.0.send(MemIo(theirs)) {
            Ok(()) => Ok(TokioIo::new(MemIo(ours))),
            Err(_) => Err(io::Error::new(io::ErrorKind::ConnectionRefused, "the mem server is gone")),
        })
    }
}

/// axum's side of the http mem server: the pipes the connector sends.
struct MemListener(mpsc::UnboundedReceiver<MemIo>);

impl axum::serve::Listener for MemListener {
    type Io = MemIo;
    type Addr = ();

    async fn accept(&mut self) -> (MemIo, ()) {
        match self.0.recv().await {
            Some(io) => (io, ()),
            // Every sender gone (never: the doors live as long as the process).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Starts the four servers on the current runtime; `port(k)` is the port of the k-th (0 for
/// any).
pub(crate) async fn start(ip: IpAddr, shm: ShmConfig, port: impl Fn(u16) -> u16) -> io::Result<WebAddrs> {
    let http_smc = SmcListener::builder().shm(shm.clone()).bind(SocketAddr::new(ip, port(0))).await?;
    let http_tcp = crate::conn::tcp_listen(SocketAddr::new(ip, port(1)))?;
    let grpc_smc = SmcListener::builder().shm(shm).bind(SocketAddr::new(ip, port(2))).await?;
    let grpc_tcp = crate::conn::tcp_listen(SocketAddr::new(ip, port(3)))?;
    let addrs = WebAddrs {
        http_smc: http_smc.local_addr()?,
        http_tcp: http_tcp.local_addr()?,
        grpc_smc: grpc_smc.local_addr()?,
        grpc_tcp: grpc_tcp.local_addr()?,
    };
    let smc = http_smc.tap_io(|s| {
        let _ = s.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(smc, app()).await });
    let tcp = http_tcp.tap_io(|s| {
        let _ = s.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(tcp, app()).await });
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(GreeterServer::new(Hello))
            .serve_with_incoming(SmcIncoming::new(grpc_smc))
            .await
    });
    let incoming = tonic::transport::server::TcpIncoming::from(grpc_tcp).with_nodelay(Some(true));
    tokio::spawn(async move {
        tonic::transport::Server::builder().add_service(GreeterServer::new(Hello)).serve_with_incoming(incoming).await
    });
    let ((http_tx, http_rx), (grpc_tx, grpc_rx)) = (mpsc::unbounded_channel(), mpsc::unbounded_channel());
    if MEM_DOORS.set(MemDoors { http: http_tx, grpc: grpc_tx }).is_ok() {
        tokio::spawn(async move { axum::serve(MemListener(http_rx), app()).await });
        let incoming = UnboundedReceiverStream::new(grpc_rx).map(io::Result::Ok);
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(GreeterServer::new(Hello))
                .serve_with_incoming(incoming)
                .await
        });
    }
    Ok(addrs)
}

/// An HTTP client for `kind`: the smc connector (which reports its transport in every
/// response) or hyper-util's own, `TCP_NODELAY` both, a pool as deep as the clients.
enum HttpClient {
    Smc(Box<Client<SmcConnector, Empty<Bytes>>>),
    Tcp(Box<Client<HttpConnector, Empty<Bytes>>>),
    Mem(Box<Client<MemConnector, Empty<Bytes>>>),
}

impl HttpClient {
    fn new(kind: Kind, shm: &ShmConfig, conns: usize) -> io::Result<HttpClient> {
        let mut b = Client::builder(TokioExecutor::new());
        b.pool_max_idle_per_host(conns);
        Ok(match kind {
            Kind::Smc => {
                let builder = smc_tokio::SmcStream::builder().shm(shm.clone());
                HttpClient::Smc(Box::new(b.build(SmcConnector::from_builder(builder))))
            }
            Kind::Mem => HttpClient::Mem(Box::new(b.build(MemConnector::new(|d| &d.http)?))),
            _ => {
                let mut c = HttpConnector::new();
                c.set_nodelay(true);
                HttpClient::Tcp(Box::new(b.build(c)))
            }
        })
    }

    /// GETs `uri`; the body's length and the transport the response came over.
    async fn get(&self, uri: hyper::Uri, close: bool) -> io::Result<(usize, &'static str)> {
        let mut req = hyper::Request::get(uri);
        if close {
            req = req.header(hyper::header::CONNECTION, "close");
        }
        let req = req.body(Empty::new()).map_err(io::Error::other)?;
        let resp = match self {
            HttpClient::Smc(c) => c.request(req).await,
            HttpClient::Tcp(c) => c.request(req).await,
            HttpClient::Mem(c) => c.request(req).await,
        }
        .map_err(io::Error::other)?;
        let transport = match (self, resp.extensions().get::<SmcConnectInfo>()) {
            (_, Some(i)) => i.transport.as_str(),
            (HttpClient::Mem(_), None) => "mem",
            (_, None) => "tcp",
        };
        if !resp.status().is_success() {
            return Err(io::Error::other(format!("status {}", resp.status())));
        }
        let body = resp.into_body().collect().await.map_err(io::Error::other)?.to_bytes();
        Ok((body.len(), transport))
    }
}

/// The `http` (`close` false) and `http-close` scenarios.
pub(crate) async fn run_http(
    kind: Kind,
    addrs: WebAddrs,
    shm: &ShmConfig,
    case: Case,
    dur: Duration,
    close: bool,
) -> io::Result<Measure> {
    let addr = if kind == Kind::Smc { addrs.http_smc } else { addrs.http_tcp };
    let uri: hyper::Uri = format!("http://{addr}/bytes/{}", case.size).parse().map_err(io::Error::other)?;
    let client = Arc::new(HttpClient::new(kind, shm, case.conns)?);
    let (stop, errors, seen) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(Seen::default()));
    let warmup = dur / 10;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..case.conns {
        let (client, uri, stop, errors, seen) =
            (client.clone(), uri.clone(), stop.clone(), errors.clone(), seen.clone());
        let size = case.size;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 14);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                match client.get(uri.clone(), close).await {
                    Ok((n, transport)) if n == size => {
                        seen.add(transport);
                        if t.duration_since(start) >= warmup {
                            lat.push(t.elapsed().as_nanos() as u64);
                        }
                    }
                    Ok((n, _)) => return Err(io::Error::other(format!("a body of {n} bytes, expected {size}"))),
                    Err(e) => {
                        // The first failure of the run is shown: the count alone says nothing of
                        // its cause.
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("smcperf: {kind:?} http request failed (the first of the run): {e}");
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            io::Result::Ok(lat)
        }));
    }
    let mut m = measure(&stop, tasks, dur + warmup, dur, String::new(), case.size, 0).await?;
    m.negotiated = seen.get();
    m.errors = errors.load(Ordering::Relaxed);
    Ok(m)
}

/// The `grpc` scenario: a channel (one HTTP/2 connection) per client, unary calls in a loop.
pub(crate) async fn run_grpc(
    kind: Kind,
    addrs: WebAddrs,
    shm: &ShmConfig,
    case: Case,
    dur: Duration,
) -> io::Result<Measure> {
    let addr = if kind == Kind::Smc { addrs.grpc_smc } else { addrs.grpc_tcp };
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).map_err(io::Error::other)?.tcp_nodelay(true);
    let mut clients = Vec::with_capacity(case.conns);
    for _ in 0..case.conns {
        let channel = match kind {
            Kind::Smc => {
                let connector = SmcConnector::from_builder(smc_tokio::SmcStream::builder().shm(shm.clone()));
                endpoint.connect_with_connector(connector).await
            }
            Kind::Mem => endpoint.connect_with_connector(MemConnector::new(|d| &d.grpc)?).await,
            _ => endpoint.connect().await,
        }
        .map_err(io::Error::other)?;
        clients.push(GreeterClient::new(channel));
    }
    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let warmup = dur / 10;
    let start = Instant::now();
    let name = "x".repeat(case.size);
    let mut tasks = Vec::new();
    for mut client in clients {
        let (stop, name, seen) = (stop.clone(), name.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 14);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let reply = client.say_hello(HelloRequest { name: name.clone() }).await.map_err(io::Error::other)?;
                if reply.get_ref().message.len() != name.len() {
                    return Err(io::Error::other("a reply of the wrong size"));
                }
                // The server names the transport its side of the connection uses.
                seen.add(&reply.get_ref().transport);
                if t.duration_since(start) >= warmup {
                    lat.push(t.elapsed().as_nanos() as u64);
                }
            }
            io::Result::Ok(lat)
        }));
    }
    let mut m = measure(&stop, tasks, dur + warmup, dur, String::new(), case.size, 0).await?;
    m.negotiated = seen.get();
    Ok(m)
}
