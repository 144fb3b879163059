//! Prometheus metrics of one proxy, served at `GET /metrics`.
//!
//! Each proxy owns its recorder instead of installing a global one, so
//! several proxies in one process (tests, `demo`) keep separate counts.

use crate::sync::lock;
use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::cell::RefCell;
use std::sync::{Mutex, OnceLock};

/// Seconds, from a millisecond to two minutes.
const SECONDS_BUCKETS: &[f64] = &[
    0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const ATTEMPTS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 13.0];

/// How often `serve` folds raw histogram observations into their buckets.
/// Until then each is kept raw, and the memory they took stays with the
/// process after a burst: at 5 s, a proxy idle after load kept 6 MiB more.
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Handles of the metrics every request records, kept: registering
    /// builds the metric's key (an allocation per label) and looks it up
    /// each time. Those without labels are registered on first use.
    in_flight: OnceLock<Gauge>,
    decision_seconds: OnceLock<Histogram>,
    attempts_per_request: OnceLock<Histogram>,
    counters: Handles<Counter>,
    histograms: Handles<Histogram>,
}

/// Labelled handles by metric name and label values. foldhash, seeded per
/// process, hashes an id in a fraction of SipHash's time; every request
/// looks up three.
struct Handles<H>(Mutex<foldhash::HashMap<Vec<u8>, H>>);

impl<H> Default for Handles<H> {
    fn default() -> Self {
        Handles(Mutex::new(foldhash::HashMap::default()))
    }
}

/// Handles kept per kind at most; label values include the requested
/// model, which clients choose, so past this the cache starts over.
const MAX_HANDLES: usize = 4096;

impl<H: Clone> Handles<H> {
    /// The handle of `name` with these label values, registered by
    /// `register` the first time.
    fn get(
        &self,
        name: &'static str,
        labels: &[(&'static str, &str)],
        register: impl FnOnce(&Key) -> H,
    ) -> H {
        ID.with_borrow_mut(|id| {
            // A client's long model name is not kept past the next lookup.
            if id.capacity() > MAX_KEPT_ID {
                *id = Vec::new();
            }
            // Each part with its length first: no two label sets share an id.
            id.clear();
            for part in std::iter::once(name).chain(labels.iter().map(|(_, value)| *value)) {
                id.extend_from_slice(&part.len().to_le_bytes());
                id.extend_from_slice(part.as_bytes());
            }
            let mut handles = lock(&self.0);
            if let Some(handle) = handles.get(id.as_slice()) {
                return handle.clone();
            }
            let owned: Vec<(&'static str, String)> = labels
                .iter()
                .map(|(label, value)| (*label, value.to_string()))
                .collect();
            let handle = register(&key(name, &owned));
            if handles.len() >= MAX_HANDLES {
                handles.clear();
            }
            handles.insert(id.clone(), handle.clone());
            handle
        })
    }
}

const MAX_KEPT_ID: usize = 1024;

thread_local! {
    /// The id being looked up, one buffer per thread: a lookup that finds
    /// its handle allocates nothing.
    static ID: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
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
        let metrics = Metrics {
            recorder,
            handle,
            in_flight: OnceLock::new(),
            decision_seconds: OnceLock::new(),
            attempts_per_request: OnceLock::new(),
            counters: Handles::default(),
            histograms: Handles::default(),
        };
        metrics.describe();
        metrics.start_at_zero();
        metrics
    }

    /// Registers the series whose labels are known in advance, so that a
    /// fresh proxy's scrape shows them at 0: a missing series is no rate,
    /// and an alert on `switchyard_reload_failed` could not tell "no
    /// failure" from "no data".
    fn start_at_zero(&self) {
        let counter = |name: &'static str, labels: &[(&'static str, String)]| {
            self.recorder
                .register_counter(&key(name, labels), &METADATA)
                .increment(0);
        };
        counter("switchyard_capacity_waits_total", &[]);
        // The scope kinds a pause applies to (`execute::scope_name`).
        for scope in ["provider", "route", "credential"] {
            counter("switchyard_pauses_total", &[("scope", scope.to_string())]);
        }
        for result in ["ok", "failed"] {
            counter(
                "switchyard_reloads_total",
                &[("result", result.to_string())],
            );
        }
        self.set("switchyard_reload_failed", &[], 0.0);
        self.in_flight(0.0);
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
        describe(
            "switchyard_reloads_total",
            None,
            "Policy reloads, by result (ok, failed).",
        );
        self.recorder.describe_gauge(
            "switchyard_reload_failed".into(),
            None,
            SharedString::const_str(
                "1 while the last reload failed and the previous policy keeps serving.",
            ),
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
                "Time to the first token of the answers served: the first event of a stream, the whole of any other answer, by provider.",
            ),
        );
        self.recorder.describe_gauge(
            "switchyard_in_flight".into(),
            None,
            SharedString::const_str("Requests being handled."),
        );
    }

    fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.counters.get(name, labels, |key| {
            self.recorder.register_counter(key, &METADATA)
        })
    }

    fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        self.histograms.get(name, labels, |key| {
            self.recorder.register_histogram(key, &METADATA)
        })
    }

    fn unlabelled_histogram<'a>(
        &self,
        cell: &'a OnceLock<Histogram>,
        name: &'static str,
    ) -> &'a Histogram {
        cell.get_or_init(|| self.recorder.register_histogram(&key(name, &[]), &METADATA))
    }

    pub fn request(&self, provider: &str, model: &str, outcome: &str, status: u16) {
        let status = status.to_string();
        self.counter(
            "switchyard_requests_total",
            &[
                ("provider", provider),
                ("model", model),
                ("outcome", outcome),
                ("status", &status),
            ],
        )
        .increment(1);
    }

    pub fn attempts(&self, attempts: u32) {
        self.unlabelled_histogram(
            &self.attempts_per_request,
            "switchyard_attempts_per_request",
        )
        .record(f64::from(attempts));
    }

    pub fn decision(&self, seconds: f64) {
        self.unlabelled_histogram(&self.decision_seconds, "switchyard_decision_seconds")
            .record(seconds);
    }

    pub fn upstream(&self, provider: &str, outcome: &str, seconds: f64) {
        self.histogram(
            "switchyard_upstream_seconds",
            &[("provider", provider), ("outcome", outcome)],
        )
        .record(seconds);
    }

    pub fn first_byte(&self, provider: &str, seconds: f64) {
        self.histogram(
            "switchyard_upstream_first_byte_seconds",
            &[("provider", provider)],
        )
        .record(seconds);
    }

    pub fn in_flight(&self, delta: f64) {
        let gauge = self.in_flight.get_or_init(|| {
            self.recorder
                .register_gauge(&key("switchyard_in_flight", &[]), &METADATA)
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_proxy_shows_its_event_series_at_zero() {
        let text = Metrics::new().render();
        for series in [
            "switchyard_capacity_waits_total 0",
            "switchyard_pauses_total{scope=\"provider\"} 0",
            "switchyard_pauses_total{scope=\"route\"} 0",
            "switchyard_pauses_total{scope=\"credential\"} 0",
            "switchyard_reloads_total{result=\"ok\"} 0",
            "switchyard_reloads_total{result=\"failed\"} 0",
            "switchyard_reload_failed 0",
            "switchyard_in_flight 0",
        ] {
            assert!(
                text.lines().any(|line| line == series),
                "no `{series}` in:\n{text}"
            );
        }
    }

    #[test]
    fn every_family_says_what_it_counts() {
        let metrics = Metrics::new();
        // One event of every kind, so that every family has a series.
        metrics.request("a", "m", "served", 200);
        metrics.first_byte("a", 0.1);
        metrics.decision(0.001);
        metrics.attempts(1);
        metrics.upstream("a", "ok", 0.2);
        metrics.capacity_wait();
        metrics.pause("provider");
        let text = metrics.render();
        let families: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split_whitespace().next())
            .collect();
        assert_eq!(families.len(), 10, "{text}");
        for family in families {
            assert!(
                text.lines()
                    .any(|line| line.starts_with(&format!("# HELP {family} "))),
                "no HELP for {family} in:\n{text}"
            );
        }
    }
}
