//! A tonic service over SMC: the server serves an `SmcListener`, the client connects with
//! `SmcConnector`, and the reply tells which transport the server saw.
//!
//! ```text
//! cargo run -p examples --example tonic_greeter -- server 127.0.0.1:50051
//! cargo run -p examples --example tonic_greeter -- client http://127.0.0.1:50051 world
//! ```

use smc_tokio::SmcListener;
use smc_tower::{SmcConnectInfo, SmcConnector, SmcIncoming};
use tonic::{Request, Response, Status};

#[allow(clippy::all, missing_docs, unreachable_pub)]
mod pb {
    include!("greeter_proto.rs");
}

use pb::greeter_client::GreeterClient;
use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

#[derive(Debug, Default)]
struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let transport = req.extensions().get::<SmcConnectInfo>().map_or("unknown", |i| i.transport.as_str());
        let name = req.into_inner().name;
        Ok(Response::new(HelloReply { message: format!("hello, {name}"), transport: transport.to_string() }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") => {
            let addr = args.get(1).map_or("127.0.0.1:50051", String::as_str);
            let listener = SmcListener::bind(addr).await?;
            eprintln!("tonic_greeter server on {}", listener.local_addr()?);
            tonic::transport::Server::builder()
                .add_service(GreeterServer::new(Hello))
                .serve_with_incoming(SmcIncoming::new(listener))
                .await?;
        }
        Some("client") => {
            let url = args.get(1).cloned().unwrap_or_else(|| "http://127.0.0.1:50051".into());
            let name = args.get(2).cloned().unwrap_or_else(|| "world".into());
            let channel =
                tonic::transport::Endpoint::from_shared(url)?.connect_with_connector(SmcConnector::new()).await?;
            let reply = GreeterClient::new(channel).say_hello(HelloRequest { name }).await?.into_inner();
            println!("{} (server saw {})", reply.message, reply.transport);
        }
        _ => eprintln!("usage: tonic_greeter server ADDR | client URL NAME"),
    }
    Ok(())
}
