//! The registry: families render, a departed backend leaves no series, start-up and config
//! zero series.

use super::*;

#[test]
fn renders_registered_families() {
    let m = Metrics::new();
    m.requests_total.with_label_values(&["p", "b", "200"]).inc();
    m.retries_total
        .with_label_values(&["p", RetryReason::Connect.as_str()])
        .inc();
    let text = m.render();
    assert!(text.contains("pronto_requests_total{backend=\"b\",code=\"200\",pool=\"p\"} 1"));
    assert!(text.contains("pronto_retries_total{pool=\"p\",reason=\"connect\"} 1"));
}

/// One series in every family with a `backend` label, for `backend`.
fn touch_every_backend_family(m: &Metrics, backend: &str) {
    m.requests_total
        .with_label_values(&["p", backend, "200"])
        .inc();
    m.requests_total
        .with_label_values(&["p", backend, "503"])
        .inc();
    m.backend_inflight.with_label_values(&[backend]).set(1);
    m.backend_healthy.with_label_values(&[backend]).set(1);
    m.ttft_seconds.with_label_values(&[backend]).observe(0.1);
    m.ttfa_seconds.with_label_values(&[backend]).observe(0.2);
    m.tpot_seconds.with_label_values(&[backend]).observe(0.01);
    m.e2e_seconds.with_label_values(&[backend]).observe(1.0);
    m.upstream_errors_total
        .with_label_values(&[backend, "connect"])
        .inc();
    m.backend_queue_depth.with_label_values(&[backend]).set(2.0);
    m.backend_kv_usage_ratio
        .with_label_values(&[backend])
        .set(0.5);
    m.engine_scrape_errors_total
        .with_label_values(&[backend])
        .inc();
    m.ttft_prediction_error_seconds
        .with_label_values(&[backend])
        .observe(0.01);
    m.ttft_prediction_abs_error_seconds
        .with_label_values(&[backend])
        .observe(0.01);
    // The exact index's sink: kv_events_total (4 results), resyncs, blocks.
    let sink = m.kv_index_sink(backend);
    sink.count("received", 1);
    sink.blocks(3);
    m.health_check_failures_total
        .with_label_values(&[backend, "timeout"])
        .inc();
    m.kv_events_connect_failures_total
        .with_label_values(&[backend])
        .inc();
    m.kv_events_subscriber_restarts_total
        .with_label_values(&[backend])
        .inc();
    m.count_ejection(backend);
    m.progress
        .backend_stalled
        .with_label_values(&[backend])
        .set(1);
    m.progress
        .stall_exclusions_total
        .with_label_values(&[backend])
        .inc();
}

/// Families (by name) with a series for `backend` in the text exposition.
fn families_with(text: &str, backend: &str) -> std::collections::BTreeSet<String> {
    let label = format!("backend=\"{backend}\"");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(&label))
        .map(|l| {
            let name = &l[..l.find('{').unwrap()];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            base.to_string()
        })
        .collect()
}

#[test]
fn forgetting_a_backend_removes_every_series_with_its_label() {
    let m = Metrics::new();
    touch_every_backend_family(&m, "b1");
    touch_every_backend_family(&m, "b2");
    m.requests_total
        .with_label_values(&["p", NONE, "404"])
        .inc();
    let before = families_with(&m.render(), "b1");
    assert_eq!(before.len(), 22, "{before:?}");
    assert_eq!(
        m.per_backend_families(),
        before.len(),
        "every family with a backend label is listed when registered"
    );

    m.forget_backend("b1");
    let text = m.render();
    assert!(!text.contains("backend=\"b1\""), "{text}");
    assert_eq!(families_with(&text, "b2"), before, "others untouched");
    assert!(text.contains("pronto_requests_total{backend=\"none\",code=\"404\",pool=\"p\"} 1"));

    // Forgetting twice, or a backend never seen, is harmless; the name can come back.
    m.forget_backend("b1");
    m.forget_backend("never");
    m.engine_scrape_errors_total
        .with_label_values(&["b1"])
        .inc();
    assert!(m
        .render()
        .contains("pronto_engine_scrape_errors_total{backend=\"b1\"} 1"));
}

#[test]
fn build_info_reload_results_and_process_series_exist_from_the_start() {
    let text = Metrics::new().render();
    let info = format!("pronto_build_info{{revision=\"{REVISION}\",version=\"{VERSION}\"}} 1");
    assert!(text.contains(&info), "{text}");
    assert!(!REVISION.is_empty());
    for result in ["ok", "unchanged", "error"] {
        let line = format!("pronto_config_reloads_total{{result=\"{result}\"}} 0");
        assert!(text.contains(&line), "{line}");
    }
    #[cfg(target_os = "linux")]
    for family in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(text.contains(&format!("\n{family} ")), "{family}");
    }
}

#[test]
fn the_config_publishes_slos_and_zero_series() {
    let yaml = "
routes:
  - {name: chat, pool: m, ttft_slo: 800ms, match: {model: m}}
  - {name: bulk, pool: m}
auth: {keys: [{name: k, key: sk-kkkkkkkk}]}
rate_limits:
  per_key: {requests_per_minute: 10}
  routes: {bulk: {max_concurrent: 4, tokens_per_minute: 100}}
pools:
  m:
    backends:
      - {name: a, url: 'http://h:1', kv_events: {endpoint: 'tcp://h:5557', block_size: 16}}
      - {name: b, url: 'http://h:2'}
";
    let config = crate::config::Config::from_yaml_str(yaml, "t").unwrap();
    let m = Metrics::new();
    m.count_ejection("a");
    m.publish_config(&config);
    let text = m.render();
    for line in [
        "pronto_route_ttft_slo_seconds{pool=\"m\",route=\"chat\"} 0.8",
        "pronto_backend_ejections_total{backend=\"a\"} 1",
        "pronto_backend_ejections_total{backend=\"b\"} 0",
        "pronto_upstream_errors_total{backend=\"b\",kind=\"connect\"} 0",
        "pronto_upstream_errors_total{backend=\"a\",kind=\"mid_stream\"} 0",
        "pronto_retries_total{pool=\"m\",reason=\"status_5xx\"} 0",
        "pronto_client_disconnects_total{pool=\"m\"} 0",
        "pronto_client_stalled_total{pool=\"m\"} 0",
        "pronto_admission_queue_length{route=\"chat\"} 0",
        "pronto_admission_queue_wait_seconds_count{route=\"chat\"} 0",
        "pronto_engine_scrape_errors_total{backend=\"a\"} 0",
        "pronto_health_check_failures_total{backend=\"b\",reason=\"refused\"} 0",
        "pronto_health_check_failures_total{backend=\"a\",reason=\"status\"} 0",
        "pronto_kv_events_connect_failures_total{backend=\"a\"} 0",
        "pronto_kv_events_subscriber_restarts_total{backend=\"a\"} 0",
        "pronto_admission_sheds_total{reason=\"slo_miss\",route=\"chat\"} 0",
        "pronto_rate_limited_total{limit=\"requests\",name=\"k\",scope=\"key\"} 0",
        "pronto_rate_limited_total{limit=\"concurrency\",name=\"bulk\",scope=\"route\"} 0",
        "pronto_rate_limited_total{limit=\"tokens\",name=\"bulk\",scope=\"route\"} 0",
    ] {
        assert!(text.contains(line), "missing {line} in:\n{text}");
    }
    // Only the limits configured; only the routes with an SLO; KV-event series only
    // for a backend with `kv_events:`.
    assert!(!text.contains("pronto_kv_events_connect_failures_total{backend=\"b\"}"));
    assert!(!text.contains("limit=\"tokens\",name=\"k\""));
    assert!(!text.contains("route=\"bulk\"} "));
    // A reload that drops the SLO withdraws its gauge.
    let no_slo = yaml.replace("ttft_slo: 800ms, ", "");
    m.publish_config(&crate::config::Config::from_yaml_str(&no_slo, "t").unwrap());
    assert!(!m.render().contains("pronto_route_ttft_slo_seconds{"));
    m.publish_pools([("m", 2, 1)]);
    m.publish_pools([("n", 1, 0)]);
    let text = m.render();
    assert!(text.contains("pronto_pool_healthy_backends{pool=\"n\"} 0"));
    assert!(!text.contains("pronto_pool_backends{pool=\"m\"}"));
}
