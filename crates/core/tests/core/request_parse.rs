//! The one-pass request parse on chat-completions bodies: both `image_url` forms, `input_image`,
//! order, byte spans, other media forcing the fallback, and bodies without images.

use mmrouter_core::request::{Endpoint, MediaKind, ParseError, PartError, Request};

fn parse(body: &str) -> Request<'_> {
    Request::parse(Endpoint::Chat, body.as_bytes()).unwrap()
}

fn urls(body: &str) -> Vec<(String, usize, usize)> {
    let r = parse(body);
    assert!(r.media_issue.is_none(), "{body}: {:?}", r.media_issue);
    r.images.into_iter().map(|r| (r.url.into_owned(), r.message, r.part)).collect()
}

#[test]
fn string_and_object_forms_and_input_image_in_order() {
    let body = r#"{
      "model": "m",
      "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [
          {"type": "text", "text": "compare"},
          {"type": "image_url", "image_url": {"url": "https://a.test/1.png", "detail": "high"}},
          {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},
          {"type": "input_image", "image_url": "https://a.test/3.jpg"}
        ]},
        {"role": "assistant", "content": null},
        {"role": "user", "content": [
          {"type": "input_text", "text": "and"},
          {"type": "input_image", "image_url": {"url": "https://a.test/4.webp"}}
        ]}
      ],
      "max_tokens": 10
    }"#;
    assert_eq!(
        urls(body),
        vec![
            ("https://a.test/1.png".into(), 1, 1),
            ("data:image/png;base64,AAAA".into(), 1, 2),
            ("https://a.test/3.jpg".into(), 1, 3),
            ("https://a.test/4.webp".into(), 3, 1),
        ]
    );
}

#[test]
fn bodies_without_images() {
    for body in [
        r#"{"messages":[{"role":"user","content":"hello"}]}"#,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
        r#"{"messages":[]}"#,
        r#"{"prompt":"no messages at all"}"#,
        r#"{"messages":[{"role":"user","content":[{"type":"refusal","refusal":"no"}, "odd", 3]}]}"#,
        r#"{"messages":[{"role":"tool","content":[{"type":"some_future_type","text":"x"}]}]}"#,
    ] {
        assert!(urls(body).is_empty(), "{body}");
    }
}

#[test]
fn other_media_force_the_fallback() {
    for (part, kind) in [
        (r#"{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}"#, "input_audio"),
        (r#"{"type":"audio_url","audio_url":{"url":"https://a.test/a.mp3"}}"#, "audio_url"),
        (r#"{"type":"file","file":{"file_id":"f"}}"#, "file"),
        (r#"{"type":"input_file","file_id":"f"}"#, "input_file"),
        (r#"{"type":"image_embeds","image_embeds":"AAAA"}"#, "image_embeds"),
        // an unknown type that still carries media is not silently dropped
        (r#"{"type":"x_video","video_url":{"url":"https://a.test/v.mp4"}}"#, "x_video"),
        (r#"{"type":"input_video","video":{"url":"https://a.test/v.mp4"}}"#, "input_video"),
    ] {
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"image_url","image_url":"https://a.test/1.png"}},{part}]}}]}}"#
        );
        match parse(&body).media_issue {
            Some(PartError::UnsupportedMedia { message, part, kind: k }) => {
                assert_eq!((message, part, k.as_str()), (0, 1, kind));
            }
            other => panic!("{part}: {other:?}"),
        }
        assert_eq!(parse(&body).media_issue.unwrap().label(), "unsupported_media");
    }
    // A `video_url` part, typed or not, is media the router reads (issue 48).
    for part in [
        r#"{"type":"video_url","video_url":{"url":"https://a.test/v.mp4"}}"#,
        r#"{"video_url":{"url":"https://a.test/v.mp4"}}"#,
    ] {
        let body = format!(r#"{{"messages":[{{"role":"user","content":[{part}]}}]}}"#);
        let r = parse(&body);
        assert!(r.media_issue.is_none(), "{part}");
        assert_eq!(
            (r.images.len(), r.images[0].kind, r.images[0].url.as_ref()),
            (1, MediaKind::Video, "https://a.test/v.mp4")
        );
    }
}

#[test]
fn malformed_input_is_an_error_or_a_reason_never_a_panic() {
    for body in ["", "{", "{\"messages\":[}"] {
        assert!(matches!(Request::parse(Endpoint::Chat, body.as_bytes()), Err(ParseError::InvalidJson(_))), "{body}");
    }
    for body in ["null", "[]", "3", "\"x\""] {
        assert!(matches!(Request::parse(Endpoint::Chat, body.as_bytes()), Err(ParseError::NotAnObject)), "{body}");
    }
    assert!(parse(r#"{"messages":"x"}"#).messages.is_err());
    for body in [
        r#"{"messages":[{"content":[{"type":"image_url","image_url":42}]}]}"#,
        r#"{"messages":[{"content":[{"type":"image_url","image_url":{"url":7}}]}]}"#,
    ] {
        assert_eq!(parse(body).media_issue.expect(body).label(), "invalid_url", "{body}");
    }
}

#[test]
fn large_data_urls_are_borrowed_not_copied() {
    let payload = "A".repeat(1 << 20);
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{payload}"}}}}]}}]}}"#
    );
    let found = parse(&body);
    let url = &found.images[0].url;
    assert!(matches!(url, std::borrow::Cow::Borrowed(_)));
    // The borrowed slice points into the body itself.
    let start = body.as_ptr() as usize;
    let at = url.as_ptr() as usize;
    assert!(at >= start && at + url.len() <= start + body.len());
}

#[test]
fn spans_locate_each_image_url_and_client_uuid_in_the_body() {
    let body = r#"{"messages":[{"role":"user","content":[
        {"type":"text","text":"{\"image_url\": \"not this\"}"},
        {"type":"image_url","uuid":"client-id","image_url":{"url":"https://a.test/1.png","detail":"low"}},
        {"type":"image_url","image_url":"data:image/png;base64,AAAA"}]}]}"#;
    let r = parse(body);
    assert_eq!(r.images.len(), 2);
    let at = |range: std::ops::Range<usize>| &body[range];
    assert_eq!(at(r.images[0].image_url_span.clone()), r#"{"url":"https://a.test/1.png","detail":"low"}"#);
    assert_eq!(at(r.images[0].uuid_span.clone().unwrap()), r#""client-id""#);
    assert_eq!(at(r.images[1].image_url_span.clone()), r#""data:image/png;base64,AAAA""#);
    assert_eq!(r.images[1].uuid_span, None);
}

/// The digest the pipeline memoizes rendered prompts by: everything the prompt renders from, not the
/// image URLs (a part renders as a placeholder whatever its URL).
#[test]
fn the_body_digest_leaves_image_urls_out() {
    let chat = |text: &str, url: &str| {
        format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":"{text}"}},{{"type":"image_url","image_url":{{"url":"{url}"}}}}]}}]}}"#
        )
    };
    let digest = |b: &str| parse(b).body_digest();
    let a = digest(&chat("what is it?", "data:image/png;base64,AAAA"));
    assert!(a.is_some());
    assert_eq!(a, digest(&chat("what is it?", "https://example.com/other.png")), "another image, same prompt");
    assert_ne!(a, digest(&chat("what is that?", "data:image/png;base64,AAAA")), "other text");
    let two = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"data:image/png;base64,AA"},{"type":"image_url","image_url":"data:image/png;base64,BB"}]}]}"#;
    let one =
        r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"data:image/png;base64,AA"}]}]}"#;
    assert_ne!(digest(two), digest(one));
    assert_eq!(Request::parse(Endpoint::Completion, br#"{"prompt":"x"}"#).unwrap().body_digest(), None);
    // Media the router cannot read, or too much text: no digest, no memo.
    let audio = r#"{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA","format":"wav"}}]}]}"#;
    assert_eq!(digest(audio), None);
    assert_eq!(digest(&chat(&"x".repeat(70_000), "data:,")), None);
    assert!(
        digest(&chat("y", &format!("data:image/png;base64,{}", "A".repeat(200_000)))).is_some(),
        "image bytes do not count"
    );
}
