//! Collision repair end to end (`cluster.collision_repair`): an in-process gateway reaches a
//! real `nats-server` through a TCP relay that delays every byte (a slow sync channel), and
//! the test plays a second replica by publishing the gateway's wire format on NATS. A request
//! waiting for its first token on backend X moves when another replica's dispatch to X, sent
//! before it, is heard late and makes X the slower choice; a dispatch that changes nothing
//! leaves it where it is, and one sent after it (queued behind it) is no collision.

mod common;
#[path = "support/nats.rs"]
mod nats;

use std::time::{Duration, Instant};

use common::{config_yaml, metric_value, metrics, Behavior, Gateway, TestBackend};
use pronto_core::cluster::{wire, BackendRef, SyncEvent};
use pronto_core::load::RequestLoad;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Each way through the relay.
const ONE_WAY: Duration = Duration::from_millis(300);

/// Copy `from` to `to`, each chunk `delay` after it was read.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0
            || tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// A loopback relay to `port` delaying each direction by `delay`; its port.
async fn slow_relay(port: u16, delay: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(delayed(cr, sw, delay));
            tokio::spawn(delayed(sr, cw, delay));
        }
    });
    relay
}

fn value(m: &str, name: &str) -> f64 {
    metric_value(m, name).unwrap_or(0.0)
}

/// Poll `gw`'s metrics until `ready` gives a value; a panic naming `what` after `bound`.
async fn wait_for<T>(
    gw: &Gateway,
    what: &str,
    bound: Duration,
    ready: impl Fn(&str) -> Option<T>,
) -> T {
    let deadline = Instant::now() + bound;
    loop {
        let m = metrics(gw).await;
        if let Some(v) = ready(&m) {
            return v;
        }
        let sync: Vec<&str> = m
            .lines()
            .filter(|l| l.starts_with("pronto_cluster"))
            .collect();
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            sync.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The backend (`x` or `y`) holding a request in flight.
fn busy(m: &str) -> Option<&'static str> {
    ["x", "y"]
        .into_iter()
        .find(|b| value(m, &format!("pronto_backend_inflight{{backend=\"{b}\"}}")) >= 1.0)
}

type Answer = (u16, Option<String>, Option<String>, String);

/// Once no remote booking is left, a streamed chat tagged `tag` sent through `gw`, and the
/// backend it waits on for its first token.
async fn in_flight(gw: &Gateway, tag: &str) -> (tokio::task::JoinHandle<Answer>, &'static str) {
    wait_for(gw, "no remote booking left", Duration::from_secs(10), |m| {
        (value(m, "pronto_cluster_remote_bookings") == 0.0).then_some(())
    })
    .await;
    let req = chat(gw, tag);
    let what = format!("the {tag} request in flight");
    (req, wait_for(gw, &what, Duration::from_secs(5), busy).await)
}

/// A streamed chat with a prompt of its own: its status, `x-pronto-backend`,
/// `x-pronto-moved-from` and body.
fn chat(gw: &Gateway, tag: &str) -> tokio::task::JoinHandle<Answer> {
    let url = gw.url("/v1/chat/completions");
    let body = serde_json::json!({"model": "m", "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": format!("{tag}: tell me about the sea")}]});
    tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(url)
            .json(&body)
            .send()
            .await
            .unwrap();
        let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        let (backend, from) = (header("x-pronto-backend"), header("x-pronto-moved-from"));
        let status = r.status().as_u16();
        (status, backend, from, r.text().await.unwrap())
    })
}

/// The other replica dispatches `prefill_tokens` to `backend`: its message, published
/// straight to NATS (the gateway hears it one relay leg later).
async fn remote_dispatch(nats: &async_nats::Client, seq: u64, backend: &str, prefill_tokens: u32) {
    let ev = SyncEvent::Dispatch {
        seq,
        backend: BackendRef::of("m", backend),
        load: RequestLoad {
            prefill_tokens,
            kv_tokens: 1_000,
        },
        hashes: Vec::new(),
    };
    let payload = wire::encode(7, &[ev]);
    nats.publish("pronto.cluster.peer", payload.into())
        .await
        .unwrap();
    nats.flush().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_behind_a_late_heard_booking_moves_and_one_behind_nothing_stays() {
    let Some(nats) = nats::Nats::start() else {
        return;
    };
    let relay = slow_relay(nats.port, ONE_WAY).await;
    // Both backends take 1.5 s to a first token: the late booking is heard meanwhile.
    let slow = Behavior {
        first_token_delay: Duration::from_millis(1_500),
        ..Behavior::default()
    };
    let x = TestBackend::start("x", slow.clone()).await;
    let y = TestBackend::start("y", slow).await;
    let pools = format!(
        "  m:\n    policy: predicted_ttft\n    backends:\n      - {{name: x, url: {}}}\n      \
         - {{name: y, url: {}}}\n",
        x.url(),
        y.url()
    );
    let gw = Gateway::start(&config_yaml(
        &pools,
        &format!(
            "explain_headers: true\ncluster:\n  nats: nats://127.0.0.1:{relay}\n  replica: g\n  \
             heartbeat: 200ms\n  peer_timeout: 1s\n  collision_repair: 0.2\n"
        ),
    ));
    let peer = async_nats::connect(nats.url()).await.unwrap();
    // The gateway's own messages come back through both legs of the relay: its estimate of
    // the sync delay is their round trip, 600 ms, above the 300 ms the peer's take.
    wait_for(&gw, "the sync delay", Duration::from_secs(20), |m| {
        (value(m, "pronto_cluster_sync_delay_seconds") > 0.5).then_some(())
    })
    .await;

    // A request goes to one backend; the peer's dispatch of a 400k-token prompt to that same
    // backend, sent just after (by the gateway's estimate, before: it is heard 300 ms late
    // and dated 600 ms back), puts it behind that prompt: it moves to the other.
    let (req, first) = in_flight(&gw, "first").await;
    let other = if first == "x" { "y" } else { "x" };
    remote_dispatch(&peer, 1, first, 400_000).await;
    let (status, backend, from, body) = req.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(backend.as_deref(), Some(other), "moved to the idle backend");
    assert_eq!(
        from.as_deref(),
        Some(first),
        "the explain header names where it was"
    );
    assert_eq!(
        body.matches("[DONE]").count(),
        1,
        "one answer, whole: {body}"
    );
    let m = metrics(&gw).await;
    assert_eq!(
        value(&m, "pronto_cluster_collisions_total{outcome=\"moved\"}"),
        1.0
    );
    // Its first attempt's connection was closed: the engine there aborts it.
    let dropped = if first == "x" { &x } else { &y };
    dropped
        .wait_cancelled(
            1,
            Duration::from_secs(5),
            "the moved request's first attempt is dropped",
        )
        .await;

    // The peer goes silent: its booking expires. A dispatch of 16 tokens to the backend a
    // second request waits on is a collision too, but staying still predicts best.
    let (req, second) = in_flight(&gw, "second").await;
    remote_dispatch(&peer, 2, second, 16).await;
    wait_for(
        &gw,
        "the second request reconsidered",
        Duration::from_secs(5),
        |m| (value(m, "pronto_cluster_collisions_total{outcome=\"stayed\"}") == 1.0).then_some(()),
    )
    .await;
    let (status, backend, from, _) = req.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(backend.as_deref(), Some(second), "stayed");
    assert_eq!(from, None);

    // A dispatch sent well after the request (700 ms; dated 600 ms back, still after it) is
    // queued behind it at the engine: not a collision, nothing is reconsidered.
    let (req, third) = in_flight(&gw, "third").await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    remote_dispatch(&peer, 3, third, 400_000).await;
    let (status, backend, from, _) = req.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!((backend.as_deref(), from), (Some(third), None));
    let m = metrics(&gw).await;
    assert_eq!(
        value(&m, "pronto_cluster_remote_bookings"),
        1.0,
        "the late dispatch was heard"
    );
    assert_eq!(
        value(&m, "pronto_cluster_collisions_total{outcome=\"moved\"}"),
        1.0
    );
    assert_eq!(
        value(&m, "pronto_cluster_collisions_total{outcome=\"stayed\"}"),
        1.0
    );
}
