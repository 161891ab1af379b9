//! hyper-util's client with `SmcConnector`: GETs a URL and prints the transport it used.
//!
//! ```text
//! cargo run -p examples --example hyper_client -- http://127.0.0.1:3000/
//! ```

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use smc_tower::{SmcConnectInfo, SmcConnector};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:3000/".to_string());
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(SmcConnector::new());
    let resp = client.get(url.parse()?).await?;
    let transport = resp.extensions().get::<SmcConnectInfo>().map(|i| i.transport.to_string());
    eprintln!("{} over {}", resp.status(), transport.as_deref().unwrap_or("?"));
    let body = resp.into_body().collect().await?.to_bytes();
    print!("{}", String::from_utf8_lossy(&body));
    Ok(())
}
