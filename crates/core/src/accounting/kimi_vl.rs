//! Kimi-VL (MoonViT, vLLM `KimiVLProcessingInfo`): cap the patch count at `in_token_limit`, pad to
//! whole `merge_kernel × patch` cells, one `<|media_pad|>` per cell. The processor refuses grids that
//! reach the position-embedding size, so those are errors even though vLLM's count does not check.

use super::error::AccountingError;
use super::kwargs::{missing, Found, Layers, PREPROCESSOR_FILE};
use super::num::{exact, mul, to_u32, to_u64};
use super::{ImageTokens, Structure};

pub(super) const PAD: &str = "<|media_pad|>";
/// Patches per side the position embedding covers ("Exceed pos emb").
const POS_EMB_LIMIT: u64 = 512;

#[derive(Clone, Debug)]
pub(super) struct Spec {
    patch: u64,
    kernel_h: u64,
    kernel_w: u64,
    in_token_limit: u64,
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let patch = l.proc_pos("patch_size")?;
        let kernel = l.proc("merge_kernel_size").ok_or_else(|| missing(PREPROCESSOR_FILE, "merge_kernel_size"))?;
        let pair = kernel.value.as_array().map(Vec::as_slice);
        let Some([kh, kw]) = pair else {
            return Err(kernel.invalid("merge_kernel_size", "must be a [height, width] pair"));
        };
        let kernel_h = Found { value: kh, origin: kernel.origin }.pos("merge_kernel_size")?;
        let kernel_w = Found { value: kw, origin: kernel.origin }.pos("merge_kernel_size")?;
        let in_token_limit = l.proc_pos("in_token_limit")?;
        if !l.proc_bool("pad_input")? {
            // vLLM's count always pads; the processor would centre-crop. Refuse the disagreement.
            let origin = l.proc("pad_input").map_or(PREPROCESSOR_FILE, |f| f.origin);
            return Err(super::kwargs::invalid_at(origin, "pad_input", "false (centre crop) is not modelled"));
        }
        mul(mul(kernel_h, kernel_w, "merge_kernel_size")?, mul(patch, patch, "patch_size")?, "cell size")?;
        Ok(Spec { patch, kernel_h, kernel_w, in_token_limit })
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        let (mut w, mut h) = (u64::from(width), u64::from(height));
        let patches = (w / self.patch) * (h / self.patch);
        if patches > self.in_token_limit {
            let scale = (exact(self.in_token_limit, "in_token_limit")? / exact(patches, "patches")?).sqrt();
            w = to_u64(exact(w, "width")? * scale, "scaled width")?;
            h = to_u64(exact(h, "height")? * scale, "scaled height")?;
        }
        if w == 0 || h == 0 {
            return Err(AccountingError::TooSmall {
                width,
                height,
                detail: "the token-limit downscale gives a 0 px side",
            });
        }
        let (unit_h, unit_w) = (self.kernel_h * self.patch, self.kernel_w * self.patch);
        let (grid_h, grid_w) = (h.div_ceil(unit_h), w.div_ceil(unit_w));
        let (patches_h, patches_w) = (grid_h * unit_h / self.patch, grid_w * unit_w / self.patch);
        if patches_h >= POS_EMB_LIMIT || patches_w >= POS_EMB_LIMIT {
            return Err(AccountingError::PositionEmbeddingExceeded {
                width,
                height,
                grid_h: patches_h,
                grid_w: patches_w,
                limit: POS_EMB_LIMIT,
            });
        }
        let n = to_u32(mul(grid_h, grid_w, "image tokens")?, "image tokens")?;
        Ok(ImageTokens {
            feature_tokens: n,
            expansion_tokens: Some(n),
            structure: Structure::KimiVl { grid_h: to_u32(grid_h, "grid")?, grid_w: to_u32(grid_w, "grid")? },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_check_values() {
        let s = Spec { patch: 14, kernel_h: 2, kernel_w: 2, in_token_limit: 4096 };
        for ((w, h), want) in
            [((1, 1), 1), ((640, 480), 414), ((1920, 1080), 1032), ((4032, 3024), 1036), ((10, 1900), 68)]
        {
            assert_eq!(s.count(w, h).map(|t| t.feature_tokens), Ok(want), "{w}x{h}");
        }
        assert_eq!(s.count(8000, 100).map_err(|e| e.label()), Err("position_embedding_exceeded"));
    }
}
