//! Link groups are process-wide, so they must not die with the runtime that happened to set
//! them up: connections of several runtimes share one group, a runtime can be dropped while
//! the others go on, and a program may build a runtime per request.

use std::time::Duration;

use smc_tokio::{SmcListener, SmcStream, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

/// A runtime with one worker thread of its own: it keeps running what it was given while the
/// test's thread does other things.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

async fn echo_once(s: &mut SmcStream, round: usize) {
    let msg = format!("round {round} from {:?}", s.local_addr().unwrap()).into_bytes();
    s.write_all(&msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tests::bounded(10, s.read_exact(&mut back)).await.unwrap();
    assert_eq!(back, msg);
}

#[test]
fn connections_on_other_runtimes_keep_echoing_after_the_groups_runtime_is_dropped() {
    let (_server_rt, addr) = tests::echo_server_on_own_runtime();
    let rescued_before = smc_tokio::stats().link_groups_rescued;
    // The first runtime's connection sets up the client link group (its driver runs there);
    // the other two runtimes' connections join that group.
    let rts: Vec<Runtime> = (0..3).map(|_| runtime()).collect();
    let mut streams: Vec<SmcStream> = rts
        .iter()
        .map(|rt| rt.block_on(async { tests::bounded(10, SmcStream::connect(addr)).await.unwrap() }))
        .collect();
    let group = streams[0].link_group();
    for (i, s) in streams.iter().enumerate() {
        assert_eq!(s.transport(), Transport::SmcD, "connection {i}");
        assert_eq!(s.link_group(), group, "connection {i} shares the first one's link group");
    }
    for (rt, s) in rts.iter().zip(streams.iter_mut()) {
        rt.block_on(echo_once(s, 0));
    }
    // Drop the runtime that drives the group, with its connection.
    let mut rts = rts.into_iter();
    let first = rts.next().unwrap();
    drop(streams.remove(0));
    drop(first);
    // The others keep echoing, on the same group, for many rounds (each waits for the peer,
    // so the group's driver must be running somewhere).
    for round in 1..=200 {
        for (rt, s) in rts.as_slice().iter().zip(streams.iter_mut()) {
            rt.block_on(echo_once(s, round));
        }
    }
    for s in &streams {
        assert_eq!(s.link_group(), group);
    }
    assert!(smc_tokio::stats().link_groups_rescued > rescued_before, "the group moved to the rescue driver");
    // New connections from a new runtime still join it.
    let rt = runtime();
    let mut s = rt.block_on(async { SmcStream::connect(addr).await.unwrap() });
    assert_eq!((s.transport(), s.link_group()), (Transport::SmcD, group));
    rt.block_on(echo_once(&mut s, 0));
}

/// Reads `len` bytes one at a time from a stream that already holds them all, on a
/// current-thread runtime, with a second task waiting to run: returns how many bytes had been
/// read when the second task got its turn.
async fn bytes_read_before_another_task_ran<R: tokio::io::AsyncRead + Unpin>(r: &mut R, len: usize) -> usize {
    let mut one = [0u8; 1];
    // The first byte may need a wait; after it, every read finds bytes at once.
    r.read_exact(&mut one).await.unwrap();
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    tokio::spawn(async move { flag.store(true, std::sync::atomic::Ordering::Relaxed) });
    let mut read = 1;
    let mut seen_at = None;
    while read < len {
        read += r.read(&mut one).await.unwrap();
        if seen_at.is_none() && ran.load(std::sync::atomic::Ordering::Relaxed) {
            seen_at = Some(read);
        }
    }
    seen_at.unwrap_or(read)
}

#[test]
fn a_stream_that_is_always_ready_yields_to_the_other_tasks_as_a_tcp_stream_does() {
    const LEN: usize = 4096;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // tokio's TcpStream spends the task's cooperative budget (128 operations) and then
        // makes the task yield; the other task runs long before the 4096 reads are done.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (c, s) = tokio::join!(tokio::net::TcpStream::connect(l.local_addr().unwrap()), l.accept());
        let (mut c, (mut s, _)) = (c.unwrap(), s.unwrap());
        s.write_all(&[7u8; LEN]).await.unwrap();
        let tcp = bytes_read_before_another_task_ran(&mut c, LEN).await;
        assert!(tcp < LEN / 4, "tcp: the other task ran after {tcp} reads");

        let (mut c, mut s) = tests::smc_pair(smc_tokio::config::ShmConfig::default()).await;
        s.write_all(&[7u8; LEN]).await.unwrap();
        let smc = bytes_read_before_another_task_ran(&mut c, LEN).await;
        assert!(smc < LEN / 4, "smc: the other task ran after {smc} of {LEN} reads (tcp: {tcp})");
    });
}

/// Shared memory with a busy-poll budget of `budget` and adaptive polling off: what a waiting
/// side does is busy polling's alone.
fn busy_polling_only(budget: Duration) -> smc_tokio::config::ShmConfig {
    smc_tokio::config::ShmConfig::default().busy_poll(budget).adaptive_poll(Duration::ZERO)
}

/// A reader spins for frames only while it awaits a reply, and not when the reply is there
/// already: one that never wrote, or that just read what came and looks again (draining until
/// it would block, as hyper and most protocol loops do), goes on waiting as without busy
/// polling. Spinning there held the thread
/// for the whole spin on every empty look (`smcperf local --scenario http --conns 64
/// --busy-poll 50`: 49-50 k requests/s against 216-263 k once it stopped).
#[tokio::test]
async fn a_reader_spins_only_while_it_awaits_a_reply() {
    let ctx = smc_tokio::Context::new();
    let (mut c, mut s) = tests::smc_pair_in(&ctx, busy_polling_only(Duration::from_millis(1))).await;
    let spins = || smc_tokio::faults::reader_spins(&ctx);
    let mut buf = [0u8; 64];
    // The client never wrote: its empty looks do not spin, however many.
    let before = spins();
    for _ in 0..100 {
        assert_eq!(c.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    }
    assert_eq!(spins(), before, "a reader that never wrote spun");
    // Messages come, the client reads them, then looks again and finds nothing: no spin.
    s.write_all(b"one").await.unwrap();
    s.write_all(b"two").await.unwrap();
    let mut got = Vec::new();
    while got.len() < 6 {
        let n = tests::bounded(10, c.read(&mut buf)).await.unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"onetwo");
    let before = spins();
    assert_eq!(c.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(spins(), before, "a reader that had just drained spun");
    // The client asks; the server has not answered yet: the client's look spins (and finds
    // nothing, since the answer is not written until after it).
    c.write_all(b"ask").await.unwrap();
    let n = tests::bounded(10, s.read(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"ask");
    let before = spins();
    assert_eq!(c.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(spins(), before + 1, "a reader awaiting a reply did not spin");
    s.write_all(b"answer").await.unwrap();
    let n = tests::bounded(10, c.read(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"answer");
    // Answered: the next empty look does not spin.
    let before = spins();
    assert_eq!(c.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    assert_eq!(spins(), before, "a reader whose reply came spun");
    // A reply that is on the link already (written, not yet taken by anyone) is taken without
    // a spin, which would end at its first look. Neither write yields, so nothing runs between
    // the answer and the read: the answer is in the client group's CDC ring, not dispatched.
    for round in 0..10 {
        c.write_all(b"ask").await.unwrap();
        let n = tests::bounded(10, s.read(&mut buf)).await.unwrap();
        assert_eq!(&buf[..n], b"ask");
        s.write_all(b"answer").await.unwrap();
        let before = spins();
        let n = c.try_read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"answer", "round {round}");
        assert_eq!(spins(), before, "round {round}: the reader spun for a reply that was there");
    }
}

/// A connection alone on its link group that awaits a reply spins for it inside its poll, by
/// default (adaptive polling on, busy polling off), unless its last spin missed its reply; once
/// another connection shares the group, none does (a spin held the thread from the group's
/// other connections), and with adaptive polling off, neither.
#[tokio::test]
async fn only_a_connection_alone_on_its_link_group_spins_for_its_reply() {
    use smc_tokio::config::ShmConfig;
    for (shm, alone_spins) in [(ShmConfig::default(), 1), (ShmConfig::default().adaptive_poll(Duration::ZERO), 0)] {
        let ctx = smc_tokio::Context::new();
        let l = SmcListener::builder().context(&ctx).shm(shm.clone()).bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let builder = SmcStream::builder().context(&ctx).shm(shm);
        let pair = || async {
            let (c, s) = tokio::join!(builder.connect(addr), l.accept());
            let (c, (s, _)) = (c.unwrap(), s.unwrap());
            assert_eq!((c.transport(), s.transport()), (Transport::SmcD, Transport::SmcD));
            (c, s)
        };
        let spins = || smc_tokio::faults::reader_spins(&ctx);
        // The client asks, the server takes the question, and the client looks for the answer
        // before it is written: the spins of that one look.
        async fn ask(c: &mut SmcStream, s: &mut SmcStream, spins: impl Fn() -> u64) -> u64 {
            let mut buf = [0u8; 16];
            c.write_all(b"ask").await.unwrap();
            let n = tests::bounded(10, s.read(&mut buf)).await.unwrap();
            assert_eq!(&buf[..n], b"ask");
            let before = spins();
            assert_eq!(c.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
            let spun = spins() - before;
            s.write_all(b"answer").await.unwrap();
            let n = tests::bounded(10, c.read(&mut buf)).await.unwrap();
            assert_eq!(&buf[..n], b"answer");
            spun
        }
        let (mut c, mut s) = pair().await;
        assert_eq!(ask(&mut c, &mut s, spins).await, alone_spins, "alone on the group");
        if alone_spins > 0 {
            // That spin missed (the answer was written after it), so the next wait skips its
            // spin. The read of the answer was no wait (the answer was on the link already):
            // the skip is left for the first of five more looks before an answer. Each spin
            // misses, and the waits after a miss skip the spin, one after the first miss, then
            // two, then four.
            let mut buf = [0u8; 16];
            c.write_all(b"ask").await.unwrap();
            let n = tests::bounded(10, s.read(&mut buf)).await.unwrap();
            assert_eq!(&buf[..n], b"ask");
            let mut looks = Vec::new();
            for _ in 0..5 {
                let before = spins();
                assert_eq!(c.try_read(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
                looks.push(spins() - before);
            }
            assert_eq!(looks, [0, 1, 0, 0, 1], "spins of looks that missed");
            s.write_all(b"answer").await.unwrap();
            let n = tests::bounded(10, c.read(&mut buf)).await.unwrap();
            assert_eq!(&buf[..n], b"answer");
        }
        let (mut c2, mut s2) = pair().await;
        assert_eq!(ask(&mut c, &mut s, spins).await, 0, "a second connection on the group");
        assert_eq!(ask(&mut c2, &mut s2, spins).await, 0, "the second connection");
        // The second one goes: the first is alone again once both ends forgot it.
        drop((c2, s2));
        tests::bounded(10, async {
            while ask(&mut c, &mut s, spins).await != alone_spins {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
}

/// Busy polling holds no thread: both ends and both link groups' drivers share one
/// current-thread runtime, with a 10 ms busy-poll budget and adaptive polling off. A driver
/// that spun inside its task kept the other end from answering until the spin ran out, then
/// armed its doorbell, and the answer rang it; a driver that looks on the runtime's turns sees
/// the traffic and never arms while it flows.
#[tokio::test]
async fn busy_polling_drivers_let_the_connections_on_their_thread_answer() {
    let ctx = smc_tokio::Context::new();
    let (mut c, mut s) = tests::smc_pair_in(&ctx, busy_polling_only(Duration::from_millis(10))).await;
    let server = tokio::spawn(async move {
        let mut buf = [0u8; 14];
        while s.read_exact(&mut buf).await.is_ok() {
            s.write_all(&buf).await.unwrap();
        }
    });
    const ROUNDS: u64 = 2000;
    let rung_before = ctx.stats().doorbells[0];
    for i in 0..ROUNDS {
        let msg = [(i % 251) as u8; 14];
        c.write_all(&msg).await.unwrap();
        let mut back = [0u8; 14];
        tests::bounded(10, c.read_exact(&mut back)).await.unwrap();
        assert_eq!(back, msg, "round {i}");
    }
    let rung = ctx.stats().doorbells[0] - rung_before;
    // A doorbell now and then is allowed for a thread preempted for more than the budget.
    assert!(rung < ROUNDS / 20, "{rung} doorbells in {ROUNDS} round trips");
    drop(c);
    tests::bounded(10, server).await.unwrap();
}

/// A task that drains the link itself and finds its own bytes there does not wake itself: it is
/// running, and a wake would make the runtime poll it once more for nothing after it returns
/// (an HTTP client's connection task, say, at each response). A wake from elsewhere (bytes the
/// group's driver dispatched) still comes, and so does one a readiness poll of the same task
/// waits for.
#[tokio::test]
async fn a_reader_that_drains_its_own_bytes_does_not_wake_its_own_task() {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    use tokio::io::{AsyncRead, ReadBuf};

    struct Wakes(AtomicUsize);
    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    // Adaptive polling off: a reader that finds nothing neither spins nor wakes itself to
    // look again, so every wake counted here is a delivery's.
    let shm = smc_tokio::config::ShmConfig::default().adaptive_poll(Duration::ZERO);
    let (mut c, s) = tests::smc_pair(shm).await;
    let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let mut buf = [0u8; 16];
    for round in 0..3 {
        let mut rb = ReadBuf::new(&mut buf);
        assert!(Pin::new(&mut c).poll_read(&mut cx, &mut rb).is_pending(), "round {round}: bytes before any were sent");
        // The peer answers; nothing of the client's side runs meanwhile (no await).
        assert_eq!(s.try_write(b"reply").unwrap(), 5);
        // The task looks again: its read drains the link and takes its own bytes.
        let mut rb = ReadBuf::new(&mut buf);
        assert!(matches!(Pin::new(&mut c).poll_read(&mut cx, &mut rb), Poll::Ready(Ok(()))));
        assert_eq!(rb.filled(), b"reply", "round {round}");
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "round {round}: the reader woke its own task");
    }
    // A reader that waits is woken when the group's driver delivers its bytes: the waker held
    // out during the drain went back before the wait.
    let mut rb = ReadBuf::new(&mut buf);
    assert!(Pin::new(&mut c).poll_read(&mut cx, &mut rb).is_pending());
    assert_eq!(s.try_write(b"later").unwrap(), 5);
    tests::bounded(10, async {
        while wakes.0.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let mut rb = ReadBuf::new(&mut buf);
    assert!(matches!(Pin::new(&mut c).poll_read(&mut cx, &mut rb), Poll::Ready(Ok(()))));
    assert_eq!(rb.filled(), b"later");
    wakes.0.store(0, Ordering::SeqCst);

    // A readiness poll of the same task waits on the same waker (`poll_read_ready` and
    // `poll_peek` polled from one task): a peek that drains the bytes leaves them there for it,
    // and must not take the wake that tells the task to poll it again.
    assert!(c.poll_read_ready(&mut cx).is_pending(), "readable before any byte was sent");
    assert_eq!(s.try_write(b"both").unwrap(), 4);
    let mut rb = ReadBuf::new(&mut buf);
    assert!(matches!(c.poll_peek(&mut cx, &mut rb), Poll::Ready(Ok(4))));
    assert_eq!(rb.filled(), b"both");
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the readiness poll's wake-up was lost");
    assert!(matches!(c.poll_read_ready(&mut cx), Poll::Ready(Ok(()))));
}

/// A program that panics while it holds SMC streams unwinds through its runtime's drop, which
/// ends the runtime's link groups while the streams are still open: their connections cannot
/// move to TCP on a runtime that is shutting down, and the panic goes on to the caller instead
/// of the thread hanging in that drop.
#[test]
fn a_panic_that_drops_the_runtime_under_open_smc_streams_unwinds() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let unwound = std::panic::catch_unwind(|| {
            // Declared before the runtime, so dropped after it: open while it shuts down.
            let _streams;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let ctx = smc_tokio::Context::new();
            _streams = rt.block_on(tests::smc_pair_in(&ctx, smc_tokio::config::ShmConfig::default()));
            panic!("the application's own panic");
        });
        let _ = tx.send(unwound.is_err());
    });
    let unwound = rx.recv_timeout(Duration::from_secs(30)).expect("the panicking thread hung in its runtime's drop");
    assert!(unwound);
}

/// A listener whose runtime shut down while it lived (bound in a short-lived runtime, kept for
/// another) fails its accepts, as tokio's listener does, instead of waiting for good on a task
/// that will never run again; and its door is closed, so a same-host client gets TCP at once
/// instead of waiting for an answer.
#[test]
fn a_listener_whose_runtime_shut_down_fails_its_accepts() {
    let first = runtime();
    let l = first.block_on(SmcListener::bind("127.0.0.1:0")).unwrap();
    let addr = l.local_addr().unwrap();
    drop(first);
    let second = runtime();
    second.block_on(async {
        let e = tests::bounded(10, l.accept()).await.map(drop).expect_err("an accept succeeded");
        assert!(e.to_string().contains("shut down"), "{e}");
        // Twice: it stays failed.
        assert!(tests::bounded(10, l.accept()).await.is_err());
        let c = tests::bounded(10, SmcStream::connect(addr)).await.unwrap();
        assert!(!c.transport().is_smc(), "{}", c.transport());
    });
}

/// A stream kept after the runtime it was made on shut down fails its reads and writes, as
/// tokio's stream of such a runtime does, instead of waiting for good (nothing watches its TCP
/// socket any more, so the peer's end or its move to TCP would never be seen). A stream made
/// on another runtime of the same link group goes on.
#[test]
fn a_stream_kept_after_its_runtime_shut_down_fails_instead_of_hanging() {
    let (server_rt, addr) = tests::echo_server_on_own_runtime();
    let (first, second) = (runtime(), runtime());
    let mut kept = first.block_on(async { tests::bounded(10, SmcStream::connect(addr)).await.unwrap() });
    let mut other = second.block_on(async { tests::bounded(10, SmcStream::connect(addr)).await.unwrap() });
    assert_eq!((kept.transport(), other.transport()), (Transport::SmcD, Transport::SmcD));
    assert_eq!(kept.link_group(), other.link_group());
    first.block_on(echo_once(&mut kept, 0));
    drop(first);
    second.block_on(async {
        let mut b = [0u8; 8];
        let r = tests::bounded(10, kept.read(&mut b)).await;
        assert!(r.as_ref().is_err_and(|e| e.to_string().contains("stream's tcp socket shut down")), "{r:?}");
        let w = tests::bounded(10, kept.write(b"x")).await;
        assert!(w.is_err(), "{w:?}");
        for round in 1..=20 {
            echo_once(&mut other, round).await;
        }
    });
    drop(kept);
    drop((second, server_rt));
}

/// A stream kept after its runtime shut down refuses a move to TCP as it fails any other use,
/// without starting one on a socket whose reactor is gone; its peer reads an abort.
#[test]
fn a_hand_back_of_a_stream_whose_runtime_shut_down_fails_with_the_runtimes_error() {
    let server_rt = runtime();
    let l = server_rt.block_on(SmcListener::bind("127.0.0.1:0")).unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = server_rt.spawn(async move { l.accept().await.map(|(s, _)| s) });
    let first = runtime();
    let kept = first.block_on(async { tests::bounded(10, SmcStream::connect(addr)).await.unwrap() });
    assert_eq!(kept.transport(), Transport::SmcD);
    let mut served = server_rt.block_on(async { tests::bounded(10, accepted).await.unwrap().unwrap() });
    drop(first);
    let second = runtime();
    second.block_on(async {
        let r = tests::bounded(10, kept.hand_back()).await;
        assert!(r.as_ref().is_err_and(|e| e.to_string().contains("stream's tcp socket shut down")), "{r:?}");
        assert_eq!(kept.transport(), Transport::SmcD, "no move started");
    });
    server_rt.block_on(async {
        let mut b = [0u8; 8];
        let r = tests::bounded(10, served.read(&mut b)).await;
        assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset));
    });
    drop(kept);
}

/// A thread that panics while its runtime drives a link group that another runtime's
/// connections share leaves that group to the rescue driver, as any runtime's end does: the
/// panic is the application's, not the driver's, and the other connections go on over shared
/// memory on the same group.
#[test]
fn a_panic_on_one_runtime_leaves_the_groups_it_shares_with_another_running() {
    let (_server_rt, addr) = tests::echo_server_on_own_runtime();
    let ctx = smc_tokio::Context::new();
    let (made_tx, made_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let a_ctx = ctx.clone();
    let a = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // The runtime runs (and drives the group it made) until the word comes.
        let s = rt.block_on(async {
            let s = tests::bounded(10, SmcStream::builder().context(&a_ctx).connect(addr)).await.unwrap();
            made_tx.send(s.link_group()).unwrap();
            let _ = go_rx.await;
            s
        });
        // The stream and the runtime (which drives the group) are dropped while unwinding.
        let _keep = (s, rt);
        panic!("the application's own panic");
    });
    let group = made_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let rt = runtime();
    let mut b =
        rt.block_on(async { tests::bounded(10, SmcStream::builder().context(&ctx).connect(addr)).await.unwrap() });
    assert_eq!((b.transport(), b.link_group()), (Transport::SmcD, group), "the first thread's group");
    rt.block_on(echo_once(&mut b, 0));
    go_tx.send(()).unwrap();
    assert!(a.join().is_err(), "the thread panicked");
    for round in 1..=50 {
        rt.block_on(echo_once(&mut b, round));
    }
    assert_eq!((b.transport(), b.link_group()), (Transport::SmcD, group), "still over the same group");
}

/// A runtime that shuts down with the tasks that hold its SMC streams (whole, or split into
/// owned halves) ends each connection in order, whatever order it drops its tasks in (the
/// stream's, or the watcher of its TCP socket, first): the peer reads what was written, then
/// the end of the stream, as from tokio's streams, never a reset.
#[test]
fn a_runtime_that_shuts_down_under_its_streams_closes_them_in_order() {
    let server_rt = runtime();
    let l = server_rt.block_on(SmcListener::bind("127.0.0.1:0")).unwrap();
    let addr = l.local_addr().unwrap();
    server_rt.spawn(async move {
        let mut n = 0;
        while let Ok((mut s, _)) = l.accept().await {
            n += 1;
            let split = n % 2 == 0;
            tokio::spawn(async move {
                s.write_all(b"hi").await.unwrap();
                // Held until the runtime drops the task.
                if split {
                    let halves = s.into_split();
                    std::future::pending::<()>().await;
                    drop(halves);
                } else {
                    std::future::pending::<()>().await;
                    drop(s);
                }
            });
        }
    });
    let rt = runtime();
    let mut clients = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..32 {
            let mut c = tests::bounded(10, SmcStream::connect(addr)).await.unwrap();
            assert_eq!(c.transport(), Transport::SmcD);
            let mut b = [0u8; 2];
            tests::bounded(10, c.read_exact(&mut b)).await.unwrap();
            clients.push(c);
        }
        clients
    });
    drop(server_rt);
    rt.block_on(async {
        for (i, c) in clients.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            let r = tests::bounded(10, c.read(&mut b)).await;
            assert_eq!(r.map_err(|e| e.kind()), Ok(0), "connection {i}: the end of the stream");
        }
    });
}

/// A listener whose runtime is dropped while its thread unwinds from the application's panic
/// fails its accepts saying its runtime shut down, not that its own task panicked (which points
/// at a runtime built without timers).
#[test]
fn a_listener_whose_runtime_unwinds_from_a_panic_says_its_runtime_shut_down() {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let l = rt.block_on(async {
            let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
            // The listener's task has run.
            tokio::time::sleep(Duration::from_millis(10)).await;
            l
        });
        tx.send(l).unwrap();
        let _keep = rt;
        panic!("the application's own panic");
    });
    let l = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(t.join().is_err(), "the thread panicked");
    let rt = runtime();
    rt.block_on(async {
        let e = tests::bounded(10, l.accept()).await.map(drop).expect_err("an accept succeeded");
        assert!(e.to_string().contains("shut down") && !e.to_string().contains("panicked"), "{e}");
    });
}

/// A listener whose tasks panic (bound on a runtime built without timers, which panics at a
/// task's first timer: a connection's handshake, or the listener's own at its door) fails its
/// accepts saying so, with the likely cause, not that its runtime shut down (that runtime runs
/// on), where its accepts waited for good while each connection was lost.
#[test]
fn a_listener_whose_tasks_panic_says_so() {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (res_tx, res_rx) = std::sync::mpsc::channel();
    // No timers on this runtime, so the test bounds its steps from other threads.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
        rt.block_on(async {
            let l = SmcListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            let first = l.accept().await.map(drop);
            // The runtime runs on, and the listener stays failed.
            tokio::task::yield_now().await;
            let second = l.accept().await.map(drop);
            let _ = res_tx.send((first, second));
        });
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // A same-host client: the first timer of its connection's handshake on the listener's
    // side panics. Whatever the listener's end leaves this client (TCP, or an error) is not
    // what the test is about.
    let client = std::thread::spawn(move || {
        let _ = runtime().block_on(async { tests::bounded(10, SmcStream::connect(addr)).await.map(drop) });
    });
    let (first, second) = res_rx.recv_timeout(Duration::from_secs(10)).expect("the accept never ended");
    let e = first.expect_err("an accept succeeded");
    assert!(e.to_string().contains("task panicked") && e.to_string().contains("enable_time"), "{e}");
    assert!(second.is_err(), "the listener stays failed");
    client.join().unwrap();
}

/// A connection needs only its own runtime to run, as tokio's streams do: while the runtime
/// that set up the link group it shares lives but does not run (a current-thread runtime whose
/// thread waits outside `block_on`, as a synchronous wrapper's does between calls), its reads
/// still see what the peer sends. Each reply here comes to a reader that is already parked
/// (no spin awaits it), and nothing but the group's doorbell says it came.
#[test]
fn a_group_whose_runtime_lives_but_does_not_run_keeps_serving_other_runtimes() {
    let (_server_rt, addr) = tests::echo_server_on_own_runtime();
    let ctx = smc_tokio::Context::new();
    // Idle groups go soon, so that the end of the second runtime's co-driver shows.
    let shm = smc_tokio::config::ShmConfig::default().idle_timeout(Duration::from_millis(300));
    let (made_tx, made_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (a_ctx, a_shm) = (ctx.clone(), shm.clone());
    let a = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut s = rt.block_on(async {
            let mut s =
                tests::bounded(10, SmcStream::builder().context(&a_ctx).shm(a_shm).connect(addr)).await.unwrap();
            echo_once(&mut s, 0).await;
            s
        });
        made_tx.send(s.link_group()).unwrap();
        // The runtime (and the group's driver on it) lives, but nothing runs it until the
        // other runtime is done.
        done_rx.recv().unwrap();
        rt.block_on(echo_once(&mut s, 1));
    });
    let group = made_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let halves = rt.block_on(async {
        let b = tests::bounded(10, SmcStream::builder().context(&ctx).shm(shm.clone()).connect(addr)).await.unwrap();
        assert_eq!((b.transport(), b.link_group()), (Transport::SmcD, group), "the first runtime's group");
        assert_eq!(ctx.stats().link_group_co_drivers, 1, "this runtime waits on the group's link too");
        let (mut r, mut w) = b.into_split();
        for round in 0..20u8 {
            let reader = tokio::spawn(async move {
                let mut back = [0u8; 3];
                r.read_exact(&mut back).await.map(|_| (r, back))
            });
            // The reader parks before anything is on its way.
            tokio::time::sleep(Duration::from_millis(20)).await;
            w.write_all(&[round, 1, 2]).await.unwrap();
            let (back_r, back) = tests::bounded(5, reader).await.unwrap().unwrap();
            assert_eq!(back, [round, 1, 2], "round {round}");
            r = back_r;
        }
        (r, w)
    });
    // A third runtime's connection starts its co-driver; dropping that runtime ends it, however
    // far the task got (perhaps not to its first turn).
    let third = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let c =
        third.block_on(tests::bounded(10, SmcStream::builder().context(&ctx).shm(shm.clone()).connect(addr))).unwrap();
    assert_eq!(c.link_group(), group);
    assert_eq!(ctx.stats().link_group_co_drivers, 2, "one for each runtime other than the group's");
    drop(third);
    drop(c);
    assert_eq!(ctx.stats().link_group_co_drivers, 1, "the dropped runtime's co-driver is gone");
    done_tx.send(()).unwrap();
    a.join().unwrap();
    // The first runtime is gone (its group went to the rescue driver); once the group idles
    // out, the co-driver leaves with it.
    rt.block_on(async {
        drop(halves);
        tests::bounded(10, async {
            while ctx.stats().link_group_co_drivers != 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    });
}
