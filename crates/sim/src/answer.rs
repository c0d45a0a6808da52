//! What each choice of an answer says, token by token, and its OpenAI JSON in vLLM's shapes: whole
//! (`message` / `text`) or streamed (`delta` chunks, one choice per chunk), with `logprobs` (chat:
//! `content[]` entries `{token, logprob, bytes, top_logprobs}`; completions: the legacy
//! `tokens`/`token_logprobs`/`top_logprobs`/`text_offset` lists).
//!
//! Text is the deterministic word sequence, choice `c` starting `c` words further; JSON output and
//! tool-call arguments are cut into pieces of at most [`PIECE_CHARS`] characters, one token each, and
//! cut short with `"length"` when the token budget ends first (as a real engine's output would be).

use serde_json::{json, Value};

use crate::params::{Output, Params};

/// The deterministic "model output": token `i` of choice `c` is `WORDS[(i + c) % len]`.
const WORDS: [&str; 12] =
    ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and", "keeps", "running"];

/// Characters per token of structured output.
const PIECE_CHARS: usize = 4;

/// The endpoint an answer is shaped for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Chat,
    Completion,
}

/// Every choice of one answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub choices: Vec<Script>,
    /// `Some(k)`: logprobs with `k` alternatives per token.
    pub logprobs: Option<u32>,
    shape: Shape,
}

/// One choice: its tokens and how it ends.
#[derive(Debug)]
pub(crate) struct Script {
    pub index: u32,
    pub pieces: Vec<String>,
    pub finish_reason: &'static str,
    /// A tool call: the pieces are its arguments.
    call: Option<Call>,
}

#[derive(Debug)]
struct Call {
    id: String,
    name: String,
    content: Value,
}

/// The token budget: `tokens`, and whether the client set it (text then ends with `"length"`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// Text tokens: the client's limit, or the simulated model's own length.
    pub text: u32,
    pub text_finish: &'static str,
    /// Structured output stops by itself before this (the client's limit, else the sim's cap).
    pub cap: u32,
}

impl Answer {
    pub(crate) fn new(params: &Params, budget: Budget, shape: Shape) -> Answer {
        let choices = (0..params.n).map(|c| script(c, &params.output, budget)).collect();
        Answer { choices, logprobs: params.logprobs, shape }
    }

    /// Tokens of the longest choice: the choices decode side by side.
    pub(crate) fn longest(&self) -> u32 {
        self.choices.iter().map(|s| s.len()).max().unwrap_or(0)
    }

    /// Tokens of every choice together (`usage.completion_tokens`).
    pub(crate) fn tokens(&self) -> u32 {
        self.choices.iter().map(Script::len).fold(0, u32::saturating_add)
    }

    /// The `choices` entries of a whole answer.
    pub(crate) fn whole(&self) -> Vec<Value> {
        self.choices.iter().map(|s| self.whole_choice(s)).collect()
    }

    fn whole_choice(&self, s: &Script) -> Value {
        let text: String = s.pieces.concat();
        let logprobs = self.logprobs_of(s, 0..s.pieces.len());
        match self.shape {
            Shape::Completion => {
                json!({"index": s.index, "text": text, "logprobs": logprobs, "finish_reason": s.finish_reason})
            }
            Shape::Chat => {
                let message = match &s.call {
                    None => json!({"role": "assistant", "content": text}),
                    Some(call) => json!({
                        "role": "assistant",
                        "content": call.content,
                        "tool_calls": [{
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": text},
                        }],
                    }),
                };
                json!({"index": s.index, "message": message, "logprobs": logprobs, "finish_reason": s.finish_reason})
            }
        }
    }

    /// The first chunk's choice for every choice (chat only): the assistant role, as vLLM opens.
    pub(crate) fn openings(&self) -> Vec<Value> {
        let opening = |s: &Script| json!({"index": s.index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
        self.choices.iter().map(opening).collect()
    }

    /// The streamed choice entries for token `i`: one per choice that has it.
    pub(crate) fn step(&self, i: u32) -> Vec<Value> {
        self.choices.iter().filter(|s| i < s.len()).map(|s| self.step_choice(s, i as usize)).collect()
    }

    fn step_choice(&self, s: &Script, i: usize) -> Value {
        let piece = &s.pieces[i];
        let finish = (i + 1 == s.pieces.len()).then_some(s.finish_reason);
        let logprobs = self.logprobs_of(s, i..i + 1);
        let delta = match (self.shape, &s.call) {
            (Shape::Completion, _) => {
                return json!({"index": s.index, "text": piece, "logprobs": logprobs, "finish_reason": finish})
            }
            (Shape::Chat, None) => json!({"content": piece}),
            // vLLM names the call with its first arguments and streams the rest by index.
            (Shape::Chat, Some(call)) if i == 0 => json!({"tool_calls": [{
                "index": 0, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": piece},
            }]}),
            (Shape::Chat, Some(_)) => json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
        };
        json!({"index": s.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
    }

    /// `logprobs` for tokens `range` of `s`, or `null` when not asked for.
    fn logprobs_of(&self, s: &Script, range: std::ops::Range<usize>) -> Value {
        let Some(k) = self.logprobs else { return Value::Null };
        match self.shape {
            Shape::Chat => json!({"content": range.map(|i| chat_entry(s, i, k)).collect::<Vec<_>>()}),
            Shape::Completion => legacy(s, range, k),
        }
    }
}

impl Script {
    pub(crate) fn len(&self) -> u32 {
        u32::try_from(self.pieces.len()).unwrap_or(u32::MAX)
    }
}

fn script(c: u32, output: &Output, budget: Budget) -> Script {
    match output {
        Output::Text => {
            let pieces = (0..budget.text).map(|i| word(c, i)).collect();
            Script { index: c, pieces, finish_reason: budget.text_finish, call: None }
        }
        Output::Json(text) => {
            let (pieces, cut) = pieces(text, budget.cap);
            Script { index: c, pieces, finish_reason: if cut { "length" } else { "stop" }, call: None }
        }
        Output::Tool(t) => {
            let (pieces, cut) = pieces(&t.arguments, budget.cap);
            let call = Call { id: tool_call_id(), name: t.name.clone(), content: t.content.clone() };
            let finish_reason = if cut { "length" } else { t.finish_reason };
            Script { index: c, pieces, finish_reason, call: Some(call) }
        }
    }
}

/// Token `i` of choice `c`'s text.
pub(crate) fn word(c: u32, i: u32) -> String {
    let at = (u64::from(c) + u64::from(i)) % WORDS.len() as u64;
    let word = WORDS[at as usize];
    if i == 0 {
        word.to_owned()
    } else {
        format!(" {word}")
    }
}

/// `text` in pieces of at most [`PIECE_CHARS`] characters, at most `cap` of them; `true` when cut.
fn pieces(text: &str, cap: u32) -> (Vec<String>, bool) {
    let chars: Vec<char> = text.chars().collect();
    let all: Vec<String> = chars.chunks(PIECE_CHARS).map(|c| c.iter().collect()).collect();
    let cap = cap.max(1) as usize;
    let cut = all.len() > cap;
    (all.into_iter().take(cap).collect(), cut)
}

/// vLLM's id for a tool call: `chatcmpl-tool-` and 32 hex digits.
fn tool_call_id() -> String {
    format!("chatcmpl-tool-{:032x}", rand::random::<u128>())
}

/// The sampled token's logprob in hundredths: deterministic, between -1 and -46.
fn hundredths(s: &Script, i: usize) -> i64 {
    let step = (i * 7 + s.index as usize * 3) % 10;
    -1 - 5 * step as i64
}

/// Hundredths as a float that prints short (-0.36, not -0.36000000000000004).
fn decimal(hundredths: i64) -> f64 {
    hundredths as f64 / 100.0
}

fn logprob(s: &Script, i: usize) -> f64 {
    decimal(hundredths(s, i))
}

/// The `k` most likely tokens at position `i`: the sampled one, then alternatives that differ from it.
fn top(s: &Script, i: usize, k: u32) -> Vec<(String, f64)> {
    let piece = &s.pieces[i];
    let sampled = hundredths(s, i);
    let space = if piece.starts_with(' ') { " " } else { "" };
    let alternatives = (0..WORDS.len())
        .map(|j| format!("{space}{}", WORDS[(i + j + 1) % WORDS.len()]))
        .filter(|alt| alt != piece)
        .enumerate()
        .map(|(j, alt)| (alt, decimal(sampled - 100 - 50 * j as i64)));
    std::iter::once((piece.clone(), decimal(sampled))).chain(alternatives).take(k as usize).collect()
}

/// One `logprobs.content` entry of a chat choice.
fn chat_entry(s: &Script, i: usize, k: u32) -> Value {
    let entry = |token: &str, logprob: f64| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    let top: Vec<Value> = top(s, i, k).iter().map(|(t, lp)| entry(t, *lp)).collect();
    let mut e = entry(&s.pieces[i], logprob(s, i));
    e["top_logprobs"] = Value::Array(top);
    e
}

/// The completions endpoint's `logprobs` for tokens `range`.
fn legacy(s: &Script, range: std::ops::Range<usize>, k: u32) -> Value {
    let offset0: usize = s.pieces[..range.start].iter().map(|p| p.chars().count()).sum();
    let mut offsets = Vec::new();
    let mut at = offset0;
    for p in &s.pieces[range.clone()] {
        offsets.push(at);
        at += p.chars().count();
    }
    let tops: Vec<Value> = range
        .clone()
        .map(|i| Value::Object(top(s, i, k).into_iter().map(|(t, lp)| (t, json!(lp))).collect()))
        .collect();
    json!({
        "text_offset": offsets,
        "token_logprobs": range.clone().map(|i| logprob(s, i)).collect::<Vec<_>>(),
        "tokens": &s.pieces[range],
        "top_logprobs": tops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ToolCall;

    fn budget(text: u32, cap: u32) -> Budget {
        Budget { text, text_finish: "length", cap }
    }

    #[test]
    fn choices_differ_and_the_first_is_the_classic_text() {
        let params = Params { n: 2, logprobs: None, output: Output::Text };
        let a = Answer::new(&params, budget(3, 100), Shape::Chat);
        assert_eq!(a.choices[0].pieces.concat(), "The quick brown");
        assert_eq!(a.choices[1].pieces.concat(), "quick brown fox");
        assert_eq!((a.longest(), a.tokens()), (3, 6));
    }

    #[test]
    fn structured_output_is_cut_by_the_budget() {
        let json = r#"{"answer": "yes"}"#.to_owned();
        let whole = Answer::new(
            &Params { n: 1, logprobs: None, output: Output::Json(json.clone()) },
            budget(1, 100),
            Shape::Chat,
        );
        assert_eq!((whole.choices[0].pieces.concat(), whole.choices[0].finish_reason), (json.clone(), "stop"));
        let cut = Answer::new(&Params { n: 1, logprobs: None, output: Output::Json(json) }, budget(1, 2), Shape::Chat);
        assert_eq!((cut.choices[0].pieces.len(), cut.choices[0].finish_reason), (2, "length"));
    }

    #[test]
    fn top_logprobs_lead_with_the_sampled_token_and_are_distinct() {
        let params = Params { n: 1, logprobs: Some(5), output: Output::Text };
        let a = Answer::new(&params, budget(4, 100), Shape::Chat);
        for i in 0..4 {
            let top = top(&a.choices[0], i, 5);
            assert_eq!(top.len(), 5);
            assert_eq!(top[0].0, a.choices[0].pieces[i]);
            let mut names: Vec<&str> = top.iter().map(|(t, _)| t.as_str()).collect();
            names.dedup();
            assert_eq!(names.len(), 5);
            assert!(top.windows(2).all(|w| w[0].1 > w[1].1), "descending: {top:?}");
        }
    }

    #[test]
    fn a_tool_call_streams_its_name_first() {
        let call = ToolCall {
            name: "f".into(),
            arguments: r#"{"a":1}"#.into(),
            finish_reason: "tool_calls",
            content: Value::Null,
        };
        let a = Answer::new(&Params { n: 1, logprobs: None, output: Output::Tool(call) }, budget(1, 100), Shape::Chat);
        let first = &a.step(0)[0]["delta"]["tool_calls"][0];
        assert_eq!(first["function"]["name"], "f");
        assert!(first["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-tool-") && id.len() == 46));
        let last = &a.step(1)[0];
        assert_eq!(last["delta"]["tool_calls"][0].get("id"), None);
        assert_eq!(last["finish_reason"], "tool_calls");
    }
}
