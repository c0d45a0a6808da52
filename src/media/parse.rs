//! Finds the image parts of a chat-completions body without copying it: messages and parts stay
//! borrowed `RawValue`s, and a URL is a `Cow` borrowed from the body unless JSON escapes force a copy,
//! so a multi-megabyte data URL is never re-serialised.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::media::MediaError;

/// One image part of the request, in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef<'a> {
    /// The `data:`/`http(s):` URL as sent.
    pub url: Cow<'a, str>,
    /// Index into `messages`.
    pub message: usize,
    /// Index into that message's `content` array.
    pub part: usize,
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    messages: Option<Vec<Message<'a>>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// The keys a part may carry; unknown keys are skipped without allocation.
#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    image_url: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input_audio: Option<&'a RawValue>,
    #[serde(borrow, default)]
    audio_url: Option<&'a RawValue>,
    #[serde(borrow, default)]
    video_url: Option<&'a RawValue>,
    #[serde(borrow, default)]
    file: Option<&'a RawValue>,
    #[serde(borrow, default)]
    image_embeds: Option<&'a RawValue>,
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

/// Part types that carry media other than a still image: the router cannot count their tokens, so
/// they force the fallback instead of being skipped.
const UNSUPPORTED_KINDS: &[&str] = &[
    "input_audio",
    "audio_url",
    "audio",
    "video_url",
    "video",
    "input_video",
    "file",
    "input_file",
    "image_embeds",
    "image_pil",
];

/// Returns the image parts of `messages[].content[]` in order.
///
/// `image_url` parts take `image_url` as a string or `{"url": …}`; `input_image` parts likewise.
/// A part with no `type` but an `image_url` key counts as an image (vLLM infers the type from the key).
/// Audio, video, file and embedding parts give [`MediaError::UnsupportedMedia`]; other parts
/// (text, refusals, unknown types without media) are ignored.
pub fn find_images(body: &[u8]) -> Result<Vec<ImageRef<'_>>, MediaError> {
    let body: Body<'_> = serde_json::from_slice(body).map_err(|e| MediaError::InvalidBody(e.to_string()))?;
    let mut images = Vec::new();
    for (m, message) in body.messages.unwrap_or_default().iter().enumerate() {
        let Some(content) = message.content else {
            continue;
        };
        // String or null content has no parts; only arrays are inspected.
        if !content.get().trim_start().starts_with('[') {
            continue;
        }
        let parts: Vec<&RawValue> = serde_json::from_str(content.get())
            .map_err(|e| MediaError::InvalidBody(format!("messages[{m}].content: {e}")))?;
        for (p, raw) in parts.iter().enumerate() {
            if !raw.get().trim_start().starts_with('{') {
                continue;
            }
            let part: Part<'_> = serde_json::from_str(raw.get())
                .map_err(|e| MediaError::InvalidBody(format!("messages[{m}].content[{p}]: {e}")))?;
            if let Some(url) = image_of(&part, m, p)? {
                images.push(ImageRef { url, message: m, part: p });
            }
        }
    }
    Ok(images)
}

fn image_of<'a>(part: &Part<'a>, m: usize, p: usize) -> Result<Option<Cow<'a, str>>, MediaError> {
    let unsupported = |kind: &str| MediaError::UnsupportedMedia { message: m, part: p, kind: kind.to_string() };
    let is_image = match part.kind.as_deref() {
        Some("image_url") | Some("input_image") => true,
        Some(kind) if UNSUPPORTED_KINDS.contains(&kind) => return Err(unsupported(kind)),
        None => part.image_url.is_some(),
        Some(_) => false,
    };
    if !is_image {
        // An unknown type that still carries a media payload is not silently dropped.
        let media_keys = [
            ("input_audio", part.input_audio.is_some()),
            ("audio_url", part.audio_url.is_some()),
            ("video_url", part.video_url.is_some()),
            ("file", part.file.is_some()),
            ("image_embeds", part.image_embeds.is_some()),
        ];
        if let Some((key, _)) = media_keys.iter().find(|(_, present)| *present) {
            return Err(unsupported(part.kind.as_deref().unwrap_or(key)));
        }
        return Ok(None);
    }
    let raw = part
        .image_url
        .ok_or_else(|| MediaError::InvalidUrl(format!("messages[{m}].content[{p}]: image_url missing")))?;
    let field: UrlField<'a> = serde_json::from_str(raw.get()).map_err(|_| {
        MediaError::InvalidUrl(format!(
            "messages[{m}].content[{p}].image_url: expected a string or {{\"url\": string}}"
        ))
    })?;
    Ok(Some(match field {
        UrlField::Plain(url) | UrlField::Object { url } => url,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_data_url_is_borrowed_from_the_body() {
        let body = br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}"#;
        let found = find_images(body).unwrap();
        assert_eq!(found.len(), 1);
        assert!(matches!(found[0].url, Cow::Borrowed(_)));
    }

    #[test]
    fn escaped_url_is_unescaped() {
        let body = br#"{"messages":[{"content":[{"type":"image_url","image_url":"http:\/\/x.test\/a.png"}]}]}"#;
        let found = find_images(body).unwrap();
        assert_eq!(found[0].url, "http://x.test/a.png");
    }

    #[test]
    fn invalid_json_is_an_error_not_a_panic() {
        assert_eq!(find_images(b"{\"messages\":[").unwrap_err().label(), "invalid_body");
        assert!(find_images(b"").is_err());
    }

    #[test]
    fn missing_url_is_invalid_url() {
        let body = br#"{"messages":[{"content":[{"type":"image_url"}]}]}"#;
        assert_eq!(find_images(body).unwrap_err().label(), "invalid_url");
        let body = br#"{"messages":[{"content":[{"type":"image_url","image_url":{"detail":"low"}}]}]}"#;
        assert_eq!(find_images(body).unwrap_err().label(), "invalid_url");
    }

    #[test]
    fn untyped_part_with_image_url_is_an_image() {
        let body = br#"{"messages":[{"content":[{"image_url":{"url":"https://a.test/x.png"}}]}]}"#;
        assert_eq!(find_images(body).unwrap().len(), 1);
    }
}
