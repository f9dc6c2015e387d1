//! The deployment files under `deploy/`: the Prometheus alerting rules load and pass their
//! unit tests (`promtool`), the Grafana dashboard is well formed and covers what operators
//! need, and the Kubernetes manifests validate.

#[path = "support/tool.rs"]
mod tool;

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn alert_rules_load_and_pass_their_unit_tests() {
    let Some(promtool) = tool::find(&["promtool"], "Debian package prometheus") else {
        return;
    };
    let dir = Path::new(ROOT).join("deploy/prometheus");
    let out = tool::run_ok(
        Command::new(&promtool)
            .args(["check", "rules", "pronto-rules.yaml"])
            .current_dir(&dir),
    );
    assert!(out.contains("SUCCESS: 5 rules found"), "{out}");
    let out = tool::run_ok(
        Command::new(&promtool)
            .args(["test", "rules", "pronto-rules.test.yaml"])
            .current_dir(&dir),
    );
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert has a unit test and a section in the operating guide.
    let rules = std::fs::read_to_string(dir.join("pronto-rules.yaml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("pronto-rules.test.yaml")).unwrap();
    let guide = std::fs::read_to_string(Path::new(ROOT).join("docs/operating.md")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 5, "{alerts:?}");
    for alert in alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no unit test"
        );
        assert!(
            guide.contains(&format!("### {alert}\n")),
            "{alert} is not in docs/operating.md"
        );
        assert!(
            rules.contains(&format!(
                "docs/operating.md#{}.",
                alert.to_ascii_lowercase()
            )),
            "{alert} links its section"
        );
    }
}
