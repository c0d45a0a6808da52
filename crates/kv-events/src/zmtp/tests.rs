//! Decoder and handshake tests, including the hostile inputs of issue 20 and proptest fuzzing of the
//! decoder (arbitrary and mutated streams, random read splits).

use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::codec::{self, Decoder, Item, READ_CHUNK};
use super::*;

fn limits() -> Limits {
    Limits {
        max_frame_bytes: 64 * 1024,
        max_message_bytes: 96 * 1024,
        max_frames: 4,
        max_command_bytes: 512,
        handshake_timeout: Duration::from_millis(300),
    }
}

/// The most a decoder with `l` may hold: the input buffer, one message, and the frame list.
fn bound(l: &Limits) -> usize {
    READ_CHUNK + l.max_message_bytes + 4 * l.max_frames * std::mem::size_of::<Bytes>()
}

/// A peer's greeting followed by its READY (as a PUB).
fn server_hello(socket_type: &str) -> Vec<u8> {
    let mut out = codec::greeting().to_vec();
    codec::encode_command(&mut out, b"READY", &codec::ready_body(&[("Socket-Type", socket_type.as_bytes())]));
    out
}

/// Feeds `data` to `dec` in reads of the given sizes (cycled), checking the bound after every step.
/// Returns the items decoded and the error that stopped decoding, if any.
fn run(dec: &mut Decoder, l: &Limits, data: &[u8], splits: &[usize]) -> (Vec<Item>, Option<ZmtpError>) {
    let mut items = Vec::new();
    let mut pos = 0;
    let mut split = splits.iter().copied().cycle();
    loop {
        match dec.next_item() {
            Ok(Some(item)) => {
                items.push(item);
                continue;
            }
            Ok(None) => {}
            Err(e) => return (items, Some(e)),
        }
        assert!(dec.held_bytes() <= bound(l), "holds {} > {}", dec.held_bytes(), bound(l));
        if pos == data.len() {
            return (items, None);
        }
        let buf = dec.read_buf();
        assert!(!buf.is_empty(), "read_buf must not be empty when input is needed");
        let n = buf.len().min(data.len() - pos).min(split.next().unwrap_or(usize::MAX).max(1));
        buf[..n].copy_from_slice(&data[pos..pos + n]);
        dec.filled(n);
        pos += n;
    }
}

fn decode(data: &[u8]) -> (Vec<Item>, Option<ZmtpError>) {
    let l = limits();
    run(&mut Decoder::new(l), &l, data, &[usize::MAX])
}

fn messages(items: &[Item]) -> Vec<Vec<Bytes>> {
    items.iter().filter_map(|i| if let Item::Message(m) = i { Some(m.clone()) } else { None }).collect()
}

fn encoded(msgs: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let mut out = server_hello("PUB");
    for m in msgs {
        codec::encode_message(&mut out, &m.iter().map(Vec::as_slice).collect::<Vec<_>>());
    }
    out
}

#[test]
fn decodes_greeting_ready_and_messages() {
    let big = vec![7u8; 40_000]; // long frame, read into its own buffer
    let data = encoded(&[vec![b"topic".to_vec(), 5u64.to_be_bytes().to_vec(), big.clone()], vec![vec![]]]);
    let (items, err) = decode(&data);
    assert_eq!(err, None);
    assert_eq!(items[0], Item::Greeting(codec::Greeting { major: 3, minor: 0 }));
    assert!(matches!(&items[1], Item::Command { name, .. } if name.as_ref() == b"READY"));
    let msgs = messages(&items);
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0][2].as_ref(), big.as_slice());
    assert_eq!(msgs[1], vec![Bytes::new()]);
}

/// `data` after a valid greeting + READY: the error it must produce, with the decoder staying bounded.
fn hostile(tail: &[u8]) -> ZmtpError {
    let mut data = server_hello("PUB");
    data.extend_from_slice(tail);
    let (_, err) = decode(&data);
    err.expect("must be refused")
}

fn repeat(chunk: &[u8], total: usize) -> Vec<u8> {
    chunk.iter().copied().cycle().take(total).collect()
}

#[test]
fn hostile_headers_are_refused_before_allocating() {
    let huge = [0x02, 0x40, 0, 0, 0, 0, 0, 0, 0]; // long frame of 2^62 bytes: 9 bytes on the wire
    assert_eq!(hostile(&huge), ZmtpError::FrameTooLarge(1 << 62));
    let mut half_gib = vec![0x02, 0, 0, 0, 0, 0x20, 0, 0, 0];
    half_gib.extend_from_slice(&[0xAB; 10_000]);
    assert_eq!(hostile(&half_gib).label(), "frame_too_large");
    // A message that never ends: MORE on every frame.
    assert_eq!(hostile(&repeat(&[0x01, 0x03, 1, 2, 3], 1 << 20)).label(), "too_many_frames");
    // 20 MB of empty MORE frames.
    assert_eq!(hostile(&repeat(&[0x01, 0x00], 20 << 20)).label(), "too_many_frames");
    // Frames within the frame limit that add up past the message limit.
    let mut parts = Vec::new();
    for _ in 0..2 {
        codec::encode_frame(&mut parts, &[0; 60_000], true, false);
    }
    assert_eq!(hostile(&parts).label(), "message_too_large");
    assert_eq!(hostile(&[0x06, 0, 0, 0, 0, 0, 0, 0x10, 0]).label(), "command_too_large");
    assert_eq!(hostile(&[0x80, 0]).label(), "bad_frame");
    assert_eq!(hostile(&[0x01, 0x01, 9, 0x04, 0x00]).label(), "bad_frame", "command inside a message");
}

#[test]
fn bad_greetings() {
    let label = |g: Vec<u8>| decode(&g).1.expect("refused").label();
    assert_eq!(label(b"HTTP/1.1 200 OK\r\n\r\n".to_vec()), "bad_greeting");
    let mut v2 = codec::greeting().to_vec();
    v2[10] = 2;
    assert_eq!(label(v2), "bad_greeting");
    let mut curve = codec::greeting().to_vec();
    curve[12..17].copy_from_slice(b"CURVE");
    assert_eq!(label(curve), "bad_greeting");
    let mut no_7f = codec::greeting().to_vec();
    no_7f[9] = 0;
    assert_eq!(label(no_7f), "bad_greeting");
    // Padding is not significant (libzmq sends a 1 in byte 8); minor 1 is fine.
    let mut libzmq = codec::greeting().to_vec();
    libzmq[8] = 1;
    libzmq[11] = 1;
    assert_eq!(decode(&libzmq).1, None);
}

#[test]
fn ready_metadata() {
    let body = codec::ready_body(&[("Socket-Type", b"PUB"), ("Identity", b"")]);
    assert_eq!(codec::ready_property(&body, "socket-type").unwrap(), Some(&b"PUB"[..]));
    assert_eq!(codec::ready_property(&body, "Identity").unwrap(), Some(&b""[..]));
    assert_eq!(codec::ready_property(&body, "X").unwrap(), None);
    assert_eq!(codec::ready_property(&body[..body.len() - 6], "Identity").unwrap_err().label(), "bad_handshake");
}

/// Runs our side of the handshake against a scripted peer on an in-memory pipe.
async fn pair(ty: SocketType) -> (Result<ZmtpSocket<DuplexStream>, ZmtpError>, DuplexStream) {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let socket = ZmtpSocket::handshake(ours, ty, b"kv", limits());
    (socket.await, theirs)
}

#[tokio::test]
async fn handshake_sends_greeting_ready_and_subscription() {
    let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
    theirs.write_all(&server_hello("XPUB")).await.unwrap();
    let mut socket = ZmtpSocket::handshake(ours, SocketType::Sub, b"kv", limits()).await.unwrap();
    let mut peer = Decoder::new(limits());
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let n = theirs.read(peer.read_buf()).await.unwrap();
        peer.filled(n);
        while let Some(item) = peer.next_item().unwrap() {
            seen.push(item);
        }
    }
    assert!(matches!(seen[0], Item::Greeting(codec::Greeting { major: 3, minor: 0 })));
    let Item::Command { name, body } = &seen[1] else { panic!("{:?}", seen[1]) };
    assert_eq!(name.as_ref(), b"READY");
    assert_eq!(codec::ready_property(body, "Socket-Type").unwrap(), Some(&b"SUB"[..]));
    assert_eq!(seen[2], Item::Message(vec![Bytes::from_static(b"\x01kv")]));

    // PING is answered with PONG (context echoed), then data flows.
    let mut tail = Vec::new();
    codec::encode_command(&mut tail, b"PING", b"\x00\x0actx");
    codec::encode_command(&mut tail, b"UNKNOWN", b"ignored");
    codec::encode_message(&mut tail, &[b"t", b"p"]);
    theirs.write_all(&tail).await.unwrap();
    assert_eq!(socket.recv().await.unwrap(), vec![Bytes::from_static(b"t"), Bytes::from_static(b"p")]);
    assert!(socket.held_bytes() <= bound(&limits()));
    let mut pong = Vec::new();
    codec::encode_command(&mut pong, b"PONG", b"ctx");
    let mut got = vec![0; pong.len()];
    let recv = tokio::spawn(async move { socket.recv().await });
    theirs.read_exact(&mut got).await.unwrap();
    assert_eq!(got, pong);
    let mut error = Vec::new();
    codec::encode_command(&mut error, b"ERROR", b"\x03bye");
    theirs.write_all(&error).await.unwrap();
    assert_eq!(recv.await.unwrap().unwrap_err(), ZmtpError::PeerError("bye".into()));
}

#[tokio::test]
async fn handshake_failures() {
    let (res, theirs) = pair(SocketType::Sub).await; // silent peer
    assert_eq!(res.err().unwrap().label(), "handshake_timeout");
    drop(theirs);

    let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
    theirs.write_all(&server_hello("ROUTER")).await.unwrap();
    let res = ZmtpSocket::handshake(ours, SocketType::Sub, b"", limits()).await;
    assert_eq!(res.err().unwrap().label(), "bad_handshake");

    let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
    let mut hello = codec::greeting().to_vec();
    codec::encode_message(&mut hello, &[b"data before READY"]);
    theirs.write_all(&hello).await.unwrap();
    let res = ZmtpSocket::handshake(ours, SocketType::Dealer, b"", limits()).await;
    assert_eq!(res.err().unwrap().label(), "bad_handshake");

    let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
    theirs.write_all(&server_hello("ROUTER")).await.unwrap();
    let mut dealer = ZmtpSocket::handshake(ours, SocketType::Dealer, b"", limits()).await.unwrap();
    theirs.write_all(&[0x02, 0x40, 0, 0, 0, 0, 0, 0, 0]).await.unwrap();
    assert_eq!(dealer.recv().await.unwrap_err().label(), "frame_too_large");
    assert!(dealer.held_bytes() <= bound(&limits()));
    drop(theirs);
}

/// Arbitrary messages within the limits.
fn valid_messages() -> impl Strategy<Value = Vec<Vec<Vec<u8>>>> {
    let frame = prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..300),
        1 => (0usize..20_000).prop_map(|n| vec![0x5A; n]),
    ];
    proptest::collection::vec(proptest::collection::vec(frame, 1..=4), 0..6)
}

fn splits() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(1usize..20_000, 1..8)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Valid streams decode to exactly what was sent, whatever the read boundaries.
    #[test]
    fn valid_streams_round_trip(msgs in valid_messages(), splits in splits()) {
        let l = limits();
        let (items, err) = run(&mut Decoder::new(l), &l, &encoded(&msgs), &splits);
        prop_assert_eq!(err, None);
        let want: Vec<Vec<Bytes>> =
            msgs.iter().map(|m| m.iter().map(|f| Bytes::copy_from_slice(f)).collect()).collect();
        prop_assert_eq!(messages(&items), want);
    }

    /// Mutated valid streams: no panic, bounded memory, and either items or a typed error.
    #[test]
    fn mutated_streams_stay_bounded(
        msgs in valid_messages(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..12),
        splits in splits(),
    ) {
        let mut data = encoded(&msgs);
        for (at, byte) in flips {
            let at = at % data.len();
            data[at] = byte;
        }
        let l = limits();
        let (_, err) = run(&mut Decoder::new(l), &l, &data, &splits);
        if let Some(e) = err {
            prop_assert!(e.is_violation(), "{e:?}");
        }
    }

    /// Arbitrary bytes after a valid greeting + READY.
    #[test]
    fn arbitrary_frames_stay_bounded(tail in proptest::collection::vec(any::<u8>(), 0..4096), splits in splits()) {
        let mut data = server_hello("PUB");
        data.extend_from_slice(&tail);
        let l = limits();
        let _ = run(&mut Decoder::new(l), &l, &data, &splits);
    }

    /// Arbitrary bytes from the first one.
    #[test]
    fn arbitrary_streams_stay_bounded(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let l = limits();
        let _ = run(&mut Decoder::new(l), &l, &data, &[7]);
    }
}
