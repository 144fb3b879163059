//! The policy language: grammar-driven parsing into a syntax tree, and the
//! checker that resolves and type-checks it against the data schema.

pub mod ast;
pub mod parse;
