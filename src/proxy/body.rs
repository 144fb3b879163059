//! Response bodies: a whole body, or a stream's events, pushed one by one by
//! the exchange that the body itself drives. Chunks go to the client as they
//! arrive; when the client goes away hyper drops the body, and the exchange
//! with it.

use crate::sync::lock;
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

pub enum ProxyBody {
    Full(Option<Bytes>),
    Stream {
        chunks: ChunkReceiver,
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
            ProxyBody::Stream { chunks, exchange } => loop {
                if let Some(bytes) = chunks.next() {
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                // The stream ends when its exchange has, all its chunks sent.
                let Some(running) = exchange else {
                    return Poll::Ready(None);
                };
                if running.as_mut().poll(cx).is_ready() {
                    *exchange = None;
                } else if chunks.is_empty() {
                    // It waits for the provider or a timer, which wake
                    // this task.
                    return Poll::Pending;
                }
            },
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

/// Most chunks waiting in a stream's queue; past this the exchange waits
/// until the client has taken some.
const QUEUE_LIMIT: usize = 16;

/// A stream's queue, from its exchange to the body that polls the exchange.
/// Both live in one task, and the exchange fills the queue only while the
/// body polls it, so no waker passes between them: a channel would wake the
/// task from inside its own poll, and tokio answers that by rescheduling the
/// task and waking an idle worker to take it, a futex call and a core's
/// wake-up per request.
#[derive(Default)]
struct Queue {
    chunks: VecDeque<Bytes>,
    body_gone: bool,
}

/// The exchange's end of a stream's queue.
pub struct ChunkSender(Arc<Mutex<Queue>>);

/// The body's end of a stream's queue.
pub struct ChunkReceiver(Arc<Mutex<Queue>>);

pub fn chunk_queue() -> (ChunkSender, ChunkReceiver) {
    let queue = Arc::new(Mutex::new(Queue::default()));
    (ChunkSender(queue.clone()), ChunkReceiver(queue))
}

impl ChunkSender {
    /// Queues `bytes`; false once the body is gone. While the queue is full
    /// this waits without a waker: the body polls the exchange again as
    /// soon as it has passed the queued chunks on.
    pub async fn send(&self, bytes: Bytes) -> bool {
        let mut bytes = Some(bytes);
        std::future::poll_fn(|_| {
            let mut queue = lock(&self.0);
            if queue.body_gone {
                return Poll::Ready(false);
            }
            if queue.chunks.len() >= QUEUE_LIMIT {
                return Poll::Pending;
            }
            if let Some(bytes) = bytes.take() {
                queue.chunks.push_back(bytes);
            }
            Poll::Ready(true)
        })
        .await
    }
}

impl ChunkReceiver {
    fn next(&self) -> Option<Bytes> {
        lock(&self.0).chunks.pop_front()
    }

    fn is_empty(&self) -> bool {
        lock(&self.0).chunks.is_empty()
    }
}

impl Drop for ChunkReceiver {
    fn drop(&mut self) {
        lock(&self.0).body_gone = true;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Polls `body` to its end with a waker that never wakes: a `Pending`
    /// here would hang a real stream.
    fn frames(mut body: ProxyBody) -> Vec<Bytes> {
        let mut context = Context::from_waker(std::task::Waker::noop());
        let mut frames = Vec::new();
        loop {
            match Pin::new(&mut body).poll_frame(&mut context) {
                Poll::Ready(Some(frame)) => frames.push(frame.unwrap().into_data().unwrap()),
                Poll::Ready(None) => return frames,
                Poll::Pending => panic!("pending after {} frames", frames.len()),
            }
        }
    }

    #[test]
    fn an_exchange_waiting_for_room_is_taken_up_again_as_the_body_is_read() {
        let (sender, receiver) = chunk_queue();
        let exchange = async move {
            for n in 0..QUEUE_LIMIT * 5 {
                assert!(sender.send(Bytes::from(n.to_string())).await);
            }
        };
        let body = ProxyBody::Stream {
            chunks: receiver,
            exchange: Some(Box::pin(exchange)),
        };
        let expected: Vec<Bytes> = (0..QUEUE_LIMIT * 5)
            .map(|n| Bytes::from(n.to_string()))
            .collect();
        assert_eq!(frames(body), expected);
    }

    #[test]
    fn a_sender_learns_that_the_body_is_gone() {
        let (sender, receiver) = chunk_queue();
        drop(receiver);
        let mut context = Context::from_waker(std::task::Waker::noop());
        let mut sending = Box::pin(sender.send(Bytes::from_static(b"late")));
        assert_eq!(sending.as_mut().poll(&mut context), Poll::Ready(false));
    }
}
