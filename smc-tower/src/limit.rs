use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use smc_tokio::Policy;
use tokio::sync::Semaphore;
use tower_layer::Layer;
use tower_service::Service;

use crate::policy::SetPolicy;

/// Bounds the SMC handshakes a connector stack runs at once. Its overflow means "go TCP now":
/// a connect that finds every slot taken is made with [`Policy::TcpOnly`] (no proposal, no
/// wait), unless the layer was built with [`wait`](HandshakeLimitLayer::wait), in which case it
/// waits for a slot, as `tower::limit::ConcurrencyLimit` does, on the same kind of semaphore.
/// A stack whose policy is [`Policy::Never`] (no TCP, ever) always waits, as far as the stack
/// tells it ([`SetPolicy::current_policy`]: `SmcConnector` and this crate's layers do; a
/// connector of its own that does not is taken to allow TCP).
///
/// On a server, the listener's own bound does this job: `SmcListener::builder()
/// .max_pending_handshakes(n).limit_handshake(true)`.
///
/// ```
/// use smc_tower::{HandshakeLimitLayer, SmcConnector};
/// use tower_layer::Layer;
///
/// let connector = HandshakeLimitLayer::new(16).layer(SmcConnector::new());
/// # let _ = connector;
/// ```
#[derive(Debug, Clone)]
pub struct HandshakeLimitLayer {
    max: usize,
    wait: bool,
}

impl HandshakeLimitLayer {
    /// At most `max` handshakes at once; beyond, connect as TCP.
    ///
    /// # Examples
    ///
    /// Two connects at once and one slot: the one that finds it taken goes TCP at once.
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, SmcListener, Transport};
    /// use smc_tower::{HandshakeLimitLayer, SmcConnector};
    /// use tower::ServiceExt;
    /// use tower_layer::Layer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let limited = HandshakeLimitLayer::new(1).layer(SmcConnector::new());
    /// let (a, b) = tokio::try_join!(limited.clone().oneshot(addr), limited.clone().oneshot(addr))?;
    /// let tcp = Transport::Tcp(FallbackReason::Disabled);
    /// assert!(a.transport().is_smc() != b.transport().is_smc());
    /// assert!(a.transport() == tcp || b.transport() == tcp);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(max: usize) -> Self {
        HandshakeLimitLayer { max: max.max(1), wait: false }
    }

    /// Wait for a slot instead of going TCP.
    ///
    /// # Examples
    ///
    /// Two connects at once and one slot: the second waits for the first, and both get SMC.
    ///
    /// ```
    /// use smc_tokio::SmcListener;
    /// use smc_tower::{HandshakeLimitLayer, SmcConnector};
    /// use tower::ServiceExt;
    /// use tower_layer::Layer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let addr = listener.local_addr()?;
    /// let limited = HandshakeLimitLayer::new(1).wait().layer(SmcConnector::new());
    /// let (a, b) = tokio::try_join!(limited.clone().oneshot(addr), limited.clone().oneshot(addr))?;
    /// assert!(a.transport().is_smc() && b.transport().is_smc());
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait(mut self) -> Self {
        self.wait = true;
        self
    }
}

impl<S: SetPolicy + Clone> Layer<S> for HandshakeLimitLayer {
    type Service = HandshakeLimit<S>;

    fn layer(&self, inner: S) -> HandshakeLimit<S> {
        let mut tcp = inner.clone();
        tcp.set_policy(Policy::TcpOnly);
        HandshakeLimit { inner, tcp, slots: Arc::new(Semaphore::new(self.max)), wait: self.wait }
    }
}

/// The service of [`HandshakeLimitLayer`].
#[derive(Debug, Clone)]
pub struct HandshakeLimit<S> {
    inner: S,
    /// The same stack with SMC off, for the overflow.
    tcp: S,
    slots: Arc<Semaphore>,
    wait: bool,
}

impl<S> HandshakeLimit<S> {
    /// Handshake slots free now.
    ///
    /// # Examples
    ///
    /// A connect holds its slot from the call until it is done.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use smc_tokio::SmcListener;
    /// use smc_tower::{HandshakeLimitLayer, SmcConnector};
    /// use tower::{Service, ServiceExt};
    /// use tower_layer::Layer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let mut limited = HandshakeLimitLayer::new(4).layer(SmcConnector::new());
    /// assert_eq!(limited.available(), 4);
    /// let connect = ServiceExt::<SocketAddr>::ready(&mut limited).await?.call(listener.local_addr()?);
    /// assert_eq!(limited.available(), 3);
    /// assert!(connect.await?.transport().is_smc());
    /// assert_eq!(limited.available(), 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

impl<S: SetPolicy> SetPolicy for HandshakeLimit<S> {
    fn set_policy(&mut self, policy: Policy) {
        self.inner.set_policy(policy);
    }

    fn current_policy(&self) -> Option<Policy> {
        self.inner.current_policy()
    }
}

impl<S, T> Service<T> for HandshakeLimit<S>
where
    S: Service<T> + SetPolicy + Clone + Send + 'static,
    S::Future: Send + 'static,
    T: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: T) -> Self::Future {
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let r = fut.await;
                    drop(permit);
                    r
                })
            }
            // Under `Never` the overflow may not go to TCP either: it waits.
            Err(_) if self.wait || self.inner.current_policy() == Some(Policy::Never) => {
                let slots = self.slots.clone();
                let mut inner = self.inner.clone();
                Box::pin(async move {
                    // The semaphore is never closed, so acquiring only waits.
                    let permit = slots.acquire_owned().await;
                    // A clone is called only once ready, as tower's contract asks.
                    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                    let r = inner.call(req).await;
                    drop(permit);
                    r
                })
            }
            Err(_) => {
                let mut tcp = self.tcp.clone();
                Box::pin(async move {
                    std::future::poll_fn(|cx| tcp.poll_ready(cx)).await?;
                    tcp.call(req).await
                })
            }
        }
    }
}
