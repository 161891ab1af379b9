//! What connections, link groups and pending handshakes cost in descriptors and memory,
//! measured (`cargo test -p tests --test resources -- --nocapture` prints the figures quoted in
//! `docs/resources.md`). Alone in its test binary: it counts `/proc/self/fd`. The assertions
//! pin the per-connection and per-group descriptor costs the document states.

#[path = "support/hostile.rs"]
mod hostile;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use smc_tokio::config::ShmConfig;
use smc_tokio::proto::clc::{ClcMessage, DeclineReason, Proposal};
use smc_tokio::{SmcListener, SmcStream, Transport};
use tests::{bounded, open_fds};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Descriptors by kind (what `/proc/self/fd` links to).
fn fd_kinds() -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(p) = std::fs::read_link(e.path()) {
            let s = p.display().to_string();
            let kind = match s.find(':') {
                Some(_) if s.starts_with("anon_inode:") => s.clone(),
                Some(i) if !s.starts_with('/') => s[..i].to_string(),
                _ => {
                    if s.starts_with("/memfd:") {
                        "memfd".into()
                    } else {
                        "file".into()
                    }
                }
            };
            let kind = if s.contains("smc-tokio-region") { "memfd(region)".to_string() } else { kind };
            *m.entry(kind).or_default() += 1;
        }
    }
    m
}

/// (address space, resident) in KiB of this process's mappings of region memfds, and VmRSS.
fn memory() -> (u64, u64, u64) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let (mut size, mut rss, mut in_region) = (0, 0, false);
    for line in smaps.lines() {
        // A mapping's header line starts with its address range ("7f..-7f.. rw-s ...").
        if line.split_whitespace().next().is_some_and(|w| w.contains('-') && !w.ends_with(':')) {
            in_region = line.contains("smc-tokio-region");
        }
        let kb = |l: &str| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        if in_region && line.starts_with("Size:") {
            size += kb(line);
        }
        if in_region && line.starts_with("Rss:") {
            rss += kb(line);
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vmrss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .unwrap_or(0);
    (size, rss, vmrss)
}

async fn settle() -> usize {
    tests::settle_fds().await
}

/// Waits (up to 10 s) until this process maps no link group's region any more, letting go of
/// the connections parked on `rx` as they come; then until the descriptor count stays put.
/// A group's region and descriptors outlive its connections by its idle timeout, or, for a
/// group whose client was killed, by the wait for that client that a handshake began.
async fn groups_gone<T>(rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        while rx.try_recv().is_ok() {}
        if memory().0 == 0 || std::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    settle().await
}

/// Waits (up to 10 s) until this process holds at most `want` descriptors, letting go of the
/// connections parked on `rx` as they come (they arrive as their reads end); then until the
/// count stays put. Returns that count, for the caller to assert on.
async fn fds_back_to<T>(want: usize, rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        while rx.try_recv().is_ok() {}
        if open_fds() <= want || std::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while rx.try_recv().is_ok() {}
    settle().await
}

fn report(what: &str, before: usize) -> usize {
    let now = open_fds();
    let (size, rss, vmrss) = memory();
    eprintln!(
        "RESOURCES {what}: {now} fds ({:+} vs before), region mappings {size} KiB address space / {rss} KiB resident, VmRSS {vmrss} KiB, {:?}",
        now as isize - before as isize,
        fd_kinds()
    );
    now
}

async fn peer_clients(addr: SocketAddr, n: usize) -> tokio::process::Child {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
        .args(["hold-clients", &addr.to_string(), &n.to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let l = bounded(60, lines.next_line()).await.unwrap().unwrap();
    assert_eq!(l, format!("READY {n}"), "all {n} on smc-d");
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_and_memory_per_connection_group_and_pending_handshake() {
    let shm = ShmConfig::default().idle_timeout(Duration::from_millis(300));
    let l = SmcListener::builder()
        .shm(shm.clone())
        .max_pending_handshakes(1000)
        // Far longer than any handshake here takes on a busy machine: every connection the
        // test makes is asserted to be SMC-D.
        .handshake_timeout(Duration::from_secs(2))
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (mut rd, mut wr) = s.into_split();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut b = [0u8; 1];
                if rd.read_exact(&mut b).await.is_ok() {
                    let _ = wr.write_all(&b).await;
                }
                let _ = tx.send((rd, wr));
            });
        }
    });
    // Warm-up: the side-channel acceptor and tokio's child-process driver.
    drop(peer_clients(addr, 1).await);
    let base = groups_gone(&mut rx).await;
    report("server idle (listener + side-channel acceptor)", base);

    // ----- server side: the clients are another process -----
    let c1 = peer_clients(addr, 1).await;
    let mut held = Vec::new();
    held.push(bounded(10, rx.recv()).await.unwrap());
    // Descriptors are closed on the closer thread (in batches, a little after they are let go):
    // let it catch up, as on the client side below.
    settle().await;
    let one = report("server, 1 connection (1 link group)", base);
    let c100 = peer_clients(addr, 100).await;
    for _ in 0..100 {
        held.push(bounded(10, rx.recv()).await.unwrap());
    }
    settle().await;
    let hundred = report("server, 101 connections (2 link groups: 1 + 100)", base);
    // 100 connections on one new group: 100 TCP sockets, the group's two doorbell sockets
    // (ringing and waiting) and its side channel, the door connection of the second peer process
    // (one per client process, shared by all its connections), and that process's tokio pidfd
    // (a test artifact).
    assert_eq!(
        hundred - one,
        100 + 3 + 1 + 1,
        "server: one descriptor per connection, three per group, one per client"
    );
    // The first connection of a group: its TCP socket, the two doorbell sockets, the side
    // channel, the client process's door connection (and the peer's pidfd). The memfds are
    // closed once mapped.
    assert_eq!(one - base, 1 + 3 + 1 + 1, "server: the first connection of a group");
    drop((c1, c100));
    held.clear();
    // The held connections and their groups go (the groups once idle, their descriptors on the
    // closer thread after that).
    let after = fds_back_to(base, &mut rx).await;
    report("server after the clients died", base);
    assert_eq!(after, base, "server: everything returned");

    // ----- client side: the server is another process -----
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
        .arg("hold")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let port: u16 = bounded(10, lines.next_line()).await.unwrap().unwrap()[5..].parse().unwrap();
    let saddr: SocketAddr = ([127, 0, 0, 1], port).into();
    let cbase = settle().await;
    let b = SmcStream::builder().shm(shm.clone());
    let mut conns = vec![bounded(10, b.connect(saddr)).await.unwrap()];
    assert_eq!(conns[0].transport(), Transport::SmcD);
    // Let the closer thread catch up with what was let go.
    settle().await;
    let c_one = report("client, 1 connection", cbase);
    assert_eq!(
        c_one - cbase,
        1 + 3 + 1,
        "client: the TCP socket, the two doorbell sockets, the side channel and the door connection"
    );
    for _ in 0..99 {
        let s = bounded(10, b.connect(saddr)).await.unwrap();
        assert_eq!(s.transport(), Transport::SmcD);
        conns.push(s);
    }
    settle().await;
    let c_hundred = report("client, 100 connections (1 link group)", cbase);
    assert_eq!(c_hundred - c_one, 99, "client: one descriptor per further connection (the door connection is shared)");
    // Touch every ring once (64 KiB writes into each connection's RMB in our region).
    for s in &mut conns {
        s.write_all(&vec![7u8; 64 << 10]).await.unwrap();
    }
    report("client, 100 connections after 64 KiB written on each", cbase);
    drop(conns);
    server.kill().await.unwrap();
    drop((server, lines));

    // ----- pending handshakes -----
    tokio::time::sleep(Duration::from_millis(800)).await;
    let pbase = settle().await;
    // (a) 100 clients that registered at the door with half a proposal and stall: one task, one
    // socket and one door connection each on the server (plus our own 100 client sockets and
    // door connections, as the clients are in this process).
    let p = ClcMessage::Proposal(Proposal { secret: hostile::random_secret(), rmb_size: 0, shm: None, rdma: None })
        .encode()
        .unwrap();
    let mut stalled = Vec::new();
    for i in 0..100 {
        stalled.push(hostile::register_and_connect(addr, 300_000 + i, &p[..p.len() / 2]).await.unwrap());
    }
    // The listener accepts the connections, and the door reads their registrations, on its own
    // time: wait (bounded) until every one of them holds its descriptors.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while open_fds() < pbase + 400 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stalled_fds = report("100 stalled handshakes (100 sockets + 100 door connections on each side)", pbase);
    assert_eq!(stalled_fds - pbase, 400);
    drop(stalled);
    // Their stream carried nothing of the handshake, so the server hands them out as TCP once
    // their handshakes end; they are parked in the channel as their reads end: let them go.
    let pbase = fds_back_to(pbase, &mut rx).await;
    // (b) 20 proposals answered with an Accept, then declined by the client: the pending link
    // group each one set up (our region memfd + ringing socket, mapped) is dropped as soon as
    // its handshake ends, since nobody joined it; only the 40 sockets remain.
    let mut hs = Vec::new();
    for i in 0..20 {
        let mut h = bounded(10, hostile::propose(addr, 200_000 + i, 1, 0, 64 << 10)).await;
        h.decline(DeclineReason::Internal).await.unwrap();
        hs.push(h);
    }
    // The server drops each group after it has read the Decline: wait (bounded) for that.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while open_fds() - pbase > 80 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let declined = report("20 accepted-then-declined handshakes (20 client + 20 server sockets)", pbase);
    eprintln!("RESOURCES pending groups: {} descriptors beyond the 40 sockets", declined - pbase - 40);
    // (Our 20 door connections are still open, and so are the server's ends: a door connection
    // lives as long as its client keeps it, for the client's next registrations.)
    assert_eq!(declined - pbase, 40 + 20 + 20, "a declined handshake's pending group is dropped at once");
    drop(hs);
    // The declined connections were handed out as TCP and are parked in the channel as their
    // reads end: let them go.
    let gone = fds_back_to(pbase, &mut rx).await;
    report("after the declined connections closed", pbase);
    assert_eq!(gone, pbase, "nothing of the declined handshakes is left");
}
