//! Image affinity through the real proxy and sims: the router credits the worker its exact dispatches
//! sent an image to when the image comes back under a new prefix, and a request that falls back feeds
//! the residency model nothing (the mission's rule: no image state from a failed request).

use crate::harness::*;

/// A chat whose system prompt (the text before the image) is `system`.
fn chat_under(system: &str, images: &[String], question: &str) -> Vec<u8> {
    let mut body: serde_json::Value = serde_json::from_slice(&chat_body(images, question, false)).unwrap();
    body["messages"][0]["content"] = system.into();
    serde_json::to_vec(&body).unwrap()
}

fn credits(route: &serde_json::Value) -> Vec<f64> {
    route["image_credit"].as_array().expect("image_credit").iter().map(|v| v.as_f64().unwrap()).collect()
}

fn resident(route: &serde_json::Value) -> Vec<u64> {
    let workers = route["image_residency"].as_array().expect("image_residency");
    workers.iter().map(|w| w["images_resident"].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_sent_an_image_is_credited_for_it_under_a_new_prefix() {
    let c = cluster_with(sims(3, fast).await, "").await;
    let photo = png_data_url(320, 240, 7);
    let r = post(&c.url, chat_under(&unique("You are a product expert."), std::slice::from_ref(&photo), "What is it?"))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-mmrouter-route"), "exact");
    let sent_to = header(&r, "x-mmrouter-worker").to_owned();
    let slot = c.sims.iter().position(|s| s.name() == sent_to).expect("a sim of the pool");

    // Another user, another system prompt: no KV block in common, the same image.
    let again = chat_under(&unique("You answer in one short sentence."), &[photo], "Which colour is it?");
    let d = debug_route(&c.url, "", &again, None).await;
    let credit = credits(&d);
    assert!(credit[slot] > 0.0, "{d}");
    assert!(credit.iter().enumerate().all(|(i, &v)| i == slot || v == 0.0), "{d}");
    assert_eq!(d["worker"], sent_to.as_str(), "the credit decides among idle workers without a cache hit");
    assert_eq!(d["image_residency"][slot]["held"][0]["encoder"], 1.0, "{d}");

    // A request the image is not part of earns nobody a credit.
    let other = chat_under(&unique("You are a product expert."), &[png_data_url(320, 240, 8)], "And this?");
    assert!(credits(&debug_route(&c.url, "", &other, None).await).iter().all(|&v| v == 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_falls_back_feeds_no_image_residency() {
    // Images over a million pixels fall back (reason too_large), and with them the whole request.
    let c = cluster_with(sims(2, fast).await, "[media]\nmax_pixels = 1000000").await;
    let small = png_data_url(320, 240, 9);
    let body = chat_under(&unique("You compare photos."), &[small.clone(), png_data_url(1200, 1000, 9)], "Same?");
    let r = post(&c.url, body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-mmrouter-route"), "text_prefix");

    let alone = chat_under(&unique("You describe photos."), &[small], "What is it?");
    let d = debug_route(&c.url, "", &alone, None).await;
    assert_eq!(credits(&d), vec![0.0, 0.0], "{d}");
    assert_eq!(resident(&d), vec![0, 0], "{d}");
    let m = metrics_text(&c.url).await;
    assert!(!m.contains("mmrouter_worker_images_resident"), "no worker carried an exact image");
}
