//! Qwen2-VL / Qwen2.5-VL / Qwen3-VL: transformers `smart_resize` (≥ 4.53, as vLLM imports it), then
//! one `<|image_pad|>` per `merge × merge` patch block.

use super::error::AccountingError;
use super::kwargs::{self, Layers, CONFIG_FILE, PREPROCESSOR_FILE};
use super::num::{self, exact, mul, py_round, to_u32, to_u64};
use super::{ImageTokens, Structure};

pub(super) const PAD: &str = "<|image_pad|>";
pub(super) const KWARGS: &[&str] = &["min_pixels", "max_pixels", "size"];

/// The processor rejects `max(h, w) / min(h, w)` above this.
pub(super) const MAX_RATIO: u32 = 200;

#[derive(Clone, Debug)]
pub(super) struct Spec {
    patch: u64,
    merge: u64,
    budget: Budget,
}

/// Pixel bounds from `size {shortest_edge, longest_edge}` and/or `min_pixels`/`max_pixels`, layer by
/// layer (file, server, request); within a layer the explicit `*_pixels` keys win over `size`.
pub(super) fn pixel_bounds(l: &Layers) -> Result<(u64, u64), AccountingError> {
    let mut min = None;
    let mut max = None;
    for (origin, map) in l.processor_layers() {
        if let Some(size) = map.get("size").filter(|v| !v.is_null()) {
            let found = kwargs::Found { value: size, origin };
            let obj = size.as_object().ok_or_else(|| found.invalid("size", "must be an object"))?;
            for (edge, slot) in [("shortest_edge", &mut min), ("longest_edge", &mut max)] {
                if let Some(v) = obj.get(edge).filter(|v| !v.is_null()) {
                    *slot = Some(kwargs::Found { value: v, origin }.u64(&format!("size.{edge}"))?);
                }
            }
        }
        for (key, slot) in [("min_pixels", &mut min), ("max_pixels", &mut max)] {
            if let Some(v) = map.get(key).filter(|v| !v.is_null()) {
                *slot = Some(kwargs::Found { value: v, origin }.u64(key)?);
            }
        }
    }
    let min = min.ok_or_else(|| kwargs::missing(PREPROCESSOR_FILE, "min_pixels (or size.shortest_edge)"))?;
    let max = max.ok_or_else(|| kwargs::missing(PREPROCESSOR_FILE, "max_pixels (or size.longest_edge)"))?;
    Ok((min, max))
}

/// Fails closed when `config.json` names a different vision geometry than the processor file.
pub(super) fn agree(l: &Layers, path: &[&str], value: u64) -> Result<(), AccountingError> {
    let name = path.join(".");
    if let Some(found) = l.cfg_found(path) {
        let other = found.u64(&name)?;
        if other != value {
            return Err(AccountingError::ConfigInvalidField {
                file: CONFIG_FILE,
                field: name,
                detail: format!("is {other} but {PREPROCESSOR_FILE} says {value}"),
            });
        }
    }
    Ok(())
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let patch = l.proc_pos("patch_size")?;
        let merge = l.proc_pos("merge_size")?;
        agree(l, &["vision_config", "patch_size"], patch)?;
        agree(l, &["vision_config", "spatial_merge_size"], merge)?;
        let (min_pixels, max_pixels) = pixel_bounds(l)?;
        let factor = mul(patch, merge, "patch_size * merge_size")?;
        Ok(Spec { patch, merge, budget: Budget { factor, min_pixels, max_pixels, frames: 1 } })
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        num::nonzero(width, height)?;
        let (hb, wb) = self.budget.resize(width, height, u64::from(height), u64::from(width))?;
        let grid_h = hb / self.patch;
        let grid_w = wb / self.patch;
        let tokens = mul(grid_h, grid_w, "patch grid")? / (self.merge * self.merge);
        let n = to_u32(tokens, "image tokens")?;
        Ok(ImageTokens {
            feature_tokens: n,
            expansion_tokens: Some(n),
            structure: Structure::Qwen {
                grid_h: to_u32(grid_h, "grid height")?,
                grid_w: to_u32(grid_w, "grid width")?,
                merge: to_u32(self.merge, "merge_size")?,
            },
        })
    }
}

/// transformers `smart_resize` parameters. `frames` multiplies the pixel-budget test: GLM treats an
/// image as `temporal_patch_size` frames, Qwen as one.
#[derive(Clone, Copy, Debug)]
pub(super) struct Budget {
    pub(super) factor: u64,
    pub(super) min_pixels: u64,
    pub(super) max_pixels: u64,
    pub(super) frames: u64,
}

impl Budget {
    /// Resizes sides `h × w` (already validated, possibly pre-scaled from `width × height`, which
    /// errors name). Returns the resized `(height, width)`, multiples of `factor`.
    pub(super) fn resize(&self, width: u32, height: u32, h: u64, w: u64) -> Result<(u64, u64), AccountingError> {
        let factor = self.factor;
        let (hf, wf) = (exact(h, "height")?, exact(w, "width")?);
        if hf.max(wf) / hf.min(wf) > f64::from(MAX_RATIO) {
            return Err(AccountingError::AspectRatio { width, height, limit: MAX_RATIO });
        }
        let f = exact(factor, "factor")?;
        let mut hb = mul(to_u64(py_round(hf / f), "rounded height")?, factor, "rounded height")?;
        let mut wb = mul(to_u64(py_round(wf / f), "rounded width")?, factor, "rounded width")?;
        let area = mul(mul(self.frames, hb, "resized area")?, wb, "resized area")?;
        // Python divides the exact integer product; an f64 of it is exact only below 2^53.
        let volume = exact(mul(mul(self.frames, h, "pixel volume")?, w, "pixel volume")?, "pixel volume")?;
        if area > self.max_pixels {
            let beta = (volume / exact(self.max_pixels, "max_pixels")?).sqrt();
            hb = factor.max(mul(to_u64((hf / beta / f).floor(), "downscaled height")?, factor, "downscaled height")?);
            wb = factor.max(mul(to_u64((wf / beta / f).floor(), "downscaled width")?, factor, "downscaled width")?);
        } else if area < self.min_pixels {
            let beta = (exact(self.min_pixels, "min_pixels")? / volume).sqrt();
            hb = mul(to_u64((hf * beta / f).ceil(), "upscaled height")?, factor, "upscaled height")?;
            wb = mul(to_u64((wf * beta / f).ceil(), "upscaled width")?, factor, "upscaled width")?;
        }
        if hb == 0 || wb == 0 {
            return Err(AccountingError::TooSmall { width, height, detail: "the pixel budget resizes a side to 0" });
        }
        Ok((hb, wb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smart_resize(
        w: u32,
        h: u32,
        factor: u64,
        min_pixels: u64,
        max_pixels: u64,
    ) -> Result<(u64, u64), AccountingError> {
        Budget { factor, min_pixels, max_pixels, frames: 1 }.resize(w, h, u64::from(h), u64::from(w))
    }

    #[test]
    fn reference_resizes_qwen2() {
        let (min, max) = (3136, 12_845_056);
        for ((h, w), want) in [
            ((1, 100), (28, 560)),
            ((9, 7), (84, 56)),
            ((400, 800), (392, 812)),
            ((640, 480), (644, 476)),
            ((1080, 1920), (1092, 1932)),
        ] {
            assert_eq!(smart_resize(w, h, 28, min, max), Ok(want), "{h}x{w}");
        }
    }

    #[test]
    fn reference_resizes_qwen3() {
        let (min, max) = (65_536, 16_777_216);
        for ((h, w), want) in [((640, 480), (640, 480)), ((1080, 1920), (1088, 1920)), ((6000, 31), (6016, 32))] {
            assert_eq!(smart_resize(w, h, 32, min, max), Ok(want), "{h}x{w}");
        }
        for (h, w) in [(100, 30_000), (13, 3000)] {
            assert_eq!(smart_resize(w, h, 32, min, max).map_err(|e| e.label()), Err("aspect_ratio"));
        }
    }

    #[test]
    fn ratio_of_exactly_200_is_accepted() {
        assert!(smart_resize(200, 1, 28, 3136, 12_845_056).is_ok());
        assert!(smart_resize(201, 1, 28, 3136, 12_845_056).is_err());
    }

    #[test]
    fn zero_min_pixels_can_empty_a_side() {
        let err = smart_resize(100, 10, 28, 0, 12_845_056).unwrap_err();
        assert_eq!(err.label(), "too_small");
    }
}
