//! The engine's task: waits on database changes, chitchat's key and liveness
//! events, the pacer and a backstop tick, and logs the periodic summaries.

use std::sync::Arc;
use std::time::Duration;

use chitchat::{ChitchatId, ListenerHandle};
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;

use super::Engine;
use crate::datagram::Rejection;

impl Engine {
    pub(super) async fn run(
        mut self,
        notify: Arc<Notify>,
        mut live_rx: tokio::sync::watch::Receiver<
            std::collections::BTreeMap<ChitchatId, chitchat::NodeState>,
        >,
        listeners: Vec<ListenerHandle>,
        cancel: CancellationToken,
        backstop: Duration,
    ) {
        self.resync_own().await;
        self.sync().await;
        let mut tick = tokio::time::interval(backstop);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut summary = tokio::time::interval(crate::invalid::SUMMARY_EVERY);
        summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut invalid_seen = crate::invalid::invalid_datagrams();
        let mut suppressed_seen = crate::invalid::suppressed_warnings();
        let mut rejected_seen = self.rejected_datagrams();
        loop {
            let owed = self.pacer.next_due();
            let flush = self.flush_due;
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                () = sleep_until_owed(flush), if flush.is_some() => self.flush_own().await,
                () = sleep_until_owed(owed), if owed.is_some() => self.send_owed(),
                r = self.changes.recv() => match r {
                    Ok(change) => self.publish(change).await,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "records db changes lagged; resynchronising from the database");
                        self.shared.metrics.resyncs.inc();
                        self.resync_own().await;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                () = notify.notified() => self.sync().await,
                r = live_rx.changed() => match r {
                    Ok(()) => self.sync().await,
                    Err(_) => break,
                },
                _ = tick.tick() => self.sync().await,
                _ = summary.tick() => {
                    let total = crate::invalid::invalid_datagrams();
                    if total > invalid_seen {
                        tracing::warn!(
                            dropped = total - invalid_seen,
                            total,
                            every_s = crate::invalid::SUMMARY_EVERY.as_secs(),
                            "datagrams on the gossip port that are not chitchat messages dropped (garbage, or another protocol)"
                        );
                        invalid_seen = total;
                    }
                    let suppressed = crate::invalid::suppressed_warnings();
                    if suppressed > suppressed_seen {
                        tracing::warn!(
                            suppressed = suppressed - suppressed_seen,
                            total = suppressed,
                            limit = crate::invalid::WARNINGS_PER_WINDOW,
                            every_s = crate::invalid::SUMMARY_EVERY.as_secs(),
                            "chitchat warnings beyond the limit left out of the log (a misconfigured or hostile peer: see the ones logged)"
                        );
                        suppressed_seen = suppressed;
                    }
                    let rejected = self.rejected_datagrams();
                    if rejected != rejected_seen {
                        let by_reason: Vec<(&str, u64)> = rejected
                            .iter()
                            .zip(&rejected_seen)
                            .zip(Rejection::ALL)
                            .filter(|((now, before), _)| now > before)
                            .map(|((now, before), why)| (why.reason(), now - before))
                            .collect();
                        tracing::warn!(
                            rejected = ?by_reason,
                            every_s = crate::invalid::SUMMARY_EVERY.as_secs(),
                            "gossip datagrams rejected (no key of this node's keyring opens them, replays, or not sealed gossip)"
                        );
                        rejected_seen = rejected;
                    }
                }
            }
        }
        drop(listeners);
        if let Err(err) = self.handle.shutdown().await {
            tracing::warn!(error = %err, "chitchat shutdown failed");
        }
        tracing::info!(node_id = %self.shared.node_id, "cluster gossip stopped");
    }

    /// Rejected datagrams so far, in the order of [`Rejection::ALL`].
    pub(super) fn rejected_datagrams(&self) -> Vec<u64> {
        let seal = self.shared.seal.as_ref();
        Rejection::ALL
            .iter()
            .map(|why| seal.map_or(0, |s| s.rejected(*why)))
            .collect()
    }
}

/// Sleeps until `at` (the select guard keeps `None` from being polled).
async fn sleep_until_owed(at: Option<tokio::time::Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}
