//! Image intake over real sockets: every fixture via a local HTTP server (with and without `Range`
//! support), and the misbehaving servers: slow, redirecting, oversized, lying about its length.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::media_common::{fixture, png_header, Reply, TestServer, FIXTURES};
use mmrouter_core::media::{ImageDigest, ImageInfo, Intake, MediaConfig, MediaError, Orientation, Source};

/// Test servers listen on 127.0.0.1 with an explicit port: both need the exception.
fn cfg() -> MediaConfig {
    MediaConfig { allow_cidrs: vec!["127.0.0.1/32".into()], ..MediaConfig::default() }
}

fn refs(urls: &[String]) -> Vec<&str> {
    urls.iter().map(String::as_str).collect()
}

async fn one(intake: &Intake, url: String) -> Result<ImageInfo, MediaError> {
    intake.process(&refs(&[url])).await.images.map(|mut v| v.remove(0))
}

fn routes(honor_range: bool) -> Vec<(&'static str, Reply)> {
    FIXTURES
        .iter()
        .map(|(name, ..)| {
            // Leaked once per test process: the server wants 'static paths.
            let path: &'static str = Box::leak(format!("/{name}").into_boxed_str());
            let reply = Reply::Body { body: fixture(name), honor_range };
            (path, reply)
        })
        .collect()
}

async fn all_fixtures_over_http(honor_range: bool) {
    let server = TestServer::start(routes(honor_range)).await;
    let intake = Intake::new(cfg()).unwrap();
    let urls: Vec<String> = FIXTURES.iter().map(|(n, ..)| server.url(&format!("/{n}"))).collect();
    let infos = intake.process(&refs(&urls)).await.images.unwrap();
    assert_eq!(infos.len(), FIXTURES.len());
    for ((name, _, w, h), info) in FIXTURES.iter().zip(&infos) {
        let bytes = fixture(name);
        assert_eq!((info.width, info.height), (*w, *h), "{name}");
        assert_eq!(info.digest, ImageDigest::of(&bytes), "{name}");
        assert_eq!(info.bytes, bytes.len(), "{name}");
        assert_eq!(info.source, Source::Http);
        assert!(name.contains(info.format) || (info.format == "jpeg" && name.ends_with(".jpg")));
    }
    let expected_range = format!("bytes=0-{}", cfg().max_image_bytes);
    assert!(server.stats.ranges().iter().all(|r| r.as_deref() == Some(expected_range.as_str())));
}

#[tokio::test]
async fn every_fixture_via_a_server_that_honours_range() {
    all_fixtures_over_http(true).await;
}

#[tokio::test]
async fn every_fixture_via_a_server_that_ignores_range() {
    all_fixtures_over_http(false).await;
}

#[tokio::test]
async fn exif_orientation_policy_over_http() {
    let server = TestServer::start(routes(false)).await;
    let exif = Intake::new(MediaConfig { orientation: Orientation::Exif, ..cfg() }).unwrap();
    let rot = one(&exif, server.url("/rocket_exif_rot6.jpg")).await.unwrap();
    assert_eq!((rot.width, rot.height), (427, 640));
    let plain = one(&exif, server.url("/rocket.jpg")).await.unwrap();
    assert_eq!((plain.width, plain.height), (640, 427));
    let stored = Intake::new(cfg()).unwrap();
    let rot = one(&stored, server.url("/rocket_exif_rot6.jpg")).await.unwrap();
    assert_eq!((rot.width, rot.height), (640, 427));
}

#[tokio::test]
async fn slow_server_is_a_fetch_timeout() {
    let server = TestServer::start(vec![(
        "/slow.png",
        Reply::Stall { body: fixture("horse.png"), head: 10, stall: Duration::from_secs(60) },
    )])
    .await;
    let intake = Intake::new(MediaConfig { fetch_timeout_ms: 300, ..cfg() }).unwrap();
    let err = one(&intake, server.url("/slow.png")).await.unwrap_err();
    assert!(matches!(err, MediaError::FetchTimeout { limit: "media.fetch_timeout_ms", .. }), "{err:?}");
    assert_eq!(err.label(), "fetch_timeout");

    // The request-wide deadline cuts in when it is shorter than the per-fetch timeout.
    let intake = Intake::new(MediaConfig { deadline_ms: 300, ..cfg() }).unwrap();
    let err = one(&intake, server.url("/slow.png")).await.unwrap_err();
    assert!(matches!(err, MediaError::FetchTimeout { limit: "media.deadline_ms", .. }), "{err:?}");
}

#[tokio::test]
async fn redirects_are_followed_rechecked_and_bounded() {
    let server = TestServer::start(vec![
        ("/img.png", Reply::Body { body: fixture("horse.png"), honor_range: true }),
        ("/ok", Reply::Redirect("/img.png".into())),
        ("/to-metadata", Reply::Redirect("http://[::ffff:127.0.0.2]:9/latest/meta-data/".into())),
        ("/to-file", Reply::Redirect("file:///etc/passwd".into())),
        ("/to-octal-loopback", Reply::Redirect("http://0177.0.0.2/".into())),
        ("/loop", Reply::Redirect("/loop".into())),
        ("/no-location", Reply::Status(302)),
    ])
    .await;
    let intake = Intake::new(cfg()).unwrap();
    let info = one(&intake, server.url("/ok")).await.unwrap();
    assert_eq!((info.width, info.height), (400, 328));

    for path in ["/to-metadata", "/to-file", "/to-octal-loopback"] {
        let err = one(&intake, server.url(path)).await.unwrap_err();
        assert_eq!(err.label(), "fetch_blocked", "{path}: {err}");
    }
    // `localhost` is a blocked name even though 127.0.0.1 is allowed as an address.
    let to_localhost = format!("http://localhost:{}/img.png", server.addr.port());
    let server2 = TestServer::start(vec![("/r", Reply::Redirect(to_localhost))]).await;
    let err = one(&intake, server2.url("/r")).await.unwrap_err();
    assert_eq!(err.label(), "fetch_blocked", "{err}");

    let err = one(&intake, server.url("/loop")).await.unwrap_err();
    assert_eq!(err.label(), "fetch_failed", "{err}");
    // the first request plus max_redirects hops, then it stops
    assert_eq!(server.stats.hits("/loop"), 1 + cfg().max_redirects);

    let err = one(&intake, server.url("/no-location")).await.unwrap_err();
    assert_eq!(err.label(), "fetch_failed");
}

#[tokio::test]
async fn an_oversized_stream_is_cut_off_without_reading_it_all() {
    let total = 64 * 1024 * 1024;
    let server = TestServer::start(vec![("/endless", Reply::Endless { total })]).await;
    let limit = 1024 * 1024;
    let intake = Intake::new(MediaConfig { max_image_bytes: limit, max_total_bytes: limit, ..cfg() }).unwrap();
    let err = one(&intake, server.url("/endless")).await.unwrap_err();
    assert!(matches!(err, MediaError::ImageTooLarge { .. }), "{err:?}");
    // Give the server's writer a moment to notice the closed connection.
    for _ in 0..50 {
        if server.stats.endless_written.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!server.stats.endless_completed.load(Ordering::SeqCst));
    assert!(server.stats.endless_written.load(Ordering::SeqCst) < total);
}

#[tokio::test]
async fn oversized_bodies_are_refused_from_their_headers() {
    let big = fixture("coffee.png"); // 466,706 bytes
    let server = TestServer::start(vec![
        ("/ranged", Reply::Body { body: big.clone(), honor_range: true }),
        ("/plain", Reply::Body { body: big.clone(), honor_range: false }),
        ("/claims-huge", Reply::LyingLength { claimed: 50 * 1024 * 1024, body: png_header(4, 4) }),
    ])
    .await;
    let intake = Intake::new(MediaConfig { max_image_bytes: 100_000, max_total_bytes: 100_000, ..cfg() }).unwrap();
    for path in ["/ranged", "/plain", "/claims-huge"] {
        let err = one(&intake, server.url(path)).await.unwrap_err();
        assert_eq!(err.label(), "too_large", "{path}: {err}");
    }
    // The ranged server was asked for at most limit+1 bytes.
    assert!(server.stats.ranges().contains(&Some("bytes=0-100000".to_string())));
}

#[tokio::test]
async fn lying_content_length() {
    let png = fixture("coffee.png");
    let server = TestServer::start(vec![
        // Claims more than it sends, then closes: a truncated body is an error, not an image.
        ("/short", Reply::LyingLength { claimed: png.len() * 2, body: png.clone() }),
        // Claims less than it sends: the framing bounds the read; the extra bytes are never read.
        ("/long", Reply::LyingLength { claimed: 100, body: png.clone() }),
    ])
    .await;
    let intake = Intake::new(cfg()).unwrap();
    let err = one(&intake, server.url("/short")).await.unwrap_err();
    assert_eq!(err.label(), "fetch_failed", "{err}");
    let info = one(&intake, server.url("/long")).await.unwrap();
    assert_eq!(info.bytes, 100);
    assert_eq!(info.digest, ImageDigest::of(&png[..100]));
    assert_eq!((info.width, info.height), (600, 400));
}

#[tokio::test]
async fn url_cache_avoids_refetching_and_ttl_zero_disables_it() {
    let server = TestServer::start(routes(true)).await;
    let cached = Intake::new(cfg()).unwrap();
    let url = server.url("/red.jpg");
    let first = one(&cached, url.clone()).await.unwrap();
    let second = one(&cached, url.clone()).await.unwrap();
    assert_eq!(server.stats.hits("/red.jpg"), 1);
    assert_eq!(first.digest, second.digest);
    assert_eq!((second.width, second.height), (32, 32));

    let uncached = Intake::new(MediaConfig { url_cache_ttl_secs: 0, ..cfg() }).unwrap();
    let url = server.url("/alien1.gif");
    one(&uncached, url.clone()).await.unwrap();
    one(&uncached, url).await.unwrap();
    assert_eq!(server.stats.hits("/alien1.gif"), 2);
}

#[tokio::test]
async fn http_errors_and_bad_content() {
    let server = TestServer::start(vec![
        ("/gone", Reply::Status(404)),
        ("/oops", Reply::Status(500)),
        (
            "/tiff",
            Reply::Body {
                body: b"II*\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00".to_vec(),
                honor_range: false,
            },
        ),
        ("/bomb", Reply::Body { body: png_header(100_000, 100_000), honor_range: true }),
    ])
    .await;
    let intake = Intake::new(cfg()).unwrap();
    for (path, label) in [
        ("/gone", "fetch_failed"),
        ("/oops", "fetch_failed"),
        ("/missing", "fetch_failed"),
        ("/tiff", "unsupported_format"),
        ("/bomb", "too_large"),
    ] {
        let err = one(&intake, server.url(path)).await.unwrap_err();
        assert_eq!(err.label(), label, "{path}: {err}");
    }
}

#[tokio::test]
async fn per_request_limits() {
    let server = TestServer::start(routes(true)).await;
    let intake =
        Intake::new(MediaConfig { max_images: 2, max_image_bytes: 300_000, max_total_bytes: 400_000, ..cfg() })
            .unwrap();
    let three: Vec<String> =
        ["red.jpg", "alien1.gif", "horse.png"].iter().map(|n| server.url(&format!("/{n}"))).collect();
    let err = intake.process(&refs(&three)).await.images.unwrap_err();
    assert!(matches!(err, MediaError::TooManyImages { count: 3, limit: 2 }));
    assert_eq!(err.label(), "too_many_images");

    // 240,512 + 251,812 bytes: each fits max_image_bytes, together over max_total_bytes.
    let two: Vec<String> =
        ["chelsea.png", "rocket_lossless.webp"].iter().map(|n| server.url(&format!("/{n}"))).collect();
    let err = intake.process(&refs(&two)).await.images.unwrap_err();
    assert!(matches!(err, MediaError::TotalTooLarge { .. }), "{err:?}");
    assert_eq!(err.label(), "too_large");
}

#[tokio::test]
async fn other_schemes_are_blocked_and_non_urls_invalid() {
    let intake = Intake::new(cfg()).unwrap();
    // A worker's loader might open another scheme: a policy refusal, like a blocked address.
    for url in ["ftp://example.com/a.png", "file:///etc/passwd", "gopher://127.0.0.1:70/_x", "FILE:///x"] {
        let err = one(&intake, url.to_string()).await.unwrap_err();
        assert_eq!(err.label(), "fetch_blocked", "{url}: {err}");
        assert_eq!(intake.screen(&[url]).await.unwrap_err().label(), "fetch_blocked", "{url}");
    }
    for url in ["not a url", "http://"] {
        let err = one(&intake, url.to_string()).await.unwrap_err();
        assert_eq!(err.label(), "invalid_url", "{url}: {err}");
    }
}

#[tokio::test]
async fn screening_judges_every_url_without_fetching() {
    let body = fixture("chelsea.png");
    let server = TestServer::start(vec![("/chelsea.png", Reply::Body { body: body.clone(), honor_range: true })]).await;
    let url = server.url("/chelsea.png");
    let data = crate::media_common::data_url("image/png", &body);
    Intake::new(cfg()).unwrap().screen(&[&data, &url]).await.unwrap(); // loopback allowed here
    assert_eq!(server.stats.hits("/chelsea.png"), 0, "screening fetched the image");
    let err = Intake::new(MediaConfig::default()).unwrap().screen(&[&data, &url]).await.unwrap_err();
    assert_eq!(err.label(), "fetch_blocked", "{err}");
}

#[tokio::test]
async fn https_to_a_plain_http_server_fails_cleanly() {
    // Exercises the rustls stack (ring provider installed by Intake::new) without any network.
    let server = TestServer::start(routes(true)).await;
    let intake = Intake::new(cfg()).unwrap();
    let url = format!("https://{}/red.jpg", server.addr);
    let err = one(&intake, url).await.unwrap_err();
    assert_eq!(err.label(), "fetch_failed", "{err}");
}
