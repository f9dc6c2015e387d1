//! The frame reader over real TCP sockets: frames dribbled in small pieces with pauses, a
//! timeout cancelling the read between pieces, and every message still decoded.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::*;
use pronto_core::kv_index::{decode_message, encode_message as encode_batch, Encoding, KvEvent};

/// A connected pair over 127.0.0.1: (the publisher's end, a reader on the subscriber's end).
async fn pair() -> (TcpStream, FrameReader<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let client = client.unwrap();
    client.set_nodelay(true).unwrap();
    let (server, _) = accepted.unwrap();
    server.set_nodelay(true).unwrap();
    (server, FrameReader::new(client))
}

/// Event batches, both encodings, small and large (one frame over 255 bytes: the long form).
fn batches() -> Vec<(u64, Vec<KvEvent>, Encoding)> {
    (0..12u64)
        .map(|seq| {
            let n = if seq == 5 { 96 } else { 1 + seq as usize % 3 };
            let events = vec![
                KvEvent::BlockStored {
                    block_hashes: (0..n as u64).map(|h| seq * 1000 + h).collect(),
                    parent: (seq > 0).then_some(seq),
                    token_ids: (0..(n * 16) as u32).collect(),
                    block_size: Some(16),
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![seq],
                },
            ];
            let enc = if seq % 2 == 0 {
                Encoding::Map
            } else {
                Encoding::Array
            };
            (seq, events, enc)
        })
        .collect()
}

#[tokio::test]
async fn dribbled_frames_survive_cancelled_reads_and_all_decode() {
    let (mut publisher, mut reader) = pair().await;
    let sent = batches();
    let mut wire = Vec::new();
    // A command frame (a late PING, say) between messages is skipped.
    wire.extend_from_slice(&encode_frame_head(COMMAND, 5));
    wire.extend_from_slice(b"\x04PING");
    for (seq, events, enc) in &sent {
        let frames = encode_batch(b"kv", *seq, 0.5, events, *enc);
        wire.extend_from_slice(&encode_message(&frames));
    }
    assert!(wire.len() > 2000, "a long frame is in there");

    // The publisher writes 1..=6 bytes at a time, each piece only once the reader has had
    // a go at the previous one, so reads are cancelled between pieces over and over.
    let (go_tx, mut go_rx) = mpsc::unbounded_channel::<()>();
    let writer = tokio::spawn(async move {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut rest = &wire[..];
        while !rest.is_empty() {
            if go_rx.recv().await.is_none() {
                return;
            }
            let n = rng.gen_range(1..=6).min(rest.len());
            publisher.write_all(&rest[..n]).await.unwrap();
            rest = &rest[n..];
        }
        // Keep the connection open until the reader is done.
        let _ = go_rx.recv().await;
    });

    let mut got = Vec::new();
    let (mut cancelled, mut cancelled_mid_frame) = (0, 0);
    for _ in 0..20_000 {
        if got.len() == sent.len() {
            break;
        }
        go_tx.send(()).unwrap();
        match tokio::time::timeout(Duration::from_millis(2), reader.next_message()).await {
            Ok(message) => got.push(message.unwrap()),
            Err(_) => {
                cancelled += 1;
                if reader.buffered() > 0 || !reader.partial.is_empty() {
                    cancelled_mid_frame += 1;
                }
            }
        }
    }
    drop(go_tx);
    writer.await.unwrap();

    assert_eq!(got.len(), sent.len(), "every message arrived");
    for (frames, (seq, events, _)) in got.iter().zip(&sent) {
        assert_eq!(frames.len(), 3);
        assert_eq!(&frames[0][..], b"kv");
        let batch = decode_message(frames).expect("decodes");
        assert_eq!(batch.seq, *seq);
        assert_eq!(&batch.events, events);
    }
    assert!(cancelled > sent.len(), "{cancelled} cancellations");
    assert!(
        cancelled_mid_frame > 0,
        "no read was cancelled with a partial frame or message held"
    );
    assert_eq!(reader.buffered(), 0);
}

#[tokio::test]
async fn the_greeting_and_frames_cut_anywhere_are_read_whole_after_a_cancelled_read() {
    let mut wire = greeting().to_vec();
    wire.extend_from_slice(&encode_message(&[&b"a"[..], &[7u8; 300][..]]));
    // Cuts inside the greeting, the short frame, the long frame's 8-byte size and its body.
    for cut in [1, 10, 63, 64, 65, 66, 67, 70, 75, 76, 200, wire.len() - 1] {
        let (mut p, mut r) = pair().await;
        p.write_all(&wire[..cut]).await.unwrap();
        let short = Duration::from_millis(5);
        if cut < 64 {
            let cancelled = tokio::time::timeout(short, r.greeting()).await;
            assert!(cancelled.is_err(), "greeting incomplete at {cut}");
            p.write_all(&wire[cut..]).await.unwrap();
            assert_eq!(r.greeting().await.unwrap(), greeting(), "cut at {cut}");
        } else {
            assert_eq!(r.greeting().await.unwrap(), greeting(), "cut at {cut}");
            let cancelled = tokio::time::timeout(short, r.next_message()).await;
            assert!(cancelled.is_err(), "message incomplete at {cut}");
            p.write_all(&wire[cut..]).await.unwrap();
        }
        let m = r.next_message().await.unwrap();
        assert_eq!(m.len(), 2, "cut at {cut}");
        assert_eq!(&m[0][..], b"a", "cut at {cut}");
        assert_eq!(&m[1][..], &[7u8; 300][..], "cut at {cut}");
        assert_eq!(r.buffered(), 0);
    }
}

#[tokio::test]
async fn protocol_errors_and_end_of_stream_are_errors() {
    // A frame larger than the limit is refused from its header alone.
    let (mut p, mut r) = pair().await;
    let mut head = vec![LONG];
    head.extend_from_slice(&(MAX_FRAME_BYTES + 1).to_be_bytes());
    p.write_all(&head).await.unwrap();
    let e = r.next_message().await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);

    // More frames than a message may have.
    let (mut p, mut r) = pair().await;
    let frames: Vec<&[u8]> = vec![b"x"; MAX_FRAMES + 1];
    p.write_all(&encode_message(&frames)).await.unwrap();
    assert_eq!(
        r.next_message().await.unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );

    // The publisher goes away mid-frame.
    let (mut p, mut r) = pair().await;
    p.write_all(&[0, 10, 1, 2, 3]).await.unwrap();
    drop(p);
    assert_eq!(
        r.next_message().await.unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
}
