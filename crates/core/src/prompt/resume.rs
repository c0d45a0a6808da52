//! Growing conversations render only their new messages (issue 26 item 1).
//!
//! A multi-turn client resends the whole history each turn, and the chat template is re-interpreted
//! for every earlier message (at eight turns, a sixth of the router's CPU). When the router rendered
//! the conversation's previous request, it keeps that text without its generation prompt, keyed by a
//! digest of the messages it came from. The next request then renders only a short *stub* — the
//! first message (and, where the template needs it, the message before the new ones) followed by the
//! new messages — and splices:
//!
//! ```text
//! render(m[0..n]) = kept(m[0..k]) + (render(stub ++ m[k..n]) − render(stub, no generation prompt))
//! ```
//!
//! That identity is a property of the template, not of Jinja, so it is *established per template*
//! before it is used: the first request that could resume runs a battery of probe conversations
//! (system prompt or none, list content with images, reasoning fields and inline `<think>`, tool
//! calls and runs of tool results, agent loops that end on a tool result) and checks the identity at
//! every split point, separately for splits after a user message and after a tool result, with two
//! stub shapes; a kind of split is used only if every probe agreed exactly. The generation prompt
//! must be a constant suffix, also checked. The bundled Qwen3-VL template resumes after user and
//! tool messages with the first-message stub; a Qwen3-style template that shows reasoning only after
//! the last user query (the last message when there is none) needs the message before the split in
//! the stub; a template that numbers images across the conversation fails both and never resumes
//! (each in this module's tests).
//!
//! Only plain requests resume (no tools, documents, `chat_template_kwargs`, `reasoning_effort`,
//! `continue_final_message`, no developer messages, no clock-reading template, no images in string
//! content format, whose placeholders are numbered across the conversation). Every
//! [`VERIFY_EVERY`]-th resumed render is also rendered whole and compared: a difference turns
//! resuming off for the model for good, with a warning (ids would otherwise drift from the engine's).
//!
//! Bounded: two generations (`crate::generations`) of at most [`GENERATION_ENTRIES`] texts and
//! [`GENERATION_BYTES`] each. Only conversations under way (a request with an assistant message) are
//! kept, as `prefix.rs` keeps their ids, and a conversation holds one entry: a resumed turn's text
//! replaces the one it extended (a client interleaving thousands of conversations would otherwise
//! fill the generations with every turn of each, and evict the turns still to be extended).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde_json::Value as Json;
use xxhash_rust::xxh3::xxh3_128;

use super::PromptError;
use crate::generations::Generations;
use crate::request::{Endpoint, Entry, Message, Part, Request};

const GENERATION_ENTRIES: usize = 8192;
/// Rendered text per generation: at most 32 MiB in both, as many tokens' worth as `prefix.rs` keeps
/// ids for (a kept text is of no use once its ids are gone, and the other way round).
const GENERATION_BYTES: usize = 16 << 20;
/// One resumed render in this many is checked against a whole render.
pub(crate) const VERIFY_EVERY: u64 = 64;
/// Split points tried per request, newest first (a client resends its last request plus new turns).
const MAX_LOOKUPS: usize = 4;

/// Renders some messages of the request being planned with its template (`true`: with the
/// generation prompt).
pub(crate) type Render<'r> = dyn Fn(&[&Message], bool) -> Result<String, PromptError> + 'r;

/// The stub rendered in front of the new messages.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stub {
    /// The first message only: its rendering is kept too, so a resumed request renders once.
    First,
    /// The first message and the one just before the new ones (templates that look back, such as
    /// Qwen3's last-user-query rule or templates that check that roles alternate).
    FirstAndBefore,
}

/// What the probes established for one template.
#[derive(Debug)]
struct Plan {
    stub: Stub,
    /// Roles after which a split is exact (of `user`, `tool`).
    after: Vec<&'static str>,
    /// What `add_generation_prompt` appends (a constant suffix).
    generation: String,
}

#[derive(Default)]
pub(crate) struct Resume {
    plan: OnceLock<Option<Plan>>,
    kept: Mutex<Option<Generations<Arc<str>>>>,
    disabled: AtomicBool,
    resumed: AtomicU64,
}

impl Resume {
    /// One that never resumes (for comparisons in benchmarks).
    pub(crate) fn off() -> Resume {
        Resume { disabled: AtomicBool::new(true), ..Resume::default() }
    }

    /// The whole text of `messages` (a plain request, see the module doc) with the generation prompt:
    /// resumed from a kept prefix when one is kept and the template allows it, else rendered whole.
    /// Keeps the text for the conversation's next turn. `images`: whether the model's content format
    /// lets image parts resume (see [`probe`]).
    pub(crate) fn render(
        &self,
        messages: &[Message],
        images: bool,
        render: &Render<'_>,
    ) -> Result<String, PromptError> {
        let whole = || render(&messages.iter().collect::<Vec<_>>(), true);
        // Without a reply there is nothing to resume (every split is before an assistant message)
        // and nothing to keep: no digests either.
        let replied = messages.len() >= 3 && messages.iter().any(|m| m.role() == Some("assistant"));
        if !replied || self.disabled.load(Ordering::Relaxed) {
            return whole();
        }
        let Some(plan) = self.plan.get_or_init(|| probe(render, images)) else {
            return whole();
        };
        let digests = prefix_digests(messages);
        let (text, resumed_from) = match self.resume(plan, messages, &digests, render) {
            Some((text, from)) => (self.verified(text, messages, render)?, Some(from)),
            None => (whole()?, None),
        };
        if let Some(body) = text.strip_suffix(plan.generation.as_str()) {
            // The conversation moved on: its next turn extends this text, not the one resumed.
            self.keep(digests[messages.len() - 1], body, resumed_from);
        }
        Ok(text)
    }

    /// How many renders were resumed from a kept prefix.
    pub(crate) fn resumed(&self) -> u64 {
        self.resumed.load(Ordering::Relaxed)
    }

    /// The text resumed, and the key of the kept text it extends.
    fn resume(
        &self,
        plan: &Plan,
        messages: &[Message],
        digests: &[u128],
        render: &Render<'_>,
    ) -> Option<(String, u128)> {
        let splits = (2..messages.len()).rev().filter(|&k| {
            messages[k].role() == Some("assistant") && plan.after.iter().any(|r| messages[k - 1].role() == Some(r))
        });
        for k in splits.take(MAX_LOOKUPS) {
            let Some(prefix) = self.get(digests[k - 1]) else { continue };
            let text = splice(plan.stub, messages, k, &prefix, render, |first| self.first(first, digests[0], render));
            if text.is_some() {
                self.resumed.fetch_add(1, Ordering::Relaxed);
            }
            return text.map(|t| (t, digests[k - 1]));
        }
        None
    }

    /// A resumed text, checked against a whole render once in [`VERIFY_EVERY`].
    fn verified(&self, text: String, messages: &[Message], render: &Render<'_>) -> Result<String, PromptError> {
        if self.resumed.load(Ordering::Relaxed) % VERIFY_EVERY != 1 {
            return Ok(text);
        }
        let whole = render(&messages.iter().collect::<Vec<_>>(), true)?;
        if whole != text {
            self.disabled.store(true, Ordering::Relaxed);
            tracing::warn!(
                "a resumed chat render differed from a whole one: conversations are rendered whole from now on"
            );
        }
        Ok(whole)
    }

    /// The kept rendering of the first message alone (rendered and kept on a miss).
    fn first(&self, first: &Message, digest: u128, render: &Render<'_>) -> Option<Arc<str>> {
        if let Some(text) = self.get(digest) {
            return Some(text);
        }
        let text: Arc<str> = render(&[first], false).ok()?.into();
        self.keep(digest, &text, None);
        Some(text)
    }

    fn get(&self, key: u128) -> Option<Arc<str>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner).as_mut()?.get(key)
    }

    /// Keeps `text` under `key`, dropping the entry under `superseded`.
    fn keep(&self, key: u128, text: &str, superseded: Option<u128>) {
        let text: Arc<str> = text.into();
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let gens =
            kept.get_or_insert_with(|| Generations::new(GENERATION_ENTRIES, GENERATION_BYTES, |t: &Arc<str>| t.len()));
        let old = superseded.map(|k| gens.remove(k));
        let dropped = gens.insert(key, text);
        // Freed after the lock is released.
        drop(kept);
        drop((old, dropped));
    }
}

/// `prefix` (the first `k` messages, rendered without the generation prompt) followed by what the
/// stub's rendering adds for `messages[k..]`; `None` when a render fails or the stub's rendering does
/// not start with the stub's own.
fn splice(
    stub: Stub,
    messages: &[Message],
    k: usize,
    prefix: &str,
    render: &Render<'_>,
    first: impl FnOnce(&Message) -> Option<Arc<str>>,
) -> Option<String> {
    let mut list: Vec<&Message> = Vec::with_capacity(messages.len() - k + 2);
    list.push(&messages[0]);
    let head: Arc<str> = match stub {
        Stub::First => first(&messages[0])?,
        Stub::FirstAndBefore => {
            list.push(&messages[k - 1]);
            render(&list, false).ok()?.into()
        }
    };
    list.extend(&messages[k..]);
    let rendered = render(&list, true).ok()?;
    let new = rendered.strip_prefix(&*head)?;
    let mut text = String::with_capacity(prefix.len() + new.len());
    text.push_str(prefix);
    text.push_str(new);
    Some(text)
}

/// `digests[i]`: a digest of `messages[..=i]` as the template reads them (an image part's URL is
/// not read: it renders as a marker). Each message is written out with the previous digest in front
/// and hashed in one call (a streaming hasher fed field by field cost several times more).
fn prefix_digests(messages: &[Message]) -> Vec<u128> {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut last = 0u128;
    messages
        .iter()
        .map(|m| {
            buf.clear();
            buf.extend_from_slice(&last.to_le_bytes());
            len_into(&mut buf, m.entries.len());
            for (key, entry) in &m.entries {
                str_into(&mut buf, key);
                match entry {
                    Entry::Json(v) => json_into(&mut buf, v),
                    Entry::Parts(parts) => parts_into(&mut buf, parts),
                }
            }
            last = xxh3_128(&buf);
            last
        })
        .collect()
}

fn parts_into(buf: &mut Vec<u8>, parts: &[Part]) {
    buf.push(7);
    len_into(buf, parts.len());
    for part in parts {
        match part {
            Part::Image(_) => buf.push(8),
            Part::Video => buf.push(9),
            Part::Object(fields) => {
                buf.push(10);
                fields_into(buf, fields.iter().map(|(k, v)| (k, v)));
            }
            Part::Json(v) => json_into(buf, v),
        }
    }
}

fn len_into(buf: &mut Vec<u8>, len: usize) {
    buf.extend_from_slice(&(len as u64).to_le_bytes());
}

fn str_into(buf: &mut Vec<u8>, s: &str) {
    len_into(buf, s.len());
    buf.extend_from_slice(s.as_bytes());
}

/// Each value prefixed by its kind, strings and containers by their length: no two values write
/// the same bytes.
fn json_into(buf: &mut Vec<u8>, v: &Json) {
    match v {
        Json::Null => buf.push(0),
        Json::Bool(b) => buf.extend_from_slice(&[1, u8::from(*b)]),
        Json::Number(n) => {
            buf.push(2);
            str_into(buf, &n.to_string());
        }
        Json::String(s) => {
            buf.push(3);
            str_into(buf, s);
        }
        Json::Array(items) => {
            buf.push(4);
            len_into(buf, items.len());
            items.iter().for_each(|i| json_into(buf, i));
        }
        Json::Object(map) => {
            buf.push(5);
            fields_into(buf, map.iter());
        }
    }
}

fn fields_into<'a>(buf: &mut Vec<u8>, fields: impl ExactSizeIterator<Item = (&'a String, &'a Json)>) {
    len_into(buf, fields.len());
    for (k, v) in fields {
        str_into(buf, k);
        json_into(buf, v);
    }
}

/// Establishes whether (and how) the template resumes: see the module doc.
/// `images`: whether probes with image parts apply (not in string content format, whose
/// placeholders are numbered across the conversation; such requests never resume).
fn probe(render: &Render<'_>, images: bool) -> Option<Plan> {
    let conversations: Vec<Vec<Message>> = PROBES.iter().filter_map(|p| parse_probe(p, images)).collect();
    let mut generation: Option<String> = None;
    let mut wholes = Vec::new();
    for messages in &conversations {
        let all: Vec<&Message> = messages.iter().collect();
        let (Ok(with), Ok(without)) = (render(&all, true), render(&all, false)) else {
            wholes.push(None);
            continue;
        };
        let suffix = with.strip_prefix(&without)?;
        if generation.get_or_insert_with(|| suffix.to_owned()) != suffix {
            return None;
        }
        wholes.push(Some(with));
    }
    let generation = generation?;
    let mut best: Option<Plan> = None;
    for stub in [Stub::First, Stub::FirstAndBefore] {
        let after = exact_splits(stub, &conversations, &wholes, render);
        if best.as_ref().is_none_or(|b| after.len() > b.after.len()) {
            best = Some(Plan { stub, after, generation: generation.clone() });
        }
    }
    best.filter(|p| !p.after.is_empty())
}

/// The roles after which every probe's split resumes exactly (and at least one does).
fn exact_splits(
    stub: Stub,
    conversations: &[Vec<Message>],
    wholes: &[Option<String>],
    render: &Render<'_>,
) -> Vec<&'static str> {
    let mut exact = Vec::new();
    'roles: for role in ["user", "tool"] {
        let mut agreed = 0;
        for (messages, whole) in conversations.iter().zip(wholes) {
            let Some(whole) = whole else { continue };
            let splits = (2..messages.len())
                .filter(|&k| messages[k].role() == Some("assistant") && messages[k - 1].role() == Some(role));
            for k in splits {
                let Ok(prefix) = render(&messages[..k].iter().collect::<Vec<_>>(), false) else { continue };
                let first = |m: &Message| render(&[m], false).ok().map(Arc::from);
                match splice(stub, messages, k, &prefix, render, first) {
                    Some(text) if text == *whole => agreed += 1,
                    Some(_) => continue 'roles,
                    None => {}
                }
            }
        }
        if agreed > 0 {
            exact.push(role);
        }
    }
    exact
}

/// A probe's messages, without its image parts unless `images`.
fn parse_probe(body: &str, images: bool) -> Option<Vec<Message>> {
    let mut json: Json = serde_json::from_str(body).ok()?;
    if !images {
        for m in json.get_mut("messages")?.as_array_mut()? {
            if let Some(Json::Array(parts)) = m.get_mut("content") {
                parts.retain(|p| p.get("type").and_then(Json::as_str) != Some("image_url"));
            }
        }
    }
    let body = serde_json::to_vec(&json).ok()?;
    Request::parse(Endpoint::Chat, &body).ok()?.messages.ok()
}

/// The probe conversations (see the module doc). Texts are short; what matters is the structure.
const PROBES: [&str; 7] = [
    r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"},
      {"role":"assistant","content":"Hello!"},{"role":"user","content":"How are you?"},
      {"role":"assistant","content":"Well."},{"role":"user","content":"Good."}]}"#,
    r#"{"messages":[{"role":"user","content":"First question"},{"role":"assistant","content":"First answer"},
      {"role":"user","content":"Second question"},{"role":"assistant","content":"Second answer"},
      {"role":"user","content":"Third question"}]}"#,
    r#"{"messages":[{"role":"system","content":[{"type":"text","text":"You see images."}]},
      {"role":"user","content":[{"type":"text","text":"Look:"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"what is it?"}]},
      {"role":"assistant","content":[{"type":"text","text":"A cat."}]},
      {"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,BBBB"}},{"type":"text","text":"And this?"}]},
      {"role":"assistant","content":"A dog."},
      {"role":"user","content":[{"type":"text","text":"Compare"},{"type":"image_url","image_url":{"url":"data:image/png;base64,CCCC"}}]}]}"#,
    r#"{"messages":[{"role":"system","content":"Think first."},{"role":"user","content":"2+2?"},
      {"role":"assistant","content":"4","reasoning_content":"Adding two and two."},{"role":"user","content":"3+3?"},
      {"role":"assistant","content":"<think>\nThree and three.\n</think>\n\n6"},{"role":"user","content":"And 4+4?"},
      {"role":"assistant","content":"8","reasoning_content":"Doubling four."},{"role":"user","content":"Thanks"}]}"#,
    r#"{"messages":[{"role":"system","content":"Use tools."},{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,DDDD"}},{"type":"text","text":"Weather here?"}]},
      {"role":"assistant","content":"","reasoning_content":"Need the tool.","tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"Sunny"},
      {"role":"assistant","content":"Checking more.","reasoning_content":"And Lyon.","tool_calls":[{"id":"c2","type":"function","function":{"name":"weather","arguments":"{\"city\": \"Lyon\"}"}}]},
      {"role":"tool","tool_call_id":"c2","content":"Rain"},
      {"role":"assistant","content":"Paris is sunny, Lyon rainy.","reasoning_content":"Summarise."},
      {"role":"user","content":[{"type":"text","text":"And there?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,EEEE"}}]},
      {"role":"assistant","content":"","reasoning_content":"Look it up.","tool_calls":[{"id":"c3","type":"function","function":{"name":"weather","arguments":"{\"city\": \"Nice\"}"}}]},
      {"role":"tool","tool_call_id":"c3","content":[{"type":"text","text":"Windy"},{"type":"image_url","image_url":{"url":"data:image/png;base64,FFFF"}}]}]}"#,
    r#"{"messages":[{"role":"system","content":"Parallel tools."},{"role":"user","content":"Two cities?"},
      {"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"w","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"w","arguments":{"x": 1}}}]},
      {"role":"tool","tool_call_id":"a","content":"one"},{"role":"tool","tool_call_id":"b","content":"two"},
      {"role":"assistant","content":"Done."},{"role":"user","content":"Again"},
      {"role":"assistant","content":"Again done."},{"role":"user","content":"Bye"}]}"#,
    r#"{"messages":[{"role":"system","content":"Names."},{"role":"user","name":"ann","content":"Hello"},
      {"role":"assistant","name":"bot","content":"Hi Ann"},{"role":"user","name":"bob","content":"And me?"},
      {"role":"assistant","content":"Hi Bob"},{"role":"user","content":"Both of us"}]}"#,
];

#[cfg(test)]
mod tests {
    use serde_json::{json, Value as Json};

    use super::Stub;
    use crate::prompt::PromptModel;
    use crate::request::{Endpoint, Request};

    fn render(model: &PromptModel, messages: &[Json]) -> String {
        let body = serde_json::to_vec(&json!({ "messages": messages })).unwrap();
        model.render_chat(&Request::parse(Endpoint::Chat, &body).unwrap(), &Default::default()).unwrap()
    }

    /// A model with `template` and fresh caches.
    fn model(template: Option<&str>) -> PromptModel {
        PromptModel::bundled("qwen3-vl").unwrap().with_overrides(template, None).unwrap()
    }

    /// Plans `turns` conversation turns (each resending the history plus a reply and a new user
    /// turn) with `warm` and with fresh models; returns how many `warm` resumed.
    fn feed(warm: &PromptModel, turns: usize, image_every: usize) -> u64 {
        let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
        for t in 0..turns {
            if t > 0 {
                messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
            }
            let content = if image_every > 0 && t % image_every == 0 {
                json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                       {"type": "text", "text": format!("question {t}")}])
            } else {
                json!(format!("question {t}"))
            };
            messages.push(json!({"role": "user", "content": content}));
            assert_eq!(
                render(warm, &messages),
                render(&warm.with_overrides(None, None).unwrap(), &messages),
                "turn {t}"
            );
        }
        warm.resumed_renders()
    }

    fn plan(model: &PromptModel) -> Option<(Stub, Vec<&'static str>)> {
        let plan = model.inner.resume.plan.get().expect("probed").as_ref()?;
        Some((plan.stub, plan.after.clone()))
    }

    #[test]
    fn qwen3_vl_resumes_after_user_and_tool_messages_from_the_first_message() {
        let warm = model(None);
        // Turn 1 has no history (not kept), turn 2 renders whole and is kept; turns 3–8 resume.
        assert_eq!(feed(&warm, 8, 3), 6);
        assert_eq!(plan(&warm), Some((Stub::First, vec!["user", "tool"])));
        // The first message's rendering and the conversation's latest text: each turn's replaced the last.
        assert_eq!(warm.inner.resume.kept.lock().unwrap().as_ref().unwrap().len(), 2);
        assert_eq!(warm.inner.resume.plan.get().unwrap().as_ref().unwrap().generation, "<|im_start|>assistant\n");
    }

    /// Reasoning kept only after the last user query, which is the last message when there is no user
    /// message (Qwen3's rule): a stub of the first message alone would hide the reasoning of an
    /// assistant turn that follows the split with no user turn after it.
    #[test]
    fn a_template_that_looks_back_resumes_with_the_message_before_the_split() {
        let template = r#"{%- set ns = namespace(last=messages|length - 1, scanning=true) %}{%- for m in messages|reverse %}{%- if ns.scanning and m.role == "user" %}{%- set ns.scanning = false %}{%- set ns.last = messages|length - 1 - loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}<{{ m.role }}>{% if m.role == "assistant" and loop.index0 > ns.last and m.reasoning_content %}[{{ m.reasoning_content }}]{% endif %}{{ m.content if m.content is string else '' }}</{{ m.role }}>{% endfor %}
{%- if add_generation_prompt %}<assistant>{% endif %}"#;
        let warm = model(Some(template));
        assert!(feed(&warm, 6, 0) > 0);
        assert_eq!(plan(&warm).map(|p| p.0), Some(Stub::FirstAndBefore));
    }

    /// Images numbered across the conversation: no split is exact, so nothing resumes, and every
    /// render is whole.
    #[test]
    fn a_template_numbering_images_across_turns_never_resumes() {
        let template = r#"{%- set n = namespace(i=0) %}{%- for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == "image" %}{% set n.i = n.i + 1 %}Picture {{ n.i }}{% elif p.type == "text" %}{{ p.text }}{% endif %}{% endfor %}{% endif %}{% endfor %}
{%- if add_generation_prompt %}<assistant>{% endif %}"#;
        let warm = model(Some(template));
        assert_eq!(feed(&warm, 6, 2), 0);
        assert_eq!(plan(&warm), None);
    }

    /// A template that the probes cannot catch (it changes only past ten messages): the first
    /// resumed render is checked against a whole one, which turns resuming off for good.
    #[test]
    fn a_resumed_render_that_differs_from_a_whole_one_turns_resuming_off() {
        let template = r#"{%- if messages|length > 10 %}[long]{% endif %}{%- for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}
{%- if add_generation_prompt %}<assistant>{% endif %}"#;
        let warm = model(Some(template));
        let role = |i: usize| match i {
            0 => "system",
            i if i % 2 == 1 => "user",
            _ => "assistant",
        };
        let long: Vec<Json> = (0..12).map(|i| json!({"role": role(i), "content": format!("m{i}")})).collect();
        // Keep the first ten messages (a request with a history), then resend them plus two.
        assert_eq!(render(&warm, &long[..10]), render(&model(Some(template)), &long[..10]));
        let resumed = render(&warm, &long[..12]);
        assert!(resumed.starts_with("[long]"), "the whole render is returned: {resumed}");
        assert!(warm.inner.resume.disabled.load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(warm.resumed_renders(), 1);
        render(&warm, &long[..10]);
        render(&warm, &long[..12]);
        assert_eq!(warm.resumed_renders(), 1, "no render resumes once turned off");
    }
}
