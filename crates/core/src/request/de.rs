//! The one serde pass behind [`Request::parse`]: nested seeds over the borrowed body (top level →
//! messages → message → content → part) that keep data URLs borrowed, record each image part's byte
//! spans, note media the router cannot count, and never stop on an unexpected shape. A Responses body
//! goes top level → `input` → items, each item through the message seed, and `responses.rs` then
//! turns what was parsed into the chat vLLM renders.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{responses, Endpoint, Entry, ImagePart, MediaKind, Message, ParseError, Part, PartError, Request};

/// Top-level keys the pipeline or the chat template read; everything else is skipped.
const KNOWN_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "cache_salt",
    "mm_processor_kwargs",
    "media_io_kwargs",
    "tools",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "documents",
    "reasoning_effort",
    "chat_template",
    "add_special_tokens",
    "prompt",
    "stream",
];

/// Part types that carry media other than a still image or a `video_url`: the router cannot count
/// their tokens, so they force the fallback instead of being skipped.
const UNSUPPORTED_KINDS: &[&str] =
    &["input_audio", "audio_url", "audio", "video", "input_video", "file", "input_file", "image_embeds", "image_pil"];

/// Part keys holding a media payload; read only for their presence (they may be megabytes).
const MEDIA_KEYS: &[&str] = &["input_audio", "audio_url", "file", "image_embeds", "image", "video"];

impl<'a> Request<'a> {
    /// Parses `body` in one pass. Only invalid JSON or a non-object body is an error.
    pub fn parse(endpoint: Endpoint, body: &'a [u8]) -> Result<Request<'a>, ParseError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let seed = TopSeed { endpoint, base: body.as_ptr() as usize };
        let request = seed.deserialize(&mut de).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => ParseError::NotAnObject,
            _ => ParseError::InvalidJson(e.to_string()),
        })?;
        de.end().map_err(|e| ParseError::InvalidJson(e.to_string()))?;
        let digest = digest(endpoint, body, &request);
        Ok(Request { digest, ..request })
    }
}

/// Bodies with up to this much outside their image URLs get a digest ([`Request::body_digest`]):
/// digesting costs ~0.05 µs per KiB, and longer texts are mostly one-off long prompts.
const DIGESTED_BODY_BYTES: usize = 64 * 1024;

/// For a chat, the digest of everything in the body but its images' `image_url` values, with the
/// number of images: what the prompt is rendered from (an image part renders as a placeholder,
/// whatever its URL). None for a completion (nothing memoizes those), a body with a media part the
/// router cannot account for, or too long a body.
fn digest(endpoint: Endpoint, body: &[u8], request: &Request<'_>) -> Option<u128> {
    let urls: usize = request.images.iter().map(|i| i.image_url_span.len()).sum();
    let chat_like = matches!(endpoint, Endpoint::Chat | Endpoint::Responses);
    if !chat_like || request.media_issue.is_some() || body.len() - urls > DIGESTED_BODY_BYTES {
        return None;
    }
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    if endpoint == Endpoint::Responses {
        // The same bytes render another prompt as a chat: the memo must not mix the two.
        h.update(b"responses\0");
    }
    h.update(&(request.images.len() as u64).to_le_bytes());
    let mut at = 0;
    for span in request.images.iter().map(|i| &i.image_url_span) {
        // Spans come in body order and do not overlap; anything else is digested whole.
        if span.start < at {
            return None;
        }
        h.update(&body[at..span.start]);
        at = span.end;
    }
    h.update(&body[at..]);
    Some(h.digest128())
}

/// State shared by the nested seeds while one body is parsed.
struct Ctx<'a> {
    base: usize,
    images: Vec<ImagePart<'a>>,
    media_issue: Option<PartError>,
    uuid_only_parts: usize,
    /// A Responses body: an `input_image`'s `image_url` is a plain string there (vLLM refuses an
    /// object), so only a string is an image to read.
    string_urls: bool,
}

impl Ctx<'_> {
    fn issue(&mut self, e: PartError) {
        self.media_issue.get_or_insert(e);
    }

    fn span(&self, raw: &RawValue) -> Range<usize> {
        let start = raw.get().as_ptr() as usize - self.base;
        start..start + raw.get().len()
    }
}

struct TopSeed {
    endpoint: Endpoint,
    base: usize,
}

impl<'a> DeserializeSeed<'a> for TopSeed {
    type Value = Request<'a>;
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Request<'a>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'a> Visitor<'a> for TopSeed {
    type Value = Request<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'a>>(self, mut map: M) -> Result<Request<'a>, M::Error> {
        let string_urls = self.endpoint == Endpoint::Responses;
        let mut ctx = Ctx { base: self.base, images: Vec::new(), media_issue: None, uuid_only_parts: 0, string_urls };
        if string_urls {
            let (fields, messages) = responses_top(&mut map, &mut ctx)?;
            return Ok(request(self.endpoint, fields, messages, ctx));
        }
        let mut fields = Map::new();
        let mut messages = Err("`messages` must be an array".to_owned());
        while let Some(key) = map.next_key::<Cow<'a, str>>()? {
            match key.as_ref() {
                "messages" => messages = map.next_value_seed(MessagesSeed(&mut ctx))?,
                k if KNOWN_FIELDS.contains(&k) => {
                    fields.insert(key.into_owned(), map.next_value()?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(request(self.endpoint, fields, messages, ctx))
    }
}

fn request<'a>(
    endpoint: Endpoint,
    fields: Map<String, Value>,
    messages: Result<Vec<Message>, String>,
    ctx: Ctx<'a>,
) -> Request<'a> {
    Request {
        endpoint,
        fields,
        messages,
        images: ctx.images,
        media_issue: ctx.media_issue,
        uuid_only_parts: ctx.uuid_only_parts,
        digest: None,
    }
}

/// The top-level map of a Responses body: the fields the pipeline reads, and the chat messages.
#[allow(clippy::type_complexity)]
fn responses_top<'a, M: MapAccess<'a>>(
    map: &mut M,
    ctx: &mut Ctx<'a>,
) -> Result<(Map<String, Value>, Result<Vec<Message>, String>), M::Error> {
    let mut fields = Map::new();
    let mut got = responses::Converted::default();
    while let Some(key) = map.next_key::<Cow<'a, str>>()? {
        match key.as_ref() {
            "input" => got.input = Some(map.next_value_seed(InputSeed(&mut *ctx))?),
            "instructions" => got.instructions = map.next_value()?,
            "tools" => got.tools = map.next_value()?,
            "reasoning" => got.reasoning = map.next_value()?,
            k if responses::FIELDS.contains(&k) => {
                fields.insert(key.into_owned(), map.next_value()?);
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    let messages = responses::convert(&mut fields, got);
    Ok((fields, messages))
}

/// `input`: a string, or items parsed by the chat path's message seed (their content parts, images
/// with their spans, included).
struct InputSeed<'c, 'a>(&'c mut Ctx<'a>);

impl<'a> DeserializeSeed<'a> for InputSeed<'_, 'a> {
    type Value = responses::Input;
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<responses::Input, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for InputSeed<'_, 'a> {
    type Value = responses::Input;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string or an array of input items")
    }
    fn visit_str<E>(self, s: &str) -> Result<responses::Input, E> {
        Ok(responses::Input::Text(s.to_owned()))
    }
    fn visit_bool<E>(self, _: bool) -> Result<responses::Input, E> {
        Ok(responses::Input::Invalid)
    }
    fn visit_i64<E>(self, _: i64) -> Result<responses::Input, E> {
        Ok(responses::Input::Invalid)
    }
    fn visit_u64<E>(self, _: u64) -> Result<responses::Input, E> {
        Ok(responses::Input::Invalid)
    }
    fn visit_f64<E>(self, _: f64) -> Result<responses::Input, E> {
        Ok(responses::Input::Invalid)
    }
    fn visit_unit<E>(self) -> Result<responses::Input, E> {
        Ok(responses::Input::Invalid)
    }
    fn visit_map<M: MapAccess<'a>>(self, mut map: M) -> Result<responses::Input, M::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(responses::Input::Invalid)
    }
    fn visit_seq<S: SeqAccess<'a>>(self, mut seq: S) -> Result<responses::Input, S::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(MessageSeed { index: items.len(), ctx: &mut *self.0 })? {
            items.push(item);
        }
        Ok(responses::Input::Items(items))
    }
}

/// The scalar visits of a lenient visitor: each JSON scalar becomes `$v` (a `Value`) and the visitor
/// yields `$out`, so an unexpected type never stops the parse.
macro_rules! visit_scalars {
    ($v:ident => $out:expr) => {
        fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
            let $v = Value::from(b);
            Ok($out)
        }
        fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
            let $v = Value::from(n);
            Ok($out)
        }
        fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
            let $v = Value::from(n);
            Ok($out)
        }
        fn visit_f64<E>(self, n: f64) -> Result<Self::Value, E> {
            let $v = Value::from(n);
            Ok($out)
        }
        fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
            let $v = Value::from(s);
            Ok($out)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            let $v = Value::Null;
            Ok($out)
        }
    };
}

struct MessagesSeed<'c, 'a>(&'c mut Ctx<'a>);

impl<'a> DeserializeSeed<'a> for MessagesSeed<'_, 'a> {
    type Value = Result<Vec<Message>, String>;
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for MessagesSeed<'_, 'a> {
    type Value = Result<Vec<Message>, String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of messages")
    }

    visit_scalars!(_v => Err("`messages` must be an array".to_owned()));

    fn visit_map<M: MapAccess<'a>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Err("`messages` must be an array".to_owned()))
    }

    fn visit_seq<S: SeqAccess<'a>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let mut out = Vec::new();
        let mut bad = None;
        while let Some(m) = seq.next_element_seed(MessageSeed { index: out.len(), ctx: &mut *self.0 })? {
            match m {
                Some(m) => out.push(m),
                None => {
                    bad.get_or_insert(format!("messages[{}] must be an object", out.len()));
                    out.push(Message { entries: Vec::new() });
                }
            }
        }
        Ok(match bad {
            Some(why) => Err(why),
            None => Ok(out),
        })
    }
}

struct MessageSeed<'c, 'a> {
    index: usize,
    ctx: &'c mut Ctx<'a>,
}

impl<'a> DeserializeSeed<'a> for MessageSeed<'_, 'a> {
    /// `None`: not an object.
    type Value = Option<Message>;
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for MessageSeed<'_, 'a> {
    type Value = Option<Message>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message object")
    }

    visit_scalars!(_v => None);

    fn visit_seq<S: SeqAccess<'a>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_map<M: MapAccess<'a>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Cow<'a, str>>()? {
            let entry = if key == "content" {
                map.next_value_seed(ContentSeed { message: self.index, ctx: &mut *self.ctx })?
            } else {
                Entry::Json(map.next_value()?)
            };
            entries.push((key.into_owned(), entry));
        }
        Ok(Some(Message { entries }))
    }
}

struct ContentSeed<'c, 'a> {
    message: usize,
    ctx: &'c mut Ctx<'a>,
}

impl<'a> DeserializeSeed<'a> for ContentSeed<'_, 'a> {
    type Value = Entry;
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for ContentSeed<'_, 'a> {
    type Value = Entry;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("message content")
    }

    visit_scalars!(v => Entry::Json(v));

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Entry::Json(v.into()))
    }

    fn visit_map<M: MapAccess<'a>>(self, map: M) -> Result<Self::Value, M::Error> {
        Value::deserialize(MapAccessDeserializer::new(map)).map(Entry::Json)
    }

    fn visit_seq<S: SeqAccess<'a>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let mut parts = Vec::new();
        while let Some(p) =
            seq.next_element_seed(PartSeed { message: self.message, part: parts.len(), ctx: &mut *self.ctx })?
        {
            parts.push(p);
        }
        Ok(Entry::Parts(parts))
    }
}

struct PartSeed<'c, 'a> {
    message: usize,
    part: usize,
    ctx: &'c mut Ctx<'a>,
}

impl<'a> DeserializeSeed<'a> for PartSeed<'_, 'a> {
    type Value = Part;
    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// What one part object held, before it is classified.
#[derive(Default)]
struct RawPart<'a> {
    fields: Vec<(String, Value)>,
    image_url: Option<&'a RawValue>,
    video_url: Option<&'a RawValue>,
    uuid: Option<&'a RawValue>,
    /// Media payload keys present (values skipped).
    media_keys: Vec<&'static str>,
}

impl<'a> Visitor<'a> for PartSeed<'_, 'a> {
    type Value = Part;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content part")
    }

    visit_scalars!(v => Part::Json(v));

    fn visit_seq<S: SeqAccess<'a>>(self, seq: S) -> Result<Self::Value, S::Error> {
        Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq)).map(Part::Json)
    }

    fn visit_map<M: MapAccess<'a>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut raw = RawPart::default();
        while let Some(key) = map.next_key::<Cow<'a, str>>()? {
            match key.as_ref() {
                "image_url" => raw.image_url = Some(map.next_value()?),
                "video_url" => raw.video_url = Some(map.next_value()?),
                "uuid" => raw.uuid = Some(map.next_value()?),
                k => match MEDIA_KEYS.iter().find(|m| **m == k) {
                    Some(m) => {
                        map.next_value::<IgnoredAny>()?;
                        raw.media_keys.push(m);
                    }
                    None => raw.fields.push((key.into_owned(), map.next_value()?)),
                },
            }
        }
        Ok(classify(raw, self.message, self.part, self.ctx))
    }
}

/// Decides what a part is: for intake (is it an image to fetch? media we cannot count?) and for the
/// template (an image or video marker, or the part as sent).
fn classify<'a>(raw: RawPart<'a>, m: usize, p: usize, ctx: &mut Ctx<'a>) -> Part {
    let kind = raw.fields.iter().find(|(k, _)| k == "type").and_then(|(_, v)| v.as_str()).map(str::to_owned);
    let unsupported = |kind: &str| PartError::UnsupportedMedia { message: m, part: p, kind: kind.to_owned() };
    // A Responses body's only media part vLLM's schema accepts is `input_image`.
    let chat = !ctx.string_urls;
    let fetch = match kind.as_deref() {
        Some("input_image") => Some(MediaKind::Image),
        Some("image_url") if chat => Some(MediaKind::Image),
        Some("video_url") if chat => Some(MediaKind::Video),
        Some(k) if UNSUPPORTED_KINDS.contains(&k) => {
            ctx.issue(unsupported(k));
            None
        }
        None if chat && raw.image_url.is_some() => Some(MediaKind::Image),
        None if chat && raw.video_url.is_some() => Some(MediaKind::Video),
        _ => None,
    };
    if fetch.is_none() {
        // An unknown type that still carries a media payload is not silently dropped.
        let video_url = raw.video_url.is_some().then_some("video_url");
        if let Some(key) = raw.media_keys.iter().copied().find(|k| !matches!(*k, "image" | "video")).or(video_url) {
            ctx.issue(unsupported(kind.as_deref().unwrap_or(key)));
        }
    }
    let template_kind = match kind.as_deref() {
        _ if !chat => (fetch == Some(MediaKind::Image)).then_some("image"),
        Some("image_url" | "input_image" | "image") => Some("image"),
        Some("video_url" | "input_video" | "video") => Some("video"),
        Some(_) => None,
        None if raw.image_url.is_some() || raw.media_keys.contains(&"image") => Some("image"),
        None if raw.video_url.is_some() => Some("video"),
        None => None,
    };
    let image = fetch.and_then(|kind| media_part(&raw, kind, m, p, ctx));
    match template_kind {
        Some("image") => Part::Image(image),
        Some(_) => Part::Video,
        None => {
            let mut fields = raw.fields;
            // Keep what the template could read; a skipped payload key reads as present-but-null.
            fields.extend(raw.media_keys.iter().map(|k| (k.to_string(), Value::Null)));
            Part::Object(fields)
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum UrlField<'a> {
    Plain(#[serde(borrow)] Cow<'a, str>),
    Object {
        #[serde(borrow)]
        url: Cow<'a, str>,
    },
}

/// The URL of an `image_url` value: a string, or an object whose `url` is one (other keys ignored, a
/// repeated `url` refused). The usual shapes are read off the raw text with one `memchr2` pass instead
/// of a second serde pass over what may be megabytes of base64 (~6 % of the router's CPU on a 150 KB
/// image); anything else goes through serde.
fn url_of<'a>(value: &'a RawValue) -> Option<Cow<'a, str>> {
    if let Some(url) = quick_url(value.get()) {
        return Some(Cow::Borrowed(url));
    }
    match serde_json::from_str::<UrlField<'a>>(value.get()) {
        Ok(UrlField::Plain(url) | UrlField::Object { url }) => Some(url),
        Err(_) => None,
    }
}

/// [`url_of`]'s fast path, on a valid JSON value: a string without escapes, or an object whose first
/// key is `url` with such a string, and after it no `"url"` and no escape (a key spelt `"\u0075rl"` is
/// a second `url`: serde refuses the duplicate, where the engine's parser would take the last one and
/// load another image than the one the router named). `None`: ask serde.
fn quick_url(text: &str) -> Option<&str> {
    let (object, rest) = match text.as_bytes().first()? {
        b'"' => (false, &text[1..]),
        b'{' => {
            let value = text[1..].trim_start().strip_prefix("\"url\"")?.trim_start().strip_prefix(':')?;
            (true, value.trim_start().strip_prefix('"')?)
        }
        _ => return None,
    };
    let end = memchr::memchr2(b'"', b'\\', rest.as_bytes())?;
    if rest.as_bytes()[end] != b'"' {
        return None; // an escape: serde decodes it
    }
    let after = rest[end + 1..].trim_start();
    let whole = if object {
        after == "}" || (after.starts_with(',') && !after.contains("\"url\"") && !after.contains('\\'))
    } else {
        after.is_empty()
    };
    whole.then(|| &rest[..end])
}

/// Records an image or video part to fetch (its index in `ctx.images`), or the reason it cannot be.
fn media_part<'a>(raw: &RawPart<'a>, kind: MediaKind, m: usize, p: usize, ctx: &mut Ctx<'a>) -> Option<usize> {
    let (value, key) = match kind {
        MediaKind::Image => (raw.image_url, "image_url"),
        MediaKind::Video => (raw.video_url, "video_url"),
    };
    let no_media = value.is_none_or(|v| v.get() == "null");
    if no_media && raw.uuid.is_some() {
        ctx.uuid_only_parts += 1;
    }
    let list = if ctx.string_urls { "input" } else { "messages" };
    let Some(value) = value else {
        ctx.issue(PartError::InvalidUrl(format!("{list}[{m}].content[{p}]: {key} missing")));
        return None;
    };
    // A Responses `input_image` takes only a string (vLLM's schema refuses `{"url": ...}` there).
    let expected = if ctx.string_urls { "a string" } else { "a string or {\"url\": string}" };
    let Some(url) = url_of(value).filter(|_| !ctx.string_urls || value.get().starts_with('"')) else {
        ctx.issue(PartError::InvalidUrl(format!("{list}[{m}].content[{p}].{key}: expected {expected}")));
        return None;
    };
    let part = ImagePart {
        url,
        kind,
        message: m,
        part: p,
        image_url_span: ctx.span(value),
        uuid_span: raw.uuid.map(|u| ctx.span(u)),
        uuid: raw.uuid.and_then(|u| serde_json::from_str::<String>(u.get()).ok()),
    };
    ctx.images.push(part);
    Some(ctx.images.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &[u8]) -> Request<'_> {
        Request::parse(Endpoint::Chat, body).unwrap()
    }

    #[test]
    fn the_quick_url_reads_what_serde_reads_or_defers_to_it() {
        let cases = [
            r#""data:image/png;base64,AAAA""#,
            r#"{"url":"data:image/png;base64,AAAA"}"#,
            r#"{ "url" : "http://x/a.png" , "detail": "high" }"#,
            r#"{"detail":"auto","url":"http://x/b.png"}"#,
            r#"{"url":"http://x/\u0061.png"}"#,
            r#""http://x/\"q\".png""#,
            r#"{"url":"http://x/a.png","url":"http://x/b.png"}"#,
            r#"{"url":"http://x/a.png","\u0075rl":"http://x/b.png"}"#,
            r#"{"url":"http://x/a.png","meta":{"url":"y"}}"#,
            r#"{"url":7}"#,
            r#"{"uri":"http://x/a.png"}"#,
            "null",
        ];
        for text in cases {
            let raw: Box<RawValue> = serde_json::from_str(text).unwrap();
            let by_serde = match serde_json::from_str::<UrlField<'_>>(text) {
                Ok(UrlField::Plain(u) | UrlField::Object { url: u }) => Some(u.into_owned()),
                Err(_) => None,
            };
            assert_eq!(url_of(&raw).map(Cow::into_owned), by_serde, "{text}");
            if let Some(quick) = quick_url(text) {
                assert_eq!(Some(quick.to_owned()), by_serde, "{text}: the fast path must agree");
            }
        }
        assert_eq!(quick_url(r#"{"url":"a","detail":"low"}"#), Some("a"));
        assert_eq!(quick_url(r#"{"url":"http://x/\u0061.png"}"#), None, "escapes go to serde");
        let twice = r#"{"url":"http://x/a.png","\u0075rl":"http://x/b.png"}"#;
        assert_eq!(quick_url(twice), None, "an escaped second url key goes to serde");
        assert_eq!(url_of(&serde_json::from_str::<Box<RawValue>>(twice).unwrap()), None, "and is refused");
    }

    #[test]
    fn plain_data_url_is_borrowed_from_the_body_with_its_span() {
        let body = br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"},"uuid":"x"}]}]}"#;
        let r = chat(body);
        assert_eq!(r.images.len(), 1);
        let img = &r.images[0];
        assert!(matches!(img.url, Cow::Borrowed(_)));
        assert_eq!(&body[img.image_url_span.clone()], br#"{"url":"data:image/png;base64,AAAA"}"#);
        assert_eq!(&body[img.uuid_span.clone().unwrap()], br#""x""#);
        assert!(r.media_issue.is_none());
        let msgs = r.messages.as_ref().unwrap();
        assert_eq!(msgs[0].role(), Some("user"));
        assert!(matches!(msgs[0].content(), Some(Entry::Parts(p)) if matches!(p[0], Part::Image(Some(0)))));
    }

    #[test]
    fn escaped_url_is_unescaped() {
        let r = chat(br#"{"messages":[{"content":[{"type":"image_url","image_url":"http:\/\/x.test\/a.png"}]}]}"#);
        assert_eq!(r.images[0].url, "http://x.test/a.png");
    }

    #[test]
    fn bodies_that_are_not_objects_are_errors() {
        assert!(matches!(Request::parse(Endpoint::Chat, b"{\"messages\":["), Err(ParseError::InvalidJson(_))));
        assert!(matches!(Request::parse(Endpoint::Chat, b""), Err(ParseError::InvalidJson(_))));
        assert_eq!(Request::parse(Endpoint::Chat, b"[1]").unwrap_err(), ParseError::NotAnObject);
        assert!(matches!(Request::parse(Endpoint::Chat, b"{} x"), Err(ParseError::InvalidJson(_))));
    }

    #[test]
    fn bad_shapes_parse_and_keep_the_reason() {
        assert_eq!(chat(br#"{"messages":"hi"}"#).messages.unwrap_err(), "`messages` must be an array");
        assert_eq!(chat(br#"{"model":"m"}"#).messages.unwrap_err(), "`messages` must be an array");
        let r = chat(br#"{"messages":[{"role":"user","content":"a"}, 5, {"content":[{"type":"image_url","image_url":"data:x"}]}]}"#);
        assert_eq!(r.messages.unwrap_err(), "messages[1] must be an object");
        // The parse went on past the bad message.
        assert_eq!(r.images.len(), 1);
        assert_eq!((r.images[0].message, r.images[0].part), (2, 0));
    }

    #[test]
    fn missing_url_is_invalid_url() {
        let r = chat(br#"{"messages":[{"content":[{"type":"image_url"}]}]}"#);
        assert_eq!(r.media_issue.unwrap().label(), "invalid_url");
        let r = chat(br#"{"messages":[{"content":[{"type":"image_url","image_url":{"detail":"low"}}]}]}"#);
        assert_eq!(r.media_issue.unwrap().label(), "invalid_url");
    }

    #[test]
    fn untyped_part_with_image_url_is_an_image() {
        let r = chat(br#"{"messages":[{"content":[{"image_url":{"url":"https://a.test/x.png"}}]}]}"#);
        assert_eq!(r.images.len(), 1);
    }

    #[test]
    fn media_we_cannot_count_is_the_first_issue() {
        let r = chat(
            br#"{"messages":[{"content":[{"type":"text","text":"hi"},{"type":"input_audio","input_audio":{"data":"AAAA"}},{"type":"video_url","video_url":{"url":"v"}}]}]}"#,
        );
        assert!(
            matches!(r.media_issue, Some(PartError::UnsupportedMedia { part: 1, ref kind, .. }) if kind == "input_audio")
        );
        let r = chat(br#"{"messages":[{"content":[{"type":"custom","file":{"x":1}}]}]}"#);
        assert_eq!(r.media_issue.unwrap().label(), "unsupported_media");
    }

    #[test]
    fn video_url_parts_are_media_with_their_spans() {
        let body = br#"{"messages":[{"content":[{"type":"image_url","image_url":"i"},{"type":"video_url","video_url":{"url":"data:video/mp4;base64,AAAA"},"uuid":"u"},{"video_url":"v"}]}]}"#;
        let r = chat(body);
        assert!(r.media_issue.is_none());
        let kinds: Vec<MediaKind> = r.images.iter().map(|i| i.kind).collect();
        assert_eq!(kinds, [MediaKind::Image, MediaKind::Video, MediaKind::Video]);
        let video = &r.images[1];
        assert!(matches!(video.url, Cow::Borrowed("data:video/mp4;base64,AAAA")));
        assert_eq!(&body[video.image_url_span.clone()], br#"{"url":"data:video/mp4;base64,AAAA"}"#);
        assert_eq!(&body[video.uuid_span.clone().unwrap()], br#""u""#);
        let parts = match r.messages.as_ref().unwrap()[0].content() {
            Some(Entry::Parts(p)) => p,
            _ => panic!("parts"),
        };
        assert!(matches!(parts[..], [Part::Image(Some(0)), Part::Video, Part::Video]));
        assert!(r.body_digest().is_some(), "a chat with videos the router reads is memoized");
        // No URL: the part cannot be read; a uuid without a video names cached features.
        let r = chat(br#"{"messages":[{"content":[{"type":"video_url","video_url":null,"uuid":"u"}]}]}"#);
        assert_eq!((r.media_issue.unwrap().label(), r.uuid_only_parts), ("invalid_url", 1));
        // Other video part types are still media the router cannot count.
        let r = chat(br#"{"messages":[{"content":[{"type":"input_video","video":{"x":1}}]}]}"#);
        assert_eq!(r.media_issue.unwrap().label(), "unsupported_media");
    }

    #[test]
    fn known_fields_are_kept_and_others_skipped() {
        let r = chat(br#"{"model":"m","max_tokens":7,"stream":true,"huge":{"x":[1,2,3]},"messages":[]}"#);
        assert_eq!(r.str_field("model"), Some("m"));
        assert_eq!(r.field("max_tokens"), Some(&Value::from(7)));
        assert!(r.field("huge").is_none());
        assert!(r.messages.unwrap().is_empty());
    }
}
