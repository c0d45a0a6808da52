//! LoRA adapters as the engines serve them: learnt from each worker's `/v1/models` at its health
//! checks (no adapter in the config), requests for an adapter routed only to workers that list it and
//! keyed with its name, the router's own `/v1/models` and `models.retrieve`.

use serde_json::Value;

use crate::harness::*;

fn adapter_chat(model: &str, text: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "model": model, "max_tokens": 4,
        "messages": [{"role": "user", "content": text}],
    });
    serde_json::to_vec(&body).unwrap()
}

/// Waits until the router's `/v1/models/{id}` knows `id` (learnt at a health round).
async fn until_listed(url: &str, id: &str) -> Value {
    for _ in 0..100 {
        let r = client().get(format!("{url}/v1/models/{id}")).send().await.unwrap();
        if r.status() == 200 {
            return r.json().await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{id} never listed");
}

/// Three sims of which the first alone serves adapter `sql-lora`, behind a proxy; and that sim's name.
async fn one_of_three_serves_sql_lora() -> (Cluster, String) {
    let mut s = sims(1, |o| {
        fast(o);
        o.lora_modules = vec!["sql-lora".into()];
    })
    .await;
    s.extend(sims(2, fast).await);
    let serving = s[0].name().to_owned();
    (cluster_with(s, "[server]\nhealth_interval_ms = 100\n").await, serving)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_requests_go_only_to_workers_that_serve_the_adapter() {
    let (c, serving) = one_of_three_serves_sql_lora().await;
    let entry = until_listed(&c.url, "sql-lora").await;
    assert_eq!(entry["parent"], "Qwen/Qwen3-VL-8B-Instruct", "{entry}");
    assert_eq!(entry["workers"]["serving"], 1);
    for i in 0..6 {
        let r = post(&c.url, adapter_chat("sql-lora", &format!("Adapter question {i}"))).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-mmrouter-worker"), serving, "request {i}");
    }
    // The base model still spreads over every worker.
    let mut seen = std::collections::HashSet::new();
    for i in 0..12 {
        let r = post(&c.url, adapter_chat("Qwen/Qwen3-VL-8B-Instruct", &format!("Base question number {i}"))).await;
        seen.insert(header(&r, "x-mmrouter-worker").to_owned());
    }
    assert!(seen.len() > 1, "base requests are not confined: {seen:?}");
    // An adapter no worker lists: OpenAI's 404 for an unknown model.
    let r = client().get(format!("{}/v1/models/other-lora", c.url)).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapters_prompt_is_keyed_apart_from_the_base_models() {
    let s = sims(1, |o| {
        fast(o);
        o.lora_modules = vec!["sql-lora".into()];
    })
    .await;
    let c = cluster_with(s, "[server]\nhealth_interval_ms = 100\n").await;
    until_listed(&c.url, "sql-lora").await;
    let text = "A long shared question about the same words, repeated so that several blocks fill up. ".repeat(8);
    let base = debug_route(&c.url, "", &adapter_chat("Qwen/Qwen3-VL-8B-Instruct", &text), None).await;
    let lora = debug_route(&c.url, "", &adapter_chat("sql-lora", &text), None).await;
    assert_eq!(base["prompt_tokens"], lora["prompt_tokens"]);
    // Served once under the adapter: its resend is a hit, the base model's is not (the engine's
    // blocks differ by adapter, and so do the router's keys).
    assert_eq!(post(&c.url, adapter_chat("sql-lora", &text)).await.status(), 200);
    let again = debug_route(&c.url, "", &adapter_chat("sql-lora", &text), None).await;
    let other = debug_route(&c.url, "", &adapter_chat("Qwen/Qwen3-VL-8B-Instruct", &text), None).await;
    let blocks = |v: &Value| v["overlap_blocks"][0].as_u64().unwrap();
    assert!(blocks(&again) > 0, "{again}");
    assert_eq!(blocks(&other), 0, "{other}");
}

/// The sim's count of `/v1/load_lora_adapter` requests and the adapters it loaded.
async fn sim_loads(sim: &mmrouter_sim::SimHandle) -> (u64, Vec<String>) {
    let v: Value = client().get(format!("{}/sim/lora", sim.url())).send().await.unwrap().json().await.unwrap();
    let loaded = v["loaded"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_owned()).collect();
    (v["loads"].as_u64().unwrap(), loaded)
}

/// Waits until the router has read every worker's `/v1/models` (its adapter gauges show).
async fn until_listings_read(url: &str, workers: &[String]) {
    for _ in 0..100 {
        let text = metrics_text(url).await;
        let read = |w: &String| text.contains(&format!("mmrouter_worker_adapters{{worker=\"{w}\",state=\"served\"}}"));
        if workers.iter().all(read) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the workers' listings were never read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapters_requests_stay_on_the_worker_that_has_it_active() {
    let s = sims(2, |o| {
        fast(o);
        o.lora_modules = vec!["sql-lora".into()];
    })
    .await;
    let names: Vec<String> = s.iter().map(|s| s.name().to_owned()).collect();
    let c = cluster_with(s, "[server]\nhealth_interval_ms = 100\n").await;
    let entry = until_listed(&c.url, "sql-lora").await;
    assert_eq!(entry["workers"]["serving"], 2, "{entry}");
    // Both serve it, neither has it active: /debug/route says so.
    let probe = adapter_chat("sql-lora", "Which table holds the orders?");
    let before = debug_route(&c.url, "", &probe, None).await;
    assert_eq!(before["adapter"]["serving"].as_array().unwrap().len(), 2, "{before}");
    assert_eq!(before["adapter"]["active"], serde_json::json!([]), "{before}");
    // The first request ties and lands on either; from then on the adapter is active there (this
    // router sent it), and new prompts — no KV overlap anywhere — follow it instead of splitting.
    let r = post(&c.url, adapter_chat("sql-lora", "0 first adapter question")).await;
    assert_eq!(r.status(), 200);
    let active = header(&r, "x-mmrouter-worker").to_owned();
    for i in 1..12 {
        let r = post(&c.url, adapter_chat("sql-lora", &format!("{i} another adapter question"))).await;
        assert_eq!(header(&r, "x-mmrouter-worker"), active, "request {i}");
    }
    let after = debug_route(&c.url, "", &probe, None).await;
    assert_eq!(after["adapter"]["active"], serde_json::json!([active]), "{after}");
    assert_eq!(after["worker"], serde_json::json!(active), "{after}");
    assert_eq!(after["adapter"]["loadable"], false);
    let other = names.iter().find(|n| **n != active).unwrap();
    let costs = after["costs"].as_array().unwrap();
    let cost = |n: &str| costs[names.iter().position(|w| w == n).unwrap()].as_f64().unwrap();
    assert_eq!(cost(other) - cost(&active), 256.0, "the swap price: {after}");
    // The metrics: both serve one adapter, one has it active.
    let m = metrics_text(&c.url).await;
    let gauge =
        |w: &str, state: &str| metric(&m, "mmrouter_worker_adapters", &format!("worker=\"{w}\",state=\"{state}\""));
    assert_eq!((gauge(&active, "served"), gauge(&active, "active")), (1.0, 1.0), "{m}");
    assert_eq!((gauge(other, "served"), gauge(other, "active")), (1.0, 0.0), "{m}");
    assert_eq!(metric(&m, "mmrouter_adapter_requests_total", "adapter=\"sql-lora\""), 12.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_adapter_is_loaded_once_on_one_worker_then_served_there() {
    let dir = tempfile::tempdir().unwrap();
    let s = sims(2, fast).await;
    let names: Vec<String> = s.iter().map(|s| s.name().to_owned()).collect();
    let config = format!(
        "[server]\nhealth_interval_ms = 100\n[model]\nload_lora_adapters = [{{ name = \"x-lora\", path = {:?} }}]\n",
        dir.path().display().to_string()
    );
    let c = cluster_with(s, &config).await;
    until_listings_read(&c.url, &names).await;
    let before = debug_route(&c.url, "", &adapter_chat("x-lora", "hello"), None).await;
    assert_eq!(before["adapter"]["serving"], serde_json::json!([]), "{before}");
    assert_eq!(before["adapter"]["loadable"], true, "{before}");
    // Eight at once: one load, every request served by the worker that loaded it.
    let sends = (0..8).map(|i| post(&c.url, adapter_chat("x-lora", &format!("{i} question for the new adapter"))));
    let answers = futures_util::future::join_all(sends).await;
    let mut workers = std::collections::HashSet::new();
    for r in &answers {
        assert_eq!(r.status(), 200);
        workers.insert(header(r, "x-mmrouter-worker").to_owned());
    }
    assert_eq!(workers.len(), 1, "{workers:?}");
    let loader = workers.into_iter().next().unwrap();
    let mut total = 0;
    for sim in &c.sims {
        let (loads, loaded) = sim_loads(sim).await;
        total += loads;
        assert_eq!(loaded.is_empty(), sim.name() != loader, "{} loaded {loaded:?}", sim.name());
    }
    assert_eq!(total, 1, "one load for eight requests");
    let m = metrics_text(&c.url).await;
    let loads = |outcome: &str| {
        metric(&m, "mmrouter_adapter_loads_total", &format!("worker=\"{loader}\",outcome=\"{outcome}\""))
    };
    assert_eq!(loads("loaded"), 1.0, "{m}");
    // The next health rounds read it from the worker's own listing, and keep it there.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let after = debug_route(&c.url, "", &adapter_chat("x-lora", "hello"), None).await;
    assert_eq!(after["adapter"]["serving"], serde_json::json!([loader]), "{after}");
    let entry = until_listed(&c.url, "x-lora").await;
    assert_eq!(entry["workers"]["serving"], 1, "{entry}");
    let r = post(&c.url, adapter_chat("x-lora", "one more")).await;
    assert_eq!(header(&r, "x-mmrouter-worker"), loader);
    let mut total = 0;
    for sim in &c.sims {
        total += sim_loads(sim).await.0;
    }
    assert_eq!(total, 1, "no second load");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_is_a_503_with_the_workers_reason_and_is_counted() {
    let s = sims(1, fast).await;
    let name = s[0].name().to_owned();
    let config = "[server]\nhealth_interval_ms = 100\n[model]\n\
        load_lora_adapters = [{ name = \"bad-lora\", path = \"/nonexistent/mmrouter-test/bad-lora\" }]\n";
    let c = cluster_with(s, config).await;
    until_listings_read(&c.url, std::slice::from_ref(&name)).await;
    let sends = (0..4).map(|i| post(&c.url, adapter_chat("bad-lora", &format!("{i} question"))));
    for r in futures_util::future::join_all(sends).await {
        assert_eq!(r.status(), 503);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "adapter_load_failed", "{body}");
        assert_eq!(body["error"]["param"], "model", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("No adapter found for /nonexistent/mmrouter-test/bad-lora"), "{message}");
        assert!(message.contains(&name), "{message}");
    }
    // The requests that waited for the failed load got its answer: one load was sent.
    assert_eq!(sim_loads(&c.sims[0]).await.0, 1);
    let m = metrics_text(&c.url).await;
    let refused = metric(&m, "mmrouter_adapter_loads_total", &format!("worker=\"{name}\",outcome=\"refused\""));
    assert_eq!(refused, 1.0, "{m}");
    // An adapter neither listed nor configured is still OpenAI's 404.
    let r = client().get(format!("{}/v1/models/other-lora", c.url)).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

/// `/tokenize` naming an adapter (unplanned, passed through) goes only to a worker that serves it: the
/// others would answer 404 for a model they do not know, as vLLM does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_for_an_adapter_goes_to_a_worker_serving_it() {
    let (c, serving) = one_of_three_serves_sql_lora().await;
    until_listed(&c.url, "sql-lora").await;
    for i in 0..8 {
        let body = serde_json::json!({"model": "sql-lora", "prompt": format!("Tokenize me, number {i}")});
        let r = client()
            .post(format!("{}/tokenize", c.url))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(header(&r, "x-mmrouter-worker"), serving, "tokenize {i}");
        assert_eq!(r.status(), 200, "tokenize {i}");
    }
}
