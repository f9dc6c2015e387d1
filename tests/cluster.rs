//! Replica sync over NATS end to end (`cluster:`): two in-process gateways, a real
//! `nats-server`, in-process backends. A prefix routed by one replica is followed by the
//! other; NATS going away and coming back under load fails no request, each replica falls
//! back to its own state and resyncs.

mod common;
#[path = "support/nats.rs"]
mod nats;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    admin_backends, client, config_yaml, metric_value, metrics, Behavior, Gateway, TestBackend,
};

/// A pool `m` listing `backends` (name, URL) in this order.
fn pool_in_order(policy: &str, backends: &[(&str, String)]) -> String {
    let mut s = format!("  m:\n    policy: {policy}\n    backends:\n");
    for (name, url) in backends {
        s.push_str(&format!("      - name: {name}\n        url: {url}\n"));
    }
    s
}

fn cluster_yaml(nats: &str, replica: &str) -> String {
    format!(
        "explain_headers: true\ncluster:\n  nats: {nats}\n  replica: {replica}\n  \
         heartbeat: 200ms\n  peer_timeout: 1s\n"
    )
}

/// A chat body whose long prompt is unique to `tag` (`turns` user turns of it).
fn conversation(tag: &str, turns: usize) -> Vec<u8> {
    let filler = format!("{tag}: the quick brown fox jumps over the lazy dog. ").repeat(300);
    let messages: Vec<_> = (0..turns)
        .map(|i| serde_json::json!({"role": "user", "content": format!("{filler} turn {i}")}))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "messages": messages, "model": "m", "stream": true, "max_tokens": 4
    }))
    .unwrap()
}

/// Poll `gw`'s metrics until `ready` holds; a panic naming `what` after `timeout`.
async fn wait_for(gw: &Gateway, what: &str, timeout: Duration, ready: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        let m = metrics(gw).await;
        if ready(&m) {
            return;
        }
        if Instant::now() > deadline {
            let sync: Vec<&str> = m
                .lines()
                .filter(|l| l.starts_with("pronto_cluster"))
                .collect();
            panic!("timed out waiting for {what}:\n{}", sync.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn value(m: &str, name: &str) -> f64 {
    metric_value(m, name).unwrap_or(0.0)
}

fn received_events(m: &str) -> f64 {
    value(m, "pronto_cluster_events_total{direction=\"received\"}")
}

async fn connected_to_one_peer(gw: &Gateway, timeout: Duration) {
    wait_for(gw, "a connection and one peer", timeout, |m| {
        value(m, "pronto_cluster_connected") == 1.0 && value(m, "pronto_cluster_peers") == 1.0
    })
    .await;
}

/// Send `body` through `gw`; the backend that served it.
async fn served_by(gw: &Gateway, body: Vec<u8>) -> String {
    let r = client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let backend = r.headers()["x-pronto-backend"]
        .to_str()
        .unwrap()
        .to_string();
    r.bytes().await.unwrap();
    backend
}

/// The other replica has folded the request `from` just finished: its dispatch, first token
/// and release (three more events than `before`), and holds nothing of it any more.
async fn folded(gw: &Gateway, before: f64) {
    wait_for(
        gw,
        "the other replica's events",
        Duration::from_secs(5),
        |m| received_events(m) >= before + 3.0 && value(m, "pronto_cluster_remote_bookings") == 0.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_synced_replicas_send_a_repeated_prefix_to_the_backend_that_holds_it() {
    let Some(nats) = nats::Nats::start() else {
        return;
    };
    let x = TestBackend::start("x", Behavior::default()).await;
    let y = TestBackend::start("y", Behavior::default()).await;
    // The two replicas list the backends in opposite orders: on an idle pool, each sends a
    // fresh prompt to its own first backend (cache_aware: least loaded, then pool order).
    let a = Gateway::start(&config_yaml(
        &pool_in_order("cache_aware", &[("x", x.url()), ("y", y.url())]),
        &cluster_yaml(&nats.url(), "replica-a"),
    ));
    let b = Gateway::start(&config_yaml(
        &pool_in_order("cache_aware", &[("y", y.url()), ("x", x.url())]),
        &cluster_yaml(&nats.url(), "replica-b"),
    ));
    connected_to_one_peer(&a, Duration::from_secs(10)).await;
    connected_to_one_peer(&b, Duration::from_secs(10)).await;
    for round in 0..3 {
        // First through A (to x, A's first), the next turn through B (which alone would pick
        // y): B follows the prefix A recorded.
        let before = received_events(&metrics(&b).await);
        let first = served_by(&a, conversation(&format!("a{round}"), 1)).await;
        assert_eq!(first, "x", "A sends a fresh prompt to its first backend");
        folded(&b, before).await;
        let repeat = served_by(&b, conversation(&format!("a{round}"), 2)).await;
        assert_eq!(
            repeat, "x",
            "round {round}: B followed the prefix routed by A"
        );
        // And the other way round.
        let before = received_events(&metrics(&a).await);
        let first = served_by(&b, conversation(&format!("b{round}"), 1)).await;
        assert_eq!(first, "y", "B sends a fresh prompt to its first backend");
        folded(&a, before).await;
        let repeat = served_by(&a, conversation(&format!("b{round}"), 2)).await;
        assert_eq!(
            repeat, "y",
            "round {round}: A followed the prefix routed by B"
        );
    }
    let m = metrics(&a).await;
    assert!(value(&m, "pronto_cluster_bytes_total{direction=\"sent\"}") > 0.0);
    assert_eq!(
        value(&m, "pronto_cluster_dropped_total{reason=\"decode_error\"}"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_lost_and_back_under_load_fails_no_request_and_resyncs() {
    let Some(mut nats) = nats::Nats::start() else {
        return;
    };
    let slowish = Behavior {
        tokens: 8,
        token_delay: Duration::from_millis(20),
        ..Behavior::default()
    };
    let x = TestBackend::start("x", slowish.clone()).await;
    let y = TestBackend::start("y", slowish).await;
    let pools = pool_in_order("predicted_ttft", &[("x", x.url()), ("y", y.url())]);
    let a = Arc::new(Gateway::start(&config_yaml(
        &pools,
        &cluster_yaml(&nats.url(), "ra"),
    )));
    let b = Arc::new(Gateway::start(&config_yaml(
        &pools,
        &cluster_yaml(&nats.url(), "rb"),
    )));
    connected_to_one_peer(&a, Duration::from_secs(10)).await;
    connected_to_one_peer(&b, Duration::from_secs(10)).await;

    // Four clients, each alternating between the replicas, until told to stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut clients = Vec::new();
    for c in 0..4 {
        let urls = [a.url("/v1/chat/completions"), b.url("/v1/chat/completions")];
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        clients.push(tokio::spawn(async move {
            let http = client(false);
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let body = conversation(&format!("client{c}"), 1 + i % 3);
                let r = http.post(&urls[(c + i) % 2]).body(body).send().await;
                let served = match r {
                    Ok(r) if r.status() == 200 => r.bytes().await.is_ok(),
                    _ => false,
                };
                if served {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let m = metrics(&b).await;
    assert!(received_events(&m) > 0.0, "synced under load");
    // Each replica times its own messages' echoes (the sync delay) and estimates the remote
    // dispatches it has not heard of yet.
    for gw in [&a, &b] {
        wait_for(
            gw,
            "the sync delay and the unseen dispatches",
            Duration::from_secs(5),
            |m| {
                value(m, "pronto_cluster_sync_delay_seconds") > 0.0
                    && value(m, "pronto_cluster_unseen_dispatches") > 0.0
            },
        )
        .await;
    }

    // NATS goes away: each replica falls back to its own state, and keeps serving.
    nats.stop();
    for gw in [&a, &b] {
        wait_for(gw, "the peer expired", Duration::from_secs(5), |m| {
            value(m, "pronto_cluster_connected") == 0.0
                && value(m, "pronto_cluster_peers") == 0.0
                && value(m, "pronto_cluster_remote_bookings") == 0.0
                && value(m, "pronto_cluster_peer_expiries_total") >= 1.0
        })
        .await;
    }
    let served_while_down = ok.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        ok.load(Ordering::Relaxed) > served_while_down,
        "still serving without NATS"
    );

    // It comes back: both reconnect, resync, and fold each other's events again.
    nats.restart();
    for gw in [&a, &b] {
        connected_to_one_peer(gw, Duration::from_secs(10)).await;
    }
    let before = received_events(&metrics(&a).await);
    wait_for(&a, "events after the return", Duration::from_secs(5), |m| {
        received_events(m) > before + 10.0
    })
    .await;

    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed");
    assert!(
        ok.load(Ordering::Relaxed) > 50,
        "{} requests",
        ok.load(Ordering::Relaxed)
    );
    // Every booking, local and remote, is released once the load is over.
    for gw in [&a, &b] {
        wait_for(gw, "no remote bookings", Duration::from_secs(5), |m| {
            value(m, "pronto_cluster_remote_bookings") == 0.0
        })
        .await;
        for backend in admin_backends(gw).await {
            assert_eq!(backend["inflight"], 0, "{backend}");
            assert_eq!(backend["outstanding_prefill_tokens"], 0, "{backend}");
        }
    }
}
