//! One expression → expression parser (and the renderers for its diagnostics).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard::diagnostics::render::{self, Style};
use switchyard::language::parse::parse_expression;
use switchyard::source::SourceMap;

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    let mut sources = SourceMap::new();
    let id = sources.add("fuzz.expr", text.as_ref());
    let (_expr, diagnostics) = parse_expression(id, &text);
    for diagnostic in &diagnostics {
        let _ = render::human(diagnostic, &sources, Style::Plain);
    }
    let _ = render::json(&diagnostics, &sources);
});
