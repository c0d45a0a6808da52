//! Planning primitives: the prompt's token ids as the worker will see them (chat template,
//! tokenizer, each image placeholder expanded to its exact run) and the image spans inside them. The
//! chained KV block keys cut from them are computed in [`crate::keys`] (shared with routing's event
//! side) and re-exported here.
//!
//! These are pure functions; the gate (all images accounted or text-prefix fallback) and the
//! `RoutePlan` are built around them by the pipeline.

use serde_json::Value as Json;

use crate::accounting::{RunPart, TextExpansion};
use crate::prompt::{ChatIdsError, PromptError, PromptModel, RenderOptions};
use crate::request::Request;

pub use crate::keys::{block_keys, seed, ImageSpan};

/// Why a prompt could not be planned. `label()` values are Prometheus `reason` labels.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("the rendered prompt has {placeholders} image placeholder(s) but the request has {images} image(s)")]
    PlaceholderMismatch { placeholders: usize, images: usize },
    #[error("image placeholder {0:?} is not a single token of this tokenizer")]
    PlaceholderNotAToken(String),
    /// Two images' placeholder ranges share a token (Gemma 3 images with no text between them):
    /// vLLM refuses such a prompt.
    #[error("two images' placeholder ranges overlap (adjacent images); vLLM refuses the prompt")]
    PlaceholdersOverlap,
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Over a per-request limit (`unit`: "bytes" of rendered text, or "tokens"): refused, not routed.
    #[error("the prompt has {size} {unit}, above the limit of {limit} (model.max_prompt_{unit})")]
    PromptTooLong { unit: &'static str, size: usize, limit: usize },
}

impl PlanError {
    pub fn label(&self) -> &'static str {
        match self {
            PlanError::Prompt(e) => e.label(),
            PlanError::PlaceholderMismatch { .. } | PlanError::PlaceholderNotAToken(_) => "placeholder_mismatch",
            PlanError::PlaceholdersOverlap => "placeholder_overlap",
            PlanError::InvalidRequest(_) => "invalid_request",
            PlanError::PromptTooLong { .. } => "prompt_too_long",
        }
    }
}

/// A rendered and tokenized chat, before image expansion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTokens {
    pub ids: Vec<u32>,
    /// Positions of the image placeholder token in `ids`, in order.
    pub placeholders: Vec<usize>,
    /// Positions of the video placeholder token in `ids`, in order (located only for a request with
    /// video parts, on a model with a video placeholder).
    pub videos: Vec<usize>,
    /// The rendered prompt (kept for expansions done in text space).
    pub text: String,
}

/// The prompt after every placeholder was replaced by its image's run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expanded {
    pub ids: Vec<u32>,
    pub spans: Vec<ImageSpan>,
}

/// Renders and tokenizes a chat request and finds the image placeholders (`placeholder` is the
/// placeholder token's text, e.g. "<|image_pad|>").
pub fn tokenize_chat(
    model: &PromptModel,
    request: &Request<'_>,
    placeholder: &str,
    opts: &RenderOptions<'_>,
) -> Result<ChatTokens, PlanError> {
    tokenize_media_chat(model, request, placeholder, None, opts)
}

/// [`tokenize_chat`], also finding the video placeholders (`video_placeholder`, e.g.
/// "<|video_pad|>") when the request has video parts.
pub fn tokenize_media_chat(
    model: &PromptModel,
    request: &Request<'_>,
    placeholder: &str,
    video_placeholder: Option<&str>,
    opts: &RenderOptions<'_>,
) -> Result<ChatTokens, PlanError> {
    // A placeholder that is not a token only matters when there is media to put there.
    let has_images = request.images.iter().any(|i| !i.is_video());
    let placeholder_id = match model.token_id(placeholder) {
        Some(id) => Some(id),
        None if !has_images => None,
        None => return Err(PlanError::PlaceholderNotAToken(placeholder.to_owned())),
    };
    let video_id = match video_placeholder.filter(|_| request.has_videos()) {
        Some(p) => Some(model.token_id(p).ok_or_else(|| PlanError::PlaceholderNotAToken(p.to_owned()))?),
        None => None,
    };
    let (text, ids) = chat_ids(model, request, opts)?;
    let at = |want: Option<u32>| -> Vec<usize> {
        ids.iter().enumerate().filter_map(|(i, &id)| (Some(id) == want).then_some(i)).collect()
    };
    let (placeholders, videos) = (at(placeholder_id), at(video_id));
    Ok(ChatTokens { ids, placeholders, videos, text })
}

/// Refuses text above `limit` before it is tokenized (the expensive step: ~0.1 µs per token with
/// `mmrouter-tokenize`, ~1–2 µs with `tokenizers`).
pub(crate) fn check_prompt_bytes(size: usize, limit: Option<usize>) -> Result<(), PlanError> {
    match limit {
        Some(limit) if size > limit => Err(PlanError::PromptTooLong { unit: "bytes", size, limit }),
        _ => Ok(()),
    }
}

/// The rendered chat and its ids (vLLM adds no special tokens unless the request asks,
/// `add_special_tokens`); text over `max_prompt_bytes` is refused before it is tokenized.
pub(crate) fn chat_ids(
    model: &PromptModel,
    request: &Request<'_>,
    opts: &RenderOptions<'_>,
) -> Result<(String, Vec<u32>), PlanError> {
    model.chat_ids(request, opts).map_err(|e| match e {
        ChatIdsError::Prompt(e) => PlanError::Prompt(e),
        ChatIdsError::TooLong { size, limit } => PlanError::PromptTooLong { unit: "bytes", size, limit },
    })
}

/// Replaces placeholder i by `images[i]`'s text expansion *in the rendered text* and tokenizes the
/// result, as the HF processor does, so the expansion's edges merge with their neighbours exactly as
/// on the worker (Gemma 3's `"\n\n"`). Each image's span is its run of embedding tokens plus the
/// expansion's `wrap` tokens on each side.
pub(crate) fn expand_text(
    model: &PromptModel,
    tokens: &ChatTokens,
    placeholder: &str,
    images: &[(u128, &TextExpansion)],
) -> Result<Expanded, PlanError> {
    if tokens.placeholders.len() < images.len() {
        return Err(PlanError::PlaceholderMismatch { placeholders: tokens.placeholders.len(), images: images.len() });
    }
    // As vLLM: the first N placeholders are the images'; one the user typed after them stays text.
    let pieces: Vec<&str> = tokens.text.splitn(images.len() + 1, placeholder).collect();
    if pieces.len() != images.len() + 1 {
        return Err(PlanError::PlaceholderMismatch { placeholders: pieces.len() - 1, images: images.len() });
    }
    let mut text = String::with_capacity(tokens.text.len() + images.iter().map(|(_, e)| e.text.len()).sum::<usize>());
    for (piece, (_, expansion)) in pieces.iter().zip(images) {
        text.push_str(piece);
        text.push_str(&expansion.text);
    }
    text.push_str(pieces.last().copied().unwrap_or_default());
    let ids = model.encode(&text)?;
    let mut spans: Vec<ImageSpan> = Vec::with_capacity(images.len());
    let mut at = 0;
    for (hash, expansion) in images {
        let embed = model
            .token_id(expansion.embed_token)
            .ok_or_else(|| PlanError::PlaceholderNotAToken(expansion.embed_token.to_owned()))?;
        let start = ids[at..].iter().position(|&id| id == embed).map(|p| p + at);
        let len = expansion.embed_count as usize;
        let wrap = expansion.wrap as usize;
        let run_ok = start.is_some_and(|s| ids.get(s..s + len).is_some_and(|run| run.iter().all(|&id| id == embed)));
        let (Some(start), true) = (start, run_ok && start.is_some_and(|s| s >= wrap && s + len + wrap <= ids.len()))
        else {
            return Err(PlanError::PlaceholderMismatch { placeholders: spans.len(), images: images.len() });
        };
        let too_long = || PlanError::InvalidRequest("expanded prompt exceeds u32 offsets".into());
        let offset = u32::try_from(start - wrap).map_err(|_| too_long())?;
        // Adjacent images share the token their "\n\n" merged into: vLLM refuses overlapping ranges.
        if spans.last().is_some_and(|prev| prev.end() > u64::from(offset)) {
            return Err(PlanError::PlaceholdersOverlap);
        }
        let span_len = u32::try_from(len + 2 * wrap).map_err(|_| too_long())?;
        spans.push(ImageSpan { offset, len: span_len, hash: *hash });
        at = start + len;
    }
    Ok(Expanded { ids, spans })
}

/// Token ids of a `/v1/completions` request's `prompt`: a string, a list of token ids, or a
/// one-element list of either. Batches (several prompts) are `invalid_request`. Strings get the
/// tokenizer's special tokens, as vLLM's completions default `add_special_tokens=true` does.
pub fn tokenize_completion(
    model: &PromptModel,
    request: &Request<'_>,
    max_prompt_bytes: Option<usize>,
) -> Result<Vec<u32>, PlanError> {
    let prompt = request.field("prompt").ok_or_else(|| PlanError::InvalidRequest("`prompt` is missing".into()))?;
    let encode = |s: &str| {
        check_prompt_bytes(s.len(), max_prompt_bytes)?;
        Ok(model.encode_with(s, true)?)
    };
    match prompt {
        Json::String(s) => encode(s),
        Json::Array(items) => match items.as_slice() {
            [Json::String(s)] => encode(s),
            [Json::Array(ids)] => token_ids(ids),
            [] => Err(PlanError::InvalidRequest("`prompt` is an empty list".into())),
            [Json::Number(_), ..] => token_ids(items),
            _ => Err(PlanError::InvalidRequest(
                "`prompt` must be a string, a list of token ids, or a one-element list of either".into(),
            )),
        },
        _ => Err(PlanError::InvalidRequest("`prompt` must be a string or a list of token ids".into())),
    }
}

fn token_ids(items: &[Json]) -> Result<Vec<u32>, PlanError> {
    if items.is_empty() {
        return Err(PlanError::InvalidRequest("`prompt` has no token ids".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| PlanError::InvalidRequest(format!("`prompt[{i}]` is not a token id (0..=4294967295)")))
        })
        .collect()
}

/// Replaces placeholder i by `images[i]`'s run (`(content hash, run parts)`), recording where
/// each image landed. Run-part texts that are one token map to that id; longer texts are
/// tokenized on their own, as vLLM tokenizes a replacement string.
pub fn expand(model: &PromptModel, tokens: &ChatTokens, images: &[(u128, &[RunPart])]) -> Result<Expanded, PlanError> {
    if tokens.placeholders.len() < images.len() {
        return Err(PlanError::PlaceholderMismatch { placeholders: tokens.placeholders.len(), images: images.len() });
    }
    // As vLLM: the first N placeholders are the images'; one the user typed after them stays text.
    expand_at(model, tokens, &tokens.placeholders[..images.len()], images)
}

/// [`expand`] at given placeholder positions (increasing, one per item: images and videos in prompt
/// order), each replaced by its item's run.
pub fn expand_at(
    model: &PromptModel,
    tokens: &ChatTokens,
    placeholders: &[usize],
    images: &[(u128, &[RunPart])],
) -> Result<Expanded, PlanError> {
    if placeholders.len() != images.len() {
        return Err(PlanError::PlaceholderMismatch { placeholders: placeholders.len(), images: images.len() });
    }
    // ChatTokens has public fields: check the positions before slicing by them.
    let ordered = placeholders.windows(2).all(|w| w[0] < w[1]);
    if !ordered || placeholders.last().is_some_and(|&p| p >= tokens.ids.len()) {
        return Err(PlanError::InvalidRequest("placeholder positions must be increasing and inside the ids".into()));
    }
    // Resolve each distinct part text once (runs repeat the same few texts).
    let mut resolved: Vec<(&str, Vec<u32>)> = Vec::new();
    let mut runs: Vec<Vec<(usize, u32)>> = Vec::with_capacity(images.len());
    let mut total = tokens.ids.len() - images.len(); // ≥ 0: each placeholder is a distinct id position
    for (_, parts) in images {
        let mut run = Vec::with_capacity(parts.len());
        for part in parts.iter() {
            let text: &str = &part.text;
            let idx = match resolved.iter().position(|(t, _)| *t == text) {
                Some(i) => i,
                None => {
                    let ids = match model.token_id(text) {
                        Some(id) => vec![id],
                        None => model.encode(text)?,
                    };
                    resolved.push((text, ids));
                    resolved.len() - 1
                }
            };
            let len = resolved[idx]
                .1
                .len()
                .checked_mul(part.repeat as usize)
                .and_then(|n| total.checked_add(n))
                .ok_or_else(|| PlanError::InvalidRequest("expanded prompt length overflows".into()))?;
            total = len;
            run.push((idx, part.repeat));
        }
        runs.push(run);
    }
    let too_long = || PlanError::InvalidRequest(format!("expanded prompt of {total} tokens exceeds u32 offsets"));
    u32::try_from(total).map_err(|_| too_long())?;

    let mut ids = Vec::with_capacity(total);
    let mut spans = Vec::with_capacity(images.len());
    let mut prev = 0;
    for ((&pos, (hash, _)), run) in placeholders.iter().zip(images).zip(&runs) {
        ids.extend_from_slice(&tokens.ids[prev..pos]);
        let start = ids.len();
        for &(idx, repeat) in run {
            let part_ids = &resolved[idx].1;
            for _ in 0..repeat {
                ids.extend_from_slice(part_ids);
            }
        }
        // Both fit: total was checked against u32 above.
        let offset = u32::try_from(start).map_err(|_| too_long())?;
        let len = u32::try_from(ids.len() - start).map_err(|_| too_long())?;
        spans.push(ImageSpan { offset, len, hash: *hash });
        prev = pos + 1;
    }
    ids.extend_from_slice(&tokens.ids[prev..]);
    Ok(Expanded { ids, spans })
}

/// The text-prefix fallback: ids before the first image or video placeholder (all ids if none).
pub fn text_prefix(tokens: &ChatTokens) -> &[u32] {
    let first = [tokens.placeholders.first(), tokens.videos.first()].into_iter().flatten().min();
    let end = first.copied().unwrap_or(tokens.ids.len());
    &tokens.ids[..end.min(tokens.ids.len())]
}
