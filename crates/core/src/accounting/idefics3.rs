//! Idefics3 / SmolVLM: rescale so the long side is `size.longest_edge`, split into
//! `max_image_size` tiles when larger than one tile, each tile and the global image give
//! `image_seq_len` `<image>` tokens, wrapped in `<fake_token_around_image>` / `<row_r_col_c>` /
//! `<global-img>` with a newline per row.
//!
//! The expansion assumes the tokenizer encodes `"\n\n"` as one token (Llama-3 for Idefics3, SmolLM2
//! for SmolVLM), which the last row's newline and the global image's leading newline merge into.

use std::borrow::Cow;

use super::error::AccountingError;
use super::kwargs::{missing, Layers, CONFIG_FILE, PREPROCESSOR_FILE};
use super::num::{add, exact, mul, to_u32, to_u64};
use super::{ImageTokens, RunPart, Structure};

pub(super) const IMAGE: &str = "<image>";
const FAKE: &str = "<fake_token_around_image>";
const GLOBAL: &str = "<global-img>";
pub(super) const KWARGS: &[&str] = &["do_image_splitting", "size", "max_image_size"];
/// The processor caps sides at 4096 after the rescale; vLLM's count does not, so larger settings are
/// refused rather than guessed.
const MAX_LONGEST_EDGE: u64 = 4096;

#[derive(Clone, Debug)]
pub(super) struct Spec {
    longest: u64,
    tile: u64,
    seq_len: u64,
    splitting: bool,
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let longest = l.proc_nested_u64("size", "longest_edge")?;
        let tile = l.proc_nested_u64("max_image_size", "longest_edge")?;
        let splitting = l.proc_bool("do_image_splitting")?;
        let origin = l.proc("size").map_or(PREPROCESSOR_FILE, |f| f.origin);
        if longest == 0 || tile == 0 || longest % tile != 0 || longest > MAX_LONGEST_EDGE {
            return Err(super::kwargs::invalid_at(
                origin,
                "size.longest_edge",
                format!(
                    "{longest} must be a positive multiple of max_image_size.longest_edge {tile} and at most {MAX_LONGEST_EDGE}"
                ),
            ));
        }
        let seq_len = match l.cfg_found(&["image_seq_len"]) {
            Some(f) => f.pos("image_seq_len")?,
            None => seq_len_from_vision(l)?,
        };
        Ok(Spec { longest, tile, seq_len, splitting })
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        let (h, w) = rescale_to_max_len(u64::from(height), u64::from(width), self.longest)?;
        let (rows, cols) = if self.splitting && (h > self.tile || w > self.tile) {
            (h.div_ceil(self.tile), w.div_ceil(self.tile))
        } else {
            (0, 0)
        };
        let tiles = mul(rows, cols, "tiles")?;
        let feature = mul(tiles + 1, self.seq_len, "image tokens")?;
        let per_row = add(mul(cols, self.seq_len + 2, "expansion")?, 1, "expansion")?;
        let expansion = add(self.seq_len + 3, mul(rows, per_row, "expansion")?, "expansion")?;
        Ok(ImageTokens {
            feature_tokens: to_u32(feature, "image tokens")?,
            expansion_tokens: Some(to_u32(expansion, "expansion")?),
            structure: Structure::Idefics3 {
                rows: to_u32(rows, "rows")?,
                cols: to_u32(cols, "cols")?,
                seq_len: to_u32(self.seq_len, "image_seq_len")?,
            },
        })
    }
}

/// `int(((image_size // patch_size) ** 2) / scale_factor ** 2)` when `image_seq_len` is not stored.
fn seq_len_from_vision(l: &Layers) -> Result<u64, AccountingError> {
    let (Some(_), Some(_), Some(_)) =
        (l.cfg(&["vision_config", "image_size"]), l.cfg(&["vision_config", "patch_size"]), l.cfg(&["scale_factor"]))
    else {
        return Err(missing(CONFIG_FILE, "image_seq_len"));
    };
    let side = l.cfg_pos(&["vision_config", "image_size"])? / l.cfg_pos(&["vision_config", "patch_size"])?;
    let scale = l.cfg_pos(&["scale_factor"])?;
    let seq = mul(side, side, "image_seq_len")? / mul(scale, scale, "scale_factor")?;
    if seq == 0 {
        return Err(super::kwargs::invalid_at(CONFIG_FILE, "scale_factor", "gives no tokens per tile"));
    }
    Ok(seq)
}

/// HF `_resize_output_size_rescale_to_max_len`: long side to `max_len`, the other side by the aspect
/// ratio, truncated, then made even; at least 1.
fn rescale_to_max_len(h: u64, w: u64, max_len: u64) -> Result<(u64, u64), AccountingError> {
    let (hf, wf) = (exact(h, "height")?, exact(w, "width")?);
    let aspect = wf / hf;
    let max = exact(max_len, "longest_edge")?;
    let (mut h, mut w) = if w >= h {
        let mut h = to_u64(max / aspect, "resized height")?;
        h += h % 2;
        (h, max_len)
    } else {
        let mut w = to_u64(max * aspect, "resized width")?;
        w += w % 2;
        (max_len, w)
    };
    h = h.max(1);
    w = w.max(1);
    Ok((h, w))
}

pub(super) fn run(rows: u32, cols: u32, seq: u32) -> Vec<RunPart> {
    let mut parts = Vec::new();
    for r in 1..=rows {
        for c in 1..=cols {
            parts.push(RunPart::new(FAKE, 1));
            parts.push(RunPart { text: Cow::Owned(format!("<row_{r}_col_{c}>")), repeat: 1 });
            parts.push(RunPart::new(IMAGE, seq));
        }
        // The last row's newline merges with the global image's leading newline.
        parts.push(RunPart::new(if r == rows { "\n\n" } else { "\n" }, 1));
    }
    parts.push(RunPart::new(FAKE, 1));
    parts.push(RunPart::new(GLOBAL, 1));
    parts.push(RunPart::new(IMAGE, seq));
    parts.push(RunPart::new(FAKE, 1));
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_check_values() {
        let idefics3 = Spec { longest: 1456, tile: 364, seq_len: 169, splitting: true };
        let smolvlm = Spec { longest: 1536, tile: 384, seq_len: 81, splitting: true };
        for ((w, h), a, b) in
            [((1, 1), 2912, 1416), ((640, 480), 2227, 1083), ((480, 640), 2228, 1084), ((8000, 100), 857, 417)]
        {
            assert_eq!(idefics3.count(w, h).map(|t| t.expansion_tokens), Ok(Some(a)), "{w}x{h}");
            assert_eq!(smolvlm.count(w, h).map(|t| t.expansion_tokens), Ok(Some(b)), "{w}x{h}");
        }
    }

    #[test]
    fn without_splitting_only_the_global_image_remains() {
        let s = Spec { longest: 1456, tile: 364, seq_len: 169, splitting: false };
        assert_eq!(s.count(4000, 3000).map(|t| (t.feature_tokens, t.expansion_tokens)), Ok((169, Some(172))));
    }
}
