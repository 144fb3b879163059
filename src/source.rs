//! Source files and positions shared by every stage that reports diagnostics.

use std::io::Read;
use std::ops::Range;
use std::path::Path;

/// The largest file any command reads as text: policies, data, requests,
/// health states, test cases and scenarios. A path to a device such as
/// `/dev/zero` is refused at this size instead of filling memory.
pub const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;

/// Reads a UTF-8 text file of at most `limit` bytes, without a leading
/// byte-order mark (some editors on Windows write one, and it is not part
/// of the text). Past the limit it stops reading and answers an error of
/// kind `FileTooLarge`; a file that is not UTF-8, one of kind `InvalidData`.
pub fn read_text(path: &Path, limit: usize) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("it is larger than {} MiB", limit >> 20),
        ));
    }
    let mut text = String::from_utf8(bytes).map_err(|error| {
        // Where, as an editor counts: lines, and bytes within the line.
        let valid = error
            .as_bytes()
            .get(..error.utf8_error().valid_up_to())
            .unwrap_or_default();
        let line = valid.iter().filter(|byte| **byte == b'\n').count() + 1;
        let column = valid.len()
            - valid
                .iter()
                .rposition(|byte| *byte == b'\n')
                .map_or(0, |at| at + 1)
            + 1;
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is not UTF-8 text (line {line}, byte {column} of the line, is not)"),
        )
    })?;
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    Ok(text)
}

/// Opening a named pipe waits for a writer, which may never come, and
/// reading a terminal waits for its user. For a file that is read again
/// and again (a served policy and its data files, at every reload) a check
/// would hang, and so would every reload after it: such files are refused
/// before they are opened, as anything but a regular file. A file given
/// once on the command line may be a pipe (`--request /dev/stdin`).
pub fn refuse_special_file(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let kind = std::fs::metadata(path)?.file_type();
        let what = if kind.is_fifo() {
            "a named pipe"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else {
            return Ok(());
        };
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {what}, not a file"),
        ))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// A byte range inside one source file.
///
/// Spans compare equal regardless of position so that syntax trees built from
/// differently formatted text compare equal; code that needs positions reads
/// `start` and `end` directly.
#[derive(Clone, Copy, Debug, Default, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl PartialEq for Span {
    fn eq(&self, _other: &Span) -> bool {
        true
    }
}

impl std::hash::Hash for Span {
    fn hash<H: std::hash::Hasher>(&self, _state: &mut H) {}
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }

    pub fn range(self) -> Range<usize> {
        self.start..self.end
    }

    pub fn shifted(self, by: usize) -> Span {
        Span::new(self.start + by, self.end + by)
    }
}

/// Identifies one file in a [`SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(usize);

/// A file's text and where its lines start.
#[derive(Debug)]
pub struct SourceFile {
    pub name: String,
    pub text: String,
    /// Computed on first use: only diagnostics need them, and a large data
    /// file that checks clean never does.
    line_starts: std::sync::OnceLock<Vec<usize>>,
}

impl SourceFile {
    fn new(name: String, text: String) -> SourceFile {
        SourceFile {
            name,
            text,
            line_starts: std::sync::OnceLock::new(),
        }
    }

    fn line_starts(&self) -> &[usize] {
        self.line_starts.get_or_init(|| {
            std::iter::once(0)
                .chain(self.text.match_indices('\n').map(|(at, _)| at + 1))
                .collect()
        })
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = self.clamp_to_char_boundary(offset);
        let line_starts = self.line_starts();
        let line_index = match line_starts.binary_search(&offset) {
            Ok(index) => index,
            Err(index) => index.saturating_sub(1),
        };
        let line_start = line_starts.get(line_index).copied().unwrap_or(0);
        let column = self
            .text
            .get(line_start..offset)
            .map_or(0, |prefix| prefix.chars().count());
        (line_index + 1, column + 1)
    }

    /// Byte offset of a 1-based line and character column; clamped to the text.
    pub fn offset_of(&self, line: usize, column: usize) -> usize {
        let Some(&line_start) = self.line_starts().get(line.saturating_sub(1)) else {
            return self.text.len();
        };
        let line_text = self.text.get(line_start..).unwrap_or("");
        let within = line_text
            .char_indices()
            .take_while(|(_, c)| *c != '\n')
            .nth(column.saturating_sub(1))
            .map_or_else(
                || line_text.find('\n').unwrap_or(line_text.len()),
                |(at, _)| at,
            );
        line_start + within
    }

    fn clamp_to_char_boundary(&self, offset: usize) -> usize {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        offset
    }
}

/// Every file a run has read, so diagnostics can quote any of them.
#[derive(Debug, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn new() -> SourceMap {
        SourceMap::default()
    }

    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> SourceId {
        self.files.push(SourceFile::new(name.into(), text.into()));
        SourceId(self.files.len() - 1)
    }

    /// The file behind an id this map handed out.
    pub fn file(&self, id: SourceId) -> Option<&SourceFile> {
        self.files.get(id.0)
    }

    /// The file at a position in the order files were added.
    pub fn file_at(&self, index: usize) -> Option<&SourceFile> {
        self.files.get(index)
    }

    pub fn name(&self, id: SourceId) -> &str {
        self.file(id).map_or("<unknown>", |file| file.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_files_are_read_up_to_a_limit_without_a_byte_order_mark() {
        let dir = std::env::temp_dir().join(format!("switchyard-read-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("text");
        std::fs::write(&file, "\u{feff}policy p {}").unwrap();
        assert_eq!(read_text(&file, 100).unwrap(), "policy p {}");
        std::fs::write(&file, "0123456789").unwrap();
        assert_eq!(read_text(&file, 10).unwrap(), "0123456789");
        let error = read_text(&file, 9).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::FileTooLarge);
        if cfg!(unix) {
            let endless = read_text(Path::new("/dev/zero"), 1 << 20).unwrap_err();
            assert_eq!(endless.to_string(), "it is larger than 1 MiB");
        }
        std::fs::write(&file, b"\xff\xfe").unwrap();
        let error = read_text(&file, 100).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("line 1, byte 1 "), "{error}");
        std::fs::write(&file, b"a: 1\nname: caf\xe9\n").unwrap();
        let error = read_text(&file, 100).unwrap_err();
        assert!(error.to_string().contains("line 2, byte 10 "), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_pipe_a_socket_or_a_device_is_refused_before_it_is_opened() {
        let dir = std::env::temp_dir().join(format!("switchyard-read-pipe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pipe = dir.join("tenants.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .unwrap();
        assert!(made.success());
        // Opened, this would wait for a writer for ever.
        let error = refuse_special_file(&pipe).unwrap_err();
        assert_eq!(error.to_string(), "it is a named pipe, not a file");
        let socket = dir.join("catalog.yaml");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let error = refuse_special_file(&socket).unwrap_err();
        assert_eq!(error.to_string(), "it is a socket, not a file");
        let error = refuse_special_file(Path::new("/dev/null")).unwrap_err();
        assert_eq!(error.to_string(), "it is a character device, not a file");
        let file = dir.join("policy");
        std::fs::write(&file, "x").unwrap();
        assert!(refuse_special_file(&file).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn line_and_column_are_one_based_and_count_characters() {
        let mut map = SourceMap::new();
        let id = map.add("x", "ab\ncäd\n");
        let file = map.file(id).unwrap();
        assert_eq!(file.line_col(0), (1, 1));
        assert_eq!(file.line_col(3), (2, 1));
        assert_eq!(file.line_col(6), (2, 3));
        assert_eq!(file.offset_of(2, 3), 6);
        assert_eq!(file.offset_of(9, 1), file.text.len());
    }

    #[test]
    fn spans_are_out_of_equality() {
        assert_eq!(Span::new(1, 2), Span::new(5, 9));
        assert_eq!(Span::new(1, 2).to(Span::new(5, 9)).range(), 1..9);
    }
}
