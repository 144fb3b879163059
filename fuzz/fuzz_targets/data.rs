//! Catalog and tenants YAML → data loader and both diagnostic renderers.
//!
//! Input format: catalog bytes, a 0 byte, tenants bytes (no 0 byte: the
//! tenants file is empty). Seeds are made this way by fuzz/seed.sh.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard::data::load_texts;
use switchyard::diagnostics::render::{self, Style};
use switchyard::source::SourceMap;

fuzz_target!(|bytes: &[u8]| {
    let (catalog, tenants) = match bytes.iter().position(|&b| b == 0) {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, &[][..]),
    };
    let catalog = String::from_utf8_lossy(catalog);
    let tenants = String::from_utf8_lossy(tenants);
    let mut sources = SourceMap::new();
    let (_data, diagnostics) = load_texts(&catalog, &tenants, &mut sources);
    for diagnostic in &diagnostics {
        let _ = render::human(diagnostic, &sources, Style::Plain);
    }
    let _ = render::json(&diagnostics, &sources);
});
