//! The model profiles compiled into the binary (`config/models/`), so `demo` and the tests run
//! with no files on disk. Both Qwen profiles share one gzip-compressed Qwen tokenizer; the
//! Qwen2.5-VL profile drops the four added tokens its real tokenizer lacks.

/// Added tokens that Qwen3's tokenizer has and Qwen2.5-VL's does not (ids 151665–151668).
pub(crate) const QWEN25_MISSING_TOKENS: [&str; 4] = ["<tool_response>", "</tool_response>", "<think>", "</think>"];

pub(crate) const QWEN_TOKENIZER_GZ: &[u8] =
    include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/models/qwen-tokenizer.json.gz"));

pub(crate) struct Profile {
    pub name: &'static str,
    pub config: &'static [u8],
    pub preprocessor_config: &'static [u8],
    pub tokenizer_config: &'static [u8],
    /// Added tokens to remove from the shared tokenizer for this profile.
    pub drop_added_tokens: &'static [&'static str],
}

macro_rules! model_file {
    ($dir:literal, $file:literal) => {
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/models/", $dir, "/", $file))
    };
}

pub(crate) const PROFILES: [Profile; 2] = [
    Profile {
        name: "qwen3-vl",
        config: model_file!("qwen3-vl", "config.json"),
        preprocessor_config: model_file!("qwen3-vl", "preprocessor_config.json"),
        tokenizer_config: model_file!("qwen3-vl", "tokenizer_config.json"),
        drop_added_tokens: &[],
    },
    Profile {
        name: "qwen2.5-vl",
        config: model_file!("qwen2.5-vl", "config.json"),
        preprocessor_config: model_file!("qwen2.5-vl", "preprocessor_config.json"),
        tokenizer_config: model_file!("qwen2.5-vl", "tokenizer_config.json"),
        drop_added_tokens: &QWEN25_MISSING_TOKENS,
    },
];

pub(crate) const NAMES: [&str; 2] = [PROFILES[0].name, PROFILES[1].name];

pub(crate) fn profile(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}
