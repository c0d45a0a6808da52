//! LLaVA-NeXT / 1.6 anyres: pick the best pinpoint canvas, count the unpadded feature map of its tiles
//! plus one newline feature per row, plus the base image.

use super::error::AccountingError;
use super::kwargs::{Found, Layers, CONFIG_FILE, PREPROCESSOR_FILE};
use super::llava::Tower;
use super::num::{add, exact, mul, to_u32, to_u64};
use super::{ImageTokens, Structure};

#[derive(Clone, Debug)]
pub(super) struct Spec {
    tower: Tower,
    /// `[height, width]` canvases in file order (order breaks ties).
    pinpoints: Vec<(u64, u64)>,
}

fn parse_pinpoints(found: Found) -> Result<Vec<(u64, u64)>, AccountingError> {
    let field = "image_grid_pinpoints";
    let list = found.value.as_array().ok_or_else(|| found.invalid(field, "must be a list of [height, width]"))?;
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let pair = item.as_array().map(Vec::as_slice);
        let Some([h, w]) = pair else {
            return Err(found.invalid(field, format!("entry {item} is not a [height, width] pair")));
        };
        let h = Found { value: h, origin: found.origin }.pos(field)?;
        let w = Found { value: w, origin: found.origin }.pos(field)?;
        out.push((h, w));
    }
    if out.is_empty() {
        return Err(found.invalid(field, "is empty"));
    }
    Ok(out)
}

impl Spec {
    pub(super) fn build(l: &Layers) -> Result<Spec, AccountingError> {
        let tower = Tower::build(l)?;
        // vLLM reads the pinpoints from config.json, HF from the processor file: they must agree.
        let cfg = l
            .cfg_found(&["image_grid_pinpoints"])
            .ok_or_else(|| super::kwargs::missing(CONFIG_FILE, "image_grid_pinpoints"))?;
        let pinpoints = parse_pinpoints(cfg)?;
        if let Some(pp) = l.proc("image_grid_pinpoints") {
            if pp.origin == PREPROCESSOR_FILE && parse_pinpoints(pp)? != pinpoints {
                return Err(AccountingError::ConfigInvalidField {
                    file: PREPROCESSOR_FILE,
                    field: "image_grid_pinpoints".into(),
                    detail: format!("differs from {CONFIG_FILE}"),
                });
            }
        }
        for &(h, w) in &pinpoints {
            if h % tower.image_size != 0 || w % tower.image_size != 0 {
                return Err(AccountingError::ConfigInvalidField {
                    file: CONFIG_FILE,
                    field: "image_grid_pinpoints".into(),
                    detail: format!("[{h}, {w}] is not a multiple of image_size {}", tower.image_size),
                });
            }
        }
        Ok(Spec { tower, pinpoints })
    }

    /// HF `select_best_resolution`: most effective pixels, then least waste, first in file order.
    fn best_canvas(&self, width: u32, height: u32) -> Result<(u64, u64), AccountingError> {
        let (wf, hf) = (f64::from(width), f64::from(height));
        let original = u128::from(width) * u128::from(height);
        let mut best = None;
        let mut best_eff = 0u128;
        let mut best_waste = u128::MAX;
        for &(ph, pw) in &self.pinpoints {
            let scale = (exact(pw, "pinpoint")? / wf).min(exact(ph, "pinpoint")? / hf);
            let dw = to_u64(wf * scale, "downscaled width")?;
            let dh = to_u64(hf * scale, "downscaled height")?;
            let eff = (u128::from(dw) * u128::from(dh)).min(original);
            let waste = (u128::from(ph) * u128::from(pw)).saturating_sub(eff);
            if eff > best_eff || (eff == best_eff && waste < best_waste) {
                best = Some((ph, pw));
                best_eff = eff;
                best_waste = waste;
            }
        }
        best.ok_or(AccountingError::UnsupportedGeometry {
            width,
            height,
            detail: "no pinpoint canvas has a positive effective resolution",
        })
    }

    pub(super) fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        let (ph, pw) = self.best_canvas(width, height)?;
        let tiles_h = ph / self.tower.image_size;
        let tiles_w = pw / self.tower.image_size;
        let mut rows = mul(self.tower.grid, tiles_h, "feature rows")?;
        let mut cols = mul(self.tower.grid, tiles_w, "feature cols")?;
        let (wf, hf) = (f64::from(width), f64::from(height));
        let (rf, cf) = (exact(rows, "feature rows")?, exact(cols, "feature cols")?);
        // Unpad: the side that was letterboxed loses its padding, symmetric (integer halving).
        if wf / hf > cf / rf {
            rows = unpad(rows, int_round7(hf * (cf / wf))?)?;
        } else {
            cols = unpad(cols, int_round7(wf * (rf / hf))?)?;
        }
        let tokens = add(
            add(mul(rows, cols, "unpadded features")?, rows, "newline features")?,
            self.tower.base,
            "image tokens",
        )?;
        let n = to_u32(tokens, "image tokens")?;
        Ok(ImageTokens {
            feature_tokens: n,
            expansion_tokens: Some(n),
            structure: Structure::AnyRes {
                tiles_h: to_u32(tiles_h, "tiles")?,
                tiles_w: to_u32(tiles_w, "tiles")?,
                rows: to_u32(rows, "feature rows")?,
                cols: to_u32(cols, "feature cols")?,
            },
        })
    }
}

/// `current - 2 * ((current - new) // 2)` with Python's floor division.
fn unpad(current: u64, new: u64) -> Result<u64, AccountingError> {
    let padding = (i128::from(current) - i128::from(new)).div_euclid(2);
    u64::try_from(i128::from(current) - 2 * padding).map_err(|_| AccountingError::Overflow { what: "unpadded side" })
}

/// Python `int(round(x, 7))` for `x >= 0`: round to 7 decimals (correctly rounded decimal
/// formatting, as CPython does), then truncate. Lifts values within 5e-8 below an integer.
pub(super) fn int_round7(x: f64) -> Result<u64, AccountingError> {
    if !x.is_finite() || x < 0.0 {
        return Err(AccountingError::Overflow { what: "unpadded side" });
    }
    let text = format!("{x:.7}");
    let whole = text.split('.').next().unwrap_or("");
    whole.parse::<u64>().map_err(|_| AccountingError::Overflow { what: "unpadded side" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round7_lifts_values_just_below_an_integer() {
        assert_eq!(int_round7(23.999_999_97), Ok(24));
        assert_eq!(int_round7(23.999_999_9), Ok(23));
        assert_eq!(int_round7(23.5), Ok(23));
        assert_eq!(int_round7(0.0), Ok(0));
        assert!(int_round7(-1.0).is_err());
    }
}
