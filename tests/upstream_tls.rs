//! Providers over HTTPS, as real ones are: `switchyard serve` (the binary,
//! so that it trusts this test's certificate authority through
//! `SSL_CERT_FILE` without touching the test process's environment) in
//! front of a provider that offers HTTP/2 and limits each connection to two
//! concurrent streams, as providers' front ends do (commonly 100 to 256).
//! Requests to one provider must never queue behind that limit: an LLM
//! stream lasts minutes, and a request waiting for a stream slot would wait
//! for another caller's answer to end.

#![cfg(target_os = "linux")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
const KEY: &str = "sk-test-acme";
const TLS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls");

/// The provider's per-connection stream limit, and how many requests the
/// test sends at once: one more than the limit.
const STREAM_LIMIT: u32 = 2;
const CONCURRENT: usize = STREAM_LIMIT as usize + 1;

/// How long the provider holds each request waiting for the others.
const GATHER: Duration = Duration::from_secs(5);

/// A provider on `https://localhost:PORT` that answers a request only once
/// `CONCURRENT` requests are in flight together (or `GATHER` has passed,
/// with a 503), and records the protocol each connection negotiated.
struct Provider {
    port: u16,
    protocols: Arc<Mutex<Vec<String>>>,
}

async fn start_provider() -> Provider {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(Path::new(TLS_DIR).join("leaf.pem"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_file(Path::new(TLS_DIR).join("leaf.key")).unwrap();
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let protocols = Arc::new(Mutex::new(Vec::new()));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let gathered = Arc::new(Notify::new());
    let recorded = protocols.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let (protocols, in_flight, gathered) =
                (recorded.clone(), in_flight.clone(), gathered.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(socket).await else {
                    return;
                };
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                protocols
                    .lock()
                    .unwrap()
                    .push(String::from(if h2 { "h2" } else { "http/1.1" }));
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (in_flight, gathered) = (in_flight.clone(), gathered.clone());
                    async move {
                        drop(request);
                        Ok::<_, hyper::Error>(answer_when_gathered(&in_flight, &gathered).await)
                    }
                });
                let io = TokioIo::new(tls);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .max_concurrent_streams(STREAM_LIMIT)
                        .serve_connection(io, service)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                }
            });
        }
    });
    Provider { port, protocols }
}

/// 200 once `CONCURRENT` requests are here together; 503 if `GATHER`
/// passes first.
async fn answer_when_gathered(in_flight: &AtomicUsize, gathered: &Notify) -> Response<Full<Bytes>> {
    let arrived = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let together = if arrived >= CONCURRENT {
        gathered.notify_waiters();
        true
    } else {
        tokio::time::timeout(GATHER, gathered.notified())
            .await
            .is_ok()
    };
    in_flight.fetch_sub(1, Ordering::SeqCst);
    let (status, body) = if together {
        (
            200,
            json!({
                "id": "chatcmpl-tls",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "together"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }),
        )
    } else {
        (
            503,
            json!({"error": {"message": format!("only {arrived} of {CONCURRENT} requests arrived together"),
                             "type": "server_error"}}),
        )
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn write_policy(dir: &Path, provider_port: u16) -> PathBuf {
    let policy = dir.join("tls.policy");
    std::fs::write(
        &policy,
        r#"policy tlstest {
  catalog "catalog.yaml"
  tenants "tenants.yaml"
}

models {
  credentials each else no_route
  unknown error unknown_model
}

failover {
  attempts 1
  on any => stop, error upstream_failed
}

errors {
  no_route = 503, "no provider can serve this model"
  unknown_model = 404, "there is no such model"
  upstream_failed = 502, "the provider failed"
}
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("catalog.yaml"),
        format!(
            "providers:\n  - id: tls\n    format: openai\n    base_url: https://localhost:{provider_port}/v1\n    \
             credentials:\n      - {{id: tls-key, key: \"${{TLS_KEY}}\"}}\n\
             models:\n  - id: m\n    kind: chat\n    routes:\n      - {{provider: tls}}\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("tenants.yaml"), common::one_key_tenants(KEY)).unwrap();
    policy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_to_one_provider_never_queue_behind_its_stream_limit() {
    // The test's own client is reqwest without a crypto provider of its own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let provider = start_provider().await;
    let dir = common::unique_dir("tls");
    let policy = write_policy(&dir, provider.port);
    let listen = format!("127.0.0.1:{}", common::closed_port());
    let served = common::Spawned(
        Command::new(BIN)
            .args(["serve", "--no-watch", "--policy"])
            .arg(&policy)
            .args(["--listen", &listen])
            .env("SSL_CERT_FILE", Path::new(TLS_DIR).join("ca.pem"))
            .env_remove("SSL_CERT_DIR")
            .env("TLS_KEY", "upstream-secret")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let base = format!("http://{listen}");
    common::wait_until_listening(&listen);

    let requests: Vec<_> = (0..CONCURRENT)
        .map(|_| {
            let request = client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(KEY)
                .header("content-type", "application/json")
                .body(
                    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                        .to_string(),
                );
            tokio::spawn(async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                (status, response.text().await.unwrap())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.unwrap());
    }
    let protocols = provider.protocols.lock().unwrap().clone();
    for (status, text) in &answers {
        assert_eq!(
            *status, 200,
            "{text}\nevery answer: {answers:?}\nconnections the provider saw: {protocols:?}"
        );
    }
    drop(served);
}
