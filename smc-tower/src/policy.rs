use std::task::{Context, Poll};

use smc_tokio::Policy;
use tower_layer::Layer;
use tower_service::Service;

/// A connector whose fallback policy can be set: [`SmcConnector`](crate::SmcConnector) and the
/// layers of this crate around it, so they stack in any order.
pub trait SetPolicy {
    /// Sets the policy for the connections this connector opens from now on.
    fn set_policy(&mut self, policy: Policy);

    /// The policy the connections it opens now get, where it knows it: layers ask, for
    /// instance, whether TCP is allowed at all ([`Policy::Never`]).
    fn current_policy(&self) -> Option<Policy> {
        None
    }
}

/// Applies a fallback [`Policy`] to every connection of the connector stack below it:
/// `Auto` (fall back to TCP), `Never` (fail instead: tests and benchmarks), `TcpOnly`.
///
/// ```
/// use smc_tower::{FallbackPolicyLayer, SmcConnector};
/// use smc_tokio::Policy;
/// use tower_layer::Layer;
///
/// let strict = FallbackPolicyLayer::new(Policy::Never).layer(SmcConnector::new());
/// # let _ = strict;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct FallbackPolicyLayer {
    policy: Policy,
}

impl FallbackPolicyLayer {
    /// A layer applying `policy`.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{FallbackReason, Policy, SmcListener, Transport};
    /// use smc_tower::{FallbackPolicyLayer, SmcConnector};
    /// use tower::ServiceExt;
    /// use tower_layer::Layer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let tcp_only = FallbackPolicyLayer::new(Policy::TcpOnly).layer(SmcConnector::new());
    /// let stream = tcp_only.oneshot(listener.local_addr()?).await?;
    /// assert_eq!(stream.transport(), Transport::Tcp(FallbackReason::Disabled));
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(policy: Policy) -> Self {
        FallbackPolicyLayer { policy }
    }
}

impl<S: SetPolicy> Layer<S> for FallbackPolicyLayer {
    type Service = FallbackPolicy<S>;

    fn layer(&self, mut inner: S) -> FallbackPolicy<S> {
        inner.set_policy(self.policy);
        FallbackPolicy { inner }
    }
}

/// The service of [`FallbackPolicyLayer`].
#[derive(Debug, Clone)]
pub struct FallbackPolicy<S> {
    inner: S,
}

impl<S: SetPolicy> SetPolicy for FallbackPolicy<S> {
    fn set_policy(&mut self, policy: Policy) {
        self.inner.set_policy(policy);
    }

    fn current_policy(&self) -> Option<Policy> {
        self.inner.current_policy()
    }
}

impl<S: Service<T>, T> Service<T> for FallbackPolicy<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: T) -> S::Future {
        self.inner.call(req)
    }
}
