//! Time to first answer, end to end: the gateway in front of the in-process simulated fleet
//! serving a reasoning model (`reasoning:` in the fleet file). Each streamed chat request
//! reasons (`delta.reasoning_content`) before it answers (`delta.content`); the gateway must
//! record the first token (TTFT) at the first reasoning token and the first answer (TTFA) at
//! the first content token, count the reasoning tokens, and expose both as metrics. Only
//! orderings and ratios are asserted, never milliseconds.

mod common;

use std::time::{Duration, Instant};

use common::{config_yaml, metric_value, metrics_when, pool, Gateway};
use futures::StreamExt;
use pronto_sim::fleet::SimFleet;
use pronto_sim::fleet_config::FleetConfig;
use serde_json::Value;

const MODEL: &str = "sim-r1";
/// Every request reasons exactly this long (`sigma: 0`).
const REASONING: u32 = 80;
const ANSWER: u32 = 20;
const BOUND: Duration = Duration::from_secs(30);

async fn fleet() -> SimFleet {
    let yaml = format!(
        "model: {MODEL}\nreasoning: {{ mean_tokens: {REASONING}, sigma: 0 }}\nbackends:\n  \
         - {{ name: b0, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0 }}\n"
    );
    let config = FleetConfig::parse(&yaml, "ttfa").unwrap();
    // Slow enough that one decode step is well above timer and loopback noise.
    SimFleet::start(&config, 0.3).await.unwrap()
}

/// What the client saw of one stream: the arrival of the first reasoning and first content
/// token after sending, the count of each, and the mean gap between answer tokens.
#[derive(Debug)]
struct Seen {
    first_token: Duration,
    first_answer: Duration,
    reasoning: u32,
    answer: u32,
    answer_itl: Duration,
}

/// Every data event of a streamed response (not `[DONE]`), with when it arrived after `sent`.
async fn events(r: reqwest::Response, sent: Instant) -> Vec<(Duration, Value)> {
    let mut bytes = r.bytes_stream();
    let (mut buf, mut out) = (String::new(), Vec::new());
    while let Some(chunk) = tokio::time::timeout(BOUND, bytes.next())
        .await
        .expect("no hang")
    {
        buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            match event.trim().strip_prefix("data: ") {
                Some(data) if data != "[DONE]" => {
                    out.push((sent.elapsed(), serde_json::from_str(data).unwrap()));
                }
                _ => {}
            }
        }
    }
    out
}

/// Whether `delta[field]` is a non-empty string.
fn has(delta: &Value, field: &str) -> bool {
    delta[field].as_str().is_some_and(|s| !s.is_empty())
}

async fn stream(gw: &Gateway, tag: &str) -> Seen {
    let sent = Instant::now();
    let r = gw.post_chat_stream(MODEL, tag, 60, ANSWER, BOUND).await;
    let (mut first_token, mut first_answer, mut last_answer) = (None, None, None);
    let (mut reasoning, mut answer) = (0, 0);
    for (at, v) in events(r, sent).await {
        let delta = &v["choices"][0]["delta"];
        if has(delta, "reasoning_content") {
            assert!(first_answer.is_none(), "reasoning after the answer began");
            reasoning += 1;
            first_token.get_or_insert(at);
        }
        if has(delta, "content") {
            answer += 1;
            first_token.get_or_insert(at);
            first_answer.get_or_insert(at);
            last_answer = Some(at);
        }
    }
    let (first_answer, last_answer) = (first_answer.unwrap(), last_answer.unwrap());
    Seen {
        first_token: first_token.unwrap(),
        first_answer,
        reasoning,
        answer,
        answer_itl: (last_answer - first_answer) / (answer - 1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_model_answers_after_its_reasoning_and_the_gateway_measures_both() {
    let fleet = fleet().await;
    let gw = Gateway::start(&config_yaml(
        &pool(MODEL, "predicted_ttft", &fleet.urls()),
        "",
    ));
    let n = 4;
    let mut seen = Vec::new();
    for i in 0..n {
        seen.push(stream(&gw, &format!("q{i}")).await);
    }
    for s in &seen {
        // The client sees the whole reasoning, then the answer.
        assert_eq!((s.reasoning, s.answer), (REASONING, ANSWER), "{s:?}");
        assert!(s.first_answer > s.first_token, "{s:?}");
        // The wait for the answer is the reasoning, one decode step per token: within a
        // factor of three of REASONING × the answer's own inter-token gap.
        let reasoning_time = (s.first_answer - s.first_token).as_secs_f64();
        let predicted = f64::from(REASONING) * s.answer_itl.as_secs_f64();
        assert!(
            reasoning_time > predicted / 3.0 && reasoning_time < predicted * 3.0,
            "reasoning took {reasoning_time:.4} s, {REASONING} × ITL = {predicted:.4} s: {s:?}"
        );
    }

    // The gateway's own view: pronto_ttfa_seconds above pronto_ttft_seconds on the backend,
    // the client-side pair per pool, and as many of each as requests.
    let backend = format!("{MODEL}-b0");
    let m = metrics_when(&gw, |m| {
        metric_value(
            m,
            &format!("pronto_ttfa_seconds_count{{backend=\"{backend}\"}}"),
        ) == Some(f64::from(n))
    })
    .await;
    let get = |name: &str, label: &str, value: &str| {
        metric_value(&m, &format!("{name}{{{label}=\"{value}\"}}"))
            .unwrap_or_else(|| panic!("no {name} for {value} in\n{m}"))
    };
    for (ttft, ttfa, label, value) in [
        (
            "pronto_ttft_seconds",
            "pronto_ttfa_seconds",
            "backend",
            backend.as_str(),
        ),
        (
            "pronto_client_ttft_seconds",
            "pronto_client_ttfa_seconds",
            "pool",
            MODEL,
        ),
    ] {
        let count = |f: &str| get(&format!("{f}_count"), label, value);
        assert_eq!((count(ttft), count(ttfa)), (f64::from(n), f64::from(n)));
        let (ttft_sum, ttfa_sum) = (
            get(&format!("{ttft}_sum"), label, value),
            get(&format!("{ttfa}_sum"), label, value),
        );
        assert!(ttfa_sum > ttft_sum, "{ttfa} {ttfa_sum} ≤ {ttft} {ttft_sum}");
    }
    // The gateway's TPOT covers every output token, reasoning included: the reasoning wait
    // it saw is REASONING of them, within a factor of three.
    let tpot = get("pronto_tpot_seconds_sum", "backend", &backend)
        / get("pronto_tpot_seconds_count", "backend", &backend);
    let waited = (get("pronto_ttfa_seconds_sum", "backend", &backend)
        - get("pronto_ttft_seconds_sum", "backend", &backend))
        / f64::from(n);
    let predicted = f64::from(REASONING) * tpot;
    assert!(
        waited > predicted / 3.0 && waited < predicted * 3.0,
        "waited {waited:.4} s for the answer, {REASONING} × TPOT = {predicted:.4} s"
    );
    drop(gw);
    fleet.shutdown().await;
}

/// Post one streamed chat request (with `extra` body fields and `header`), read it to the
/// end; returns the response's explain headers of interest.
async fn explained(
    gw: &Gateway,
    tag: &str,
    header: (&str, &str),
    extra: Value,
) -> [Option<f64>; 3] {
    let text: String = (0..60).map(|i| format!(" {tag}{i}")).collect();
    let mut body = serde_json::json!({"model": MODEL, "stream": true, "max_tokens": ANSWER,
                                      "messages": [{"role": "user", "content": text}]});
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    let r = tokio::time::timeout(
        BOUND,
        reqwest::Client::new()
            .post(gw.url("/v1/chat/completions"))
            .header(header.0, header.1)
            .json(&body)
            .send(),
    )
    .await
    .expect("no hang")
    .unwrap();
    assert_eq!(r.status(), 200);
    let get = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().parse::<f64>().unwrap())
    };
    let seen = [
        get("x-pronto-expected-reasoning-tokens"),
        get("x-pronto-predicted-ttft-ms"),
        get("x-pronto-predicted-ttfa-ms"),
    ];
    tokio::time::timeout(BOUND, r.bytes())
        .await
        .expect("no hang")
        .unwrap();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttfa_route_learns_how_long_the_model_reasons_and_predicts_the_answer() {
    let fleet = fleet().await;
    let routes = format!(
        "explain_headers: true\nroutes:\n  \
         - {{name: think, pool: {MODEL}, objective: ttfa, match: {{headers: {{x-objective: ttfa}}}}}}\n  \
         - {{name: plain, pool: {MODEL}}}\n"
    );
    let gw = Gateway::start(&config_yaml(
        &pool(MODEL, "predicted_ttft", &fleet.urls()),
        &routes,
    ));
    let ttfa = ("x-objective", "ttfa");
    let none = serde_json::json!({});
    // Nothing learnt yet: no reasoning expected.
    let [expected, ..] = explained(&gw, "first", ttfa, none.clone()).await;
    assert_eq!(expected, Some(0.0));
    // Every stream reasons REASONING tokens: once a few have ended (the observation lands
    // just after each stream's last byte), that is the expectation, and with the TPOT model
    // predicting, the predicted TTFA is the TTFT plus that reasoning.
    let mut last = [None; 3];
    for i in 0..20 {
        last = explained(&gw, &format!("t{i}"), ttfa, none.clone()).await;
        if last[0] == Some(f64::from(REASONING)) && last[2].is_some() {
            break;
        }
    }
    let [expected, ttft, answer] = last;
    assert_eq!(expected, Some(f64::from(REASONING)), "{last:?}");
    let (ttft, answer) = (ttft.unwrap(), answer.unwrap());
    assert!(answer > ttft, "{last:?}");
    // A reasoning effort not seen yet borrows what requests without one taught.
    let high = serde_json::json!({"reasoning_effort": "high"});
    let [expected, ..] = explained(&gw, "h0", ttfa, high).await;
    assert_eq!(expected, Some(f64::from(REASONING)));
    // The plain route minimises TTFT: no TTFA in its explanation.
    let [expected, ttft, answer] = explained(&gw, "p0", ("x-objective", "ttft"), none).await;
    assert_eq!((expected, answer), (None, None));
    assert!(ttft.is_some());
    drop(gw);
    fleet.shutdown().await;
}

/// One streamed request through a raced route, as the client saw it.
#[derive(Debug)]
struct Raced {
    backend: String,
    race: Option<String>,
    race_first: Option<String>,
    /// Response ids seen (one per backend response).
    ids: Vec<String>,
    reasoning: u32,
    answer: u32,
    first_answer: Duration,
}

async fn raced(gw: &Gateway, tag: &str) -> Raced {
    let sent = Instant::now();
    let r = gw.post_chat_stream(MODEL, tag, 60, ANSWER, BOUND).await;
    let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    let (backend, race, race_first) = (
        header("x-pronto-backend").unwrap(),
        header("x-pronto-race"),
        header("x-pronto-race-first"),
    );
    let (mut ids, mut reasoning, mut answer, mut first_answer) = (Vec::new(), 0, 0, None);
    for (at, v) in events(r, sent).await {
        let id = v["id"].as_str().unwrap_or_default().to_string();
        if !ids.contains(&id) {
            ids.push(id);
        }
        let delta = &v["choices"][0]["delta"];
        if has(delta, "reasoning_content") {
            reasoning += 1;
        }
        if has(delta, "content") {
            answer += 1;
            first_answer.get_or_insert(at);
        }
    }
    Raced {
        backend,
        race,
        race_first,
        ids,
        reasoning,
        answer,
        first_answer: first_answer.expect("an answer"),
    }
}

/// `race_on: ttfa`: b0 produces its first token on time but reasons ten times slower than
/// b1, so only a race on the first *answer* catches it. With a 1 s deadline on the answer, the
/// request first sent to b0 is answered by b1 — one clean stream (every reasoning and answer
/// token once, from one response), b0's copy cancelled, bookings released — while the same
/// deadline on the first token never fires and the client waits for b0's slow reasoning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_on_the_first_answer_moves_a_request_off_a_slow_reasoner() {
    const DEADLINE: Duration = Duration::from_secs(1);
    let yaml = format!(
        "model: {MODEL}\nreasoning: {{ mean_tokens: {REASONING}, sigma: 0 }}\nbackends:\n  \
         - {{ name: b0, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0, faults: {{ slowdown: 10 }} }}\n  \
         - {{ name: b1, profile: h100-llama3-8b, num_kv_blocks: 4000, port: 0 }}\n"
    );
    let fleet = SimFleet::start(&FleetConfig::parse(&yaml, "ttfa-race").unwrap(), 0.3)
        .await
        .unwrap();
    let urls = fleet.urls();
    let pools = format!(
        "  {MODEL}:\n    policy: round_robin\n    backends:\n      \
         - {{name: b0, url: '{}'}}\n      - {{name: b1, url: '{}'}}\n",
        urls[0], urls[1]
    );
    let cancelled_on_b0 = || async {
        let m = reqwest::get(format!("{}/metrics", urls[0]))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        m.lines()
            .find(|l| l.starts_with("sim_cancelled_requests_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    for race_on in ["ttfa", "ttft"] {
        let gw = Gateway::start(&config_yaml(
            &pools,
            &format!(
                "explain_headers: true\nroutes:\n  - {{name: chat, pool: {MODEL}, race_on: {race_on}, \
                 first_token_deadline: {{after: {}ms}}}}\n",
                DEADLINE.as_millis()
            ),
        ));
        let before = cancelled_on_b0().await;
        // Round robin: one of two requests goes first to b0.
        let seen = [
            raced(&gw, &format!("{race_on}a")).await,
            raced(&gw, &format!("{race_on}b")).await,
        ];
        for s in &seen {
            assert_eq!(s.ids.len(), 1, "chunks of two responses: {s:?}");
            assert_eq!((s.reasoning, s.answer), (REASONING, ANSWER), "{s:?}");
        }
        let on_b0: Vec<&Raced> = seen
            .iter()
            .filter(|s| s.backend == "b0" || s.race_first.as_deref() == Some("b0"))
            .collect();
        assert!(!on_b0.is_empty(), "{seen:?}");
        if race_on == "ttfa" {
            // (The race's second decision moves the rotation on: both may start on b0.)
            for s in &on_b0 {
                assert_eq!(s.race.as_deref(), Some("failover"), "{s:?}");
                assert_eq!(s.backend, "b1", "{s:?}");
            }
            let want = before + on_b0.len() as f64;
            let deadline = Instant::now() + BOUND;
            while cancelled_on_b0().await < want && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(cancelled_on_b0().await, want, "b0's copies cancelled");
        } else {
            // The first token came in time: no race, and the answer waited for b0.
            assert_eq!(on_b0.len(), 1, "{seen:?}");
            let s = on_b0[0];
            assert_eq!(
                (s.race.as_deref(), s.backend.as_str()),
                (None, "b0"),
                "{s:?}"
            );
            assert!(s.first_answer > DEADLINE, "{s:?}");
        }
        let m = metrics_when(&gw, |m| {
            metric_value(m, "pronto_backend_inflight{backend=\"b0\"}") == Some(0.0)
                && metric_value(m, "pronto_backend_inflight{backend=\"b1\"}") == Some(0.0)
        })
        .await;
        for b in ["b0", "b1"] {
            let inflight = format!("pronto_backend_inflight{{backend=\"{b}\"}}");
            assert_eq!(
                metric_value(&m, &inflight),
                Some(0.0),
                "bookings released: {m}"
            );
        }
        drop(gw);
    }
    fleet.shutdown().await;
}
