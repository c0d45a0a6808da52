//! An ISO-BMFF (MP4 / QuickTime MOV) container probe: the frame count, frame rate and frame size that
//! vLLM's opencv loader reads from a clip (`CAP_PROP_FRAME_COUNT`, `CAP_PROP_FPS`, the frame size),
//! from the sample tables alone — no frame is decoded, nothing is allocated per frame.
//!
//! OpenCV asks FFmpeg, whose mov demuxer reports the video track's sample count as its frame count
//! and, when the track has one sample duration (`stts` with one entry), `timescale / duration` as its
//! frame rate. What this probe cannot reproduce exactly is refused with a reason instead of estimated:
//! a non-trivial edit list (FFmpeg then hides or repeats samples, and vLLM's end-of-stream seek may
//! correct the count), several sample durations (variable frame rate: FFmpeg guesses a rate from
//! timestamps), fragments (`moof`: samples outside `moov`), a rotation matrix (OpenCV turns the
//! frames, and the size with them), several video tracks, sample data the file does not hold (a header
//! declaring 10⁹ frames in a few KB), and codecs not listed in [`CODECS`].
//!
//! Every box is bounded by its parent before it is read; a table's length is checked against its box
//! before it is walked.

use crate::media::error::MediaError;

/// Sample-entry codecs whose frames the engines' FFmpeg decodes one per sample, sized as the entry says.
pub(crate) const CODECS: &[&[u8; 4]] = &[b"mp4v", b"avc1", b"avc3", b"hvc1", b"hev1", b"vp09", b"av01"];

/// What the engine's opencv loader reads from the container.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Mp4Video {
    pub frames: u64,
    pub fps: f64,
    pub width: u32,
    pub height: u32,
    /// The sample entry's four-character code (`mp4v`, `avc1`, …).
    pub codec: [u8; 4],
}

/// True when `bytes` starts like an ISO-BMFF file (an `ftyp`, or a QuickTime file's first atom).
pub(crate) fn is_iso_bmff(bytes: &[u8]) -> bool {
    matches!(bytes.get(4..8), Some(t) if [b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip"].iter().any(|k| t == *k))
}

fn invalid(why: impl Into<String>) -> MediaError {
    MediaError::VideoInvalid(why.into())
}

/// One box: its type, its body, and the bytes after it.
struct Mp4Box<'a> {
    kind: [u8; 4],
    body: &'a [u8],
}

/// The boxes of `buf` in order; a size that overruns its parent is an error, not a truncation.
fn boxes(mut buf: &[u8]) -> impl Iterator<Item = Result<Mp4Box<'_>, MediaError>> {
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        let next = split_box(buf);
        match next {
            Ok((b, rest)) => {
                buf = rest;
                Some(Ok(b))
            }
            Err(e) => {
                buf = &[];
                Some(Err(e))
            }
        }
    })
}

fn split_box(buf: &[u8]) -> Result<(Mp4Box<'_>, &[u8]), MediaError> {
    let size32 = u32_at(buf, 0)?;
    let kind: [u8; 4] = buf.get(4..8).and_then(|k| k.try_into().ok()).ok_or_else(|| invalid("box header cut"))?;
    let (size, header) = match size32 {
        0 => (buf.len() as u64, 8usize),
        1 => (u64_at(buf, 8)?, 16),
        n => (u64::from(n), 8),
    };
    if size < header as u64 || size > buf.len() as u64 {
        let name = String::from_utf8_lossy(&kind).into_owned();
        return Err(invalid(format!("box '{name}' declares {size} bytes, {} available", buf.len())));
    }
    let size = size as usize;
    Ok((Mp4Box { kind, body: &buf[header..size] }, &buf[size..]))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, MediaError> {
    b.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]])).ok_or_else(|| invalid("box too short"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, MediaError> {
    b.get(at..at + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]])).ok_or_else(|| invalid("box too short"))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, MediaError> {
    let s = b.get(at..at + 8).ok_or_else(|| invalid("box too short"))?;
    Ok(u64::from_be_bytes(s.try_into().map_err(|_| invalid("box too short"))?))
}

/// The one child of `kind` (a second one is refused: which one FFmpeg reads is not ours to guess).
fn child<'a>(parent: &'a [u8], kind: &[u8; 4]) -> Result<&'a [u8], MediaError> {
    let mut found = None;
    for b in boxes(parent) {
        let b = b?;
        if &b.kind == kind {
            if found.is_some() {
                return Err(invalid(format!("two '{}' boxes", String::from_utf8_lossy(kind))));
            }
            found = Some(b.body);
        }
    }
    found.ok_or_else(|| invalid(format!("no '{}' box", String::from_utf8_lossy(kind))))
}

fn has_child(parent: &[u8], kind: &[u8; 4]) -> Result<bool, MediaError> {
    for b in boxes(parent) {
        if &b?.kind == kind {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Probes a whole MP4/MOV file.
pub(crate) fn probe(file: &[u8]) -> Result<Mp4Video, MediaError> {
    let mut moov = None;
    for b in boxes(file) {
        let b = b?;
        match &b.kind {
            b"moov" if moov.is_some() => return Err(invalid("two 'moov' boxes")),
            b"moov" => moov = Some(b.body),
            b"moof" => {
                return Err(MediaError::VideoContainer(
                    "fragmented MP4 (moof): samples outside the sample tables".into(),
                ))
            }
            _ => {}
        }
    }
    let moov = moov.ok_or_else(|| invalid("no 'moov' box"))?;
    let mut video = None;
    for b in boxes(moov) {
        let b = b?;
        if &b.kind == b"trak" && handler(b.body)? == *b"vide" {
            if video.is_some() {
                return Err(MediaError::VideoContainer("several video tracks".into()));
            }
            video = Some(b.body);
        }
    }
    let trak = video.ok_or_else(|| invalid("no video track"))?;
    let probed = video_track(trak)?;
    check_sample_data(trak, file.len() as u64, probed.frames)?;
    Ok(probed)
}

/// The track's handler type (`vide`, `soun`, …) from `mdia/hdlr`.
fn handler(trak: &[u8]) -> Result<[u8; 4], MediaError> {
    let hdlr = child(child(trak, b"mdia")?, b"hdlr")?;
    hdlr.get(8..12).and_then(|s| s.try_into().ok()).ok_or_else(|| invalid("hdlr too short"))
}

fn video_track(trak: &[u8]) -> Result<Mp4Video, MediaError> {
    check_matrix(child(trak, b"tkhd")?)?;
    if has_child(trak, b"edts")? {
        check_edit_list(child(child(trak, b"edts")?, b"elst")?)?;
    }
    let mdia = child(trak, b"mdia")?;
    let timescale = timescale(child(mdia, b"mdhd")?)?;
    let stbl = child(child(mdia, b"minf")?, b"stbl")?;
    let (codec, width, height) = sample_entry(child(stbl, b"stsd")?)?;
    let (frames, delta) = single_duration(child(stbl, b"stts")?)?;
    let sizes = sample_count(child(stbl, b"stsz")?)?;
    if sizes != frames {
        return Err(invalid(format!("stts counts {frames} samples, stsz {sizes}")));
    }
    if frames == 0 {
        return Err(invalid("the video track has no samples"));
    }
    // As FFmpeg's r_frame_rate (timescale / the one sample duration), which OpenCV reports; a double
    // division is correctly rounded, so reducing the fraction first would give the same value.
    let fps = f64::from(timescale) / f64::from(delta);
    Ok(Mp4Video { frames, fps, width, height, codec })
}

/// OpenCV turns frames by the track's display matrix (and reports the turned size): only the identity
/// is sized as stored.
fn check_matrix(tkhd: &[u8]) -> Result<(), MediaError> {
    let at = match tkhd.first() {
        Some(0) => 40,
        Some(1) => 52,
        _ => return Err(invalid("tkhd version")),
    };
    const IDENTITY: [u32; 9] = [0x0001_0000, 0, 0, 0, 0x0001_0000, 0, 0, 0, 0x4000_0000];
    for (i, want) in IDENTITY.iter().enumerate() {
        if u32_at(tkhd, at + 4 * i)? != *want {
            return Err(MediaError::VideoTimeline("the track has a display matrix (rotation or flip)".into()));
        }
    }
    Ok(())
}

/// Only the trivial edit list (one edit, from media time 0, at rate 1) shows every sample once.
fn check_edit_list(elst: &[u8]) -> Result<(), MediaError> {
    let version = *elst.first().ok_or_else(|| invalid("elst too short"))?;
    let count = u32_at(elst, 4)?;
    let (media_time, rate) = match (version, count) {
        (0, 1) => (i64::from(u32_at(elst, 12)? as i32), u32_at(elst, 16)?),
        (1, 1) => (u64_at(elst, 16)? as i64, u32_at(elst, 24)?),
        (0 | 1, n) => return Err(MediaError::VideoTimeline(format!("an edit list of {n} edits"))),
        _ => return Err(invalid("elst version")),
    };
    if media_time != 0 || rate != 0x0001_0000 {
        return Err(MediaError::VideoTimeline(format!("an edit starting at media time {media_time}")));
    }
    Ok(())
}

fn timescale(mdhd: &[u8]) -> Result<u32, MediaError> {
    let ts = match mdhd.first() {
        Some(0) => u32_at(mdhd, 12)?,
        Some(1) => u32_at(mdhd, 20)?,
        _ => return Err(invalid("mdhd version")),
    };
    if ts == 0 {
        return Err(invalid("timescale 0"));
    }
    Ok(ts)
}

/// The one visual sample entry: codec, width, height.
fn sample_entry(stsd: &[u8]) -> Result<([u8; 4], u32, u32), MediaError> {
    if u32_at(stsd, 4)? != 1 {
        return Err(MediaError::VideoContainer("several sample descriptions".into()));
    }
    let (entry, _) = split_box(stsd.get(8..).ok_or_else(|| invalid("stsd too short"))?)?;
    if !CODECS.iter().any(|c| **c == entry.kind) {
        return Err(MediaError::VideoCodec(String::from_utf8_lossy(&entry.kind).into_owned()));
    }
    // SampleEntry (6 reserved, data_reference_index) + VisualSampleEntry's 16 bytes before the size.
    let (width, height) = (u16_at(entry.body, 24)?, u16_at(entry.body, 26)?);
    if width == 0 || height == 0 {
        return Err(invalid(format!("frame size {width}x{height}")));
    }
    Ok((entry.kind, u32::from(width), u32::from(height)))
}

/// The sample count and the single sample duration; several durations are a variable frame rate.
fn single_duration(stts: &[u8]) -> Result<(u64, u32), MediaError> {
    match u32_at(stts, 4)? {
        1 => {}
        0 => return Err(invalid("stts has no entries")),
        n => return Err(MediaError::VideoTimeline(format!("{n} sample durations (variable frame rate)"))),
    }
    let (count, delta) = (u32_at(stts, 8)?, u32_at(stts, 12)?);
    if delta == 0 {
        return Err(MediaError::VideoTimeline("sample duration 0".into()));
    }
    Ok((u64::from(count), delta))
}

fn sample_count(stsz: &[u8]) -> Result<u64, MediaError> {
    Ok(u64::from(u32_at(stsz, 8)?))
}

/// The samples' bytes must fit in the file: a header may not declare frames that are not there (the
/// engine would fail to read them, and the router would count frames that are never seen).
fn check_sample_data(trak: &[u8], file_len: u64, frames: u64) -> Result<(), MediaError> {
    let stbl = child(child(child(trak, b"mdia")?, b"minf")?, b"stbl")?;
    let stsz = child(stbl, b"stsz")?;
    let constant = u64::from(u32_at(stsz, 4)?);
    let total = if constant != 0 {
        constant.saturating_mul(frames)
    } else {
        let table = stsz.get(12..).ok_or_else(|| invalid("stsz too short"))?;
        if (table.len() as u64) < frames.saturating_mul(4) {
            return Err(invalid(format!("stsz lists fewer than its {frames} samples")));
        }
        table
            .chunks_exact(4)
            .take(frames as usize)
            .map(|c| u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
            .sum()
    };
    if total > file_len {
        return Err(invalid(format!("{frames} samples of {total} bytes in a file of {file_len}")));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn bx(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut out = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(body);
        out
    }

    fn full(version: u8, rest: &[u8]) -> Vec<u8> {
        let mut out = vec![version, 0, 0, 0];
        out.extend_from_slice(rest);
        out
    }

    fn be(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    /// A minimal MP4 with one video track: `frames` samples of `sample` bytes, timescale / delta fps,
    /// an optional edit list, `stts` entries as given.
    pub(crate) struct Clip {
        pub frames: u32,
        pub sample: u32,
        pub timescale: u32,
        pub stts: Vec<(u32, u32)>,
        pub elst: Option<(i32, u32)>,
        pub matrix_a: u32,
        pub codec: [u8; 4],
        pub mdat: usize,
    }

    impl Default for Clip {
        fn default() -> Clip {
            Clip {
                frames: 20,
                sample: 10,
                timescale: 10240,
                stts: vec![(20, 1024)],
                elst: Some((0, 0x10000)),
                matrix_a: 0x10000,
                codec: *b"mp4v",
                mdat: 200,
            }
        }
    }

    impl Clip {
        pub(crate) fn bytes(&self) -> Vec<u8> {
            let mut matrix = be(&[self.matrix_a, 0, 0, 0, 0x10000, 0, 0, 0, 0x4000_0000]);
            let mut tkhd = be(&[0, 0, 1, 0, 2000, 0, 0, 0, 0]);
            tkhd.append(&mut matrix);
            tkhd.extend(be(&[64 << 16, 48 << 16]));
            let mut trak = bx(b"tkhd", &full(0, &tkhd[..]));
            if let Some((t, rate)) = self.elst {
                trak.extend(bx(b"edts", &bx(b"elst", &full(0, &be(&[1, 2000, t as u32, rate])))));
            }
            let mut entry = vec![0u8; 6];
            entry.extend([0, 1]);
            entry.extend([0u8; 16]);
            entry.extend(64u16.to_be_bytes());
            entry.extend(48u16.to_be_bytes());
            entry.extend([0u8; 50]);
            let stsd = full(0, &[be(&[1]), bx(&self.codec, &entry)].concat());
            let stts = full(
                0,
                &[be(&[self.stts.len() as u32]), self.stts.iter().flat_map(|&(c, d)| be(&[c, d])).collect()].concat(),
            );
            let stsz = full(0, &be(&[self.sample, self.frames]));
            let stbl = [bx(b"stsd", &stsd), bx(b"stts", &stts), bx(b"stsz", &stsz)].concat();
            let minf = bx(b"minf", &bx(b"stbl", &stbl));
            let mdhd = bx(b"mdhd", &full(0, &be(&[0, 0, self.timescale, 20480, 0])));
            let hdlr = bx(b"hdlr", &full(0, &[be(&[0]), b"vide".to_vec(), vec![0; 13]].concat()));
            trak.extend(bx(b"mdia", &[mdhd, hdlr, minf].concat()));
            let moov = bx(b"moov", &bx(b"trak", &trak));
            [bx(b"ftyp", b"isom\0\0\x02\0isomiso2mp41"), bx(b"mdat", &vec![0; self.mdat]), moov].concat()
        }
    }

    #[test]
    fn a_plain_clip_gives_count_rate_and_size() {
        let v = probe(&Clip::default().bytes()).unwrap();
        assert_eq!(v, Mp4Video { frames: 20, fps: 10.0, width: 64, height: 48, codec: *b"mp4v" });
        let ntsc = Clip { timescale: 11988, stts: vec![(20, 400)], ..Clip::default() };
        assert_eq!(probe(&ntsc.bytes()).unwrap().fps, 29.97);
        assert_eq!(probe(&Clip { elst: None, ..Clip::default() }.bytes()).unwrap().frames, 20);
    }

    #[test]
    fn what_the_tables_cannot_say_exactly_is_refused_with_a_reason() {
        let label = |c: Clip| probe(&c.bytes()).unwrap_err().label();
        assert_eq!(label(Clip { elst: Some((1024, 0x10000)), ..Clip::default() }), "video_timeline");
        assert_eq!(label(Clip { elst: Some((0, 0x20000)), ..Clip::default() }), "video_timeline");
        assert_eq!(label(Clip { stts: vec![(10, 1024), (10, 2048)], ..Clip::default() }), "video_timeline");
        assert_eq!(label(Clip { matrix_a: 0, ..Clip::default() }), "video_timeline");
        assert_eq!(label(Clip { codec: *b"mjpa", ..Clip::default() }), "video_codec");
        assert_eq!(label(Clip { stts: vec![(19, 1024)], ..Clip::default() }), "video_invalid");
        assert_eq!(label(Clip { timescale: 0, ..Clip::default() }), "video_invalid");
    }

    #[test]
    fn a_header_declaring_a_billion_frames_is_refused_without_allocating() {
        let huge = Clip { frames: 1_000_000_000, stts: vec![(1_000_000_000, 1024)], sample: 1, ..Clip::default() };
        let err = probe(&huge.bytes()).unwrap_err();
        assert_eq!(err.label(), "video_invalid", "{err}");
        assert!(err.to_string().contains("1000000000 samples"), "{err}");
    }

    #[test]
    fn truncated_and_overrunning_boxes_are_errors_never_panics() {
        let bytes = Clip::default().bytes();
        for cut in 0..bytes.len() {
            let _ = probe(&bytes[..cut]);
        }
        let mut lying = bytes.clone();
        lying[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(probe(&lying).unwrap_err().label(), "video_invalid");
        assert!(is_iso_bmff(&bytes) && !is_iso_bmff(b"\x1aE\xdf\xa3webm"));
    }
}
