//! The Responses API through the router, against sims that store responses as vLLM does with
//! `VLLM_ENABLE_RESPONSES_API_STORE=1` (in the memory of the worker that produced them): planned
//! like a chat, and every follow-up by `previous_response_id` (and `GET /v1/responses/{id}`) pinned
//! to the worker that stored the response — learnt from streamed and whole answers, found by asking
//! the workers when this router does not know it, refused clearly when that worker is gone or down.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

const MODEL: &str = "Qwen/Qwen3-VL-8B-Instruct";
/// Round-robin: without pinning, consecutive requests go to different workers.
const SPREAD: &str = "[server]\nhealth_interval_ms = 100\n[routing]\npolicy = \"round_robin\"\n";

fn stored_sims(n: usize) -> impl std::future::Future<Output = Vec<mmrouter_sim::SimHandle>> {
    sims(n, |o| {
        fast(o);
        o.responses_store = true;
    })
}

fn turn(input: Value, previous: Option<&str>, stream: bool) -> Vec<u8> {
    let mut body = json!({"model": MODEL, "input": input, "max_output_tokens": 4});
    if let Some(id) = previous {
        body["previous_response_id"] = id.into();
    }
    if stream {
        body["stream"] = true.into();
    }
    serde_json::to_vec(&body).unwrap()
}

/// One answer: its worker, route, id and `usage.input_tokens` (from `response.completed` when streamed).
struct Turn {
    status: u16,
    worker: String,
    route: String,
    pinned: String,
    id: String,
    input_tokens: u64,
    body: Value,
}

async fn send(url: &str, body: Vec<u8>) -> Turn {
    let r = post_to(url, "/v1/responses", body).await;
    let (status, worker, route) =
        (r.status().as_u16(), header(&r, "x-mmrouter-worker").to_owned(), header(&r, "x-mmrouter-route").to_owned());
    let pinned = header(&r, "x-mmrouter-pinned").to_owned();
    let sse = header(&r, "content-type").starts_with("text/event-stream");
    let text = r.text().await.unwrap();
    let body = if sse { completed_event(&text) } else { serde_json::from_str(&text).unwrap() };
    let id = body["id"].as_str().unwrap_or_default().to_owned();
    let input_tokens = body["usage"]["input_tokens"].as_u64().unwrap_or_default();
    Turn { status, worker, route, pinned, id, input_tokens, body }
}

/// A stream's final response (its `response.completed` event), checked to carry the id its first
/// event announced.
fn completed_event(text: &str) -> Value {
    let events: Vec<Value> =
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(events[0]["type"], "response.created", "{text}");
    let done = events.iter().find(|e| e["type"] == "response.completed").expect("a completed event").clone();
    assert_eq!(done["response"]["id"], events[0]["response"]["id"]);
    done["response"].clone()
}

async fn pinned(url: &str, outcome: &str) -> f64 {
    metric(&metrics_text(url).await, "mmrouter_responses_pinned_total", &format!("outcome=\"{outcome}\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_is_planned_and_every_follow_up_lands_on_the_worker_that_stored_it() {
    let c = cluster_with(stored_sims(2).await, SPREAD).await;
    let first =
        send(&c.url, turn(json!("Tell me about tide pools and the animals living in them."), None, false)).await;
    // A text chat's route (`exact` is for chats with images, below).
    assert_eq!((first.status, first.route.as_str()), (200, "no_media"), "{}", first.body);
    assert!(first.id.starts_with("resp_"), "{}", first.body);
    let home = first.worker.clone();
    let mut previous = first.id;
    // Streamed and whole turns in turn: each answer's id (a stream's from its first event) is learnt.
    for i in 0..6 {
        let next =
            send(&c.url, turn(json!(format!("And what about question {i}?")), Some(&previous), i % 2 == 0)).await;
        assert_eq!(next.status, 200, "turn {i}: {}", next.body);
        assert_eq!(next.worker, home, "turn {i} left the worker holding its previous response");
        assert_eq!(next.pinned, "known", "turn {i}");
        assert_eq!(next.body["previous_response_id"], previous.as_str());
        previous = next.id;
    }
    let t = metrics_text(&c.url).await;
    assert_eq!(metric(&t, "mmrouter_responses_pinned_total", "outcome=\"known\""), 6.0);
    assert_eq!(metric(&t, "mmrouter_responses_learnt_total", "source=\"worker\""), 7.0);
    // Predicted prompt tokens = the worker's usage.input_tokens. A follow-up's prompt is the worker's
    // stored conversation, which the router never saw: it is not planned, only pinned.
    assert_eq!(metric(&t, "mmrouter_prompt_tokens_drift_count", ""), 1.0);
    assert_eq!(metric(&t, "mmrouter_prompt_tokens_drift_sum", ""), 0.0);
    // GET /v1/responses/{id} goes to the same worker (the other would answer 404).
    let r = client().get(format!("{}/v1/responses/{previous}", c.url)).send().await.unwrap();
    assert_eq!((r.status().as_u16(), header(&r, "x-mmrouter-worker")), (200, home.as_str()));
    // Without `store`, nothing is learnt: a follow-up has nothing to find.
    let mut body: Value = serde_json::from_slice(&turn(json!("Not kept."), None, false)).unwrap();
    body["store"] = false.into();
    let unstored = send(&c.url, serde_json::to_vec(&body).unwrap()).await;
    let next = send(&c.url, turn(json!("Follow-up."), Some(&unstored.id), false)).await;
    assert_eq!(next.status, 404, "{}", next.body);
    assert_eq!(next.body["error"]["code"], "response_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_conversation_is_planned_exactly_and_pinned() {
    let c = cluster_with(stored_sims(2).await, SPREAD).await;
    let input = json!([{"role": "user", "content": [
        {"type": "input_text", "text": "What is in this picture?"},
        {"type": "input_image", "image_url": png_data_url(64, 48, 7)},
    ]}]);
    let first = send(&c.url, turn(input, None, false)).await;
    assert_eq!((first.status, first.route.as_str()), (200, "exact"), "{}", first.body);
    assert!(first.input_tokens > 0);
    for i in 0..4 {
        let next = send(&c.url, turn(json!(format!("Describe it again, {i}.")), Some(&first.id), i % 2 == 1)).await;
        assert_eq!((next.status, next.worker.as_str()), (200, first.worker.as_str()), "turn {i}: {}", next.body);
    }
    let t = metrics_text(&c.url).await;
    assert_eq!(metric(&t, "mmrouter_prompt_tokens_drift_sum", ""), 0.0);
    assert_eq!(metric(&t, "mmrouter_prompt_tokens_drift_count", ""), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_never_saw_the_response_finds_its_worker_by_asking() {
    let a = cluster_with(stored_sims(2).await, SPREAD).await;
    let first = send(&a.url, turn(json!("Where do puffins nest?"), None, false)).await;
    assert_eq!(first.status, 200);
    // A second router over the same workers (a restart, or another replica): it has learnt nothing.
    let b = cluster_with(Vec::new(), &format!("{SPREAD}{}", workers_of(&a))).await;
    for i in 0..4 {
        let next = send(&b.url, turn(json!(format!("More, {i}.")), Some(&first.id), false)).await;
        assert_eq!((next.status, next.worker.as_str()), (200, first.worker.as_str()), "turn {i}: {}", next.body);
    }
    assert_eq!(pinned(&b.url, "recovered").await, 1.0, "asked once, then remembered");
    assert_eq!(pinned(&b.url, "known").await, 3.0);
    // An id no worker has: OpenAI's 404, naming the field.
    let lost = send(&b.url, turn(json!("Hello?"), Some("resp_00000000000000000000000000000000"), false)).await;
    assert_eq!(lost.status, 404);
    assert_eq!(lost.body["error"]["code"], "response_not_found");
    assert_eq!(lost.body["error"]["param"], "previous_response_id");
    assert_eq!(lost.body["error"]["type"], "invalid_request_error");
    // One no worker could have given is refused without asking any.
    let odd = send(&b.url, turn(json!("Hello?"), Some("../../admin"), false)).await;
    assert_eq!(odd.status, 404);
    assert_eq!(pinned(&b.url, "response_not_found").await, 2.0);
    // GET by id through a router that never saw it.
    let c = cluster_with(Vec::new(), &format!("{SPREAD}{}", workers_of(&a))).await;
    let r = client().get(format!("{}/v1/responses/{}", c.url, first.id)).send().await.unwrap();
    assert_eq!((r.status().as_u16(), header(&r, "x-mmrouter-worker")), (200, first.worker.as_str()));
}

fn workers_of(c: &Cluster) -> String {
    c.sims.iter().map(|s| format!("[[workers]]\nname = {:?}\nurl = {:?}\n", s.name(), s.url())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_worker_is_a_404_and_a_down_one_a_503_never_another_worker() {
    let mut c = cluster_with(stored_sims(3).await, SPREAD).await;
    let a = send(&c.url, turn(json!("First conversation."), None, false)).await;
    let mut b = send(&c.url, turn(json!("Second conversation."), None, false)).await;
    while b.worker == a.worker {
        b = send(&c.url, turn(json!("Second conversation, again."), None, false)).await;
    }
    // `a`'s worker removed from the pool.
    let r = client().delete(format!("{}/admin/workers/{}", c.url, a.worker)).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let next = send(&c.url, turn(json!("Still there?"), Some(&a.id), false)).await;
    assert_eq!(next.status, 404, "{}", next.body);
    assert_eq!(next.body["error"]["code"], "response_worker_gone");
    assert!(next.body["error"]["message"].as_str().unwrap().contains(&a.worker), "{}", next.body);
    // `b`'s worker stops: once its health check finds it down, a follow-up is a 503 naming it.
    let at = c.sims.iter().position(|s| s.name() == b.worker).unwrap();
    c.sims.remove(at).shutdown().await;
    let router = c.state.pools()[0].router.clone();
    let (_, worker) = router.lookup(&b.worker).unwrap();
    for _ in 0..100 {
        if !worker.is_healthy() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let next = send(&c.url, turn(json!("Still there?"), Some(&b.id), false)).await;
    assert_eq!(next.status, 503, "{}", next.body);
    assert_eq!(next.body["error"]["code"], "response_worker_unavailable");
    assert_eq!(next.body["error"]["param"], "previous_response_id");
    assert!(next.body["error"]["message"].as_str().unwrap().contains(&b.worker), "{}", next.body);
    let t = metrics_text(&c.url).await;
    assert_eq!(metric(&t, "mmrouter_responses_pinned_total", "outcome=\"response_worker_gone\""), 1.0);
    assert_eq!(metric(&t, "mmrouter_responses_pinned_total", "outcome=\"response_worker_unavailable\""), 1.0);
    // Nothing of either went to another worker.
    let r = client().get(format!("{}/v1/responses/{}", c.url, b.id)).send().await.unwrap();
    assert_eq!(r.status(), 503);
}
