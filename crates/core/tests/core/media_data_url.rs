//! Data-URL intake and probing on the real fixture images, the orientation policy, the header-less
//! fallback decode, and decompression bombs.

use crate::media_common::{data_url, fixture, gif_header, png_header, FIXTURES};
use mmrouter_core::media::{
    decode_data_url, probe_bytes, ImageDigest, Intake, MediaConfig, MediaError, Orientation, Source,
};

fn refs(urls: &[String]) -> Vec<&str> {
    urls.iter().map(String::as_str).collect()
}

#[test]
fn probe_bytes_matches_pillow_for_every_fixture() {
    let cfg = MediaConfig::default();
    for (name, _, w, h) in FIXTURES {
        let (pw, ph, _) = probe_bytes(&fixture(name), &cfg).unwrap();
        assert_eq!((pw, ph), (*w, *h), "{name}");
    }
}

#[test]
fn exif_orientation_is_a_switch() {
    let bytes = fixture("rocket_exif_rot6.jpg");
    let stored = probe_bytes(&bytes, &MediaConfig::default()).unwrap();
    assert_eq!(stored, (640, 427, "jpeg"));
    let exif = MediaConfig { orientation: Orientation::Exif, ..MediaConfig::default() };
    assert_eq!(probe_bytes(&bytes, &exif).unwrap(), (427, 640, "jpeg"));
    // Images without an orientation tag are unaffected by the switch.
    for (name, _, w, h) in FIXTURES.iter().filter(|f| f.0 != "rocket_exif_rot6.jpg") {
        let (pw, ph, _) = probe_bytes(&fixture(name), &exif).unwrap();
        assert_eq!((pw, ph), (*w, *h), "{name}");
    }
}

#[tokio::test]
async fn every_fixture_as_a_data_url_in_one_request() {
    let intake = Intake::new(MediaConfig::default()).unwrap();
    let urls: Vec<String> = FIXTURES.iter().map(|(name, mime, ..)| data_url(mime, &fixture(name))).collect();
    let infos = intake.process(&refs(&urls)).await.images.unwrap();
    for ((name, _, w, h), info) in FIXTURES.iter().zip(&infos) {
        let bytes = fixture(name);
        assert_eq!((info.width, info.height), (*w, *h), "{name}");
        assert_eq!(info.digest, ImageDigest::of(&bytes), "{name}");
        assert_eq!(info.bytes, bytes.len());
        assert_eq!(info.source, Source::DataUrl);
    }
    assert_eq!(infos[0].format, "jpeg");
    assert_eq!(infos[2].format, "png");
    assert_eq!(infos[5].format, "gif");
    assert_eq!(infos[8].format, "webp");

    let exif = Intake::new(MediaConfig { orientation: Orientation::Exif, ..MediaConfig::default() }).unwrap();
    let url = data_url("image/jpeg", &fixture("rocket_exif_rot6.jpg"));
    let info = exif.process(&refs(&[url])).await.images.unwrap();
    assert_eq!((info[0].width, info[0].height), (427, 640));
}

#[tokio::test]
async fn an_image_sent_again_keeps_its_identity_and_still_counts_against_the_budget() {
    let bytes = fixture("rocket.jpg");
    let url = data_url("image/jpeg", &bytes);
    // Room for two copies of the image per request, not three.
    let cfg =
        MediaConfig { max_image_bytes: bytes.len(), max_total_bytes: 2 * bytes.len() + 1, ..MediaConfig::default() };
    let intake = Intake::new(cfg).unwrap();
    // The first request notes it, the second keeps it, the third and fourth are answered from the memo.
    for round in 0..4 {
        let infos = intake.process(&refs(&[url.clone(), url.clone()])).await.images.unwrap();
        for info in &infos {
            assert_eq!(info.digest, ImageDigest::of(&bytes), "round {round}");
            assert_eq!((info.width, info.height, info.bytes), (640, 427, bytes.len()), "round {round}");
        }
    }
    let three = intake.process(&refs(&[url.clone(), url.clone(), url.clone()])).await.images;
    assert!(matches!(three, Err(MediaError::TotalTooLarge { .. })), "{three:?}");
    // Other text of the same length is read, not taken for the kept image.
    let mut other = bytes.clone();
    let n = other.len();
    other[n - 10] ^= 0xff;
    let infos = intake.process(&refs(&[data_url("image/jpeg", &other)])).await.images.unwrap();
    assert_eq!(infos[0].digest, ImageDigest::of(&other));
}

/// rocket.jpg with `segments` APP15 segments of ~60 KiB inserted after SOI, pushing SOF past the
/// 64 KiB header prefix.
fn jpeg_with_padding_segments(segments: usize) -> Vec<u8> {
    let jpg = fixture("rocket.jpg");
    let mut out = jpg[..2].to_vec();
    for _ in 0..segments {
        let len: u16 = 60_000;
        out.extend_from_slice(&[0xFF, 0xEF]);
        out.extend_from_slice(&len.to_be_bytes());
        out.resize(out.len() + usize::from(len) - 2, 0x20);
    }
    out.extend_from_slice(&jpg[2..]);
    out
}

#[tokio::test]
async fn sof_beyond_the_header_prefix_is_still_found() {
    let jpg = jpeg_with_padding_segments(3);
    assert!(jpg.len() > 180_000);
    let intake = Intake::new(MediaConfig::default()).unwrap();
    let url = data_url("image/jpeg", &jpg);
    let info = intake.process(&refs(&[url])).await.images.unwrap();
    assert_eq!((info[0].width, info[0].height), (640, 427));
    assert_eq!(info[0].digest, ImageDigest::of(&jpg));
}

#[tokio::test]
async fn header_probe_failure_falls_back_to_the_decoders_header_read() {
    // A 0xFF fill byte before the first marker is valid JPEG (T.81 B.1.1.2) but trips imagesize's
    // marker walk; the decoder handles it.
    let jpg = fixture("rocket.jpg");
    let mut filled = jpg[..2].to_vec();
    filled.push(0xFF);
    filled.extend_from_slice(&jpg[2..]);
    assert!(imagesize::blob_size(&filled).is_err(), "fixture no longer exercises the fallback");
    let cfg = MediaConfig::default();
    assert_eq!(probe_bytes(&filled, &cfg).unwrap(), (640, 427, "jpeg"));
    let intake = Intake::new(cfg.clone()).unwrap();
    let info = intake.process(&refs(&[data_url("image/jpeg", &filled)])).await.images.unwrap();
    assert_eq!((info[0].width, info[0].height), (640, 427));

    // A truncated body that the header cannot size is a decode failure.
    let truncated = &filled[..400];
    assert_eq!(probe_bytes(truncated, &cfg).unwrap_err().label(), "decode_failed");
}

#[test]
fn decompression_bombs_are_refused_from_the_header() {
    let cfg = MediaConfig::default();
    for bomb in [png_header(100_000, 100_000), gif_header(65_535, 65_535)] {
        let err = probe_bytes(&bomb, &cfg).unwrap_err();
        assert!(matches!(err, MediaError::TooManyPixels { .. }), "{err:?}");
        assert_eq!(err.label(), "too_large");
    }
    // A GIF within Pillow's bound passes the pixel cap; a tighter cap refuses it.
    let tight = MediaConfig { max_pixels: 1_000_000, ..MediaConfig::default() };
    assert_eq!(probe_bytes(&gif_header(1001, 1000), &tight).unwrap_err().label(), "too_large");
    assert_eq!(probe_bytes(&gif_header(1000, 1000), &tight).unwrap(), (1000, 1000, "gif"));
}

#[tokio::test]
async fn bomb_data_url_is_refused_by_intake() {
    let intake = Intake::new(MediaConfig::default()).unwrap();
    for url in
        [data_url("image/png", &png_header(100_000, 100_000)), data_url("image/gif", &gif_header(60_000, 60_000))]
    {
        let err = intake.process(&refs(&[url])).await.images.unwrap_err();
        assert_eq!(err.label(), "too_large", "{err}");
    }
}

#[tokio::test]
async fn data_url_limits_and_errors() {
    let png = fixture("horse.png");
    let url = data_url("image/png", &png);
    assert_eq!(decode_data_url(&url, png.len()).unwrap(), png);
    assert_eq!(decode_data_url(&url, png.len() - 1).unwrap_err().label(), "too_large");

    let small = Intake::new(MediaConfig { max_image_bytes: 10_000, max_total_bytes: 10_000, ..MediaConfig::default() })
        .unwrap();
    let err = small.process(&refs(std::slice::from_ref(&url))).await.images.unwrap_err();
    assert!(matches!(err, MediaError::ImageTooLarge { .. }), "{err:?}");

    // Each image fits, the request does not.
    let total = Intake::new(MediaConfig { max_image_bytes: 20_000, max_total_bytes: 20_000, ..MediaConfig::default() })
        .unwrap();
    let err = total.process(&refs(&[url.clone(), url.clone()])).await.images.unwrap_err();
    assert!(matches!(err, MediaError::TotalTooLarge { .. }), "{err:?}");

    let intake = Intake::new(MediaConfig::default()).unwrap();
    for (bad, label) in [
        (data_url("text/plain", &png), "invalid_data_url"),
        ("data:image/png;base64,@@@@".to_string(), "invalid_data_url"),
        (data_url("image/tiff", b"II*\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00"), "unsupported_format"),
        (data_url("image/png", b"\x89PNG\r\n\x1a\n"), "probe_failed"),
        // A BMP whose header declares 2x2 with embedded-JPEG compression: Pillow cannot open it.
        (data_url("image/bmp", &bmp_declaring_jpeg()), "unsupported_format"),
    ] {
        let err = intake.process(&refs(&[bad])).await.images.unwrap_err();
        assert_eq!(err.label(), label, "{err}");
    }
    assert!(intake.process(&[]).await.images.unwrap().is_empty());
}

/// A 2x2 BMP header with compression 4 (BI_JPEG) and bytes that are no JPEG.
fn bmp_declaring_jpeg() -> Vec<u8> {
    let mut v = b"BM".to_vec();
    for n in [70u32, 0, 54, 40, 2, 2] {
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.extend_from_slice(&[1, 0, 24, 0]); // planes, bits per pixel
    for n in [4u32, 16, 0, 0, 0, 0] {
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.extend_from_slice(&[0x20; 16]);
    v
}
