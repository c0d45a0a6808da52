//! LLaVA-1.5: a fixed feature map, `(image_size / patch_size)^2` plus the CLIP class token, minus one
//! for the "default" feature-select strategy (576 for CLIP-L/336).

use super::error::AccountingError;
use super::kwargs::{Layers, CONFIG_FILE};
use super::num::{add, mul, to_u32};
use super::{ImageTokens, Structure};

pub(super) const IMAGE: &str = "<image>";

/// Vision-tower geometry shared with LLaVA-NeXT.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tower {
    /// `vision_config.image_size` (one tile's side in pixels).
    pub(super) image_size: u64,
    /// Patches per tile side.
    pub(super) grid: u64,
    /// Tokens of one tile after the feature-select strategy.
    pub(super) base: u64,
}

impl Tower {
    pub(super) fn build(l: &Layers) -> Result<Tower, AccountingError> {
        let image_size = l
            .cfg_found(&["vision_config", "image_size"])
            .ok_or_else(|| super::kwargs::missing(CONFIG_FILE, "vision_config.image_size"))?
            .square_u64("vision_config.image_size")?;
        let patch = l.cfg_pos(&["vision_config", "patch_size"])?;
        // vLLM: `image_size // patch_size` (SigLIP-384 with patch 14 gives 27).
        let grid = image_size / patch;
        if grid == 0 {
            return Err(AccountingError::ConfigInvalidField {
                file: CONFIG_FILE,
                field: "vision_config.image_size".into(),
                detail: format!("{image_size} is smaller than patch_size {patch}"),
            });
        }
        // HF's LlavaConfig itself fills a missing tower type with CLIP; CLIP adds a class token.
        let class_tokens = match l.cfg_str(&["vision_config", "model_type"]).unwrap_or("clip_vision_model") {
            "clip_vision_model" => 1,
            "siglip_vision_model" => 0,
            other => {
                return Err(AccountingError::UnsupportedModel {
                    detail: format!("{CONFIG_FILE} vision_config.model_type {other:?} is not modelled"),
                })
            }
        };
        let strategy_drop = match l.cfg_str(&["vision_feature_select_strategy"]) {
            Some("default") => 1,
            Some("full") => 0,
            Some(other) => {
                return Err(AccountingError::ConfigInvalidField {
                    file: CONFIG_FILE,
                    field: "vision_feature_select_strategy".into(),
                    detail: format!("{other:?} is neither \"default\" nor \"full\""),
                })
            }
            None => return Err(super::kwargs::missing(CONFIG_FILE, "vision_feature_select_strategy")),
        };
        let base = add(mul(grid, grid, "feature map")?, class_tokens, "feature map")? - strategy_drop;
        if base == 0 {
            return Err(AccountingError::ConfigInvalidField {
                file: CONFIG_FILE,
                field: "vision_config.image_size".into(),
                detail: "yields an empty feature map".into(),
            });
        }
        Ok(Tower { image_size, grid, base })
    }
}

#[derive(Clone, Debug)]
pub(super) struct Spec {
    tokens: u32,
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        Ok(Spec { tokens: to_u32(Tower::build(l)?.base, "image tokens")? })
    }

    pub(super) fn count(&self, _width: u32, _height: u32) -> Result<ImageTokens, AccountingError> {
        Ok(ImageTokens {
            feature_tokens: self.tokens,
            expansion_tokens: Some(self.tokens),
            structure: Structure::Fixed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map};

    fn tower(cfg: serde_json::Value) -> Result<Tower, AccountingError> {
        let pp = json!({});
        let server = Map::new();
        Tower::build(&Layers::new(&pp, &cfg, &server, None))
    }

    #[test]
    fn strategy_and_tower_type_change_the_count() {
        let vc = json!({"image_size": 336, "patch_size": 14});
        let t = tower(json!({"vision_config": vc, "vision_feature_select_strategy": "default"}));
        assert_eq!(t.map(|t| t.base), Ok(576));
        let t = tower(json!({"vision_config": vc, "vision_feature_select_strategy": "full"}));
        assert_eq!(t.map(|t| t.base), Ok(577));
        let siglip = json!({"image_size": 384, "patch_size": 14, "model_type": "siglip_vision_model"});
        let t = tower(json!({"vision_config": siglip, "vision_feature_select_strategy": "full"}));
        assert_eq!(t.map(|t| t.base), Ok(729));
    }

    #[test]
    fn missing_strategy_is_an_error() {
        let t = tower(json!({"vision_config": {"image_size": 336, "patch_size": 14}}));
        let err = t.unwrap_err();
        assert_eq!(err.label(), "config_missing_field");
        assert!(err.to_string().contains("vision_feature_select_strategy"));
    }
}
