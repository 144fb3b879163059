//! Response bodies: whole, or fed frame by frame through a channel so each
//! stream event reaches the client as soon as it is produced.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, SizeHint};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::{mpsc, watch};

/// A frame of a channel body: data, or an error that makes the server drop
/// the connection mid-body (the client sees the body end early).
type Piece = Result<Bytes, io::Error>;

/// Frames buffered between the producer and the connection; small, so a
/// slow client slows the producer down.
const CHANNEL_FRAMES: usize = 8;

#[derive(Debug)]
pub enum SimBody {
    /// Sent with a `Content-Length`.
    Whole(Option<Bytes>),
    /// Sent chunked, a frame per message; ends when the [`Feed`] is dropped.
    Channel(ChannelBody),
}

#[derive(Debug)]
pub struct ChannelBody {
    receiver: mpsc::Receiver<Piece>,
    /// Frames handed to the connection so far.
    taken: u64,
    /// Set to `taken` whenever the connection finds no frame waiting: it
    /// then writes out everything it holds before asking again.
    idle: watch::Sender<u64>,
}

/// The producing end of a channel body.
#[derive(Debug)]
pub struct Feed {
    sender: mpsc::Sender<Piece>,
    sent: u64,
    idle: watch::Receiver<u64>,
}

/// The connection is gone: the client left or the server stopped.
#[derive(Debug)]
pub struct Gone;

impl Feed {
    pub async fn send(&mut self, bytes: impl Into<Bytes>) -> Result<(), Gone> {
        self.sender.send(Ok(bytes.into())).await.map_err(|_| Gone)?;
        self.sent += 1;
        Ok(())
    }

    /// Waits until the connection has taken every frame sent and found the
    /// channel empty, so those frames are written before anything that
    /// follows (an error frame would otherwise drop them unwritten).
    pub async fn written(&mut self) -> Result<(), Gone> {
        let sent = self.sent;
        self.idle
            .wait_for(|taken| *taken >= sent)
            .await
            .map(|_| ())
            .map_err(|_| Gone)
    }

    /// Ends the body with an error once what was sent is written: the
    /// connection is dropped without the body's proper end.
    pub async fn cut(mut self) {
        if self.written().await.is_ok() {
            let cut = io::Error::new(io::ErrorKind::ConnectionAborted, "cut by the scenario");
            let _ = self.sender.send(Err(cut)).await;
        }
    }

    /// Ends the body with an error at once, whatever is still unwritten.
    pub async fn abort(self) {
        let abort = io::Error::new(io::ErrorKind::ConnectionAborted, "the sim stops");
        let _ = self.sender.send(Err(abort)).await;
    }

    /// Resolves when the connection is gone.
    pub async fn closed(&self) {
        self.sender.closed().await;
    }
}

impl SimBody {
    pub fn whole(bytes: impl Into<Bytes>) -> SimBody {
        SimBody::Whole(Some(bytes.into()))
    }

    pub fn empty() -> SimBody {
        SimBody::Whole(None)
    }

    pub fn channel() -> (Feed, SimBody) {
        let (sender, receiver) = mpsc::channel(CHANNEL_FRAMES);
        let (idle, idle_receiver) = watch::channel(0);
        let feed = Feed {
            sender,
            sent: 0,
            idle: idle_receiver,
        };
        let body = ChannelBody {
            receiver,
            taken: 0,
            idle,
        };
        (feed, SimBody::Channel(body))
    }
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            SimBody::Whole(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            SimBody::Channel(channel) => match channel.receiver.poll_recv(context) {
                Poll::Ready(piece) => {
                    channel.taken += 1;
                    Poll::Ready(piece.map(|piece| piece.map(Frame::data)))
                }
                Poll::Pending => {
                    channel.idle.send_replace(channel.taken);
                    Poll::Pending
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SimBody::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Whole(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |bytes| bytes.len() as u64))
            }
            SimBody::Channel(_) => SizeHint::default(),
        }
    }
}

/// Reads a request body up to `limit` bytes: `Ok(None)` when it is larger,
/// `Err` when the client went away mid-body.
pub async fn read_limited(
    body: hyper::body::Incoming,
    limit: usize,
) -> Result<Option<Bytes>, hyper::Error> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(Some(collected.to_bytes())),
        Err(error) => match error.downcast::<hyper::Error>() {
            Ok(error) => Err(*error),
            Err(_) => Ok(None),
        },
    }
}
