//! Simulated providers: an HTTP server speaking the OpenAI and Anthropic wire
//! formats that answers, fails, stalls and breaks as a scenario file says,
//! and records every request it receives for tests to read.
//!
//! One sim hosts every provider: `/{provider}/v1/chat/completions` is
//! answered by the scenario's provider `{provider}`. The scenario format,
//! the steps and the `/_sim` endpoints are documented in docs/sim.md.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use switchyard::sim::{Scenario, start};
//! let scenario = Scenario::parse("providers: {aki-io: {sequence: [503, 200]}}", "inline")
//!     .map_err(std::io::Error::other)?;
//! let sim = start("127.0.0.1:0".parse().map_err(std::io::Error::other)?, scenario).await?;
//! let base_url = sim.base_url("aki-io"); // http://127.0.0.1:PORT/aki-io/v1
//! # let _ = base_url;
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod body;
mod record;
mod scenario;
mod server;
mod step;
mod wire;

pub use record::RecordedRequest;
pub use scenario::Scenario;

use crate::state::Clock;
use server::{Shared, Timing};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Binds `listen` (port 0 picks a free port) and serves the scenario on the
/// current tokio runtime until the handle is shut down or dropped.
pub async fn start(listen: SocketAddr, scenario: Scenario) -> std::io::Result<SimHandle> {
    start_timed(listen, scenario, None).await
}

/// [`start`], with the scenario's pauses (latency, first token, chunk
/// intervals) on `clock`: a test that moves the proxy's clock by hand then
/// also decides when the sim answers.
pub async fn start_on_clock(
    listen: SocketAddr,
    scenario: Scenario,
    clock: Arc<dyn Clock>,
) -> std::io::Result<SimHandle> {
    start_timed(listen, scenario, Some(clock)).await
}

async fn start_timed(
    listen: SocketAddr,
    scenario: Scenario,
    clock: Option<Arc<dyn Clock>>,
) -> std::io::Result<SimHandle> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared::new(scenario));
    let (stop, stopped) = watch::channel(false);
    let timing = Timing { stopped, clock };
    let server = tokio::spawn(server::serve(listener, Arc::clone(&shared), timing));
    Ok(SimHandle {
        addr,
        shared,
        stop,
        server: Some(server),
    })
}

/// A running sim. Dropping it stops the server; [`SimHandle::shutdown`]
/// also waits until it has stopped.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
}

impl SimHandle {
    /// The address the sim listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL a catalog gives for `provider`: `http://ADDR/{provider}/v1`.
    pub fn base_url(&self, provider: &str) -> String {
        format!("http://{}/{provider}/v1", self.addr)
    }

    /// The simulated providers, in scenario order.
    pub fn providers(&self) -> Vec<String> {
        self.shared.providers()
    }

    /// Every request received so far, oldest first (the latest 10,000).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests()
    }

    /// Replaces the scenario; every sequence starts from its first step.
    pub fn set_scenario(&self, scenario: Scenario) {
        self.shared.set_scenario(scenario);
    }

    /// Forgets the recorded requests and starts every sequence over.
    pub fn clear(&self) {
        self.shared.clear();
    }

    /// Stops accepting connections, ends every answer in progress (a stream
    /// is cut, an unanswered request's connection closed), closes idle
    /// connections, and waits until the server has stopped.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(server) = self.server.take() {
            // The server task only ends by returning; a join error would mean
            // the runtime is shutting down, and then there is nothing to wait for.
            let _ = server.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}
