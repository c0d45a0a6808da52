//! Planning behaviour: placeholder expansion, text-prefix fallback, completions prompts and the
//! chained block keys.

use std::borrow::Cow;

use mmrouter_core::accounting::RunPart;
use mmrouter_core::plan::{self, block_keys, expand, seed, text_prefix, ChatTokens, ImageSpan, PlanError};
use mmrouter_core::prompt::PromptModel;
use mmrouter_core::request::{Endpoint, Request};
use serde_json::json;

/// Renders and tokenizes a chat request given as JSON (through the real parse).
fn tokenize_chat(model: &PromptModel, request: &serde_json::Value, placeholder: &str) -> Result<ChatTokens, PlanError> {
    let body = serde_json::to_vec(request).unwrap();
    plan::tokenize_chat(model, &Request::parse(Endpoint::Chat, &body).unwrap(), placeholder, &Default::default())
}

fn tokenize_completion(model: &PromptModel, request: &serde_json::Value) -> Result<Vec<u32>, PlanError> {
    let body = serde_json::to_vec(request).unwrap();
    plan::tokenize_completion(model, &Request::parse(Endpoint::Completion, &body).unwrap(), None)
}

const PAD: &str = "<|image_pad|>";

fn model() -> PromptModel {
    PromptModel::bundled("qwen3-vl").unwrap()
}

fn run(text: &'static str, repeat: u32) -> RunPart {
    RunPart { text: Cow::Borrowed(text), repeat }
}

fn image(n: u32) -> serde_json::Value {
    json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", "A".repeat(n as usize))}})
}

fn two_image_request() -> serde_json::Value {
    json!({"messages": [
        {"role": "system", "content": "Be precise."},
        {"role": "user", "content": [{"type": "text", "text": "First:"}, image(8), {"type": "text", "text": "second:"}, image(12), {"type": "text", "text": "Compare them."}]}
    ]})
}

#[test]
fn qwen_runs_are_placed_exactly() {
    let model = model();
    let pad = model.token_id(PAD).unwrap();
    let tokens = tokenize_chat(&model, &two_image_request(), PAD).unwrap();
    assert_eq!(tokens.placeholders.len(), 2);
    for &p in &tokens.placeholders {
        assert_eq!(tokens.ids[p], pad);
        assert_eq!(tokens.ids[p - 1], model.token_id("<|vision_start|>").unwrap());
        assert_eq!(tokens.ids[p + 1], model.token_id("<|vision_end|>").unwrap());
    }
    let (a, b) = ([run(PAD, 5)], [run(PAD, 7)]);
    let out = expand(&model, &tokens, &[(0xAA, &a), (0xBB, &b)]).unwrap();
    let (p0, p1) = (tokens.placeholders[0], tokens.placeholders[1]);
    assert_eq!(out.ids.len(), tokens.ids.len() + 4 + 6);
    assert_eq!(
        out.spans,
        [
            ImageSpan { offset: p0 as u32, len: 5, hash: 0xAA },
            ImageSpan { offset: (p1 + 4) as u32, len: 7, hash: 0xBB },
        ]
    );
    for span in &out.spans {
        let (s, e) = (span.offset as usize, (span.offset + span.len) as usize);
        assert!(out.ids[s..e].iter().all(|&id| id == pad));
        assert_ne!(out.ids[s - 1], pad);
        assert_ne!(out.ids[e], pad);
    }
    // Everything outside the runs is the unexpanded text, in order.
    assert_eq!(out.ids[..p0], tokens.ids[..p0]);
    assert_eq!(out.ids[p0 + 5..p1 + 4], tokens.ids[p0 + 1..p1]);
    assert_eq!(out.ids[p1 + 4 + 7..], tokens.ids[p1 + 1..]);
}

#[test]
fn fewer_placeholders_than_images_is_a_mismatch() {
    let model = model();
    let one_image = json!({"messages": [{"role": "user", "content": [image(4), {"type": "text", "text": "hi"}]}]});
    let tokens = tokenize_chat(&model, &one_image, PAD).unwrap();
    let (a, b) = ([run(PAD, 3)], [run(PAD, 2)]);
    let err = expand(&model, &tokens, &[(1, &a), (2, &b)]).unwrap_err();
    assert_eq!(err.label(), "placeholder_mismatch");
    assert!(err.to_string().contains("1 image placeholder(s) but the request has 2"), "{err}");

    let err = tokenize_chat(&model, &two_image_request(), "[IMG]").unwrap_err();
    assert_eq!(err.label(), "placeholder_mismatch");
}

/// vLLM expands the first N placeholder tokens of the prompt for N images (checked against
/// `vllm launch render`): a placeholder the user typed *after* the images stays one token, one typed
/// *before* them takes the first image's run and the template's own placeholder stays one token.
#[test]
fn typed_placeholders_beyond_the_images_stay_text() {
    let model = model();
    let pad = model.token_id(PAD).unwrap();
    let one = [run(PAD, 3)];
    for (content, typed_first) in [
        (json!([image(4), {"type": "text", "text": "see <|image_pad|>"}]), false),
        (json!([{"type": "text", "text": "see <|image_pad|>"}, image(4)]), true),
    ] {
        let tokens = tokenize_chat(&model, &json!({"messages": [{"role": "user", "content": content}]}), PAD).unwrap();
        assert_eq!(tokens.placeholders.len(), 2);
        let out = expand(&model, &tokens, &[(1, &one)]).unwrap();
        let first = tokens.placeholders[0];
        assert_eq!(out.spans, [ImageSpan { offset: first as u32, len: 3, hash: 1 }]);
        assert_eq!(out.ids.len(), tokens.ids.len() + 2);
        assert_eq!(out.ids.iter().filter(|&&id| id == pad).count(), 4, "3 of the run + the one left as text");
        let vision_start = model.token_id("<|vision_start|>").unwrap();
        assert_eq!(out.ids[first - 1] == vision_start, !typed_first);
    }
}

#[test]
fn multi_part_runs_expand_in_order() {
    let model = model();
    let id = |t: &str| model.token_id(t).unwrap();
    // Pixtral-like rows: 3 "[IMG]" then "[IMG_BREAK]", last row ends with "[IMG_END]"
    // (stand-ins that are single tokens in the Qwen vocabulary), plus a multi-token text part.
    let (img, brk, end) = ("<|vision_pad|>", "<|box_start|>", "<|box_end|>");
    let parts = [run(img, 3), run(brk, 1), run(img, 3), run(end, 1), run("\n\n", 2)];
    let newline = model.encode("\n\n").unwrap();
    assert_eq!(newline.len(), 1, "\\n\\n is one Qwen token");
    let tokens =
        ChatTokens { ids: vec![10, 11, id(PAD), 12], placeholders: vec![2], videos: Vec::new(), text: String::new() };
    let out = expand(&model, &tokens, &[(7, &parts)]).unwrap();
    let (i, b, e, nl) = (id(img), id(brk), id(end), newline[0]);
    assert_eq!(out.ids, [10, 11, i, i, i, b, i, i, i, e, nl, nl, 12]);
    assert_eq!(out.spans, [ImageSpan { offset: 2, len: 10, hash: 7 }]);

    let multi_token = [run("hello world", 2)];
    let hw = model.encode("hello world").unwrap();
    assert!(hw.len() > 1);
    let out = expand(&model, &tokens, &[(7, &multi_token)]).unwrap();
    assert_eq!(out.ids[2..2 + 2 * hw.len()], [hw.clone(), hw].concat());
    assert_eq!(out.spans[0].len as usize, out.ids.len() - 3);
}

#[test]
fn malformed_chat_tokens_are_rejected_not_panicking() {
    let model = model();
    let one = [run(PAD, 1)];
    let out_of_range = ChatTokens { ids: vec![1, 2], placeholders: vec![5], videos: Vec::new(), text: String::new() };
    assert_eq!(expand(&model, &out_of_range, &[(1, &one)]).unwrap_err().label(), "invalid_request");
    let unordered =
        ChatTokens { ids: vec![1, 2, 3], placeholders: vec![2, 1], videos: Vec::new(), text: String::new() };
    assert_eq!(expand(&model, &unordered, &[(1, &one), (2, &one)]).unwrap_err().label(), "invalid_request");
}

#[test]
fn text_prefix_stops_before_the_first_placeholder() {
    let model = model();
    let tokens = tokenize_chat(&model, &two_image_request(), PAD).unwrap();
    let prefix = text_prefix(&tokens);
    assert_eq!(prefix.len(), tokens.placeholders[0]);
    assert_eq!(prefix, &tokens.ids[..tokens.placeholders[0]]);
    assert_eq!(*prefix.last().unwrap(), model.token_id("<|vision_start|>").unwrap());

    let text_only = tokenize_chat(&model, &json!({"messages": [{"role": "user", "content": "hi"}]}), PAD).unwrap();
    assert!(text_only.placeholders.is_empty());
    assert_eq!(text_prefix(&text_only), &text_only.ids[..]);
}

#[test]
fn completion_prompts() {
    let model = model();
    let hello = model.encode("Hello world").unwrap();
    assert_eq!(tokenize_completion(&model, &json!({"prompt": "Hello world"})).unwrap(), hello);
    assert_eq!(tokenize_completion(&model, &json!({"prompt": ["Hello world"]})).unwrap(), hello);
    assert_eq!(tokenize_completion(&model, &json!({"prompt": [1, 2, 3]})).unwrap(), [1, 2, 3]);
    assert_eq!(tokenize_completion(&model, &json!({"prompt": [[4, 5]]})).unwrap(), [4, 5]);
    for bad in [
        json!({}),
        json!({"prompt": 5}),
        json!({"prompt": []}),
        json!({"prompt": ["a", "b"]}),
        json!({"prompt": [[1], [2]]}),
        json!({"prompt": [1, -2]}),
        json!({"prompt": [1, 4294967296u64]}),
        json!({"prompt": [1, "x"]}),
        json!({"prompt": [[]]}),
    ] {
        let err = tokenize_completion(&model, &bad).unwrap_err();
        assert_eq!(err.label(), "invalid_request", "{bad}");
    }
}

fn ids(n: u32) -> Vec<u32> {
    (1000..1000 + n).collect()
}

#[test]
fn only_full_blocks_get_keys() {
    let s = seed("m", None, None);
    assert_eq!(block_keys(&ids(47), &[], 16, s).len(), 2);
    assert_eq!(block_keys(&ids(48), &[], 16, s).len(), 3);
    assert!(block_keys(&ids(15), &[], 16, s).is_empty());
    // The tail does not influence the full blocks' keys.
    assert_eq!(block_keys(&ids(47), &[], 16, s), block_keys(&ids(32), &[], 16, s));
}

#[test]
fn a_changed_token_changes_its_block_and_every_later_one() {
    let s = seed("m", None, None);
    let base = block_keys(&ids(64), &[], 16, s);
    assert_eq!(base, block_keys(&ids(64), &[], 16, s), "deterministic");
    let mut changed = ids(64);
    changed[37] += 1; // block 2
    let keys = block_keys(&changed, &[], 16, s);
    assert_eq!(keys[..2], base[..2]);
    assert_ne!(keys[2], base[2]);
    assert_ne!(keys[3], base[3]);
    // Same block content at a different chain position gets a different key (it is chained).
    let uniform = vec![7u32; 48];
    let k = block_keys(&uniform, &[], 16, s);
    assert_ne!(k[0], k[1]);
    assert_ne!(k[1], k[2]);
}

#[test]
fn image_hash_and_offset_enter_the_overlapping_blocks() {
    let s = seed("m", None, None);
    let tokens = vec![5u32; 64];
    let span = |offset, len, hash| ImageSpan { offset, len, hash };
    // Image over tokens 20..40: blocks 1 and 2 (of 16).
    let a = block_keys(&tokens, &[span(20, 20, 1)], 16, s);
    let b = block_keys(&tokens, &[span(20, 20, 2)], 16, s);
    let none = block_keys(&tokens, &[], 16, s);
    assert_eq!(a[0], b[0]);
    assert_eq!(a[0], none[0]);
    assert_ne!(a[1], b[1]);
    assert_ne!(a[2], b[2]);
    assert_ne!(a[3], b[3], "later blocks differ through the chain");

    // Same tokens and hash, image starting at another offset inside block 1.
    let shifted = block_keys(&tokens, &[span(21, 19, 1)], 16, s);
    assert_eq!(shifted[0], a[0]);
    assert_ne!(shifted[1], a[1]);

    // Block 2 sees the image continuing from block 1 (negative relative offset): two images
    // that differ only in where they started still give block 2 different extra keys.
    let early = block_keys(&tokens, &[span(17, 23, 1)], 16, s);
    let late = block_keys(&tokens, &[span(18, 22, 1)], 16, s);
    assert_ne!(early[1], late[1]);

    // An image ending exactly at a block boundary does not touch the next block.
    let ends_at_32 = block_keys(&tokens, &[span(20, 12, 1)], 16, s);
    let ends_at_33 = block_keys(&tokens, &[span(20, 13, 1)], 16, s);
    assert_eq!(ends_at_32[1], block_keys(&tokens, &[span(20, 12, 1), span(32, 0, 9)], 16, s)[1]);
    assert_ne!(ends_at_32[2], ends_at_33[2]);
    // Span order in the input does not matter.
    let two = [span(2, 4, 1), span(40, 4, 2)];
    let rev = [two[1], two[0]];
    assert_eq!(block_keys(&tokens, &two, 16, s), block_keys(&tokens, &rev, 16, s));
}

#[test]
fn seed_model_lora_and_salt_change_every_key() {
    let tokens = ids(64);
    let base = block_keys(&tokens, &[], 16, seed("qwen3-vl", None, None));
    for other in [
        seed("qwen2.5-vl", None, None),
        seed("qwen3-vl", Some("adapter-a"), None),
        seed("qwen3-vl", None, Some("tenant-a")),
        seed("qwen3-vl", Some("adapter-a"), Some("tenant-a")),
    ] {
        let keys = block_keys(&tokens, &[], 16, other);
        assert!(keys.iter().zip(&base).all(|(a, b)| a != b));
    }
    assert_eq!(seed("qwen3-vl", Some("x"), None), seed("qwen3-vl", Some("x"), None));
    assert_ne!(seed("qwen3-vl", Some("x"), None), seed("qwen3-vl", None, Some("x")));
}

#[test]
fn planned_prompt_end_to_end() {
    let model = model();
    let tokens = tokenize_chat(&model, &two_image_request(), PAD).unwrap();
    let (a, b) = ([run(PAD, 40)], [run(PAD, 40)]);
    let out = expand(&model, &tokens, &[(1, &a), (2, &b)]).unwrap();
    let s = seed("qwen3-vl", None, None);
    let keys = block_keys(&out.ids, &out.spans, 4, s);
    assert_eq!(keys.len(), out.ids.len() / 4);
    // The text-prefix blocks are exactly the leading blocks of the full plan.
    let prefix_keys = block_keys(text_prefix(&tokens), &[], 4, s);
    assert!(!prefix_keys.is_empty());
    assert_eq!(keys[..prefix_keys.len()], prefix_keys[..]);
    let _: &dyn std::error::Error = &PlanError::InvalidRequest(String::new());
}
