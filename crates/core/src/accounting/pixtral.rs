//! Pixtral-12B / Mistral-Small-3.1 (Mistral3): scale down to `longest_edge`, then one `[IMG]` per
//! `patch × merge` cell, an `[IMG_BREAK]` after each row and `[IMG_END]` after the last.
//!
//! The downscale rounds differently by serving path: HF processors floor, mistral_common (vLLM
//! `--tokenizer-mode mistral`) rounds ties-to-even and clamps to 1. The server-level proxy key
//! `tokenizer_mode` (`"hf"`/`"auto"` or `"mistral"`) selects it; the HF files alone imply `"hf"`.

use super::error::AccountingError;
use super::kwargs::{missing, Found, Layers, CONFIG_FILE, PREPROCESSOR_FILE, SERVER_KWARGS, TOKENIZER_MODE};
use super::num::{self, exact, mul, py_round, to_u32, to_u64};
use super::{Family, ImageTokens, RunPart, Structure};

pub(super) const IMG: &str = "[IMG]";
const BREAK: &str = "[IMG_BREAK]";
const END: &str = "[IMG_END]";
pub(super) const KWARGS: &[&str] = &[];

/// How the downscale to `longest_edge` rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PixtralRounding {
    /// HF `PixtralImageProcessor` (and SGLang): `floor`.
    Floor,
    /// mistral_common ≥ 1.13: `max(1, round())`, ties to even.
    MistralCommon,
}

#[derive(Clone, Debug)]
pub(super) struct Spec {
    unit: u64,
    longest: u64,
    rounding: PixtralRounding,
}

/// `patch_size` as a number or a square `{height, width}` object.
fn patch_size(found: Found) -> Result<u64, AccountingError> {
    let Some(obj) = found.value.as_object() else {
        return found.pos("patch_size");
    };
    let get = |k: &str| match obj.get(k) {
        Some(value) => Found { value, origin: found.origin }.pos(&format!("patch_size.{k}")),
        None => Err(missing(PREPROCESSOR_FILE, &format!("patch_size.{k}"))),
    };
    let (h, w) = (get("height")?, get("width")?);
    if h != w {
        return Err(found.invalid("patch_size", "non-square patches are not modelled"));
    }
    Ok(h)
}

impl Spec {
    pub(super) fn build(l: &Layers, family: Family) -> Result<Spec, AccountingError> {
        let patch = patch_size(l.proc("patch_size").ok_or_else(|| missing(PREPROCESSOR_FILE, "patch_size"))?)?;
        super::qwen::agree(l, &["vision_config", "patch_size"], patch)?;
        let merge = match (family, l.cfg_found(&["spatial_merge_size"])) {
            (_, Some(found)) => found.pos("spatial_merge_size")?,
            // A `llava` checkpoint has no merge layer at all.
            (Family::Pixtral, None) => 1,
            (_, None) => return Err(missing(CONFIG_FILE, "spatial_merge_size")),
        };
        let longest = l.proc_nested_u64("size", "longest_edge")?;
        if longest == 0 {
            return Err(super::kwargs::invalid_at(PREPROCESSOR_FILE, "size.longest_edge", "must be positive"));
        }
        let rounding = match l.server_value(TOKENIZER_MODE).map(|v| v.as_str()) {
            None | Some(Some("auto")) | Some(Some("hf")) => PixtralRounding::Floor,
            Some(Some("mistral")) => PixtralRounding::MistralCommon,
            Some(_) => {
                return Err(super::kwargs::kwarg_error(
                    SERVER_KWARGS,
                    TOKENIZER_MODE,
                    "must be \"auto\", \"hf\" or \"mistral\"",
                ))
            }
        };
        Ok(Spec { unit: mul(patch, merge, "patch_size * spatial_merge_size")?, longest, rounding })
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        num::nonzero(width, height)?;
        let (mut h, mut w) = (u64::from(height), u64::from(width));
        let (hf, wf) = (f64::from(height), f64::from(width));
        let longest = exact(self.longest, "longest_edge")?;
        let ratio = (hf / longest).max(wf / longest);
        if ratio > 1.0 {
            match self.rounding {
                PixtralRounding::Floor => {
                    h = to_u64((hf / ratio).floor(), "resized height")?;
                    w = to_u64((wf / ratio).floor(), "resized width")?;
                }
                PixtralRounding::MistralCommon => {
                    h = to_u64(py_round(hf / ratio), "resized height")?.max(1);
                    w = to_u64(py_round(wf / ratio), "resized width")?.max(1);
                }
            }
        }
        if h == 0 || w == 0 {
            return Err(AccountingError::TooSmall {
                width,
                height,
                detail: "the downscale to longest_edge gives a 0 px side",
            });
        }
        let rows = h.div_ceil(self.unit);
        let cols = w.div_ceil(self.unit);
        let feature = mul(rows, cols, "[IMG] tokens")?;
        let expansion = mul(rows, cols + 1, "expansion")?;
        Ok(ImageTokens {
            feature_tokens: to_u32(feature, "[IMG] tokens")?,
            expansion_tokens: Some(to_u32(expansion, "expansion")?),
            structure: Structure::Pixtral { rows: to_u32(rows, "rows")?, cols: to_u32(cols, "cols")? },
        })
    }
}

pub(super) fn run(rows: u32, cols: u32) -> Vec<RunPart> {
    let mut parts = Vec::with_capacity(2 * rows as usize);
    for r in 0..rows {
        parts.push(RunPart::new(IMG, cols));
        parts.push(RunPart::new(if r + 1 == rows { END } else { BREAK }, 1));
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_and_mistral_common_rounding_differ() {
        let hf = Spec { unit: 28, longest: 1540, rounding: PixtralRounding::Floor };
        let mc = Spec { unit: 28, longest: 1540, rounding: PixtralRounding::MistralCommon };
        assert_eq!(hf.count(4800, 963).map(|t| t.expansion_tokens), Ok(Some(616)));
        assert_eq!(mc.count(4800, 963).map(|t| t.expansion_tokens), Ok(Some(672)));
    }

    #[test]
    fn pixtral_12b_small_images() {
        let s = Spec { unit: 16, longest: 1024, rounding: PixtralRounding::Floor };
        assert_eq!(s.count(100, 1).map(|t| t.expansion_tokens), Ok(Some(8)));
        assert_eq!(s.count(640, 480).map(|t| t.expansion_tokens), Ok(Some(1230)));
    }

    #[test]
    fn run_ends_rows_with_breaks_and_the_image_with_end() {
        let parts = run(2, 3);
        let texts: Vec<_> = parts.iter().map(|p| (p.text.as_ref(), p.repeat)).collect();
        assert_eq!(texts, vec![(IMG, 3), (BREAK, 1), (IMG, 3), (END, 1)]);
    }
}
