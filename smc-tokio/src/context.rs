//! The context: the one handle that owns what connections share.
//!
//! A [`Context`] owns the link groups (shared memory and RDMA, by peer), the settings that
//! builders fill in from, the client's negative cache, the counters [`Context::stats`]
//! reports, the client handshake limit and the RMB memory budget. Connections and listeners
//! made through it share those and nothing else: two contexts in one process set up separate
//! link groups to the same peer, count separately and cap their memory separately.
//!
//! The drop-in constructors ([`SmcStream::connect`](crate::SmcStream::connect),
//! [`SmcListener::bind`](crate::SmcListener::bind), [`stats`](crate::stats()),
//! [`config::global`]) use the default context, [`Context::global`], whose settings are read
//! from the `SMC_TOKIO_*` environment at first use.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};

use crate::config::{self, GlobalSettings, RmbBudget, Settings};
use crate::door::ClientDoors;
use crate::negative_cache::NegativeCache;
use crate::smc::manager::Manager;
use crate::stats::{Counters, Stats};

/// What connections share: link groups, settings, negative cache, counters and limits.
///
/// Cheap to clone (a reference count; none for the default context); every clone is the same
/// context. Give one to builders with
/// [`SmcStreamBuilder::context`](crate::SmcStreamBuilder::context) and
/// [`SmcListenerBuilder::context`](crate::SmcListenerBuilder::context); without, they use
/// [`Context::global`].
///
/// # Examples
///
/// ```
/// use smc_tokio::{Context, SmcListener, SmcStream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let ctx = Context::new();
/// let listener = SmcListener::builder().context(&ctx).bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// let accept = tokio::spawn(async move { listener.accept().await });
/// let stream = SmcStream::builder().context(&ctx).connect(addr).await?;
/// let (_served, _) = accept.await??;
/// // Counted in this context, not in the default one.
/// assert_eq!(ctx.stats().client.total(), 1);
/// assert_eq!(ctx.stats().server.total(), 1);
/// # drop(stream);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Context {
    /// `None`: the default context, whose parts live in a static. Cloning it (every builder,
    /// connector and stream holds a context, and hyper's client clones its connector for each
    /// request) then touches no reference count, so threads that clone it share no line
    /// they write.
    shared: Option<Arc<Shared>>,
}

/// Aligned past the reference counts of its `Arc`, which clones write: the fields read on every
/// operation (settings, manager) do not share a line with them.
#[repr(align(128))]
struct Shared {
    settings: Arc<GlobalSettings>,
    manager: Arc<Manager>,
    negative_cache: NegativeCache,
    /// Client handshakes running through this context (`limit_handshake` on a stream builder).
    client_handshakes: AtomicUsize,
    /// The door connections its clients keep to listeners on this host.
    doors: ClientDoors,
}

impl Context {
    /// A new context with settings from the `SMC_TOKIO_*` environment (as
    /// [`Settings::from_vars`] reads it), no link groups and zeroed counters.
    ///
    /// # Examples
    ///
    /// ```
    /// let ctx = smc_tokio::Context::new();
    /// assert_eq!(ctx.stats().link_groups, 0);
    /// assert_eq!(ctx.settings().get(), smc_tokio::config::Settings::from_vars(|k| std::env::var(k).ok()));
    /// ```
    // No `Default`: a default-constructed context would read as the default one
    // ([`Context::global`]), which a new context is not.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Context {
        Context::with_settings(Settings::from_vars(|k| std::env::var(k).ok()))
    }

    /// A new context with `settings`, no link groups and zeroed counters.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{config::Settings, Context, Policy};
    ///
    /// let mut settings = Settings::default();
    /// settings.policy = Policy::TcpOnly;
    /// let ctx = Context::with_settings(settings);
    /// assert_eq!(ctx.settings().get().policy, Policy::TcpOnly);
    /// // The default context is not touched.
    /// assert_eq!(Context::global().settings().get().policy, smc_tokio::config::global().get().policy);
    /// ```
    pub fn with_settings(settings: Settings) -> Context {
        let counters = Arc::new(Counters::default());
        Context::from_parts(Arc::new(GlobalSettings::new(settings)), counters, Arc::new(RmbBudget::new()))
    }

    fn from_parts(settings: Arc<GlobalSettings>, counters: Arc<Counters>, budget: Arc<RmbBudget>) -> Context {
        Context { shared: Some(Arc::new(Shared::new(settings, counters, budget))) }
    }

    /// What the context holds.
    fn shared(&self) -> &Shared {
        match &self.shared {
            Some(s) => s,
            None => Shared::global(),
        }
    }

    /// The default context: the one [`SmcStream::connect`](crate::SmcStream::connect),
    /// [`SmcListener::bind`](crate::SmcListener::bind) and builders without a context use.
    /// Its settings are [`config::global`], its counters [`stats`](crate::stats()), its budget
    /// [`config::set_rmb_memory_cap`].
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::Context;
    ///
    /// assert!(Context::global().ptr_eq(Context::global()));
    /// assert_eq!(Context::global().stats(), smc_tokio::stats());
    /// ```
    pub fn global() -> &'static Context {
        static G: Context = Context { shared: None };
        &G
    }

    /// The context's settings: a snapshot with [`get`](GlobalSettings::get), changed at run
    /// time with [`update`](GlobalSettings::update). Builders' explicit values win over them.
    ///
    /// # Examples
    ///
    /// ```
    /// let ctx = smc_tokio::Context::new();
    /// ctx.settings().update(|s| s.max_pending_handshakes = 64);
    /// assert_eq!(ctx.settings().get().max_pending_handshakes, 64);
    /// ```
    pub fn settings(&self) -> &GlobalSettings {
        &self.shared().settings
    }

    /// A snapshot of this context's counters.
    ///
    /// # Examples
    ///
    /// ```
    /// let ctx = smc_tokio::Context::new();
    /// assert_eq!(ctx.stats().client.total(), 0);
    /// println!("{}", ctx.stats());
    /// ```
    pub fn stats(&self) -> Stats {
        let manager = &self.shared().manager;
        manager.counters.snapshot(manager.budget())
    }

    /// Caps the RMB memory (receive rings; on SMC-R, with the send buffers registered beside
    /// them) that this context's connections may hold at once;
    /// past it, new connections stay on TCP and rings stop growing.
    ///
    /// # Examples
    ///
    /// ```
    /// let ctx = smc_tokio::Context::new();
    /// ctx.set_rmb_memory_cap(1 << 20);
    /// assert_eq!(ctx.rmb_memory_in_use(), 0);
    /// ```
    pub fn set_rmb_memory_cap(&self, bytes: u64) {
        self.shared().manager.budget().set_cap(bytes);
    }

    /// RMB memory this context's live connections hold, in bytes: shared-memory rings at
    /// their current size, and SMC-R's registered (pinned) chunks while they are registered.
    pub fn rmb_memory_in_use(&self) -> u64 {
        self.shared().manager.budget().in_use()
    }

    /// Whether `self` and `other` are the same context.
    pub fn ptr_eq(&self, other: &Context) -> bool {
        std::ptr::eq(self.shared(), other.shared())
    }

    pub(crate) fn manager(&self) -> &Arc<Manager> {
        &self.shared().manager
    }

    pub(crate) fn counters(&self) -> &Arc<Counters> {
        &self.shared().manager.counters
    }

    pub(crate) fn negative_cache(&self) -> &NegativeCache {
        &self.shared().negative_cache
    }

    pub(crate) fn client_handshakes(&self) -> &AtomicUsize {
        &self.shared().client_handshakes
    }

    /// The door connections this context's clients keep open.
    pub(crate) fn doors(&self) -> &ClientDoors {
        &self.shared().doors
    }

    /// The settings, shared (a listener's door reads them as they change).
    pub(crate) fn settings_handle(&self) -> &Arc<GlobalSettings> {
        &self.shared().settings
    }
}

impl Shared {
    fn new(settings: Arc<GlobalSettings>, counters: Arc<Counters>, budget: Arc<RmbBudget>) -> Shared {
        Shared {
            settings,
            manager: Manager::new(counters, budget),
            negative_cache: NegativeCache::default(),
            client_handshakes: AtomicUsize::new(0),
            doors: ClientDoors::default(),
        }
    }

    /// The default context's parts, made at first use.
    fn global() -> &'static Shared {
        static G: OnceLock<Shared> = OnceLock::new();
        G.get_or_init(|| {
            Shared::new(config::global_handle().clone(), Counters::process().clone(), RmbBudget::process().clone())
        })
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("global", &self.ptr_eq(Context::global()))
            .field("link_groups", &self.stats().link_groups)
            .finish_non_exhaustive()
    }
}
