#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! Inputs that crashed or stalled the parsers of untrusted input while
//! fuzzing (see fuzz/README.md). Each test runs the same code path as its fuzz
//! target (`fuzz/fuzz_targets/*.rs`): parse or load, check, then render every
//! diagnostic as text and as JSON; for provider streams, read and classify
//! every event.
//!
//! A stack overflow aborts the whole process rather than panicking, so every
//! test runs its input in a child process (this test binary, filtered to the
//! one test) on a thread with an 8 MiB stack, the size of a main thread and of
//! the fuzz targets' stack. Inputs that used to take exponential time get a
//! deadline; the child is killed when it passes. Inputs that used to take
//! quadratic time run at two sizes, and the larger must not take
//! disproportionately more CPU time: a ratio, which a busy machine does not
//! upset as it does a deadline.
//!
//! The inputs are generated here rather than stored: they are long repetitions.
//!
//! Run them in both profiles: some overflows only happen in release builds.
//! In a debug build pest's own stack guard stops the parse of a deeply nested
//! `if` chain first (with a misleading syntax error), while in release pest
//! gets through and the lowering that follows overflows.
//!
//!     cargo test --test fuzz_regressions
//!     cargo test --release --test fuzz_regressions

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};
use switchyard::data::{Data, load_texts};
use switchyard::diagnostics::Diagnostic;
use switchyard::diagnostics::render::{self, Style};
use switchyard::evaluate::Endpoint;
use switchyard::language::check_text_with_data;
use switchyard::language::parse::parse_expression;
use switchyard::proxy::wire::{EventReader, usage_of};
use switchyard::source::SourceMap;

// ---------------------------------------------------------------- the fuzz targets' code paths

const CATALOG: &str = include_str!("../policies/noirdoc/catalog.yaml");
const TENANTS: &str = include_str!("../policies/noirdoc/tenants.yaml");

static DATA: LazyLock<Data> = LazyLock::new(|| {
    let (data, diagnostics) = load_texts(CATALOG, TENANTS, &mut SourceMap::new());
    data.unwrap_or_else(|| panic!("the Noirdoc data does not load: {diagnostics:#?}"))
});

fn render_all(diagnostics: &[Diagnostic], sources: &SourceMap) {
    for diagnostic in diagnostics {
        let _ = render::human(diagnostic, sources, Style::Plain);
    }
    let _ = render::json(diagnostics, sources);
}

/// fuzz_targets/policy.rs
fn policy_target(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let mut sources = SourceMap::new();
    sources.add("catalog.yaml", CATALOG);
    sources.add("tenants.yaml", TENANTS);
    let diagnostics = check_text_with_data(&mut sources, "fuzz.policy", &text, &DATA);
    render_all(&diagnostics, &sources);
}

/// fuzz_targets/data.rs: catalog, a 0 byte, tenants.
fn data_target(bytes: &[u8]) {
    let (catalog, tenants) = match bytes.iter().position(|&b| b == 0) {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, &[][..]),
    };
    let catalog = String::from_utf8_lossy(catalog);
    let tenants = String::from_utf8_lossy(tenants);
    let mut sources = SourceMap::new();
    let (_data, diagnostics) = load_texts(&catalog, &tenants, &mut sources);
    render_all(&diagnostics, &sources);
}

/// fuzz_targets/expression.rs
fn expression_target(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let mut sources = SourceMap::new();
    let id = sources.add("fuzz.expr", text.as_ref());
    let (_expr, diagnostics) = parse_expression(id, &text);
    render_all(&diagnostics, &sources);
}

/// Where the first blank line in `bytes` ends, by a plain search.
fn first_blank_line_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|at| {
        [&b"\n\n"[..], b"\r\n\r\n", b"\n\r\n"]
            .into_iter()
            .find(|blank| bytes[at..].starts_with(blank))
            .map(|blank| at + blank.len())
    })
}

/// fuzz_targets/sse.rs: a provider's stream, given to the reader in the
/// chunks `chunks` yields, each event classified for `endpoint`; no byte is
/// lost or reordered, and events end at their first blank line.
fn sse_target<'a>(endpoint: Endpoint, chunks: impl IntoIterator<Item = &'a [u8]>) {
    let mut reader = EventReader::default();
    let mut pushed = Vec::new();
    let mut received = 0;
    for chunk in chunks {
        pushed.extend_from_slice(chunk);
        let Ok(events) = reader.push(chunk) else {
            return;
        };
        for event in events {
            assert_eq!(first_blank_line_end(&event.raw), Some(event.raw.len()));
            received += event.raw.len();
            if event.tree_readable() {
                assert_eq!(
                    event.read(endpoint),
                    event.read_by_tree(endpoint),
                    "{:?}",
                    event.data
                );
            }
            let _ = event.usage();
            if let Ok(data) = serde_json::from_str::<serde_json::Value>(&event.data) {
                let _ = usage_of(&data);
            }
        }
    }
    assert_eq!(first_blank_line_end(reader.pending()), None);
    // A byte order mark that begins the stream is dropped.
    let expected = pushed.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&pushed);
    assert_eq!(received + reader.pending().len(), expected.len());
}

fn data_pair(catalog: &str, tenants: &str) -> Vec<u8> {
    let mut bytes = catalog.as_bytes().to_vec();
    bytes.push(0);
    bytes.extend_from_slice(tenants.as_bytes());
    bytes
}

const HEADER: &str = "policy p {\n  catalog \"c\"\n  tenants \"t\"\n}\n";

// ---------------------------------------------------------------- running one input in a child process

const CHILD: &str = "SWITCHYARD_FUZZ_REGRESSION";
/// The input's size, for a test that runs its input at two sizes.
const SIZE: &str = "SWITCHYARD_FUZZ_REGRESSION_SIZE";
/// What a child prints (on stderr) of the CPU time its input took.
const CPU_NS: &str = "cpu-ns=";
const STACK: usize = 8 * 1024 * 1024;
/// For inputs that crash: long enough for a debug build to get there.
const CRASH_DEADLINE: Duration = Duration::from_secs(120);
/// For inputs that used to take exponential time: they take well under a
/// second in a debug build now, and hours before.
const STALL_DEADLINE: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(30)
} else {
    Duration::from_secs(3)
};
/// For inputs that used to take quadratic time, a guard against a hang only:
/// they are judged by how their time grows ([`grows_linearly`]).
const HANG_DEADLINE: Duration = Duration::from_secs(300);
/// How much larger the second input of [`grows_linearly`] is.
const SCALE: usize = 8;
/// Linear work takes about `SCALE` times as long at `SCALE` times the size
/// (8.1 to 10.6 times for these inputs in a debug build), quadratic work up
/// to `SCALE²` (64) times, less where linear parts dilute it: removing the
/// cap on measured suggestions made the unknown models' input grow 34
/// times.
const MAX_GROWTH: f64 = 24.0;

/// Runs `body` in a child process and fails unless it finishes within
/// `deadline` without panicking or aborting.
fn isolated(name: &str, deadline: Duration, body: fn()) {
    if in_child(name) {
        on_a_main_sized_stack(name, body);
        return;
    }
    run_child(name, deadline, None);
}

/// Runs `body` at `size` and at `SCALE` times `size`, each in a child
/// process, and fails unless the larger took under `MAX_GROWTH` times the
/// CPU time of the smaller. A ratio, not a deadline: a busy machine does not
/// make the test fail, a quadratic algorithm does. CPU time, not wall time,
/// so that tests running beside it do not count.
fn grows_linearly(name: &str, size: usize, body: fn(usize)) {
    if in_child(name) {
        let size = std::env::var(SIZE)
            .ok()
            .and_then(|size| size.parse().ok())
            .expect("the input's size");
        on_a_main_sized_stack(name, move || {
            let started = CpuClock::start();
            body(size);
            eprintln!("{CPU_NS}{}", started.elapsed().as_nanos());
        });
        return;
    }
    let cpu_time = |size: usize| {
        let stderr = run_child(name, HANG_DEADLINE, Some(size));
        stderr
            .lines()
            .find_map(|line| line.strip_prefix(CPU_NS)?.parse::<u64>().ok())
            .map(Duration::from_nanos)
            .unwrap_or_else(|| panic!("{name}: the child printed no CPU time:\n{stderr}"))
    };
    let growth =
        |small: Duration, large: Duration| large.as_secs_f64() / small.as_secs_f64().max(1e-9);
    let mut small = cpu_time(size);
    let mut large = cpu_time(size * SCALE);
    // CPU time still grows a little on a busy machine (caches shared with
    // the tests beside it): a ratio over the bound is measured once more,
    // and each size keeps its faster run. Quadratic work is over the bound
    // every time.
    if growth(small, large) >= MAX_GROWTH {
        small = small.min(cpu_time(size));
        large = large.min(cpu_time(size * SCALE));
    }
    let growth = growth(small, large);
    assert!(
        growth < MAX_GROWTH,
        "{name}: {SCALE} times the input took {growth:.1} times as long ({small:?}, then {large:?}); \
         linear work takes about {SCALE} times, quadratic {}",
        SCALE * SCALE
    );
}

fn in_child(name: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(name)
}

/// Runs `body` on a thread with the stack of a main thread and of the fuzz
/// targets, so that stack overflows happen where they would there.
fn on_a_main_sized_stack(name: &str, body: impl FnOnce() + Send + 'static) {
    let worker = std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(STACK)
        .spawn(body)
        .expect("spawn the worker thread");
    if worker.join().is_err() {
        panic!("{name}: the code under test panicked");
    }
}

/// The calling thread's CPU time, from Linux's scheduler statistics; wall
/// time where they cannot be read.
enum CpuClock {
    Scheduler(Duration),
    Wall(Instant),
}

impl CpuClock {
    fn start() -> CpuClock {
        match thread_cpu_time() {
            Some(used) => CpuClock::Scheduler(used),
            None => CpuClock::Wall(Instant::now()),
        }
    }

    fn elapsed(&self) -> Duration {
        match self {
            CpuClock::Scheduler(before) => thread_cpu_time()
                .map(|now| now.saturating_sub(*before))
                .unwrap_or_default(),
            CpuClock::Wall(started) => started.elapsed(),
        }
    }
}

/// `/proc/thread-self/schedstat` begins with the thread's time on a CPU in
/// nanoseconds.
fn thread_cpu_time() -> Option<Duration> {
    let stats = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stats.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// Runs this test in a child process (this test binary, filtered to the
/// test) and fails unless it finishes within `deadline` without panicking
/// or aborting; returns what it wrote to stderr.
fn run_child(name: &str, deadline: Duration, size: Option<usize>) -> String {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(size) = size {
        command.env(SIZE, size.to_string());
    }
    let mut child = command.spawn().expect("start the child process");
    let mut stderr = child.stderr.take().expect("child stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = reader.join().unwrap_or_default();
    let tail: String = {
        let lines: Vec<&str> = stderr.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    match status {
        None => panic!(
            "{name}: did not finish within {deadline:?} (killed)\n--- child stderr ---\n{tail}"
        ),
        Some(status) if !status.success() => panic!(
            "{name}: the child process failed: {status} (SIGABRT/SIGSEGV = stack overflow)\n--- child stderr ---\n{tail}"
        ),
        Some(_) => stderr,
    }
}

// ---------------------------------------------------------------- crashes: stack overflows

/// `let a = if c then 1 else if c then 1 else ... 1`: `if` nests without
/// brackets, so the bracket-depth limit of the pre-scan does not see it and
/// the lowering recursion (`Lowerer::expr` → `pratt` → `primary`) overflows.
/// Crashed the release fuzz build from 2 940 levels (59 KB). Release only: in
/// a debug build pest's stack guard fails the parse first (E0101 "expected
/// something else, found `true`", itself misleading).
#[test]
fn policy_if_else_chain() {
    isolated("policy_if_else_chain", CRASH_DEADLINE, || {
        let text = format!(
            "{HEADER}let a = {}1\n",
            "if true then 1 else ".repeat(6_000)
        );
        policy_target(text.as_bytes());
    });
}

/// `on 500 => error e if c else e if c else ... e`: `error_choice` is
/// right-recursive in the grammar and `Lowerer::error_choice` recurses once
/// per alternative. Crashed a release build from about 9 700 alternatives
/// (145 KB). Release only, as above.
#[test]
fn policy_error_choice_chain() {
    isolated("policy_error_choice_chain", CRASH_DEADLINE, || {
        let text = format!(
            "{HEADER}failover {{\n  on 500 => error {}e\n}}\n",
            "e if true else ".repeat(20_000)
        );
        policy_target(text.as_bytes());
    });
}

/// `let a0 = a1 + 1`, `let a1 = a2 + 1`, ...: every definition uses the next
/// one, so `Checker::let_type` → `check_expr` → ... → `named_value` →
/// `let_type` recurses once per definition. Crashed the release fuzz build
/// from 4 363 definitions (94 KB).
#[test]
fn policy_forward_let_chain() {
    isolated("policy_forward_let_chain", CRASH_DEADLINE, || {
        let count = 9_000;
        let mut text = String::from(HEADER);
        for i in 0..count {
            text.push_str(&format!("let a{i} = a{} + 1\n", i + 1));
        }
        text.push_str(&format!("let a{count} = 1\n"));
        policy_target(text.as_bytes());
    });
}

/// `let d0 = d1 + 1 + ... + 1`, `let d1 = d2 + 1 + ...`, ...: 199
/// definitions, each a sum of 128 terms (the expression length and the
/// definition depth the checker accepts). The checker grew its stack at
/// each definition only, and one definition's sum of 128 terms used up the
/// red zone in an unoptimised build: `switchyard check` overflowed on this
/// policy, which checks clean. Debug only; a release build had room.
#[test]
fn policy_deep_definitions_of_long_sums() {
    isolated(
        "policy_deep_definitions_of_long_sums",
        CRASH_DEADLINE,
        || {
            let count = 199;
            let mut text = String::from(HEADER);
            for i in 0..count {
                text.push_str(&format!("let d{i} = d{}{}\n", i + 1, " + 1".repeat(127)));
            }
            text.push_str(&format!("let d{count} = 1\n"));
            policy_target(text.as_bytes());
        },
    );
}

/// `((((...1...))))` given to `parse_expression`, which (unlike `parse`) has
/// no bracket-depth pre-scan: the lowering recursion overflows. Crashed the
/// release fuzz build from 9 697 levels (19 KB). Release only, as above.
#[test]
fn expression_nested_parentheses() {
    isolated("expression_nested_parentheses", CRASH_DEADLINE, || {
        let text = format!("{}1{}", "(".repeat(20_000), ")".repeat(20_000));
        expression_target(text.as_bytes());
    });
}

/// `[[[[...]]]]` given to `parse_expression`. Crashed the release fuzz build
/// from 2 944 levels (5.9 KB). Release only, as above.
#[test]
fn expression_nested_lists() {
    isolated("expression_nested_lists", CRASH_DEADLINE, || {
        let text = format!("{}{}", "[".repeat(6_000), "]".repeat(6_000));
        expression_target(text.as_bytes());
    });
}

/// `if c then 1 else if c then 1 else ... 1` given to `parse_expression`.
/// Crashed the release fuzz build from 2 941 levels (59 KB). Release only, as
/// above.
#[test]
fn expression_if_else_chain() {
    isolated("expression_if_else_chain", CRASH_DEADLINE, || {
        let text = format!("{}1", "if true then 1 else ".repeat(6_000));
        expression_target(text.as_bytes());
    });
}

/// An attribute type `list<list<...<bool>...>>` in the catalog schema:
/// `AttrType::parse` (src/data/schema.rs) recurses once per `list<`. Crashed
/// a release build from about 105 000 levels (a 1 MB string, which may be
/// spread over lines; data files may be 64 MiB).
#[test]
fn data_nested_list_type() {
    isolated("data_nested_list_type", CRASH_DEADLINE, || {
        // 400 000 levels over 800 lines: data lines may be 256 KiB at most,
        // and a quoted YAML string folds its lines into spaces, which
        // `AttrType::parse` trims.
        let opening = format!("\n      {}", "list<".repeat(1_000)).repeat(400);
        let closing = format!("\n      {}", ">".repeat(1_000)).repeat(400);
        let anchor = "attributes:\n  provider:\n";
        assert!(
            CATALOG.contains(anchor),
            "the Noirdoc catalog changed shape"
        );
        let deep = format!("{anchor}    deep: \"{opening} bool {closing}\"\n");
        data_target(&data_pair(&CATALOG.replacen(anchor, &deep, 1), TENANTS));
    });
}

// ---------------------------------------------------------------- stalls: superlinear time

/// Found by the `expression` fuzz target (timeout after 10 s; the file is
/// fuzz/regressions/expression/timeout-90d32782169de14e2a71013fed221cf7b31ce0a7).
/// `min_of(` matches both `aggregate` and `call` in the grammar, so when the
/// inside fails to parse pest tries it twice per level: exponential time in
/// the number of unclosed `min_of(`. 13 s in the release fuzz build.
#[test]
fn expression_fuzz_timeout_unclosed_aggregates() {
    isolated(
        "expression_fuzz_timeout_unclosed_aggregates",
        STALL_DEADLINE,
        || {
            expression_target(
                b"s -min_of( n_of( R( rf(ivat-min_of(0s -min_of( if-min_ofeccos_of( R( (0s -min_of( if-min_of(0s -min_of( R( rf(ivat-min_of(0s -min_of( if-min_ofeccosmimin_of(if-min_of(0s -min_of( R( (0s -min_of( if-min_of(0s -min_of( R( rf(ivat-min_of(0s -min_of( if-min_ofeccosmin_of( R( (0s -min_mf( if-min_of(0s -min_of( R( rf(ivat-mi ==1.25",
            );
        },
    );
}

/// The same, minimised by hand: `min_of(` 24 times, never closed (168 bytes).
/// Doubles with every level: 16 levels take 1.3 s in the release fuzz build.
#[test]
fn expression_unclosed_aggregates() {
    isolated("expression_unclosed_aggregates", STALL_DEADLINE, || {
        expression_target("min_of(".repeat(24).as_bytes());
    });
}

/// The same in a policy, through `parse` (whose bracket-depth limit of 48
/// does not help): `let a = min_of(min_of(...` 18 levels deep, unclosed
/// (174 bytes), takes 31 s in the release fuzz build, and doubles per level.
/// A typo can hang `switchyard check`.
#[test]
fn policy_unclosed_aggregates() {
    isolated("policy_unclosed_aggregates", STALL_DEADLINE, || {
        let text = format!("{HEADER}let a = {}\n", "min_of(".repeat(24));
        policy_target(text.as_bytes());
    });
}

/// Many definitions `let aN = aN-1 + 1` (40 000 are 0.9 MB, below the
/// 4 MiB policy limit): definitions were found by a linear scan of all of
/// them (`Checker::let_type`, `check_quietly`), so checking was quadratic:
/// 5.4 s for 20 000 and about 25 s for 40 000 in release.
#[test]
fn policy_many_definitions_check_in_linear_time() {
    grows_linearly(
        "policy_many_definitions_check_in_linear_time",
        2_500,
        |count| {
            let mut text = format!("{HEADER}let a0 = 1\n");
            for i in 1..count {
                text.push_str(&format!("let a{i} = a{} + 1\n", i - 1));
            }
            policy_target(text.as_bytes());
        },
    );
}

/// Many lines `let = 1` (20 000 are 160 KB), one syntax error each:
/// checking takes 0.1 s, but `render::human` handed the whole file to
/// annotate-snippets for every diagnostic, so rendering was O(diagnostics x
/// file size): 11 s in release for 20 000 (20 000 unused definitions:
/// 13 s), about 90 s in a debug build.
#[test]
fn policy_many_diagnostics_render_in_linear_time() {
    grows_linearly(
        "policy_many_diagnostics_render_in_linear_time",
        2_000,
        |lines| {
            let text = format!("{HEADER}{}", "let = 1\n".repeat(lines));
            policy_target(text.as_bytes());
        },
    );
}

/// A long name used where a definition of a name one letter off exists:
/// `diagnostics::suggest` ran a full Damerau-Levenshtein over every
/// candidate, quadratic in the name's length (3.2 s for 30 000 characters in
/// release; a 2 MB policy with two 1 MB names would take hours).
#[test]
fn policy_long_unknown_name_suggests_in_linear_time() {
    grows_linearly(
        "policy_long_unknown_name_suggests_in_linear_time",
        5_000,
        |length| {
            let name = "a".repeat(length);
            let text = format!("{HEADER}let {name} = 1\nlet b = {}b\n", &name[1..]);
            policy_target(text.as_bytes());
        },
    );
}

/// Many models and a key allowing as many unknown model ids (3 000 of
/// each are 280 KB): each unknown id was compared with every model id by
/// `diagnostics::suggest`, 7.9 s in release for 3 000.
#[test]
fn data_many_unknown_models_load_in_linear_time() {
    grows_linearly(
        "data_many_unknown_models_load_in_linear_time",
        400,
        |count| {
            let mut catalog = String::from(
                "providers:\n  - id: p\n    format: openai\n    base_url: http://x/v1\n    credentials:\n      - {id: k, key: \"${K}\"}\nmodels:\n",
            );
            for i in 0..count {
                catalog.push_str(&format!(
                    "  - id: model-number-{i}\n    kind: chat\n    routes:\n      - provider: p\n"
                ));
            }
            let unknown: Vec<String> = (0..count).map(|i| format!("unknown-model-{i}")).collect();
            let tenants = format!(
                "attributes:\n  key:\n    allowed_models: list<model>\ntenants:\n  - id: t\n    keys:\n      - id: k1\n        sha256: 9d72c7cfb7ccac5fb1184e70600d9a57c2871be7e61bfab2cb13e76717bce387\n        attributes: {{allowed_models: [{}]}}\n",
                unknown.join(", ")
            );
            data_target(&data_pair(&catalog, &tenants));
        },
    );
}

/// One long event arriving in 1 KiB chunks, as a provider streaming a large
/// event over a slow connection sends it: `EventReader::push` searched the
/// whole buffer for a blank line on every chunk, so reading it was
/// quadratic: 150 s in the fuzz build for almost 4 MiB, the reader's limit
/// (4 000 chunks, 8 GB of bytes compared). Found by probing the `sse` target
/// by hand (inputs of `-max_len` never get near the limit).
#[test]
fn sse_long_event_in_small_chunks_reads_in_linear_time() {
    grows_linearly(
        "sse_long_event_in_small_chunks_reads_in_linear_time",
        500,
        |chunks| {
            let mut stream = b"data: ".to_vec();
            stream.extend(std::iter::repeat_n(b'x', chunks * 1024));
            stream.extend_from_slice(b"\n\n");
            sse_target(Endpoint::ChatCompletions, stream.chunks(1024));
        },
    );
}

/// Blank lines (empty events) in one chunk: `push` drained each event from
/// the front of its buffer, moving the rest of the chunk once per event,
/// quadratic in the chunk's size: 140 s in the fuzz build for 4 MiB (1 MiB:
/// 5.5 s; 4 MiB in 256 KiB chunks: 6.8 s).
#[test]
fn sse_many_events_in_one_chunk_read_in_linear_time() {
    grows_linearly(
        "sse_many_events_in_one_chunk_read_in_linear_time",
        128 * 1024,
        |events| {
            let stream = b"\n\n".repeat(events);
            sse_target(Endpoint::ChatCompletions, [stream.as_slice()]);
        },
    );
}

/// fuzz/artifacts of the `sse` target, 2026-11-30: an event whose data has
/// a number beyond the range of `f64` (`"created":17644e0800`). serde_json
/// builds no tree of it, so the tree reading called the event malformed,
/// while `Event::meaning` reads it as the valid JSON it is (as whole answers
/// were already read); the target now compares the two only where the tree
/// can be built.
#[test]
fn sse_event_with_a_number_beyond_f64() {
    isolated("sse_event_with_a_number_beyond_f64", CRASH_DEADLINE, || {
        let stream = b"data: {\"id\":\"chunk\",\"created\":17644e0800,\"choices\":[]}\n\n";
        sse_target(Endpoint::ChatCompletions, [&stream[..]]);
    });
}
