//! The gateway's bookkeeping follows the one routing core's rules, seen from outside: a
//! prompt's prefix is recorded when it is dispatched, a non-streamed request leaves prefill by
//! its predicted TTFT, and the TTFT model learns at the first token, not at the stream's end.

mod common;

use std::time::Duration;

use common::{
    admin_backends, chat_body, client, config_yaml, metric_value, pool, Behavior, Gateway,
    TestBackend,
};
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_is_recorded_at_dispatch_so_a_repeat_follows_it_before_the_first_answer() {
    // Non-streamed answers take 2 s: the first request's head arrives long after the repeat.
    let slow = Behavior {
        header_delay: Duration::from_secs(2),
        ..Behavior::default()
    };
    let a = TestBackend::start("a", slow.clone()).await;
    let b = TestBackend::start("b", slow).await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "cache_aware", &[a.url(), b.url()]),
        "explain_headers: true\n",
    ));
    let body = chat_body(20_000, false);
    let first = {
        let (c, url, body) = (client(false), gw.url("/v1/chat/completions"), body.clone());
        tokio::spawn(async move { c.post(url).body(body).send().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(body)
        .send()
        .await
        .unwrap();
    let first = first.await.unwrap();
    let backend = |r: &reqwest::Response| {
        r.headers()["x-pronto-backend"]
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(first.status(), 200);
    assert_eq!(second.status(), 200);
    assert_eq!(
        backend(&first),
        backend(&second),
        "the repeat went where the prompt was already sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_non_streamed_request_leaves_prefill_by_its_predicted_ttft() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            header_delay: Duration::from_secs(4),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "predicted_ttft", &[backend.url()]),
        "",
    ));
    let req = {
        let (c, url) = (client(false), gw.url("/v1/chat/completions"));
        tokio::spawn(async move {
            c.post(url)
                .body(chat_body(8_000, false))
                .send()
                .await
                .unwrap()
        })
    };
    // The prior predicts well under a second for ~2k tokens on an idle backend; the answer
    // takes 4 s. Halfway, the request is in flight and decoding, not queued prefill.
    let mut seen = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let b = &admin_backends(&gw).await[0];
        if b["inflight"] == 1 && b["outstanding_prefill_tokens"] == 0 {
            seen = Some(b.clone());
            break;
        }
    }
    let b = seen.expect("the prefill charge ended while the request was still in flight");
    assert_eq!(b["running_decodes"], 1, "{b}");
    assert_eq!(req.await.unwrap().status(), 200);
    let b = &admin_backends(&gw).await[0];
    assert_eq!(
        (b["inflight"].as_u64(), b["running_decodes"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_learns_at_the_first_token_not_at_the_end_of_the_stream() {
    let backend = TestBackend::start(
        "b",
        Behavior {
            tokens: 40,
            token_delay: Duration::from_millis(100),
            ..Behavior::default()
        },
    )
    .await;
    let gw = Gateway::start(&config_yaml(
        &pool("m", "predicted_ttft", &[backend.url()]),
        "",
    ));
    let r = client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(chat_body(2_000, true))
        .send()
        .await
        .unwrap();
    let mut s = r.bytes_stream();
    // Past the role chunk and the first token, with ~3.5 s of the stream still to come.
    let mut text = String::new();
    while !text.contains("\"content\"") {
        text.push_str(&String::from_utf8_lossy(&s.next().await.unwrap().unwrap()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = reqwest::get(gw.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for family in [
        "pronto_ttft_seconds_count",
        "pronto_ttft_prediction_error_seconds_count",
        "pronto_ttft_prediction_abs_error_seconds_count",
    ] {
        assert_eq!(
            metric_value(&m, &format!("{family}{{backend=\"m-b0\"}}")),
            Some(1.0),
            "{family} while the stream is still running"
        );
    }
    let b = &admin_backends(&gw).await[0];
    assert_eq!(
        (b["inflight"].as_u64(), b["running_decodes"].as_u64()),
        (Some(1), Some(1))
    );
    while s.next().await.is_some() {}
}
