//! axum on an `SmcListener`, printing each request's transport.
//!
//! ```text
//! cargo run --release -p examples --example axum_hello -- 127.0.0.1:3000 [--tcp]
//! curl http://127.0.0.1:3000/                      # hello over tcp (curl speaks plain TCP)
//! cargo run -p examples --example hyper_client -- http://127.0.0.1:3000/   # over smc-d
//! ```
//!
//! `--tcp` serves the same app on a plain tokio `TcpListener`, for comparisons (`wrk`).

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use smc_tokio::SmcListener;
use smc_tower::SmcConnectInfo;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".to_string());
    let quiet = std::env::var_os("QUIET").is_some();
    if args.any(|a| a == "--tcp") {
        let app = Router::new().route("/", get(|| async { "hello\n" }));
        let l = tokio::net::TcpListener::bind(&addr).await?;
        eprintln!("axum_hello (plain tcp) on http://{}", l.local_addr()?);
        return axum::serve(l, app).await;
    }
    let app = Router::new().route(
        "/",
        get(move |ConnectInfo(info): ConnectInfo<SmcConnectInfo>| async move {
            if !quiet {
                eprintln!("{} over {}", info.peer, info.transport);
            }
            "hello\n"
        }),
    );
    let l = SmcListener::bind(&addr).await?;
    eprintln!("axum_hello on http://{}", l.local_addr()?);
    axum::serve(l, app.into_make_service_with_connect_info::<SmcConnectInfo>()).await
}
