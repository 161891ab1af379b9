//! tower pieces for [`smc_tokio`]: a connector for hyper-util's client (and tonic's
//! `Endpoint::connect_with_connector`), a handshake-limit layer whose overflow goes TCP, a
//! fallback-policy layer, and connect info for axum handlers.
//!
//! This crate depends on `smc-tokio`, never the other way round.
//!
//! ```no_run
//! use http_body_util::Empty;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use smc_tower::{FallbackPolicyLayer, HandshakeLimitLayer, SmcConnector};
//! use tower_layer::Layer;
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let connector = HandshakeLimitLayer::new(64).layer(SmcConnector::new());
//! let client = Client::builder(TokioExecutor::new()).build::<_, Empty<bytes::Bytes>>(connector);
//! let resp = client.get("http://127.0.0.1:8080/".parse()?).await?;
//! println!("{:?}", resp.extensions().get::<smc_tower::SmcConnectInfo>());
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod connect_info;
mod connector;
mod limit;
mod policy;
#[cfg(feature = "tonic")]
mod tonic;

pub use connect_info::SmcConnectInfo;
pub use connector::{SmcConnection, SmcConnector};
pub use limit::{HandshakeLimit, HandshakeLimitLayer};
pub use policy::{FallbackPolicy, FallbackPolicyLayer, SetPolicy};
pub use smc_tokio;
#[cfg(feature = "tonic")]
pub use tonic::{IncomingConnectInfo, SmcIncoming, SmcIo};
