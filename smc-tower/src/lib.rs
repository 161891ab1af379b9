//! tower pieces for [`smc_tokio`]: connectors, handshake-limit and fallback-policy layers, and
//! axum/hyper/tonic glue.
//!
//! This crate depends on `smc-tokio`, never the other way round. Its layers arrive with the
//! handshake-limit work; today it re-exports the driver crate so that a service stack can name
//! one dependency.
//!
//! ```
//! use smc_tower::smc_tokio::SmcStream;
//! # let _ = SmcStream::builder();
//! ```

#![warn(missing_docs)]

pub use smc_tokio;
