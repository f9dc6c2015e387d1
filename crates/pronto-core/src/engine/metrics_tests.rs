use super::*;

const VLLM: &str = include_str!("../../tests/fixtures/metrics/vllm.txt");
const VLLM_OLD: &str = include_str!("../../tests/fixtures/metrics/vllm-old.txt");
const SGLANG: &str = include_str!("../../tests/fixtures/metrics/sglang.txt");
const TGI: &str = include_str!("../../tests/fixtures/metrics/tgi.txt");

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

#[test]
fn vllm_sums_engines_and_averages_kv_usage() {
    let s = EngineSample::parse(VLLM).unwrap();
    assert_eq!(s.flavor, EngineFlavor::Vllm);
    assert_eq!((s.waiting, s.running), (4.0, 12.0));
    assert!(approx(s.kv_usage, 0.35), "{}", s.kv_usage);
    assert_eq!(s.prefix_queries, Some(1_572_864.0));
    assert_eq!(s.prefix_hits, Some(524_288.0));
    assert_eq!(s.cache_hit_rate, None);
    assert_eq!(s.kv_capacity_tokens, Some(27_910.0 * 16.0));
}

#[test]
fn kv_capacity_comes_from_cache_config_info_labels_only_when_complete() {
    assert_eq!(
        EngineSample::parse(VLLM_OLD).unwrap().kv_capacity_tokens,
        Some(7224.0 * 16.0)
    );
    assert_eq!(
        EngineSample::parse(SGLANG).unwrap().kv_capacity_tokens,
        None
    );
    assert_eq!(
        kv_capacity(r#"block_size="16",num_gpu_blocks="None""#),
        None
    );
    assert_eq!(kv_capacity(r#"num_gpu_blocks="10""#), None);
    assert_eq!(
        kv_capacity(r#"num_gpu_blocks="10", block_size="32""#),
        Some(320.0)
    );
}

#[test]
fn vllm_old_names_are_recognised() {
    let s = EngineSample::parse(VLLM_OLD).unwrap();
    assert_eq!(s.flavor, EngineFlavor::Vllm);
    assert_eq!((s.waiting, s.running), (9.0, 12.0));
    assert!(approx(s.kv_usage, 0.9731));
    assert_eq!((s.prefix_queries, s.prefix_hits), (None, None));
}

#[test]
fn vllm_prefers_new_kv_family_over_old() {
    let text = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n\
                vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n";
    assert!(approx(EngineSample::parse(text).unwrap().kv_usage, 0.1));
}

#[test]
fn sglang_maps_queue_running_usage_and_cache() {
    let s = EngineSample::parse(SGLANG).unwrap();
    assert_eq!(s.flavor, EngineFlavor::Sglang);
    assert_eq!((s.waiting, s.running), (2826.0, 24.0));
    assert!(approx(s.kv_usage, 0.28));
    assert_eq!(s.prefix_queries, Some(8_128_902.0));
    assert_eq!(s.prefix_hits, Some(3_250_000.0));
    assert!(approx(s.cache_hit_rate.unwrap(), 0.007507552643049313));
}

#[test]
fn tgi_has_queue_and_batch_but_no_kv() {
    let s = EngineSample::parse(TGI).unwrap();
    assert_eq!(s.flavor, EngineFlavor::Tgi);
    assert_eq!((s.waiting, s.running, s.kv_usage), (6.0, 32.0, 0.0));
    assert_eq!((s.prefix_queries, s.prefix_hits), (None, None));
}

#[test]
fn unknown_or_empty_pages_are_errors() {
    let go = "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\n\
              go_goroutines 42\n";
    for text in [
        "",
        "\n\n# just a comment\n",
        go,
        "<html>not found</html>",
        "\u{fffd}\0\x01",
    ] {
        assert_eq!(
            EngineSample::parse(text),
            Err(EngineMetricsError::UnknownFormat),
            "{text:?}"
        );
    }
    // Waiting without running is not enough.
    assert_eq!(
        EngineSample::parse("vllm:num_requests_waiting 3\n"),
        Err(EngineMetricsError::UnknownFormat)
    );
}

#[test]
fn malformed_line_of_a_read_family_is_an_error_elsewhere_ignored() {
    let bad = "vllm:num_requests_running 1\nvllm:num_requests_waiting{engine=\"0\" 3\n";
    assert_eq!(
        EngineSample::parse(bad),
        Err(EngineMetricsError::Malformed {
            line: 2,
            reason: "unterminated label set"
        })
    );
    let bad_value = "vllm:num_requests_running one\nvllm:num_requests_waiting 3\n";
    assert!(matches!(
        EngineSample::parse(bad_value),
        Err(EngineMetricsError::Malformed { line: 1, .. })
    ));
    let noise = "weird{x=\"unterminated 1\nother_metric abc\nvllm:num_requests_running 1\n\
                 vllm:num_requests_waiting 3\n";
    let s = EngineSample::parse(noise).unwrap();
    assert_eq!((s.waiting, s.running), (3.0, 1.0));
}

#[test]
fn non_finite_or_negative_load_is_rejected() {
    for v in ["NaN", "+Inf", "-Inf", "-1"] {
        let text = format!("vllm:num_requests_running 1\nvllm:num_requests_waiting {v}\n");
        assert!(
            matches!(
                EngineSample::parse(&text),
                Err(EngineMetricsError::BadValue {
                    metric: "vllm:num_requests_waiting",
                    ..
                })
            ),
            "{v}"
        );
    }
}

#[test]
fn kv_usage_is_clamped_to_one() {
    let text = "sglang:num_queue_reqs 0\nsglang:num_running_reqs 0\nsglang:token_usage 1.02\n";
    assert_eq!(EngineSample::parse(text).unwrap().kv_usage, 1.0);
}

#[test]
fn parser_reads_values_timestamps_and_exemplars() {
    let text = "a 1\nb{} 2.5e+03 1700000000000\nc{le=\"+Inf\"} +Inf\nd NaN\n\
                e_bucket{le=\"0.1\"} 7 # {trace_id=\"x\"} 0.05 1.7e9\n  f\t-Inf\n";
    let got: Vec<Sample<'_>> = samples(text).map(Result::unwrap).collect();
    let names: Vec<&str> = got.iter().map(|s| s.name).collect();
    assert_eq!(names, ["a", "b", "c", "d", "e_bucket", "f"]);
    assert_eq!(got[0].value, 1.0);
    assert_eq!(
        (got[1].value, got[1].timestamp_ms),
        (2500.0, Some(1_700_000_000_000))
    );
    assert_eq!(got[2].value, f64::INFINITY);
    assert_eq!(got[2].label("le").as_deref(), Some("+Inf"));
    assert!(got[3].value.is_nan());
    assert_eq!((got[4].value, got[4].timestamp_ms), (7.0, None));
    assert_eq!(got[5].value, f64::NEG_INFINITY);
}

#[test]
fn escaped_label_values_are_skipped_and_unescaped() {
    let lora = samples(VLLM)
        .map(Result::unwrap)
        .find(|s| s.name == "vllm:lora_requests_info")
        .unwrap();
    assert_eq!(lora.value, 1.7380512338e9);
    assert_eq!(
        lora.label("running_lora_adapters").as_deref(),
        Some("sql-lora,\"quoted} adapter\"")
    );
    assert_eq!(
        lora.label("waiting_lora_adapters").as_deref(),
        Some("a\\b\nc")
    );
    assert_eq!(lora.label("max_lora").as_deref(), Some("1"));
    assert_eq!(lora.label("absent"), None);
}

#[test]
fn parser_reports_line_numbers_and_names() {
    let text = "# c\n\nok 1\nbad{a=\"1\"} x\n{a=\"1\"} 1\nnovalue\n";
    let errs: Vec<LineError<'_>> = samples(text).filter_map(Result::err).collect();
    assert_eq!(
        errs,
        [
            LineError {
                line: 4,
                name: Some("bad"),
                reason: "invalid value"
            },
            LineError {
                line: 5,
                name: None,
                reason: "invalid metric name"
            },
            LineError {
                line: 6,
                name: None,
                reason: "no value"
            },
        ]
    );
}

#[test]
fn every_fixture_line_parses() {
    for (name, text) in [
        ("vllm", VLLM),
        ("vllm-old", VLLM_OLD),
        ("sglang", SGLANG),
        ("tgi", TGI),
    ] {
        let bad: Vec<_> = samples(text).filter_map(Result::err).collect();
        assert!(bad.is_empty(), "{name}: {bad:?}");
        assert!(samples(text).count() > 10, "{name}");
    }
}

proptest::proptest! {
    #[test]
    fn parse_never_panics(text in "\\PC{0,200}") {
        let _ = EngineSample::parse(&text);
        let _ = samples(&text).count();
    }

    #[test]
    fn sums_are_over_label_sets(values in proptest::collection::vec(0u32..1000, 1..8)) {
        let mut text = String::from("vllm:num_requests_running 0\n");
        for (i, v) in values.iter().enumerate() {
            text.push_str(&format!("vllm:num_requests_waiting{{engine=\"{i}\"}} {v}\n"));
        }
        let s = EngineSample::parse(&text).unwrap();
        proptest::prop_assert_eq!(s.waiting, values.iter().map(|&v| f64::from(v)).sum::<f64>());
    }
}
