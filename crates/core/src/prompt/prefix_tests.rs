//! Prefix reuse against cold encoding: conversations fed turn by turn (issue 26, "growing conversations
//! cost only their new turn": the incremental plan equals a cold one, byte for byte), and random texts
//! that extend or diverge from earlier ones.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::{json, Value as Json};

use super::PromptModel;
use crate::plan::{block_keys, seed, tokenize_chat};
use crate::request::{Endpoint, Request};

/// The seeded multilingual corpus of mmrouter-tokenize's tests (prose, code, CJK, emoji, special tokens).
#[path = "../../../tokenize/tests/tokenize/common/corpus.rs"]
mod corpus;

/// What a plan is made of: the rendered text, its ids and their block keys; or the error's text.
type Planned = Result<(String, Vec<u32>, Vec<u64>), String>;

fn plan(model: &PromptModel, request: &Json, placeholder: &str) -> Planned {
    let body = serde_json::to_vec(request).unwrap();
    let parsed = Request::parse(Endpoint::Chat, &body).map_err(|e| format!("{e:?}"))?;
    let tokens = tokenize_chat(model, &parsed, placeholder, &Default::default()).map_err(|e| e.to_string())?;
    let keys = block_keys(&tokens.ids, &[], 16, seed("m", None, None));
    Ok((tokens.text, tokens.ids, keys))
}

/// A model with its own empty caches (the bundled instance is shared by every test).
fn cold(model: &PromptModel) -> PromptModel {
    model.with_overrides(None, None).unwrap()
}

/// Plans each request with `warm` (kept across calls) and with a cold copy; both must agree exactly.
/// Returns how many of them `warm` served from a kept prefix.
fn check_turns(warm: &PromptModel, requests: &[Json], placeholder: &str, what: &str) -> usize {
    let mut hits = 0;
    for (turn, request) in requests.iter().enumerate() {
        let before = warm.inner.segments.prefix_hits();
        let got = plan(warm, request, placeholder);
        let want = plan(&cold(warm), request, placeholder);
        assert!(got == want, "{what}, turn {turn}: the warm plan differs from a cold one");
        hits += warm.inner.segments.prefix_hits() - before;
    }
    hits
}

fn text(r: &mut corpus::Rng, bytes: usize) -> String {
    let mix = if r.chance(0.5) { corpus::Mix::Realistic } else { corpus::Mix::Adversarial };
    corpus::document(r, bytes, mix)
}

fn text_in(r: &mut corpus::Rng, lo: usize, hi: usize) -> String {
    let bytes = r.range(lo, hi);
    text(r, bytes)
}

/// An assistant reply: plain, with reasoning (a field, or inline `<think>` as some clients resend
/// it), or a tool call followed by its result.
fn reply(r: &mut corpus::Rng) -> Vec<Json> {
    let content = text_in(r, 20, 1500);
    match r.below(4) {
        0 => vec![json!({"role": "assistant", "content": content})],
        1 => vec![json!({"role": "assistant", "content": content, "reasoning_content": text(r, 300)})],
        2 => vec![json!({"role": "assistant", "content": format!("<think>\n{}\n</think>\n\n{content}", text(r, 200))})],
        _ => vec![
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "search", "arguments": json!({"q": text(r, 40)}).to_string()}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": text_in(r, 50, 800)}),
        ],
    }
}

/// The requests a multi-turn client sends: a shared system prompt, then each turn the whole history
/// (earlier user turns and replies) plus one new user turn.
fn conversation(seed: u64, turns: usize, system: &str) -> Vec<Json> {
    let mut r = corpus::Rng::new(seed);
    let tools = r.chance(0.3).then(|| json!([{"type": "function", "function": {"name": "search",
        "description": "Searches the web.", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]));
    let kwargs = r.chance(0.3).then(|| json!({"enable_thinking": false}));
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut requests = Vec::new();
    for turn in 0..turns {
        if turn > 0 {
            messages.extend(reply(&mut r));
        }
        messages.push(json!({"role": "user", "content": text_in(&mut r, 10, 2500)}));
        let mut request = json!({"model": "m", "messages": messages});
        if let Some(t) = &tools {
            request["tools"] = t.clone();
        }
        if let Some(k) = &kwargs {
            request["chat_template_kwargs"] = k.clone();
        }
        requests.push(request);
    }
    requests
}

/// A Qwen3-style template: reasoning is kept only for assistant turns after the last user query, so a
/// new user turn re-renders the previous ones without it and the common prefix ends turns earlier.
const QWEN3_STYLE: &str = r#"{%- set ns = namespace(last_query=messages|length - 1, multi_step=true) %}
{%- for message in messages|reverse %}{%- set index = messages|length - 1 - loop.index0 %}
{%- if ns.multi_step and message.role == "user" %}{%- set ns.multi_step = false %}{%- set ns.last_query = index %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- set content = message.content if message.content is string else '' %}
{%- if message.role == "user" or message.role == "system" %}{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- elif message.role == "assistant" %}
{%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' %}
{%- if loop.index0 > ns.last_query and reasoning %}{{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content }}
{%- else %}{{- '<|im_start|>assistant\n' + content }}{%- endif %}
{%- if message.tool_calls %}{%- for call in message.tool_calls %}{{- '\n<tool_call>\n' + call.function.arguments | tojson + '\n</tool_call>' }}{%- endfor %}{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}{{- '<|im_start|>user\n<tool_response>\n' + content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"#;

/// An agent loop under [`QWEN3_STYLE`]: user, then assistant (with reasoning) / tool rounds, each
/// request the history so far; then a new user turn, which drops every reasoning of the loop.
fn agent_loop(seed: u64, system: &str) -> Vec<Json> {
    let mut r = corpus::Rng::new(seed);
    let mut messages =
        vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": text(&mut r, 400)})];
    let mut requests = vec![json!({"messages": messages})];
    for round in 0..4 {
        let call = json!({"id": format!("c{round}"), "type": "function",
            "function": {"name": "run", "arguments": json!({"cmd": text(&mut r, 30)}).to_string()}});
        messages
            .push(json!({"role": "assistant", "content": text(&mut r, 100), "reasoning_content": text(&mut r, 300),
            "tool_calls": [call]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("c{round}"), "content": text(&mut r, 500)}));
        requests.push(json!({"messages": messages}));
    }
    messages.push(json!({"role": "assistant", "content": text(&mut r, 200), "reasoning_content": text(&mut r, 200)}));
    messages.push(json!({"role": "user", "content": text(&mut r, 300)}));
    requests.push(json!({"messages": messages}));
    requests
}

const QWEN_PAD: &str = "<|image_pad|>";

const SYSTEM: &str = "You are a meticulous assistant for a multilingual engineering team. Answer in the \
    user's language; quote code in fenced blocks (```rust … ```), keep tables aligned, and say so when \
    unsure. Ünïcödé, 東京, Привет, مرحبا — all welcome.\n\nRules:\n1. Be brief.\n2. Cite sources.\n";

#[test]
fn conversations_fed_turn_by_turn_plan_as_cold() {
    let warm = cold(&PromptModel::bundled("qwen3-vl").unwrap());
    assert!(warm.inner.segments.splits());
    for seed in 0..6 {
        let requests = conversation(seed, 8, &SYSTEM.repeat(4));
        let hits = check_turns(&warm, &requests, QWEN_PAD, &format!("conversation {seed}"));
        // Every turn after the second starts with the previous one's prompt, kept because it had a
        // history (the first turn, a one-off until answered, is not kept).
        assert!(hits >= requests.len() - 2, "conversation {seed}: {hits} prefix hits");
    }
    // Conversations without tools or template kwargs render only their new turns (`resume`).
    assert!(warm.resumed_renders() >= 6, "{} resumed renders", warm.resumed_renders());
}

#[test]
fn reasoning_dropped_from_earlier_turns_still_reuses_the_common_prefix() {
    let base = PromptModel::bundled("qwen3-vl").unwrap();
    let warm = base.with_overrides(Some(QWEN3_STYLE), None).unwrap();
    for seed in 0..3 {
        let requests = agent_loop(100 + seed, &SYSTEM.repeat(4));
        for request in &requests {
            if let Err(e) = plan(&cold(&warm), request, QWEN_PAD) {
                panic!("the template renders: {e}");
            }
        }
        let hits = check_turns(&warm, &requests, QWEN_PAD, &format!("agent loop {seed}"));
        assert!(hits >= requests.len() - 2, "agent loop {seed}: {hits} prefix hits");
    }
}

fn parity_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity")
}

/// Each corpus chat with more than one message, as a client sends it turn by turn: the request cut
/// after each message that is not an assistant's, then the request as it is.
fn corpus_turns() -> Vec<(String, Vec<Json>)> {
    let corpus: Json = serde_json::from_slice(&std::fs::read(parity_dir().join("chats.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for chat in corpus["chats"].as_array().unwrap() {
        let request = &chat["request"];
        let messages = request["messages"].as_array().unwrap();
        if messages.len() < 2 {
            continue;
        }
        let mut turns: Vec<Json> = (1..messages.len())
            .filter(|&n| messages[n - 1]["role"] != "assistant")
            .map(|n| {
                let mut turn = request.clone();
                turn["messages"] = Json::Array(messages[..n].to_vec());
                turn
            })
            .collect();
        turns.push(request.clone());
        out.push((chat["name"].as_str().unwrap().to_owned(), turns));
    }
    out
}

/// The corpus chats turn by turn, after a long shared system prompt (so that every prompt is long
/// enough to be kept), on the bundled models and the fixture models whose tokenizers are split.
#[test]
fn corpus_chats_fed_turn_by_turn_plan_as_cold() {
    let mut models: Vec<(&str, PromptModel, &str)> =
        ["qwen3-vl", "qwen2.5-vl"].iter().map(|n| (*n, PromptModel::bundled(n).unwrap(), QWEN_PAD)).collect();
    for (family, placeholder) in [("gemma3", "<start_of_image>"), ("internvl3", "<image>"), ("llama4", "<|image|>")] {
        let model = PromptModel::from_dir(&parity_dir().join("models").join(family)).unwrap();
        assert!(model.inner.segments.splits(), "{family}");
        models.push((family, model, placeholder));
    }
    let system = SYSTEM.repeat(4);
    for (name, model, placeholder) in &models {
        let warm = cold(model);
        let mut hits = 0;
        for (chat, mut turns) in corpus_turns() {
            for turn in &mut turns {
                let messages = turn["messages"].as_array_mut().unwrap();
                messages.insert(0, json!({"role": "system", "content": system}));
            }
            hits += check_turns(&warm, &turns, placeholder, &format!("{name}: {chat}"));
        }
        assert!(hits > 20, "{name}: {hits} prefix hits");
        eprintln!("{name}: {} resumed renders", warm.resumed_renders());
    }
}

use super::segments::tests::PIECES;

/// Texts built from earlier ones: each takes some pieces of a previous text (or none) and adds new
/// ones, so it extends it, or diverges from it after a common prefix.
fn texts(steps: &[(usize, usize, Vec<usize>)]) -> Vec<String> {
    let mut pieces: Vec<Vec<usize>> = Vec::new();
    for (parent, keep, added) in steps {
        let mut p = match pieces.len() {
            0 => Vec::new(),
            n => pieces[parent % n].clone(),
        };
        p.truncate(p.len() * keep / 8);
        p.extend(added);
        pieces.push(p);
    }
    pieces.iter().map(|p| p.iter().map(|&i| PIECES[i]).collect()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn texts_extending_or_diverging_encode_as_whole(
        steps in prop::collection::vec((0..16usize, 0..=8usize, prop::collection::vec(0..PIECES.len(), 0..40)), 1..10)
    ) {
        let base = PromptModel::bundled("qwen3-vl").unwrap();
        let tok = base.tokenizer();
        // The production encoder and the `tokenizers`-only one, each kept across the texts.
        for model in [cold(&base), base.with_hf_tokenizer_only()] {
            for text in texts(&steps) {
                let whole = tok.encode_fast(text.as_str(), false).unwrap().get_ids().to_vec();
                prop_assert_eq!(model.encode(&text).unwrap(), whole);
            }
        }
    }
}

#[test]
fn a_text_extending_an_earlier_one_reuses_its_prefix() {
    let model = cold(&PromptModel::bundled("qwen3-vl").unwrap());
    let tok = model.tokenizer();
    let turn = |n: usize| format!("<|im_start|>user\n{} {n}<|im_end|>\n", PIECES[8].repeat(16));
    let first = format!("{}{}<|im_start|>assistant\n", turn(1), turn(2));
    let second = format!("{}{}{}<|im_start|>assistant\n", turn(1), turn(2), turn(3));
    // Diverges inside the second turn: the common prefix ends after the first.
    let third = format!("{}{}<|im_start|>assistant\n", turn(1), turn(4));
    for (text, hits) in [(&first, 0), (&second, 1), (&third, 2), (&second, 3)] {
        let whole = tok.encode_fast(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(model.encode(text).unwrap(), whole);
        assert_eq!(model.inner.segments.prefix_hits(), hits);
    }
}

/// A one-off prompt (no assistant turn, extending nothing kept) is not kept: its extension finds no
/// prefix. A chat with an assistant turn is, and so is whatever extends a kept prompt.
#[test]
fn only_conversations_are_kept_for_later_prefixes() {
    let model = cold(&PromptModel::bundled("qwen3-vl").unwrap());
    let long = PIECES[8].repeat(30);
    let chat = |turns: &[(&str, &str)]| {
        let messages: Vec<_> = turns.iter().map(|(r, c)| serde_json::json!({"role": r, "content": c})).collect();
        serde_json::to_vec(&serde_json::json!({ "messages": messages })).unwrap()
    };
    let plan = |body: Vec<u8>| {
        let req = crate::request::Request::parse(crate::request::Endpoint::Chat, &body).unwrap();
        model.chat_ids(&req, &Default::default()).unwrap();
    };
    plan(chat(&[("system", &long), ("user", "one")]));
    plan(chat(&[("system", &long), ("user", "one"), ("assistant", "ok"), ("user", "two")]));
    assert_eq!(model.inner.segments.prefix_hits(), 0, "the one-off first turn was not kept");
    plan(chat(&[
        ("system", &long),
        ("user", "one"),
        ("assistant", "ok"),
        ("user", "two"),
        ("assistant", "ok"),
        ("user", "3"),
    ]));
    assert_eq!(model.inner.segments.prefix_hits(), 1, "the second turn had a history: kept");
}

/// An added token that extends another (`<|im_end|>` + more) can match across the end of a kept prefix
/// in a new text: the prefix reused must end far enough before the checkpoint that the split there
/// cannot change.
#[test]
fn a_longer_added_token_across_the_prefix_end_is_not_cut() {
    use super::prefix::CHECKPOINT_BYTES;
    use super::segments::SegmentEncoder;
    let mut tok = PromptModel::bundled("qwen3-vl").unwrap().tokenizer().clone();
    tok.add_special_tokens([tokenizers::AddedToken::from("<|im_end|>\n<|im_start|>", true)]).unwrap();
    let enc = SegmentEncoder::new(&tok, None);
    assert!(enc.splits());
    // `<|im_end|>` ends 4 bytes before the first checkpoint, which both texts share; only the second
    // goes on to complete the longer token.
    let head = format!("{}<|im_end|>\n<|im_st", "a".repeat(CHECKPOINT_BYTES - 14));
    let first = format!("{head}{}", "x".repeat(2 * CHECKPOINT_BYTES));
    let second = format!("{head}art|>{}", "y".repeat(2 * CHECKPOINT_BYTES));
    for text in [&first, &second] {
        let whole = tok.encode_fast(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(enc.encode(&tok, text, true).unwrap(), whole);
    }
}
