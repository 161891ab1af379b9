//! tonic over SMC (client with `SmcConnector`, server on `SmcIncoming`) and over the fallback;
//! the handler reads the transport from its request.

use smc_tokio::config::ShmConfig;
use smc_tokio::SmcListener;
use smc_tower::{SmcConnectInfo, SmcConnector, SmcIncoming};
use tests::bounded;
use tonic::{Request, Response, Status};

#[allow(clippy::all, missing_docs, unreachable_pub, dead_code)]
mod pb {
    include!("../../examples/greeter_proto.rs");
}

use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let transport = req.extensions().get::<SmcConnectInfo>().map_or("unknown", |i| i.transport.as_str());
        let name = req.into_inner().name;
        Ok(Response::new(HelloReply { message: format!("hello, {name}"), transport: transport.to_string() }))
    }
}

/// A tonic channel to `addr` through `SmcConnector`.
async fn channel_to(addr: std::net::SocketAddr) -> tonic::transport::Channel {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    bounded(10, endpoint.connect_with_connector(SmcConnector::new())).await.unwrap()
}

async fn round_trip(shm: bool) -> (String, String) {
    let l = SmcListener::builder().shm(ShmConfig::default().enabled(shm)).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(GreeterServer::new(Hello))
            .serve_with_incoming(SmcIncoming::new(l)),
    );
    let channel = channel_to(addr).await;
    let mut client = GreeterClient::new(channel);
    let mut last = None;
    for i in 0..3 {
        let r = bounded(10, client.say_hello(HelloRequest { name: format!("n{i}") })).await.unwrap().into_inner();
        assert_eq!(r.message, format!("hello, n{i}"));
        last = Some(r);
    }
    let r = last.unwrap();
    (r.message, r.transport)
}

#[tokio::test]
async fn tonic_over_smc() {
    assert_eq!(round_trip(true).await.1, "smc-d");
}

#[tokio::test]
async fn tonic_over_the_fallback() {
    assert_eq!(round_trip(false).await.1, "tcp");
}

/// A greeter that answers with the addresses tonic knows of the request's connection.
struct Addresses;

#[tonic::async_trait]
impl Greeter for Addresses {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let message = format!("{:?} {:?}", req.remote_addr(), req.local_addr());
        Ok(Response::new(HelloReply { message, transport: String::new() }))
    }
}

/// With tonic's own connect info, `Request::remote_addr` and `local_addr` answer, as on a
/// tonic server over TCP (they look for that type only).
#[tokio::test]
async fn tonic_handlers_read_the_peer_with_tcp_connect_info() {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let incoming = SmcIncoming::new(l).with_connect_info::<tonic::transport::server::TcpConnectInfo>();
    tokio::spawn(
        tonic::transport::Server::builder().add_service(GreeterServer::new(Addresses)).serve_with_incoming(incoming),
    );
    let channel = channel_to(addr).await;
    let r = bounded(10, GreeterClient::new(channel).say_hello(HelloRequest { name: String::new() })).await.unwrap();
    let message = r.into_inner().message;
    assert!(message.starts_with("Some(127.0.0.1:"), "{message}");
    assert!(message.ends_with(&format!("Some({addr})")), "{message}");
}
