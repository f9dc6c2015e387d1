//! A stream through the gateway with the real OpenAI Python SDK (installed by `.ci/run`), and
//! its `models.list` / `models.retrieve` and a request id round trip.

mod common;

use common::{config_yaml, pool, Behavior, Gateway, TestBackend};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_streams_through_the_gateway() {
    let has_sdk = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_sdk && std::env::var_os("CI").is_none() {
        eprintln!(
            "SKIPPED: the OpenAI Python SDK is not installed (pip install openai); CI installs it"
        );
        return;
    }
    assert!(
        has_sdk,
        "CI must have the OpenAI Python SDK (scripts/bootstrap.sh installs it)"
    );
    let backend = TestBackend::start("b", Behavior::default()).await;
    let gw = Gateway::start(&config_yaml(
        &pool("llama", "least_inflight", &[backend.url()]),
        "",
    ));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/openai_stream.py");
    let base = gw.url("/v1");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args([script, &base, "llama"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sdk failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("t0 t1 t2 t3 "));
    assert_eq!(lines.next(), Some("CHUNKS 6"), "role + 4 tokens + finish");
    assert_eq!(lines.next(), Some("NONSTREAM t0 t1 t2 t3 "));
    assert_eq!(lines.next(), Some("MODELS llama"));
    assert_eq!(lines.next(), Some("RETRIEVE llama model"));
    assert_eq!(lines.next(), Some("MISSING 404 model_not_found"));
    assert_eq!(lines.next(), Some("REQUEST_ID sdk-request-1"));
    assert_eq!(backend.requests(), 3);
}
