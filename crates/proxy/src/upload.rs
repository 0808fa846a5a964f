//! A request body on its way to an endpoint, watched by the request's tries.
//!
//! hyper's client connection polls the body as it writes it; [`Sending`] notes what
//! each poll found in an [`Upload`] the request's task looks at after each poll of
//! the connection (see `reverse::exchange`): whether bytes moved since it last
//! looked, whether the body ended (the response timeout starts then), and, when no
//! byte moved for the body timeout, whose side stalled: the client's (the last poll
//! of the body found nothing, 408) or the endpoint's (the connection stopped taking
//! the body, 504). A body that failed (the client went away, or sent a malformed
//! chunk) fails the try without blaming the endpoint.
//!
//! Only requests with a body have one: a request without one costs nothing here.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// What the polls of a request body found, as far as the last one.
#[derive(Debug, Default)]
pub(crate) struct Upload {
    /// Frames passed on so far.
    frames: AtomicU64,
    /// One of the `WAITING`…`FAILED` states.
    state: AtomicU8,
}

/// Its last poll passed a frame on, or it was not polled yet.
const MOVING: u8 = 0;
/// Its last poll found nothing: it waits for the client.
const WAITING: u8 = 1;
/// It has ended: it was sent whole.
const ENDED: u8 = 2;
/// It failed: the client's connection or stream failed while sending it.
const FAILED: u8 = 3;

/// Where a request body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stand {
    /// Still being sent; the last poll passed a frame on (or none was made yet):
    /// what holds it up now is the endpoint's connection.
    Moving,
    /// Still being sent; the last poll found nothing: it waits for the client.
    Waiting,
    /// Sent whole.
    Ended,
    /// The client's side failed while it was being sent.
    Failed,
}

impl Upload {
    /// Frames passed on so far: a change means bytes moved.
    pub(crate) fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }

    pub(crate) fn stand(&self) -> Stand {
        match self.state.load(Ordering::Relaxed) {
            MOVING => Stand::Moving,
            WAITING => Stand::Waiting,
            ENDED => Stand::Ended,
            _ => Stand::Failed,
        }
    }

    fn set(&self, state: u8) {
        self.state.store(state, Ordering::Relaxed);
    }
}

/// A client's request body as it goes to an endpoint, noting its progress in an
/// [`Upload`].
#[derive(Debug)]
pub(crate) struct Sending {
    inner: Incoming,
    upload: Arc<Upload>,
}

impl Sending {
    /// `inner`, watched through the [`Upload`] returned beside it.
    pub(crate) fn new(inner: Incoming) -> (Self, Arc<Upload>) {
        let upload = Arc::new(Upload::default());
        let body = Self {
            inner,
            upload: upload.clone(),
        };
        (body, upload)
    }
}

impl Body for Sending {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let up = &self.upload;
        match &polled {
            Poll::Pending => up.set(WAITING),
            Poll::Ready(Some(Ok(frame))) => {
                up.frames.fetch_add(1, Ordering::Relaxed);
                // Trailers are a body's last frame: hyper polls no further after
                // them, so no `None` would come to say it ended.
                let ended = frame.is_trailers() || self.inner.is_end_stream();
                up.set(if ended { ENDED } else { MOVING });
            }
            Poll::Ready(None) => up.set(ENDED),
            Poll::Ready(Some(Err(_))) => up.set(FAILED),
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
