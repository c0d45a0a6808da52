//! The Responses API (`POST /v1/responses`) planned as vLLM renders it: token-for-token parity on the
//! bundled Qwen profiles.
//!
//! The expected ids are vLLM's own: `tests/fixtures/responses/oracle.py` posts each body to vLLM 0.32's
//! GPU-less render server (`vllm launch render`, `/v1/responses/render`: its conversion of
//! `instructions`, `input` items and tools into a chat) and commits the `token_ids` and each image's
//! `mm_placeholders` range (`goldens.json`). Here each body goes through the router's pipeline (parse
//! as `Endpoint::Responses` → intake → account → plan, traced): where vLLM renders it the plan must be
//! exact with equal ids and image spans; where vLLM refuses it the plan must not be exact. A body whose
//! image names a client `uuid` is also spliced as the exact route forwards it: the engine names an
//! image by the `uuid` of its `input_image` part (the goldens' `mm_hashes`), so after the splice it
//! names it by the router's digest, as on the chat path.

use base64::Engine;
use mmrouter_core::media::MediaConfig;
use mmrouter_core::model::{ModelSource, ModelSpec};
use mmrouter_core::pipeline::{splice_uuids, Pipeline, PipelineConfig, Planned, Route};
use mmrouter_core::request::{Endpoint, Request};
use serde_json::Value;

fn goldens() -> Value {
    let path = crate::fixtures().join("responses").join("goldens.json");
    serde_json::from_slice(&std::fs::read(path).expect("goldens.json")).unwrap()
}

/// The body as the oracle sent it: each `asset:<file>` a data URL of that committed image.
fn body(request: &Value) -> Vec<u8> {
    let mut request = request.clone();
    inline_assets(&mut request);
    let mut body = serde_json::Map::new();
    body.insert("model".into(), "m".into());
    body.extend(request.as_object().unwrap().clone());
    serde_json::to_vec(&body).unwrap()
}

fn inline_assets(v: &mut Value) {
    match v {
        Value::String(s) if s.starts_with("asset:") => {
            let file = &s["asset:".len()..];
            let bytes = std::fs::read(crate::fixtures().join("images").join(file)).unwrap();
            let mime = match file.rsplit('.').next() {
                Some("jpg") => "image/jpeg".to_owned(),
                Some(ext) => format!("image/{ext}"),
                None => "application/octet-stream".to_owned(),
            };
            *s = format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        Value::Array(items) => items.iter_mut().for_each(inline_assets),
        Value::Object(map) => map.values_mut().for_each(inline_assets),
        _ => {}
    }
}

fn pipeline(profile: &'static str) -> Pipeline {
    let cfg = PipelineConfig { model: ModelSpec::new(ModelSource::Bundled(profile)), media: MediaConfig::default() };
    Pipeline::new(&cfg).expect("pipeline loads")
}

fn plan(rt: &tokio::runtime::Runtime, p: &Pipeline, body: &[u8]) -> Planned {
    let request = Request::parse(Endpoint::Responses, body).expect("a JSON object");
    rt.block_on(p.plan_with(&request, true)).expect("no policy rejection")
}

/// `Ok(true)`: exact and equal to vLLM; `Ok(false)`: vLLM refuses it and the router does not claim it.
fn check(row: &Value, planned: &Planned) -> Result<bool, String> {
    let (plan, trace) = (&planned.plan, planned.trace.as_ref().expect("trace requested"));
    if row["outcome"] != "ok" {
        return match plan.prompt_exact {
            true => Err(format!("vLLM refuses it ({}) but the plan is exact", row["message"])),
            false => Ok(false),
        };
    }
    let want: Vec<u32> = serde_json::from_value(row["ids"].clone()).unwrap();
    if !plan.prompt_exact || trace.ids != want {
        return Err(format!(
            "route {} exact {} ({:?}, unrendered {:?})\n  got text {:?}\n  want {} ids, got {}",
            plan.route.label(),
            plan.prompt_exact,
            plan.reason(),
            plan.unrendered,
            trace.text.as_deref().unwrap_or("<none>"),
            want.len(),
            trace.ids.len(),
        ));
    }
    let want_spans: Vec<(u64, u64)> = row["image_spans"]
        .as_array()
        .map(|s| s.iter().map(|x| (x["offset"].as_u64().unwrap(), x["length"].as_u64().unwrap())).collect())
        .unwrap_or_default();
    let spans: Vec<(u64, u64)> = trace.spans.iter().map(|s| (u64::from(s.offset), u64::from(s.len))).collect();
    if spans != want_spans {
        return Err(format!("image spans {spans:?}, vLLM's mm_placeholders {want_spans:?}"));
    }
    let route = if want_spans.is_empty() { Route::NoMedia } else { Route::Exact };
    match plan.route == route {
        true => Ok(true),
        false => Err(format!("route {}, want {}", plan.route.label(), route.label())),
    }
}

/// The engine names a uuid's image by that uuid; the exact route replaces the client's with the
/// router's digest, and the spliced body parses to that digest in the same part.
fn check_uuid_splice(row: &Value, body: &[u8], planned: &Planned) {
    let hashes: Vec<&str> = row["mm_hashes"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect();
    let sent = Request::parse(Endpoint::Responses, body).unwrap();
    let client: Vec<&str> = sent.images.iter().map(|i| i.uuid.as_deref().unwrap()).collect();
    assert_eq!(hashes, client, "vLLM names an input_image by its uuid");
    let spliced = splice_uuids(body, &planned.plan.images);
    let again = Request::parse(Endpoint::Responses, &spliced).unwrap();
    let ours: Vec<&str> = planned.plan.images.iter().map(|i| i.hash.as_str()).collect();
    let named: Vec<&str> = again.images.iter().map(|i| i.uuid.as_deref().unwrap()).collect();
    assert_eq!(named, ours, "the spliced body names each image by the router's digest");
    assert!(ours.iter().all(|h| !client.contains(h)));
    let reparsed: Value = serde_json::from_slice(&spliced).unwrap();
    assert_eq!(reparsed["input"][0]["content"][0]["uuid"], ours[0], "in the image's own part");
}

fn check_family(family: &str, profile: &'static str) -> usize {
    let goldens = goldens();
    let bodies = goldens["bodies"].as_array().unwrap();
    let rows = goldens["renders"][family].as_array().unwrap();
    assert_eq!(bodies.len(), rows.len(), "{family}: goldens are stale; rerun the oracle");
    let p = pipeline(profile);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (mut failures, mut exact) = (Vec::new(), 0);
    for (b, row) in bodies.iter().zip(rows) {
        let name = b["name"].as_str().unwrap();
        assert_eq!(row["name"], name, "{family}: goldens are stale");
        let body = body(&b["request"]);
        let planned = plan(&rt, &p, &body);
        match check(row, &planned) {
            Ok(true) => exact += 1,
            Ok(false) => {}
            Err(why) => failures.push(format!("{name}: {why}")),
        }
        if row.get("mm_hashes").is_some() && planned.plan.route == Route::Exact {
            check_uuid_splice(row, &body, &planned);
        }
    }
    assert!(failures.is_empty(), "{family}: {} bodies differ:\n{}", failures.len(), failures.join("\n"));
    let accepted = rows.iter().filter(|r| r["outcome"] == "ok").count();
    assert_eq!(exact, accepted, "{family}: every body vLLM renders is exact");
    exact
}

#[test]
fn qwen2_5_vl_responses_are_token_exact() {
    assert_eq!(check_family("qwen2_5_vl", "qwen2.5-vl"), 23);
}

#[test]
fn qwen3_vl_responses_are_token_exact() {
    assert_eq!(check_family("qwen3_vl", "qwen3-vl"), 23);
}
