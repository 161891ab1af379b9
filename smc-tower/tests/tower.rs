//! smc-tower against real servers: hyper-util's client with `SmcConnector`, the layers, and
//! axum serving an `SmcListener` with connect info.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use smc_tokio::config::ShmConfig;
use smc_tokio::{DeclineReason, FallbackReason, Policy, Side, SmcListener, Transport};
use smc_tower::{FallbackPolicyLayer, HandshakeLimitLayer, SmcConnectInfo, SmcConnector};
use tower::ServiceExt;
use tower_layer::Layer;

async fn hyper_server(shm: bool) -> std::net::SocketAddr {
    let l = SmcListener::builder().shm(ShmConfig::default().enabled(shm)).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let t = s.transport();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_r: Request<hyper::body::Incoming>| async move {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(t.as_str()))))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(s), svc).await;
            });
        }
    });
    addr
}

async fn get<C>(client: &Client<C, Empty<Bytes>>, addr: std::net::SocketAddr) -> (String, Option<SmcConnectInfo>)
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let uri = format!("http://{addr}/").parse().unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.get(uri)).await.unwrap().unwrap();
    let info = resp.extensions().get::<SmcConnectInfo>().copied();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (String::from_utf8_lossy(&body).into_owned(), info)
}

#[tokio::test]
async fn a_uri_with_a_host_name_or_an_address_connects() {
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(SmcConnector::new());
    let addr = hyper_server(true).await;
    // A name: looked up (localhost may come back as ::1 first, where nothing listens; the
    // connector tries each address in turn).
    let uri = format!("http://localhost:{}/", addr.port()).parse().unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.get(uri)).await.unwrap().unwrap();
    assert_eq!(resp.extensions().get::<SmcConnectInfo>().map(|i| i.peer), Some(addr));
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "smc-d");
    // An address: connected to as it is.
    let (body, info) = get(&client, addr).await;
    assert_eq!((body.as_str(), info.map(|i| i.peer)), ("smc-d", Some(addr)));
}

#[tokio::test]
async fn hyper_client_over_smc_and_over_the_fallback() {
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(SmcConnector::new());
    let addr = hyper_server(true).await;
    let (body, info) = get(&client, addr).await;
    assert_eq!(body, "smc-d");
    assert_eq!(info.map(|i| i.transport), Some(Transport::SmcD));
    // Keep-alive: the second request reuses the connection.
    assert_eq!(get(&client, addr).await.0, "smc-d");

    let addr = hyper_server(false).await;
    let (body, info) = get(&client, addr).await;
    assert_eq!(body, "tcp");
    assert_eq!(
        info.map(|i| i.transport),
        Some(Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::NoCommonTransport, by: Side::Peer }))
    );
}

#[tokio::test]
async fn fallback_policy_layer_applies_its_policy() {
    let addr = hyper_server(true).await;
    let tcp_only = FallbackPolicyLayer::new(Policy::TcpOnly).layer(SmcConnector::new());
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(tcp_only);
    let (_, info) = get(&client, addr).await;
    assert_eq!(info.map(|i| i.transport), Some(Transport::Tcp(FallbackReason::Disabled)));

    // Never: a server that declines is an error, not a TCP connection.
    let declining = hyper_server(false).await;
    let strict = FallbackPolicyLayer::new(Policy::Never).layer(SmcConnector::new());
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(strict);
    let uri = format!("http://{declining}/").parse().unwrap();
    assert!(client.get(uri).await.is_err());
}

#[tokio::test]
async fn handshake_limit_layer_sends_the_overflow_to_tcp() {
    let addr = hyper_server(true).await;
    // Eight clients at once through a limit of one: every connect is served, those that found
    // the slot taken over TCP without a proposal.
    let limited = HandshakeLimitLayer::new(1).layer(SmcConnector::new());
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(limited.clone());
        tasks.push(tokio::spawn(async move { get(&client, addr).await }));
    }
    let mut smc = 0;
    for t in tasks {
        let (body, info) = t.await.unwrap();
        let info = info.unwrap();
        assert_eq!(body, info.transport.as_str());
        match info.transport {
            Transport::SmcD => smc += 1,
            t => assert_eq!(t, Transport::Tcp(FallbackReason::Disabled)),
        }
    }
    assert!(smc >= 1);
}

/// Under `Policy::Never` TCP is never an answer, not even for the limit's overflow: the
/// connects beyond the slot wait for it, and every one is SMC.
#[tokio::test]
async fn handshake_limit_layer_under_policy_never_waits_instead_of_tcp() {
    let listener = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(listener.accept().await.unwrap().0);
        }
        held
    });
    let limited = HandshakeLimitLayer::new(1).layer(SmcConnector::new().policy(Policy::Never));
    let tasks: Vec<_> = (0..8).map(|_| tokio::spawn(limited.clone().oneshot(addr))).collect();
    for t in tasks {
        let s = t.await.unwrap().unwrap();
        assert!(s.transport().is_smc(), "{:?}", s.transport());
    }
    assert_eq!(server.await.unwrap().len(), 8);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_serves_an_smc_listener_with_connect_info() {
    use axum::extract::ConnectInfo;
    use axum::routing::get as route_get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/", route_get(|ConnectInfo(info): ConnectInfo<SmcConnectInfo>| async move { info.transport.as_str() }));
    tokio::spawn(async move { axum::serve(l, app.into_make_service_with_connect_info::<SmcConnectInfo>()).await });

    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(SmcConnector::new());
    assert_eq!(get(&client, addr).await.0, "smc-d");

    // A plain TCP client is served too, and the handler sees it.
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut resp = String::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut resp)).await.unwrap().unwrap();
    assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("tcp"), "{resp}");

    // And curl, where it is installed (.ci/run installs it).
    match tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "10", &format!("http://{addr}/")])
        .output()
        .await
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => eprintln!("SKIPPED the curl part: curl is not installed"),
        Err(e) => panic!("curl: {e}"),
        Ok(out) => assert_eq!(String::from_utf8_lossy(&out.stdout), "tcp"),
    }
}

/// Behind axum's `tap_io` (which sets options on each connection), an `SmcListener` is served
/// and axum's `ConnectInfo<SocketAddr>` works.
#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_serves_a_tapped_smc_listener_with_its_socket_addr() {
    use axum::extract::ConnectInfo;
    use axum::routing::get as route_get;
    use axum::serve::ListenerExt;

    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(SmcConnector::new());
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/",
        route_get(|ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>| async move { peer.ip().to_string() }),
    );
    let tapped = l.tap_io(|s: &mut smc_tokio::SmcStream| {
        let _ = s.set_nodelay(true);
    });
    tokio::spawn(async move {
        axum::serve(tapped, app.into_make_service_with_connect_info::<std::net::SocketAddr>()).await
    });
    assert_eq!(get(&client, addr).await.0, "127.0.0.1");
}
