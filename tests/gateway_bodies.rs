//! The whole request body is read before routing and reaches the backend byte for byte, at
//! every size up to the limit, streaming and not, over HTTP/1.1 and h2c.

mod common;

use common::{chat_body, client, config_yaml, fnv64, pool, Behavior, Gateway, TestBackend};

async fn roundtrip(gw: &Gateway, backend: &TestBackend, size: usize, stream: bool, h2c: bool) {
    let body = chat_body(size, stream);
    let before = backend.requests();
    let resp = client(h2c)
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap_or_else(|e| panic!("size {size} stream {stream} h2c {h2c}: {e}"));
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "size {size} stream {stream} h2c {h2c}: {text}");
    if stream {
        assert!(text.contains("data: [DONE]"), "stream not complete: {text}");
    } else {
        assert!(text.contains("\"chat.completion\""), "{text}");
    }
    assert_eq!(backend.requests(), before + 1);
    let last = *backend.state.seen.bodies.lock().unwrap().last().unwrap();
    assert_eq!(
        last,
        (body.len(), fnv64(&body)),
        "body changed in transit (size {size})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_every_size_arrive_intact() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    for size in [1 << 10, 100 << 10, 5 << 20, 30 << 20] {
        for stream in [false, true] {
            for h2c in [false, true] {
                roundtrip(&gw, &backend, size, stream, h2c).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_upload_arrives_intact() {
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        "",
    ));
    let body = chat_body(300 << 10, true);
    // A streamed request body has no Content-Length: HTTP/1.1 sends it chunked.
    let parts: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(7000).map(|c| Ok(c.to_vec())).collect();
    let resp = client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(parts)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("[DONE]"));
    let last = *backend.state.seen.bodies.lock().unwrap().last().unwrap();
    assert_eq!(last, (body.len(), fnv64(&body)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_after_a_long_prompt_is_still_routed() {
    // The OpenAI SDK serialises `messages` before `model`: with a 5 MiB prompt the model name
    // is at the very end of the body. Two pools prove the right one is chosen.
    let a = TestBackend::start("a", Behavior::default()).await;
    let b = TestBackend::start("b", Behavior::default()).await;
    let pools = format!(
        "{}{}",
        pool("m", "round_robin", &[a.url()]),
        pool("other", "round_robin", &[b.url()])
    );
    let gw = Gateway::start(&config_yaml(&pools, ""));
    let filler = "x".repeat(5 << 20);
    let body = serde_json::to_vec(&serde_json::json!({
        "messages": [{"role": "user", "content": filler}], "model": "other", "stream": false
    }))
    .unwrap();
    let resp = client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!((a.requests(), b.requests()), (0, 1));
}
