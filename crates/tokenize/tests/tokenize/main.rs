//! mmrouter-tokenize against Hugging Face `tokenizers` (the workspace's pinned version, the one
//! mmrouter-core uses): `parity` on the Qwen3 tokenizer over generated and found corpora, `config` on
//! accepted and refused `tokenizer.json` variants; `tekken` against ids `mistral_common` produced.
//! One test binary: each binary links the whole dependency graph again.

mod common;
mod config;
mod parity;
mod tekken;
