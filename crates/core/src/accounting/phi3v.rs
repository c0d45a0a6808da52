//! Phi-3-vision / Phi-3.5-vision: the remote `HD_transform` (as vLLM ports it). The image is scaled
//! to a grid of at most `num_crops` 336-px crops, padded to whole crops; each crop and the global view
//! give 144 tokens, plus separators and 12 newline tokens per crop row.

use super::error::AccountingError;
use super::kwargs::Layers;
use super::num::{add, exact, mul, to_u32, to_u64};
use super::{ImageTokens, Structure};

pub(super) const IMAGE: &str = "<|image|>";
pub(super) const KWARGS: &[&str] = &["num_crops"];

/// The crop side and per-crop token counts are fixed by the model architecture (vLLM hard-codes them).
const CROP: u64 = 336;
const TOKENS_PER_CROP: u64 = 144;
const NEWLINE_TOKENS: u64 = 12;
/// The crop search is linear in `num_crops`; checkpoints ship 4 or 16.
const MAX_NUM_CROPS: u64 = 1 << 16;

#[derive(Clone, Debug)]
pub(super) struct Spec {
    num_crops: u64,
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let num_crops = l.proc_pos("num_crops")?;
        if num_crops > MAX_NUM_CROPS {
            let origin = l.proc("num_crops").map_or(super::kwargs::PREPROCESSOR_FILE, |f| f.origin);
            return Err(super::kwargs::invalid_at(origin, "num_crops", format!("exceeds {MAX_NUM_CROPS}")));
        }
        Ok(Spec { num_crops })
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        let (mut w, mut h) = (u64::from(width), u64::from(height));
        let transposed = w < h;
        if transposed {
            std::mem::swap(&mut w, &mut h);
        }
        let ratio = exact(w, "width")? / exact(h, "height")?;
        let mut scale: u64 = 1;
        while mul(scale, to_u64((exact(scale, "scale")? / ratio).ceil(), "scale")?, "scale")? <= self.num_crops {
            scale += 1;
        }
        scale -= 1;
        let new_w = scale * CROP;
        let new_h = to_u64(exact(new_w, "resized width")? / ratio, "resized height")?;
        if new_h == 0 {
            return Err(AccountingError::TooSmall {
                width,
                height,
                detail: "the HD transform resizes the short side to 0 px",
            });
        }
        let mut crops_h = new_h.div_ceil(CROP);
        let mut crops_w = scale;
        if transposed {
            std::mem::swap(&mut crops_h, &mut crops_w);
        }
        let grid = mul(crops_h, crops_w, "crop grid")?;
        let tokens = add(
            add(mul(grid + 1, TOKENS_PER_CROP, "image tokens")?, 1, "image tokens")?,
            mul(crops_h + 1, NEWLINE_TOKENS, "image tokens")?,
            "image tokens",
        )?;
        let n = to_u32(tokens, "image tokens")?;
        Ok(ImageTokens {
            feature_tokens: n,
            expansion_tokens: Some(n),
            structure: Structure::Phi3V { crops_h: to_u32(crops_h, "crops")?, crops_w: to_u32(crops_w, "crops")? },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_check_values() {
        let phi3 = Spec { num_crops: 16 };
        let phi35 = Spec { num_crops: 4 };
        for ((w, h), a, b) in
            [((1, 1), 2509, 757), ((640, 480), 1921, 757), ((480, 640), 1933, 757), ((1920, 1080), 2353, 757)]
        {
            assert_eq!(phi3.count(w, h).map(|t| t.feature_tokens), Ok(a), "{w}x{h}");
            assert_eq!(phi35.count(w, h).map(|t| t.feature_tokens), Ok(b), "{w}x{h}");
        }
    }

    #[test]
    fn empty_resize_is_an_error_not_a_count() {
        assert_eq!(Spec { num_crops: 4 }.count(1, 4562).map_err(|e| e.label()), Err("too_small"));
    }
}
