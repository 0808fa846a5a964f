//! Process signals: shutdown (SIGTERM, ctrl-c) and reload (SIGHUP).

use tokio::signal::unix::{SignalKind, signal};

/// Completes on the first SIGTERM or SIGINT.
pub(crate) async fn shutdown() {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; ctrl-c only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
