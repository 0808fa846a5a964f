//! [`tower::discover::Discover`] over a discovery source (the `tower` feature).
//!
//! [`EndpointDiscover`] runs the same refresh loop as [`DiscoveryTasks`](crate::DiscoveryTasks)
//! (so `fail_open`, `min_endpoints`, TTL-driven timing and push sources behave the
//! same) and turns every change of the published endpoint set into
//! [`Change::Remove`] / [`Change::Insert`] per endpoint, keyed by its socket
//! address, for `tower::balance` and anything else that consumes a `Discover`.
//! A service is made for each inserted endpoint by the caller's `make_service`.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use dwara_lb::{Endpoint, UpstreamLb};
use futures_core::Stream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tower::discover::Change;
use tracing::{Instrument, debug, info_span};

use crate::UpstreamDiscovery;
use crate::refresh;

/// One step of the endpoint set as the watcher task sees it.
#[derive(Debug)]
enum Step {
    Insert(Endpoint),
    Remove(SocketAddr),
}

/// A [`Discover`](tower::discover::Discover) of one upstream's endpoints.
///
/// Built inside a tokio runtime; dropping it stops its refresh loop. The stream never
/// ends and never fails: resolution failures are handled by the refresh policy
/// (`fail_open` keeps the endpoints, otherwise they are all removed).
///
/// ```no_run
/// # async fn demo(up: dwara_discovery::UpstreamDiscovery) {
/// use dwara_discovery::tower::EndpointDiscover;
///
/// // One service per endpoint; here just its address, a real caller connects.
/// let discover = EndpointDiscover::spawn(up, |endpoint| endpoint.addr);
/// # drop(discover);
/// # }
/// ```
pub struct EndpointDiscover<M> {
    steps: mpsc::UnboundedReceiver<Step>,
    make_service: M,
    lb: Arc<UpstreamLb>,
    /// The refresh loop and the watcher; dropping the set aborts both.
    _tasks: JoinSet<()>,
}

impl<M> std::fmt::Debug for EndpointDiscover<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointDiscover")
            .field("endpoints", &self.lb.endpoints().len())
            .finish_non_exhaustive()
    }
}

impl<M, S> EndpointDiscover<M>
where
    M: FnMut(&Endpoint) -> S,
{
    /// Starts `discovery`'s refresh loop (publishing into `discovery.lb` as usual)
    /// and a watcher that reports each change of the set. Endpoints already in the
    /// load balancer are reported as inserted first. Must be called inside a tokio
    /// runtime.
    pub fn spawn(discovery: UpstreamDiscovery, make_service: M) -> Self {
        let (tx, steps) = mpsc::unbounded_channel();
        let mut tasks = JoinSet::new();
        // Subscribed before the loop starts, so its first change is not missed.
        let changes = discovery.stats.subscribe_changes();
        let span = info_span!("discovery", upstream = %discovery.name, consumer = "tower");
        tasks.spawn(watch_set(discovery.lb.clone(), changes, tx).instrument(span.clone()));
        tasks.spawn(
            refresh::run(
                discovery.name.clone(),
                discovery.source.clone(),
                discovery.lb.clone(),
                discovery.policy.clone(),
                discovery.stats.clone(),
            )
            .instrument(span),
        );
        Self {
            steps,
            make_service,
            lb: discovery.lb,
            _tasks: tasks,
        }
    }
}

/// Sends the difference between the set last reported and the load balancer's
/// current set after every change the refresh loop publishes.
async fn watch_set(
    lb: Arc<UpstreamLb>,
    mut changes: watch::Receiver<u64>,
    tx: mpsc::UnboundedSender<Step>,
) {
    let mut reported: HashSet<SocketAddr> = HashSet::new();
    loop {
        changes.borrow_and_update();
        let current = lb.endpoints();
        // Removals first: a balancer never holds more services than the set has.
        let gone: Vec<SocketAddr> = reported
            .iter()
            .filter(|addr| !current.contains(**addr))
            .copied()
            .collect();
        for addr in gone {
            reported.remove(&addr);
            if tx.send(Step::Remove(addr)).is_err() {
                return;
            }
        }
        for endpoint in current.iter() {
            if reported.insert(endpoint.addr) && tx.send(Step::Insert(*endpoint)).is_err() {
                return;
            }
        }
        debug!(endpoints = reported.len(), "tower discover: set reported");
        if changes.changed().await.is_err() {
            return;
        }
    }
}

impl<M, S> Stream for EndpointDiscover<M>
where
    M: FnMut(&Endpoint) -> S + Unpin,
{
    type Item = Result<Change<SocketAddr, S>, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.steps.poll_recv(cx) {
            Poll::Ready(Some(Step::Insert(endpoint))) => {
                let service = (this.make_service)(&endpoint);
                Poll::Ready(Some(Ok(Change::Insert(endpoint.addr, service))))
            }
            Poll::Ready(Some(Step::Remove(addr))) => Poll::Ready(Some(Ok(Change::Remove(addr)))),
            // The tasks live as long as `self`: a closed channel means one of them
            // ended (a panic), and the set it would report is unknown from now on.
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
