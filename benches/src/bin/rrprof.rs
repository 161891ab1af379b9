use tokio::io::{AsyncReadExt, AsyncWriteExt};
fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(50_000);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let l = smc_tokio::SmcListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(smc_tokio::SmcStream::connect(addr), l.accept());
        let mut a = a.unwrap();
        assert!(a.transport().is_smc());
        let mut b = b.unwrap().0;
        let msg = [0x5au8; 14];
        let mut buf = [0u8; 14];
        for _ in 0..n {
            a.write_all(&msg).await.unwrap();
            b.read_exact(&mut buf).await.unwrap();
            b.write_all(&buf).await.unwrap();
            a.read_exact(&mut buf).await.unwrap();
        }
    });
}
