//! `mmrouter count`: image-token counts for sizes and image files, for a bundled profile or an HF
//! model directory (the output contract is in `accounting::cli`).

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::accounting::{cli as acli, Counter, Family};
use crate::prompt::PromptModel;

/// Returns the process exit code: 0 when every input was counted, 1 when any failed.
pub fn count(
    model_dir: &str,
    family: Option<&str>,
    sizes: &[String],
    files: &[PathBuf],
    json: bool,
) -> anyhow::Result<i32> {
    let family = family
        .map(|f| f.parse::<Family>().map_err(|_| anyhow::anyhow!("--family: unknown family '{f}'")))
        .transpose()?;
    let counter = if PromptModel::bundled_names().contains(&model_dir) {
        let file = |f: &str| -> anyhow::Result<serde_json::Value> {
            let b =
                PromptModel::bundled_file(model_dir, f).with_context(|| format!("bundled {model_dir} lacks {f}"))?;
            Ok(serde_json::from_slice(b)?)
        };
        Counter::from_json(&file("preprocessor_config.json")?, &file("config.json")?, family, &Default::default())
    } else {
        Counter::from_model_dir(Path::new(model_dir), family, &Default::default())
    }
    .with_context(|| format!("loading the image-token counter for --model-dir {model_dir}"))?;
    let rows = acli::count_rows(&counter, sizes, files);
    let out = if json { acli::render_json(&rows)? } else { acli::render_table(&counter, &rows) };
    print!("{out}");
    Ok(if rows.iter().any(|r| r.error.is_some()) { 1 } else { 0 })
}
