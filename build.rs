//! Bundles every file under `policies/` into the binary, so that
//! `switchyard demo` can serve a shipped policy from any directory. What the
//! demo serves is data (`policies/demo.yaml`), not code.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn files_under(dir: &Path, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files_under(&path, found)?;
        } else {
            found.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let policies = root.join("policies");
    println!("cargo:rerun-if-changed=policies");
    let mut files = Vec::new();
    files_under(&policies, &mut files)?;
    files.sort();
    let mut source = String::from("&[\n");
    for file in files {
        let relative = file
            .strip_prefix(&policies)?
            .to_string_lossy()
            .replace('\\', "/");
        println!("cargo:rerun-if-changed={}", file.display());
        writeln!(
            source,
            "    ({relative:?}, include_str!({:?})),",
            file.to_string_lossy()
        )?;
    }
    source.push_str("]\n");
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("shipped_policies.rs");
    std::fs::write(out, source)?;
    Ok(())
}
