//! An HTTP/1.1 server that answers `hello` on every path, with hyper over an `SmcListener`.
//!
//! ```text
//! cargo run -p examples --example http_hello -- 127.0.0.1:8080
//! curl http://127.0.0.1:8080/        # hello
//! ```
//!
//! Plain clients (curl, wrk, browsers) are served over TCP; SMC clients over SMC when both ends
//! can. Each request logs the connection's transport.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use smc_tokio::SmcListener;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8080".to_string());
    let listener = SmcListener::bind(&addr).await?;
    eprintln!("http_hello listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: log and keep serving.
                eprintln!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let transport = stream.transport();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| async move {
                eprintln!("{peer} {} {} over {transport}", req.method(), req.uri());
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
            });
            if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                eprintln!("{peer}: {e}");
            }
        });
    }
}
