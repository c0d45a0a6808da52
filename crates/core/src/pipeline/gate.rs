//! **The gate** (after Dynamo PR #16947): a request with images is planned `Exact` only if *every* image
//! was read, accounted and expanded; any failure makes it a `TextPrefix { reason }` plan whose engine
//! keys are only those before the first image, followed by an affinity tail over the unexpanded prompt
//! (each image one placeholder token), carrying nothing of the images that did succeed. Also where a
//! plan's block keys are cut from its ids ([`Gate::set_blocks`]), for every route.

use std::sync::Arc;

use crate::accounting::{RunPart, TextExpansion};
use crate::keys::ImageSpan;
use crate::pipeline::account::{Accounted, Expansion};
use crate::pipeline::error::Fallback;
use crate::pipeline::output::{PromptTrace, Route, RoutePlan};
use crate::plan::{self, ChatTokens, PlanError};
use crate::prompt::PromptModel;
use crate::request::MediaKind;

/// A plan being built, with its trace if one was asked for.
pub(super) struct Draft {
    pub plan: RoutePlan,
    pub trace: Option<PromptTrace>,
}

/// What the gate needs from the pipeline, borrowed for one request.
pub(super) struct Gate<'p> {
    pub model: &'p PromptModel,
    /// The image placeholder token's text; `None` when the model has no accounting profile.
    pub placeholder: Option<&'p str>,
    pub block_size: u32,
}

impl Gate<'_> {
    /// An exact plan only if every image was accounted and expanded; otherwise a text-prefix plan with
    /// the reason, carrying nothing of the images.
    pub(super) fn gate(
        &self,
        out: &mut Draft,
        tokens: Result<Arc<ChatTokens>, PlanError>,
        accounted: Result<Vec<Accounted>, Fallback>,
        has_media: bool,
        seed: u64,
    ) {
        match (tokens, accounted) {
            // An image that cannot be accounted is the reason, whatever else also failed.
            (tokens, Err(reason)) => {
                out.plan.route = Route::TextPrefix { reason };
                // Without a known placeholder the image position is unknown: route by load only.
                if let (Ok(tokens), Some(_)) = (&tokens, self.placeholder) {
                    self.set_fallback_blocks(out, tokens, seed);
                }
            }
            (Err(e), Ok(_)) if has_media => out.plan.route = Route::TextPrefix { reason: e.label() },
            // Never routes on ids it cannot stand behind: no blocks, and the reason is counted.
            (Err(e), Ok(_)) => {
                tracing::debug!("prompt not rendered ({e}); routing by load only");
                out.plan.unrendered = Some(e.label());
            }
            // Without images nothing is expanded: a placeholder the user typed stays the one token it is.
            (Ok(tokens), Ok(acc)) if acc.is_empty() && !has_media => {
                self.set_blocks(out, &tokens.ids, &[], seed, true);
            }
            (Ok(tokens), Ok(acc)) => match self.expand(&tokens, &acc) {
                Ok((expanded, order)) => {
                    out.plan.route = Route::Exact;
                    self.set_blocks(out, &expanded.ids, &expanded.spans, seed, true);
                    out.plan.spans = expanded.spans;
                    // In prompt order, as the spans.
                    let mut planned: Vec<Option<_>> = acc.into_iter().map(|a| Some(a.planned)).collect();
                    out.plan.images = order.iter().filter_map(|&i| planned[i].take()).collect();
                    // A video's run holds texts tokenized on their own (Qwen3-VL's timestamps): its
                    // tokens are its span's.
                    for (image, span) in out.plan.images.iter_mut().zip(&out.plan.spans) {
                        if image.video.is_some() {
                            image.tokens = span.len;
                        }
                    }
                }
                Err(e) => {
                    out.plan.route = Route::TextPrefix { reason: e.label() };
                    self.set_fallback_blocks(out, &tokens, seed);
                }
            },
        }
    }

    /// Each image's (and video's) placeholder replaced by its run: in token space, or in text space
    /// for image families whose expansion merges with its neighbours. Also the order of `acc` in the
    /// prompt (the spans' order).
    fn expand(&self, tokens: &ChatTokens, acc: &[Accounted]) -> Result<(plan::Expanded, Vec<usize>), PlanError> {
        let texts: Option<Vec<(u128, &TextExpansion)>> = acc
            .iter()
            .map(|a| match &a.expansion {
                Expansion::Text(t) => Some((a.hash, t)),
                Expansion::Tokens(_) => None,
            })
            .collect();
        if let (Some(texts), Some(p)) = (texts, self.placeholder) {
            return Ok((plan::expand_text(self.model, tokens, p, &texts)?, (0..acc.len()).collect()));
        }
        let runs: Option<Vec<(u128, &[RunPart])>> = acc
            .iter()
            .map(|a| match &a.expansion {
                Expansion::Tokens(run) => Some((a.hash, run.as_slice())),
                Expansion::Text(_) => None,
            })
            .collect();
        let runs = runs.ok_or(PlanError::InvalidRequest("mixed image expansions".into()))?;
        if acc.iter().all(|a| a.kind == MediaKind::Image) {
            return Ok((plan::expand(self.model, tokens, &runs)?, (0..acc.len()).collect()));
        }
        // As vLLM, per modality: the n-th image takes the n-th image placeholder, the n-th video the
        // n-th video placeholder; the runs then go in at those positions, in prompt order.
        let (mut images, mut videos) = (tokens.placeholders.iter(), tokens.videos.iter());
        let mut at = Vec::with_capacity(acc.len());
        for (i, a) in acc.iter().enumerate() {
            let pos = match a.kind {
                MediaKind::Image => images.next(),
                MediaKind::Video => videos.next(),
            };
            let mismatch = || PlanError::PlaceholderMismatch {
                placeholders: tokens.placeholders.len() + tokens.videos.len(),
                images: acc.len(),
            };
            at.push((*pos.ok_or_else(mismatch)?, i));
        }
        at.sort_unstable();
        let positions: Vec<usize> = at.iter().map(|&(p, _)| p).collect();
        let ordered: Vec<(u128, &[RunPart])> = at.iter().map(|&(_, i)| runs[i]).collect();
        let expanded = plan::expand_at(self.model, tokens, &positions, &ordered)?;
        Ok((expanded, at.into_iter().map(|(_, i)| i).collect()))
    }

    /// A text-prefix plan's blocks: the text before the first image, then the affinity tail over the
    /// unexpanded rest (each image its one placeholder token, so no image's identity or size is in
    /// it). Without the tail every fallback turn of every conversation behind the same system prompt
    /// would route on the same keys and scatter over the pool, re-prefilling its history each turn.
    fn set_fallback_blocks(&self, out: &mut Draft, tokens: &ChatTokens, seed: u64) {
        let prefix = plan::text_prefix(tokens).len();
        self.set_blocks(out, &tokens.ids, &[], seed, false);
        let bs = self.block_size.max(1) as usize;
        out.plan.text_blocks = Some(prefix / bs);
        let last = [tokens.placeholders.last(), tokens.videos.last()].into_iter().flatten().max();
        out.plan.placeholder_blocks = last.map(|&p| p / bs + 1);
    }

    /// The plan routes on `ids` (with `spans`): its block keys, its token count, and whether that is
    /// the whole prompt; the trace keeps them too.
    pub(super) fn set_blocks(&self, out: &mut Draft, ids: &[u32], spans: &[ImageSpan], seed: u64, whole: bool) {
        let plan = &mut out.plan;
        plan.prompt_tokens = ids.len().min(u32::MAX as usize) as u32;
        plan.prompt_exact = whole;
        plan.blocks = plan::block_keys(ids, spans, self.block_size as usize, seed);
        if let Some(trace) = &mut out.trace {
            trace.ids = ids.to_vec();
            trace.spans = spans.to_vec();
        }
    }
}
