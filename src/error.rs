//! OpenAI-shaped error responses: `{"error": {"message", "type", "param", "code"}}` (the OpenAI
//! SDKs read all four; `param` names the request field at fault, `null` when none is).
//!
//! Clients (the OpenAI SDKs, curl scripts) parse this shape; every error the proxy itself produces
//! goes through [`ApiError`] so none of them is plain text.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mmrouter_core::pipeline::Rejection;
use mmrouter_core::request::ParseError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI `type`, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// Stable machine-readable code, e.g. `upstream_timeout`.
    pub code: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, code, param: None }
    }
    /// The same error, naming the request field at fault.
    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", code, message)
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "body_too_large",
            format!("request body exceeds the limit of {limit} bytes (server.max_body_bytes)"),
        )
    }
    pub fn no_worker() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "no_healthy_worker",
            "no healthy worker is available to serve this request; retry later",
        )
    }
    /// No pool serves the request's `model` (OpenAI's answer for an unknown model).
    pub fn model_not_found(model: Option<&str>) -> Self {
        let message = match model {
            Some(m) => format!("The model `{m}` does not exist (GET /v1/models lists the models served here)."),
            None => "The request names no `model`; GET /v1/models lists the models served here.".to_owned(),
        };
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "model_not_found", message).with_param("model")
    }
    /// A LoRA adapter this pool knows but no worker in rotation lists now.
    pub fn adapter_not_served(adapter: &str) -> Self {
        let message = format!(
            "The model `{adapter}` (a LoRA adapter) is not loaded on any worker now (GET /v1/models lists what is served)."
        );
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "model_not_found", message).with_param("model")
    }
    /// A path (or method) the router does not serve.
    pub fn unknown_route(method: &str, path: &str) -> Self {
        let message = format!("Unknown request URL: {method} {path}. Please check the URL and method.");
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "unknown_url", message)
    }
    /// A failure inside the proxy itself (not the client's, not a worker's).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal_error", message)
    }
    pub fn body_json(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl From<ParseError> for ApiError {
    fn from(e: ParseError) -> Self {
        ApiError::bad_request("invalid_json", e.to_string())
    }
}

impl From<Rejection> for ApiError {
    fn from(e: Rejection) -> Self {
        ApiError::bad_request(e.label(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body_json())).into_response();
        resp.headers_mut().insert("x-mmrouter-error", HeaderValue::from_static(self.code));
        resp
    }
}
