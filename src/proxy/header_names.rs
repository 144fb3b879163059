//! The header names the proxy reads or writes on every request, each built
//! once at compile time: a lookup by `&str` parses and validates the name
//! on every call, and `HeaderName::from_static` outside a constant does too.

use hyper::header::HeaderName;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const API_KEY: HeaderName = HeaderName::from_static("x-api-key");
pub const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
pub const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");
pub const OPENAI_BETA: HeaderName = HeaderName::from_static("openai-beta");
pub const POLICY_VERSION: HeaderName = HeaderName::from_static("x-switchyard-policy-version");
/// Where Anthropic's API and clients carry the request id.
pub const ANTHROPIC_REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
/// Whether a client should send the request again; the official OpenAI and
/// Anthropic SDKs obey it before their own retry rules.
pub const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
/// Retry-After in milliseconds, which the official SDKs prefer.
pub const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
