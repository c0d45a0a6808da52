//! Llama 4: choose a tile canvas (float32 scale comparisons, as torch does), then `<|patch|>` runs per
//! tile with tile separators, a global view when there is more than one tile, and start/end markers.

use super::error::AccountingError;
use super::kwargs::{Layers, CONFIG_FILE, PREPROCESSOR_FILE};
use super::num::{add, mul, to_u32};
use super::{ImageTokens, RunPart, Structure};

pub(super) const PLACEHOLDER: &str = "<|image|>";
pub(super) const KWARGS: &[&str] = &["max_patches", "resize_to_max_canvas"];

const PATCH: &str = "<|patch|>";
const START: &str = "<|image_start|>";
const END: &str = "<|image_end|>";
const TILE_X: &str = "<|tile_x_separator|>";
const TILE_Y: &str = "<|tile_y_separator|>";
/// Canvas candidates grow like `n log n` in `max_patches`; checkpoints ship 16.
const MAX_PATCHES_LIMIT: u64 = 1024;

#[derive(Clone, Debug)]
pub(super) struct Spec {
    tile: u64,
    resize_to_max_canvas: bool,
    patches_per_tile: u64,
    /// Canvases as `(rows, cols)` tiles, in the processor's candidate order.
    candidates: Vec<(u64, u64)>,
}

/// HF `find_supported_resolutions`: for every tile count from `max` down to 1, its factor pairs
/// `(rows, cols)` grouped by aspect ratio in first-seen order.
fn candidates(max: u64) -> Vec<(u64, u64)> {
    // (reduced aspect ratio, canvases with that ratio), in first-seen order.
    type Group = ((u64, u64), Vec<(u64, u64)>);
    let mut groups: Vec<Group> = Vec::new();
    for count in (1..=max).rev() {
        for rows in (1..=count).filter(|r| count % r == 0) {
            let cols = count / rows;
            let g = gcd(rows, cols);
            let key = (rows / g, cols / g);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, list)) => list.push((rows, cols)),
                None => groups.push((key, vec![(rows, cols)])),
            }
        }
    }
    groups.into_iter().flat_map(|(_, list)| list).collect()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let tile = l.proc_nested_u64("size", "height")?;
        let tile_w = l.proc_nested_u64("size", "width")?;
        if tile != tile_w || tile == 0 {
            return Err(AccountingError::ConfigInvalidField {
                file: PREPROCESSOR_FILE,
                field: "size".into(),
                detail: format!("{tile}x{tile_w}: only square, non-empty tiles are modelled"),
            });
        }
        let max_patches = l.proc_pos("max_patches")?;
        if max_patches > MAX_PATCHES_LIMIT {
            let origin = l.proc("max_patches").map_or(PREPROCESSOR_FILE, |f| f.origin);
            return Err(super::kwargs::invalid_at(origin, "max_patches", format!("exceeds {MAX_PATCHES_LIMIT}")));
        }
        let resize_to_max_canvas = l.proc_bool("resize_to_max_canvas")?;
        let image_size = l
            .cfg_found(&["vision_config", "image_size"])
            .ok_or_else(|| super::kwargs::missing(CONFIG_FILE, "vision_config.image_size"))?
            .square_u64("vision_config.image_size")?;
        let patch = l.cfg_pos(&["vision_config", "patch_size"])?;
        let shuffle = l.cfg_f64(&["vision_config", "pixel_shuffle_ratio"])?;
        // vLLM: `int(round(1 / ratio**2))` patches merge into one token.
        let downsample = (1.0 / (shuffle * shuffle)).round_ties_even();
        if !(1.0..=1024.0).contains(&downsample) {
            return Err(AccountingError::ConfigInvalidField {
                file: CONFIG_FILE,
                field: "vision_config.pixel_shuffle_ratio".into(),
                detail: format!("{shuffle} is not a usable shuffle ratio"),
            });
        }
        let side = image_size / patch;
        let patches_per_tile = mul(side, side, "patches per tile")? / downsample as u64;
        if patches_per_tile == 0 {
            return Err(AccountingError::ConfigInvalidField {
                file: CONFIG_FILE,
                field: "vision_config.image_size".into(),
                detail: "gives no patch tokens per tile".into(),
            });
        }
        Ok(Spec { tile, resize_to_max_canvas, patches_per_tile, candidates: candidates(max_patches) })
    }

    /// HF `get_best_fit` in float32: the smallest upscale (largest if `resize_to_max_canvas`), else
    /// the largest downscale; among equal scales the smallest canvas, first in order.
    fn best_fit(&self, width: u32, height: u32) -> (u64, u64) {
        let (wf, hf) = (width as f32, height as f32);
        let tile = self.tile as f32;
        let scales: Vec<f32> = self
            .candidates
            .iter()
            .map(|&(r, c)| {
                let (sw, sh) = ((c as f32 * tile) / wf, (r as f32 * tile) / hf);
                if sh > sw {
                    sw
                } else {
                    sh
                }
            })
            .collect();
        let up = scales.iter().copied().filter(|s| *s >= 1.0);
        let selected = if scales.iter().any(|s| *s >= 1.0) {
            if self.resize_to_max_canvas {
                up.fold(f32::MIN, f32::max)
            } else {
                up.fold(f32::MAX, f32::min)
            }
        } else {
            scales.iter().copied().fold(f32::MIN, f32::max)
        };
        let mut best = (1, 1);
        let mut best_area = u64::MAX;
        for (&(r, c), s) in self.candidates.iter().zip(&scales) {
            if *s == selected && r * c < best_area {
                best = (r, c);
                best_area = r * c;
            }
        }
        best
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        let (rows, cols) = self.best_fit(width, height);
        let tiles = rows * cols;
        let multi = tiles > 1;
        let views = if multi { tiles + 1 } else { 1 };
        let feature = mul(self.patches_per_tile, views, "patch tokens")?;
        let separators = if multi { rows * (cols - 1) + rows } else { 0 };
        let expansion = add(add(feature, 3, "expansion")?, separators, "expansion")?;
        Ok(ImageTokens {
            feature_tokens: to_u32(feature, "patch tokens")?,
            expansion_tokens: Some(to_u32(expansion, "expansion")?),
            structure: Structure::Llama4 {
                rows: to_u32(rows, "rows")?,
                cols: to_u32(cols, "cols")?,
                patches_per_tile: to_u32(self.patches_per_tile, "patches per tile")?,
            },
        })
    }
}

/// `<|image_start|>` [rows of tiles, `<|tile_x_separator|>` between, `<|tile_y_separator|>` after
/// each row, when more than one tile] `<|image|>` global view `<|image_end|>`.
pub(super) fn run(rows: u32, cols: u32, per_tile: u32) -> Vec<RunPart> {
    let mut parts = vec![RunPart::new(START, 1)];
    if rows.saturating_mul(cols) > 1 {
        for _ in 0..rows {
            for c in 0..cols {
                parts.push(RunPart::new(PATCH, per_tile));
                if c + 1 < cols {
                    parts.push(RunPart::new(TILE_X, 1));
                }
            }
            parts.push(RunPart::new(TILE_Y, 1));
        }
    }
    parts.push(RunPart::new(PLACEHOLDER, 1));
    parts.push(RunPart::new(PATCH, per_tile));
    parts.push(RunPart::new(END, 1));
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scout() -> Spec {
        Spec { tile: 336, resize_to_max_canvas: false, patches_per_tile: 144, candidates: candidates(16) }
    }

    #[test]
    fn candidate_order_groups_by_aspect_ratio() {
        let c = candidates(4);
        assert_eq!(c, vec![(1, 4), (2, 2), (1, 1), (4, 1), (1, 3), (3, 1), (1, 2), (2, 1)]);
    }

    #[test]
    fn reference_counts() {
        for ((w, h), want) in [((1, 1), 147), ((448, 448), 727), ((640, 480), 727), ((1920, 1080), 2322)] {
            assert_eq!(scout().count(w, h).map(|t| t.expansion_tokens), Ok(Some(want)), "{w}x{h}");
        }
        assert_eq!(scout().count(640, 480).map(|t| t.feature_tokens), Ok(720));
    }
}
