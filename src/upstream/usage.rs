//! Reads a worker's answer as it streams past, without buffering SSE streams whole: the prompt tokens
//! its `usage` reports (for the drift metric) — a chat's or completion's `usage.prompt_tokens`, a
//! Responses answer's `usage.input_tokens` (non-streamed, or in its `response.completed` event's
//! `response`) — and, when asked, a Responses answer's `id` (the top-level `id`, or the first
//! event's `response.id`, which is `response.created`'s).

use std::borrow::Cow;

/// What the watch found once the answer has ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Watched {
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` (Responses: `input_tokens_details`), for traces.
    pub cached_tokens: Option<u64>,
    /// The answer's id (only when watched for): a Responses answer's, for the pinning of follow-ups.
    pub response_id: Option<String>,
}

/// Finds usage (and the id) in a response as it streams past.
pub struct UsageWatch {
    kind: Kind,
    want_id: bool,
    id: Option<String>,
}

enum Kind {
    /// Non-stream JSON: keep a bounded copy and parse it at the end.
    Json { buf: Vec<u8>, overflow: bool },
    /// SSE: scan complete `data:` lines; remember the last usage seen.
    Sse { line: Vec<u8>, last: Option<u64>, last_cached: Option<u64> },
}

/// A non-stream answer larger than this is not inspected (it is still relayed whole).
const MAX_JSON_WATCH: usize = 8 << 20;
/// An SSE line longer than this is not inspected (a Responses stream's `response.completed` event
/// repeats the whole output: an answer of about 250 000 tokens reports no usage).
const MAX_SSE_LINE: usize = 1 << 20;

/// The parts of an answer (or of one streamed event) read here.
#[derive(serde::Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    usage: Option<UsageTokens>,
    /// A Responses event's response (`response.created`, `response.completed`, …).
    #[serde(borrow)]
    response: Option<Inner<'a>>,
}

#[derive(serde::Deserialize)]
struct Inner<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    usage: Option<UsageTokens>,
}

#[derive(serde::Deserialize)]
struct UsageTokens {
    /// Chat and completions.
    prompt_tokens: Option<u64>,
    /// Responses.
    input_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    input_tokens_details: Option<Details>,
}

#[derive(serde::Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

impl UsageTokens {
    fn prompt(&self) -> Option<u64> {
        self.prompt_tokens.or(self.input_tokens)
    }

    fn cached(&self) -> Option<u64> {
        self.prompt_tokens_details.as_ref().or(self.input_tokens_details.as_ref()).and_then(|d| d.cached_tokens)
    }
}

impl UsageWatch {
    /// A watch over an SSE stream or a JSON body; `want_id`: also keep the answer's id.
    pub fn new(sse: bool, want_id: bool) -> Self {
        let kind = if sse {
            Kind::Sse { line: Vec::new(), last: None, last_cached: None }
        } else {
            Kind::Json { buf: Vec::new(), overflow: false }
        };
        UsageWatch { kind, want_id, id: None }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.kind {
            Kind::Json { buf, overflow } => {
                if !*overflow && buf.len() + chunk.len() <= MAX_JSON_WATCH {
                    buf.extend_from_slice(chunk);
                } else {
                    *overflow = true;
                    buf.clear();
                }
            }
            Kind::Sse { line, last, last_cached } => {
                for part in chunk.split_inclusive(|&b| b == b'\n') {
                    if line.len() + part.len() <= MAX_SSE_LINE {
                        line.extend_from_slice(part);
                    }
                    if part.ends_with(b"\n") {
                        let want_id = self.want_id && self.id.is_none();
                        let (usage, id) = sse_line(line, want_id);
                        *last = usage.map(|u| u.0).or(*last);
                        *last_cached = usage.and_then(|u| u.1).or(*last_cached);
                        self.id = self.id.take().or(id);
                        line.clear();
                    }
                }
            }
        }
    }

    /// What the answer reported (call once, at its end).
    pub fn finish(&mut self) -> Watched {
        let want_id = self.want_id;
        match &mut self.kind {
            Kind::Json { buf, overflow } => {
                if *overflow {
                    return Watched::default();
                }
                let Ok(a) = serde_json::from_slice::<Answer>(buf) else { return Watched::default() };
                let prompt_tokens = a.usage.as_ref().and_then(UsageTokens::prompt);
                let cached_tokens = a.usage.as_ref().and_then(UsageTokens::cached);
                let response_id = a.id.filter(|_| want_id).map(Cow::into_owned);
                Watched { prompt_tokens, cached_tokens, response_id }
            }
            Kind::Sse { line, last, last_cached } => {
                let (usage, id) = sse_line(line, want_id && self.id.is_none());
                let (prompt_tokens, cached_tokens) =
                    (usage.map(|u| u.0).or(*last), usage.and_then(|u| u.1).or(*last_cached));
                Watched { prompt_tokens, cached_tokens, response_id: self.id.take().or(id) }
            }
        }
    }
}

/// One SSE line's usage (prompt tokens, cached tokens) and (when wanted) its event's `response.id`.
fn sse_line(line: &[u8], want_id: bool) -> (Option<(u64, Option<u64>)>, Option<String>) {
    let Some(data) = line.strip_prefix(b"data:") else { return (None, None) };
    // Cheap pre-checks: most events carry neither.
    let has = |needle: &[u8]| data.windows(needle.len()).any(|w| w == needle);
    let worth_reading = has(b"\"usage\"") || (want_id && has(b"\"response\""));
    if !worth_reading {
        return (None, None);
    }
    let Ok(a) = serde_json::from_slice::<Answer>(data.trim_ascii()) else { return (None, None) };
    let inner = a.response.as_ref();
    let usage = a.usage.as_ref().or(inner.and_then(|r| r.usage.as_ref()));
    let usage = usage.and_then(|u| Some((u.prompt()?, u.cached())));
    let id = inner.and_then(|r| r.id.as_deref()).filter(|_| want_id).map(str::to_owned);
    (usage, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch_cut(body: &[u8], sse: bool, want_id: bool) -> Vec<Watched> {
        (0..body.len())
            .map(|cut| {
                let mut w = UsageWatch::new(sse, want_id);
                w.feed(&body[..cut]);
                w.feed(&body[cut..]);
                w.finish()
            })
            .collect()
    }

    #[test]
    fn usage_from_json_split_anywhere() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":42,"completion_tokens":3}}"#;
        for w in watch_cut(body, false, false) {
            assert_eq!(w, Watched { prompt_tokens: Some(42), cached_tokens: None, response_id: None });
        }
    }

    #[test]
    fn usage_from_sse_split_anywhere() {
        let body = b"data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7}}\n\ndata: [DONE]\n\n";
        for w in watch_cut(body, true, false) {
            assert_eq!(w.prompt_tokens, Some(7));
        }
        let mut w = UsageWatch::new(true, false);
        w.feed(b"data: {\"choices\":[],\"usage\":null}\n\ndata: [DONE]\n\n");
        assert_eq!(w.finish(), Watched::default());
    }

    #[test]
    fn cached_tokens_from_a_chats_usage_whole_and_streamed() {
        let usage = r#"{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}"#;
        let json = format!(r#"{{"id":"x","usage":{usage}}}"#);
        let sse = format!("data: {{\"choices\":[]}}\n\ndata: {{\"choices\":[],\"usage\":{usage}}}\n\ndata: [DONE]\n\n");
        for (body, stream) in [(json, false), (sse, true)] {
            for w in watch_cut(body.as_bytes(), stream, false) {
                assert_eq!((w.prompt_tokens, w.cached_tokens), (Some(40), Some(32)), "{body}");
            }
        }
    }

    #[test]
    fn a_responses_answer_gives_its_input_tokens_and_id() {
        let body = br#"{"id":"resp_0a1b","object":"response","output":[],"usage":{"input_tokens":31,"input_tokens_details":{"cached_tokens":16},"output_tokens":5}}"#;
        for w in watch_cut(body, false, true) {
            assert_eq!(
                w,
                Watched { prompt_tokens: Some(31), cached_tokens: Some(16), response_id: Some("resp_0a1b".into()) }
            );
        }
        let mut w = UsageWatch::new(false, false);
        w.feed(body);
        assert_eq!(w.finish().response_id, None, "the id is kept only when asked for");
    }

    #[test]
    fn a_responses_stream_gives_the_created_id_and_the_completed_usage() {
        let body = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_first\",\"usage\":null}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n",
            "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"id\":\"resp_other\"}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_first\",\"usage\":{\"input_tokens\":12,\"output_tokens\":2}}}\n\n",
        )
        .as_bytes();
        for w in watch_cut(body, true, true) {
            assert_eq!(
                w,
                Watched { prompt_tokens: Some(12), cached_tokens: None, response_id: Some("resp_first".into()) }
            );
        }
    }

    #[test]
    fn an_oversized_line_is_not_read() {
        let mut w = UsageWatch::new(true, true);
        let pad = "x".repeat(MAX_SSE_LINE);
        w.feed(format!("data: {{\"pad\":\"{pad}\",\"response\":{{\"id\":\"resp_1\"}}}}\n\n").as_bytes());
        assert_eq!(w.finish(), Watched::default());
    }
}
