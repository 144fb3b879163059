//! Switchyard: routing policies as data for LLM API gateways.
//!
//! The pipeline, one module each: [`language`] (parse, syntax tree, check),
//! [`data`] (catalog and tenants), [`compile`] (the immutable snapshot),
//! [`evaluate`] (the pure decision), [`state`] (health and capacity),
//! [`proxy`] (the HTTP server that executes decisions), [`sim`] (simulated
//! providers), and the command-line interface in [`cli`].

pub mod cli;
pub mod compile;
pub mod data;
pub mod diagnostics;
pub mod evaluate;
pub mod json_text;
pub mod language;
#[cfg(feature = "server")]
pub mod proxy;
#[cfg(feature = "server")]
pub mod reload;
#[cfg(feature = "server")]
pub mod sim;
pub mod source;
#[cfg(feature = "server")]
pub mod state;
pub mod sync;
pub mod value;
