//! What the long-running commands (`serve`, `sim`, `demo`) share: logging,
//! the runtime, and waiting for a signal to stop.

use clap::ValueEnum;
use std::io::IsTerminal;

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logs at `info` unless `RUST_LOG` says otherwise.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal());
    // A second initialisation (tests running commands in-process) keeps the first.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// Resolves on SIGINT or SIGTERM.
pub async fn stop_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// Parses a duration such as `10s` or `250ms` for a command-line option.
pub fn duration_arg(text: &str) -> Result<std::time::Duration, String> {
    crate::data::schema::parse_duration(text)
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a duration such as `10s` or `250ms`"))
}
