//! Response bodies: a whole body, or a stream's events, pushed one by one by
//! the exchange that the body itself drives. Chunks go to the client as they
//! arrive; when the client goes away hyper drops the body, and the exchange
//! with it.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

pub enum ProxyBody {
    Full(Option<Bytes>),
    Stream {
        chunks: mpsc::Receiver<Bytes>,
        /// The exchange that sends the chunks, polled with the body until
        /// it ends.
        exchange: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    },
}

impl ProxyBody {
    pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
        ProxyBody::Full(Some(bytes.into()))
    }

    pub fn empty() -> ProxyBody {
        ProxyBody::Full(None)
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ProxyBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Stream { chunks, exchange } => {
                if let Some(running) = exchange
                    && running.as_mut().poll(cx).is_ready()
                {
                    *exchange = None;
                }
                match chunks.poll_recv(cx) {
                    // The exchange closed the stream but still has to
                    // finish; it wakes this task when it can go on.
                    Poll::Ready(None) if exchange.is_some() => Poll::Pending,
                    polled => polled.map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes)))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ProxyBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            ProxyBody::Stream { .. } => SizeHint::default(),
        }
    }
}
