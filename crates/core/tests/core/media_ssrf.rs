//! SSRF guard through the public API. Blocked URLs are refused before any connection is opened,
//! so the private-range cases send no traffic; the "allowed when configured" cases use a server
//! on 127.0.0.1.

use crate::media_common::{fixture, Reply, TestServer};
use mmrouter_core::media::{ImageInfo, Intake, MediaConfig, MediaError};

async fn fetch(cfg: MediaConfig, url: &str) -> Result<ImageInfo, MediaError> {
    let intake = Intake::new(cfg).unwrap();
    let refs = [url];
    intake.process(&refs).await.images.map(|mut v| v.remove(0))
}

#[tokio::test]
async fn every_denied_range_is_blocked_by_default() {
    let hosts = [
        "0.0.0.0",
        "10.0.0.1",
        "100.64.0.1",
        "127.0.0.1",
        "127.1.2.3",
        "169.254.169.254",
        "172.16.0.1",
        "192.0.0.1",
        "192.0.2.1",
        "192.168.0.1",
        "198.18.0.1",
        "198.51.100.1",
        "203.0.113.1",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "[::]",
        "[::1]",
        "[fc00::1]",
        "[fd00::1]",
        "[fe80::1]",
        "[ff02::1]",
        "[2001:db8::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:169.254.169.254]",
        "[::ffff:192.168.0.1]",
        "[64:ff9b::7f00:1]",
        "[2002:7f00:1::]",
    ];
    for host in hosts {
        for url in [format!("http://{host}/a.png"), format!("https://{host}:8443/a.png")] {
            let err = fetch(MediaConfig::default(), &url).await.unwrap_err();
            assert_eq!(err.label(), "fetch_blocked", "{url}: {err}");
        }
    }
}

#[tokio::test]
async fn internal_names_and_alternative_ip_spellings_are_blocked_by_default() {
    for url in [
        "http://localhost/a.png",
        "http://LocalHost./a.png",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://2130706433/a.png",
        "http://0177.0.0.1/a.png",
        "http://0x7f.0.0.1/a.png",
        "http://0x7f000001/a.png",
        "http://127.1/a.png",
        "http://[::ffff:127.0.0.1]/a.png",
        "http://[::ffff:7f00:1]/a.png",
    ] {
        let err = fetch(MediaConfig::default(), url).await.unwrap_err();
        assert!(err.is_blocked(), "{url}: {err}");
    }
}

#[tokio::test]
async fn loopback_is_reachable_only_when_configured() {
    let server =
        TestServer::start(vec![("/a.png", Reply::Body { body: fixture("horse.png"), honor_range: true })]).await;
    let port = server.addr.port();
    let spellings = [
        format!("http://127.0.0.1:{port}/a.png"),
        format!("http://2130706433:{port}/a.png"),
        format!("http://0177.0.0.1:{port}/a.png"),
        format!("http://0x7f.0.0.1:{port}/a.png"),
        format!("http://localhost:{port}/a.png"),
    ];
    for url in &spellings {
        let err = fetch(MediaConfig::default(), url).await.unwrap_err();
        assert_eq!(err.label(), "fetch_blocked", "{url}");
    }
    assert_eq!(server.stats.hits("/a.png"), 0, "a blocked URL reached the server");

    // allow_cidrs opens the address, whatever its spelling.
    let by_cidr = MediaConfig { allow_cidrs: vec!["127.0.0.0/8".into()], ..MediaConfig::default() };
    for url in &spellings[..4] {
        let info = fetch(by_cidr.clone(), url).await.unwrap();
        assert_eq!((info.width, info.height), (400, 328), "{url}");
    }
    // ...but not the internal name.
    let err = fetch(by_cidr, &spellings[4]).await.unwrap_err();
    assert_eq!(err.label(), "fetch_blocked");

    // allow_hosts opens a name, with or without a port; a wrong port stays closed.
    for entry in ["localhost".to_string(), format!("localhost:{port}")] {
        let by_host = MediaConfig { allow_hosts: vec![entry.clone()], ..MediaConfig::default() };
        let info = fetch(by_host, &spellings[4]).await.unwrap();
        assert_eq!(info.width, 400, "{entry}");
    }
    let wrong_port = MediaConfig {
        allow_hosts: vec![format!("localhost:{}", port.wrapping_add(1).max(1))],
        ..MediaConfig::default()
    };
    assert!(fetch(wrong_port, &spellings[4]).await.unwrap_err().is_blocked());

    // allow_private turns the guard off.
    let open = MediaConfig { allow_private: true, ..MediaConfig::default() };
    assert!(fetch(open, &spellings[4]).await.is_ok());
}

#[tokio::test]
async fn a_narrow_allowance_does_not_open_neighbours() {
    let cfg = MediaConfig { allow_cidrs: vec!["127.0.0.1/32".into()], ..MediaConfig::default() };
    for url in ["http://127.0.0.2/", "http://[::1]/", "http://2130706434/", "http://[::ffff:127.0.0.3]/"] {
        assert!(fetch(cfg.clone(), url).await.unwrap_err().is_blocked(), "{url}");
    }
}

#[test]
fn invalid_exceptions_are_config_errors_naming_the_key() {
    let err = Intake::new(MediaConfig { allow_cidrs: vec!["x".into()], ..MediaConfig::default() }).err().unwrap();
    assert_eq!(err, "media.allow_cidrs: invalid CIDR 'x'");
    let err =
        Intake::new(MediaConfig { allow_hosts: vec!["http://a/".into()], ..MediaConfig::default() }).err().unwrap();
    assert!(err.starts_with("media.allow_hosts"), "{err}");
}

#[test]
fn reject_blocked_urls_is_exposed() {
    // On by default: a blocked URL is refused, not forwarded for the worker to fetch.
    assert!(Intake::new(MediaConfig::default()).unwrap().reject_blocked_urls());
    let intake = Intake::new(MediaConfig { reject_blocked_urls: false, ..MediaConfig::default() }).unwrap();
    assert!(!intake.reject_blocked_urls());
}
