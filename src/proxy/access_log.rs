//! The one log line per request, as facts. The proxy hands each line to an
//! [`AccessLog`]; `serve` and `demo` install one that queues the facts for
//! their log's writer thread, which formats them there, off the request's
//! path. Without one, each line is a tracing event at once.

use super::REQUEST_LOG_TARGET;
use super::execute::Report;
use std::fmt;
use std::time::SystemTime;

/// Where the proxy sends its request lines.
pub trait AccessLog: Send + Sync {
    fn write(&self, line: RequestLine);
}

/// One request's log line.
#[derive(Debug, Clone)]
pub struct RequestLine {
    /// When the request ended.
    pub at: SystemTime,
    pub request_id: std::sync::Arc<str>,
    pub endpoint: &'static str,
    pub tenant: String,
    pub model: String,
    /// The plan (its providers in order and how many attempts it allows),
    /// or why the request was refused.
    pub decision: String,
    pub status: u16,
    /// As `switchyard_requests_total` counts it (`served`, `refused`,
    /// `unauthorized`, ...), on every line.
    pub outcome: &'static str,
    /// The code of the error the proxy answered with, if it answered one
    /// (a provider's own answer passed through is not one).
    pub error: Option<String>,
    /// What the exchange did; none for a request refused before it began.
    pub exchange: Option<ExchangeLine>,
}

impl RequestLine {
    /// The code of the error the proxy answered with; empty when none.
    pub fn error(&self) -> &str {
        self.error.as_deref().unwrap_or("")
    }
}

#[derive(Debug, Clone)]
pub struct ExchangeLine {
    pub report: Report,
    /// From arrival to the end, in milliseconds.
    pub ms: u64,
}

impl ExchangeLine {
    /// Each attempt as `provider:outcome:12ms`, separated by spaces; as
    /// `provider/credential:outcome:12ms` when the request tried two
    /// credentials of one provider, so that the line says which key failed.
    pub fn write_attempts(&self, out: &mut (impl fmt::Write + ?Sized)) -> fmt::Result {
        let attempts = &self.report.attempts;
        let two_keys_of_one = attempts.iter().enumerate().any(|(n, attempt)| {
            attempts.iter().skip(n + 1).any(|later| {
                later.provider == attempt.provider && later.credential != attempt.credential
            })
        });
        for (n, attempt) in attempts.iter().enumerate() {
            if n > 0 {
                out.write_char(' ')?;
            }
            out.write_str(&attempt.provider)?;
            if two_keys_of_one {
                write!(out, "/{}", attempt.credential)?;
            }
            write!(out, ":{}:{}ms", attempt.outcome, attempt.millis)?;
        }
        Ok(())
    }

    pub fn served_by(&self) -> &str {
        self.report.served_provider.as_deref().unwrap_or("")
    }

    pub fn served_model(&self) -> &str {
        self.report.served_model.as_deref().unwrap_or("")
    }

    /// Input and output tokens, when the provider reported them: a log
    /// reader must tell "none reported" from zero.
    pub fn tokens(&self) -> Option<(u64, u64)> {
        self.report.usage
    }
}

/// Writes each line as a tracing event (target [`REQUEST_LOG_TARGET`]) as
/// it comes: for a proxy whose program installed no log of its own, and
/// for lines that tracing styles for a terminal.
pub struct TracingAccessLog;

impl AccessLog for TracingAccessLog {
    fn write(&self, line: RequestLine) {
        let Some(exchange) = &line.exchange else {
            tracing::info!(
                target: REQUEST_LOG_TARGET,
                request_id = &*line.request_id,
                endpoint = line.endpoint,
                tenant = line.tenant,
                model = line.model,
                decision = line.decision.as_str(),
                status = line.status,
                outcome = line.outcome,
                error = line.error(),
                "request"
            );
            return;
        };
        let mut attempts = String::with_capacity(32 * exchange.report.attempts.len());
        let _ = exchange.write_attempts(&mut attempts);
        let tokens = exchange.tokens();
        tracing::info!(
            target: REQUEST_LOG_TARGET,
            request_id = &*line.request_id,
            endpoint = line.endpoint,
            tenant = line.tenant,
            model = line.model,
            decision = line.decision.as_str(),
            attempts = attempts.as_str(),
            served_by = exchange.served_by(),
            served_model = exchange.served_model(),
            input_tokens = tokens.map(|(input, _)| input),
            output_tokens = tokens.map(|(_, output)| output),
            waited_ms = exchange.report.waited_ms,
            status = line.status,
            outcome = line.outcome,
            error = line.error(),
            ms = exchange.ms,
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::execute::AttemptRecord;

    fn attempts(tried: &[(&str, &str, &str)]) -> String {
        let report = Report {
            attempts: tried
                .iter()
                .map(|(provider, credential, outcome)| AttemptRecord {
                    provider: provider.to_string(),
                    credential: credential.to_string(),
                    outcome: outcome.to_string(),
                    millis: 3,
                })
                .collect(),
            ..Report::default()
        };
        let mut text = String::new();
        ExchangeLine { report, ms: 9 }
            .write_attempts(&mut text)
            .unwrap_or_default();
        text
    }

    #[test]
    fn attempts_name_the_credential_only_when_one_provider_used_two() {
        assert_eq!(
            attempts(&[("aki-io", "aki-1", "503"), ("scaleway", "sc-1", "ok")]),
            "aki-io:503:3ms scaleway:ok:3ms"
        );
        assert_eq!(
            attempts(&[
                ("openai", "openai-primary", "429"),
                ("openai", "openai-secondary", "429"),
                ("openrouter", "openrouter-key", "ok"),
            ]),
            "openai/openai-primary:429:3ms openai/openai-secondary:429:3ms \
             openrouter/openrouter-key:ok:3ms"
        );
        // The same key twice (a retry) says nothing new.
        assert_eq!(
            attempts(&[("openai", "k", "429"), ("openai", "k", "ok")]),
            "openai:429:3ms openai:ok:3ms"
        );
    }
}
