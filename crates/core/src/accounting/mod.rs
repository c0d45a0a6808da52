//! Exact, fallible image-token accounting: how many prompt tokens one image becomes, per VLM family.
//!
//! A [`Counter`] is built once from a model directory's `preprocessor_config.json` and `config.json`
//! (family auto-detected, or overridden), with the server's `processor_kwargs` on top; a request's
//! `mm_processor_kwargs` give a derived counter. Every count either matches what vLLM / transformers
//! produce or is an [`AccountingError`] whose label becomes the fallback reason — never an estimate.
//! The per-family formulas live one file each; `/work/shared/reference/accounting.md` has the facts.

mod error;
mod gemma3;
mod glm4v;
mod idefics3;
mod internvl;
mod kimi_vl;
mod kwargs;
mod llama4;
mod llava;
mod llava_next;
mod nemotron;
mod num;
mod phi3v;
mod pixtral;
mod qwen;
pub mod video;

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

pub use error::AccountingError;

use kwargs::{Layers, CONFIG_FILE, PREPROCESSOR_FILE, REQUEST_KWARGS, SERVER_KWARGS};

/// A model family with its own counting rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Qwen2-VL and Qwen2.5-VL (`smart_resize`, factor 28).
    Qwen2Vl,
    /// Qwen3-VL (same algorithm, patch 16, factor 32).
    Qwen3Vl,
    /// GLM-4.1V / GLM-4.5V (budget over two temporal frames, small sides upscaled).
    Glm4v,
    /// LLaVA-1.5 (fixed count).
    Llava,
    /// LLaVA-NeXT / 1.6 anyres.
    LlavaNext,
    /// Phi-3-vision and Phi-3.5-vision HD transform.
    Phi3V,
    /// Llama 4 tiles with separators.
    Llama4,
    /// InternVL 2.5 / 3 dynamic tiling.
    InternVl,
    /// Gemma 3, optionally with pan & scan.
    Gemma3,
    /// Pixtral-12B (HF `llava` checkpoints with a Pixtral vision tower).
    Pixtral,
    /// Mistral-Small-3.1 / 3.2 (`mistral3`).
    Mistral3,
    /// Idefics3.
    Idefics3,
    /// SmolVLM (the Idefics3 algorithm).
    SmolVlm,
    /// Kimi-VL (MoonViT).
    KimiVl,
    /// Nemotron-3-Nano-Omni dynamic resolution (request-wide budget).
    NemotronOmni,
}

const ALL_FAMILIES: [Family; 15] = [
    Family::Qwen2Vl,
    Family::Qwen3Vl,
    Family::Glm4v,
    Family::Llava,
    Family::LlavaNext,
    Family::Phi3V,
    Family::Llama4,
    Family::InternVl,
    Family::Gemma3,
    Family::Pixtral,
    Family::Mistral3,
    Family::Idefics3,
    Family::SmolVlm,
    Family::KimiVl,
    Family::NemotronOmni,
];

impl Family {
    /// Stable snake_case name (config `[model] family`, CLI `--family`).
    pub fn label(&self) -> &'static str {
        match self {
            Family::Qwen2Vl => "qwen2_vl",
            Family::Qwen3Vl => "qwen3_vl",
            Family::Glm4v => "glm4v",
            Family::Llava => "llava",
            Family::LlavaNext => "llava_next",
            Family::Phi3V => "phi3_v",
            Family::Llama4 => "llama4",
            Family::InternVl => "internvl",
            Family::Gemma3 => "gemma3",
            Family::Pixtral => "pixtral",
            Family::Mistral3 => "mistral3",
            Family::Idefics3 => "idefics3",
            Family::SmolVlm => "smolvlm",
            Family::KimiVl => "kimi_vl",
            Family::NemotronOmni => "nemotron_omni",
        }
    }

    /// Every supported family, for listings and tests.
    /// See [`Counter::prompt_placeholder`].
    pub fn prompt_placeholder(self, n: usize) -> Option<String> {
        Some(match self {
            Family::Qwen2Vl | Family::Qwen3Vl => "<|vision_start|><|image_pad|><|vision_end|>".to_owned(),
            Family::Glm4v => "<|begin_of_image|><|image|><|end_of_image|>".to_owned(),
            Family::Llava
            | Family::LlavaNext
            | Family::Idefics3
            | Family::SmolVlm
            | Family::InternVl
            | Family::NemotronOmni => "<image>".to_owned(),
            Family::Phi3V => format!("<|image_{n}|>"),
            Family::Llama4 => "<|image|>".to_owned(),
            Family::Gemma3 => "<start_of_image>".to_owned(),
            Family::KimiVl => "<|media_start|>image<|media_content|><|media_pad|><|media_end|>".to_owned(),
            Family::Pixtral | Family::Mistral3 => return None,
        })
    }

    pub fn all() -> &'static [Family] {
        &ALL_FAMILIES
    }

    /// The family a `config.json` `model_type` names, if supported.
    fn from_model_type(model_type: &str, l: &Layers) -> Option<Family> {
        Some(match model_type {
            "qwen2_vl" | "qwen2_5_vl" => Family::Qwen2Vl,
            "qwen3_vl" | "qwen3_vl_moe" => Family::Qwen3Vl,
            "glm4v" | "glm4v_moe" => Family::Glm4v,
            "llava" => llava_or_pixtral(l),
            "llava_next" => Family::LlavaNext,
            "phi3_v" => Family::Phi3V,
            "llama4" => Family::Llama4,
            "internvl" | "internvl_chat" => Family::InternVl,
            "gemma3" => Family::Gemma3,
            "mistral3" => Family::Mistral3,
            "idefics3" => Family::Idefics3,
            "smolvlm" => Family::SmolVlm,
            "kimi_vl" => Family::KimiVl,
            t if t.starts_with("NemotronH_Nano") && nemotron::is_dynamic(l) => Family::NemotronOmni,
            _ => return None,
        })
    }

    /// The family a `config.json` `architectures` entry names, if supported.
    fn from_architecture(arch: &str, l: &Layers) -> Option<Family> {
        Some(match arch {
            "Qwen2VLForConditionalGeneration" | "Qwen2_5_VLForConditionalGeneration" => Family::Qwen2Vl,
            "Qwen3VLForConditionalGeneration" | "Qwen3VLMoeForConditionalGeneration" => Family::Qwen3Vl,
            "Glm4vForConditionalGeneration" | "Glm4vMoeForConditionalGeneration" => Family::Glm4v,
            "LlavaForConditionalGeneration" => llava_or_pixtral(l),
            "LlavaNextForConditionalGeneration" => Family::LlavaNext,
            "Phi3VForCausalLM" => Family::Phi3V,
            "Llama4ForConditionalGeneration" => Family::Llama4,
            "InternVLForConditionalGeneration" | "InternVLChatModel" => Family::InternVl,
            "Gemma3ForConditionalGeneration" => Family::Gemma3,
            "Mistral3ForConditionalGeneration" => Family::Mistral3,
            "Idefics3ForConditionalGeneration" => Family::Idefics3,
            "SmolVLMForConditionalGeneration" => Family::SmolVlm,
            "KimiVLForConditionalGeneration" => Family::KimiVl,
            _ => return None,
        })
    }

    /// Dispatch on `model_type`, then `architectures` (never on a model id); refuse anything else.
    fn detect(l: &Layers) -> Result<Family, AccountingError> {
        let model_type = l.cfg_str(&["model_type"]);
        if let Some(family) = model_type.and_then(|t| Family::from_model_type(t, l)) {
            return Ok(family);
        }
        let archs: Vec<&str> = l
            .cfg(&["architectures"])
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(family) = archs.iter().find_map(|a| Family::from_architecture(a, l)) {
            return Ok(family);
        }
        let detail = match (model_type, archs.is_empty()) {
            (None, true) => format!("{CONFIG_FILE} has neither `model_type` nor `architectures`"),
            (t, _) if t.is_some_and(|t| t.starts_with("NemotronH_Nano")) => format!(
                "model_type {t:?}: only the dynamic-resolution (Omni) image path is modelled \
                 ({CONFIG_FILE} vision_config.args.min_num_patches)"
            ),
            _ => format!("model_type {model_type:?} / architectures {archs:?} is not a supported family"),
        };
        Err(AccountingError::UnsupportedModel { detail })
    }
}

/// HF ships Pixtral-12B as `llava` with a Pixtral vision tower.
fn llava_or_pixtral(l: &Layers) -> Family {
    let pixtral_tower = l.cfg_str(&["vision_config", "model_type"]) == Some("pixtral");
    let pixtral_processor = l.pp_str("image_processor_type").is_some_and(|t| t.starts_with("Pixtral"));
    if pixtral_tower || pixtral_processor {
        Family::Pixtral
    } else {
        Family::Llava
    }
}

impl std::str::FromStr for Family {
    type Err = AccountingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let normalized = s.trim().to_ascii_lowercase().replace(['-', '.'], "_");
        let alias = match normalized.as_str() {
            "qwen2_5_vl" => Some(Family::Qwen2Vl),
            "qwen3_vl_moe" => Some(Family::Qwen3Vl),
            "glm4v_moe" => Some(Family::Glm4v),
            "internvl_chat" => Some(Family::InternVl),
            _ => None,
        };
        alias.or_else(|| ALL_FAMILIES.iter().copied().find(|f| f.label() == normalized)).ok_or_else(|| {
            AccountingError::UnsupportedModel {
                detail: format!(
                    "unknown family {s:?} (known: {})",
                    ALL_FAMILIES.iter().map(Family::label).collect::<Vec<_>>().join(", ")
                ),
            }
        })
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// What a count depends on beyond `(width, height)`; only request-wide families read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestContext {
    /// The workers' `--max-model-len`.
    pub max_model_len: Option<u32>,
    /// Prompt tokens that are not image tokens, as the engine's entrypoint sees them (the OpenAI
    /// chat path sees the rendered prompt; token-in paths see 0).
    pub text_tokens: Option<u32>,
}

/// Where the tokens of one image come from (rows, tiles, crops …), per family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Structure {
    /// Qwen-VL: resized patch grid before the `merge × merge` merge.
    Qwen { grid_h: u32, grid_w: u32, merge: u32 },
    /// GLM-4.xV: resized patch grid before the 2×2 merge.
    Glm { grid_h: u32, grid_w: u32, merge: u32 },
    /// LLaVA-1.5: one fixed-size feature map.
    Fixed,
    /// LLaVA-NeXT: chosen pinpoint in tiles, unpadded feature map (rows × cols, a newline per row).
    AnyRes { tiles_h: u32, tiles_w: u32, rows: u32, cols: u32 },
    /// Phi-3-V: HD-transform crop grid (plus one global view).
    Phi3V { crops_h: u32, crops_w: u32 },
    /// Llama 4: tile grid (a single tile means no global view).
    Llama4 { rows: u32, cols: u32, patches_per_tile: u32 },
    /// InternVL: tiles (thumbnail included when present).
    InternVl { tiles: u32, thumbnail: bool, tokens_per_tile: u32 },
    /// Gemma 3: pan-and-scan crops besides the full image (0 without pan & scan).
    Gemma3 { crops: u32, tokens_per_image: u32 },
    /// Pixtral / Mistral3: `[IMG]` grid, a break per row.
    Pixtral { rows: u32, cols: u32 },
    /// Idefics3 / SmolVLM: split grid (0×0 when not split), `seq_len` tokens per tile.
    Idefics3 { rows: u32, cols: u32, seq_len: u32 },
    /// Kimi-VL: merged token grid.
    KimiVl { grid_h: u32, grid_w: u32 },
    /// Nemotron Omni: patch grid before the 2×2 pixel shuffle.
    NemotronOmni { patches_h: u32, patches_w: u32 },
}

/// One piece of an image's expansion: a literal token text repeated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunPart {
    pub text: Cow<'static, str>,
    pub repeat: u32,
}

impl RunPart {
    fn new(text: &'static str, repeat: u32) -> RunPart {
        RunPart { text: Cow::Borrowed(text), repeat }
    }
}

/// The token count of one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageTokens {
    /// Tokens that receive an image embedding (vLLM `get_num_image_tokens`).
    pub feature_tokens: u32,
    /// Every token replacing the placeholder; `None` where it also depends on the prompt (Gemma 3).
    pub expansion_tokens: Option<u32>,
    pub structure: Structure,
}

/// An expansion that is text, not tokens: it replaces the placeholder in the rendered prompt before
/// tokenization, because its edges merge with the prompt around it (Gemma 3's `"\n\n"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextExpansion {
    pub text: String,
    /// The token that carries the image's embedding, and how many of it the text holds in one run.
    pub embed_token: &'static str,
    pub embed_count: u32,
    /// Tokens on each side of the embedding run that vLLM's placeholder range (`mm_placeholders`, the
    /// offsets it hashes into block keys) also covers.
    pub wrap: u32,
}

impl ImageTokens {
    /// The text expansion of families that need one (Gemma 3 without pan-and-scan crops), else `None`.
    pub fn text_expansion(&self) -> Option<TextExpansion> {
        match &self.structure {
            Structure::Gemma3 { crops: 0, tokens_per_image } => Some(gemma3::text_expansion(*tokens_per_image)),
            _ => None,
        }
    }

    /// The exact token run that replaces the placeholder, in order, as literal token texts with repeat
    /// counts. `None` where the run also depends on the prompt (Gemma 3's merged newlines).
    pub fn run(&self) -> Option<Vec<RunPart>> {
        let n = self.feature_tokens;
        Some(match &self.structure {
            Structure::Qwen { .. } => vec![RunPart::new(qwen::PAD, n)],
            Structure::Glm { .. } => vec![RunPart::new(glm4v::PAD, n)],
            Structure::Fixed | Structure::AnyRes { .. } => vec![RunPart::new(llava::IMAGE, n)],
            Structure::Phi3V { .. } => vec![RunPart::new(phi3v::IMAGE, n)],
            Structure::Llama4 { rows, cols, patches_per_tile } => llama4::run(*rows, *cols, *patches_per_tile),
            Structure::InternVl { .. } => internvl::run(n),
            Structure::Gemma3 { .. } => return None,
            Structure::Pixtral { rows, cols } => pixtral::run(*rows, *cols),
            Structure::Idefics3 { rows, cols, seq_len } => idefics3::run(*rows, *cols, *seq_len),
            Structure::KimiVl { .. } => vec![RunPart::new(kimi_vl::PAD, n)],
            Structure::NemotronOmni { .. } => nemotron::run(n),
        })
    }
}

/// Parsed counting parameters of one family.
#[derive(Clone, Debug)]
enum Spec {
    Qwen(qwen::Spec),
    Glm(glm4v::Spec),
    Llava(llava::Spec),
    LlavaNext(llava_next::Spec),
    Phi3V(phi3v::Spec),
    Llama4(llama4::Spec),
    InternVl(internvl::Spec),
    Gemma3(gemma3::Spec),
    Pixtral(pixtral::Spec),
    Idefics3(idefics3::Spec),
    KimiVl(kimi_vl::Spec),
    Nemotron(nemotron::Spec),
}

/// The model files and server kwargs a counter was built from (kept to apply request kwargs).
#[derive(Debug)]
struct Sources {
    preprocessor: Value,
    config: Value,
    server_kwargs: Map<String, Value>,
}

/// Counts image tokens for one model, with the server's processor kwargs applied.
#[derive(Clone, Debug)]
pub struct Counter {
    family: Family,
    spec: Spec,
    sources: Arc<Sources>,
}

impl Counter {
    /// Reads `preprocessor_config.json` and `config.json` from `dir`.
    pub fn from_model_dir(
        dir: &Path,
        family_override: Option<Family>,
        server_kwargs: &Map<String, Value>,
    ) -> Result<Counter, AccountingError> {
        let preprocessor = read_json(dir, PREPROCESSOR_FILE)?;
        let config = read_json(dir, CONFIG_FILE)?;
        Counter::build(preprocessor, config, family_override, server_kwargs.clone())
    }

    /// The counter of vLLM's `--tokenizer-mode mistral`, where mistral_common sizes images from the
    /// `image` section of `tekken.json` (patch, longest side, spatial merge) and rounds half to even.
    pub fn for_tekken(patch: u32, max_image_size: u32, merge: u32) -> Result<Counter, AccountingError> {
        let preprocessor = serde_json::json!({"patch_size": patch, "size": {"longest_edge": max_image_size}});
        let config = serde_json::json!({"spatial_merge_size": merge});
        // Pixtral-12B has no merge layer; Mistral 3 merges 2×2 patches into one token.
        let family = if merge == 1 { Family::Pixtral } else { Family::Mistral3 };
        let mut kwargs = Map::new();
        kwargs.insert(kwargs::TOKENIZER_MODE.to_owned(), Value::String("mistral".into()));
        Counter::build(preprocessor, config, Some(family), kwargs)
    }

    /// Builds from already-parsed files.
    pub fn from_json(
        preprocessor_config: &Value,
        config: &Value,
        family_override: Option<Family>,
        server_kwargs: &Map<String, Value>,
    ) -> Result<Counter, AccountingError> {
        Counter::build(preprocessor_config.clone(), config.clone(), family_override, server_kwargs.clone())
    }

    fn build(
        preprocessor: Value,
        config: Value,
        family_override: Option<Family>,
        server_kwargs: Map<String, Value>,
    ) -> Result<Counter, AccountingError> {
        for (file, v) in [(PREPROCESSOR_FILE, &preprocessor), (CONFIG_FILE, &config)] {
            if !v.is_object() {
                return Err(AccountingError::ConfigFile { file: file.to_string(), detail: "not a JSON object".into() });
            }
        }
        let sources = Sources { preprocessor, config, server_kwargs };
        let layers = Layers::new(&sources.preprocessor, &sources.config, &sources.server_kwargs, None);
        let family = match family_override {
            Some(f) => f,
            None => Family::detect(&layers)?,
        };
        let mut allowed = allowed_kwargs(family, &layers).to_vec();
        if matches!(family, Family::Pixtral | Family::Mistral3) {
            allowed.push(kwargs::TOKENIZER_MODE);
        }
        kwargs::check_keys(&sources.server_kwargs, &allowed, SERVER_KWARGS)?;
        let spec = build_spec(family, &layers)?;
        Ok(Counter { family, spec, sources: Arc::new(sources) })
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// A counter with a request's vLLM `mm_processor_kwargs` applied on top of the server's; any key
    /// the family does not model is a `processor_kwargs` error (the count would be a guess).
    pub fn with_request_kwargs(&self, kwargs: &Map<String, Value>) -> Result<Counter, AccountingError> {
        if kwargs.is_empty() {
            return Ok(self.clone());
        }
        let s = &self.sources;
        let layers = Layers::new(&s.preprocessor, &s.config, &s.server_kwargs, Some(kwargs));
        kwargs::check_keys(kwargs, allowed_kwargs(self.family, &layers), REQUEST_KWARGS)?;
        let spec = build_spec(self.family, &layers)?;
        Ok(Counter { family: self.family, spec, sources: Arc::clone(&self.sources) })
    }

    /// Tokens of one image of stored size `width × height` (no EXIF rotation).
    ///
    /// Nemotron Omni: the single-image count with the full per-image budget (`max_num_patches`),
    /// exact only when the request holds this one image and enough context; routing must use
    /// [`Counter::count_all`].
    pub fn count(&self, width: u32, height: u32) -> Result<ImageTokens, AccountingError> {
        num::nonzero(width, height)?;
        match &self.spec {
            Spec::Qwen(s) => s.count(width, height),
            Spec::Glm(s) => s.count(width, height),
            Spec::Llava(s) => s.count(width, height),
            Spec::LlavaNext(s) => s.count(width, height),
            Spec::Phi3V(s) => s.count(width, height),
            Spec::Llama4(s) => s.count(width, height),
            Spec::InternVl(s) => s.count(width, height),
            Spec::Gemma3(s) => s.count(width, height),
            Spec::Pixtral(s) => s.count(width, height),
            Spec::Idefics3(s) => s.count(width, height),
            Spec::KimiVl(s) => s.count(width, height),
            Spec::Nemotron(s) => s.count_single(width, height),
        }
    }

    /// Tokens of every image of one request, in order. Per image for most families; Nemotron Omni
    /// shares one budget across the request (needs `ctx.max_model_len` and `ctx.text_tokens`).
    /// All-or-nothing: the first failing image fails the call.
    pub fn count_all(&self, sizes: &[(u32, u32)], ctx: &RequestContext) -> Result<Vec<ImageTokens>, AccountingError> {
        match &self.spec {
            Spec::Nemotron(s) => s.count_all(sizes, ctx),
            _ => sizes.iter().map(|&(w, h)| self.count(w, h)).collect(),
        }
    }

    /// Literal text of the single token the chat template emits per image and the processor
    /// replaces. Phi-3-V is the exception: prompts carry `<|image_1|>`, `<|image_2|>` … and each is
    /// replaced by a run of `<|image|>`, the text returned here.
    /// The placeholder vLLM writes into string-format message content for the n-th image (1-based) of
    /// a request (`get_placeholder_str`); `None` where vLLM writes none (Pixtral, Mistral 3).
    pub fn prompt_placeholder(&self, n: usize) -> Option<String> {
        match &self.spec {
            Spec::InternVl(s) if s.hf_format() => Some(internvl::HF_PLACEHOLDER.to_owned()),
            _ => self.family.prompt_placeholder(n),
        }
    }

    pub fn placeholder(&self) -> &str {
        if let Spec::InternVl(s) = &self.spec {
            return s.placeholder();
        }
        match self.family {
            Family::Qwen2Vl | Family::Qwen3Vl => qwen::PAD,
            Family::Glm4v => glm4v::PAD,
            Family::Llava | Family::LlavaNext => llava::IMAGE,
            Family::Phi3V => phi3v::IMAGE,
            Family::Llama4 => llama4::PLACEHOLDER,
            Family::InternVl => internvl::PLACEHOLDER,
            Family::Gemma3 => gemma3::PLACEHOLDER,
            Family::Pixtral | Family::Mistral3 => pixtral::IMG,
            Family::Idefics3 | Family::SmolVlm => idefics3::IMAGE,
            Family::KimiVl => kimi_vl::PAD,
            Family::NemotronOmni => nemotron::PLACEHOLDER,
        }
    }
}

/// Processor kwargs each family models (request and server level).
fn allowed_kwargs(family: Family, l: &Layers) -> &'static [&'static str] {
    match family {
        Family::Qwen2Vl | Family::Qwen3Vl => qwen::KWARGS,
        Family::Glm4v => glm4v::KWARGS,
        Family::Llava | Family::LlavaNext | Family::KimiVl | Family::NemotronOmni => &[],
        Family::Phi3V => phi3v::KWARGS,
        Family::Llama4 => llama4::KWARGS,
        Family::InternVl => internvl::kwargs(l),
        Family::Gemma3 => gemma3::KWARGS,
        Family::Pixtral | Family::Mistral3 => pixtral::KWARGS,
        Family::Idefics3 | Family::SmolVlm => idefics3::KWARGS,
    }
}

fn build_spec(family: Family, l: &Layers) -> Result<Spec, AccountingError> {
    Ok(match family {
        Family::Qwen2Vl | Family::Qwen3Vl => Spec::Qwen(qwen::Spec::build(l)?),
        Family::Glm4v => Spec::Glm(glm4v::Spec::build(l)?),
        Family::Llava => Spec::Llava(llava::Spec::build(l)?),
        Family::LlavaNext => Spec::LlavaNext(llava_next::Spec::build(l)?),
        Family::Phi3V => Spec::Phi3V(phi3v::Spec::build(l)?),
        Family::Llama4 => Spec::Llama4(llama4::Spec::build(l)?),
        Family::InternVl => Spec::InternVl(internvl::Spec::build(l)?),
        Family::Gemma3 => Spec::Gemma3(gemma3::Spec::build(l)?),
        Family::Pixtral | Family::Mistral3 => Spec::Pixtral(pixtral::Spec::build(l, family)?),
        Family::Idefics3 | Family::SmolVlm => Spec::Idefics3(idefics3::Spec::build(l)?),
        Family::KimiVl => Spec::KimiVl(kimi_vl::Spec::build(l)?),
        Family::NemotronOmni => Spec::Nemotron(nemotron::Spec::build(l)?),
    })
}

fn read_json(dir: &Path, file: &'static str) -> Result<Value, AccountingError> {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| AccountingError::ConfigFile { file: path.display().to_string(), detail: e.to_string() })?;
    serde_json::from_str(&text)
        .map_err(|e| AccountingError::ConfigFile { file: path.display().to_string(), detail: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn family_names_round_trip() {
        for f in Family::all() {
            assert_eq!(f.label().parse::<Family>().ok(), Some(*f));
        }
        assert_eq!("qwen2.5-vl".parse::<Family>().ok(), Some(Family::Qwen2Vl));
        assert_eq!("nope".parse::<Family>().map_err(|e| e.label()), Err("unsupported_model"));
    }

    #[test]
    fn detection_uses_model_type_then_architectures() {
        let pp = json!({});
        let server = Map::new();
        let detect = |cfg: Value| {
            let l = Layers::new(&pp, &cfg, &server, None);
            Family::detect(&l)
        };
        assert_eq!(detect(json!({"model_type": "qwen2_5_vl"})), Ok(Family::Qwen2Vl));
        assert_eq!(detect(json!({"model_type": "llava"})), Ok(Family::Llava));
        assert_eq!(
            detect(json!({"model_type": "llava", "vision_config": {"model_type": "pixtral"}})),
            Ok(Family::Pixtral)
        );
        assert_eq!(detect(json!({"architectures": ["Qwen3VLForConditionalGeneration"]})), Ok(Family::Qwen3Vl));
        assert_eq!(detect(json!({"model_type": "bert"})).map_err(|e| e.label()), Err("unsupported_model"));
        assert_eq!(detect(json!({})).map_err(|e| e.label()), Err("unsupported_model"));
        assert_eq!(
            detect(json!({"model_type": "NemotronH_Nano_VL_V2", "vision_config": {}})).map_err(|e| e.label()),
            Err("unsupported_model")
        );
    }

    #[test]
    fn files_that_are_not_objects_are_refused() {
        let err = Counter::from_json(&json!([]), &json!({}), None, &Map::new()).unwrap_err();
        assert_eq!(err.label(), "config_file");
    }

    #[test]
    fn empty_files_report_missing_fields_for_every_family() {
        let pp = json!({});
        let cfg = json!({});
        let server = Map::new();
        let l = Layers::new(&pp, &cfg, &server, None);
        for f in Family::all() {
            let err = build_spec(*f, &l).unwrap_err();
            assert_eq!(err.label(), "config_missing_field", "{f}: {err}");
        }
    }
}
