//! Nemotron-3-Nano-Omni dynamic resolution: each image gets a patch grid under a patch budget, and
//! vLLM shares one budget (from `max_model_len` minus the text) across all images of a request, so
//! one image's count depends on the others. `count_all` implements that request-wide loop.

use super::error::AccountingError;
use super::kwargs::{Layers, CONFIG_FILE};
use super::num::{self, exact, mul, py_round, to_u32, to_u64};
use super::{ImageTokens, RequestContext, RunPart, Structure};

pub(super) const PLACEHOLDER: &str = "<image>";
const START: &str = "<img>";
const END: &str = "</img>";
/// The 0.5 pixel shuffle turns 4 patches into one token.
const PATCHES_PER_TOKEN: u64 = 4;
/// vLLM reserves these tokens besides the text.
const RESERVED: i64 = 4;
/// vLLM's budget loop gives up after this many rounds.
const MAX_ROUNDS: u32 = 10;

/// The dynamic path is the one whose vision args carry a patch budget.
pub(super) fn is_dynamic(l: &Layers) -> bool {
    l.cfg(&["vision_config", "args", "min_num_patches"]).is_some()
}

#[derive(Clone, Debug)]
pub(super) struct Spec {
    patch: u64,
    min_patches: u64,
    max_patches: u64,
}

fn agree_f64(l: &Layers, pp_key: &str, cfg_value: f64, cfg_key: &str) -> Result<(), AccountingError> {
    if let Some(found) = l.proc(pp_key) {
        if found.f64(pp_key)? != cfg_value {
            return Err(found.invalid(pp_key, format!("disagrees with {CONFIG_FILE} {cfg_key} = {cfg_value}")));
        }
    }
    Ok(())
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let patch = l.cfg_pos(&["patch_size"])?;
        let image_size = l.cfg_pos(&["force_image_size"])?;
        let downsample = l.cfg_f64(&["downsample_ratio"])?;
        if downsample != 0.5 {
            return Err(super::kwargs::invalid_at(CONFIG_FILE, "downsample_ratio", "must be exactly 0.5"));
        }
        // Duplicated values must agree, or the count would depend on which file the engine reads.
        agree_f64(l, "image_size", image_size as f64, "force_image_size")?;
        agree_f64(l, "patch_size", patch as f64, "patch_size")?;
        agree_f64(l, "downsample_ratio", downsample, "downsample_ratio")?;
        let min_patches = l.cfg_pos(&["vision_config", "args", "min_num_patches"])?;
        let max_patches = l.cfg_pos(&["vision_config", "args", "max_num_patches"])?;
        if min_patches > max_patches {
            return Err(super::kwargs::invalid_at(
                CONFIG_FILE,
                "vision_config.args.min_num_patches",
                format!("{min_patches} exceeds max_num_patches {max_patches}"),
            ));
        }
        Ok(Spec { patch, min_patches, max_patches })
    }

    /// Patch grid `(rows, cols)` of one image under `budget` patches.
    fn patches(&self, width: u32, height: u32, budget: u64) -> Result<(u64, u64), AccountingError> {
        num::nonzero(width, height)?;
        let p = exact(self.patch, "patch_size")?;
        let ch = to_u64(py_round(f64::from(height) / p + 0.5), "patch rows")?;
        let cw = to_u64(py_round(f64::from(width) / p + 0.5), "patch cols")?;
        let b = exact(budget, "patch budget")?;
        let factor = (b / exact(mul(ch, cw, "patches")?, "patches")?).sqrt().min(1.0);
        let mut th = to_u64((factor * exact(ch, "patch rows")?).floor(), "patch rows")?;
        let mut tw = to_u64((factor * exact(cw, "patch cols")?).floor(), "patch cols")?;
        if budget > self.min_patches && th * tw < self.min_patches {
            if th == 0 || tw == 0 {
                return Err(AccountingError::TooSmall {
                    width,
                    height,
                    detail: "the patch budget leaves a 0-patch side",
                });
            }
            let up = (exact(self.min_patches, "min_num_patches")? / exact(th * tw, "patches")?).sqrt();
            th = to_u64((up * exact(th, "patch rows")?).ceil(), "patch rows")?;
            tw = to_u64((up * exact(tw, "patch cols")?).ceil(), "patch cols")?;
        }
        if th % 2 == 1 {
            th = if mul(th + 1, tw, "patches")? <= budget { th + 1 } else { (th - 1).max(2) };
        }
        if tw % 2 == 1 {
            tw = if mul(th, tw + 1, "patches")? <= budget { tw + 1 } else { (tw - 1).max(2) };
        }
        if th == 0 || tw == 0 {
            return Err(AccountingError::TooSmall { width, height, detail: "the patch budget leaves a 0-patch side" });
        }
        mul(th, tw, "patches")?;
        Ok((th, tw))
    }

    fn tokens(&self, (th, tw): (u64, u64)) -> Result<ImageTokens, AccountingError> {
        let feature = to_u32(th * tw / PATCHES_PER_TOKEN, "image tokens")?;
        Ok(ImageTokens {
            feature_tokens: feature,
            expansion_tokens: Some(feature.checked_add(2).ok_or(AccountingError::Overflow { what: "expansion" })?),
            structure: Structure::NemotronOmni {
                patches_h: to_u32(th, "patch rows")?,
                patches_w: to_u32(tw, "patch cols")?,
            },
        })
    }

    /// One image with the whole per-image budget (`max_num_patches`).
    pub(super) fn count_single(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        self.tokens(self.patches(width, height, self.max_patches)?)
    }

    /// vLLM's request-wide budget: shrink every image's budget in proportion until the total fits.
    pub(super) fn count_all(
        &self,
        sizes: &[(u32, u32)],
        ctx: &RequestContext,
    ) -> Result<Vec<ImageTokens>, AccountingError> {
        if sizes.is_empty() {
            return Ok(Vec::new());
        }
        for &(w, h) in sizes {
            num::nonzero(w, h)?;
        }
        let family = "nemotron_omni";
        let max_model_len =
            ctx.max_model_len.ok_or(AccountingError::NeedsRequestContext { family, field: "max_model_len" })?;
        let text = ctx.text_tokens.ok_or(AccountingError::NeedsRequestContext { family, field: "text_tokens" })?;
        let avail = i64::from(max_model_len) - i64::from(text) - RESERVED;
        if avail < 0 {
            return Err(AccountingError::BudgetUnderflow { max_model_len, text_tokens: text });
        }
        let n = sizes.len() as u64;
        let total = (avail as u64 * PATCHES_PER_TOKEN).max(mul(self.min_patches, n, "patch budget")?);
        let mut budgets = vec![total.clamp(self.min_patches, self.max_patches); sizes.len()];
        for _ in 0..MAX_ROUNDS {
            let grids =
                sizes.iter().zip(&budgets).map(|(&(w, h), &b)| self.patches(w, h, b)).collect::<Result<Vec<_>, _>>()?;
            let raw: Vec<u64> = grids.iter().map(|(th, tw)| th * tw).collect();
            let sum = raw
                .iter()
                .try_fold(0u64, |acc, r| acc.checked_add(*r))
                .ok_or(AccountingError::Overflow { what: "patch sum" })?;
            if sum <= total {
                return grids.into_iter().map(|g| self.tokens(g)).collect();
            }
            let shrunk: Vec<u64> = raw
                .iter()
                .map(|&r| {
                    let share = u128::from(r) * u128::from(total) / u128::from(sum);
                    u64::try_from(share).unwrap_or(u64::MAX).max(self.min_patches)
                })
                .collect();
            budgets = if shrunk.iter().zip(&budgets).any(|(new, old)| new < old) {
                shrunk
            } else {
                vec![self.min_patches; sizes.len()]
            };
        }
        Err(AccountingError::NoConvergence { iterations: MAX_ROUNDS })
    }
}

pub(super) fn run(feature: u32) -> Vec<RunPart> {
    vec![RunPart::new(START, 1), RunPart::new(PLACEHOLDER, feature), RunPart::new(END, 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn omni() -> Spec {
        Spec { patch: 16, min_patches: 1024, max_patches: 13_312 }
    }

    #[test]
    fn single_image_goldens() {
        for ((w, h), want) in [
            ((224, 224), 256),
            ((64, 32), 276),
            ((512, 512), 256),
            ((1000, 500), 512),
            ((500, 1000), 512),
            ((1024, 1024), 1024),
            ((1536, 1536), 2304),
            ((1920, 1080), 2040),
        ] {
            assert_eq!(omni().count_single(w, h).map(|t| t.feature_tokens), Ok(want), "{w}x{h}");
        }
    }

    #[test]
    fn request_wide_budget_depends_on_text_and_other_images() {
        let three = [(1920, 1080); 3];
        let ctx = |text| RequestContext { max_model_len: Some(4096), text_tokens: Some(text) };
        let with_text = omni().count_all(&three, &ctx(10)).unwrap();
        assert!(with_text.iter().all(|t| t.feature_tokens == 1344));
        let without = omni().count_all(&three, &ctx(0)).unwrap();
        assert!(without.iter().all(|t| t.feature_tokens == 1323));
        let single =
            omni().count_all(&three[..1], &RequestContext { max_model_len: Some(131_072), text_tokens: Some(0) });
        assert_eq!(single.map(|v| v[0].feature_tokens), Ok(2040));
    }

    #[test]
    fn request_context_errors() {
        let err = omni().count_all(&[(10, 10)], &RequestContext::default()).unwrap_err();
        assert_eq!(err.label(), "needs_request_context");
        let ctx = RequestContext { max_model_len: Some(10), text_tokens: Some(20) };
        assert_eq!(omni().count_all(&[(10, 10)], &ctx).unwrap_err().label(), "budget_underflow");
    }
}
