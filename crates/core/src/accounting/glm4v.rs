//! GLM-4.1V / GLM-4.5V (transformers ≥ 5.1): sides below the factor are scaled up first, the aspect
//! ratio is checked after that, and the pixel budget covers `temporal_patch_size` frames.

use super::error::AccountingError;
use super::kwargs::Layers;
use super::num::{self, exact, mul, to_u32, to_u64};
use super::qwen::{agree, pixel_bounds, Budget};
use super::{ImageTokens, Structure};

pub(super) const PAD: &str = "<|image|>";
pub(super) const KWARGS: &[&str] = &["min_pixels", "max_pixels", "size"];

#[derive(Clone, Debug)]
pub(super) struct Spec {
    patch: u64,
    merge: u64,
    budget: Budget,
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let patch = l.proc_pos("patch_size")?;
        let merge = l.proc_pos("merge_size")?;
        let frames = l.proc_pos("temporal_patch_size")?;
        agree(l, &["vision_config", "patch_size"], patch)?;
        agree(l, &["vision_config", "spatial_merge_size"], merge)?;
        let (min_pixels, max_pixels) = pixel_bounds(l)?;
        let factor = mul(patch, merge, "patch_size * merge_size")?;
        Ok(Spec { patch, merge, budget: Budget { factor, min_pixels, max_pixels, frames } })
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        num::nonzero(width, height)?;
        let factor = self.budget.factor;
        let (mut h, mut w) = (u64::from(height), u64::from(width));
        if h < factor || w < factor {
            // `scale = max(factor / h, factor / w); h = int(h * scale)`, in Python floats.
            let f = exact(factor, "factor")?;
            let (hf, wf) = (exact(h, "height")?, exact(w, "width")?);
            let scale = (f / hf).max(f / wf);
            h = to_u64(hf * scale, "upscaled height")?;
            w = to_u64(wf * scale, "upscaled width")?;
        }
        let (hb, wb) = self.budget.resize(width, height, h, w)?;
        let grid_h = hb / self.patch;
        let grid_w = wb / self.patch;
        let tokens = mul(grid_h, grid_w, "patch grid")? / (self.merge * self.merge);
        let n = to_u32(tokens, "image tokens")?;
        Ok(ImageTokens {
            feature_tokens: n,
            expansion_tokens: Some(n),
            structure: Structure::Glm {
                grid_h: to_u32(grid_h, "grid height")?,
                grid_w: to_u32(grid_w, "grid width")?,
                merge: to_u32(self.merge, "merge_size")?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glm_ocr() -> Spec {
        Spec {
            patch: 14,
            merge: 2,
            budget: Budget { factor: 28, min_pixels: 12_544, max_pixels: 9_633_792, frames: 2 },
        }
    }

    #[test]
    fn external_goldens() {
        let spec = glm_ocr();
        for ((w, h), want) in [
            ((6000, 4000), 6144),
            ((4000, 3000), 6030),
            ((3000, 3000), 6084),
            ((5000, 4000), 6090),
            ((1700, 2200), 4819),
            ((100, 100), 16),
        ] {
            assert_eq!(spec.count(w, h).map(|t| t.feature_tokens), Ok(want), "{w}x{h}");
        }
    }

    #[test]
    fn small_sides_scale_up_before_the_ratio_check() {
        // 1x100 becomes 28x2800: ratio 100, accepted.
        assert!(glm_ocr().count(1, 100).is_ok());
    }
}
