//! Switchyard: routing policies as data for LLM API gateways.
//!
//! The pipeline, one module each: [`language`] (parse, syntax tree, check),
//! [`data`] (catalog and tenants), and the command-line interface in [`cli`].

pub mod cli;
pub mod data;
pub mod diagnostics;
pub mod language;
pub mod source;
pub mod value;
