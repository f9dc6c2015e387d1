//! Before the first byte, end to end: the gateway in front of the in-process simulated fleet,
//! one backend of which stalls every first token (`stall_first_token`). A route with a
//! `first_token_deadline` fails over to the other backend; a route with `hedge` sends a
//! second copy after its delay. Each test checks what the client sees (one clean stream from
//! one backend, nothing twice), that the late copy's upstream was closed (the simulator counts
//! responses dropped before their last token), the gateway's counters, that bookings are
//! released, and that the late backend's model learned from the miss. Orderings only: the
//! stall is far longer than any deadline here.

mod common;

use std::time::{Duration, Instant};

use common::{admin_backends, config_yaml, metric_value, metrics_when, Gateway};
use futures::StreamExt;
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::Value;

const MODEL: &str = "sim-model";
const STALL: Duration = Duration::from_secs(3);
const BOUND: Duration = Duration::from_secs(30);
const TOKENS: u32 = 12;

/// `b0` stalls every first token by STALL; `b1` is healthy.
async fn fleet() -> SimFleet {
    fleet_at(0.05).await
}

/// [`fleet`] with engine steps at `scale` × the profile's.
async fn fleet_at(scale: f64) -> SimFleet {
    let yaml = format!(
        "model: {MODEL}\nbackends:\n  \
         - {{ name: b0, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0, faults: {{ stall_first_token: {}ms }} }}\n  \
         - {{ name: b1, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0 }}\n",
        STALL.as_millis()
    );
    SimFleet::start(&FleetConfig::parse(&yaml, "failover").unwrap(), scale)
        .await
        .unwrap()
}

fn gateway(fleet: &SimFleet, route_extra: &str) -> Gateway {
    let urls = fleet.urls();
    let pools = format!(
        "  {MODEL}:\n    policy: round_robin\n    backends:\n      \
         - {{name: b0, url: '{}'}}\n      - {{name: b1, url: '{}'}}\n",
        urls[0], urls[1]
    );
    Gateway::start(&config_yaml(
        &pools,
        &format!(
            "explain_headers: true\nroutes:\n  - {{name: chat, pool: {MODEL}{route_extra}}}\n"
        ),
    ))
}

/// One streamed request as the client saw it.
#[derive(Debug)]
struct Stream {
    backend: String,
    race: Option<String>,
    race_first: Option<String>,
    first_token: Duration,
    /// Chunk ids seen (one per backend response).
    ids: Vec<String>,
    roles: usize,
    contents: usize,
    dones: usize,
}

async fn stream(gw: &Gateway, tag: &str) -> Stream {
    let sent = Instant::now();
    let r = gw.post_chat_stream(MODEL, tag, 40, TOKENS, BOUND).await;
    let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    let mut s = Stream {
        backend: header("x-pronto-backend").unwrap(),
        race: header("x-pronto-race"),
        race_first: header("x-pronto-race-first"),
        first_token: Duration::ZERO,
        ids: Vec::new(),
        roles: 0,
        contents: 0,
        dones: 0,
    };
    let mut bytes = r.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = tokio::time::timeout(BOUND, bytes.next())
        .await
        .expect("no hang")
    {
        buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").expect("a data event");
            if data == "[DONE]" {
                s.dones += 1;
                continue;
            }
            let v: Value = serde_json::from_str(data).unwrap();
            let id = v["id"].as_str().unwrap().to_string();
            if !s.ids.contains(&id) {
                s.ids.push(id);
            }
            let delta = &v["choices"][0]["delta"];
            if delta["role"].is_string() {
                s.roles += 1;
            }
            if delta["content"].as_str().is_some_and(|c| !c.is_empty()) {
                if s.contents == 0 {
                    s.first_token = sent.elapsed();
                }
                s.contents += 1;
            }
        }
    }
    s
}

/// `sim_cancelled_requests_total` of backend `i`, once it reaches `want` (or after BOUND).
async fn cancelled(fleet: &SimFleet, i: usize, want: f64) -> f64 {
    let url = format!("{}/metrics", fleet.urls()[i]);
    let deadline = Instant::now() + BOUND;
    loop {
        let m = reqwest::get(&url).await.unwrap().text().await.unwrap();
        let v = m
            .lines()
            .find(|l| l.starts_with("sim_cancelled_requests_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0);
        if v >= want || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn clean(s: &Stream) {
    // One backend's response, whole, once.
    assert_eq!(s.ids.len(), 1, "chunks of two responses: {s:?}");
    assert_eq!(
        (s.roles, s.contents, s.dones),
        (1, TOKENS as usize, 1),
        "{s:?}"
    );
}

async fn inflight_is_released(gw: &Gateway) {
    let deadline = Instant::now() + BOUND;
    loop {
        let backends = admin_backends(gw).await;
        if backends.iter().all(|b| b["inflight"] == 0) {
            return;
        }
        assert!(Instant::now() < deadline, "bookings left: {backends:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_first_token_fails_over_and_the_late_copy_is_cancelled() {
    let fleet = fleet().await;
    let gw = gateway(&fleet, ", first_token_deadline: {after: 300ms}");
    let mut failovers = 0;
    for i in 0..6 {
        let s = stream(&gw, &format!("f{i}")).await;
        clean(&s);
        // The stalled backend never serves: whoever went there first was moved.
        assert_eq!(s.backend, "b1", "{s:?}");
        if s.race_first.as_deref() == Some("b0") {
            assert_eq!(s.race.as_deref(), Some("failover"), "{s:?}");
            // Served before the stalled backend would have produced anything.
            assert!(s.first_token < STALL, "{s:?}");
            failovers += 1;
        } else {
            assert_eq!(s.race, None, "{s:?}");
        }
    }
    assert!(
        failovers >= 2,
        "round robin sent some to b0 first: {failovers}"
    );

    // The late copies' connections were closed: the engine side saw each one dropped
    // before its last token; the healthy backend had nothing cancelled.
    let want = f64::from(failovers);
    assert_eq!(cancelled(&fleet, 0, want).await, want);
    assert_eq!(cancelled(&fleet, 1, 0.0).await, 0.0);

    let m = metrics_when(&gw, |m| {
        metric_value(
            m,
            "pronto_failovers_total{reason=\"absolute_deadline\",route=\"chat\"}",
        ) == Some(want)
    })
    .await;
    let get = |k: &str| metric_value(&m, k).unwrap_or_else(|| panic!("no {k} in\n{m}"));
    assert_eq!(
        get("pronto_failovers_total{reason=\"absolute_deadline\",route=\"chat\"}"),
        want
    );
    assert_eq!(get("pronto_failovers_won_total{route=\"chat\"}"), want);
    assert_eq!(
        get("pronto_failovers_total{reason=\"relative_deadline\",route=\"chat\"}"),
        0.0
    );
    assert!(get("pronto_race_wasted_prompt_tokens_total{kind=\"failover\",route=\"chat\"}") > 0.0);
    // Nothing was an error, nothing was counted as a first-token timeout.
    assert_eq!(
        metric_value(
            &m,
            "pronto_upstream_errors_total{backend=\"b0\",kind=\"first_token_timeout\"}"
        )
        .unwrap_or(0.0),
        0.0
    );
    inflight_is_released(&gw).await;
    // The late backend's model learned from each miss (a censored sample: it never produced
    // a first token through the gateway, so these are the only samples it has).
    let backends = admin_backends(&gw).await;
    let b0 = backends.iter().find(|b| b["name"] == "b0").unwrap();
    assert_eq!(b0["ttft_samples"], failovers, "{b0:#}");
    drop(gw);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_races_a_slow_first_token_within_its_budget() {
    let fleet = fleet().await;
    // The budget grants the first hedge (a fresh route banks one) and then 1 % of requests.
    let gw = gateway(&fleet, ", hedge: {after: 100ms, budget: 0.01}");
    let (mut hedged, mut waited) = (0, 0);
    for i in 0..8 {
        let s = stream(&gw, &format!("h{i}")).await;
        clean(&s);
        match (s.race_first.as_deref(), s.backend.as_str()) {
            (Some("b0"), "b1") => {
                assert_eq!(s.race.as_deref(), Some("hedge"), "{s:?}");
                assert!(s.first_token < STALL, "{s:?}");
                hedged += 1;
            }
            // The budget is spent: the stalled backend is waited for.
            (None, "b0") => {
                assert!(s.first_token >= STALL, "{s:?}");
                waited += 1;
            }
            (None, "b1") => {}
            _ => panic!("unexpected race: {s:?}"),
        }
        if hedged > 0 && waited > 0 {
            break;
        }
    }
    assert_eq!((hedged, waited), (1, 1), "one hedge, then none");
    assert_eq!(cancelled(&fleet, 0, 1.0).await, 1.0);
    let m = metrics_when(&gw, |m| {
        metric_value(m, "pronto_hedges_won_total{route=\"chat\"}") == Some(1.0)
    })
    .await;
    let get = |k: &str| metric_value(&m, k).unwrap_or_else(|| panic!("no {k} in\n{m}"));
    assert_eq!(get("pronto_hedges_sent_total{route=\"chat\"}"), 1.0);
    assert_eq!(get("pronto_hedges_won_total{route=\"chat\"}"), 1.0);
    assert!(get("pronto_race_wasted_prompt_tokens_total{kind=\"hedge\",route=\"chat\"}") > 0.0);
    // A route without a deadline has no failover series.
    assert_eq!(
        metric_value(&m, "pronto_failovers_won_total{route=\"chat\"}"),
        None
    );
    inflight_is_released(&gw).await;
    drop(gw);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_backend_learns_from_its_misses_and_is_avoided() {
    // Real-time steps: TTFTs well above loopback noise, so the healthy backend's model is
    // trusted.
    let fleet = fleet_at(1.0).await;
    let urls = fleet.urls();
    // predicted_ttft: the deadline is relative to the decision's prediction.
    let pools = format!(
        "  {MODEL}:\n    policy: predicted_ttft\n    backends:\n      \
         - {{name: b0, url: '{}'}}\n      - {{name: b1, url: '{}'}}\n",
        urls[0], urls[1]
    );
    let gw = Gateway::start(&config_yaml(
        &pools,
        &format!(
            "explain_headers: true\nroutes:\n  - {{name: chat, pool: {MODEL}, \
             first_token_deadline: {{factor: 2, floor: 200ms}}}}\n"
        ),
    ));
    let mut seen = Vec::new();
    for i in 0..24 {
        let s = stream(&gw, &format!("l{i}")).await;
        clean(&s);
        assert_eq!(s.backend, "b1", "the stalled backend never serves: {s:?}");
        seen.push(s.race.is_some());
    }
    let failovers = seen.iter().filter(|&&r| r).count();
    // The policy probes a cold backend until its model has `min_samples` (3) observations.
    // Each miss is one — a TTFT of at least the deadline — so b0 is probed at most three
    // times, then trusted to be slow and avoided; were misses not learned from, it would stay
    // cold and be probed again and again.
    assert!(
        (1..=3).contains(&failovers),
        "probes of the late backend: {seen:?}"
    );
    let b0 = admin_backends(&gw).await;
    let b0 = b0.iter().find(|b| b["name"] == "b0").unwrap();
    assert_eq!(b0["ttft_samples"], failovers, "{b0:#}");
    let m = metrics_when(&gw, |m| {
        metric_value(
            m,
            "pronto_failovers_total{reason=\"relative_deadline\",route=\"chat\"}",
        ) == Some(failovers as f64)
    })
    .await;
    assert_eq!(
        metric_value(
            &m,
            "pronto_failovers_total{reason=\"relative_deadline\",route=\"chat\"}"
        ),
        Some(failovers as f64)
    );
    let want = failovers as f64;
    assert_eq!(cancelled(&fleet, 0, want).await, want);
    inflight_is_released(&gw).await;
    drop(gw);
    fleet.shutdown().await;
}
