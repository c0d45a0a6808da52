//! InternVL 2.5 / 3 dynamic tiling as vLLM and transformers count it: the tile grid whose aspect
//! ratio is closest (ties go to the larger grid only when the image covers more than half of it),
//! plus a thumbnail when there is more than one tile; `<img>` + `<IMG_CONTEXT>`×N + `</img>`.
//!
//! HF-format checkpoints (`model_type` `internvl`, GotOcr2 processor) take the tile range from the
//! processor file; remote-code checkpoints (`internvl_chat`) from `config.json`.

use super::error::AccountingError;
use super::kwargs::{missing, Found, Layers, CONFIG_FILE, PREPROCESSOR_FILE};
use super::num::{exact, mul, to_u32, to_u64};
use super::{ImageTokens, RunPart, Structure};

/// What remote-code checkpoints' templates emit per image (`internvl_chat`).
pub(super) const PLACEHOLDER: &str = "<image>";
/// What HF-format checkpoints' templates emit per image (`internvl`): the context token itself, which
/// the processor replaces by `<img>` + N of it + `</img>`.
pub(super) const HF_PLACEHOLDER: &str = CONTEXT;
const CONTEXT: &str = "<IMG_CONTEXT>";
const START: &str = "<img>";
const END: &str = "</img>";
const HF_KWARGS: &[&str] = &["crop_to_patches", "min_patches", "max_patches"];
const REMOTE_KWARGS: &[&str] = &["min_dynamic_patch", "max_dynamic_patch", "dynamic_image_size"];
/// Grid enumeration is quadratic-ish in the tile limit; checkpoints ship 6–12 (40 for some OCR).
const MAX_TILES_LIMIT: u64 = 1024;

fn is_remote(l: &Layers) -> bool {
    l.cfg_str(&["model_type"]) == Some("internvl_chat")
}

pub(super) fn kwargs(l: &Layers) -> &'static [&'static str] {
    if is_remote(l) {
        REMOTE_KWARGS
    } else {
        HF_KWARGS
    }
}

#[derive(Clone, Debug)]
pub(super) struct Spec {
    tile: u64,
    thumbnail: bool,
    tokens_per_tile: u64,
    /// `(cols, rows)` grids sorted by tile count.
    grids: Vec<(u64, u64)>,
    /// HF format (`model_type` `internvl`) rather than remote code (`internvl_chat`).
    hf: bool,
}

fn required<'a>(found: Option<Found<'a>>, file: &'static str, key: &str) -> Result<Found<'a>, AccountingError> {
    found.ok_or_else(|| missing(file, key))
}

impl Spec {
    pub(super) fn hf_format(&self) -> bool {
        self.hf
    }

    /// The token the chat template writes per image.
    pub(super) fn placeholder(&self) -> &'static str {
        if self.hf {
            HF_PLACEHOLDER
        } else {
            PLACEHOLDER
        }
    }

    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let (tile, min_tiles, max_tiles, thumbnail, max_origin) = if is_remote(l) {
            let tile = match l.cfg_found(&["force_image_size"]) {
                Some(f) => f.square_u64("force_image_size")?,
                None => required(l.cfg_found(&["vision_config", "image_size"]), CONFIG_FILE, "force_image_size")?
                    .square_u64("vision_config.image_size")?,
            };
            let dynamic = required(l.kwarg_or_cfg("dynamic_image_size"), CONFIG_FILE, "dynamic_image_size")?
                .bool("dynamic_image_size")?;
            let thumbnail =
                required(l.cfg_found(&["use_thumbnail"]), CONFIG_FILE, "use_thumbnail")?.bool("use_thumbnail")?;
            let min_f = required(l.kwarg_or_cfg("min_dynamic_patch"), CONFIG_FILE, "min_dynamic_patch")?;
            let max_f = required(l.kwarg_or_cfg("max_dynamic_patch"), CONFIG_FILE, "max_dynamic_patch")?;
            let (min, max) = (min_f.pos("min_dynamic_patch")?, max_f.pos("max_dynamic_patch")?);
            // `dynamic_image_size = false` means one tile, no thumbnail.
            let (min, max) = if dynamic { (min, max) } else { (1, 1) };
            (tile, min, max, thumbnail, max_f.origin)
        } else {
            let tile = l.proc_nested_u64("size", "height")?;
            if l.proc_nested_u64("size", "width")? != tile {
                return Err(AccountingError::ConfigInvalidField {
                    file: PREPROCESSOR_FILE,
                    field: "size".into(),
                    detail: "only square tiles are modelled".into(),
                });
            }
            let crop = l.proc_bool("crop_to_patches")?;
            let min = l.proc_pos("min_patches")?;
            let max = l.proc_pos("max_patches")?;
            let origin = l.proc("max_patches").map_or(PREPROCESSOR_FILE, |f| f.origin);
            // GotOcr2 always appends the thumbnail when it produced more than one tile.
            let (min, max) = if crop { (min, max) } else { (1, 1) };
            (tile, min, max, true, origin)
        };
        if tile == 0 {
            return Err(super::kwargs::invalid_at(PREPROCESSOR_FILE, "size", "must be positive"));
        }
        if max_tiles > MAX_TILES_LIMIT || min_tiles > max_tiles {
            return Err(super::kwargs::invalid_at(
                max_origin,
                "max_patches",
                format!("tile range {min_tiles}..={max_tiles} is empty or exceeds {MAX_TILES_LIMIT}"),
            ));
        }
        let image_size =
            required(l.cfg_found(&["vision_config", "image_size"]), CONFIG_FILE, "vision_config.image_size")?
                .square_u64("vision_config.image_size")?;
        let patch = required(l.cfg_found(&["vision_config", "patch_size"]), CONFIG_FILE, "vision_config.patch_size")?
            .square_u64("vision_config.patch_size")?;
        if patch == 0 {
            return Err(super::kwargs::invalid_at(CONFIG_FILE, "vision_config.patch_size", "must be positive"));
        }
        let downsample = l.cfg_f64(&["downsample_ratio"])?;
        // `int((image_size // patch_size) ** 2 * downsample_ratio ** 2)`
        let side = exact(image_size / patch, "patch grid")?;
        let tokens_per_tile = to_u64(side * side * (downsample * downsample), "tokens per tile")?;
        if tokens_per_tile == 0 {
            return Err(super::kwargs::invalid_at(CONFIG_FILE, "downsample_ratio", "gives no tokens per tile"));
        }
        let mut grids: Vec<(u64, u64)> = (1..=max_tiles)
            .flat_map(|c| (1..=max_tiles).map(move |r| (c, r)))
            .filter(|&(c, r)| (min_tiles..=max_tiles).contains(&(c * r)))
            .collect();
        grids.sort_by_key(|&(c, r)| c * r);
        Ok(Spec { tile, thumbnail, tokens_per_tile, grids, hf: !is_remote(l) })
    }

    fn best_grid(&self, width: u32, height: u32) -> (u64, u64) {
        let aspect = f64::from(width) / f64::from(height);
        let area = u128::from(width) * u128::from(height);
        let tile_area = u128::from(self.tile) * u128::from(self.tile);
        let mut best = (1, 1);
        let mut best_diff = f64::INFINITY;
        for &(c, r) in &self.grids {
            let diff = (aspect - c as f64 / r as f64).abs();
            if diff < best_diff {
                best = (c, r);
                best_diff = diff;
            } else if diff == best_diff && 2 * area > tile_area * u128::from(c * r) {
                // `area > 0.5 * tile * tile * c * r`, compared exactly as Python does.
                best = (c, r);
            }
        }
        best
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        let (c, r) = self.best_grid(width, height);
        let mut tiles = c * r;
        let thumbnail = self.thumbnail && tiles != 1;
        if thumbnail {
            tiles += 1;
        }
        let feature = to_u32(mul(tiles, self.tokens_per_tile, "image tokens")?, "image tokens")?;
        let expansion = feature.checked_add(2).ok_or(AccountingError::Overflow { what: "expansion" })?;
        Ok(ImageTokens {
            feature_tokens: feature,
            expansion_tokens: Some(expansion),
            structure: Structure::InternVl {
                tiles: to_u32(tiles, "tiles")?,
                thumbnail,
                tokens_per_tile: to_u32(self.tokens_per_tile, "tokens per tile")?,
            },
        })
    }
}

pub(super) fn run(feature: u32) -> Vec<RunPart> {
    vec![RunPart::new(START, 1), RunPart::new(CONTEXT, feature), RunPart::new(END, 1)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map};

    fn spec(
        cfg: serde_json::Value,
        pp: serde_json::Value,
        server: Map<String, serde_json::Value>,
    ) -> Result<Spec, AccountingError> {
        Spec::build(&Layers::new(&pp, &cfg, &server, None))
    }

    fn vision() -> serde_json::Value {
        json!({"image_size": 448, "patch_size": 14})
    }

    #[test]
    fn quick_check_values() {
        let pp = json!({"size": {"height": 448, "width": 448}, "min_patches": 1, "max_patches": 12, "crop_to_patches": true});
        let cfg = json!({"model_type": "internvl", "vision_config": vision(), "downsample_ratio": 0.5});
        let s = spec(cfg, pp, Map::new()).unwrap();
        for ((w, h), want) in [((1, 1), 256), ((640, 480), 3328), ((1920, 1080), 2304), ((8000, 100), 3328)] {
            assert_eq!(s.count(w, h).map(|t| t.feature_tokens), Ok(want), "{w}x{h}");
        }
    }

    #[test]
    fn remote_code_reads_config_and_kwargs() {
        let cfg = json!({
            "model_type": "internvl_chat", "force_image_size": 448, "vision_config": vision(),
            "downsample_ratio": 0.5, "min_dynamic_patch": 1, "max_dynamic_patch": 12,
            "dynamic_image_size": true, "use_thumbnail": true
        });
        let s = spec(cfg.clone(), json!({}), Map::new()).unwrap();
        assert_eq!(s.count(640, 480).map(|t| t.feature_tokens), Ok(3328));
        let server = json!({"max_dynamic_patch": 1}).as_object().cloned().unwrap_or_default();
        let s = spec(cfg, json!({}), server).unwrap();
        assert_eq!(s.count(640, 480).map(|t| t.feature_tokens), Ok(256));
    }
}
