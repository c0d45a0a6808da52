//! Finds `usage.prompt_tokens` in a worker's answer as it streams past (for the drift metric), without
//! buffering SSE streams whole.

/// Finds `usage.prompt_tokens` in a response as it streams past, without buffering SSE streams whole.
pub enum UsageWatch {
    /// Non-stream JSON: keep a bounded copy and parse it at the end.
    Json { buf: Vec<u8>, overflow: bool },
    /// SSE: scan complete `data:` lines; remember the last usage seen.
    Sse { line: Vec<u8>, last: Option<u64> },
}

/// A non-stream answer larger than this is not inspected for usage (it is still relayed whole).
const MAX_JSON_WATCH: usize = 8 << 20;
const MAX_SSE_LINE: usize = 1 << 20;

#[derive(serde::Deserialize)]
struct UsageOnly {
    usage: Option<UsageTokens>,
}
#[derive(serde::Deserialize)]
struct UsageTokens {
    prompt_tokens: Option<u64>,
}

impl UsageWatch {
    pub fn new(sse: bool) -> Self {
        if sse {
            UsageWatch::Sse { line: Vec::new(), last: None }
        } else {
            UsageWatch::Json { buf: Vec::new(), overflow: false }
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        match self {
            UsageWatch::Json { buf, overflow } => {
                if !*overflow && buf.len() + chunk.len() <= MAX_JSON_WATCH {
                    buf.extend_from_slice(chunk);
                } else {
                    *overflow = true;
                    buf.clear();
                }
            }
            UsageWatch::Sse { line, last } => {
                for part in chunk.split_inclusive(|&b| b == b'\n') {
                    if line.len() + part.len() <= MAX_SSE_LINE {
                        line.extend_from_slice(part);
                    }
                    if part.ends_with(b"\n") {
                        if let Some(n) = sse_line_usage(line) {
                            *last = Some(n);
                        }
                        line.clear();
                    }
                }
            }
        }
    }

    pub fn finish(&mut self) -> Option<u64> {
        match self {
            UsageWatch::Json { buf, overflow } => {
                if *overflow {
                    return None;
                }
                let u: UsageOnly = serde_json::from_slice(buf).ok()?;
                u.usage?.prompt_tokens
            }
            UsageWatch::Sse { line, last } => sse_line_usage(line).or(*last),
        }
    }
}

fn sse_line_usage(line: &[u8]) -> Option<u64> {
    let data = line.strip_prefix(b"data:")?;
    // Cheap pre-check: most chunks carry no usage.
    if !data.windows(7).any(|w| w == b"\"usage\"") {
        return None;
    }
    let u: UsageOnly = serde_json::from_slice(data.trim_ascii()).ok()?;
    u.usage?.prompt_tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_from_json_split_anywhere() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":42,"completion_tokens":3}}"#;
        for cut in 0..body.len() {
            let mut w = UsageWatch::new(false);
            w.feed(&body[..cut]);
            w.feed(&body[cut..]);
            assert_eq!(w.finish(), Some(42), "cut at {cut}");
        }
    }

    #[test]
    fn usage_from_sse_split_anywhere() {
        let body = b"data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7}}\n\ndata: [DONE]\n\n";
        for cut in 0..body.len() {
            let mut w = UsageWatch::new(true);
            w.feed(&body[..cut]);
            w.feed(&body[cut..]);
            assert_eq!(w.finish(), Some(7), "cut at {cut}");
        }
        let mut w = UsageWatch::new(true);
        w.feed(b"data: {\"choices\":[],\"usage\":null}\n\ndata: [DONE]\n\n");
        assert_eq!(w.finish(), None);
    }
}
