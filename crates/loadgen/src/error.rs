//! Typed errors of the load and workload generators.

use std::path::PathBuf;

/// Why a workload could not be generated or loaded, or a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    #[error("--{option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: invalid workload line: {reason}")]
    WorkloadLine { path: PathBuf, line: usize, reason: String },
    #[error("{path}: the workload holds no request")]
    EmptyWorkload { path: PathBuf },
    #[error("--images-dir {path}: no PNG/JPEG/WebP file found")]
    NoImages { path: PathBuf },
    #[error("--url {url}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("building the HTTP client: {0}")]
    Client(String),
}

impl LoadgenError {
    /// Stable snake_case label of the error kind.
    pub fn label(&self) -> &'static str {
        match self {
            LoadgenError::InvalidOption { .. } => "invalid_option",
            LoadgenError::Read { .. } => "read_failed",
            LoadgenError::Write { .. } => "write_failed",
            LoadgenError::WorkloadLine { .. } => "workload_line",
            LoadgenError::EmptyWorkload { .. } => "empty_workload",
            LoadgenError::NoImages { .. } => "no_images",
            LoadgenError::BadUrl { .. } => "bad_url",
            LoadgenError::Client(_) => "client_build",
        }
    }
}

/// Why one request of a run failed (the report counts failures by these labels, or by status).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("timed out")]
    Timeout,
    #[error("connect failed: {0}")]
    Connect(String),
    #[error("transport error: {0}")]
    Transport(String),
}

impl RequestError {
    /// Stable snake_case label of the failure kind.
    pub fn label(&self) -> &'static str {
        match self {
            RequestError::Status(_) => "http_status",
            RequestError::Timeout => "timeout",
            RequestError::Connect(_) => "connect",
            RequestError::Transport(_) => "transport",
        }
    }

    /// Key under which the report counts this failure: `http_<code>` for statuses, else the label.
    pub fn report_key(&self) -> String {
        match self {
            RequestError::Status(code) => format!("http_{code}"),
            other => other.label().to_string(),
        }
    }

    pub(crate) fn from_reqwest(e: &reqwest::Error) -> RequestError {
        if e.is_timeout() {
            RequestError::Timeout
        } else if e.is_connect() {
            RequestError::Connect(e.to_string())
        } else {
            RequestError::Transport(e.to_string())
        }
    }
}
