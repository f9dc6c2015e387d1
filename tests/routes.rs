//! Routes and SLO admission end to end: the gateway binary against in-process backends.

mod common;

use std::time::Duration;

use common::{config_yaml, metric_value, metrics_when, pool, Behavior, Gateway, TestBackend};

fn body(model: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4
    }))
    .unwrap()
}

/// Status, `x-pronto-backend`, `retry-after` and body of one chat request.
async fn send(gw: &Gateway, model: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .body(body(model));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    Reply {
        status: r.status().as_u16(),
        backend: header("x-pronto-backend"),
        retry_after: header("retry-after"),
        body: r.text().await.unwrap(),
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    backend: Option<String>,
    retry_after: Option<String>,
    body: String,
}

fn error_code(text: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    v["error"]["code"].as_str().unwrap().to_string()
}

/// Wait until the admin metric `name_labels` has value `want`.
async fn metric_reaches(gw: &Gateway, name_labels: &str, want: f64) {
    let m = metrics_when(gw, |m| metric_value(m, name_labels) == Some(want)).await;
    assert_eq!(metric_value(&m, name_labels), Some(want), "{name_labels}");
}

/// Wait until `backend` has received `n` requests.
async fn arrived(backend: &TestBackend, n: usize) {
    for _ in 0..500 {
        if backend.state.seen.headers.lock().unwrap().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend never saw {n} requests");
}

/// The `x-id` header of every request `backend` received, in arrival order.
fn arrival_ids(backend: &TestBackend) -> Vec<String> {
    backend
        .state
        .seen
        .headers
        .lock()
        .unwrap()
        .iter()
        .map(|h| h.get("x-id").unwrap().to_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_match_by_key_header_model_glob_in_order() {
    let (a, b, c) = (
        TestBackend::start("a", Behavior::default()).await,
        TestBackend::start("b", Behavior::default()).await,
        TestBackend::start("c", Behavior::default()).await,
    );
    let pools = [
        pool("pa", "round_robin", &[a.url()]),
        pool("pb", "round_robin", &[b.url()]),
        pool("pc", "round_robin", &[c.url()]),
    ]
    .concat();
    let routes = "explain_headers: true\nroutes:\n  \
        - {name: keyed, match: {api_keys: [sk-gold, sk-silver]}, pool: pc}\n  \
        - {name: tenant, match: {headers: {x-tenant: acme}}, pool: pb}\n  \
        - {name: llama, match: {model: 'llama-*'}, pool: pa}\n  \
        - {name: exact, match: {model: mistral, path: '/v1/chat/*'}, pool: pb}\n";
    let gw = Gateway::start(&config_yaml(&pools, routes));
    let to = |r: Reply| (r.status, r.backend.unwrap_or_default());
    assert_eq!(
        to(send(&gw, "llama-3-8b", &[]).await),
        (200, "pa-b0".into())
    );
    assert_eq!(
        to(send(&gw, "llama-3-8b", &[("x-tenant", "acme")]).await),
        (200, "pb-b0".into()),
        "an earlier route wins"
    );
    assert_eq!(
        to(send(&gw, "llama-3-8b", &[("authorization", "Bearer sk-silver")]).await),
        (200, "pc-b0".into())
    );
    assert_eq!(
        to(send(&gw, "llama-3-8b", &[("authorization", "Bearer sk-bronze")]).await),
        (200, "pa-b0".into()),
        "a wrong key does not match the keyed route"
    );
    assert_eq!(to(send(&gw, "mistral", &[]).await), (200, "pb-b0".into()));
    let miss = send(&gw, "gpt-4", &[]).await;
    assert_eq!(miss.status, 404);
    assert_eq!(error_code(&miss.body), "model_not_found");
    // Pool names are not models any more: /v1/models lists the routes' exact models.
    let models: serde_json::Value = reqwest::get(gw.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "mistral");
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_answers_429_with_retry_after_and_counts_it() {
    let fast = TestBackend::start("fast", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("fast", "round_robin", &[fast.url()]),
        // Any prediction (the cold prior alone is 20 ms) misses a 1 µs objective.
        "routes:\n  - {name: strict, pool: fast, ttft_slo: 1us, on_slo_miss: shed}\n",
    ));
    let r = send(&gw, "m", &[]).await;
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert_eq!(error_code(&r.body), "slo_overloaded");
    assert!(r.body.contains("strict"), "{}", r.body);
    assert_eq!(fast.requests(), 0);
    metric_reaches(
        &gw,
        "pronto_admission_sheds_total{reason=\"slo_miss\",route=\"strict\"}",
        1.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_serves_from_the_other_pool() {
    let fast = TestBackend::start("fast", Behavior::default()).await;
    let spare = TestBackend::start("spare", Behavior::default()).await;
    let pools = [
        pool("fast", "round_robin", &[fast.url()]),
        pool("spare", "round_robin", &[spare.url()]),
    ]
    .concat();
    let gw = Gateway::start(&config_yaml(
        &pools,
        "explain_headers: true\nroutes:\n  - {name: fb, pool: fast, ttft_slo: 1us, \
         on_slo_miss: fallback, fallback_pool: spare}\n",
    ));
    for _ in 0..3 {
        let r = send(&gw, "m", &[]).await;
        assert_eq!((r.status, r.backend.as_deref()), (200, Some("spare-b0")));
    }
    assert_eq!((fast.requests(), spare.requests()), (0, 3));
}

/// One backend that takes one request at a time, each held for `hold`.
async fn single_slot_pool(hold: Duration) -> (TestBackend, String) {
    let backend = TestBackend::start(
        "slow",
        Behavior {
            header_delay: hold,
            ..Behavior::default()
        },
    )
    .await;
    let pool = format!(
        "  p:\n    backends:\n      - {{name: slow, url: '{}', max_inflight: 1}}\n",
        backend.url()
    );
    (backend, pool)
}

fn spawn_send(gw: &std::sync::Arc<Gateway>, id: &str, class: &str) -> tokio::task::JoinHandle<u16> {
    let gw = std::sync::Arc::clone(gw);
    let (id, class) = (id.to_string(), class.to_string());
    tokio::spawn(async move {
        send(&gw, "m", &[("x-id", &id), ("x-class", &class)])
            .await
            .status
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_wait_for_capacity_and_leave_when_their_client_hangs_up() {
    let (backend, pools) = single_slot_pool(Duration::from_millis(800)).await;
    let gw = std::sync::Arc::new(Gateway::start(&config_yaml(
        &pools,
        "retry: {max_retries: 0}\nroutes:\n  - {name: q, pool: p, ttft_slo: 60s, on_slo_miss: queue}\n",
    )));
    let first = spawn_send(&gw, "first", "i");
    arrived(&backend, 1).await;
    let waiter = spawn_send(&gw, "waiter", "i");
    metric_reaches(&gw, "pronto_admission_queue_length{route=\"q\"}", 1.0).await;
    let quitter = spawn_send(&gw, "quitter", "i");
    metric_reaches(&gw, "pronto_admission_queue_length{route=\"q\"}", 2.0).await;
    // The quitter's client hangs up: it leaves the queue at once, before any slot frees.
    quitter.abort();
    metric_reaches(&gw, "pronto_admission_queue_length{route=\"q\"}", 1.0).await;
    assert_eq!(backend.requests(), 1, "nothing else was sent yet");
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(waiter.await.unwrap(), 200, "served once the slot freed");
    metric_reaches(&gw, "pronto_admission_queue_length{route=\"q\"}", 0.0).await;
    assert_eq!(arrival_ids(&backend), ["first", "waiter"]);
    let m = metrics_when(&gw, |m| {
        metric_value(m, "pronto_admission_queue_wait_seconds_count{route=\"q\"}") == Some(2.0)
    })
    .await;
    assert_eq!(
        metric_value(&m, "pronto_admission_queue_wait_seconds_count{route=\"q\"}"),
        Some(2.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_requests_overtake_earlier_queued_batch_ones() {
    let (backend, pools) = single_slot_pool(Duration::from_millis(300)).await;
    let gw = std::sync::Arc::new(Gateway::start(&config_yaml(
        &pools,
        "retry: {max_retries: 0}\nroutes:\n  \
         - {name: batch, match: {headers: {x-class: batch}}, pool: p, ttft_slo: 60s, priority: batch}\n  \
         - {name: chat, pool: p, ttft_slo: 60s, priority: interactive}\n",
    )));
    let mut tasks = vec![spawn_send(&gw, "first", "interactive")];
    arrived(&backend, 1).await;
    for (i, id) in ["batch-1", "batch-2"].iter().enumerate() {
        tasks.push(spawn_send(&gw, id, "batch"));
        let labels = "pronto_admission_queue_length{route=\"batch\"}";
        metric_reaches(&gw, labels, (i + 1) as f64).await;
    }
    for (i, id) in ["chat-1", "chat-2"].iter().enumerate() {
        tasks.push(spawn_send(&gw, id, "interactive"));
        let labels = "pronto_admission_queue_length{route=\"chat\"}";
        metric_reaches(&gw, labels, (i + 1) as f64).await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(
        arrival_ids(&backend),
        ["first", "chat-1", "chat-2", "batch-1", "batch-2"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_sheds() {
    let (backend, pools) = single_slot_pool(Duration::from_millis(500)).await;
    let gw = std::sync::Arc::new(Gateway::start(&config_yaml(
        &pools,
        "retry: {max_retries: 0}\nadmission: {queue_size: 1}\nroutes:\n  - {name: q, pool: p, ttft_slo: 60s}\n",
    )));
    let first = spawn_send(&gw, "first", "i");
    arrived(&backend, 1).await;
    let queued = spawn_send(&gw, "queued", "i");
    metric_reaches(&gw, "pronto_admission_queue_length{route=\"q\"}", 1.0).await;
    let r = send(&gw, "m", &[("x-id", "over")]).await;
    assert_eq!(r.status, 429);
    assert_eq!(error_code(&r.body), "slo_overloaded");
    assert!(r.retry_after.is_some());
    assert_eq!((first.await.unwrap(), queued.await.unwrap()), (200, 200));
    metric_reaches(
        &gw,
        "pronto_admission_sheds_total{reason=\"queue_full\",route=\"q\"}",
        1.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_can_override_its_pools_policy() {
    let (a, b) = (
        TestBackend::start("a", Behavior::default()).await,
        TestBackend::start("b", Behavior::default()).await,
    );
    // The pool pins a session to one backend; the `spread` route round-robins the same pool.
    let pools = pool("p", "consistent_hash", &[a.url(), b.url()]);
    let routes = "explain_headers: true\nroutes:\n  \
        - {name: sticky, match: {headers: {x-tier: sticky}}, pool: p}\n  \
        - {name: spread, pool: p, policy: round_robin}\n";
    let gw = Gateway::start(&config_yaml(&pools, routes));
    let mut sticky = std::collections::BTreeSet::new();
    let mut spread = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let r = send(&gw, "m", &[("x-tier", "sticky"), ("x-session-id", "s1")]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        sticky.insert(r.backend.unwrap());
        let r = send(&gw, "m", &[("x-session-id", "s1")]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        spread.insert(r.backend.unwrap());
    }
    assert_eq!(
        sticky.len(),
        1,
        "the pool's consistent_hash keeps the session: {sticky:?}"
    );
    assert_eq!(
        spread.len(),
        2,
        "the route's round_robin spreads it: {spread:?}"
    );
    let m = metrics_when(&gw, |m| m.contains("policy=\"round_robin\"")).await;
    assert!(
        m.contains(r#"pronto_route_decisions_total{policy="round_robin",pool="p""#),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_503_at_once_and_an_overload_429() {
    let (backend, pools) = single_slot_pool(Duration::from_millis(1500)).await;
    let slo = Duration::from_secs(30);
    let gw = std::sync::Arc::new(Gateway::start(&config_yaml(
        &pools,
        "retry: {max_retries: 0}\nroutes:\n  \
         - {name: s, match: {headers: {x-class: shed}}, pool: p, ttft_slo: 30s, on_slo_miss: shed}\n  \
         - {name: q, pool: p, ttft_slo: 30s, on_slo_miss: queue}\n",
    )));
    // Overload: the backend is up and busy. The shed route answers 429; a queued request
    // waits for the slot and is served.
    let first = spawn_send(&gw, "first", "i");
    arrived(&backend, 1).await;
    let shed = send(&gw, "m", &[("x-class", "shed")]).await;
    assert_eq!(
        (shed.status, error_code(&shed.body)),
        (429, "slo_overloaded".into())
    );
    assert!(shed.retry_after.is_some());
    let waiter = spawn_send(&gw, "waiter", "i");
    metric_reaches(&gw, "pronto_admission_queue_length{route=\"q\"}", 1.0).await;
    assert_eq!((first.await.unwrap(), waiter.await.unwrap()), (200, 200));

    // Outage: the only backend is down. Both routes answer 503 at once, with Retry-After,
    // long before the 30 s objective.
    backend.kill();
    metric_reaches(&gw, "pronto_backend_healthy{backend=\"slow\"}", 0.0).await;
    for class in ["i", "shed"] {
        let t = std::time::Instant::now();
        let r = send(&gw, "m", &[("x-class", class)]).await;
        let took = t.elapsed();
        assert_eq!(r.status, 503, "{class}: {r:?}");
        assert_eq!(error_code(&r.body), "no_backend_available");
        assert_eq!(r.retry_after.as_deref(), Some("1"));
        assert!(took < slo / 2, "{class}: answered after {took:?}");
    }
    metric_reaches(&gw, "pronto_admission_queue_length{route=\"q\"}", 0.0).await;
}
