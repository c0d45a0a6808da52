//! The probe-duration histogram is recorded once per image with the `source` label.

mod media_common;

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use media_common::{data_url, fixture, Reply, TestServer};
use metrics::{Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use mmrouter::media::{ImageRef, Intake, MediaConfig};

/// (metric name, labels, value)
type Samples = Arc<Mutex<Vec<(String, Vec<(String, String)>, f64)>>>;

#[derive(Default)]
struct Capture {
    samples: Samples,
}

struct Sink {
    name: String,
    labels: Vec<(String, String)>,
    samples: Samples,
}

impl HistogramFn for Sink {
    fn record(&self, value: f64) {
        let sample = (self.name.clone(), self.labels.clone(), value);
        self.samples.lock().unwrap().push(sample);
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Sink {
            name: key.name().to_string(),
            labels: key.labels().map(|l| (l.key().to_string(), l.value().to_string())).collect(),
            samples: Arc::clone(&self.samples),
        }))
    }
}

#[test]
fn probe_duration_is_recorded_per_image_with_its_source() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let capture = Capture::default();
    metrics::with_local_recorder(&capture, || {
        rt.block_on(async {
            let server =
                TestServer::start(vec![("/a.gif", Reply::Body { body: fixture("alien1.gif"), honor_range: true })])
                    .await;
            let intake =
                Intake::new(MediaConfig { allow_cidrs: vec!["127.0.0.1/32".into()], ..MediaConfig::default() })
                    .unwrap();
            let urls = [
                data_url("image/jpeg", &fixture("red.jpg")),
                server.url("/a.gif"),
                data_url("image/png", &fixture("horse.png")),
            ];
            let refs: Vec<ImageRef<'_>> = urls
                .iter()
                .enumerate()
                .map(|(i, u)| ImageRef { url: Cow::Borrowed(u.as_str()), message: 0, part: i })
                .collect();
            intake.process(&refs).await.unwrap();
        })
    });
    let samples = capture.samples.lock().unwrap();
    let mut sources: Vec<&str> = samples
        .iter()
        .filter(|(name, ..)| name == mmrouter::metrics::IMAGE_PROBE_DURATION_SECONDS)
        .map(|(_, labels, value)| {
            assert!(*value >= 0.0);
            assert_eq!(labels.len(), 1);
            assert_eq!(labels[0].0, "source");
            labels[0].1.as_str()
        })
        .collect();
    sources.sort();
    assert_eq!(sources, ["data_url", "data_url", "http"]);
}
