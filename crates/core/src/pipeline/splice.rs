//! The uuid splice: each exact image's `uuid` written into the body bytes as received, so vLLM names the
//! image as the router does, without re-serialising the body (every other byte stays as sent).

use std::ops::Range;

use crate::pipeline::output::PlannedImage;

/// The body with each exact image's `uuid` written in (vLLM then names the image as the router does);
/// every other byte stays as received.
pub fn splice_uuids(body: &[u8], images: &[PlannedImage]) -> Vec<u8> {
    let pieces = spliced_pieces(body, images);
    let mut out = Vec::with_capacity(body.len() + 80 * images.len());
    for piece in &pieces {
        out.extend_from_slice(piece.bytes());
    }
    out
}

/// One piece of a spliced body: bytes of the body as received, or a uuid written in.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'b> {
    Received(&'b [u8]),
    Uuid(String),
}

impl Piece<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Piece::Received(b) => b,
            Piece::Uuid(text) => text.as_bytes(),
        }
    }
}

/// [`splice_uuids`]'s body as the pieces it is made of, in order, for a caller that sends them without
/// joining them (the received ones are subslices of `body`).
pub fn spliced_pieces<'b>(body: &'b [u8], images: &[PlannedImage]) -> Vec<Piece<'b>> {
    let mut edits: Vec<(Range<usize>, String)> = images
        .iter()
        .filter_map(|img| {
            let splice = img.splice.as_ref()?;
            Some(match &splice.existing {
                Some(value) => (value.clone(), format!("\"{}\"", img.hash)),
                None => (splice.image_url.end..splice.image_url.end, format!(",\"uuid\":\"{}\"", img.hash)),
            })
        })
        .collect();
    edits.sort_by_key(|(r, _)| r.start);
    let mut pieces = Vec::with_capacity(2 * edits.len() + 1);
    let mut at = 0;
    for (range, text) in edits {
        pieces.push(Piece::Received(&body[at..range.start]));
        pieces.push(Piece::Uuid(text));
        at = range.end;
    }
    pieces.push(Piece::Received(&body[at..]));
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::output::UuidSplice;
    use crate::request::{Endpoint, Request};

    fn image(hash: &str, splice: Option<UuidSplice>) -> PlannedImage {
        PlannedImage { hash: hash.into(), splice, width: 1, height: 1, feature_tokens: 1, tokens: 1, video: None }
    }

    #[test]
    fn uuids_are_spliced_in_and_client_ones_replaced() {
        let body = br#"{"messages":[{"content":[{"type":"image_url","image_url":{"url":"a"}},{"type":"image_url","uuid":"evil","image_url":"b"}]}]}"#;
        let req = Request::parse(Endpoint::Chat, body).unwrap();
        let splices: Vec<UuidSplice> = req
            .images
            .iter()
            .map(|i| UuidSplice { image_url: i.image_url_span.clone(), existing: i.uuid_span.clone() })
            .collect();
        let images = [image("aaaa", Some(splices[0].clone())), image("bbbb", Some(splices[1].clone()))];
        let out = String::from_utf8(splice_uuids(body, &images)).unwrap();
        assert_eq!(
            out,
            r#"{"messages":[{"content":[{"type":"image_url","image_url":{"url":"a"},"uuid":"aaaa"},{"type":"image_url","uuid":"bbbb","image_url":"b"}]}]}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(parsed["messages"][0]["content"][1]["uuid"], "bbbb");
        // A trusted client uuid (no splice) leaves the body as received.
        assert_eq!(splice_uuids(body, &[image("evil", None)]), body.to_vec());
    }
}
