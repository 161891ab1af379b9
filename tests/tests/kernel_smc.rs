//! The kernel-SMC option (`AF_SMC` sockets) on a host whose kernel may have no `AF_SMC` (this
//! development VM and CI have none): wanting it changes nothing a peer or the application can
//! see, and the stats count why the sockets stayed TCP. Where the kernel has `AF_SMC`, the same
//! tests check that the listener really is an `AF_SMC` socket and still serves every kind of
//! client. The kernel-SMC peers themselves are tested in the soft-RoCE guests
//! (`tests/rdma-vm/run.sh two-kernel`).

use smc_tokio::config::Settings;
use smc_tokio::kernel::{KernelMode, KernelUnavailable};
use smc_tokio::{FallbackReason, SmcListener, SmcStream, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The stats' count for `why`.
fn unavailable(why: KernelUnavailable) -> u64 {
    smc_tokio::stats().kernel.unavailable[why.index()]
}

async fn echo_once(listener: &SmcListener) -> std::io::Result<Transport> {
    let (mut s, _) = listener.accept().await?;
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).await?;
    s.write_all(&buf).await?;
    Ok(s.transport())
}

async fn roundtrip<S: AsyncReadExt + AsyncWriteExt + Unpin>(s: &mut S) {
    s.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");
}

#[tokio::test]
async fn kernel_on_without_af_smc_falls_back_cleanly_with_the_reason_counted() {
    let have = smc_tokio::kernel::available();
    // The listener has a context of its own, whose counters only its fallback moves (the other
    // tests here count theirs in the process's, at the same time).
    let ctx = smc_tokio::Context::new();
    let no_af_smc = || ctx.stats().kernel.unavailable[KernelUnavailable::NoAfSmc.index()];
    let before = no_af_smc();
    let listener = SmcListener::builder().context(&ctx).kernel(KernelMode::On).bind("127.0.0.1:0").await.unwrap();
    assert_eq!(listener.is_kernel_smc(), have, "AF_SMC exactly where the kernel has it");
    if !have {
        assert_eq!(no_af_smc(), before + 1, "the listener's fallback is counted");
    }
    let addr = listener.local_addr().unwrap();

    // An smc-tokio client that wants the kernel's SMC too: the listener's door gives it this
    // crate's SMC-D, as without the option.
    let mut c = SmcStream::builder().kernel(KernelMode::On).connect(addr).await.unwrap();
    let (mut srv, _) = listener.accept().await.unwrap();
    assert_eq!(c.transport(), Transport::SmcD);
    assert_eq!(srv.transport(), Transport::SmcD);
    c.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    srv.read_exact(&mut buf).await.unwrap();
    srv.write_all(&buf).await.unwrap();
    c.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");

    // A plain tokio client: plain TCP, bytes intact, no wait.
    let server = tokio::spawn(async move { (echo_once(&listener).await, listener) });
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    roundtrip(&mut plain).await;
    let (t, _listener) = server.await.unwrap();
    let t = t.unwrap();
    if have {
        // The kernel fell back for a client without the SMC option, and says why.
        assert!(matches!(t, Transport::Tcp(FallbackReason::Kernel(_))), "{t}");
    } else {
        assert_eq!(t, Transport::Tcp(FallbackReason::PeerNoSmc));
    }
}

#[tokio::test]
async fn a_kernel_client_of_a_plain_server_stays_tcp_with_its_bytes() {
    let have = smc_tokio::kernel::available();
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = plain.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = plain.accept().await.unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf).await.unwrap();
        // The plain server sees exactly the application's bytes and then the end.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        rest
    });
    let before = unavailable(KernelUnavailable::NoAfSmc);
    let mut c = SmcStream::builder().kernel(KernelMode::On).connect(addr).await.unwrap();
    roundtrip(&mut c).await;
    match c.transport() {
        Transport::Tcp(FallbackReason::NotProposed) => {
            assert!(!have);
            assert!(unavailable(KernelUnavailable::NoAfSmc) > before, "the client's fallback is counted");
        }
        // With AF_SMC, the kernel's SYN option met a plain server: the kernel says so.
        Transport::Tcp(FallbackReason::Kernel(k)) => assert!(have, "{k}"),
        other => panic!("a plain server cannot give {other}"),
    }
    drop(c);
    assert!(server.await.unwrap().is_empty());
}

#[tokio::test]
async fn kernel_off_makes_no_af_smc_socket() {
    let listener = SmcListener::builder().kernel(KernelMode::Off).bind("127.0.0.1:0").await.unwrap();
    assert!(!listener.is_kernel_smc());
    let c = SmcStream::builder().kernel(KernelMode::Off).connect(listener.local_addr().unwrap()).await.unwrap();
    assert_eq!(c.transport(), Transport::SmcD);
}

#[test]
fn auto_without_the_module_is_counted_as_not_loaded() {
    if std::path::Path::new("/sys/module/smc").exists() {
        eprintln!("the kernel's smc module is loaded here: auto uses it (the soft-RoCE guests test that)");
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let before = unavailable(KernelUnavailable::NotLoaded);
        let listener = SmcListener::builder().kernel(KernelMode::Auto).bind("127.0.0.1:0").await.unwrap();
        assert!(!listener.is_kernel_smc());
        assert!(unavailable(KernelUnavailable::NotLoaded) > before);
    });
}

#[test]
fn the_environment_sets_the_mode() {
    let s = Settings::from_vars(|k| (k == "SMC_TOKIO_KERNEL").then(|| "on".to_string()));
    assert_eq!(s.kernel, KernelMode::On);
    let s = Settings::from_vars(|k| (k == "SMC_TOKIO_KERNEL").then(|| "OFF".to_string()));
    assert_eq!(s.kernel, KernelMode::Off);
    // Unparsable: the default stays (with a warning).
    let s = Settings::from_vars(|k| (k == "SMC_TOKIO_KERNEL").then(|| "maybe".to_string()));
    assert_eq!(s.kernel, KernelMode::Auto);
    assert_eq!(Settings::default().kernel, KernelMode::Auto);
}

#[test]
fn the_global_limit_knob_says_why_it_cannot_work_here() {
    match smc_tokio::kernel::limit_handshake() {
        // A kernel with SMC: the dump answers.
        Ok(_) => assert!(std::path::Path::new("/sys/module/smc").exists()),
        Err(e) => {
            assert!(!std::path::Path::new("/sys/module/smc").exists(), "{e}");
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        }
    }
}
