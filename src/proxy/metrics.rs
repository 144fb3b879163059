//! Prometheus metrics of one proxy, served at `GET /metrics`.
//!
//! Each proxy owns its recorder instead of installing a global one, so
//! several proxies in one process (tests, `demo`) keep separate counts.

use metrics::{Key, Label, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// Seconds, from a millisecond to two minutes.
const SECONDS_BUCKETS: &[f64] = &[
    0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const ATTEMPTS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 13.0];

/// How often `serve` folds raw histogram observations into their buckets.
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

static METADATA: Metadata<'static> =
    Metadata::new("switchyard", metrics::Level::INFO, Some(module_path!()));

fn key(name: &'static str, labels: &[(&'static str, String)]) -> Key {
    Key::from_parts(
        name,
        labels
            .iter()
            .map(|(label, value)| Label::new(*label, value.clone()))
            .collect::<Vec<_>>(),
    )
}

impl Metrics {
    pub fn new() -> Metrics {
        let builder = PrometheusBuilder::new();
        let builder = match builder.set_buckets(SECONDS_BUCKETS) {
            Ok(builder) => builder,
            // The bucket list is a non-empty constant; this cannot happen.
            Err(_) => PrometheusBuilder::new(),
        };
        let builder = match builder.set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(String::from(
                "switchyard_attempts_per_request",
            )),
            ATTEMPTS_BUCKETS,
        ) {
            Ok(builder) => builder,
            Err(_) => PrometheusBuilder::new(),
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let metrics = Metrics { recorder, handle };
        metrics.describe();
        metrics
    }

    fn describe(&self) {
        let describe = |name: &'static str, unit: Option<Unit>, text: &'static str| {
            self.recorder
                .describe_counter(name.into(), unit, SharedString::const_str(text));
        };
        describe(
            "switchyard_requests_total",
            None,
            "Requests answered, by the provider and model that answered last, outcome and status.",
        );
        describe(
            "switchyard_capacity_waits_total",
            None,
            "Requests that waited for a paused or full provider before their first attempt.",
        );
        describe(
            "switchyard_pauses_total",
            None,
            "Pauses the policy applied, by scope kind.",
        );
        self.recorder.describe_histogram(
            "switchyard_attempts_per_request".into(),
            None,
            SharedString::const_str("Upstream attempts made per request."),
        );
        self.recorder.describe_histogram(
            "switchyard_decision_seconds".into(),
            Some(Unit::Seconds),
            SharedString::const_str("Time to evaluate the policy for a request."),
        );
        self.recorder.describe_histogram(
            "switchyard_upstream_seconds".into(),
            Some(Unit::Seconds),
            SharedString::const_str("Upstream attempt duration, by provider and outcome."),
        );
        self.recorder.describe_histogram(
            "switchyard_upstream_first_byte_seconds".into(),
            Some(Unit::Seconds),
            SharedString::const_str(
                "Time to the first response byte (first event for streams), by provider.",
            ),
        );
        self.recorder.describe_gauge(
            "switchyard_in_flight".into(),
            None,
            SharedString::const_str("Requests being handled."),
        );
    }

    pub fn request(&self, provider: &str, model: &str, outcome: &str, status: u16) {
        self.recorder
            .register_counter(
                &key(
                    "switchyard_requests_total",
                    &[
                        ("provider", provider.to_string()),
                        ("model", model.to_string()),
                        ("outcome", outcome.to_string()),
                        ("status", status.to_string()),
                    ],
                ),
                &METADATA,
            )
            .increment(1);
    }

    pub fn attempts(&self, attempts: u32) {
        self.recorder
            .register_histogram(&key("switchyard_attempts_per_request", &[]), &METADATA)
            .record(f64::from(attempts));
    }

    pub fn decision(&self, seconds: f64) {
        self.recorder
            .register_histogram(&key("switchyard_decision_seconds", &[]), &METADATA)
            .record(seconds);
    }

    pub fn upstream(&self, provider: &str, outcome: &str, seconds: f64) {
        self.recorder
            .register_histogram(
                &key(
                    "switchyard_upstream_seconds",
                    &[
                        ("provider", provider.to_string()),
                        ("outcome", outcome.to_string()),
                    ],
                ),
                &METADATA,
            )
            .record(seconds);
    }

    pub fn first_byte(&self, provider: &str, seconds: f64) {
        self.recorder
            .register_histogram(
                &key(
                    "switchyard_upstream_first_byte_seconds",
                    &[("provider", provider.to_string())],
                ),
                &METADATA,
            )
            .record(seconds);
    }

    pub fn in_flight(&self, delta: f64) {
        let gauge = self
            .recorder
            .register_gauge(&key("switchyard_in_flight", &[]), &METADATA);
        if delta >= 0.0 {
            gauge.increment(delta);
        } else {
            gauge.decrement(-delta);
        }
    }

    pub fn capacity_wait(&self) {
        self.recorder
            .register_counter(&key("switchyard_capacity_waits_total", &[]), &METADATA)
            .increment(1);
    }

    pub fn pause(&self, scope: &str) {
        self.recorder
            .register_counter(
                &key("switchyard_pauses_total", &[("scope", scope.to_string())]),
                &METADATA,
            )
            .increment(1);
    }

    /// A counter by name and labels, for parts of the server with their own
    /// events (reloads).
    pub fn count(&self, name: &'static str, labels: &[(&'static str, String)]) {
        self.recorder
            .register_counter(&key(name, labels), &METADATA)
            .increment(1);
    }

    /// A gauge set to a value.
    pub fn set(&self, name: &'static str, labels: &[(&'static str, String)], value: f64) {
        self.recorder
            .register_gauge(&key(name, labels), &METADATA)
            .set(value);
    }

    /// Folds the observations recorded since the last upkeep into the
    /// histograms. Until then the recorder keeps every raw observation, so
    /// a proxy nobody scrapes must still run this now and then (`serve`
    /// does, every [`UPKEEP_INTERVAL`]).
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    pub fn render(&self) -> String {
        self.handle.run_upkeep();
        self.handle.render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
