//! What planning hands back: how the request is routed ([`Route`]), the plan routing matches on
//! ([`RoutePlan`], with each accounted image as a [`PlannedImage`] and where its `uuid` goes), the stage
//! timings, and the prompt trace for operators. Plain values: the server's observe stage turns them into
//! metrics, so nothing here records anything.

use std::ops::Range;
use std::time::Duration;

use crate::keys::ImageSpan;
use crate::media::ProbeTiming;

/// How a request is routed (the `x-mmrouter-route` header and the `route` metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Every image accounted exactly: blocks cover the whole prompt, images included.
    Exact,
    /// Some image (or the model) could not be accounted: the engine's own keys cover only the text
    /// before the first image; the conversation's affinity tail follows them (see [`RoutePlan::text_blocks`]).
    TextPrefix { reason: &'static str },
    /// No media in the request: blocks cover the whole prompt.
    NoMedia,
    /// A non-inference `/v1/*` call forwarded as is.
    Passthrough,
}

impl Route {
    pub fn label(&self) -> &'static str {
        match self {
            Route::Exact => "exact",
            Route::TextPrefix { .. } => "text_prefix",
            Route::NoMedia => "no_media",
            Route::Passthrough => "passthrough",
        }
    }
}

/// One accounted image (or video: [`PlannedImage::video`]) of an exact plan, in prompt order.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlannedImage {
    /// The image's identifier: the hex BLAKE3 digest of its bytes (the `uuid` written for vLLM), or the
    /// client's own uuid under `trust_client_uuids`.
    pub hash: String,
    /// Where to write `"uuid": hash` into the forwarded body (nothing when the client's uuid is trusted).
    #[serde(skip)]
    pub splice: Option<UuidSplice>,
    pub width: u32,
    pub height: u32,
    pub feature_tokens: u32,
    /// Tokens that replace the image's placeholder in the prompt.
    pub tokens: u32,
    /// A video: how it was counted (absent for an image). `width`/`height` are then its frame size,
    /// `feature_tokens` its `<|video_pad|>` tokens, `tokens` its whole run (timestamps included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub video: Option<PlannedVideo>,
}

/// How one video of an exact plan was counted.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PlannedVideo {
    /// `mp4`, `mov` or `jpeg_list`.
    pub format: &'static str,
    /// Frames the processor receives (after the engine's sampling).
    pub frames: u32,
    /// Temporal groups of two frames.
    pub groups: u32,
    pub tokens_per_group: u32,
    /// Each frame's size after the processor's resize (width, height).
    pub resized: (u32, u32),
    /// Qwen3-VL: each group's timestamp text; empty for Qwen2.5-VL.
    pub timestamps: Vec<String>,
}

/// Where an image part's `uuid` goes in the received body: replacing the client's value, or as a new
/// field right after the part's `image_url` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UuidSplice {
    pub image_url: Range<usize>,
    pub existing: Option<Range<usize>>,
}

/// What the pipeline decided about one request's prompt: the route and what routing matches on.
/// Selection results are not part of it: the caller holds the selection's decision.
#[derive(Debug)]
pub struct RoutePlan {
    pub route: Route,
    /// Chained KV block keys routing matches against the index.
    pub blocks: Vec<u64>,
    pub block_size: u32,
    /// Prompt tokens routing is based on: the whole prompt (exact, no_media), or on a text-prefix plan
    /// the prompt with each image as its one placeholder token (a lower bound of what the engine sees).
    pub prompt_tokens: u32,
    /// True when `prompt_tokens` is the whole prompt the model sees (drift is then measurable).
    pub prompt_exact: bool,
    /// Exact plans only.
    pub images: Vec<PlannedImage>,
    pub spans: Vec<ImageSpan>,
    pub decode_tokens: u32,
    /// The request carries `mm_processor_kwargs` or `media_io_kwargs`: vLLM then hashes each image's
    /// uuid together with them, so its KV events name these images differently from the router.
    pub images_rehashed: bool,
    /// Why a chat without media has no ids (its template, tokenizer or request the router cannot
    /// render exactly): it routes by load alone, and the reason is counted.
    pub unrendered: Option<&'static str>,
    /// Text-prefix plans: how many leading `blocks` are the text before the first image, the engine's
    /// own keys. The rest is the affinity tail: keys over the prompt as the template renders it, each
    /// image left as its one placeholder token, so a conversation that fell back keeps its worker on the
    /// next turn. The tail carries nothing of any image (no identity, no token count); no engine can
    /// announce those keys, so they are recorded as approximate entries and never confirmed.
    pub text_blocks: Option<usize>,
    /// Text-prefix plans whose prompt has image placeholders: how many leading blocks contain all of
    /// them. Once every placeholder is inside a keyed block, the engine's count of the prompt teaches
    /// the router what the prefix ending at the last block really holds ([`RoutePlan::unseen_key`]).
    pub placeholder_blocks: Option<usize>,
}

impl RoutePlan {
    pub(super) fn empty(route: Route, block_size: u32, decode_tokens: u32) -> RoutePlan {
        RoutePlan {
            route,
            blocks: Vec::new(),
            block_size,
            prompt_tokens: 0,
            prompt_exact: false,
            images: Vec::new(),
            spans: Vec::new(),
            decode_tokens,
            images_rehashed: false,
            unrendered: None,
            text_blocks: None,
            placeholder_blocks: None,
        }
    }

    /// A non-inference `/v1/*` call: forwarded as is, routed by load.
    pub fn passthrough(block_size: u32) -> RoutePlan {
        RoutePlan::empty(Route::Passthrough, block_size, 0)
    }

    /// Index of the first block holding image tokens (on a text-prefix plan, the first block of its
    /// affinity tail); `blocks.len()` when none does.
    pub fn first_image_block(&self) -> usize {
        let first = self.spans.first().map(|s| (s.offset / self.block_size.max(1)) as usize).or(self.text_blocks);
        first.unwrap_or(self.blocks.len()).min(self.blocks.len())
    }

    /// The block key under which the engine's count of this prompt is learnt (`routing::unseen`): a
    /// text-prefix plan's last block, when every image placeholder lies in a keyed block.
    pub fn unseen_key(&self) -> Option<u64> {
        let end = self.placeholder_blocks?;
        (matches!(self.route, Route::TextPrefix { .. }) && end <= self.blocks.len())
            .then(|| self.blocks.last().copied())?
    }

    /// Image tokens this request puts on its worker; zero unless the plan is exact.
    pub fn exact_image_tokens(&self) -> u32 {
        match self.route {
            Route::Exact => self.images.iter().map(|i| i.tokens).sum(),
            _ => 0,
        }
    }

    pub fn predicted_prompt_tokens(&self) -> Option<u32> {
        self.prompt_exact.then_some(self.prompt_tokens)
    }

    /// The fallback reason of a text-prefix plan.
    pub fn fallback_reason(&self) -> Option<&'static str> {
        match self.route {
            Route::TextPrefix { reason } => Some(reason),
            _ => None,
        }
    }

    /// Why the plan does not route on the whole prompt's ids: an image chat's fallback reason, or why
    /// a text chat could not be rendered.
    pub fn reason(&self) -> Option<&'static str> {
        self.fallback_reason().or(self.unrendered)
    }
}

/// Time spent in each stage of [`Pipeline::plan`](super::Pipeline::plan) (the
/// `mmrouter_stage_duration_seconds` samples).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimings {
    /// `None` for completions (no images to read or account).
    pub intake: Option<Duration>,
    pub account: Option<Duration>,
    pub plan: Duration,
}

/// The outcome of planning: the plan, and what happened on the way (for the observe stage).
#[derive(Debug)]
pub struct Planned {
    pub plan: RoutePlan,
    pub timings: StageTimings,
    /// One sample per image read (data URL or fetch).
    pub probes: Vec<ProbeTiming>,
    /// The prompt as routing saw it, when asked for ([`Pipeline::plan_with`](super::Pipeline::plan_with)).
    pub trace: Option<PromptTrace>,
}

/// What the model sees, as the router computed it: for operators to compare with the worker's own
/// rendering (`/debug/route?tokens=true`, `mmrouter render`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PromptTrace {
    /// The rendered chat (before image expansion); `None` for completions.
    pub text: Option<String>,
    /// The token ids the plan's blocks are cut from: the whole prompt, or the text prefix of a
    /// fallback.
    pub ids: Vec<u32>,
    /// Where each image's tokens sit in `ids` (exact plans only).
    pub spans: Vec<ImageSpan>,
}
