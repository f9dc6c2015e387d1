use std::collections::BTreeMap;

use super::*;
use crate::state::GatewayState;

/// A config file in a fresh temporary directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, text: &str) -> TempFile {
        let dir = std::env::temp_dir().join(format!(
            "pronto-reload-{tag}-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let f = TempFile(dir.join("pronto.yaml"));
        f.write(text);
        f
    }

    fn write(&self, text: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

const TWO: &str = "
pools:
  m:
    backends:
      - {name: a, url: 'http://127.0.0.1:1'}
      - {name: b, url: 'http://127.0.0.1:2'}
";

fn setup(text: &str) -> (TempFile, StateHandle, Metrics, Reloader) {
    let file = TempFile::new("unit", text);
    let config = Config::load(&file.0).unwrap();
    let metrics = Metrics::new();
    let state = StateHandle::new(GatewayState::new(
        Arc::new(config),
        Default::default(),
        &metrics,
    ));
    let reloader = Reloader::new(state.clone(), metrics.clone());
    (file, state, metrics, reloader)
}

fn reloads(metrics: &Metrics, result: ReloadResult) -> u64 {
    metrics
        .config_reloads_total
        .with_label_values(&[result.as_str()])
        .get()
}

#[test]
fn unchanged_file_is_not_swapped() {
    let (_file, state, metrics, r) = setup(TWO);
    let before = state.load();
    let report = r.reload(Trigger::Admin).unwrap();
    assert_eq!(
        (report.result, report.version),
        (ReloadResult::Unchanged, 1)
    );
    assert!(Arc::ptr_eq(&before, &state.load()));
    assert_eq!(reloads(&metrics, ReloadResult::Unchanged), 1);
}

#[test]
fn valid_change_swaps_and_keeps_unchanged_backends() {
    let (file, state, metrics, r) = setup(TWO);
    let a = Arc::clone(&state.load().backends[0]);
    let b = Arc::clone(&state.load().backends[1]);
    let new = TWO.replace(
        "{name: b, url: 'http://127.0.0.1:2'}",
        "{name: c, url: 'http://127.0.0.1:3'}",
    );
    file.write(&new);
    let report = r.reload(Trigger::Signal).unwrap();
    assert_eq!(report.result, ReloadResult::Ok, "{report:?}");
    assert_eq!(report.version, 2);
    assert_eq!(report.hash, config::text_hash(&new));
    assert_eq!((report.backends_kept, report.backends_new), (1, 1));
    assert_eq!(report.backends_removed, ["b"]);
    let now = state.load();
    assert!(Arc::ptr_eq(&now.backends[0], &a), "a kept its state");
    assert_eq!(now.backends[1].name(), "c");
    assert!(!now.backends.iter().any(|x| Arc::ptr_eq(x, &b)));
    assert_eq!(reloads(&metrics, ReloadResult::Ok), 1);
    assert_eq!(metrics.config_version.get(), 2);
    let status = r.status_json();
    assert_eq!(status["version"], 2);
    assert_eq!(status["last_reload"]["trigger"], "signal");
    assert_eq!(status["config"]["pools"]["m"]["backends"][1]["name"], "c");
}

#[test]
fn invalid_file_changes_nothing_and_is_located() {
    let (file, state, metrics, r) = setup(TWO);
    let before = state.load();
    for (bad, expect) in [
        ("pools:\n  m:\n    backends: [}\n", ":3:"),
        (
            &*TWO.replace("name: a,", "name: a, wieght: 2,"),
            ":5:27: pools.m.backends[0].wieght: unknown field `wieght`",
        ),
        (&*TWO.replace("127.0.0.1:2", "127.0.0.1:99999"), ":6:"),
    ] {
        file.write(bad);
        let report = r.reload(Trigger::Admin).unwrap();
        assert_eq!(report.result, ReloadResult::Error);
        assert_eq!(report.version, 1);
        let error = report.error.unwrap();
        assert!(error.starts_with(&file.0.display().to_string()), "{error}");
        assert!(error.contains(expect), "{error} lacks {expect}");
        assert!(Arc::ptr_eq(&before, &state.load()));
        let status = r.status_json();
        assert_eq!(status["last_error"]["message"], error.as_str());
        assert!(
            !r.is_news(&config::text_hash(bad)),
            "a rejected file is reported once"
        );
    }
    assert_eq!(reloads(&metrics, ReloadResult::Error), 3);
    assert_eq!(metrics.config_last_reload_successful.get(), 0);
    // Back to the active text: unchanged, and the error is resolved.
    file.write(TWO);
    assert_eq!(
        r.reload(Trigger::Watch).unwrap().result,
        ReloadResult::Unchanged
    );
    assert!(r.status_json()["last_error"].is_null());
    assert_eq!(metrics.config_last_reload_successful.get(), 1);
}

#[test]
fn start_bound_settings_warn_and_keep_their_running_values() {
    let (file, state, _metrics, r) = setup(&format!("listen: 127.0.0.1:18080\n{TWO}"));
    file.write(&format!(
        "listen: 127.0.0.1:18081\nthreads: 7\nexplain_headers: true\n{TWO}"
    ));
    let report = r.reload(Trigger::Admin).unwrap();
    assert_eq!(report.result, ReloadResult::Ok);
    let restart: Vec<&String> = report
        .warnings
        .iter()
        .filter(|w| w.contains("bound at start"))
        .collect();
    assert_eq!(restart.len(), 2, "{:?}", report.warnings);
    assert!(restart[0].contains(": listen changed"));
    assert!(restart[1].contains(": threads changed"));
    let now = state.load();
    assert_eq!(now.config.listen, "127.0.0.1:18080".parse().unwrap());
    assert_eq!(now.config.threads, 2);
    assert!(now.config.explain_headers, "the rest applies");
    // Compared with the previous file, not the running value: no warning the second time.
    file.write(&format!("listen: 127.0.0.1:18081\nthreads: 7\n{TWO}"));
    let report = r.reload(Trigger::Admin).unwrap();
    assert_eq!(report.result, ReloadResult::Ok);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
}

#[test]
fn no_file_no_reload() {
    let config = Config::from_backend_urls(
        &["http://127.0.0.1:1".to_string()],
        "m",
        pronto_core::routing::PolicyKind::LeastInflight,
    )
    .unwrap();
    let metrics = Metrics::new();
    let state = StateHandle::new(GatewayState::new(
        Arc::new(config),
        Default::default(),
        &metrics,
    ));
    let r = Reloader::new(state, metrics);
    assert_eq!(r.reload(Trigger::Admin), Err(NoConfigFile));
    assert!(r.status_json()["path"].is_null());
}

#[test]
fn rfc3339_formats_utc() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    let t = UNIX_EPOCH + Duration::from_millis(951_782_400_123); // leap day 2000
    assert_eq!(rfc3339(t), "2000-02-29T00:00:00.123Z");
    let t = UNIX_EPOCH + Duration::from_secs(1_767_225_599); // last second of 2025
    assert_eq!(rfc3339(t), "2025-12-31T23:59:59.000Z");
}

#[test]
fn labels_do_not_matter_to_unrelated_backends() {
    // Editing one backend's labels re-creates that backend only.
    let (file, state, _m, r) = setup(TWO);
    let a = Arc::clone(&state.load().backends[0]);
    let b = Arc::clone(&state.load().backends[1]);
    file.write(&TWO.replace(
        "url: 'http://127.0.0.1:2'}",
        "url: 'http://127.0.0.1:2', labels: {gpu: a100}}",
    ));
    let report = r.reload(Trigger::Admin).unwrap();
    assert_eq!((report.backends_kept, report.backends_new), (1, 1));
    assert!(report.backends_removed.len() == 1 && report.backends_removed[0] == "b");
    let now = state.load();
    assert!(Arc::ptr_eq(&now.backends[0], &a));
    assert!(!Arc::ptr_eq(&now.backends[1], &b));
    let labels: BTreeMap<String, String> = [("gpu".to_string(), "a100".to_string())].into();
    assert_eq!(now.backends[1].config.labels, labels);
}
