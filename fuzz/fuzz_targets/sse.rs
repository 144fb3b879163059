//! A provider's stream → the proxy's server-sent-event reader
//! (`EventReader::push`) and classifier (`Event::meaning`, `Event::usage`,
//! `usage_of`). Needs the library's `server` feature:
//! `cargo fuzz run --features server sse ...`.
//!
//! Input format: one byte for the endpoint (modulo 5, in the order of
//! `Endpoint::ALL`: chat_completions, completions, embeddings, responses,
//! messages), then the stream, cut into the chunks given to `push` at every
//! 0xFF byte (which is never part of UTF-8 text, so real streams have none;
//! the 0xFF bytes themselves are dropped).
//!
//! Besides crashes, the target checks what the proxy relies on when it
//! forwards events: no byte is lost or reordered (the events' `raw` bytes
//! followed by `pending()` are exactly the bytes pushed), and the stream is
//! cut at every blank line and nowhere else: each event ends at the first
//! blank line in it, and no blank line is left in the pending bytes. A plain
//! search from the start of each event is the reference (the reader resumes
//! its search where the previous chunk ended). Each event means what its
//! data's JSON tree says (`Event::read_by_tree`), though `read` reads
//! only the members that tell it, wherever serde_json builds that tree
//! (`Event::tree_readable`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard::evaluate::Endpoint;
use switchyard::proxy::wire::{EventReader, usage_of};

/// Where the first blank line in `bytes` ends (`\n\n`, `\r\n\r\n` or
/// `\n\r\n`), by a plain search from the start.
fn first_blank_line_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|at| {
        let rest = bytes.get(at..)?;
        [&b"\n\n"[..], b"\r\n\r\n", b"\n\r\n"]
            .into_iter()
            .find(|blank| rest.starts_with(blank))
            .map(|blank| at + blank.len())
    })
}

fuzz_target!(|bytes: &[u8]| {
    let Some((&endpoint, stream)) = bytes.split_first() else {
        return;
    };
    let endpoint = Endpoint::ALL[usize::from(endpoint) % Endpoint::ALL.len()];
    let mut reader = EventReader::default();
    let mut pushed: Vec<u8> = Vec::with_capacity(stream.len());
    let mut received: Vec<u8> = Vec::with_capacity(stream.len());
    for chunk in stream.split(|&b| b == 0xFF) {
        pushed.extend_from_slice(chunk);
        let Ok(events) = reader.push(chunk) else {
            // An event over the reader's limit: the proxy gives up on the
            // stream here.
            return;
        };
        for event in events {
            assert!(
                first_blank_line_end(&event.raw) == Some(event.raw.len()),
                "an event does not end at its first blank line: {:?}",
                String::from_utf8_lossy(&event.raw)
            );
            received.extend_from_slice(&event.raw);
            assert!(
                !event.tree_readable()
                    || event.read(endpoint) == event.read_by_tree(endpoint),
                "the event is read otherwise than from its JSON tree: {:?}",
                event.data
            );
            let _ = event.usage();
            if let Ok(data) = serde_json::from_str::<serde_json::Value>(&event.data) {
                let _ = usage_of(&data);
            }
        }
    }
    assert!(
        first_blank_line_end(reader.pending()).is_none(),
        "a complete event was left pending: {:?}",
        String::from_utf8_lossy(reader.pending())
    );
    received.extend_from_slice(reader.pending());
    // A byte order mark that begins the stream is dropped.
    let expected = pushed.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&pushed);
    assert!(
        received == expected,
        "the events' bytes and the pending bytes are not the bytes pushed"
    );
});
