//! The doctor's requests to a worker: each answer read chunk by chunk up to a cap chosen for what the
//! request expects (refused at the cap, never buffered whole first), each request whole — connect,
//! headers and the last body byte — within the per-request timeout, so a worker that drips its answer
//! costs that timeout and no more. JSON answers are parsed into the few typed fields the checks read,
//! never into a `serde_json::Value` (a tree of small nodes many times the size of its text). Errors
//! are findings for the report, not crashes.

use std::time::Duration;

use serde::de::DeserializeOwned;

/// What a request expects back, and so the most of it that is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A small JSON document: `/health`, `/version`, `/server_info`, `/v1/models`, a one-token chat.
    Json,
    /// A Prometheus text page (vLLM's is tens of KiB).
    Metrics,
    /// vLLM's render answer: the prompt's token ids and the processed probe image's features.
    Render,
}

impl Expect {
    /// The cap, in bytes: a few times what an honest worker sends.
    pub const fn cap(self) -> usize {
        match self {
            Expect::Json => 1 << 20,
            Expect::Metrics => 4 << 20,
            Expect::Render => 16 << 20,
        }
    }
}

/// Why a request to a worker gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0}")]
    Transport(String),
    #[error("answer larger than {} MiB (read stopped there)", .cap >> 20)]
    TooLarge { cap: usize },
    #[error("no whole answer within {0:?}")]
    TimedOut(Duration),
    /// A non-2xx answer, as its excerpt.
    #[error("{0}")]
    Status(String),
    #[error("HTTP {status}: not the JSON expected ({reason})")]
    NotJson { status: u16, reason: String },
}

pub struct WorkerHttp {
    client: reqwest::Client,
    base: String,
    timeout: Duration,
}

/// A worker's answer: its status and body.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as `T` (unknown fields skipped without being kept).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| HttpError::NotJson { status: self.status, reason: e.to_string() })
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The start of the body, for a report line.
    pub fn excerpt(&self) -> String {
        let text = String::from_utf8_lossy(&self.body[..self.body.len().min(200)]).into_owned();
        format!("HTTP {}: {}", self.status, text.trim())
    }
}

impl WorkerHttp {
    pub fn new(base: &str, timeout: Duration) -> anyhow::Result<WorkerHttp> {
        // The timeout is ours (`read`), over the whole exchange, so its error says what happened.
        let client = mmrouter_core::http_client_builder().build()?;
        Ok(WorkerHttp { client, base: base.trim_end_matches('/').to_owned(), timeout })
    }

    pub async fn get(&self, path: &str, expect: Expect) -> Result<Answer, HttpError> {
        self.read(self.client.get(format!("{}{path}", self.base)), expect).await
    }

    pub async fn post(&self, path: &str, body: Vec<u8>, expect: Expect) -> Result<Answer, HttpError> {
        let req =
            self.client.post(format!("{}{path}", self.base)).header("content-type", "application/json").body(body);
        self.read(req, expect).await
    }

    /// A 2xx JSON answer as `T`, or why not.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, HttpError> {
        let answer = self.get(path, Expect::Json).await?;
        if !answer.is_success() {
            return Err(HttpError::Status(answer.excerpt()));
        }
        answer.parse()
    }

    async fn read(&self, req: reqwest::RequestBuilder, expect: Expect) -> Result<Answer, HttpError> {
        tokio::time::timeout(self.timeout, read_capped(req, expect.cap()))
            .await
            .unwrap_or(Err(HttpError::TimedOut(self.timeout)))
    }
}

/// Sends `req` and reads its answer, stopping at `cap` bytes.
async fn read_capped(req: reqwest::RequestBuilder, cap: usize) -> Result<Answer, HttpError> {
    let transport = |e: reqwest::Error| HttpError::Transport(crate::upstream::error_chain(&e));
    let mut resp = req.send().await.map_err(transport)?;
    let status = resp.status().as_u16();
    // A declared length over the cap is refused before a byte of the body is read.
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(HttpError::TooLarge { cap });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > cap {
            return Err(HttpError::TooLarge { cap });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Answer { status, body })
}
