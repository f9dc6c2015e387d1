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

// === Kubernetes ===

type Yaml = serde_yaml_ng::Value;

fn k8s_dir() -> std::path::PathBuf {
    Path::new(ROOT).join("deploy/k8s/base")
}

/// Every manifest of the base, deploy/k8s/base: `(file name, document)`.
fn manifests() -> Vec<(String, Yaml)> {
    let mut out = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(k8s_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    for name in names {
        let text = std::fs::read_to_string(k8s_dir().join(&name)).unwrap();
        let doc: Yaml = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, doc));
    }
    out
}

fn by_kind<'a>(docs: &'a [(String, Yaml)], kind: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .filter(|(_, d)| d["kind"].as_str() == Some(kind))
        .map(|(_, d)| d)
        .collect()
}

fn one<'a>(docs: &'a [(String, Yaml)], kind: &str) -> &'a Yaml {
    let found = by_kind(docs, kind);
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

fn s(v: &Yaml) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// Kinds with no schema in kubernetes-validate (kustomize's own), checked field by field.
const CUSTOM: [&str; 1] = ["Kustomization"];

#[test]
fn kubernetes_manifests_validate_against_the_api_schemas() {
    let Some(validate) = tool::find(&["kubernetes-validate"], "PyPI package kubernetes-validate")
    else {
        return;
    };
    let docs = manifests();
    let files: Vec<&str> = docs
        .iter()
        .filter(|(_, d)| !CUSTOM.contains(&s(&d["kind"])))
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(files.len(), 5, "{files:?}");
    let out = tool::run_ok(
        Command::new(validate)
            .arg("--strict")
            .args(&files)
            .current_dir(k8s_dir()),
    );
    for f in &files {
        assert!(out.contains(&format!("INFO {f} passed")), "{f}: {out}");
    }
}

#[test]
fn kubernetes_manifests_agree_with_each_other_and_the_config() {
    let docs = manifests();
    let deploy = one(&docs, "Deployment");
    let pod = &deploy["spec"]["template"];
    let pod_labels = &pod["metadata"]["labels"];
    assert_eq!(&deploy["spec"]["selector"]["matchLabels"], pod_labels);
    let c = &pod["spec"]["containers"][0];
    let port = |name: &str| -> u64 {
        c["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    };

    // The ConfigMap's config: the ports, the grace period and the token variable.
    let cm = one(&docs, "ConfigMap");
    let config_text = s(&cm["data"]["pronto.yaml"]);
    let config: Yaml = serde_yaml_ng::from_str(config_text).unwrap();
    let config_port =
        |key: &str| -> u64 { s(&config[key]).rsplit(':').next().unwrap().parse().unwrap() };
    assert_eq!(port("http"), config_port("listen"));
    assert_eq!(port("admin"), config_port("admin_listen"));
    let token_var = s(&config["admin"]["token"]["env"]);
    let env = c["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some(token_var))
        .unwrap_or_else(|| panic!("the container does not set {token_var}"));
    // The Secret the docs say to create.
    assert_eq!(s(&env["valueFrom"]["secretKeyRef"]["name"]), "pronto-admin");
    let args: Vec<&str> = c["args"].as_sequence().unwrap().iter().map(s).collect();
    let config_path = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
    let mount = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| config_path.starts_with(s(&m["mountPath"])))
        .expect("the config file is on a mounted volume");
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees updates"
    );
    assert!(config_path.ends_with("/pronto.yaml"));
    let volume = pod["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["configMap"]["name"], cm["metadata"]["name"]);

    // Probes on the admin port; the drain fits in the termination grace period.
    assert_eq!(s(&c["readinessProbe"]["httpGet"]["path"]), "/readyz");
    assert_eq!(s(&c["livenessProbe"]["httpGet"]["path"]), "/healthz");
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(s(&c[probe]["httpGet"]["port"]), "admin", "{probe}");
    }
    let pre_stop: Vec<&str> = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    assert_eq!(pre_stop[0], "/bin/sleep");
    let pre_stop_s: u64 = pre_stop[1].parse().unwrap();
    let grace = s(&config["grace_period"]);
    let grace_s: u64 = grace.strip_suffix('s').unwrap().parse().unwrap();
    assert_eq!(
        pod["spec"]["terminationGracePeriodSeconds"].as_u64(),
        Some(pre_stop_s + grace_s + 5),
        "terminationGracePeriodSeconds = preStop + grace_period ({grace}) + 5 s"
    );
    assert_eq!(
        pod["spec"]["securityContext"]["runAsNonRoot"],
        Yaml::Bool(true)
    );

    // The Service and PodDisruptionBudget select the gateway's pods.
    let gateway_service = by_kind(&docs, "Service")
        .into_iter()
        .find(|svc| svc["metadata"]["name"] == deploy["metadata"]["name"])
        .expect("a Service for the gateway");
    assert_eq!(&gateway_service["spec"]["selector"], pod_labels);
    assert_eq!(
        s(&gateway_service["spec"]["ports"][0]["targetPort"]),
        "http"
    );
    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], pod_labels);

    // The DNS-discovered pool is the headless vLLM Service, by name and port.
    let pools = config["pools"].as_mapping().unwrap();
    assert_eq!(pools.len(), 1);
    let dns = s(&pools.values().next().unwrap()["discover"]["dns"]);
    let (host, dns_port) = dns.rsplit_once(':').unwrap();
    let vllm = by_kind(&docs, "Service")
        .into_iter()
        .find(|svc| svc["metadata"]["name"].as_str() == Some(host))
        .unwrap_or_else(|| panic!("no Service {host} in deploy/k8s"));
    assert_eq!(
        s(&vllm["spec"]["clusterIP"]),
        "None",
        "headless: one address per pod"
    );
    assert_eq!(
        vllm["spec"]["ports"][0]["port"]
            .as_u64()
            .unwrap()
            .to_string(),
        dns_port
    );

    // The Kustomization lists every other manifest.
    let k = one(&docs, "Kustomization");
    let mut listed: Vec<&str> = k["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    listed.sort();
    let mut files: Vec<&str> = docs
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "kustomization.yaml")
        .collect();
    files.sort();
    assert_eq!(listed, files);
}

#[test]
fn the_configmap_config_passes_check_config() {
    let docs = manifests();
    let cm = one(&docs, "ConfigMap");
    let dir = std::env::temp_dir().join(format!("pronto-k8s-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pronto.yaml");
    std::fs::write(&file, s(&cm["data"]["pronto.yaml"])).unwrap();
    let check = |token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pronto"));
        cmd.arg("check-config")
            .arg(&file)
            .env_remove("PRONTO_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.env("PRONTO_ADMIN_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = check(Some("a-token-from-the-secret-0123456789"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{text}");
    assert!(text.starts_with("OK: 1 pool"), "{text}");
    assert!(!text.contains("warning"), "{text}");
    // Without the Secret's variable the pod would not start.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&file, s(&cm["data"]["pronto.yaml"])).unwrap();
    let (ok, text) = check(None);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok && text.contains("PRONTO_ADMIN_TOKEN"), "{text}");
}

// === What `kubectl apply -k` applies: every variant, rendered by kustomize ===

/// `kubectl kustomize DIR` (kubectl's own kustomize, the one `kubectl apply -k` uses): the
/// rendered documents, or `None` where kubectl is missing outside CI.
fn kustomize(dir: &str) -> Option<Vec<Yaml>> {
    let kubectl = tool::find(&["kubectl"], "kubectl (kustomize)")?;
    let out = tool::run_ok(
        Command::new(kubectl)
            .arg("kustomize")
            .arg(Path::new(ROOT).join(dir)),
    );
    let docs = serde_yaml_ng::Deserializer::from_str(&out)
        .map(|d| <Yaml as serde::Deserialize>::deserialize(d).unwrap())
        .filter(|d| !d.is_null())
        .collect();
    Some(docs)
}

fn kinds(docs: &[Yaml]) -> Vec<String> {
    let mut k: Vec<String> = docs.iter().map(|d| s(&d["kind"]).to_string()).collect();
    k.sort();
    k
}

/// `kubernetes-validate --strict` over rendered documents: a kind with no API schema (a custom
/// resource whose CRD the cluster may lack) fails it.
fn validate_rendered(name: &str, docs: &[Yaml]) {
    let Some(validate) = tool::find(&["kubernetes-validate"], "PyPI package kubernetes-validate")
    else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("pronto-k8s-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        let f = format!("{i}-{}.yaml", s(&d["kind"]).to_lowercase());
        std::fs::write(dir.join(&f), serde_yaml_ng::to_string(d).unwrap()).unwrap();
        files.push(f);
    }
    let out = Command::new(validate)
        .arg("--strict")
        .args(&files)
        .current_dir(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: {text}");
    for f in &files {
        assert!(
            text.contains(&format!("INFO {f} passed")),
            "{name}: {f}: {text}"
        );
    }
}

#[test]
fn deploy_k8s_renders_only_built_in_kinds_and_they_validate() {
    // What `kubectl apply -k deploy/k8s` applies on a plain cluster: no custom resource.
    let Some(docs) = kustomize("deploy/k8s") else {
        return;
    };
    assert_eq!(
        kinds(&docs),
        [
            "ConfigMap",
            "Deployment",
            "PodDisruptionBudget",
            "Service",
            "Service"
        ]
    );
    validate_rendered("base", &docs);
    // The image is the one the docs build and tag, and the Cargo package's version.
    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let image = s(&deploy["spec"]["template"]["spec"]["containers"][0]["image"]);
    assert_eq!(image, format!("pronto:{}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn the_image_name_and_tag_are_the_same_everywhere() {
    let tag = format!("pronto:{}", env!("CARGO_PKG_VERSION"));
    for file in [
        "README.md",
        "docs/operating.md",
        "Dockerfile",
        "deploy/k8s/base/kustomization.yaml",
    ] {
        let text = std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap();
        let builds: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("docker build"))
            .collect();
        for line in &builds {
            assert!(line.contains(&format!("-t {tag}")), "{file}: {line}");
        }
        for line in text
            .lines()
            .filter(|l| l.contains("docker run") || l.contains("docker push"))
        {
            assert!(line.contains(&tag), "{file}: {line}");
        }
        assert!(
            !builds.is_empty() || text.contains(&tag),
            "{file} names the image {tag}"
        );
    }
    let base = std::fs::read_to_string(k8s_dir().join("kustomization.yaml")).unwrap();
    let k: Yaml = serde_yaml_ng::from_str(&base).unwrap();
    let image = &k["images"][0];
    assert_eq!(s(&image["name"]), "pronto");
    assert_eq!(
        format!("{}:{}", s(&image["newName"]), s(&image["newTag"])),
        tag
    );
}

#[test]
fn the_monitoring_variant_adds_a_pod_monitor_for_the_admin_metrics() {
    let Some(docs) = kustomize("deploy/k8s/monitoring") else {
        return;
    };
    let base = kustomize("deploy/k8s").unwrap();
    let mut want = kinds(&base);
    want.push("PodMonitor".into());
    want.sort();
    assert_eq!(kinds(&docs), want);
    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod_labels = &deploy["spec"]["template"]["metadata"]["labels"];
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    let secret = &c["env"][0]["valueFrom"]["secretKeyRef"];
    // PodMonitor (a CRD: no schema here; the fields the operator requires, checked here).
    let pm = docs.iter().find(|d| d["kind"] == "PodMonitor").unwrap();
    assert_eq!(s(&pm["apiVersion"]), "monitoring.coreos.com/v1");
    assert!(pm["metadata"]["name"].is_string());
    assert_eq!(&pm["spec"]["selector"]["matchLabels"], pod_labels);
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(s(&ep["port"]), "admin");
    assert_eq!(s(&ep["path"]), "/metrics");
    assert_eq!(s(&ep["authorization"]["type"]), "Bearer");
    assert_eq!(
        &ep["authorization"]["credentials"], secret,
        "the pods' token Secret"
    );
}

#[test]
fn the_replicated_variant_renders_and_validates() {
    let Some(docs) = kustomize("deploy/k8s/replicated") else {
        return;
    };
    let base = kustomize("deploy/k8s").unwrap();
    assert_eq!(
        docs.len(),
        base.len() + 3,
        "NATS: its config, a Deployment and a Service"
    );
    validate_rendered("replicated", &docs);
}

// === The replicated variant (deploy/k8s/replicated) ===

fn replicated_dir() -> std::path::PathBuf {
    Path::new(ROOT).join("deploy/k8s/replicated")
}

fn replicated(name: &str) -> Yaml {
    let text = std::fs::read_to_string(replicated_dir().join(name)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("replicated/{name}: {e}"))
}

#[test]
fn the_replicated_variant_validates_against_the_api_schemas() {
    let Some(validate) = tool::find(&["kubernetes-validate"], "PyPI package kubernetes-validate")
    else {
        return;
    };
    // The whole resources (the Deployment patch is partial: checked field by field below).
    let files = [
        "nats-config.yaml",
        "nats-deployment.yaml",
        "nats-service.yaml",
        "pronto-config.yaml",
    ];
    let out = tool::run_ok(
        Command::new(validate)
            .arg("--strict")
            .args(files)
            .current_dir(replicated_dir()),
    );
    for f in files {
        assert!(out.contains(&format!("INFO {f} passed")), "{f}: {out}");
    }
}

#[test]
fn the_replicated_variant_names_replicas_after_their_pods_and_finds_nats() {
    let base = manifests();
    let deploy = one(&base, "Deployment");
    let k = replicated("kustomization.yaml");
    let listed = |key: &str| -> Vec<String> {
        k[key]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|r| s(if r.is_string() { r } else { &r["path"] }).to_string())
            .collect()
    };
    assert_eq!(
        listed("resources"),
        [
            "../base",
            "nats-config.yaml",
            "nats-deployment.yaml",
            "nats-service.yaml"
        ]
    );
    assert_eq!(
        listed("patches"),
        ["pronto-config.yaml", "pronto-replica-id.yaml"]
    );
    // The Deployment patch: the base's Deployment and container, several replicas, POD_NAME
    // from the downward API.
    let patch = replicated("pronto-replica-id.yaml");
    assert_eq!(patch["kind"], deploy["kind"]);
    assert_eq!(patch["metadata"]["name"], deploy["metadata"]["name"]);
    assert!(patch["spec"]["replicas"].as_u64().unwrap() >= 2);
    let c = &patch["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["name"],
        deploy["spec"]["template"]["spec"]["containers"][0]["name"]
    );
    let env = &c["env"][0];
    assert_eq!(
        s(&env["valueFrom"]["fieldRef"]["fieldPath"]),
        "metadata.name"
    );
    // The config patch replaces the base's ConfigMap: the same config plus `cluster:`, whose
    // replica name is that variable and whose server is the NATS Service.
    let cm = replicated("pronto-config.yaml");
    assert_eq!(
        cm["metadata"]["name"],
        one(&base, "ConfigMap")["metadata"]["name"]
    );
    let text = s(&cm["data"]["pronto.yaml"]);
    let config: Yaml = serde_yaml_ng::from_str(text).unwrap();
    let cluster = &config["cluster"];
    assert_eq!(cluster["replica"]["env"], env["name"]);
    let nats = s(&cluster["nats"]).strip_prefix("nats://").unwrap();
    let (host, port) = nats.rsplit_once(':').unwrap();
    let svc = replicated("nats-service.yaml");
    assert_eq!(s(&svc["metadata"]["name"]), host);
    assert_eq!(
        svc["spec"]["ports"][0]["port"]
            .as_u64()
            .unwrap()
            .to_string(),
        port
    );
    let nats_deploy = replicated("nats-deployment.yaml");
    let name = "app.kubernetes.io/name";
    assert_eq!(
        svc["spec"]["selector"][name],
        nats_deploy["spec"]["template"]["metadata"]["labels"][name]
    );
    // NATS admits the replicas by the password of one Secret: the server's variable and the
    // gateway's come from the same key, the config reads the gateway's, and the server's
    // config (mounted from nats-config.yaml) names the same user, its variable, and only the
    // cluster's subjects.
    let nats_pod = &nats_deploy["spec"]["template"]["spec"];
    let nats_c = &nats_pod["containers"][0];
    let server_var = &nats_c["env"][0];
    let password_var = &c["env"][1];
    assert_eq!(
        server_var["valueFrom"]["secretKeyRef"],
        password_var["valueFrom"]["secretKeyRef"]
    );
    assert_eq!(
        s(&password_var["valueFrom"]["secretKeyRef"]["name"]),
        "pronto-nats"
    );
    assert_eq!(cluster["auth"]["password"]["env"], password_var["name"]);
    let nats_cm = replicated("nats-config.yaml");
    let mount = &nats_c["volumeMounts"][0];
    let volume = &nats_pod["volumes"][0];
    assert_eq!(volume["name"], mount["name"]);
    assert_eq!(volume["configMap"]["name"], nats_cm["metadata"]["name"]);
    let args: Vec<&str> = nats_c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    assert_eq!(
        args,
        [
            "--config",
            &format!("{}/nats-server.conf", s(&mount["mountPath"]))
        ]
    );
    let conf = s(&nats_cm["data"]["nats-server.conf"]);
    let subjects = format!("\"{}.*\"", s(&cluster["subject"]));
    for want in [
        format!("port: {port}"),
        format!("user: {}", s(&cluster["auth"]["user"])),
        format!("password: ${}", s(&server_var["name"])),
        format!("publish: {subjects}"),
        format!("subscribe: {subjects}"),
    ] {
        assert!(
            conf.contains(&want),
            "nats-server.conf lacks `{want}`:\n{conf}"
        );
    }
    // Everything else is the base config, and it passes check-config in a pod.
    let mut without: Yaml = config.clone();
    without.as_mapping_mut().unwrap().remove("cluster");
    let base_config: Yaml =
        serde_yaml_ng::from_str(s(&one(&base, "ConfigMap")["data"]["pronto.yaml"])).unwrap();
    assert_eq!(without, base_config);
    let dir = std::env::temp_dir().join(format!("pronto-k8s-replicated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pronto.yaml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pronto"))
        .arg("check-config")
        .arg(&file)
        .env("PRONTO_ADMIN_TOKEN", "a-token-from-the-secret-0123456789")
        .env("POD_NAME", "pronto-7d9f8c6b5-x2k4p")
        .env("NATS_PASSWORD", "a-password-from-the-secret-0123")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("warning"), "{text}");
}

// === Grafana ===

#[test]
fn the_dashboard_is_well_formed_and_covers_the_operating_signals() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("deploy/grafana/pronto.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dash["uid"], "pronto-gateway");
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "pool", "backend"]);
    let panels = dash["panels"].as_array().unwrap();
    let mut ids = std::collections::HashSet::new();
    let mut exprs = Vec::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate id {}",
            p["id"]
        );
        let pos = &p["gridPos"];
        let (x, w) = (pos["x"].as_u64().unwrap(), pos["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{}: off the grid", p["title"]);
        if p["type"] == "row" {
            continue;
        }
        assert!(
            p["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{}",
            p["title"]
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    let all = exprs.join("\n");
    for family in [
        "pronto_client_ttft_seconds",
        "pronto_ttft_seconds",
        "pronto_predicted_ttft_seconds",
        "pronto_ttft_prediction_error_seconds",
        "pronto_ttft_prediction_abs_error_seconds",
        "pronto_route_ttft_slo_seconds",
        "pronto_route_decisions_total",
        "pronto_backend_queue_depth",
        "pronto_backend_kv_usage_ratio",
        "pronto_retries_total",
        "pronto_backend_ejections_total",
        "pronto_rate_limited_total",
        "pronto_admission_sheds_total",
        "pronto_requests_total",
        "pronto_upstream_errors_total",
        "pronto_pool_healthy_backends",
        "pronto_build_info",
        "pronto_client_ttfa_seconds",
        "pronto_ttfa_seconds",
        "pronto_failovers_total",
        "pronto_hedges_sent_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(all.contains(family), "no panel shows {family}");
    }
}
