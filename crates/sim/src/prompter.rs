//! [`WordPrompter`]: the simulator's fallback prompter, for tests and for running without a model.
//!
//! It is deliberately crude and knows nothing of chat templates or tokenizers:
//! * every whitespace-separated word of every text part (chat `messages[].content` strings and
//!   `{"type":"text"}` parts; the completions `prompt` string) is one token, its id a hash of the word;
//! * every image part (`image_url`, string or `{url}`) is **one** opaque token, a hash of its URL bytes
//!   (any other part type likewise hashes its JSON as one token);
//! * a completions `prompt` given as token ids uses those ids;
//! * full blocks are chain-keyed with xxh3: `key_i = xxh3_64_with_seed(LE bytes of block i's ids,
//!   key_{i-1})`, the chain starting from a fixed root.
//!
//! Two requests therefore share cached blocks exactly when their word sequences share full blocks.
//! Its token ids are not a model's, so it reports none: its requests publish no KV events.

use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::prompt::{Prompter, SimPrompt};

/// Seeds keep words, images and other parts in separate id spaces.
const WORD_SEED: u64 = 0x5749_4d5f_574f_5244;
const IMAGE_SEED: u64 = 0x5349_4d5f_494d_4147;
const PART_SEED: u64 = 0x5349_4d5f_5041_5254;

/// The fallback prompter: one token per word, one per image. See the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub struct WordPrompter;

impl Prompter for WordPrompter {
    fn prompt(&self, path: &str, body: &Value, _raw: &[u8], block_size: usize) -> Result<SimPrompt, String> {
        if block_size == 0 {
            return Err("block size must be at least 1".to_owned());
        }
        let mut tokens = Vec::new();
        match path {
            "/v1/chat/completions" => chat_tokens(body, &mut tokens)?,
            "/v1/completions" => completion_tokens(body, &mut tokens)?,
            other => return Err(format!("no prompt format for path {other}")),
        }
        let prompt_tokens =
            u32::try_from(tokens.len()).map_err(|_| format!("prompt of {} tokens is too long", tokens.len()))?;
        Ok(SimPrompt { prompt_tokens, block_keys: chain_keys(&tokens, block_size), ..SimPrompt::default() })
    }
}

fn root_key() -> u64 {
    xxh3_64(b"mmrouter-sim word prompter")
}

fn chain_keys(tokens: &[u64], block_size: usize) -> Vec<u64> {
    let mut parent = root_key();
    let mut bytes = Vec::with_capacity(block_size * 8);
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            bytes.clear();
            block.iter().for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
            parent = xxh3_64_with_seed(&bytes, parent);
            parent
        })
        .collect()
}

fn words(text: &str, out: &mut Vec<u64>) {
    out.extend(text.split_whitespace().map(|w| xxh3_64_with_seed(w.as_bytes(), WORD_SEED)));
}

fn chat_tokens(body: &Value, out: &mut Vec<u64>) -> Result<(), String> {
    let messages = body.get("messages").and_then(Value::as_array).ok_or("`messages` must be an array")?;
    for (i, message) in messages.iter().enumerate() {
        match message.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => words(text, out),
            Some(Value::Array(parts)) => parts.iter().try_for_each(|part| part_tokens(part, out))?,
            Some(_) => return Err(format!("`messages[{i}].content` must be a string or an array of parts")),
        }
    }
    Ok(())
}

fn part_tokens(part: &Value, out: &mut Vec<u64>) -> Result<(), String> {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => {
            let text = part.get("text").and_then(Value::as_str).ok_or("a text part needs a string `text`")?;
            words(text, out);
        }
        Some("image_url") => {
            let image = part.get("image_url");
            let url = image.and_then(|i| i.get("url")).or(image).and_then(Value::as_str);
            let url = url.ok_or("an image_url part needs `image_url.url`")?;
            out.push(xxh3_64_with_seed(url.as_bytes(), IMAGE_SEED));
        }
        _ => out.push(xxh3_64_with_seed(part.to_string().as_bytes(), PART_SEED)),
    }
    Ok(())
}

fn completion_tokens(body: &Value, out: &mut Vec<u64>) -> Result<(), String> {
    match body.get("prompt") {
        Some(Value::String(text)) => words(text, out),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            out.extend(items.iter().filter_map(Value::as_u64))
        }
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            words(items[0].as_str().unwrap_or_default(), out)
        }
        _ => return Err("`prompt` must be a string, one string in an array, or an array of token ids".to_owned()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(body: Value, bs: usize) -> SimPrompt {
        WordPrompter.prompt("/v1/chat/completions", &body, b"", bs).expect("prompt")
    }

    #[test]
    fn counts_words_and_images() {
        let p = chat(
            json!({"messages": [
                {"role": "system", "content": "you are  helpful"},
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": "http://x/y.png"}
                ]},
                {"role": "assistant", "content": null}
            ]}),
            2,
        );
        assert_eq!(p.prompt_tokens, 8);
        assert_eq!(p.block_keys.len(), 4);
    }

    #[test]
    fn shared_prefix_shares_leading_keys_only() {
        let a = chat(json!({"messages": [{"role": "user", "content": "a b c d e f g"}]}), 2);
        let b = chat(json!({"messages": [{"role": "user", "content": "a b c X e f g"}]}), 2);
        assert_eq!(a.block_keys.len(), 3);
        assert_eq!(a.block_keys[0], b.block_keys[0]);
        assert_ne!(a.block_keys[1], b.block_keys[1]);
        assert_ne!(a.block_keys[2], b.block_keys[2], "keys are chained: a change propagates");
    }

    #[test]
    fn images_differ_by_url() {
        let img = |u: &str| json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}}, {"type": "text", "text": "x"}]}]});
        assert_ne!(chat(img("a"), 1).block_keys[0], chat(img("b"), 1).block_keys[0]);
    }

    #[test]
    fn completions_prompt_forms() {
        let p = |v: Value| WordPrompter.prompt("/v1/completions", &json!({"prompt": v}), b"", 2);
        assert_eq!(p(json!("one two three")).expect("string").prompt_tokens, 3);
        assert_eq!(p(json!(["one two"])).expect("one string").prompt_tokens, 2);
        assert_eq!(p(json!([1, 2, 3, 4])).expect("ids").block_keys.len(), 2);
        assert!(p(json!(["a", "b"])).is_err());
        assert!(p(json!(5)).is_err());
    }

    #[test]
    fn malformed_requests_are_errors() {
        let p = |v: Value| WordPrompter.prompt("/v1/chat/completions", &v, b"", 16);
        assert!(p(json!({})).expect_err("no messages").contains("messages"));
        assert!(p(json!({"messages": [{"content": 3}]})).expect_err("bad content").contains("messages[0]"));
        assert!(p(json!({"messages": [{"content": [{"type": "image_url"}]}]})).is_err());
        assert!(WordPrompter.prompt("/v1/embeddings", &json!({}), b"", 16).is_err());
        assert!(WordPrompter.prompt("/v1/completions", &json!({"prompt": "x"}), b"", 0).is_err());
    }
}
