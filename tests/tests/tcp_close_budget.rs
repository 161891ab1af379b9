//! The budget of TCP sockets held for peers' closes, in a test binary of its own: it lowers the
//! process's descriptor limit, which tests running beside it would feel.

#[path = "support/close_bed.rs"]
mod close_bed;
use close_bed::{states_on, wait_for, Bed, FIN_WAIT2};

/// Sockets held for peers' closes stay within a sixteenth of the descriptor limit: past it, a
/// close sends its FIN at once.
#[test]
fn held_sockets_stay_within_their_budget() {
    // SAFETY: reads and sets this process's own limit through valid pointers.
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = 512;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // Made after the limit went down: its contexts' budget is 512 / 16 = 32.
        let bed = Bed::new().await;
        let (mut clients, mut ports) = (Vec::new(), Vec::new());
        for _ in 0..40 {
            let (c, port) = bed.server_gone().await;
            clients.push(c);
            ports.push(port);
        }
        assert_eq!(bed.sctx.stats().tcp_held, 32);
        // The FIN goes when the stream's watcher task is gone, on the runtime's next turn.
        wait_for("8 closes past the budget send a FIN", || {
            states_on(bed.port, &ports).iter().filter(|&&s| s == FIN_WAIT2).count() == 8
        })
        .await;
        drop(clients);
        wait_for("held sockets let go", || bed.sctx.stats().tcp_held == 0).await;
    });
}
