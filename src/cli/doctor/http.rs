//! The doctor's requests to a worker: bounded reads, a timeout per request, errors as text for the
//! report (a worker that answers badly is a finding, not a crash).

use std::time::Duration;

use serde_json::Value;

/// Largest answer read from a worker: a render answer carries the processed pixels.
const MAX_ANSWER_BYTES: usize = 64 << 20;

pub struct WorkerHttp {
    client: reqwest::Client,
    base: String,
}

/// A worker's answer: its status and body.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("HTTP {}: not JSON ({e})", self.status))
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
        let client = mmrouter_core::http_client_builder().timeout(timeout).build()?;
        Ok(WorkerHttp { client, base: base.trim_end_matches('/').to_owned() })
    }

    pub async fn get(&self, path: &str) -> Result<Answer, String> {
        self.read(self.client.get(format!("{}{path}", self.base))).await
    }

    pub async fn post(&self, path: &str, body: Vec<u8>) -> Result<Answer, String> {
        let req =
            self.client.post(format!("{}{path}", self.base)).header("content-type", "application/json").body(body);
        self.read(req).await
    }

    /// A 2xx JSON answer, or why not.
    pub async fn get_json(&self, path: &str) -> Result<Value, String> {
        let answer = self.get(path).await?;
        if !answer.is_success() {
            return Err(answer.excerpt());
        }
        answer.json()
    }

    async fn read(&self, req: reqwest::RequestBuilder) -> Result<Answer, String> {
        let mut resp = req.send().await.map_err(|e| crate::upstream::error_chain(&e))?;
        let status = resp.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| crate::upstream::error_chain(&e))? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(format!("answer over {MAX_ANSWER_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Answer { status, body })
    }
}
