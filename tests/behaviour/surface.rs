//! The API surface around chat: what the router answers itself, in OpenAI's error shape.

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_and_models_get_openai_shaped_json_errors() {
    let c = cluster_with(sims(1, fast).await, "").await;
    for (method, path) in [("GET", "/nope"), ("POST", "/v2/chat/completions"), ("GET", "/")] {
        let r = client().request(method.parse().unwrap(), format!("{}{path}", c.url)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
        let v: serde_json::Value = r.json().await.expect("a JSON body");
        let e = &v["error"];
        assert_eq!(e["code"], "unknown_url", "{v}");
        assert_eq!(e["type"], "invalid_request_error");
        assert!(e["message"].as_str().unwrap().contains(path), "{v}");
        assert!(e.as_object().unwrap().contains_key("param"), "param present (null): {v}");
    }
    let s = sims(1, fast).await;
    let toml = format!(
        "[[pools]]\nname = \"p\"\nmodels = [\"only-this\"]\nmodel = {{ dir = \"qwen3-vl\" }}\nworkers = [{{ name = {:?}, url = {:?} }}]\n",
        s[0].name(),
        s[0].url()
    );
    let c2 = proxy(s, &toml).await;
    let r = post(&c2.url, chat_body(&[], "hi", false)).await;
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!((v["error"]["code"].clone(), v["error"]["param"].clone()), ("model_not_found".into(), "model".into()));
}
