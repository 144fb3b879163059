//! Building responses to clients.

use super::body::ProxyBody;
use super::header_names;
use super::wire;
use crate::data::WireFormat;
use crate::evaluate::ErrorResponse;
use hyper::ext::ReasonPhrase;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::Value as Json;

/// Adds headers, skipping any a policy computed that HTTP cannot carry.
pub fn with_headers(
    mut response: Response<ProxyBody>,
    headers: &[(String, String)],
) -> Response<ProxyBody> {
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A response with the request id set.
pub fn base(
    status: u16,
    request_id: &str,
    content_type: &'static str,
    body: ProxyBody,
) -> Response<ProxyBody> {
    let mut response = Response::new(body);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    *response.status_mut() = status;
    if status.canonical_reason().is_none() {
        // hyper writes `<none>` for a status it has no name for (a
        // provider's 529, a policy's 460).
        response
            .extensions_mut()
            .insert(ReasonPhrase::from_static(reason_of_unnamed(status)));
    }
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(value) = HeaderValue::from_str(request_id) {
        response
            .headers_mut()
            .insert(header_names::REQUEST_ID, value);
    }
    response
}

/// The reason phrase of a status without a standard one.
fn reason_of_unnamed(status: StatusCode) -> &'static [u8] {
    match status.as_u16() {
        529 => b"Overloaded",
        _ if status.is_client_error() => b"Client Error",
        _ if status.is_server_error() => b"Server Error",
        _ => b"Unknown",
    }
}

pub fn json(status: u16, request_id: &str, body: &Json) -> Response<ProxyBody> {
    base(
        status,
        request_id,
        "application/json",
        ProxyBody::full(body.to_string()),
    )
}

/// The error object in the caller's wire format, with `Retry-After` when
/// the error has one and the policy's headers.
pub fn error(
    wire: WireFormat,
    request_id: &str,
    error: &ErrorResponse,
    headers: &[(String, String)],
) -> Response<ProxyBody> {
    let body = wire::error_body(wire, request_id, error);
    let mut response = json(error.status, request_id, &body);
    for (name, value) in error.advice_headers() {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(name), value);
        }
    }
    with_headers(response, headers)
}

/// An error the proxy itself raises (authentication, limits, routing).
pub fn builtin_error(
    wire: WireFormat,
    request_id: &str,
    status: u16,
    code: &str,
    message: &str,
) -> Response<ProxyBody> {
    let error = ErrorResponse {
        status,
        code: code.to_string(),
        message: message.to_string(),
        error_type: crate::evaluate::default_type(status).to_string(),
        retry_after_secs: None,
        should_retry: None,
    };
    self::error(wire, request_id, &error, &[])
}
