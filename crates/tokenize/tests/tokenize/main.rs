//! mmrouter-tokenize against Hugging Face `tokenizers` (the workspace's pinned version, the one
//! mmrouter-core uses): `parity` on the Qwen3 tokenizer over generated and found corpora, `config` on
//! accepted and refused `tokenizer.json` variants. One test binary.

mod common;
mod config;
mod parity;
