//! Pools: several models behind one router, a request's `model` picking the pool.

use crate::harness::*;

/// Two pools of one sim each: Qwen3-VL (with a LoRA adapter its worker serves) and Qwen2.5-VL.
async fn two_pools() -> Cluster {
    let qwen3 = sims(1, |o| {
        fast(o);
        o.lora_modules = vec!["qwen3-sql-lora".into()];
    })
    .await;
    let qwen25 = sims(1, |o| {
        fast(o);
        o.model_dir = Some("qwen2.5-vl".into());
    })
    .await;
    let toml = format!(
        r#"
[[pools]]
name = "qwen3"
models = ["Qwen/Qwen3-VL-8B-Instruct", "qwen3-vl"]
model = {{ dir = "qwen3-vl", lora_adapters = ["qwen3-sql-lora"] }}
workers = [{{ name = "{a}", url = "{a_url}" }}]

[[pools]]
name = "qwen25"
models = ["Qwen/Qwen2.5-VL-7B-Instruct"]
model = {{ dir = "qwen2.5-vl" }}
workers = [{{ name = "{b}", url = "{b_url}" }}]
"#,
        a = qwen3[0].name(),
        a_url = qwen3[0].url(),
        b = qwen25[0].name(),
        b_url = qwen25[0].url(),
    );
    proxy(qwen3.into_iter().chain(qwen25).collect(), &toml).await
}

fn chat(model: &str, text: &str) -> Vec<u8> {
    serde_json::to_vec(
        &serde_json::json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_model_picks_the_pool_each_with_its_own_index() {
    let c = two_pools().await;
    let (a, b) = (c.sims[0].name().to_owned(), c.sims[1].name().to_owned());
    for (model, worker) in [
        ("Qwen/Qwen3-VL-8B-Instruct", &a),
        ("qwen3-vl", &a),
        ("qwen3-sql-lora", &a),
        ("Qwen/Qwen2.5-VL-7B-Instruct", &b),
    ] {
        let r = post(&c.url, chat(model, "Describe the weather on Mars in a long paragraph, please.")).await;
        assert_eq!(r.status(), 200, "{model}");
        assert_eq!(r.headers()["x-mmrouter-worker"].to_str().unwrap(), worker, "{model}");
    }
    assert_eq!(c.sims[0].stats().requests, 3);
    assert_eq!(c.sims[1].stats().requests, 1);
    // Each pool keeps its own routing index and load.
    let pools = c.state.pools();
    assert_eq!((pools[0].name.as_str(), pools[1].name.as_str()), ("qwen3", "qwen25"));
    assert!(pools[0].router.index_blocks() > pools[1].router.index_blocks());
    assert!(pools[1].router.index_blocks() > 0);
    assert_eq!(pools[0].router.workers().len(), 1);
    let m = metrics_text(&c.url).await;
    assert_eq!(metric(&m, mmrouter::observe::POOL_REQUESTS_TOTAL, "pool=\"qwen3\""), 3.0);
    assert_eq!(metric(&m, mmrouter::observe::POOL_REQUESTS_TOTAL, "pool=\"qwen25\""), 1.0);
    let info = format!("worker=\"{b}\",pool=\"qwen25\",engine=\"vllm\",role=\"both\"");
    assert_eq!(metric(&m, mmrouter::observe::WORKER_INFO, &info), 1.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_is_an_openai_404_and_nothing_is_forwarded() {
    let c = two_pools().await;
    for body in [chat("gpt-4o", "hi"), br#"{"messages":[{"role":"user","content":"hi"}]}"#.to_vec()] {
        let r = post(&c.url, body).await;
        assert_eq!(r.status(), 404);
        let err: serde_json::Value = r.json().await.unwrap();
        assert_eq!(err["error"]["code"], "model_not_found", "{err}");
        assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    }
    assert_eq!(c.sims[0].stats().requests + c.sims[1].stats().requests, 0);
    let m = metrics_text(&c.url).await;
    assert_eq!(metric(&m, mmrouter::observe::REJECTED_TOTAL, "reason=\"model_not_found\""), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_models_lists_every_pools_models() {
    let c = two_pools().await;
    let r = client().get(format!("{}/v1/models", c.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let list: serde_json::Value = r.json().await.unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["Qwen/Qwen3-VL-8B-Instruct", "qwen3-vl", "qwen3-sql-lora", "Qwen/Qwen2.5-VL-7B-Instruct"]);
    for m in list["data"].as_array().unwrap() {
        assert_eq!(m["object"], "model");
        assert!(m["owned_by"].is_string() && m["created"].is_number(), "{m}");
        assert_eq!(m["workers"], serde_json::json!({"both": 1}), "{m}");
    }
    // /debug/route names the pool.
    let r = client()
        .post(format!("{}/debug/route", c.url))
        .body(chat("Qwen/Qwen2.5-VL-7B-Instruct", "hi"))
        .send()
        .await
        .unwrap();
    let d: serde_json::Value = r.json().await.unwrap();
    assert_eq!(d["pool"], "qwen25", "{d}");
}

#[test]
fn pool_configs_are_validated() {
    let pool = |name: &str, model: &str, worker: &str| {
        format!("[[pools]]\nname = \"{name}\"\nmodels = [\"{model}\"]\nworkers = [{{ name = \"{worker}\", url = \"http://127.0.0.1:9\" }}]\n")
    };
    for (toml, needle) in [
        (format!("{}{}", pool("a", "m", "w1"), pool("b", "m", "w2")), "served by another pool"),
        (format!("{}{}", pool("a", "m", "w1"), pool("a", "n", "w2")), "pools[1].name"),
        (format!("{}{}", pool("a", "m", "w1"), pool("b", "n", "w1")), "worker name 'w1'"),
        (
            format!("{}[[workers]]\nname = \"x\"\nurl = \"http://127.0.0.1:9\"\n", pool("a", "m", "w1")),
            "[[pools.workers]]",
        ),
        (pool("a", "m", "w1").replace("models = [\"m\"]", "models = []"), "pools[0].models"),
    ] {
        let err = mmrouter::config::Settings::parse(&toml).unwrap_err().to_string();
        assert!(err.contains(needle), "{toml}\n→ {err}");
    }
    let ok = mmrouter::config::Settings::parse(&format!("{}{}", pool("a", "m", "w1"), pool("b", "n", "w2"))).unwrap();
    assert_eq!(ok.pools.len(), 2);
    assert_eq!(ok.pools[1].models, ["n"]);
}

/// Issue 47: a disaggregated pool says what it is made of — `/v1/models` counts its workers by role,
/// `/health` lists them by role and calls the pool unavailable when one leg has no worker left,
/// `/metrics` labels each worker's info series with its role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_pool_shows_its_roles() {
    let s = sims(3, fast).await;
    let worker = |name: &str, url: &str, role: &str| format!("{{ name = {name:?}, url = {url:?}, role = \"{role}\" }}");
    let workers = [
        worker("p0", &s[0].url(), "prefill"),
        worker("d0", &s[1].url(), "decode"),
        worker("d1", &s[2].url(), "decode"),
    ];
    let toml = format!(
        "[server]\nhealth_interval_ms = 0\n[[pools]]\nname = \"pd\"\nmodels = [\"m\"]\nworkers = [{}]\n",
        workers.join(", ")
    );
    let c = proxy(s, &toml).await;
    let list: serde_json::Value =
        client().get(format!("{}/v1/models", c.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["data"][0]["id"], "m");
    assert_eq!(list["data"][0]["workers"], serde_json::json!({"prefill": 1, "decode": 2}), "{list}");

    let health = || async {
        let r = client().get(format!("{}/health", c.url)).send().await.unwrap();
        (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
    };
    let (status, body) = health().await;
    assert_eq!((status, body["pools"][0]["status"].as_str()), (200, Some("ok")), "{body}");
    let roles = &body["pools"][0]["roles"];
    assert_eq!(roles["prefill"], serde_json::json!({"workers": 1, "healthy_workers": ["p0"]}), "{body}");
    assert_eq!(roles["decode"]["workers"], 2, "{body}");

    let m = metrics_text(&c.url).await;
    let info = "worker=\"d1\",pool=\"pd\",engine=\"vllm\",role=\"decode\"";
    assert_eq!(metric(&m, mmrouter::observe::WORKER_INFO, info), 1.0, "{m}");

    // Every decode worker down: the prefill worker alone serves nothing.
    let router = &c.state.pools()[0].router;
    for name in ["d0", "d1"] {
        router.mark_down(router.find(name).unwrap());
    }
    let (status, body) = health().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["pools"][0]["status"], "unavailable", "{body}");
    assert_eq!(body["pools"][0]["roles"]["decode"]["healthy_workers"], serde_json::json!([]), "{body}");
    assert_eq!(body["healthy_workers"], serde_json::json!(["p0"]), "{body}");
}
