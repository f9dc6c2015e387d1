//! Replay runner tests against scripted in-process HTTP servers on 127.0.0.1:0. Assertions are
//! on counts, classifications and orderings; every wait is bounded by the client timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use tokio::sync::Barrier;

use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ReplayArgs,
}

fn args(extra: &[&str]) -> ReplayArgs {
    let mut argv = vec![
        "x",
        "--target",
        "http://127.0.0.1:1",
        "--out",
        "/tmp/unused",
    ];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).unwrap().args
}

#[test]
fn workload_options_cut_and_scale_but_keep_indices() {
    let all = workload(&args(&[])).unwrap();
    assert!(all.len() > 200, "{}", all.len());
    assert!(all.iter().enumerate().all(|(i, (idx, _))| *idx == i as u64));

    let fast = workload(&args(&["--load-scale", "4", "--limit", "50"])).unwrap();
    assert_eq!(fast.len(), 50);
    for ((i, a), (j, b)) in all.iter().zip(&fast) {
        assert_eq!(i, j);
        assert!((a.arrival_s / 4.0 - b.arrival_s).abs() < 1e-9);
        assert_eq!(a.hash_ids, b.hash_ids);
    }

    let cut = workload(&args(&["--duration", "20s"])).unwrap();
    assert!(!cut.is_empty() && cut.len() < all.len());
    assert!(cut.iter().all(|(_, r)| r.arrival_s <= 20.0));
    assert_eq!(
        cut.len(),
        all.iter().filter(|(_, r)| r.arrival_s <= 20.0).count()
    );

    // The default synthetic workload is shorter than 10 minutes: a --duration past its end
    // is noted, one within it is not.
    let last = all.iter().map(|(_, r)| r.arrival_s).fold(0.0, f64::max);
    let long = Duration::from_secs_f64(last * 2.0);
    let note = short_workload(Some(long), &all).expect("a note");
    assert!(note.contains(&format!("end at {last:.1} s")), "{note}");
    assert_eq!(short_workload(Some(Duration::from_secs(20)), &cut), None);
    assert_eq!(short_workload(None, &all), None);

    let short = workload(&args(&["--max-input-tokens", "2500"])).unwrap();
    assert!(!short.is_empty() && short.len() < all.len());
    assert!(short.iter().all(|(_, r)| r.input_tokens <= 2500));
    for (i, r) in &short {
        assert_eq!(&all[*i as usize].1, r, "indices survive the filter");
    }

    let other_seed = workload(&args(&["--seed", "2", "--conversations", "10"])).unwrap();
    assert_ne!(other_seed[0].1, all[0].1);

    for bad in [
        "--load-scale=0",
        "--load-scale=-1",
        "--load-scale=NaN",
        "--load-scale=inf",
    ] {
        assert!(workload(&args(&[bad])).is_err(), "{bad}");
    }
    let missing = workload(&args(&["--trace", "/nonexistent/trace.jsonl"]));
    assert!(missing
        .unwrap_err()
        .to_string()
        .contains("/nonexistent/trace.jsonl"));
}

/// What the scripted server does, chosen by the request's `max_tokens`.
const OK: u32 = 5;
const STATUS_500: u32 = 500;
const NO_DONE: u32 = 501;
const ERROR_EVENT: u32 = 502;

#[derive(Default)]
struct Script {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// When set, every request waits here before answering.
    barrier: Option<Barrier>,
}

fn sse(events: &[String]) -> Response {
    let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-pronto-backend", "b1")
        .header("x-pronto-predicted-ttft-ms", "12.5")
        .body(Body::from(body))
        .unwrap()
}

async fn chat(State(s): State<Arc<Script>>, Json(body): Json<serde_json::Value>) -> Response {
    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    s.max_in_flight.fetch_max(now, Ordering::SeqCst);
    if let Some(b) = &s.barrier {
        b.wait().await;
    } else {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    s.in_flight.fetch_sub(1, Ordering::SeqCst);
    assert_eq!(body["stream"], true);
    let n = body["max_tokens"].as_u64().unwrap() as u32;
    let role = r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#.to_string();
    let token = r#"{"choices":[{"delta":{"content":"tok"}}]}"#.to_string();
    match n {
        STATUS_500 => (StatusCode::INTERNAL_SERVER_ERROR, "engine exploded").into_response(),
        NO_DONE => sse(&[role, token]),
        ERROR_EVENT => sse(&[role, r#"{"error":{"message":"backend died"}}"#.into()]),
        n => {
            let mut ev = vec![role];
            ev.extend((0..n).map(|_| token.clone()));
            ev.push(format!(
                r#"{{"choices":[],"usage":{{"prompt_tokens":10,"completion_tokens":{n},"prompt_tokens_details":{{"cached_tokens":4}}}}}}"#
            ));
            ev.push("[DONE]".into());
            sse(&ev)
        }
    }
}

async fn serve(script: Arc<Script>) -> String {
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route(
            "/v1/models",
            get(|| async { Json(serde_json::json!({"data": [{"id": "m1"}, {"id": "m2"}]})) }),
        )
        .with_state(script);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/")
}

fn request(arrival_s: f64, output_tokens: u32) -> TraceRequest {
    TraceRequest {
        arrival_s,
        input_tokens: 40,
        output_tokens,
        hash_ids: vec![1],
        block_tokens: pronto_sim::workload::TRACE_BLOCK_TOKENS as u32,
        session: None,
    }
}

async fn run(url: &str, reqs: Vec<TraceRequest>, cap: Option<usize>) -> Vec<RequestRecord> {
    let client = http_client(8).unwrap();
    let model = discover_model(&client, url).await.unwrap();
    assert_eq!(model, "m1");
    let sender = Arc::new(Sender::new(
        client,
        url,
        model,
        Duration::from_secs(10),
        false,
    ));
    let progress = Arc::new(Progress {
        total: reqs.len(),
        ..Progress::default()
    });
    let recs = replay((0u64..).zip(reqs).collect(), sender, cap, progress.clone()).await;
    assert_eq!(progress.done.load(Ordering::Relaxed), recs.len());
    assert_eq!(progress.sent.load(Ordering::Relaxed), recs.len());
    assert_eq!(
        progress.errors.load(Ordering::Relaxed),
        recs.iter().filter(|r| !r.ok()).count()
    );
    recs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_recorded_with_their_reason() {
    let url = serve(Arc::default()).await;
    let reqs = vec![
        request(0.0, OK),
        request(0.0, STATUS_500),
        request(0.01, NO_DONE),
        request(0.02, ERROR_EVENT),
        request(0.03, 1),
    ];
    let recs = run(&url, reqs, None).await;
    assert_eq!(
        recs.iter().map(|r| r.index).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );

    let ok = &recs[0];
    assert!(ok.ok(), "{:?}", ok.error);
    assert_eq!(
        (ok.status, ok.output_events, ok.completion_tokens),
        (Some(200), 5, Some(5))
    );
    assert_eq!((ok.prompt_tokens, ok.cached_tokens), (Some(10), Some(4)));
    assert_eq!(ok.backend.as_deref(), Some("b1"));
    assert_eq!(ok.predicted_ttft_ms, Some(12.5));
    let (ttft, e2e, tpot) = (ok.ttft_ms.unwrap(), ok.e2e_ms.unwrap(), ok.tpot_ms.unwrap());
    assert!(0.0 <= ttft && ttft <= e2e);
    assert!((tpot - (e2e - ttft) / 4.0).abs() < 1e-9);

    let err = |i: usize| recs[i].error.clone().unwrap_or_default();
    assert_eq!(recs[1].status, Some(500));
    assert!(
        err(1).contains("500") && err(1).contains("engine exploded"),
        "{}",
        err(1)
    );
    assert!(err(2).contains("[DONE]"), "{}", err(2));
    assert!(err(3).contains("backend died"), "{}", err(3));
    for r in &recs[1..4] {
        assert!(r.ttft_ms.is_none() && r.tpot_ms.is_none() && r.e2e_ms.is_some());
    }
    // One token: a TTFT but no TPOT.
    assert!(recs[4].ok() && recs[4].ttft_ms.is_some() && recs[4].tpot_ms.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_is_open() {
    // Every request is held until all five have arrived: a client that waited for earlier
    // requests before sending later ones would time out instead.
    let script = Arc::new(Script {
        barrier: Some(Barrier::new(5)),
        ..Script::default()
    });
    let url = serve(script.clone()).await;
    let reqs = (0..5).map(|i| request(f64::from(i) * 0.01, OK)).collect();
    let recs = run(&url, reqs, None).await;
    assert!(recs.iter().all(RequestRecord::ok), "{recs:?}");
    assert_eq!(script.max_in_flight.load(Ordering::SeqCst), 5);
    // Sends happen in schedule order, never before their time.
    assert!(recs
        .windows(2)
        .all(|w| w[0].scheduled_s <= w[1].scheduled_s));
    assert!(recs
        .iter()
        .all(|r| r.sent_s >= r.scheduled_s && r.send_lag_ms >= 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_cap_holds_requests_back() {
    let script = Arc::new(Script::default());
    let url = serve(script.clone()).await;
    let reqs = (0..12).map(|_| request(0.0, OK)).collect();
    let recs = run(&url, reqs, Some(2)).await;
    assert!(recs.iter().all(RequestRecord::ok));
    let max = script.max_in_flight.load(Ordering::SeqCst);
    assert!((1..=2).contains(&max), "{max} in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_target_fails_the_run_with_the_reason() {
    // Bind then drop: nothing listens on the port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("pronto-replay-refused-{}", std::process::id()));
    let target = format!("http://127.0.0.1:{port}");
    let out = dir.to_str().unwrap();
    let base = [
        "--target",
        &target,
        "--out",
        out,
        "--limit",
        "3",
        "--load-scale",
        "100",
    ];

    let no_model = Cli::try_parse_from(["x"].iter().chain(&base)).unwrap().args;
    let e = replay_to_dir(&no_model).await.unwrap_err().to_string();
    assert!(
        e.contains("cannot reach") && e.contains("/v1/models"),
        "{e}"
    );

    let with_model = Cli::try_parse_from(["x", "--model", "m"].iter().chain(&base))
        .unwrap()
        .args;
    let e = replay_to_dir(&with_model).await.unwrap_err().to_string();
    assert!(e.contains("all 3 requests") && e.contains("failed"), "{e}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        (summary["requests"].as_u64(), summary["errors"].as_u64()),
        (Some(3), Some(3))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_targets_take_the_requests_in_turn() {
    let (a, b) = (Arc::<Script>::default(), Arc::<Script>::default());
    let (url_a, url_b) = (serve(a.clone()).await, serve(b.clone()).await);
    // The third target refuses connections: requests 2 and 5 are its turn.
    let targets = format!("{url_a}, {url_b},http://127.0.0.1:1");
    let client = http_client(8).unwrap();
    let sender = Arc::new(Sender::new(
        client,
        &targets,
        "m1".into(),
        Duration::from_secs(10),
        false,
    ));
    let reqs: Vec<_> = (0..6).map(|i| (i, request(0.01 * i as f64, OK))).collect();
    let recs = replay(reqs, sender, None, Arc::default()).await;
    let failed: Vec<u64> = recs.iter().filter(|r| !r.ok()).map(|r| r.index).collect();
    assert_eq!(failed, [2, 5]);
    for s in [&a, &b] {
        assert!(s.max_in_flight.load(Ordering::Relaxed) >= 1);
    }
}
