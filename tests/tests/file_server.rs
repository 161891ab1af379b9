//! The nginx-style file server of the `file_server` example: curl and an SmcStream client, in
//! every response mode.

use std::sync::Arc;

use examples::{read_response, serve_smc, ServeMode};
use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::{bounded, Rng};
use tokio::io::AsyncWriteExt;

async fn server(root: Arc<std::path::PathBuf>) -> std::net::SocketAddr {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let root = root.clone();
            tokio::spawn(async move { serve_smc(s, &root, ServeMode::CORK_SENDFILE).await });
        }
    });
    addr
}

/// A directory of its own (each test serves and writes its file while the others do theirs),
/// removed when the test ends, holding the file `f`.
fn www() -> (tempfile::TempDir, Arc<std::path::PathBuf>, Vec<u8>) {
    let dir = tempfile::Builder::new().prefix("smc-tokio-www-").tempdir().unwrap();
    let body = Rng::new(42).bytes(300_000);
    std::fs::write(dir.path().join("f"), &body).unwrap();
    let root = Arc::new(dir.path().to_path_buf());
    (dir, root, body)
}

#[tokio::test]
async fn keep_alive_requests_in_every_mode_over_smc() {
    let (_dir, root, body) = www();
    let addr = server(root).await;
    let mut c = SmcStream::connect(addr).await.unwrap();
    assert_eq!(c.transport(), Transport::SmcD);
    let mut buf = Vec::new();
    for mode in ["cork-sendfile", "write", "sendfile", "cork-sendfile"] {
        c.write_all(format!("GET /f?mode={mode} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes()).await.unwrap();
        let mut seen = Vec::new();
        let n = bounded(10, read_response(&mut ReadTee { inner: &mut c, seen: &mut seen }, &mut buf)).await.unwrap();
        assert_eq!(n, body.len(), "{mode}");
        // Each response is read whole before the next request is sent, so what the tee saw
        // is exactly one response: its head, then the file.
        assert!(seen.ends_with(&body), "{mode}: body differs from the file");
        assert!(seen.starts_with(b"HTTP/1.1 200 OK\r\n"), "{mode}");
    }
}

/// Records every byte read through it, so the test can check the response's bytes.
struct ReadTee<'a> {
    inner: &'a mut SmcStream,
    seen: &'a mut Vec<u8>,
}

impl tokio::io::AsyncRead for ReadTee<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut *self.inner).poll_read(cx, buf);
        let new = buf.filled()[before..].to_vec();
        self.seen.extend_from_slice(&new);
        r
    }
}

#[tokio::test]
async fn curl_fetches_files_intact() {
    let (_dir, root, body) = www();
    let addr = server(root.clone()).await;
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "10", &format!("http://{addr}/f"), &format!("http://{addr}/f?mode=write")])
        .output()
        .await;
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("SKIPPED curl_fetches_files_intact: curl is not installed");
        }
        Err(e) => panic!("curl: {e}"),
        Ok(out) => {
            assert!(out.status.success());
            // Two responses on one keep-alive connection, back to back.
            assert_eq!(out.stdout.len(), 2 * body.len());
            assert!(out.stdout[..body.len()] == body[..] && out.stdout[body.len()..] == body[..]);
        }
    }
}
