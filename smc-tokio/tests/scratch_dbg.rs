#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch() {
    let l = smc_tokio::SmcListener::builder().max_pending_handshakes(4096).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut v = Vec::new();
        loop {
            let (s, _) = l.accept().await.unwrap();
            v.push(s);
        }
    });
    let t0 = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        tasks.push(tokio::spawn(async move {
            let t = std::time::Instant::now();
            let s = smc_tokio::SmcStream::builder().max_pending_handshakes(4096).connect(addr).await.unwrap();
            (s.transport().is_smc(), t.elapsed())
        }));
    }
    let mut smc = 0;
    let mut worst = std::time::Duration::ZERO;
    for t in tasks {
        let (ok, d) = t.await.unwrap();
        smc += ok as usize;
        worst = worst.max(d);
    }
    println!("smc {smc} worst {worst:?} total {:?}", t0.elapsed());
    println!("{}", smc_tokio::stats());
}
