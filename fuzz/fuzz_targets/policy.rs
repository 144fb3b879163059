//! Policy text → parser, checker (against the Noirdoc data) and both
//! diagnostic renderers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;
use switchyard::data::{Data, load_texts};
use switchyard::diagnostics::render::{self, Style};
use switchyard::language::check_text_with_data;
use switchyard::source::SourceMap;

const CATALOG: &str = include_str!("../../policies/noirdoc/catalog.yaml");
const TENANTS: &str = include_str!("../../policies/noirdoc/tenants.yaml");

static DATA: LazyLock<Data> = LazyLock::new(|| {
    let (data, diagnostics) = load_texts(CATALOG, TENANTS, &mut SourceMap::new());
    data.unwrap_or_else(|| panic!("the Noirdoc data does not load: {diagnostics:#?}"))
});

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    // The same source ids as when DATA was loaded (catalog 0, tenants 1), so
    // labels the checker puts on data files render against the right text;
    // the policy is added after them by check_text_with_data.
    let mut sources = SourceMap::new();
    sources.add("catalog.yaml", CATALOG);
    sources.add("tenants.yaml", TENANTS);
    let diagnostics = check_text_with_data(&mut sources, "fuzz.policy", &text, &DATA);
    for diagnostic in &diagnostics {
        let _ = render::human(diagnostic, &sources, Style::Plain);
    }
    let _ = render::json(&diagnostics, &sources);
});
