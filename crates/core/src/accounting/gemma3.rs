//! Gemma 3: a fixed number of soft tokens per image, times (1 + crops) with pan & scan (enabled only
//! through processor kwargs). The total expansion also depends on how the surrounding `"\n\n"` merge
//! with the prompt's newlines, so only the soft-token count is exact here.

use super::error::AccountingError;
use super::kwargs::{missing, Layers, PREPROCESSOR_FILE};
use super::num::{exact, mul, to_u32, to_u64};
use super::{ImageTokens, Structure};

pub(super) const PLACEHOLDER: &str = "<start_of_image>";
const END: &str = "<end_of_image>";
const SOFT: &str = "<image_soft_token>";

/// `Gemma3Processor`'s `full_image_sequence`: what replaces each `<start_of_image>` in the prompt text.
pub(super) fn text_expansion(tokens_per_image: u32) -> super::TextExpansion {
    let soft = SOFT.repeat(tokens_per_image as usize);
    super::TextExpansion {
        text: format!("\n\n{PLACEHOLDER}{soft}{END}\n\n"),
        embed_token: SOFT,
        embed_count: tokens_per_image,
        // vLLM's range runs from the token ending the leading "\n\n" (merged with the prompt's own
        // newlines) to the one starting the trailing "\n\n": `<start_of_image>` … `<end_of_image>` and one
        // token beyond each (checked against `vllm launch render`).
        wrap: 2,
    }
}
pub(super) const KWARGS: &[&str] = &[
    "do_pan_and_scan",
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "pan_and_scan_min_ratio_to_activate",
];

/// `Gemma3Processor`'s own image-kwarg defaults. Released checkpoints ship these fields as `null`, and
/// the processor then applies these values, so they are what the engine computes with.
const DEFAULT_MIN_CROP: u64 = 256;
const DEFAULT_MAX_CROPS: u64 = 4;
const DEFAULT_MIN_RATIO: f64 = 1.2;

#[derive(Clone, Debug)]
struct PanAndScan {
    min_crop: u64,
    max_crops: u64,
    min_ratio: f64,
}

#[derive(Clone, Debug)]
pub(super) struct Spec {
    tokens_per_image: u64,
    pan_and_scan: Option<PanAndScan>,
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let tokens_per_image = l.cfg_pos(&["mm_tokens_per_image"])?;
        // The field itself must be in the file (`null` there means off, as in the processor).
        let in_file = l.processor_layers().next().is_some_and(|(_, m)| m.contains_key("do_pan_and_scan"));
        let enabled = match l.proc_opt_bool("do_pan_and_scan")? {
            Some(v) => v,
            None if in_file => false,
            None => return Err(missing(PREPROCESSOR_FILE, "do_pan_and_scan")),
        };
        let pan_and_scan = if enabled {
            let min_crop = match l.proc("pan_and_scan_min_crop_size") {
                Some(f) => f.pos("pan_and_scan_min_crop_size")?,
                None => DEFAULT_MIN_CROP,
            };
            let max_crops = match l.proc("pan_and_scan_max_num_crops") {
                Some(f) => f.pos("pan_and_scan_max_num_crops")?,
                None => DEFAULT_MAX_CROPS,
            };
            let min_ratio = l.proc_opt_f64("pan_and_scan_min_ratio_to_activate")?.unwrap_or(DEFAULT_MIN_RATIO);
            Some(PanAndScan { min_crop, max_crops, min_ratio })
        } else {
            None
        };
        Ok(Spec { tokens_per_image, pan_and_scan })
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        let crops = match &self.pan_and_scan {
            Some(p) => p.crops(width, height)?,
            None => 0,
        };
        let soft = mul(crops + 1, self.tokens_per_image, "soft tokens")?;
        Ok(ImageTokens {
            feature_tokens: to_u32(soft, "soft tokens")?,
            expansion_tokens: None,
            structure: Structure::Gemma3 {
                crops: to_u32(crops, "crops")?,
                tokens_per_image: to_u32(self.tokens_per_image, "mm_tokens_per_image")?,
            },
        })
    }
}

impl PanAndScan {
    /// `Gemma3ImageProcessor.pan_and_scan`: crops along the long side, or none.
    fn crops(&self, width: u32, height: u32) -> Result<u64, AccountingError> {
        let (w, h) = (f64::from(width), f64::from(height));
        let (long, short) = if width >= height { (w, h) } else { (h, w) };
        if long / short < self.min_ratio {
            return Ok(0);
        }
        let min_crop = exact(self.min_crop, "pan_and_scan_min_crop_size")?;
        let n = to_u64((long / short + 0.5).floor(), "crops")?;
        let n = to_u64((long / min_crop).floor(), "crops")?.min(n);
        let n = self.max_crops.min(n.max(2));
        let (ncw, nch) = if width >= height { (n, 1) } else { (1, n) };
        let crop_w = to_u64((w / exact(ncw, "crops")?).ceil(), "crop width")?;
        let crop_h = to_u64((h / exact(nch, "crops")?).ceil(), "crop height")?;
        Ok(if crop_w.min(crop_h) < self.min_crop { 0 } else { ncw * nch })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pas() -> Spec {
        Spec { tokens_per_image: 256, pan_and_scan: Some(PanAndScan { min_crop: 256, max_crops: 4, min_ratio: 1.2 }) }
    }

    #[test]
    fn quick_check_values() {
        for ((w, h), want) in [((1, 1), 256), ((640, 480), 768), ((1920, 1080), 768), ((10, 1900), 256)] {
            assert_eq!(pas().count(w, h).map(|t| t.feature_tokens), Ok(want), "{w}x{h}");
        }
        let plain = Spec { tokens_per_image: 256, pan_and_scan: None };
        assert_eq!(plain.count(4032, 3024).map(|t| (t.feature_tokens, t.expansion_tokens)), Ok((256, None)));
    }
}
