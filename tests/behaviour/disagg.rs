//! Disaggregated serving through the proxy, against simulated workers in roles: the legs a request
//! takes (encode → prefill → decode), which worker each leg goes to, and the smaller paths a failed
//! leg leaves (docs/disaggregated.md). The real engines' side is in tests/engine (NIXL, E/PD).

use mmrouter_sim::{Role, SimHandle};
use serde_json::Value;

use crate::harness::*;

/// Sims in `roles` (fast timing), each with `tweak` applied.
async fn role_sims(roles: &[Role], tweak: impl Fn(&mut mmrouter_sim::SimOptions)) -> Vec<SimHandle> {
    let mut out = Vec::new();
    for &role in roles {
        let mut v = sims(1, |o| {
            fast(o);
            o.role = role;
            tweak(o);
        })
        .await;
        out.append(&mut v);
    }
    out
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Both => "both",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
        Role::Encode => "encode",
    }
}

/// A proxy over `sims`, each worker in its sim's role; `extra` TOML goes first.
async fn disagg_proxy(sims: Vec<SimHandle>, extra: &str) -> Cluster {
    let mut toml = format!("{extra}\n");
    for s in &sims {
        toml.push_str(&format!(
            "[[workers]]\nname = {:?}\nurl = {:?}\nrole = {:?}\n",
            s.name(),
            s.url(),
            role_name(s.role())
        ));
    }
    proxy(sims, &toml).await
}

/// A chat whose user turn starts with `lead` (so prefixes differ), then the images, then a question.
fn chat(lead: &str, images: &[String], stream: bool) -> Vec<u8> {
    let mut parts = vec![serde_json::json!({"type": "text", "text": lead})];
    parts.extend(images.iter().map(|u| serde_json::json!({"type": "image_url", "image_url": {"url": u}})));
    parts.push(serde_json::json!({"type": "text", "text": "What is in the picture?"}));
    let mut body = serde_json::json!({
        "model": "Qwen/Qwen3-VL-8B-Instruct",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": parts}],
    });
    if stream {
        body["stream"] = true.into();
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    serde_json::to_vec(&body).unwrap()
}

async fn answer(r: reqwest::Response) -> (String, String, String, String) {
    let (w, p, e) = (
        header(&r, "x-mmrouter-worker"),
        header(&r, "x-mmrouter-prefill-worker"),
        header(&r, "x-mmrouter-encode-worker"),
    );
    let (w, p, e) = (w.to_owned(), p.to_owned(), e.to_owned());
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    (w, p, e, r.text().await.unwrap())
}

fn prompt_tokens(text: &str) -> u64 {
    let v: Value = serde_json::from_str(text).expect("a JSON answer");
    v["usage"]["prompt_tokens"].as_u64().expect("usage")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pd_requests_are_prefilled_on_one_worker_and_decoded_on_another() {
    let sims = role_sims(&[Role::Prefill, Role::Prefill, Role::Decode], |_| {}).await;
    let (p, d) = ([sims[0].name().to_owned(), sims[1].name().to_owned()], sims[2].name().to_owned());
    let c = disagg_proxy(sims, "").await;
    let image = png_data_url(640, 480, 7);
    let (worker, prefill, _, text) =
        answer(post(&c.url, chat("Look closely.", std::slice::from_ref(&image), false)).await).await;
    assert_eq!(worker, d);
    assert!(p.contains(&prefill), "prefilled on {prefill}");
    let decode = c.sims[2].stats();
    assert_eq!(decode.kv_transfers, 1);
    assert_eq!(decode.external_kv_tokens, prompt_tokens(&text), "decode pulled the whole prompt");
    // Streamed: the decode leg streams; the prefill leg never does.
    let r = post(&c.url, chat("Another look.", &[image], true)).await;
    let (worker, _, _, text) = answer(r).await;
    assert_eq!(worker, d);
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(c.sims[2].stats().kv_transfers, 2);
    let prefill_requests: u64 = c.sims[..2].iter().map(|s| s.stats().requests).sum();
    assert_eq!(prefill_requests, 2, "one prefill leg per request");
    let m = metrics_text(&c.url).await;
    assert_eq!(metric(&m, "mmrouter_disagg_legs_total", r#"leg="prefill",outcome="served""#), 2.0);
    assert_eq!(metric(&m, "mmrouter_disagg_legs_total", r#"leg="decode",outcome="served""#), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_is_prefilled_where_its_prompt_is_cached() {
    let sims = role_sims(&[Role::Prefill, Role::Prefill, Role::Prefill, Role::Decode], |_| {}).await;
    let c = disagg_proxy(sims, "").await;
    let image = png_data_url(320, 240, 9);
    for lead in ["First conversation.", "Second conversation.", "Third conversation."] {
        let body = chat(lead, std::slice::from_ref(&image), false);
        let (_, first, _, _) = answer(post(&c.url, body.clone()).await).await;
        let (_, again, _, _) = answer(post(&c.url, body).await).await;
        assert_eq!(again, first, "the repeat of {lead:?} goes to the prefill worker that holds it");
    }
    let cached: u64 = c.sims[..3].iter().map(|s| s.stats().cached_tokens).sum();
    assert!(cached > 0, "prefill legs of repeats hit the prefill workers' caches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_prefill_is_tried_elsewhere_then_the_request_is_served_whole() {
    let sims = role_sims(&[Role::Prefill, Role::Prefill, Role::Decode], |o| {
        if o.role == Role::Prefill {
            o.error_rate = 1.0;
        }
    })
    .await;
    let decode = sims[2].name().to_owned();
    let c = disagg_proxy(sims, "[routing.ejection]\nconsecutive_failures = 100\n").await;
    let (worker, prefill, _, _) = answer(post(&c.url, chat("Hello there.", &[], false)).await).await;
    assert_eq!((worker.as_str(), prefill.as_str()), (decode.as_str(), ""), "served whole by the decode worker");
    assert_eq!(c.sims[2].stats().kv_transfers, 0, "computed locally, nothing pulled");
    let m = metrics_text(&c.url).await;
    assert_eq!(metric(&m, "mmrouter_disagg_fallback_total", r#"leg="prefill",reason="server_error""#), 2.0);
    // Prefill workers gone entirely: still answered.
    let mut sims = c.sims;
    let d = sims.pop().unwrap();
    for s in sims {
        s.shutdown().await;
    }
    let (worker, _, _, _) = answer(post(&c.url, chat("Still there?", &[], false)).await).await;
    assert_eq!(worker, d.name());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_transfer_params_from_a_prefill_worker_are_not_relayed() {
    // A "prefill worker" whose answer carries parameters vLLM never writes.
    let app = axum::Router::new().route("/health", axum::routing::get(|| async { "" })).route(
        "/v1/chat/completions",
        axum::routing::post(|| async {
            axum::Json(serde_json::json!({"id": "x", "kv_transfer_params": {"do_remote_prefill": true, "remote_host": "http://evil/ x"}}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let sims = role_sims(&[Role::Decode], |_| {}).await;
    let toml = format!(
        "[[workers]]\nname = \"fake-prefill\"\nurl = {fake:?}\nrole = \"prefill\"\n[[workers]]\nname = {:?}\nurl = {:?}\nrole = \"decode\"\n",
        sims[0].name(),
        sims[0].url()
    );
    let c = proxy(sims, &toml).await;
    let (worker, _, _, _) = answer(post(&c.url, chat("Hi.", &[], false)).await).await;
    assert_eq!(worker, c.sims[0].name());
    assert_eq!(c.sims[0].stats().kv_transfers, 0, "nothing relayed: the decode worker computed the prompt");
    let m = metrics_text(&c.url).await;
    let refused = metric(&m, "mmrouter_disagg_fallback_total", r#"leg="prefill",reason="kv_transfer_params_shape""#);
    assert_eq!(refused, 1.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_encoder_that_computed_an_image_encodes_it_again() {
    let storage = tempfile::tempdir().unwrap();
    let dir = storage.path().to_owned();
    let sims = role_sims(&[Role::Encode, Role::Encode, Role::Encode, Role::Both], move |o| {
        o.ec_shared_storage = Some(dir.clone());
    })
    .await;
    let c = disagg_proxy(sims, "").await;
    let (a, b) = (png_data_url(640, 480, 1), png_data_url(640, 480, 2));
    let mut by_image = [Vec::new(), Vec::new()];
    for turn in 0..4 {
        for (i, image) in [&a, &b].into_iter().enumerate() {
            // A new lead each time: the image is never inside a cached prefix, so it needs the encoder.
            let body = chat(&format!("Turn {turn} about image {i}."), std::slice::from_ref(image), false);
            let (_, _, encoder, _) = answer(post(&c.url, body).await).await;
            assert!(!encoder.is_empty(), "an encode leg was sent");
            by_image[i].push(encoder);
        }
    }
    for (i, encoders) in by_image.iter().enumerate() {
        assert!(encoders.iter().all(|e| *e == encoders[0]), "image {i} went to {encoders:?}");
    }
    let encoded: u64 = c.sims[..3].iter().map(|s| s.stats().image_encoded_tokens).sum();
    let hits: u64 = c.sims[..3].iter().map(|s| s.stats().encoder_cache_hits).sum();
    assert!(hits >= 6, "the encoders' own caches served the repeats ({hits} hits, {encoded} tokens encoded)");
    let pd = c.sims[3].stats();
    assert!(pd.ec_loads >= 2, "the worker loaded the encoders' outputs: {pd:?}");
    assert_eq!(pd.image_encoded_tokens, 0, "and encoded nothing itself: {pd:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_encode_leg_is_skipped_when_the_prefix_holds_the_image_and_when_it_fails() {
    let sims = role_sims(&[Role::Encode, Role::Both], |_| {}).await;
    let c = disagg_proxy(sims, "").await;
    let body = chat("Same words twice.", &[png_data_url(400, 300, 5)], false);
    let (_, _, first, _) = answer(post(&c.url, body.clone()).await).await;
    let (_, _, second, _) = answer(post(&c.url, body).await).await;
    assert_eq!((first.is_empty(), second.as_str()), (false, ""), "the repeat's image is inside the cached prefix");
    let m = metrics_text(&c.url).await;
    assert_eq!(metric(&m, "mmrouter_disagg_fallback_total", r#"leg="encode",reason="cached_prefix""#), 1.0);
    c.sims[0].set_error_rate(1.0);
    let (worker, _, encoder, _) =
        answer(post(&c.url, chat("New words.", &[png_data_url(400, 300, 6)], false)).await).await;
    assert_eq!((worker.as_str(), encoder.as_str()), (c.sims[1].name(), ""), "served, encoded locally");
    let m = metrics_text(&c.url).await;
    assert_eq!(metric(&m, "mmrouter_disagg_fallback_total", r#"leg="encode",reason="server_error""#), 1.0);
    // Text only: no encode leg at all.
    let before = c.sims[0].stats().requests;
    answer(post(&c.url, chat("No picture.", &[], false)).await).await;
    assert_eq!(c.sims[0].stats().requests, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_routes_its_encode_leg_by_load_and_records_no_image() {
    let sims = role_sims(&[Role::Encode, Role::Both], |_| {}).await;
    // The router's own limit refuses the image (the engines would take it): a text-prefix fallback.
    let c = disagg_proxy(sims, "[media]\nmax_image_bytes = 64\n").await;
    let r = post(&c.url, chat("Too big for the router.", &[png_data_url(300, 200, 3)], false)).await;
    assert_eq!(header(&r, "x-mmrouter-route"), "text_prefix");
    let (_, _, encoder, _) = answer(r).await;
    assert_eq!(encoder, c.sims[0].name(), "the encode leg still runs, chosen by load");
    let pool = c.state.pools()[0].clone();
    let resident: usize = pool.router.live_workers().iter().map(|(_, w)| w.images_resident()).sum();
    assert_eq!(resident, 0, "a fallback names no image");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_route_shows_each_legs_choice() {
    let sims = role_sims(&[Role::Encode, Role::Prefill, Role::Decode], |_| {}).await;
    let c = disagg_proxy(sims, "").await;
    let v = debug_route(&c.url, "", &chat("Explain.", &[png_data_url(200, 200, 4)], false), None).await;
    let legs = &v["legs"];
    assert_eq!(legs["encode"]["worker"], c.sims[0].name(), "{v}");
    assert_eq!(legs["encode"]["policy"], "encode_residency");
    assert_eq!(legs["prefill"]["worker"], c.sims[1].name());
    assert_eq!(legs["decode"]["worker"], c.sims[2].name());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_legs_are_sent_together_and_meet_in_one_room() {
    let sims = role_sims(&[Role::Prefill, Role::Decode], |o| {
        o.kv_events_format = mmrouter_sim::KvEventsFormat::Sglang;
        if o.role == Role::Prefill {
            o.bootstrap_port = Some(0);
        }
    })
    .await;
    let port = sims[0].bootstrap_port().expect("a bootstrap server");
    let toml = format!(
        "[[workers]]\nname = {:?}\nurl = {:?}\nengine = \"sglang\"\nrole = \"prefill\"\nbootstrap_port = {port}\n\
         [[workers]]\nname = {:?}\nurl = {:?}\nengine = \"sglang\"\nrole = \"decode\"\n",
        sims[0].name(),
        sims[0].url(),
        sims[1].name(),
        sims[1].url()
    );
    let c = proxy(sims, &toml).await;
    for stream in [false, true] {
        let (worker, _, _, _) = answer(post(&c.url, chat("Hello SGLang.", &[], stream)).await).await;
        assert_eq!(worker, c.sims[1].name());
    }
    assert_eq!(c.sims[0].stats().requests, 2, "every request's prefill leg");
    assert_eq!(c.sims[1].stats().kv_transfers, 2, "the decode legs found their rooms");
}
