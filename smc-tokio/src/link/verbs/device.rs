//! Safe owners of verbs objects (device context and protection domain, memory regions,
//! completion channel and queue, queue pair) and device discovery: which device, port and GID
//! serve a local IP address.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use super::ffi::{self, Lib};
use crate::config::RdmaConfig;

/// Why this process offers no RDMA for a connection. Counted in the stats by
/// [`as_str`](Unavailable::as_str).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// RDMA is switched off in the settings.
    Disabled,
    /// libibverbs could not be loaded.
    NoLibrary(&'static str),
    /// No RDMA device is present (or none could be opened).
    NoDevice,
    /// Devices exist, but no active RoCE port has a GID for the connection's local address.
    NoPort,
}

impl Unavailable {
    /// Its index in [`Stats::rdma_unavailable`](crate::Stats::rdma_unavailable).
    pub(crate) fn index(&self) -> usize {
        match self {
            Unavailable::Disabled => 0,
            Unavailable::NoLibrary(_) => 1,
            Unavailable::NoDevice => 2,
            Unavailable::NoPort => 3,
        }
    }

    /// A short name for stats and logs.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Unavailable::Disabled => "disabled",
            Unavailable::NoLibrary(_) => "no libibverbs",
            Unavailable::NoDevice => "no rdma device",
            Unavailable::NoPort => "no active port for the address",
        }
    }
}

/// An open device context.
pub(crate) struct Device {
    pub(crate) lib: &'static Lib,
    ctx: NonNull<c_void>,
    pub(crate) name: String,
}

// SAFETY: a verbs context may be used from any thread (libibverbs locks internally); this type
// only hands out its pointer to the wrappers in this module.
unsafe impl Send for Device {}
// SAFETY: as above; no method mutates Rust-visible state.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).finish()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the context is ours; every object made from it holds an Arc of this Device,
        // so none is left when it drops.
        unsafe { (self.lib.close_device)(self.ctx.as_ptr()) };
    }
}

impl Device {
    pub(crate) fn ctx(&self) -> *mut c_void {
        self.ctx.as_ptr()
    }

    fn query_port(&self, port: u8) -> Option<(ffi::ibv_port_attr, u8)> {
        note_setup("ibv_query_port");
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: `attr` is larger than the structure the library fills; the context is open.
        let r = unsafe { (self.lib.query_port)(self.ctx(), port, &mut attr) };
        if r != 0 {
            return None;
        }
        let link_layer = attr._rest[ffi::PORT_LINK_LAYER - 16];
        Some((attr, link_layer))
    }

    fn query_gid(&self, port: u8, index: c_int) -> Option<[u8; 16]> {
        note_setup("ibv_query_gid");
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: `gid` is a valid out-parameter; the context is open.
        let r = unsafe { (self.lib.query_gid)(self.ctx(), port, index, &mut gid) };
        (r == 0).then_some(gid.raw)
    }
}

// ----- where setup runs ----------------------------------------------------------------

std::thread_local! {
    /// Set while this thread runs link setup on purpose (a blocking thread, [`as_setup`]).
    static SETUP_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set on the dedicated setup thread, where steps run one at a time.
    static DEDICATED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this is the dedicated setup thread, where no other setup step runs meanwhile (not
/// the blocking pool, which runs them side by side when that thread could not start).
pub(crate) fn on_the_setup_thread() -> bool {
    DEDICATED.with(std::cell::Cell::get)
}

/// Device calls that block (creating and modifying verbs objects, registering memory, scanning
/// GID tables) made on a runtime thread instead of a blocking one, since the process started.
static SETUP_ON_RUNTIME: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `f`, link setup that blocks, marking this thread as one where that is expected.
pub(crate) fn as_setup<T>(f: impl FnOnce() -> T) -> T {
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            SETUP_THREAD.with(|c| c.set(false));
        }
    }
    SETUP_THREAD.with(|c| c.set(true));
    let _unmark = Unmark;
    f()
}

/// A job for the setup thread.
type SetupJob = Box<dyn FnOnce() + Send>;

/// Runs `f` (blocking link setup) on the process's RDMA setup thread, inside the caller's
/// runtime (so it may spawn tasks and register descriptors), and resolves to its result.
///
/// One long-lived thread, not tokio's blocking pool, because what setup blocks on is the
/// process's memory map: registering memory pins pages with the map's lock held, and mapping a
/// pool takes it for writing. Setups running side by side on several threads (the blocking
/// pool starts one per concurrent call, each with a fresh stack `mmap`ed from the calling
/// runtime thread) queue writers behind pinning readers, and every page fault or `mmap` of the
/// runtime threads then waits behind them: the soft-RoCE guest measured 330 ms runtime stalls
/// during 20 concurrent handshakes that way, with no verbs call on the runtime. Serialized on
/// one thread, setup never holds the lock in two modes at once. `None` if the job was lost
/// (its thread died).
///
/// A job whose caller stopped waiting before its turn came (its handshake timed out or was
/// dropped) is skipped: setup the thread would do for nobody does not delay the jobs queued
/// behind it.
pub(crate) async fn on_setup_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    match setup_step(None, f).await {
        Setup::Done(t) => Some(t),
        Setup::Late | Setup::Lost => None,
    }
}

/// What became of a setup step queued with a deadline ([`on_setup_thread_by`]).
#[derive(Debug)]
pub(crate) enum Setup<T> {
    /// It ran, with this result.
    Done(T),
    /// Its turn had not come by the deadline: it never runs.
    Late,
    /// Its thread died before it ran.
    Lost,
}

/// [`on_setup_thread`], waiting for the step's turn until `deadline` at most. A step that
/// began by then is waited for to its end, however long it takes after the deadline: its
/// caller gets what it made (a link, a group, a registered slot) and disposes of it, instead
/// of the step finishing for nobody. A step that had not begun never runs.
pub(crate) async fn on_setup_thread_by<T: Send + 'static>(
    deadline: tokio::time::Instant,
    f: impl FnOnce() -> T + Send + 'static,
) -> Setup<T> {
    setup_step(Some(deadline), f).await
}

/// [`on_setup_thread_by`], or with no deadline at all (`None`: no timer, which a runtime with
/// a paused clock would advance to).
async fn setup_step<T: Send + 'static>(
    deadline: Option<tokio::time::Instant>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Setup<T> {
    let handle = tokio::runtime::Handle::current();
    let (start_tx, mut start_rx) = tokio::sync::oneshot::channel::<()>();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: SetupJob = Box::new(move || {
        // Inside the runtime whatever becomes of the step, so that `f`, dropped unrun, drops
        // there too (moved in after the guard, it drops before it).
        let _rt = handle.enter();
        let f = f;
        // Begins only while its caller waits; the caller, having seen it begin, waits for its
        // end.
        if start_tx.send(()).is_err() {
            tracing::debug!("rdma setup step skipped: nobody waits for it any more");
            return;
        }
        let _ = tx.send(as_setup(f));
    });
    if let Err(job) = send_setup_job(job) {
        // No setup thread: the blocking pool does it.
        drop(tokio::task::spawn_blocking(job));
    }
    let waited = match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, &mut start_rx).await,
        None => Ok((&mut start_rx).await),
    };
    let begun = match waited {
        Ok(r) => r.is_ok(),
        Err(_) => {
            // Closed first, so that the step either began before this (and is waited for) or
            // never begins.
            start_rx.close();
            if start_rx.try_recv().is_err() {
                return Setup::Late;
            }
            true
        }
    };
    if !begun {
        return Setup::Lost;
    }
    rx.await.map_or(Setup::Lost, Setup::Done)
}

/// Drops `what` (a link's verbs objects: destroying them and deregistering memory takes the
/// memory map's lock too) on the setup thread, or here if there is none or this is it.
pub(crate) fn drop_on_setup_thread(what: Box<dyn std::any::Any + Send>) {
    if SETUP_THREAD.with(std::cell::Cell::get) {
        // On it already (a setup step that ended an idle group to make room): now, so that
        // what it unpins is given back to the budget before the step goes on.
        drop(what);
        return;
    }
    let job: SetupJob = Box::new(move || as_setup(move || drop(what)));
    if let Err(job) = send_setup_job(job) {
        job();
    }
}

/// Queues a job for the setup thread (started on first use); gives it back if there is none.
fn send_setup_job(job: SetupJob) -> Result<(), SetupJob> {
    static SETUP: OnceLock<Option<Mutex<std::sync::mpsc::Sender<SetupJob>>>> = OnceLock::new();
    let sender = SETUP.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SetupJob>();
        let spawned = std::thread::Builder::new().name("smc-tokio-rdma-setup".into()).spawn(move || {
            DEDICATED.with(|d| d.set(true));
            for job in rx {
                job();
            }
        });
        match spawned {
            Ok(_) => Some(Mutex::new(tx)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the rdma setup thread: using the blocking pool");
                None
            }
        }
    });
    match sender {
        Some(s) => s.lock().unwrap_or_else(|e| e.into_inner()).send(job).map_err(|e| e.0),
        None => Err(job),
    }
}

/// Notes a blocking device call: one made on a runtime thread (a task's, not a blocking
/// thread running [`as_setup`]) is counted and logged, as the bug it is.
fn note_setup(what: &'static str) {
    if !SETUP_THREAD.with(std::cell::Cell::get) && tokio::runtime::Handle::try_current().is_ok() {
        SETUP_ON_RUNTIME.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(what, "blocking rdma setup call on a runtime thread");
    }
}

/// Holds the setup thread (or, without one, a blocking thread) until the returned sender is
/// dropped or sent to: the jobs queued meanwhile wait, as they would behind slow setups.
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn hold_setup_thread() -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let job: SetupJob = Box::new(move || {
        let _ = rx.recv();
    });
    if let Err(job) = send_setup_job(job) {
        std::thread::spawn(job);
    }
    tx
}

/// How many blocking device calls ran on a runtime thread (see [`note_setup`]); 0 is right.
/// Read by the tests through `faults` (feature `test-util`).
#[cfg(feature = "test-util")]
pub(crate) fn setup_calls_on_runtime() -> u64 {
    SETUP_ON_RUNTIME.load(std::sync::atomic::Ordering::Relaxed)
}

/// A protection domain. Each link group has its own (as the kernel's SMC-R has one per link):
/// a QP can only reach memory registered in its own PD, so no peer can aim an RDMA WRITE at
/// another group's buffers, whatever rkey it guesses.
pub(crate) struct Pd {
    dev: Arc<Device>,
    pd: NonNull<c_void>,
}

// SAFETY: a PD may be used from any thread (libibverbs locks internally).
unsafe impl Send for Pd {}
// SAFETY: as above; no method mutates Rust-visible state.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn new(dev: &Arc<Device>) -> io::Result<Arc<Pd>> {
        note_setup("ibv_alloc_pd");
        // SAFETY: the context is open.
        let pd = unsafe { (dev.lib.alloc_pd)(dev.ctx()) };
        let pd = NonNull::new(pd).ok_or_else(io::Error::last_os_error)?;
        Ok(Arc::new(Pd { dev: dev.clone(), pd }))
    }

    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// `addr..addr + len` must stay mapped until the returned region is dropped.
    pub(crate) unsafe fn reg_mr(self: &Arc<Self>, addr: *mut u8, len: usize, access: c_int) -> io::Result<Mr> {
        note_setup("ibv_reg_mr");
        // SAFETY: the PD is open; the caller keeps the memory mapped for the MR's life.
        let mr = unsafe { (self.dev.lib.reg_mr)(self.pd.as_ptr(), addr.cast(), len, access) };
        let mr = NonNull::new(mr).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: a registered MR's lkey and rkey sit at these offsets (checked by the test bed).
        let (lkey, rkey) = unsafe {
            let p = mr.as_ptr().cast::<u8>();
            (p.add(ffi::MR_LKEY).cast::<u32>().read(), p.add(ffi::MR_RKEY).cast::<u32>().read())
        };
        Ok(Mr { pd: self.clone(), mr, lkey, rkey })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP made in this PD holds an Arc of it, so none is left.
        unsafe { (self.dev.lib.dealloc_pd)(self.pd.as_ptr()) };
    }
}

/// A registered memory region.
pub(crate) struct Mr {
    pd: Arc<Pd>,
    mr: NonNull<c_void>,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

// SAFETY: an MR handle may be deregistered from any thread; the keys are plain values.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the MR is ours and registered once.
        unsafe { (self.pd.dev.lib.dereg_mr)(self.mr.as_ptr()) };
    }
}

/// An anonymous private mapping, touched (and so backed) only where it is registered or used.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; access is coordinated by its users.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(crate) fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: an anonymous mapping with no address hint has no preconditions.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len: len.max(1) })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours; every MR over it was dropped first (field order).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A completion channel: the descriptor that becomes readable when an armed CQ gets a
/// completion. The link group's driver waits on it through tokio's `AsyncFd` (which needs
/// only its raw descriptor).
pub(crate) struct CompChannel {
    dev: Arc<Device>,
    ch: NonNull<c_void>,
    fd: RawFd,
}

// SAFETY: libibverbs' channel calls are thread-safe; the link takes events from one task (its
// link group's driver), and the descriptor is only read.
unsafe impl Send for CompChannel {}
// SAFETY: as above.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    pub(crate) fn new(dev: &Arc<Device>) -> io::Result<CompChannel> {
        note_setup("ibv_create_comp_channel");
        // SAFETY: the context is open.
        let ch = unsafe { (dev.lib.create_comp_channel)(dev.ctx()) };
        let ch = NonNull::new(ch).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: a channel's fd sits at this offset (checked by the test bed).
        let fd = unsafe { ch.as_ptr().cast::<u8>().add(ffi::CHANNEL_FD).cast::<c_int>().read() };
        let me = CompChannel { dev: dev.clone(), ch, fd };
        // Non-blocking, so ibv_get_cq_event returns EAGAIN instead of sleeping in the reactor.
        crate::sys::set_nonblocking(fd)?;
        Ok(me)
    }

    /// Takes one completion event: `Ok(true)` if there was one, `Ok(false)` on EAGAIN.
    pub(crate) fn get_event(&self) -> io::Result<bool> {
        let mut cq = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the channel is open and non-blocking; out-parameters are valid.
        let r = unsafe { (self.dev.lib.get_cq_event)(self.ch.as_ptr(), &mut cq, &mut ctx) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            Ok(false)
        } else {
            Err(e)
        }
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: the CQ using this channel was destroyed first (the link's field order).
        unsafe { (self.dev.lib.destroy_comp_channel)(self.ch.as_ptr()) };
    }
}

/// A completion queue bound to a channel.
pub(crate) struct Cq {
    dev: Arc<Device>,
    pub(crate) cq: NonNull<c_void>,
    poll: ffi::PollCqFn,
    notify: ffi::ReqNotifyFn,
    /// Events taken from the channel and not yet acknowledged.
    unacked: Mutex<u32>,
}

// SAFETY: polls and arms happen under the link's CQ lock; acks take our own `unacked` lock;
// libibverbs and its providers allow these calls from any thread.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

/// Reads the function pointer at byte `offset` of a context's ops table.
///
/// # Safety
/// `ctx` must be an open `ibv_context`, `offset` one of the `CTX_OPS_*` offsets and `F` the
/// function-pointer type of the operation there.
unsafe fn op<F: Copy>(ctx: *mut c_void, offset: usize) -> io::Result<F> {
    // SAFETY: per the contract, a function pointer (possibly null) sits at `offset`.
    let p = unsafe { ctx.cast::<u8>().add(offset).cast::<*mut c_void>().read() };
    if p.is_null() {
        return Err(io::Error::other("verbs provider lacks an operation"));
    }
    // SAFETY: F is the fn-pointer type of that operation (the caller's contract).
    Ok(unsafe { ffi::fn_ptr(p) })
}

impl Cq {
    pub(crate) fn new(dev: &Arc<Device>, entries: u32, channel: &CompChannel) -> io::Result<Cq> {
        note_setup("ibv_create_cq");
        // SAFETY: the context and channel are open.
        let cq =
            unsafe { (dev.lib.create_cq)(dev.ctx(), entries as c_int, std::ptr::null_mut(), channel.ch.as_ptr(), 0) };
        let cq = NonNull::new(cq).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: the context is open; the offsets are the ops table's.
        let (poll, notify) =
            unsafe { (op(dev.ctx(), ffi::CTX_OPS_POLL_CQ)?, op(dev.ctx(), ffi::CTX_OPS_REQ_NOTIFY_CQ)?) };
        Ok(Cq { dev: dev.clone(), cq, poll, notify, unacked: Mutex::new(0) })
    }

    /// Polls up to `out.len()` completions; returns how many were written.
    pub(crate) fn poll(&self, out: &mut [ffi::ibv_wc]) -> io::Result<usize> {
        // SAFETY: `out` has room for `out.len()` entries; the CQ is live.
        let n = unsafe { (self.poll)(self.cq.as_ptr(), out.len() as c_int, out.as_mut_ptr()) };
        usize::try_from(n).map_err(|_| io::Error::other("ibv_poll_cq failed"))
    }

    /// Arms the CQ: the next completion makes the channel readable.
    pub(crate) fn arm(&self) -> io::Result<()> {
        // SAFETY: the CQ is live.
        let r = unsafe { (self.notify)(self.cq.as_ptr(), 0) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(r))
        }
    }

    /// Counts an event taken from the channel; acknowledges in batches (each ack takes a lock
    /// in libibverbs; the kernel's smc_wr acks every event, we amortize).
    pub(crate) fn event_taken(&self) {
        let mut n = self.unacked.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        if *n >= 32 {
            // SAFETY: `n` events were taken from this CQ's channel and not yet acked.
            unsafe { (self.dev.lib.ack_cq_events)(self.cq.as_ptr(), *n) };
            *n = 0;
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let n = *self.unacked.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: every taken event is acked before the CQ is destroyed, as ibv_destroy_cq
        // requires; the QP using it was destroyed first.
        unsafe {
            if n > 0 {
                (self.dev.lib.ack_cq_events)(self.cq.as_ptr(), n);
            }
            (self.dev.lib.destroy_cq)(self.cq.as_ptr());
        }
    }
}

/// A reliable-connected queue pair.
pub(crate) struct Qp {
    dev: Arc<Device>,
    /// Keeps the PD alive until the QP is destroyed.
    _pd: Arc<Pd>,
    qp: NonNull<c_void>,
    pub(crate) qpn: u32,
    /// The inline data the device granted per send work request (at least what we asked for
    /// when creation with a request succeeded; 0 when it only worked without).
    pub(crate) max_inline: u32,
    post_send: ffi::PostSendFn,
    post_recv: ffi::PostRecvFn,
}

// SAFETY: libibverbs' post calls are thread-safe (providers lock their queues); sends from
// connections are serialized by the link's tx lock, and the server's one LINK_UP post happens
// before any connection can send.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

/// Where a QP connects to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remote {
    pub(crate) gid: [u8; 16],
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) mtu: u16,
}

impl Qp {
    /// An RC QP on `cq` for both queues, moved to INIT on `port`, able to send `inline` bytes
    /// inline if the device grants it (see [`max_inline`](Qp::max_inline); a device that
    /// cannot gets a QP without inline sends).
    pub(crate) fn new(pd: &Arc<Pd>, cq: &Cq, port: u8, send_wr: u32, recv_wr: u32, inline: u32) -> io::Result<Qp> {
        match Self::create(pd, cq, port, send_wr, recv_wr, inline) {
            Err(e) if inline > 0 => {
                tracing::debug!(error = %e, inline, "qp with inline sends refused: creating one without");
                Self::create(pd, cq, port, send_wr, recv_wr, 0)
            }
            r => r,
        }
    }

    fn create(pd: &Arc<Pd>, cq: &Cq, port: u8, send_wr: u32, recv_wr: u32, inline: u32) -> io::Result<Qp> {
        note_setup("ibv_create_qp");
        let dev = &pd.dev;
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.cq.as_ptr(),
            recv_cq: cq.cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the PD and CQ are live; `init` is a valid attribute structure.
        let qp = unsafe { (dev.lib.create_qp)(pd.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: a QP's number sits at this offset (checked by the test bed); the ops offsets
        // are the context's.
        let (qpn, post_send, post_recv) = unsafe {
            (
                qp.as_ptr().cast::<u8>().add(ffi::QP_NUM).cast::<u32>().read(),
                op(dev.ctx(), ffi::CTX_OPS_POST_SEND),
                op(dev.ctx(), ffi::CTX_OPS_POST_RECV),
            )
        };
        // ibv_create_qp writes the capabilities it granted back into `init`.
        let max_inline = init.cap.max_inline_data;
        let me =
            Qp { dev: dev.clone(), _pd: pd.clone(), qp, qpn, max_inline, post_send: post_send?, post_recv: post_recv? };
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: (ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE) as u32,
            ..Default::default()
        };
        me.modify(&mut a, ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_ACCESS_FLAGS)?;
        Ok(me)
    }

    fn modify(&self, a: &mut ffi::ibv_qp_attr, mask: c_int) -> io::Result<()> {
        note_setup("ibv_modify_qp");
        // SAFETY: the QP is live; `a` is a valid attribute structure for `mask`.
        let r = unsafe { (self.dev.lib.modify_qp)(self.qp.as_ptr(), a, mask) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(r))
        }
    }

    /// INIT -> RTR -> RTS towards `remote`, sending from `sgid_index` with our `psn`.
    pub(crate) fn connect(&self, port: u8, sgid_index: u8, psn: u32, remote: &Remote) -> io::Result<()> {
        let mtu = ffi::mtu_enum(remote.mtu).ok_or_else(|| io::Error::other("bad path mtu"))?;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_RTR,
            path_mtu: mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            // 12: 0.64 ms, the value ibv_rc_pingpong and the kernel's smc_ib use.
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = port;
        a.ah_attr.grh.dgid.raw = remote.gid;
        a.ah_attr.grh.sgid_index = sgid_index;
        a.ah_attr.grh.hop_limit = 64;
        self.modify(
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER,
        )?;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_RTS,
            // 14: 4.096 us * 2^14 = 67 ms per try, 6 retries: a peer that stopped answering
            // (its process, its host or the path to it gone) fails the link in about half a
            // second (the kernel's smc_ib uses 30 and 7 for real fabrics). Not 7: soft-RoCE
            // (rxe) takes a retry count of 7 for "retry forever", as the specification does only
            // for `rnr_retry`, and a path that broke under two live processes must fail the
            // link for their connections to move to TCP (`SmcConn::fail_link`).
            timeout: 14,
            retry_cnt: 6,
            // 7: retry forever on receiver-not-ready, as the kernel's SMC-R does; flow control
            // above (the peer's ring and our send-queue bound) keeps it rare.
            rnr_retry: 7,
            sq_psn: psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.modify(
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    /// Moves the QP to the error state: outstanding work requests flush, the peer's next
    /// transfer fails.
    pub(crate) fn set_error(&self) {
        let mut a = ffi::ibv_qp_attr { qp_state: ffi::IBV_QPS_ERR, ..Default::default() };
        // Not counted as setup: the move to ERR is what tears a failed link down, from the
        // runtime; it is one call that flushes the queues and never waits for the peer.
        // SAFETY: the QP is live; `a` is a valid attribute structure for the mask.
        let _ = unsafe { (self.dev.lib.modify_qp)(self.qp.as_ptr(), &mut a, ffi::IBV_QP_STATE) };
    }

    /// Posts a chain of send work requests.
    ///
    /// # Safety
    /// Every `sg_list` in the chain must point to SGEs that stay valid for the call; the
    /// memory they name must be registered (or the WR inline) and, for non-inline WRs, stay
    /// unchanged until the WR completes.
    pub(crate) unsafe fn post_send(&self, wr: *mut ffi::ibv_send_wr) -> io::Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: forwarded from this function's contract; the QP is live.
        let r = unsafe { (self.post_send)(self.qp.as_ptr(), wr, &mut bad) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(r))
        }
    }

    /// Posts one receive of `len` bytes at `addr` (registered with `lkey`).
    ///
    /// # Safety
    /// `addr..addr + len` must be registered under `lkey` and stay mapped until the receive
    /// completes or the QP is destroyed.
    pub(crate) unsafe fn post_recv(&self, wr_id: u64, addr: *mut u8, len: u32, lkey: u32) -> io::Result<()> {
        let mut sge = ffi::ibv_sge { addr: addr as u64, length: len, lkey };
        let mut wr = ffi::ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: `wr` and `sge` live across the call; the buffer per the contract.
        let r = unsafe { (self.post_recv)(self.qp.as_ptr(), &mut wr, &mut bad) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(r))
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: the QP is ours; nothing posts after the link is dropped.
        unsafe { (self.dev.lib.destroy_qp)(self.qp.as_ptr()) };
    }
}

/// A port that serves an address: the device, port number, GID (index and value) and MTU.
#[derive(Debug, Clone)]
pub(crate) struct Port {
    pub(crate) dev: Arc<Device>,
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    pub(crate) gid: [u8; 16],
    pub(crate) mtu: u16,
}

static DEVS: OnceLock<Result<Vec<Arc<Device>>, Unavailable>> = OnceLock::new();

/// Opens the devices (loads libibverbs and every provider library it lists, which can take
/// tens of milliseconds from a cold page cache) on a blocking thread the first time, so that no
/// runtime worker stalls inside a handshake. Later calls return at once. Calls made while it
/// is queued or running wait for that one job instead of queueing more.
pub(crate) async fn init_devices() {
    static OPENING: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    if DEVS.get().is_none() {
        // A lost job (its thread died) is not taken as done: the next call tries again.
        let _ = OPENING
            .get_or_try_init(|| async {
                on_setup_thread(|| {
                    let _ = devices();
                })
                .await
                .ok_or(())
            })
            .await;
    }
}

/// Whether [`init_devices`] ran (whatever it found).
pub(crate) fn devices_opened() -> bool {
    DEVS.get().is_some()
}

/// Whether the devices were opened and there is at least one ([`init_devices`] ran).
pub(crate) fn have_devices() -> bool {
    matches!(DEVS.get(), Some(Ok(_)))
}

/// Every device on the host, opened once per process (devices rarely come and go; a process
/// that needs a new one restarts).
fn devices() -> Result<&'static [Arc<Device>], Unavailable> {
    DEVS.get_or_init(|| {
        note_setup("ibv_open_device");
        let lib = ffi::lib().map_err(Unavailable::NoLibrary)?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-parameter.
        let list = unsafe { (lib.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(Unavailable::NoDevice);
        }
        let mut out = Vec::new();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` device pointers.
            let d = unsafe { *list.add(i) };
            // SAFETY: `d` is a device of the list; its name is a C string owned by it.
            let name = unsafe { CStr::from_ptr((lib.get_device_name)(d)) }.to_string_lossy().into_owned();
            // SAFETY: as above.
            let Some(ctx) = NonNull::new(unsafe { (lib.open_device)(d) }) else {
                tracing::debug!(device = %name, error = %io::Error::last_os_error(), "cannot open rdma device");
                continue;
            };
            out.push(Arc::new(Device { lib, ctx, name }));
        }
        // SAFETY: the list came from get_device_list; open contexts stay valid after freeing it.
        unsafe { (lib.free_device_list)(list) };
        if out.is_empty() {
            Err(Unavailable::NoDevice)
        } else {
            Ok(out)
        }
    })
    .as_ref()
    .map(|v| v.as_slice())
    .map_err(Clone::clone)
}

/// The IPv4-mapped (or native IPv6) GID of an address.
pub(crate) fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn gid_type(dev: &str, port: u8, index: c_int) -> Option<String> {
    note_setup("gid type (sysfs)");
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}"))
        .ok()
        .map(|s| s.trim().to_owned())
}

type PortKey = (IpAddr, String, u8, i32);
/// Hits and misses of [`find_port`]: a miss (an address no RoCE port serves, loopback say)
/// would otherwise rescan every GID table on each handshake.
static PORT_CACHE: OnceLock<Mutex<HashMap<PortKey, Option<Port>>>> = OnceLock::new();

fn port_key(local: IpAddr, cfg: &RdmaConfig) -> PortKey {
    (local, cfg.device.clone().unwrap_or_default(), cfg.port.unwrap_or(0), cfg.gid_index.map_or(-1, i32::from))
}

/// [`find_port`]'s answer if it is known without touching a device (`None`: it is not, and
/// finding out blocks).
pub(crate) fn find_port_cached(local: IpAddr, cfg: &RdmaConfig) -> Option<Result<Port, Unavailable>> {
    if !cfg.enabled {
        return Some(Err(Unavailable::Disabled));
    }
    match DEVS.get() {
        None => return None,
        // No library or no device: known for good.
        Some(Err(e)) => return Some(Err(e.clone())),
        Some(Ok(_)) => {}
    }
    let cache = PORT_CACHE.get_or_init(Mutex::default);
    let hit = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&port_key(local, cfg)).cloned();
    hit.map(|p| p.ok_or(Unavailable::NoPort))
}

/// Starts [`find_port_off_runtime`] for `local` in a task of its own, unless one is running
/// for it already: a listener asks as each connection comes while the answer is not known, and
/// a flood of connections must not pile up tasks.
pub(crate) fn look_up_in_background(local: IpAddr, cfg: &RdmaConfig) {
    static STARTED: OnceLock<Mutex<std::collections::HashSet<PortKey>>> = OnceLock::new();
    let started = STARTED.get_or_init(Mutex::default);
    let key = port_key(local, cfg);
    if !started.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone()) {
        return;
    }
    /// Takes the key out when the look-up ends, or its task is dropped with its runtime.
    struct Unmark(&'static Mutex<std::collections::HashSet<PortKey>>, PortKey);
    impl Drop for Unmark {
        fn drop(&mut self) {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.1);
        }
    }
    let unmark = Unmark(started, key);
    let cfg = cfg.clone();
    tokio::spawn(async move {
        let _unmark = unmark;
        let _ = find_port_off_runtime(local, &cfg).await;
    });
}

/// [`find_port`] without blocking a runtime worker: the cached answer, or the scan on a
/// blocking thread.
pub(crate) async fn find_port_off_runtime(local: IpAddr, cfg: &RdmaConfig) -> Result<Port, Unavailable> {
    if let Some(r) = find_port_cached(local, cfg) {
        return r;
    }
    init_devices().await;
    if let Some(r) = find_port_cached(local, cfg) {
        return r;
    }
    // One look-up per key at a time: a listener asks for each connection while the answer is
    // not known, and each would otherwise queue a job on the setup thread.
    type Looking = Arc<tokio::sync::OnceCell<Result<Port, Unavailable>>>;
    static LOOKING: OnceLock<Mutex<HashMap<PortKey, Looking>>> = OnceLock::new();
    let looking = LOOKING.get_or_init(Mutex::default);
    let key = port_key(local, cfg);
    let cell = looking.lock().unwrap_or_else(|e| e.into_inner()).entry(key.clone()).or_default().clone();
    let cfg = cfg.clone();
    let r =
        cell.get_or_try_init(|| async move { on_setup_thread(move || find_port(local, &cfg)).await.ok_or(()) }).await;
    // Answered (the cache has it now), or lost: the next look-up starts afresh.
    let mut l = looking.lock().unwrap_or_else(|e| e.into_inner());
    if l.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
        l.remove(&key);
    }
    r.cloned().unwrap_or(Err(Unavailable::NoDevice))
}

/// Finds the device, port and GID that serve `local` (the TCP connection's local address):
/// an active Ethernet (RoCE) port whose GID table holds the address as a RoCE v2 GID, unless
/// the settings name a device, port or GID index.
///
/// The first look for an address queries the devices' GID tables and reads sysfs, which blocks:
/// call it on a blocking thread ([`find_port_off_runtime`]), or only after
/// [`find_port_cached`] answered.
pub(crate) fn find_port(local: IpAddr, cfg: &RdmaConfig) -> Result<Port, Unavailable> {
    if !cfg.enabled {
        return Err(Unavailable::Disabled);
    }
    if let Some(r) = find_port_cached(local, cfg) {
        return r;
    }
    let key = port_key(local, cfg);
    let cache = PORT_CACHE.get_or_init(Mutex::default);
    let want = gid_of(local);
    for dev in devices()? {
        if cfg.device.as_ref().is_some_and(|d| *d != dev.name) {
            continue;
        }
        // Every port the device has: they are numbered from 1 without gaps, so the first one
        // that cannot be queried ends the scan.
        for port in 1..=u8::MAX {
            let Some((attr, link_layer)) = dev.query_port(port) else { break };
            if cfg.port.is_some_and(|p| p != port) {
                continue;
            }
            if attr.state != ffi::IBV_PORT_ACTIVE || link_layer != ffi::IBV_LINK_LAYER_ETHERNET {
                continue;
            }
            let Some(mtu) = ffi::mtu_bytes(attr.active_mtu) else { continue };
            let found = if let Some(idx) = cfg.gid_index {
                // It must hold the address too: both ends decline a peer whose GID is not its
                // address's, so a GID of another address could never connect.
                match dev.query_gid(port, c_int::from(idx)) {
                    Some(g) if g == want => Some((idx, g)),
                    Some(_) => {
                        tracing::warn!(dev = %dev.name, port, idx, %local, "the configured gid index does not hold the address's gid: no rdma there");
                        None
                    }
                    None => None,
                }
            } else {
                (0..attr.gid_tbl_len.min(256)).find_map(|i| {
                    let g = dev.query_gid(port, i).filter(|g| *g == want)?;
                    let v2 = gid_type(&dev.name, port, i).is_none_or(|t| t.eq_ignore_ascii_case("RoCE v2"));
                    v2.then_some((i as u8, g))
                })
            };
            if let Some((gid_index, gid)) = found {
                let p = Port { dev: dev.clone(), port, gid_index, gid, mtu };
                cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, Some(p.clone()));
                return Ok(p);
            }
        }
    }
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: a process meets few local addresses; past that, misses are not remembered.
    if c.len() < 1024 {
        c.insert(key, None);
    }
    Err(Unavailable::NoPort)
}

/// Every active RoCE port with its GIDs, for diagnostics (`smc-rdma-test devices`).
///
/// # Examples
///
/// ```
/// // A line per active port; on a host without RDMA, the reason there is none.
/// match smc_tokio::rdma::describe_devices() {
///     Ok(ports) => ports.iter().for_each(|p| assert!(p.contains(" port "))),
///     Err(why) => assert!(!why.is_empty()),
/// }
/// ```
pub fn describe_devices() -> Result<Vec<String>, String> {
    let devs = devices().map_err(|e| match e {
        Unavailable::NoLibrary(m) => m.to_owned(),
        other => other.as_str().to_owned(),
    })?;
    let mut out = Vec::new();
    for dev in devs {
        for port in 1..=u8::MAX {
            let Some((attr, ll)) = dev.query_port(port) else { break };
            let mut line = format!(
                "{} port {port} state {} link_layer {} mtu {:?}",
                dev.name,
                attr.state,
                ll,
                ffi::mtu_bytes(attr.active_mtu)
            );
            for i in 0..attr.gid_tbl_len.min(16) {
                if let Some(g) = dev.query_gid(port, i) {
                    if g != [0; 16] {
                        let t = gid_type(&dev.name, port, i).unwrap_or_default();
                        line.push_str(&format!(" gid[{i}]={} ({t})", std::net::Ipv6Addr::from(g)));
                    }
                }
            }
            out.push(line);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::{hold_setup_thread, on_setup_thread, on_setup_thread_by, Setup};

    /// The setup thread is the process's: the tests that hold it take turns.
    static HOLDING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// A setup step whose caller stopped waiting before the thread came to it (its handshake
    /// timed out) is not run: it would delay the steps queued behind it for nobody.
    #[tokio::test]
    async fn a_setup_step_nobody_waits_for_is_skipped() {
        let _turn = HOLDING.lock().await;
        let held = hold_setup_thread();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let waited =
            tokio::time::timeout(Duration::from_millis(50), on_setup_thread(move || r.store(true, Ordering::SeqCst)));
        assert!(waited.await.is_err(), "the thread is held: the step cannot have run");
        drop(held);
        // A step queued after it runs once the thread has passed the first.
        assert_eq!(on_setup_thread(|| 7).await, Some(7));
        assert!(!ran.load(Ordering::SeqCst), "a step nobody waited for was run");
    }

    /// A deadline bounds a step's wait for its turn, not its run: one whose turn did not come
    /// in time never runs; one that began is waited for to its end, past the deadline.
    #[tokio::test]
    async fn a_deadline_bounds_the_wait_for_a_turn_not_the_step() {
        let _turn = HOLDING.lock().await;
        let held = hold_setup_thread();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let soon = tokio::time::Instant::now() + Duration::from_millis(50);
        let late = on_setup_thread_by(soon, move || r.store(true, Ordering::SeqCst)).await;
        assert!(matches!(late, Setup::Late), "{late:?}");
        drop(held);
        // Begun well within its deadline, the step goes on until after it (holding the
        // process's setup thread that long: kept short).
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        let (began_tx, began_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let step = tokio::spawn(on_setup_thread_by(deadline, move || {
            let _ = began_tx.send(());
            let _ = go_rx.recv();
            7
        }));
        began_rx.await.expect("the step began");
        tokio::time::sleep_until(deadline + Duration::from_millis(50)).await;
        go_tx.send(()).unwrap();
        assert!(matches!(step.await.unwrap(), Setup::Done(7)), "a step that began was given up");
        assert!(!ran.load(Ordering::SeqCst), "a step whose turn came too late was run");
    }
}
