//! Intake reports one probe timing per image read, with its source (the server turns them into the
//! `mmrouter_image_probe_duration_seconds{source}` samples).

use crate::media_common::{data_url, fixture, Reply, TestServer};
use mmrouter_core::media::{Intake, MediaConfig, Source};

#[tokio::test]
async fn probe_timing_is_reported_per_image_with_its_source() {
    let server =
        TestServer::start(vec![("/a.gif", Reply::Body { body: fixture("alien1.gif"), honor_range: true })]).await;
    let intake =
        Intake::new(MediaConfig { allow_cidrs: vec!["127.0.0.1/32".into()], ..MediaConfig::default() }).unwrap();
    let urls = [
        data_url("image/jpeg", &fixture("red.jpg")),
        server.url("/a.gif"),
        data_url("image/png", &fixture("horse.png")),
    ];
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let report = intake.process(&refs).await;
    assert_eq!(report.images.unwrap().len(), 3);
    let mut sources: Vec<&str> = report.probes.iter().map(|p| p.source.label()).collect();
    sources.sort();
    assert_eq!(sources, ["data_url", "data_url", "http"]);

    // A failed image is timed too; the request as a whole fails.
    let report = intake.process(&[urls[0].as_str(), "data:image/png;base64,!!!!"]).await;
    assert_eq!(report.images.unwrap_err().label(), "invalid_data_url");
    assert!(report.probes.iter().any(|p| p.source == Source::DataUrl));
}
