//! Shared code of the examples: the nginx-style static file server used by the `file_server`
//! example and by `smcperf`'s `file` scenario, so that both measure the same logic.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};

use smc_tokio::SmcStream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How a response is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeMode {
    /// Headers and body under one cork guard, pushed when the guard drops.
    pub cork: bool,
    /// Body with `SmcStream::sendfile` (no user-space buffer) instead of read + `write_all`.
    pub sendfile: bool,
}

impl ServeMode {
    /// nginx's `sendfile on; tcp_nopush on;`.
    pub const CORK_SENDFILE: ServeMode = ServeMode { cork: true, sendfile: true };
    /// `sendfile off`: read the file, write headers and body.
    pub const PLAIN_WRITES: ServeMode = ServeMode { cork: false, sendfile: false };
    /// `sendfile on; tcp_nopush off;`.
    pub const SENDFILE: ServeMode = ServeMode { cork: false, sendfile: true };

    /// Parses the `mode=` query parameter (`cork-sendfile`, `write`, `sendfile`).
    pub fn from_query(q: &str) -> Option<ServeMode> {
        q.split('&').find_map(|kv| match kv.strip_prefix("mode=")? {
            "cork-sendfile" => Some(Self::CORK_SENDFILE),
            "write" => Some(Self::PLAIN_WRITES),
            "sendfile" => Some(Self::SENDFILE),
            _ => None,
        })
    }
}

/// One parsed request.
#[derive(Debug)]
struct Request {
    path: String,
    query: String,
    close: bool,
}

/// Largest request head accepted.
const MAX_HEAD: usize = 16 << 10;

/// Reads one request head from `rd` (with `buf` keeping bytes that belong to the next one).
/// `Ok(None)` at a clean EOF between requests.
async fn read_request<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut Vec<u8>) -> io::Result<Option<Request>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            let mut lines = head.split("\r\n");
            let first = lines.next().unwrap_or_default();
            let mut parts = first.split(' ');
            let (method, target, version) = (parts.next(), parts.next(), parts.next());
            if method != Some("GET") || target.is_none() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "only GET is served"));
            }
            let target = target.unwrap_or("/");
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            let mut close = version == Some("HTTP/1.0");
            for l in lines {
                if let Some((k, v)) = l.split_once(':') {
                    if k.trim().eq_ignore_ascii_case("connection") {
                        close = v.trim().eq_ignore_ascii_case("close");
                    }
                }
            }
            return Ok(Some(Request { path: path.to_string(), query: query.to_string(), close }));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request head too large"));
        }
        let mut chunk = [0u8; 4096];
        let n = rd.read(&mut chunk).await?;
        if n == 0 {
            return if buf.is_empty() { Ok(None) } else { Err(io::ErrorKind::UnexpectedEof.into()) };
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Resolves a request path under `root`, refusing anything that climbs out of it.
fn resolve(root: &Path, path: &str) -> Option<PathBuf> {
    let rel = Path::new(path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

/// Per-connection open files (nginx's `open_file_cache`, per connection).
#[derive(Default)]
struct Files(HashMap<PathBuf, (File, u64)>);

impl Files {
    fn get(&mut self, p: PathBuf) -> io::Result<&(File, u64)> {
        if !self.0.contains_key(&p) {
            let f = File::open(&p)?;
            let len = f.metadata()?.len();
            self.0.insert(p.clone(), (f, len));
        }
        self.0.get(&p).ok_or_else(|| io::Error::other("file cache"))
    }
}

fn head(status: &str, len: u64, close: bool) -> String {
    format!(
        "HTTP/1.1 {status}\r\nserver: smc-tokio-file-server\r\ncontent-length: {len}\r\ncontent-type: application/octet-stream\r\nconnection: {}\r\n\r\n",
        if close { "close" } else { "keep-alive" }
    )
}

/// Serves HTTP/1.1 keep-alive file requests on an `SmcStream` with `mode` (or the request's
/// `mode=` query parameter, which wins), until the client closes.
pub async fn serve_smc(mut s: SmcStream, root: &Path, mode: ServeMode) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut files = Files::default();
    let mut body = Vec::new();
    while let Some(req) = read_request(&mut s, &mut buf).await? {
        let mode = ServeMode::from_query(&req.query).unwrap_or(mode);
        let file = resolve(root, &req.path).map(|p| files.get(p));
        let (file, len) = match file {
            Some(Ok((f, len))) => (f, *len),
            _ => {
                s.write_all(head("404 Not Found", 0, req.close).as_bytes()).await?;
                if req.close {
                    break;
                }
                continue;
            }
        };
        let guard = mode.cork.then(|| s.cork());
        s.write_all(head("200 OK", len, req.close).as_bytes()).await?;
        if mode.sendfile {
            let sent = s.sendfile(file, 0, len).await?;
            if sent != len {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank while being served"));
            }
        } else {
            body.resize(len as usize, 0);
            file.read_exact_at(&mut body, 0)?;
            s.write_all(&body).await?;
        }
        drop(guard);
        if req.close {
            break;
        }
    }
    s.shutdown().await
}

/// Serves the same requests on any stream with plain writes (the tokio `TcpStream` baseline).
pub async fn serve_plain<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, root: &Path) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut files = Files::default();
    let mut body = Vec::new();
    while let Some(req) = read_request(&mut s, &mut buf).await? {
        match resolve(root, &req.path).map(|p| files.get(p)) {
            Some(Ok((f, len))) => {
                s.write_all(head("200 OK", *len, req.close).as_bytes()).await?;
                body.resize(*len as usize, 0);
                f.read_exact_at(&mut body, 0)?;
                s.write_all(&body).await?;
            }
            _ => s.write_all(head("404 Not Found", 0, req.close).as_bytes()).await?,
        }
        if req.close {
            break;
        }
    }
    s.shutdown().await
}

/// Reads one response (head and `content-length` body) from `rd`; returns the body length.
/// `buf` keeps bytes of the next response.
pub async fn read_response<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut Vec<u8>) -> io::Result<usize> {
    let (end, len) = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]);
            if !head.starts_with("HTTP/1.1 200") {
                return Err(io::Error::other(format!("unexpected response: {}", head.lines().next().unwrap_or(""))));
            }
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok())?
                })
                .ok_or_else(|| io::Error::other("no content-length"))?;
            break (end + 4, len);
        }
        // Straight into the buffer's spare room: no staging copy, no zeroing.
        buf.reserve(8192);
        if rd.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    };
    while buf.len() < end + len {
        buf.reserve(end + len - buf.len());
        if rd.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    buf.drain(..end + len);
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_root() {
        let root = Path::new("/srv");
        assert_eq!(resolve(root, "/a/b.txt"), Some(PathBuf::from("/srv/a/b.txt")));
        assert_eq!(resolve(root, "/../etc/passwd"), None);
        assert_eq!(resolve(root, "/a/../../x"), None);
    }

    #[test]
    fn modes_from_query() {
        assert_eq!(ServeMode::from_query("mode=write"), Some(ServeMode::PLAIN_WRITES));
        assert_eq!(ServeMode::from_query("x=1&mode=cork-sendfile"), Some(ServeMode::CORK_SENDFILE));
        assert_eq!(ServeMode::from_query("mode=nope"), None);
    }
}
