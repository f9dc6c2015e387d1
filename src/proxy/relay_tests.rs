//! The relay's writes to the client, counted at the socket: a response head goes out with its
//! first chunk, what the backend already sent goes out together, and a chunk is never kept
//! waiting for the next.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::v1::client::HttpSession as Http1Session;
use pingora_core::protocols::http::ServerSession;
use pingora_http::RequestHeader;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::Notify;

use super::*;
use crate::backend::Backend;
use crate::coalesce::Coalesce;
use crate::proxy::test_io::Recorder;
use crate::telemetry::Metrics;
use pronto_core::ids::BackendId;
use pronto_core::load::RequestLoad;

/// The relay's two ends, and the pipes that feed them.
struct Ends {
    client: ServerSession,
    /// Kept open: the client has not hung up.
    _client_pipe: DuplexStream,
    writes: Arc<Mutex<Vec<Vec<u8>>>>,
    wrote: Arc<Notify>,
    up: HttpSession,
    /// Where the test writes what the backend sends.
    backend: DuplexStream,
}

async fn ends() -> Ends {
    let (reads, mut client_pipe) = tokio::io::duplex(64 * 1024);
    client_pipe
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    let (writes, wrote) = (Arc::default(), Arc::new(Notify::new()));
    let recorder = Recorder {
        reads,
        writes: Arc::clone(&writes),
        wrote: Arc::clone(&wrote),
    };
    let stream: pingora_core::protocols::Stream = Box::new(recorder);
    let mut client = ServerSession::new_http1(Box::new(Coalesce::new(stream)));
    assert!(client.read_request().await.unwrap());
    let (up_io, backend) = tokio::io::duplex(64 * 1024);
    let mut up = HttpSession::H1(Http1Session::new(Box::new(Coalesce::new(
        Box::new(up_io) as pingora_core::protocols::Stream
    ))));
    let req = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
    up.write_request_header(Box::new(req)).await.unwrap();
    Ends {
        client,
        _client_pipe: client_pipe,
        writes,
        wrote,
        up,
        backend,
    }
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                      transfer-encoding: chunked\r\n\r\n";

fn chunk(data: &str) -> Vec<u8> {
    format!("{:X}\r\n{data}\r\n", data.len()).into_bytes()
}

fn backend() -> Arc<Backend> {
    let cfg = crate::config::Backend {
        name: Arc::from("b0"),
        host: "127.0.0.1".into(),
        port: 1,
        tls: false,
        weight: 1,
        max_inflight: None,
        labels: BTreeMap::new(),
        kv_events: None,
        ca: None,
        api_key: None,
        profile: None,
        served_model_name: None,
    };
    Arc::new(Backend::new(
        BackendId(0),
        cfg,
        Duration::from_secs(1),
        Metrics::new(),
    ))
}

/// Read the upstream head and first chunk (as an attempt does), then relay the rest.
async fn relay(e: &mut Ends, metrics: &Metrics, backend: &Arc<Backend>) -> RelayOutcome {
    relay_with(e, metrics, backend, true, None).await
}

/// [`relay`] of an SSE stream or not, with a model name rewriter.
async fn relay_with(
    e: &mut Ends,
    metrics: &Metrics,
    backend: &Arc<Backend>,
    sse: bool,
    unrename: Option<Unrename>,
) -> RelayOutcome {
    e.up.read_response_header().await.unwrap();
    let head = e.up.response_header().unwrap().clone();
    let first = e.up.read_response_body().await.unwrap();
    let body_done = e.up.response_done();
    let mut guard = backend.start_request(RequestLoad::default(), Instant::now(), true, None);
    let now = Instant::now();
    Relay {
        head: Some(client_response_head(&head, &[]).unwrap()),
        unrename,
        held_first_token_at: None,
        first_chunk: first,
        body_done,
        sse,
        idle: Duration::from_secs(30),
        observer: FirstTokenObserver {
            metrics,
            pool: "m",
            guard: &mut guard,
            inputs: Default::default(),
            predicted_s: None,
            sent_at: now,
            arrived: now,
        },
        request_id: "r",
        splice: None,
    }
    .run(&mut e.client, &mut e.up)
    .await
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn what_the_backend_sent_at_once_reaches_the_client_in_one_write() {
    rt().block_on(async {
        let mut e = ends().await;
        let events = [
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: [DONE]\n\n",
        ];
        let mut wire = HEAD.to_vec();
        wire.extend(chunk(events[0]));
        wire.extend(chunk(events[1]));
        wire.extend(b"0\r\n\r\n");
        e.backend.write_all(&wire).await.unwrap();
        let (metrics, b) = (Metrics::new(), backend());
        let out = relay(&mut e, &metrics, &b).await;
        assert_eq!(out.end, RelayEnd::Complete);
        assert_eq!(out.output_events, 1);
        let writes = e.writes.lock().unwrap().clone();
        assert_eq!(writes.len(), 1, "one write: {writes:?}");
        let text = String::from_utf8(writes[0].clone()).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        let body = text.split_once("\r\n\r\n").unwrap().1;
        let expected = [chunk(events[0]), chunk(events[1]), b"0\r\n\r\n".to_vec()].concat();
        assert_eq!(body.as_bytes(), expected);
    });
}

#[test]
fn a_chunk_is_not_held_back_waiting_for_the_next() {
    rt().block_on(async {
        let mut e = ends().await;
        let first = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
        let second = "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n";
        let mut wire = HEAD.to_vec();
        wire.extend(chunk(first));
        e.backend.write_all(&wire).await.unwrap();
        let (metrics, b) = (Metrics::new(), backend());
        let (writes, wrote) = (Arc::clone(&e.writes), Arc::clone(&e.wrote));
        let mut backend_pipe = std::mem::replace(&mut e.backend, tokio::io::duplex(1).0);
        // The backend sends its second event only once the client has the first: a relay that
        // waited for more before writing would never finish (the guard below fails the test).
        let backend_side = async {
            loop {
                let seen = writes.lock().unwrap().concat();
                if seen.ends_with(&chunk(first)) {
                    break;
                }
                wrote.notified().await;
            }
            let head_and_first = writes.lock().unwrap().clone();
            let mut rest = chunk(second);
            rest.extend(b"0\r\n\r\n");
            backend_pipe.write_all(&rest).await.unwrap();
            head_and_first
        };
        let (out, head_and_first) = tokio::time::timeout(
            Duration::from_secs(30),
            futures::future::join(relay(&mut e, &metrics, &b), backend_side),
        )
        .await
        .expect("the relay held the first chunk back");
        assert_eq!(out.end, RelayEnd::Complete);
        assert_eq!(out.output_events, 2);
        assert_eq!(head_and_first.len(), 1, "head and first chunk in one write");
        let writes = e.writes.lock().unwrap().clone();
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert_eq!(writes[1], [chunk(second), b"0\r\n\r\n".to_vec()].concat());
    });
}

#[test]
fn a_renamed_json_answer_loses_its_length_and_says_the_clients_model() {
    rt().block_on(async {
        let mut e = ends().await;
        let body = r#"{"id":"c","model":"/models/served","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
        let wire = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        e.backend.write_all(wire.as_bytes()).await.unwrap();
        let (metrics, b) = (Metrics::new(), backend());
        let unrename = Unrename::new("/models/served", bytes::Bytes::from_static(b"\"m\""));
        let out = relay_with(&mut e, &metrics, &b, false, Some(unrename)).await;
        assert_eq!(out.end, RelayEnd::Complete);
        assert_eq!(out.usage.map(|u| u.prompt_tokens), Some(3), "usage still read");
        let text = String::from_utf8(e.writes.lock().unwrap().concat()).unwrap();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap();
        assert!(!head.to_ascii_lowercase().contains("content-length"), "{head}");
        assert!(head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "{head}");
        let want = body.replace("/models/served", "m");
        assert_eq!(rest, String::from_utf8([chunk(&want), b"0\r\n\r\n".to_vec()].concat()).unwrap());
    });
}
