//! Hostile peers on the shm side channel: a client or a server that hands over a region that is
//! not sealed, not a memfd, too small or not what its header says, a doorbell that is missing,
//! unreachable, its peer's own or connected elsewhere, a wrong token, or that runs as another
//! uid. Every case ends in a refusal or a TCP
//! fallback with the bytes intact; the process never crashes, and connections on other link
//! groups keep every byte.

#[path = "support/hostile.rs"]
mod hostile;

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use hostile::{Layout, Map, Region, REGION_SEALS};
use smc_tokio::config::ShmConfig;
use smc_tokio::proto::cdc::CdcMsg;
use smc_tokio::proto::clc::{Accept, ClcMessage, Decline, DeclineReason, LinkInfo, Proposal, ShmLinkInfo, ShmOffer};
use smc_tokio::proto::cursor::Cursor;
use smc_tokio::proto::side::{BellTag, Join};
use smc_tokio::{FallbackReason, Side, SmcListener, SmcStream, Transport};
use tests::{bounded, echo_check, Rng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Our RMB size in hostile proposals (the server's receive rings, which we write).
const RMB: u32 = 64 << 10;

fn layout() -> Layout {
    Layout::new(8, 4, RMB)
}

/// A listener whose every connection is echoed; each accepted connection's peer address and
/// transport is reported on the channel.
async fn server(cfg: ShmConfig) -> (SocketAddr, mpsc::UnboundedReceiver<(SocketAddr, Transport)>) {
    server_with(cfg, Duration::from_secs(2)).await
}

/// [`server`] with its own handshake timeout.
async fn server_with(
    cfg: ShmConfig,
    handshake_timeout: Duration,
) -> (SocketAddr, mpsc::UnboundedReceiver<(SocketAddr, Transport)>) {
    let l = SmcListener::builder().shm(cfg).handshake_timeout(handshake_timeout).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, peer)) = l.accept().await {
            let _ = tx.send((peer, s.transport()));
            tokio::spawn(async move {
                let (mut rd, mut wr) = s.into_split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                let _ = wr.shutdown().await;
            });
        }
    });
    (addr, rx)
}

/// The legitimate connection that must keep its bytes: a long-lived SMC stream checked with a
/// random echo through its split halves.
struct Bystander {
    rd: smc_tokio::OwnedReadHalf,
    wr: smc_tokio::OwnedWriteHalf,
    group: Option<u64>,
    round: u64,
}

impl Bystander {
    async fn new(addr: SocketAddr, rx: &mut mpsc::UnboundedReceiver<(SocketAddr, Transport)>) -> Bystander {
        let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
        assert_eq!(s.transport(), Transport::SmcD);
        assert_eq!(report_for(rx, s.local_addr().unwrap()).await, Transport::SmcD);
        let group = s.link_group();
        let (rd, wr) = s.into_split();
        Bystander { rd, wr, group, round: 0 }
    }

    async fn check(&mut self, what: &str) {
        self.round += 1;
        let data = Rng::new(self.round * 31).bytes(200_000);
        let (w, r) = bounded(20, async {
            tokio::join!(self.wr.write_all(&data), async {
                let mut back = vec![0u8; data.len()];
                self.rd.read_exact(&mut back).await.map(|_| back)
            })
        })
        .await;
        w.unwrap();
        assert!(r.unwrap() == data, "{what}: the bystander connection's bytes differ");
    }
}

/// The transport the server handed out the connection from `me` with (others are skipped).
async fn report_for(rx: &mut mpsc::UnboundedReceiver<(SocketAddr, Transport)>, me: SocketAddr) -> Transport {
    loop {
        let (peer, t) = bounded(10, rx.recv()).await.unwrap();
        if peer == me {
            return t;
        }
    }
}

/// What one side hands over on the side channel: descriptors, and the doorbell it names.
type Handed = (Vec<OwnedFd>, BellTag);

/// One hostile JOIN: what the client hands over, and what it should get back.
struct Case {
    what: &'static str,
    fds: Box<dyn Fn() -> Handed + Send>,
    /// Refused at once with this WELCOME status (no descriptors); `None`: admitted, then the
    /// region or doorbell is refused and the side channel closed.
    status: Option<u32>,
}

fn region_and_doorbell(r: Region) -> Handed {
    (vec![r.fd.try_clone().unwrap()], hostile::doorbell())
}

fn sealed_region() -> OwnedFd {
    Region::new(layout(), REGION_SEALS).fd.try_clone().unwrap()
}

fn cases() -> Vec<Case> {
    let l = layout();
    vec![
        Case { what: "an unsealed memfd", fds: Box::new(move || region_and_doorbell(Region::new(l, 0))), status: None },
        Case {
            what: "a memfd sealed against shrinking but not growth",
            fds: Box::new(move || region_and_doorbell(Region::new(l, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL))),
            status: None,
        },
        Case {
            what: "a memfd sealed against writes and growth but not shrinking",
            fds: Box::new(move || region_and_doorbell(Region::new(l, libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_GROW))),
            status: None,
        },
        Case {
            what: "a regular file, not a memfd",
            fds: Box::new(move || {
                let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
                let path = dir.join(format!("hostile-region-{}", std::process::id()));
                let f =
                    std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
                f.set_len(l.total_len as u64).unwrap();
                let mut hdr = Vec::new();
                for w in l.header() {
                    hdr.extend_from_slice(&w.to_ne_bytes());
                }
                std::os::unix::fs::FileExt::write_all_at(&f, &hdr, 0).unwrap();
                let _ = std::fs::remove_file(&path);
                (vec![OwnedFd::from(f)], hostile::doorbell())
            }),
            status: None,
        },
        Case {
            what: "a sealed memfd smaller than its header says",
            fds: Box::new(move || {
                let fd = hostile::memfd(8192, true);
                let m = Map::new(fd.as_fd(), 8192, true).unwrap();
                for (i, w) in l.header().iter().enumerate() {
                    m.word(i * 8).store(*w, std::sync::atomic::Ordering::Relaxed);
                }
                drop(m);
                hostile::add_seals(fd.as_fd(), REGION_SEALS).unwrap();
                (vec![fd], hostile::doorbell())
            }),
            status: None,
        },
        Case {
            what: "an empty sealed memfd",
            fds: Box::new(|| {
                let fd = hostile::memfd(0, true);
                hostile::add_seals(fd.as_fd(), REGION_SEALS).unwrap();
                (vec![fd], hostile::doorbell())
            }),
            status: None,
        },
        Case {
            // Larger slots are fine (room for the ring to grow); smaller ones cannot hold it.
            what: "a sealed region whose slots are smaller than the proposal's ring",
            fds: Box::new(|| region_and_doorbell(Region::new(Layout::new(8, 4, RMB / 2), REGION_SEALS))),
            status: None,
        },
        Case {
            what: "a doorbell nobody has bound",
            fds: Box::new(|| (vec![sealed_region()], BellTag([0x77; 24]))),
            status: None,
        },
        Case {
            what: "a doorbell connected to another one",
            fds: Box::new(|| (vec![sealed_region()], hostile::busy_doorbell())),
            status: None,
        },
        Case {
            what: "a region without a doorbell",
            fds: Box::new(|| (vec![sealed_region()], BellTag::NONE)),
            status: Some(3),
        },
        Case {
            what: "a region and one descriptor more",
            fds: Box::new(|| (vec![sealed_region(), sealed_region()], hostile::doorbell())),
            status: Some(3),
        },
        Case { what: "no descriptors at all", fds: Box::new(|| (Vec::new(), hostile::doorbell())), status: Some(3) },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_client_regions_are_refused_and_other_groups_keep_their_bytes() {
    let (addr, mut rx) = server(ShmConfig::default()).await;
    let mut by = Bystander::new(addr, &mut rx).await;
    by.check("before").await;
    let instance = Rng::new(u64::from(std::process::id())).next_u64();
    for (i, case) in cases().into_iter().enumerate() {
        let what = case.what;
        let pid = 100_000 + i as u32;
        let mut hs = bounded(10, hostile::propose(addr, pid, instance, 0, RMB)).await;
        assert_ne!(Some(hs.accept.link_group), by.group, "{what}: a new group for a new peer");
        let (name, group, token) = (hs.accept.socket_name.clone(), hs.accept.link_group, hs.secret);
        let (fds, bell) = (case.fds)();
        let (sock, welcome) = bounded(
            10,
            tokio::task::spawn_blocking(move || {
                let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
                hostile::join(&name, group, token, bell, &raw)
            }),
        )
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{what}: join: {e}"));
        match case.status {
            Some(status) => {
                assert_eq!(welcome.status, status, "{what}: refused with a typed status");
                assert!(welcome.fds.is_empty(), "{what}: a refusal hands over nothing");
                assert!(welcome.bell.is_none(), "{what}: a refusal names no doorbell");
            }
            None => {
                // Admitted on the token, so the server handed over its half; then it checked
                // ours, refused it, and closed the side channel.
                assert_eq!(welcome.status, 0, "{what}");
                assert_eq!(welcome.fds.len(), 1, "{what}");
                assert!(!welcome.bell.is_none(), "{what}");
                let sock2 = sock.try_clone().unwrap();
                bounded(10, tokio::task::spawn_blocking(move || hostile::side_eof(sock2.as_fd())))
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{what}: side channel not closed: {e}"));
            }
        }
        drop(sock);
        // A Confirm for the refused link does not fit: the server declines it in step and
        // serves the connection as TCP, bytes intact.
        let reply = hs.confirm(0).await.unwrap();
        assert!(
            matches!(reply, ClcMessage::Decline(Decline { reason: DeclineReason::SyncError, .. })),
            "{what}: the server's final word is {reply:?}"
        );
        let me = hs.tcp.local_addr().unwrap();
        assert_eq!(
            report_for(&mut rx, me).await,
            Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::SyncError, by: Side::Local }),
            "{what}"
        );
        hs.tcp.write_all(what.as_bytes()).await.unwrap();
        let mut back = vec![0u8; what.len()];
        bounded(10, hs.tcp.read_exact(&mut back)).await.unwrap();
        assert_eq!(back, what.as_bytes(), "{what}: echoed over tcp");
        // The refused group is dead: the same peer naming it gets a new one.
        let hs2 = bounded(10, hostile::propose(addr, pid, instance, group, RMB)).await;
        if case.status.is_none() {
            assert_ne!(hs2.accept.link_group, group, "{what}: the refused group is not reused");
        }
        drop(hs2);
        by.check(what).await;
    }
    // A refused client that declines instead continues over TCP with its bytes.
    let mut hs = bounded(10, hostile::propose(addr, 99_999, instance, 0, RMB)).await;
    let (name, group, token) = (hs.accept.socket_name.clone(), hs.accept.link_group, hs.secret);
    let (sock, w) = tokio::task::spawn_blocking(move || {
        let r = Region::new(layout(), 0);
        hostile::join(&name, group, token, hostile::doorbell(), &[r.fd.as_raw_fd()])
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(w.status, 0);
    drop(sock);
    let answer = hs.decline(DeclineReason::Internal).await.unwrap();
    assert!(matches!(answer, ClcMessage::Decline(_)), "the server answers a decline with its own: {answer:?}");
    let me = hs.tcp.local_addr().unwrap();
    hs.tcp.write_all(b"over tcp after a refused region").await.unwrap();
    let mut back = [0u8; 31];
    bounded(10, hs.tcp.read_exact(&mut back)).await.unwrap();
    assert_eq!(&back, b"over tcp after a refused region");
    let t = report_for(&mut rx, me).await;
    assert_eq!(t, Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::Internal, by: Side::Peer }));
    by.check("after the fallback").await;
}

/// One client process that asks for a new link group with every connection (another instance
/// each time, as a hostile client may) gets at most 64 groups with one listener at once: the next Proposal is
/// declined and its connection goes on over TCP with its bytes; once one of the 64 goes away,
/// a new group can be made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_process_gets_a_bounded_number_of_link_groups() {
    const PER_CLIENT: u32 = 64;
    // Handshakes that outlive the test: no pending group goes by itself.
    let (addr, mut rx) = server_with(ShmConfig::default(), Duration::from_secs(60)).await;
    let instance = Rng::new(u64::from(std::process::id()) ^ 0x6b0d).next_u64();
    let mut held = Vec::new();
    for i in 0..PER_CLIENT {
        held.push(bounded(10, hostile::propose(addr, i, instance, 0, RMB)).await);
    }
    let groups: std::collections::HashSet<u64> = held.iter().map(|h| h.accept.link_group).collect();
    assert_eq!(groups.len(), PER_CLIENT as usize, "a new group for each instance, up to the bound");

    let over = |n: u32| async move {
        let secret = hostile::random_secret();
        let p =
            ClcMessage::Proposal(Proposal { secret, rmb_size: RMB, shm: Some(ShmOffer { link_group: 0 }), rdma: None });
        hostile::register_and_connect(addr, instance ^ (u64::from(n) << 32), &p.encode().unwrap()).await
    };
    let (mut tcp, door) = bounded(10, over(PER_CLIENT)).await.unwrap();
    let answer = bounded(10, hostile::door_recv_clc(&door)).await.unwrap();
    assert!(
        matches!(answer, Some(ClcMessage::Decline(Decline { reason: DeclineReason::OutOfMemory, .. }))),
        "one group more than the bound is declined: {answer:?}"
    );
    let me = tcp.local_addr().unwrap();
    assert_eq!(
        report_for(&mut rx, me).await,
        Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::OutOfMemory, by: Side::Local })
    );
    tcp.write_all(b"over tcp past the group bound").await.unwrap();
    let mut back = [0u8; 29];
    bounded(10, tcp.read_exact(&mut back)).await.unwrap();
    assert_eq!(&back, b"over tcp past the group bound");

    // One of the 64 handshakes gives up: its pending group goes, and there is room again.
    drop(held.remove(0));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for n in PER_CLIENT + 1.. {
        let (_tcp, door) = bounded(10, over(n)).await.unwrap();
        match bounded(10, hostile::door_recv_clc(&door)).await.unwrap() {
            Some(ClcMessage::Accept(Accept { link: LinkInfo::Shm(info), .. })) => {
                assert!(!groups.contains(&info.link_group), "a new group");
                break;
            }
            Some(ClcMessage::Decline(Decline { reason: DeclineReason::OutOfMemory, .. })) => {
                assert!(std::time::Instant::now() < deadline, "no room came back after a group went away");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
}

/// A listener with no room for a receive ring (a context whose RMB cap is 0), and a registration
/// at its door, as `instance`, that it declined for want of memory before its socket connected:
/// the listener, its address, the registered socket (not connected) and the door connection.
async fn declined_before_connecting(instance: u64) -> (SmcListener, SocketAddr, OwnedFd, OwnedFd) {
    let ctx = smc_tokio::Context::new();
    ctx.set_rmb_memory_cap(0);
    let l = SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (sock, door) = bounded(10, hostile::register(addr, instance, &hostile::shm_proposal(RMB))).await.unwrap();
    let answer = bounded(10, hostile::door_recv_clc(&door)).await.unwrap();
    assert!(
        matches!(answer, Some(ClcMessage::Decline(Decline { reason: DeclineReason::OutOfMemory, .. }))),
        "declined for want of memory: {answer:?}"
    );
    (l, addr, sock, door)
}

/// A registration declined before its connection came is handed out, once the connection is
/// accepted, with the reason its client was told, not as a plain client's: the registration
/// stays filed until then. (Dropped at the Decline, it was matched at accept only when the
/// listener happened to take the connection from the kernel first.)
#[tokio::test]
async fn a_registration_declined_before_its_connection_came_is_handed_out_with_its_reason() {
    let (l, addr, sock, door) = declined_before_connecting(0x5eed).await;
    // Only now does the connection come.
    let mut tcp = bounded(10, hostile::connect_registered(sock, addr)).await.unwrap();
    let (mut s, _) = bounded(10, l.accept()).await.unwrap();
    assert_eq!(
        s.transport(),
        Transport::Tcp(FallbackReason::Declined { reason: DeclineReason::OutOfMemory, by: Side::Local }),
        "the connection is handed out with the reason its client was told"
    );
    tcp.write_all(b"declined first").await.unwrap();
    let mut b = [0u8; 14];
    bounded(10, s.read_exact(&mut b)).await.unwrap();
    assert_eq!(&b, b"declined first");
    // The door connection stayed open throughout (a closed one drops its registrations).
    drop(door);
}

/// A registration declined before its connection came does not keep a dropped listener alive:
/// the wait for its connection ends with the listener, and so does the door with its door
/// connections (the client reads their end).
#[tokio::test]
async fn a_declined_registration_left_waiting_does_not_hold_a_dropped_listener() {
    // The connection never comes.
    let (l, _addr, _sock, door) = declined_before_connecting(0x1eaf).await;
    drop(l);
    // (Each read waits 5 s at most.)
    let end = bounded(10, hostile::door_recv_clc(&door)).await;
    assert!(matches!(end, Ok(None)), "the dropped listener's door connection stayed open: {end:?}");
}

/// A well-formed, sealed region: the server maps it and serves the connection. Its sender cannot
/// resize it (or punch holes, or map it writable anew) once sealed, so the server's reads can
/// never fault; a frame in its ring that is no CDC message ends only the connection it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_region_cannot_be_resized_by_its_sender_and_the_server_keeps_reading() {
    let (addr, mut rx) = server(ShmConfig::default()).await;
    let mut by = Bystander::new(addr, &mut rx).await;
    let mut hs = bounded(10, hostile::propose(addr, 4242, 77, 0, RMB)).await;
    let server_token = hs.accept.rmb_slot;
    // The side channel stays open to the end: closing it would end the link group.
    let (region, _sock, server_memfd, ring_server) = hostile::join_genuine(&hs, layout()).await;

    // The server's region is sealed too (no shrink, no grow, seals sealed), and what we got is
    // a read-only descriptor of a file of mode 0400: we cannot map it writable, resize it or
    // punch holes into it through that descriptor, nor reseal it.
    let seals = hostile::get_seals(server_memfd.as_fd()).unwrap();
    assert_eq!(seals & REGION_SEALS, REGION_SEALS, "server region seals {seals:#x}");
    assert_eq!(hostile::errno_of(Map::new(server_memfd.as_fd(), 4096, true)), libc::EACCES);
    assert_eq!(hostile::ftruncate_errno(server_memfd.as_fd(), 0), libc::EINVAL);
    // SAFETY: plain syscall on a descriptor we hold.
    let punch = unsafe {
        libc::fallocate(server_memfd.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, 4096)
    };
    assert_eq!(punch, -1, "punching a hole into the server's region through our descriptor must fail");
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EBADF));
    // SAFETY: fstat into a zeroed buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(server_memfd.as_raw_fd(), &mut st) }, 0);
    assert_eq!(st.st_mode & 0o777, 0o400, "the server's region is mode 0400");

    // Our region, after sending: no shrink, no grow, no new seals.
    let total = region.layout.total_len;
    assert_eq!(hostile::ftruncate_errno(region.fd.as_fd(), 4096), libc::EPERM, "shrink");
    assert_eq!(hostile::ftruncate_errno(region.fd.as_fd(), 0), libc::EPERM, "shrink to nothing");
    assert_eq!(hostile::ftruncate_errno(region.fd.as_fd(), total * 2), libc::EPERM, "grow");
    assert_eq!(hostile::errno_of(hostile::add_seals(region.fd.as_fd(), libc::F_SEAL_WRITE)), libc::EPERM);
    // SAFETY: fstat into a zeroed buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(region.fd.as_raw_fd(), &mut st) }, 0);
    assert_eq!(st.st_size as usize, total, "the size did not change");

    // The link works: confirm, send bytes through our ring, and read the echo from the server's.
    let commit = hs.confirm(0).await.unwrap();
    assert!(hostile::is_commit(&commit, hs.secret), "the server commits: {commit:?}");
    let me = hs.tcp.local_addr().unwrap();
    assert_eq!(report_for(&mut rx, me).await, Transport::SmcD);
    let mut region = region;
    let msg = b"through a sealed region";
    region.rmb_write(0, 0, msg);
    let mut cdc = CdcMsg::new(1, server_token);
    cdc.prod = Cursor::new(0, msg.len() as u32);
    region.push_cdc(&cdc);
    hostile::ring(ring_server.as_raw_fd()).unwrap();
    let server_map = Map::new(server_memfd.as_fd(), 4096, false).unwrap();
    let hdr: Vec<u64> = (0..8).map(|i| server_map.word(i * 8).load(std::sync::atomic::Ordering::Relaxed)).collect();
    let server_layout = Layout::new(hdr[2] as u32, hdr[3] as u32, hdr[4] as u32);
    assert_eq!(hdr[0], hostile::REGION_MAGIC);
    drop(server_map);
    let server_map = Map::new(server_memfd.as_fd(), server_layout.total_len, false).unwrap();
    let frame = bounded(10, async {
        loop {
            if let Some(f) = hostile::peer_frame(&server_map, server_layout.cdc_slots, 0) {
                return f;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let echo = CdcMsg::decode(&frame).unwrap();
    assert_eq!((echo.seq, echo.token), (1, 0), "the server's first message, for our token");
    assert_eq!(echo.prod, Cursor::new(0, msg.len() as u32));
    let slot = (server_token & 0xFFFF) as usize;
    let at = server_layout.rmb_offset + slot * server_layout.rmb_size as usize;
    assert_eq!(server_map.read(at, msg.len()), msg, "the echo in the server's ring");
    assert_eq!(hostile::peer_cdc_cons(&server_map), 1, "the server consumed our frame");

    // A frame in our ring that is no CDC message, for the server's connection: the server
    // ends that connection, and only it.
    let mut garbage = CdcMsg::new(2, server_token).encode();
    garbage[0] = 0;
    region.push_frame(&garbage);
    hostile::ring(ring_server.as_raw_fd()).unwrap();
    let mut b = [0u8; 16];
    match bounded(10, hs.tcp.read(&mut b)).await {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("{n} bytes on the TCP connection under smc"),
    }
    by.check("after the hostile frame").await;
    let s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD);
    bounded(10, echo_check(s, b"still serving", 4, 9)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_and_groups_on_the_side_channel_are_refused() {
    let (addr, mut rx) = server(ShmConfig::default()).await;
    let mut by = Bystander::new(addr, &mut rx).await;
    let mut hs = bounded(10, hostile::propose(addr, 5151, 78, 0, RMB)).await;
    let (name, group, token) = (hs.accept.socket_name.clone(), hs.accept.link_group, hs.secret);
    let region = Region::new(layout(), REGION_SEALS);
    let bell = hostile::doorbell();
    let fds = [region.fd.as_raw_fd()];
    let attempts = bounded(
        20,
        tokio::task::spawn_blocking({
            let name = name.clone();
            move || {
                let mut statuses = Vec::new();
                // A token no handshake gave out.
                let (_s, w) = hostile::join(&name, group, hostile::random_secret(), bell, &fds).unwrap();
                statuses.push((w.status, w.fds.len()));
                // The right token, another group.
                let (_s, w) = hostile::join(&name, group ^ 0x5555, token, bell, &fds).unwrap();
                statuses.push((w.status, w.fds.len()));
                // A token differing in its last bit.
                let mut near = token;
                near.0[15] ^= 1;
                let (_s, w) = hostile::join(&name, group, near, bell, &fds).unwrap();
                statuses.push((w.status, w.fds.len()));
                // A malformed JOIN: closed without a welcome.
                let s = hostile::side_connect(&name).unwrap();
                let mut bad = hostile::join_msg(group, token, bell);
                bad[0] = b'X';
                hostile::send_join(s.as_fd(), &bad, &fds).unwrap();
                let eof = hostile::side_eof(s.as_fd());
                // A JOIN of the wrong length.
                let s = hostile::side_connect(&name).unwrap();
                hostile::send_join(s.as_fd(), &hostile::join_msg(group, token, bell)[..40], &fds).unwrap();
                let eof2 = hostile::side_eof(s.as_fd());
                (statuses, eof.is_ok(), eof2.is_ok())
            }
        }),
    )
    .await
    .unwrap();
    assert_eq!(attempts.0, vec![(1, 0), (1, 0), (1, 0)], "wrong token or group: refused (status 1) with nothing");
    assert!(attempts.1 && attempts.2, "malformed joins are closed without a welcome");
    // None of that spoiled the pending group: the real token still joins, and the link works.
    let (sock, w) = bounded(10, tokio::task::spawn_blocking(move || hostile::join(&name, group, token, bell, &fds)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((w.status, w.fds.len()), (0, 1));
    let commit = hs.confirm(0).await.unwrap();
    assert!(hostile::is_commit(&commit, hs.secret), "the server commits: {commit:?}");
    let me = hs.tcp.local_addr().unwrap();
    assert_eq!(report_for(&mut rx, me).await, Transport::SmcD);
    // A second JOIN for the now established group, even with the right token, is refused:
    // no group waits for this process any more, so its connection is closed at accept.
    let name = hs.accept.socket_name.clone();
    let second =
        bounded(10, tokio::task::spawn_blocking(move || hostile::join(&name, group, token, bell, &fds))).await.unwrap();
    let err = second.map(|(_, w)| (w.status, w.fds.len())).expect_err("a group is joined once");
    // The server closes the side channel at accept, so the JOIN's own send may meet that close
    // (a broken pipe, or a reset) before the read for a welcome does (the end).
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    assert!(matches!(err.kind(), UnexpectedEof | BrokenPipe | ConnectionReset), "closed without a welcome: {err}");
    drop((sock, region));
    by.check("after the wrong tokens").await;
}

/// A fake server (door included) that takes the client's registration, accepts its Proposal
/// with shm on the door and answers the client's JOIN with what `make_fds` hands over (given
/// the client's descriptors and doorbell; and `status`, `group` in the WELCOME), then expects the client's Decline on the door, answers it, and echoes over
/// TCP, which carried nothing of the handshake.
async fn hostile_server(
    what: &'static str,
    status: u32,
    welcome_group_xor: u64,
    make_fds: impl Fn(&[OwnedFd], BellTag) -> Handed + Send + Sync + 'static,
) -> (SocketAddr, tokio::task::JoinHandle<ClcMessage>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let door = hostile::fake_door(addr);
    let task = tokio::spawn(async move {
        let (door_conn, id, port, _instance, p) =
            tokio::task::spawn_blocking(move || hostile::accept_registration(door.as_fd())).await.unwrap().unwrap();
        let (c, peer) = l.accept().await.unwrap();
        assert_eq!(peer.port(), port, "{what}: the registered socket connected");
        let ClcMessage::Proposal(p) = p else { panic!("{what}: no proposal") };
        let offer = p.shm.expect("the client offers shm");
        assert_eq!(offer.link_group, 0, "{what}: no group yet with this server");
        let group = 0x1000 + u64::from(addr.port());
        let name = format!("smct-hostile-{}-{}", std::process::id(), addr.port()).into_bytes();
        let side = hostile::side_listen(&name);
        let accept = Accept {
            secret: p.secret,
            link: LinkInfo::Shm(ShmLinkInfo { link_group: group, rmb_slot: 0, rmb_size: RMB, socket_name: name }),
        };
        hostile::door_send_clc_for(&door_conn, id, &ClcMessage::Accept(accept)).unwrap();
        let token = p.secret;
        let make_fds = std::sync::Arc::new(make_fds);
        let side_task = tokio::task::spawn_blocking(move || {
            let s = hostile::side_accept(side.as_fd(), Duration::from_secs(5)).unwrap();
            let (msg, client_fds) = hostile::recv_fds(s.as_fd()).unwrap();
            let join = Join::decode(&msg).unwrap();
            assert_eq!(
                (join.link_group, join.secret),
                (group, token),
                "{what}: the client proves the handshake's token"
            );
            assert!(!join.bell.is_none(), "{what}: the client names its doorbell");
            assert_eq!(client_fds.len(), 1, "{what}: the client sends its region");
            // The real client's region is sealed, and what we got is a read-only descriptor: we
            // can neither map it writable nor resize it.
            let seals = hostile::get_seals(client_fds[0].as_fd()).unwrap();
            assert_eq!(seals & REGION_SEALS, REGION_SEALS, "{what}: client region seals {seals:#x}");
            assert_eq!(hostile::errno_of(Map::new(client_fds[0].as_fd(), 4096, true)), libc::EACCES);
            assert_eq!(hostile::ftruncate_errno(client_fds[0].as_fd(), 0), libc::EINVAL);
            let (fds, bell) = make_fds(&client_fds, join.bell);
            let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
            hostile::send_fds(s.as_fd(), &hostile::welcome_msg(group ^ welcome_group_xor, status, bell), &raw).unwrap();
            // Keep the side channel open until the client gives up on it.
            let _ = hostile::side_eof(s.as_fd());
        });
        let reply = hostile::door_recv_clc(&door_conn).await.unwrap().expect("the client answers the accept");
        // The side channel's checks held (a panic there fails the test, not only the join).
        side_task.await.unwrap_or_else(|e| panic!("{what}: the fake side channel: {e}"));
        if let ClcMessage::Decline(d) = &reply {
            // The client waits for our final word after its Decline.
            hostile::door_send_clc_for(&door_conn, id, &ClcMessage::Decline(*d)).unwrap();
        }
        let mut c = c;
        let (mut rd, mut wr) = c.split();
        let _ = tokio::io::copy(&mut rd, &mut wr).await;
        drop(door_conn);
        reply
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_server_regions_are_refused_and_the_client_falls_back_with_its_bytes() {
    type MakeFds = fn(&[OwnedFd], BellTag) -> Handed;
    let cases: Vec<(&'static str, u32, u64, MakeFds)> = vec![
        ("an unsealed memfd", 0, 0, |_, _| region_and_doorbell(Region::new(layout(), 0))),
        ("a region that can still shrink", 0, 0, |_, _| {
            region_and_doorbell(Region::new(layout(), libc::F_SEAL_GROW | libc::F_SEAL_SEAL))
        }),
        ("a regular file", 0, 0, |_, _| {
            let f = std::fs::File::open(env!("CARGO_BIN_EXE_smc-test-peer")).unwrap();
            (vec![OwnedFd::from(f)], hostile::doorbell())
        }),
        ("a region smaller than its header", 0, 0, |_, _| {
            let fd = hostile::memfd(4096, true);
            let m = Map::new(fd.as_fd(), 4096, true).unwrap();
            for (i, w) in layout().header().iter().enumerate() {
                m.word(i * 8).store(*w, std::sync::atomic::Ordering::Relaxed);
            }
            drop(m);
            hostile::add_seals(fd.as_fd(), REGION_SEALS).unwrap();
            (vec![fd], hostile::doorbell())
        }),
        ("no doorbell named", 0, 0, |_, _| (vec![sealed_region()], BellTag::NONE)),
        ("a doorbell nobody has bound", 0, 0, |_, _| (vec![sealed_region()], BellTag([0x77; 24]))),
        ("a doorbell connected to another one", 0, 0, |_, _| (vec![sealed_region()], hostile::busy_doorbell())),
        ("the client's own doorbell named", 0, 0, |_, theirs| (vec![sealed_region()], theirs)),
        ("the client's own region sent back", 0, 0, |c, _| (vec![c[0].try_clone().unwrap()], hostile::doorbell())),
        ("a refusal status", 2, 0, |_, _| (Vec::new(), BellTag::NONE)),
        ("a welcome for another group", 0, 1, |_, _| region_and_doorbell(Region::new(layout(), REGION_SEALS))),
        ("a welcome with two descriptors", 0, 0, |_, _| (vec![sealed_region(), sealed_region()], hostile::doorbell())),
    ];
    for (i, (what, status, xor, make)) in cases.into_iter().enumerate() {
        let (addr, server) = hostile_server(what, status, xor, make).await;
        let s = bounded(10, SmcStream::connect(addr)).await.unwrap_or_else(|e| panic!("{what}: connect: {e}"));
        let t = s.transport();
        let Transport::Tcp(FallbackReason::Declined { reason, by: Side::Local }) = t else {
            panic!("{what}: expected a local decline and tcp, got {t}");
        };
        let data = Rng::new(i as u64 + 500).bytes(300_000);
        bounded(20, echo_check(s, &data, 30_000, i as u64)).await;
        let reply = bounded(10, server).await.unwrap();
        let ClcMessage::Decline(d) = reply else { panic!("{what}: the client answered {reply:?}") };
        assert_eq!(d.reason, reason, "{what}");
        eprintln!("{what}: client declined ({reason})");
    }
}

// ----- another uid -----------------------------------------------------------------------------

/// Runs the test peer's echo client as `uid`, trusting the uids in `trust` (besides its own)
/// as servers.
async fn run_peer_as(uid: u32, addr: SocketAddr, trust: &str) -> String {
    let out = bounded(
        30,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
            .args(["client", &addr.to_string()])
            .env("SMC_TOKIO_SHM_ALLOW_UIDS", trust)
            .uid(uid)
            .gid(uid)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "peer as uid {uid}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[tokio::test]
async fn a_client_running_as_another_uid_falls_back_to_tcp_with_its_bytes() {
    if !tests::require_root("a_client_running_as_another_uid_falls_back_to_tcp_with_its_bytes") {
        return;
    }
    let (addr, mut rx) = server(ShmConfig::default()).await;
    // The client does not trust our uid: it finds our door, sees its owner, and connects as a
    // plain client without registering.
    let text = run_peer_as(65534, addr, "").await;
    assert!(text.contains("TRANSPORT tcp (smc not proposed"), "{text}");
    assert!(text.contains("OK"), "{text}");
    let (_, t) = bounded(10, rx.recv()).await.unwrap();
    assert_eq!(t, Transport::Tcp(FallbackReason::PeerNoSmc), "server saw {t}");
    // The client trusts us, but we do not trust it: the door refuses its connection (by
    // SO_PEERCRED) and closes it, before or after the registration was sent, and the client
    // goes plain, its bytes intact.
    let refused = smc_tokio::stats().door[4];
    let text = run_peer_as(65534, addr, "0").await;
    assert!(
        text.contains("TRANSPORT tcp (peer does not speak smc)") || text.contains("TRANSPORT tcp (smc not proposed"),
        "{text}"
    );
    assert!(text.contains("OK"), "{text}");
    let (_, t) = bounded(10, rx.recv()).await.unwrap();
    assert_eq!(t, Transport::Tcp(FallbackReason::PeerNoSmc), "server saw {t}");
    assert!(smc_tokio::stats().door[4] > refused, "the door refused the other uid");
}

#[tokio::test]
async fn an_allowed_uid_gets_shared_memory() {
    if !tests::require_root("an_allowed_uid_gets_shared_memory") {
        return;
    }
    // (Not uid 65534: the overflow uid is never trusted, allowed or not.)
    let (addr, mut rx) = server(ShmConfig::default().allow_uid(65533)).await;
    let text = run_peer_as(65533, addr, "0").await;
    assert!(text.contains("TRANSPORT smc-d") && text.contains("OK"), "{text}");
    assert_eq!(bounded(10, rx.recv()).await.unwrap().1, Transport::SmcD);
    // Allowing one uid does not allow others.
    let (addr, mut rx) = server(ShmConfig::default().allow_uid(65532)).await;
    let text = run_peer_as(65533, addr, "0").await;
    assert!(text.contains("TRANSPORT tcp (") && text.contains("OK"), "{text}");
    assert!(matches!(bounded(10, rx.recv()).await.unwrap().1, Transport::Tcp(_)));
}

/// A read returns what a peek showed, as over TCP, whatever the peer does between: a peer
/// that sends a message inline with other bytes in its ring, and one that rewrites bytes of
/// its ring after they were peeked at, both read back what the peek returned (the peer's
/// memory is read once per byte).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_returns_what_a_peek_showed_whatever_the_peer_writes_between() {
    let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut hs = bounded(10, hostile::propose(addr, 4243, 78, 0, RMB)).await;
    let server_token = hs.accept.rmb_slot;
    let (mut region, _sock, _server_memfd, ring_server) = hostile::join_genuine(&hs, layout()).await;
    let commit = hs.confirm(0).await.unwrap();
    assert!(hostile::is_commit(&commit, hs.secret), "the server commits: {commit:?}");
    let (mut s, _) = bounded(10, l.accept()).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD);

    // Inline bytes that differ from the ring's: the peek and the read agree.
    region.rmb_write(0, 0, b"AAAA");
    let mut cdc = CdcMsg::new(1, server_token);
    cdc.prod = Cursor::new(0, 4);
    cdc.set_inline(b"BBBB").unwrap();
    region.push_cdc(&cdc);
    hostile::ring(ring_server.as_raw_fd()).unwrap();
    let mut peeked = [0u8; 4];
    assert_eq!(bounded(10, s.peek(&mut peeked)).await.unwrap(), 4);
    region.rmb_write(0, 0, b"CCCC");
    let mut read = [0u8; 4];
    bounded(10, s.read_exact(&mut read)).await.unwrap();
    assert_eq!(read, peeked, "inline {:?}", String::from_utf8_lossy(&peeked));

    // Bytes of the ring rewritten after a peek: the read returns the peeked ones, and so does a
    // second peek of more.
    region.rmb_write(0, 4, b"DDDDdddd");
    let mut cdc = CdcMsg::new(2, server_token);
    cdc.prod = Cursor::new(0, 12);
    region.push_cdc(&cdc);
    hostile::ring(ring_server.as_raw_fd()).unwrap();
    let mut first = [0u8; 4];
    bounded(10, async {
        while s.peek(&mut first).await.unwrap() < 4 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!(&first, b"DDDD");
    region.rmb_write(0, 4, b"EEEE");
    let mut more = [0u8; 8];
    assert_eq!(bounded(10, s.peek(&mut more)).await.unwrap(), 8);
    assert_eq!(&more, b"DDDDdddd", "a longer peek after the rewrite");
    region.rmb_write(0, 8, b"eeee");
    let mut read = [0u8; 8];
    bounded(10, s.read_exact(&mut read)).await.unwrap();
    assert_eq!(&read, b"DDDDdddd", "the read after the rewrites");
}
