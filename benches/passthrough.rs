//! The load run's baseline (benches/load.sh): a bare pass-through proxy on
//! the stack Switchyard is built on — a hyper 1 server, reqwest upstream
//! over pooled keep-alive connections — that forwards every request to one
//! upstream base URL unchanged and streams the answer back. What Switchyard
//! costs beyond it is its own work: authentication, the decision, health and
//! capacity state, metrics and the log line.
//!
//!     cargo run --release --example passthrough -- 127.0.0.1:9201 http://127.0.0.1:9100/aki-io

use bytes::Bytes;
use futures_util::TryStreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, std::io::Error>;

fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response
}

async fn forward(
    client: reqwest::Client,
    upstream: Arc<str>,
    request: Request<Incoming>,
) -> Response<Body> {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str());
    let url = format!("{upstream}{path}");
    let method = request.method().clone();
    let content_type = request.headers().get(CONTENT_TYPE).cloned();
    let Ok(body) = request.into_body().collect().await else {
        return empty(StatusCode::BAD_REQUEST);
    };
    let mut outgoing = client.request(method, url).body(body.to_bytes());
    if let Some(content_type) = content_type {
        outgoing = outgoing.header(CONTENT_TYPE, content_type);
    }
    let Ok(answer) = outgoing.send().await else {
        return empty(StatusCode::BAD_GATEWAY);
    };
    let status = answer.status();
    let content_type = answer.headers().get(CONTENT_TYPE).cloned();
    let stream = answer
        .bytes_stream()
        .map_ok(Frame::data)
        .map_err(std::io::Error::other);
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response.headers_mut().insert(CONTENT_TYPE, content_type);
    }
    response
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, upstream] = args.as_slice() else {
        eprintln!("usage: passthrough LISTEN_ADDR UPSTREAM_BASE_URL");
        return ExitCode::from(2);
    };
    let listener = match TcpListener::bind(listen.as_str()).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {listen}: {error}");
            return ExitCode::from(2);
        }
    };
    // As the proxy does: TLS through rustls with ring (the crate's choice).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            eprintln!("error: cannot build the HTTP client: {error}");
            return ExitCode::from(2);
        }
    };
    let upstream: Arc<str> = Arc::from(upstream.trim_end_matches('/'));
    eprintln!("passthrough: {listen} -> {upstream}");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // As Switchyard does: a stream's small writes go out at once.
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let answer = forward(client.clone(), upstream.clone(), request);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new());
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
