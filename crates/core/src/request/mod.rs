//! Stage **parse**: the request body read once, borrowed, into what every later stage needs.
//!
//! One serde pass over the received bytes finds the messages (for the chat template), the image parts
//! (for intake, with their byte spans in the body so a later stage can splice fields into them
//! without re-serialising), any media the router cannot account for, and the top-level fields the
//! pipeline reads. A data URL is never copied: its `image_url` value stays a `&RawValue` borrowed from
//! the body and its URL a `Cow` borrowed from that. Text and the small fields the template sees are
//! owned `serde_json::Value`s. Unknown top-level keys are skipped without allocating.
//!
//! The parse is lenient about shape: only a body that is not a JSON object is an error. A chat whose
//! `messages` the template could not render (not an array, a message that is not an object) still
//! parses; the problem is kept as a value and the pipeline routes it by load, leaving the answer to the
//! worker, as a transparent proxy should.
//!
//! A Responses API body (`Endpoint::Responses`) is read in the same pass and converted to the chat
//! vLLM renders for it (`responses.rs`): the same view, `messages` included, as a chat's.
//!
//! This file is the API: the request and its parts, and how later stages read them. The serde machinery
//! that builds them in that one pass — [`Request::parse`] and its visitors — is in `de.rs`, which uses
//! these types; nothing here uses it.

mod de;
mod responses;

use std::borrow::Cow;
use std::ops::Range;

use serde_json::{Map, Value};

/// Which OpenAI endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
    /// The Responses API: its `instructions` and `input` items are turned into chat messages as vLLM
    /// turns them (`responses.rs`), so the request is planned like a chat.
    Responses,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
            Endpoint::Responses => "/v1/responses",
        }
    }
}

/// Why a body is not a request at all (answered 400, nothing forwarded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("request body must be a JSON object")]
    NotAnObject,
}

/// A content part the router cannot turn into an image to account for: the request then routes on
/// its text prefix. `label()` is the fallback reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    /// Audio, files, embeddings, videos not sent as `video_url`: media whose tokens the router cannot
    /// count.
    #[error("messages[{message}].content[{part}]: unsupported media part type '{kind}'")]
    UnsupportedMedia { message: usize, part: usize, kind: String },
    /// An image or video part without a usable URL.
    #[error("invalid image URL: {0}")]
    InvalidUrl(String),
}

impl PartError {
    pub fn label(&self) -> &'static str {
        match self {
            PartError::UnsupportedMedia { .. } => "unsupported_media",
            PartError::InvalidUrl(_) => "invalid_url",
        }
    }
}

/// One request, parsed.
#[derive(Debug)]
pub struct Request<'a> {
    pub endpoint: Endpoint,
    fields: Map<String, Value>,
    /// The chat's messages, or why they cannot be rendered (`messages` missing or not an array, a
    /// message that is not an object).
    pub messages: Result<Vec<Message>, String>,
    /// Media parts to read — images and videos ([`ImagePart::kind`]) — in request order (only those
    /// with a usable URL).
    pub images: Vec<ImagePart<'a>>,
    /// The first media part the router cannot account for (audio, video, files, embeddings, an image
    /// part without a URL): the request then routes on its text prefix.
    pub media_issue: Option<PartError>,
    /// Image or video parts that name a `uuid` but carry no usable media (`"image_url": null`): vLLM
    /// would serve cached features by that name.
    pub uuid_only_parts: usize,
    /// A digest of what the prompt renders from (see `body_digest`).
    digest: Option<u128>,
}

/// One message: its keys in the order sent; `content` keeps image parts as parts (no URL copied).
#[derive(Debug)]
pub struct Message {
    pub entries: Vec<(String, Entry)>,
}

/// A message value: plain JSON, or a content array of parts.
#[derive(Debug)]
pub enum Entry {
    Json(Value),
    Parts(Vec<Part>),
}

/// One content part as the template sees it.
#[derive(Debug)]
pub enum Part {
    /// An image part (a `{"type": "image"}` marker for the template); `Some(i)` is its index in
    /// [`Request::images`] when it has a usable URL.
    Image(Option<usize>),
    /// A video part (`{"type": "video"}` for the template).
    Video,
    /// Any other object part (text, refusal, …), its keys in order.
    Object(Vec<(String, Value)>),
    /// A part that is not an object, as sent.
    Json(Value),
}

/// What a media part holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MediaKind {
    /// An `image_url` part.
    Image,
    /// A `video_url` part.
    Video,
}

/// A media part of the request (an image, or a video: [`ImagePart::kind`]): its URL and where it
/// sits in the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImagePart<'a> {
    /// The `data:`/`http(s):` URL as sent (borrowed unless JSON escapes forced a copy).
    pub url: Cow<'a, str>,
    /// An image or a video part.
    pub kind: MediaKind,
    /// Index into `messages` (for a Responses body, into its `input` items).
    pub message: usize,
    /// Index into that message's `content` array.
    pub part: usize,
    /// Byte range of the part's `image_url` value (a video's `video_url` value) in the body.
    pub image_url_span: Range<usize>,
    /// Byte range of the part's own `uuid` value, if the client sent one.
    pub uuid_span: Option<Range<usize>>,
    /// That value, when it is a string.
    pub uuid: Option<String>,
}

impl ImagePart<'_> {
    pub fn is_video(&self) -> bool {
        self.kind == MediaKind::Video
    }
}

impl<'a> Request<'a> {
    /// Whether any media part to read is a video.
    pub fn has_videos(&self) -> bool {
        self.images.iter().any(ImagePart::is_video)
    }

    /// For a chat, a digest of the number of images and the body's bytes outside the images'
    /// `image_url` values, when those are at most 64 KiB and every media part is an image the router
    /// reads: equal digests, equal rendered prompts (the pipeline memoizes them by it).
    pub fn body_digest(&self) -> Option<u128> {
        self.digest
    }

    /// A top-level field the pipeline reads (see `KNOWN_FIELDS` in `de.rs`, `FIELDS` in `responses.rs`),
    /// as sent; for a Responses body also the chat's `tools`, `reasoning_effort` and generation flags
    /// converted from it.
    pub fn field(&self, key: &str) -> Option<&Value> {
        self.fields.get(key).filter(|v| !v.is_null())
    }

    pub fn str_field(&self, key: &str) -> Option<&str> {
        self.field(key).and_then(Value::as_str)
    }
}

impl Message {
    /// The value of `key` if it is plain JSON.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).and_then(|(_, e)| match e {
            Entry::Json(v) => Some(v),
            Entry::Parts(_) => None,
        })
    }

    pub fn role(&self) -> Option<&str> {
        self.get("role").and_then(Value::as_str)
    }

    /// The `content` entry, if present.
    pub fn content(&self) -> Option<&Entry> {
        self.entries.iter().find(|(k, _)| k == "content").map(|(_, e)| e)
    }
}
