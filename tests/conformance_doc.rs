//! CONFORMANCE.md against the rule tags in the reference policies.
//!
//! Every rule of a seed is a row of CONFORMANCE.md (`| ID | Rule | Policy |
//! Status |`). The policies and their data files name the rules they express
//! in comments, as `[N25]`; a tag stands for its paragraph, the run of
//! non-blank lines around the comment. This test derives each row's Policy
//! cell from the tags and checks the table against them, so line numbers never
//! go stale. The conformance tests (`tests/conformance_<policy>.rs`) name the
//! rules each test proves the same way, in the comments above the test's
//! `fn`; the Tests cell and the `proven` status follow from those.
//! `SWITCHYARD_BLESS=1 cargo test --test conformance_doc` rewrites the Policy
//! and Tests cells, the statuses that follow from them and the summary
//! instead of failing on them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const PACKAGE_ROOT: &str = env!("CARGO_MANIFEST_DIR");
const DOC: &str = "CONFORMANCE.md";
const POLICIES: &str = "policies";
/// The Policy cell of a row that no paragraph expresses.
const NONE: &str = "—";
const PROVEN: &str = "proven";
const EXPRESSED_ONLY: &str = "expressed-only: ";
const OUT_OF_SCOPE: &str = "out of scope: ";
/// The reason a blessed row gets when its tests are gone.
const NOT_YET_TESTED: &str = "expressed-only: no conformance test yet";

/// Where a tag's paragraph is: a file (relative to `policies/`, in the order
/// of [`tagged_files`]) and its first and last lines, 1-based.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    file_rank: usize,
    first: usize,
    last: usize,
}

/// A tag as written: its file and line, for messages.
#[derive(Debug)]
struct Tag {
    id: String,
    file: String,
    line: usize,
    place: Place,
    /// Whether its paragraph holds more than comments.
    states_something: bool,
}

/// A table row of CONFORMANCE.md.
#[derive(Debug)]
struct Row {
    /// Index of its line in the document.
    line: usize,
    id: String,
    rule: String,
    policy: String,
    tests: String,
    status: String,
    /// The policy file its section names, such as `noirdoc.policy`.
    policy_file: String,
    /// The seed's name in the summary, such as `Noirdoc`.
    seed: String,
}

/// Whether `text` is a rule id: capital letters, then digits (`N25`, `A102`).
fn is_rule_id(text: &str) -> bool {
    let letters = text.chars().take_while(char::is_ascii_uppercase).count();
    let digits = text.len() - letters;
    letters > 0 && digits > 0 && text[letters..].chars().all(|c| c.is_ascii_digit())
}

/// The comment of a line, after its `#`, if it has one. A `#` inside a
/// double-quoted string is not a comment; in YAML a comment starts a line or
/// follows white space.
fn comment(line: &str, yaml: bool) -> Option<&str> {
    let mut in_string = false;
    let mut escaped = false;
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if c == '#' && (!yaml || previous.is_whitespace()) {
            return Some(&line[at + 1..]);
        }
        previous = c;
    }
    None
}

/// The rule ids a comment names in square brackets.
fn tags_in(comment: &str) -> Vec<String> {
    comment
        .split('[')
        .skip(1)
        .filter_map(|after| after.split_once(']'))
        .map(|(inside, _)| inside)
        .filter(|inside| is_rule_id(inside))
        .map(str::to_owned)
        .collect()
}

/// The paragraph around line `index` (0-based): its first and last lines,
/// 1-based.
fn paragraph(lines: &[&str], index: usize) -> (usize, usize) {
    let blank = |i: usize| lines[i].trim().is_empty();
    let mut first = index;
    while first > 0 && !blank(first - 1) {
        first -= 1;
    }
    let mut last = index;
    while last + 1 < lines.len() && !blank(last + 1) {
        last += 1;
    }
    (first + 1, last + 1)
}

/// The files tags may be in, relative to `policies/`, in the order a Policy
/// cell lists them: each policy (by file name), then its catalog, then its
/// tenants.
fn tagged_files(root: &Path) -> Vec<String> {
    let mut policies: Vec<String> = std::fs::read_dir(root.join(POLICIES))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".policy"))
        .collect();
    policies.sort();
    let mut files = Vec::new();
    for policy in policies {
        let stem = policy.trim_end_matches(".policy").to_owned();
        files.push(policy);
        for data in ["catalog.yaml", "tenants.yaml"] {
            let file = format!("{stem}/{data}");
            if root.join(POLICIES).join(&file).is_file() {
                files.push(file);
            }
        }
    }
    files
}

/// Every tag in the tagged files.
fn tags(root: &Path, files: &[String]) -> Vec<Tag> {
    let mut tags = Vec::new();
    for (file_rank, file) in files.iter().enumerate() {
        let text = std::fs::read_to_string(root.join(POLICIES).join(file)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let yaml = file.ends_with(".yaml");
        for (index, line) in lines.iter().enumerate() {
            let Some(comment) = comment(line, yaml) else {
                continue;
            };
            for id in tags_in(comment) {
                let (first, last) = paragraph(&lines, index);
                let states_something = lines[first - 1..last]
                    .iter()
                    .any(|line| !line.trim_start().starts_with('#'));
                tags.push(Tag {
                    id,
                    file: file.clone(),
                    line: index + 1,
                    place: Place {
                        file_rank,
                        first,
                        last,
                    },
                    states_something,
                });
            }
        }
    }
    tags
}

/// A conformance test naming a rule it proves.
#[derive(Debug)]
struct TestTag {
    id: String,
    /// The policy file its test file is about, such as `ai-setu.policy`.
    policy_file: String,
    /// The test's file (relative to the package) and function.
    file: String,
    line: usize,
    function: String,
}

/// The conformance test files: `tests/conformance_<policy>.rs`, with `-` in
/// a policy's name written `_`; `conformance_doc.rs` is this file.
fn conformance_test_files(root: &Path, policy_files: &[String]) -> Vec<(String, String)> {
    policy_files
        .iter()
        .filter(|file| file.ends_with(".policy"))
        .map(|policy| {
            let stem = policy.trim_end_matches(".policy").replace('-', "_");
            (format!("tests/conformance_{stem}.rs"), policy.clone())
        })
        .filter(|(file, _)| root.join(file).is_file())
        .collect()
}

/// The rule tags of every conformance test: the ids in the comments between
/// the previous item and a test's `fn` line.
fn test_tags(root: &Path, files: &[(String, String)]) -> Vec<TestTag> {
    let mut tags = Vec::new();
    for (file, policy_file) in files {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let mut pending: Vec<(String, usize)> = Vec::new();
        // An ignored test proves nothing.
        let mut ignored = false;
        for (index, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if let Some(comment) = trimmed.strip_prefix("//") {
                pending.extend(tags_in(comment).into_iter().map(|id| (id, index + 1)));
            } else if trimmed.starts_with("#[ignore") {
                ignored = true;
            } else if trimmed.starts_with("#[") || trimmed.is_empty() {
                continue;
            } else if let Some(function) = function_name(trimmed) {
                let pending = std::mem::take(&mut pending);
                if std::mem::take(&mut ignored) {
                    continue;
                }
                for (id, line) in pending {
                    tags.push(TestTag {
                        id,
                        policy_file: policy_file.clone(),
                        file: file.clone(),
                        line,
                        function: function.clone(),
                    });
                }
            } else {
                pending.clear();
                ignored = false;
            }
        }
    }
    tags
}

/// The name of the function a line declares (`async fn x(` or `fn x(`).
fn function_name(line: &str) -> Option<String> {
    let rest = line
        .strip_prefix("pub ")
        .unwrap_or(line)
        .strip_prefix("async ")
        .unwrap_or(line.strip_prefix("pub ").unwrap_or(line));
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(name[..end].to_owned())
}

/// The Tests cell: the tests that name the row, in file order.
fn tests_cell(functions: &[String]) -> String {
    if functions.is_empty() {
        NONE.to_owned()
    } else {
        functions
            .iter()
            .map(|function| format!("`{function}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The cells of a table line, trimmed; `\|` stays inside its cell.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push_str("\\|");
                chars.next();
            }
            '|' => cells.push(String::new()),
            _ => cells.last_mut().unwrap().push(c),
        }
    }
    cells.iter().map(|cell| cell.trim().to_owned()).collect()
}

/// A section heading's seed name and policy file:
/// "## Noirdoc (`noirdoc-….txt` → `noirdoc.policy`)" gives ("Noirdoc",
/// "noirdoc.policy").
fn section(heading: &str) -> Option<(String, String)> {
    let (seed, rest) = heading.split_once(" (")?;
    let (_, policy) = rest.split_once("→ `")?;
    let (policy, _) = policy.split_once('`')?;
    Some((seed.trim().to_owned(), policy.to_owned()))
}

/// The rows of the document, and problems with rows that cannot be read.
fn rows(lines: &[&str], problems: &mut Vec<String>) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut current: Option<(String, String)> = None;
    for (index, line) in lines.iter().enumerate() {
        if let Some(heading) = line.strip_prefix("## ") {
            current = section(heading);
            continue;
        }
        if !line.starts_with('|') {
            continue;
        }
        let cells = cells(line);
        if !is_rule_id(&cells[0]) {
            continue;
        }
        let Some((seed, policy_file)) = current.clone() else {
            problems.push(format!(
                "{DOC}:{}: row {} is outside a seed's section",
                index + 1,
                cells[0]
            ));
            continue;
        };
        let [id, rule, policy, tests, status] = match <[String; 5]>::try_from(cells) {
            Ok(cells) => cells,
            Err(cells) => {
                problems.push(format!(
                    "{DOC}:{}: row {} needs five cells (ID, Rule, Policy, Tests, Status), not {}",
                    index + 1,
                    cells[0],
                    cells.len()
                ));
                continue;
            }
        };
        rows.push(Row {
            line: index,
            id,
            rule,
            policy,
            tests,
            status,
            policy_file,
            seed,
        });
    }
    rows
}

/// The Policy cell the tags of one row call for.
fn policy_cell(places: &BTreeSet<Place>, files: &[String]) -> String {
    if places.is_empty() {
        return NONE.to_owned();
    }
    places
        .iter()
        .map(|place| {
            let file = &files[place.file_rank];
            if place.first == place.last {
                format!("{file}:{}", place.first)
            } else {
                format!("{file}:{}-{}", place.first, place.last)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether `file` (relative to `policies/`) belongs to `policy_file`: the
/// policy itself or one of its data files.
fn belongs_to(file: &str, policy_file: &str) -> bool {
    let stem = policy_file.trim_end_matches(".policy");
    file == policy_file || file.starts_with(&format!("{stem}/"))
}

/// The summary table's lines: per seed, its rows and how many have each
/// status (with the statuses as they will be written).
fn summary(rows: &[(&Row, String)]) -> Vec<String> {
    // Seed, rules, proven, expressed-only, out of scope.
    type Counts = (String, usize, usize, usize, usize);
    let mut seeds: Vec<Counts> = Vec::new();
    for (row, status) in rows {
        if seeds.last().is_none_or(|seed| seed.0 != row.seed) {
            seeds.push((row.seed.clone(), 0, 0, 0, 0));
        }
        let seed = seeds.last_mut().unwrap();
        seed.1 += 1;
        if status == PROVEN {
            seed.2 += 1;
        } else if status.starts_with(EXPRESSED_ONLY) {
            seed.3 += 1;
        } else if status.starts_with(OUT_OF_SCOPE) {
            seed.4 += 1;
        }
    }
    let mut lines = vec![
        "| Seed | Rules | proven | expressed-only | out of scope |".to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    for (seed, total, proven, expressed_only, out_of_scope) in &seeds {
        lines.push(format!(
            "| {seed} | {total} | {proven} | {expressed_only} | {out_of_scope} |"
        ));
    }
    let all = |pick: fn(&Counts) -> usize| -> usize { seeds.iter().map(pick).sum() };
    lines.push(format!(
        "| **All** | **{}** | **{}** | **{}** | **{}** |",
        all(|seed| seed.1),
        all(|seed| seed.2),
        all(|seed| seed.3),
        all(|seed| seed.4)
    ));
    lines
}

/// The lines (first, end) of the table under "## Summary".
fn summary_table(lines: &[&str]) -> Option<(usize, usize)> {
    let heading = lines.iter().position(|line| *line == "## Summary")?;
    let first = heading
        + lines[heading..]
            .iter()
            .position(|line| line.starts_with('|'))?;
    let end = first
        + lines[first..]
            .iter()
            .position(|line| !line.starts_with('|'))
            .unwrap_or(lines.len() - first);
    Some((first, end))
}

#[test]
fn conformance_table_matches_the_rule_tags_in_the_policies() {
    let root = Path::new(PACKAGE_ROOT);
    let bless = std::env::var("SWITCHYARD_BLESS").is_ok_and(|value| value == "1");
    let text = std::fs::read_to_string(root.join(DOC)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut problems = Vec::new();

    let rows = rows(&lines, &mut problems);
    let files = tagged_files(root);
    let tags = tags(root, &files);

    let mut ids = BTreeMap::new();
    for row in &rows {
        if let Some(earlier) = ids.insert(row.id.as_str(), row) {
            problems.push(format!(
                "{DOC}:{}: row {} is also on line {}",
                row.line + 1,
                row.id,
                earlier.line + 1
            ));
        }
    }

    let mut places: BTreeMap<&str, BTreeSet<Place>> = BTreeMap::new();
    for tag in &tags {
        let at = format!("{POLICIES}/{}:{}", tag.file, tag.line);
        match ids.get(tag.id.as_str()) {
            None => problems.push(format!("{at}: [{}] names no row of {DOC}", tag.id)),
            Some(row) if !belongs_to(&tag.file, &row.policy_file) => problems.push(format!(
                "{at}: [{}] is a rule of {}, not of this file's policy",
                tag.id, row.policy_file
            )),
            Some(_) if !tag.states_something => problems.push(format!(
                "{at}: [{}] tags a paragraph of comments only; put it above the statement",
                tag.id
            )),
            Some(_) => {
                places
                    .entry(tag.id.as_str())
                    .or_default()
                    .insert(tag.place.clone());
            }
        }
    }

    let test_files = conformance_test_files(root, &files);
    let mut proving: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let test_tags = test_tags(root, &test_files);
    for tag in &test_tags {
        let at = format!("{}:{}", tag.file, tag.line);
        match ids.get(tag.id.as_str()) {
            None => problems.push(format!("{at}: [{}] names no row of {DOC}", tag.id)),
            Some(row) if row.policy_file != tag.policy_file => problems.push(format!(
                "{at}: [{}] is a rule of {}, not of this file's policy",
                tag.id, row.policy_file
            )),
            Some(_) => {
                let functions = proving.entry(tag.id.as_str()).or_default();
                if !functions.contains(&tag.function) {
                    functions.push(tag.function.clone());
                }
            }
        }
    }

    let mut rewritten: Vec<String> = lines.iter().map(|line| (*line).to_owned()).collect();
    let mut stale = Vec::new();
    let no_places = BTreeSet::new();
    let no_tests = Vec::new();
    let mut statuses: Vec<(&Row, String)> = Vec::new();
    for row in &rows {
        let at = format!("{DOC}:{}", row.line + 1);
        let row_places = places.get(row.id.as_str()).unwrap_or(&no_places);
        let row_tests = proving.get(row.id.as_str()).unwrap_or(&no_tests);
        let out_of_scope =
            row.status.len() > OUT_OF_SCOPE.len() && row.status.starts_with(OUT_OF_SCOPE);
        // The status the tags call for; a reason written by hand is kept.
        let status = if out_of_scope {
            row.status.clone()
        } else if !row_tests.is_empty() {
            PROVEN.to_owned()
        } else if row.status.len() > EXPRESSED_ONLY.len() && row.status.starts_with(EXPRESSED_ONLY)
        {
            row.status.clone()
        } else {
            NOT_YET_TESTED.to_owned()
        };
        if row.status.contains("MISSING") {
            problems.push(format!("{at}: {} is MISSING", row.id));
        } else if out_of_scope {
            if !row_places.is_empty() || !row_tests.is_empty() {
                problems.push(format!(
                    "{at}: {} is out of scope, but it is tagged in {}{}",
                    row.id,
                    policy_cell(row_places, &files),
                    if row_tests.is_empty() {
                        ""
                    } else {
                        " and in tests"
                    }
                ));
            }
        } else if row_places.is_empty() {
            problems.push(format!(
                "{at}: {} is not out of scope, but no policy or data file tags it",
                row.id
            ));
        } else if ![PROVEN, EXPRESSED_ONLY, "expressed"]
            .iter()
            .any(|known| row.status.starts_with(known))
        {
            problems.push(format!(
                "{at}: {} has status {:?}; use `{PROVEN}`, `{EXPRESSED_ONLY}REASON` or `{OUT_OF_SCOPE}REASON`",
                row.id, row.status
            ));
        }
        let expected_policy = policy_cell(row_places, &files);
        let expected_tests = tests_cell(row_tests);
        if row.policy != expected_policy || row.tests != expected_tests || row.status != status {
            stale.push(format!(
                "{at}: {} should read | {expected_policy} | {expected_tests} | {status} |",
                row.id
            ));
            rewritten[row.line] = format!(
                "| {} | {} | {} | {} | {} |",
                row.id, row.rule, expected_policy, expected_tests, status
            );
        }
        statuses.push((row, status));
    }

    let expected_summary = summary(&statuses);
    match summary_table(&lines) {
        None => problems.push(format!("{DOC}: no table under \"## Summary\"")),
        Some((first, end)) => {
            if lines[first..end] != expected_summary {
                stale.push(format!(
                    "{DOC}:{}: the summary should read\n{}",
                    first + 1,
                    expected_summary.join("\n")
                ));
                rewritten.splice(first..end, expected_summary);
            }
        }
    }

    if bless {
        if !stale.is_empty() {
            let mut out = rewritten.join("\n");
            out.push('\n');
            std::fs::write(root.join(DOC), out).unwrap();
        }
    } else if !stale.is_empty() {
        stale.push(format!(
            "run `SWITCHYARD_BLESS=1 cargo test --test conformance_doc` to rewrite {DOC}"
        ));
        problems.extend(stale);
    }

    assert!(
        problems.is_empty(),
        "{DOC} disagrees with the rule tags in {POLICIES}/:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_tag_is_read_from_comments_only_and_stands_for_its_paragraph() {
    assert_eq!(comment(r#"  "x" = "a # b" # [N1]"#, false), Some(" [N1]"));
    assert_eq!(comment(r#"  key: "${A#B}"  # [G2]"#, true), Some(" [G2]"));
    assert_eq!(comment("  url: http://x/#y", true), None);
    assert_eq!(
        tags_in(" \"quote\" [N25] [N26] [`/auto`](/routing) [x1]"),
        ["N25", "N26"]
    );
    let lines = ["a", "", "# [N1]", "b", "c", "", "d"];
    assert_eq!(paragraph(&lines, 2), (3, 5));
    assert_eq!(paragraph(&lines, 0), (1, 1));
    assert_eq!(paragraph(&lines, 6), (7, 7));
    assert!(is_rule_id("A102") && !is_rule_id("A") && !is_rule_id("12") && !is_rule_id("Ab1"));
    assert_eq!(
        cells(r"| N1 | a \| b | `x.policy:1-2` | `t` | proven |"),
        ["N1", r"a \| b", "`x.policy:1-2`", "`t`", "proven"]
    );
    assert_eq!(
        function_name("async fn n27_three_attempts() {"),
        Some("n27_three_attempts".to_owned())
    );
    assert_eq!(function_name("fn helper(x: u8)"), Some("helper".to_owned()));
    assert_eq!(function_name("let x = 1;"), None);
}
