//! A streamed Responses answer, as vLLM 0.32 streams one without parsers: `response.created` and
//! `response.in_progress` at once (the response `in_progress`, no output, no usage); after the first
//! token `response.output_item.added` (the message `in_progress`) and `response.content_part.added`;
//! one `response.output_text.delta` per token; then `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done` and `response.completed` with the whole
//! response and its usage (stored when asked). Each event is `event: <type>\ndata: <json>\n\n` with
//! its `sequence_number` counting from 0; the stream ends without `[DONE]`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};

use super::job::{message_item, new_id, output_text, Job};
use crate::error::SimError;
use crate::server::{AppState, Turn};

pub(super) fn response(state: Arc<AppState>, job: Job, turn: Turn) -> Response {
    let events = Events { state, item_id: new_id("msg"), job, turn, seq: 0, cached: 0, step: Step::Open };
    let stream = futures_util::stream::unfold(events, |mut e| async move {
        let item = e.next().await?;
        Some((item, e))
    });
    ([(CONTENT_TYPE, "text/event-stream"), (CACHE_CONTROL, "no-cache")], Body::from_stream(stream)).into_response()
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Open,
    Prefill,
    Token(u32),
    Close,
    Finished,
}

/// The state of one streamed answer; dropping it (client gone) releases what its turn holds.
struct Events {
    state: Arc<AppState>,
    job: Job,
    turn: Turn,
    item_id: String,
    seq: u64,
    cached: u32,
    step: Step,
}

impl Events {
    async fn next(&mut self) -> Option<Result<Bytes, SimError>> {
        let result = self.advance().await;
        if result.as_ref().is_some_and(Result::is_err) {
            self.step = Step::Finished;
        }
        result
    }

    async fn advance(&mut self) -> Option<Result<Bytes, SimError>> {
        match self.step {
            Step::Open => {
                self.step = Step::Prefill;
                let opening = self.job.response("in_progress", Vec::new(), Value::Null);
                let mut out = BytesMut::new();
                out.extend_from_slice(&self.event("response.created", json!({"response": opening})));
                out.extend_from_slice(&self.event("response.in_progress", json!({"response": opening})));
                Some(Ok(out.freeze()))
            }
            Step::Prefill => {
                self.cached = match self.turn.prefill(&self.job.prompt).await {
                    Ok(cached) => cached,
                    Err(e) => return Some(Err(e)),
                };
                self.step = Step::Token(0);
                let item = json!({"item": message_item(&self.item_id, "", "in_progress"), "output_index": 0});
                let part = json!({
                    "content_index": 0, "item_id": self.item_id, "output_index": 0,
                    "part": output_text("", json!([])),
                });
                let mut out = BytesMut::new();
                out.extend_from_slice(&self.event("response.output_item.added", item));
                out.extend_from_slice(&self.event("response.content_part.added", part));
                match self.token(0).await {
                    Ok(delta) => out.extend_from_slice(&delta),
                    Err(e) => return Some(Err(e)),
                }
                Some(Ok(out.freeze()))
            }
            Step::Token(i) => Some(self.token(i).await),
            Step::Close => {
                self.step = Step::Finished;
                self.turn.finish();
                Some(Ok(self.close()))
            }
            Step::Finished => None,
        }
    }

    /// Output token `i`'s delta event.
    async fn token(&mut self, i: u32) -> Result<Bytes, SimError> {
        self.turn.token(i, self.job.drop_at).await?;
        let next = i.saturating_add(1);
        self.step = if next >= self.job.tokens() { Step::Close } else { Step::Token(next) };
        let delta = json!({
            "content_index": 0, "delta": self.job.pieces[i as usize], "item_id": self.item_id,
            "logprobs": [], "output_index": 0,
        });
        Ok(self.event("response.output_text.delta", delta))
    }

    /// The closing events, the last one the whole response (kept in the store when asked for).
    fn close(&mut self) -> Bytes {
        let text = self.job.text();
        let text_done = json!({
            "content_index": 0, "item_id": self.item_id, "logprobs": [], "output_index": 0, "text": text,
        });
        let part_done = json!({
            "content_index": 0, "item_id": self.item_id, "output_index": 0, "part": output_text(&text, Value::Null),
        });
        let item = message_item(&self.item_id, &text, "completed");
        let usage = self.job.usage(self.cached, self.state.opts.usage_drift);
        let response = self.job.response(self.job.status(), vec![item.clone()], usage);
        self.job.keep(&self.state, &response);
        let mut out = BytesMut::new();
        out.extend_from_slice(&self.event("response.output_text.done", text_done));
        out.extend_from_slice(&self.event("response.content_part.done", part_done));
        out.extend_from_slice(&self.event("response.output_item.done", json!({"item": item, "output_index": 0})));
        out.extend_from_slice(&self.event("response.completed", json!({"response": response})));
        out.freeze()
    }

    /// One SSE event of `kind`: `fields`, then its `sequence_number` and `type` (the order pydantic
    /// writes them in).
    fn event(&mut self, kind: &str, mut fields: Value) -> Bytes {
        fields["sequence_number"] = json!(self.seq);
        fields["type"] = json!(kind);
        self.seq += 1;
        Bytes::from(format!("event: {kind}\ndata: {fields}\n\n"))
    }
}
