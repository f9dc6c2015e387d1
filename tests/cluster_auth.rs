//! Replicas that authenticate (`cluster.auth`, `cluster.tls`) against a real `nats-server`
//! started with authorization and TLS, its CA and certificates made here with rcgen.
//!
//! - Replicas with the right credentials (a user and password; an NKey) and the custom CA
//!   sync, over TLS with client certificates, checking the server's name they were told.
//! - A replica without credentials is refused: it says so in its log, counts it in
//!   `pronto_cluster_nats_errors_total{reason="authorization"}`, and keeps routing alone. One
//!   that does not find the server's certificate valid for the name it connects to is
//!   refused with `reason="tls"`.
//! - A publisher without credentials cannot connect; one with credentials for other subjects
//!   has its forged booking refused by the server's permissions, and no replica ever holds
//!   it — while the same message from a replica's credentials does arrive.
//! - A token works too.
//! - The NATS of `deploy/k8s/replicated` admits the replicas' user with the Secret's password
//!   on the cluster's subjects only, and nobody else.

mod common;
#[path = "support/nats.rs"]
mod nats;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{client, config_yaml, metric_value, metrics, Behavior, Gateway, TestBackend};
use pronto_core::cluster::{wire, BackendRef, SyncEvent};
use pronto_core::load::RequestLoad;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

const REPLICA_PASSWORD: &str = "password-of-the-replicas";
const METRICS_PASSWORD: &str = "password-of-the-metrics-reader";

/// A temporary directory, removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("pronto-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

/// A CA, the server's certificate (for `nats.test` and `localhost`, not `127.0.0.1`) and a
/// client certificate, all PEM files in `d`.
struct Pki {
    ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

fn pki(d: &Dir) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "Pronto test CA");
    let ca = params.self_signed(&ca_key).unwrap();
    let leaf = |names: &[&str]| {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(&["nats.test", "localhost"]);
    let (client_cert, client_key) = leaf(&["pronto-replica"]);
    Pki {
        ca: d.file("ca.pem", &ca.pem()),
        client_cert: d.file("client.pem", &client_cert),
        client_key: d.file("client.key", &client_key),
        server_cert: d.file("server.pem", &server_cert),
        server_key: d.file("server.key", &server_key),
    }
}

/// The subject permissions docs/operating.md recommends: the cluster's subjects only.
const CLUSTER_PERMISSIONS: &str =
    "permissions: {publish: \"pronto.cluster.*\", subscribe: \"pronto.cluster.*\"}";

/// A nats-server with TLS (client certificates verified) and three users: the replicas' (a
/// password), one replica's NKey, and a metrics reader allowed only `metrics.>`.
fn secured_nats(d: &Dir, pki: &Pki, nkey_public: &str) -> Option<nats::Nats> {
    let p = |p: &Path| p.display().to_string();
    let conf = format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  \
         timeout: 2\n}}\nauthorization {{\n  users = [\n    \
         {{user: replica, password: \"{REPLICA_PASSWORD}\", {CLUSTER_PERMISSIONS}}}\n    \
         {{nkey: \"{nkey_public}\", {CLUSTER_PERMISSIONS}}}\n    \
         {{user: metrics, password: \"{METRICS_PASSWORD}\", permissions: {{publish: \"metrics.>\", \
         subscribe: \"metrics.>\"}}}}\n  ]\n}}\n",
        p(&pki.server_cert),
        p(&pki.server_key),
        p(&pki.ca),
    );
    nats::Nats::start_with(d.file("nats.conf", &conf), &[])
}

fn cluster_yaml(nats: &str, replica: &str, extra: &str) -> String {
    format!(
        "explain_headers: true\ncluster:\n  nats: {nats}\n  replica: {replica}\n  \
         heartbeat: 200ms\n  peer_timeout: 5s\n{extra}"
    )
}

fn tls_yaml(pki: &Pki, server_name: Option<&str>) -> String {
    let mut s = format!(
        "  tls:\n    ca: {}\n    cert: {}\n    key: {}\n",
        pki.ca.display(),
        pki.client_cert.display(),
        pki.client_key.display()
    );
    if let Some(n) = server_name {
        s.push_str(&format!("    server_name: {n}\n"));
    }
    s
}

fn pool(url: &str) -> String {
    format!(
        "  m:\n    policy: least_inflight\n    backends:\n      - name: x\n        url: {url}\n"
    )
}

fn value(m: &str, name: &str) -> f64 {
    metric_value(m, name).unwrap_or(0.0)
}

/// Poll `gw`'s metrics until `ready` holds; a panic naming `what` after `timeout`.
async fn wait_for(gw: &Gateway, what: &str, timeout: Duration, ready: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        let m = metrics(gw).await;
        if ready(&m) {
            return;
        }
        if Instant::now() > deadline {
            let sync: Vec<&str> = m
                .lines()
                .filter(|l| l.starts_with("pronto_cluster"))
                .collect();
            panic!("timed out waiting for {what}:\n{}", sync.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn received_events(m: &str) -> f64 {
    value(m, "pronto_cluster_events_total{direction=\"received\"}")
}

fn nats_errors(m: &str, reason: &str) -> f64 {
    value(
        m,
        &format!("pronto_cluster_nats_errors_total{{reason=\"{reason}\"}}"),
    )
}

async fn serve_one(gw: &Gateway) {
    let body = serde_json::json!({
        "model": "m", "max_tokens": 4, "stream": false,
        "messages": [{"role": "user", "content": "hello"}],
    });
    let r = client(false)
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

/// One forged sync message: a dispatch of a large request to backend `x` of pool `m`.
fn forged_booking() -> bytes::Bytes {
    let mut buf = Vec::new();
    wire::begin(&mut buf, 0x5eed);
    wire::push(
        &mut buf,
        &SyncEvent::Dispatch {
            seq: 1,
            backend: BackendRef::of("m", "x"),
            load: RequestLoad {
                prefill_tokens: 100_000,
                kv_tokens: 200_000,
            },
            hashes: Vec::new(),
        },
    );
    buf.into()
}

/// A test client over TLS with a client certificate (through `localhost`, which the server's
/// certificate names), with `options`' credentials; server errors go to `errors`.
async fn test_client(
    pki: &Pki,
    port: u16,
    options: async_nats::ConnectOptions,
    errors: tokio::sync::mpsc::UnboundedSender<String>,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    options
        .add_root_certificates(pki.ca.clone())
        .add_client_certificate(pki.client_cert.clone(), pki.client_key.clone())
        .require_tls(true)
        .event_callback(move |ev| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(e) = ev {
                    let _ = errors.send(e.to_string());
                }
            }
        })
        .connect(format!("tls://localhost:{port}"))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_credentials_sync_over_tls_and_nothing_else_gets_in() {
    let d = Dir::new("cluster-auth");
    let pki = pki(&d);
    let nkey = nkeys::KeyPair::new_user();
    let Some(nats) = secured_nats(&d, &pki, &nkey.public_key()) else {
        return;
    };
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let backend = TestBackend::start("x", Behavior::default()).await;
    let password = d.file("password", &format!("{REPLICA_PASSWORD}\n"));
    let seed = d.file("seed", &nkey.seed().unwrap());
    let tls = tls_yaml(&pki, Some("nats.test"));
    let a = Gateway::start(&config_yaml(
        &pool(&backend.url()),
        &cluster_yaml(
            &url,
            "replica-a",
            &format!(
                "  auth:\n    user: replica\n    password: {{file: {}}}\n{tls}",
                password.display()
            ),
        ),
    ));
    let b = Gateway::start(&config_yaml(
        &pool(&backend.url()),
        &cluster_yaml(
            &url,
            "replica-b",
            &format!("  auth:\n    nkey: {{file: {}}}\n{tls}", seed.display()),
        ),
    ));
    // Both connect, hear each other, and fold each other's requests.
    for gw in [&a, &b] {
        wait_for(
            gw,
            "a connection and one peer",
            Duration::from_secs(10),
            |m| {
                value(m, "pronto_cluster_connected") == 1.0
                    && value(m, "pronto_cluster_peers") == 1.0
            },
        )
        .await;
    }
    let before = received_events(&metrics(&b).await);
    serve_one(&a).await;
    wait_for(&b, "replica-a's request", Duration::from_secs(5), |m| {
        received_events(m) >= before + 3.0
    })
    .await;

    // No credentials (TLS right): refused; it says why, counts it, and serves alone.
    let c = Gateway::start_process(&config_yaml(
        &pool(&backend.url()),
        &cluster_yaml(&url, "replica-c", &tls),
    ));
    wait_for(
        &c,
        "an authorization refusal",
        Duration::from_secs(10),
        |m| nats_errors(m, "authorization") >= 1.0,
    )
    .await;
    let line = c
        .wait_for_log(|l| l.contains("cluster sync refused") && l.contains("authorization"))
        .await;
    let line = line.expect("the refusal is logged");
    assert!(
        line.contains("cluster.auth"),
        "it names the setting: {line}"
    );
    assert!(!line.contains(REPLICA_PASSWORD), "{line}");
    serve_one(&c).await;
    let m = metrics(&c).await;
    assert_eq!(value(&m, "pronto_cluster_connected"), 0.0);
    assert_eq!(nats_errors(&m, "tls"), 0.0, "TLS was not the problem");

    // The right credentials, but connecting to 127.0.0.1 without `server_name`: the server's
    // certificate does not name that address. Refused, for TLS.
    let e = Gateway::start(&config_yaml(
        &pool(&backend.url()),
        &cluster_yaml(
            &url,
            "replica-e",
            &format!(
                "  auth:\n    user: replica\n    password: {{file: {}}}\n{}",
                password.display(),
                tls_yaml(&pki, None)
            ),
        ),
    ));
    wait_for(&e, "a TLS refusal", Duration::from_secs(10), |m| {
        nats_errors(m, "tls") >= 1.0
    })
    .await;
    serve_one(&e).await;
    let m = metrics(&e).await;
    assert_eq!(value(&m, "pronto_cluster_connected"), 0.0);
    assert_eq!(nats_errors(&m, "authorization"), 0.0);

    // A publisher without credentials cannot even connect.
    let (tx, mut server_errors) = tokio::sync::mpsc::unbounded_channel();
    let refused = test_client(
        &pki,
        nats.port,
        async_nats::ConnectOptions::new(),
        tx.clone(),
    )
    .await;
    let kind = refused.err().map(|e| e.kind());
    assert_eq!(
        kind,
        Some(async_nats::ConnectErrorKind::AuthorizationViolation)
    );
    // One with another user's credentials publishes a forged booking: the server refuses it.
    let intruder = test_client(
        &pki,
        nats.port,
        async_nats::ConnectOptions::with_user_and_password(
            "metrics".into(),
            METRICS_PASSWORD.into(),
        ),
        tx.clone(),
    )
    .await
    .expect("the metrics user connects");
    intruder
        .publish("pronto.cluster.intruder", forged_booking())
        .await
        .unwrap();
    intruder.flush().await.unwrap();
    let refusal = tokio::time::timeout(Duration::from_secs(5), server_errors.recv())
        .await
        .expect("the server answers the forged publish")
        .unwrap();
    assert!(
        refusal.to_lowercase().contains("permissions violation"),
        "{refusal}"
    );
    // The same message from a replica's credentials, published after the server refused the
    // intruder's, does arrive: once a replica holds it, it would hold the intruder's too.
    let control = test_client(
        &pki,
        nats.port,
        async_nats::ConnectOptions::with_user_and_password(
            "replica".into(),
            REPLICA_PASSWORD.into(),
        ),
        tx,
    )
    .await
    .expect("the replicas' user connects");
    control
        .publish("pronto.cluster.control", forged_booking())
        .await
        .unwrap();
    control.flush().await.unwrap();
    for gw in [&a, &b] {
        wait_for(gw, "the control booking", Duration::from_secs(5), |m| {
            value(m, "pronto_cluster_remote_bookings") >= 1.0
        })
        .await;
        let m = metrics(gw).await;
        assert_eq!(
            value(&m, "pronto_cluster_remote_bookings"),
            1.0,
            "the control's booking only"
        );
        assert_eq!(
            value(&m, "pronto_cluster_peers"),
            2.0,
            "the other replica and the control: no intruder, no replica-c or -e"
        );
    }
    drop(backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_lets_replicas_sync_and_a_wrong_one_is_refused() {
    let d = Dir::new("cluster-token");
    let Some(nats) = nats::Nats::start_with(
        d.file(
            "nats.conf",
            "authorization {\n  token: \"the-cluster-token\"\n}\n",
        ),
        &[],
    ) else {
        return;
    };
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let backend = TestBackend::start("x", Behavior::default()).await;
    let token = d.file("token", "the-cluster-token\n");
    let wrong = d.file("wrong", "not-the-token\n");
    let auth = |p: &Path| format!("  auth:\n    token: {{file: {}}}\n", p.display());
    let a = Gateway::start(&config_yaml(
        &pool(&backend.url()),
        &cluster_yaml(&url, "ta", &auth(&token)),
    ));
    let b = Gateway::start(&config_yaml(
        &pool(&backend.url()),
        &cluster_yaml(&url, "tb", &auth(&token)),
    ));
    let w = Gateway::start(&config_yaml(
        &pool(&backend.url()),
        &cluster_yaml(&url, "tw", &auth(&wrong)),
    ));
    for gw in [&a, &b] {
        wait_for(
            gw,
            "a connection and one peer",
            Duration::from_secs(10),
            |m| {
                value(m, "pronto_cluster_connected") == 1.0
                    && value(m, "pronto_cluster_peers") == 1.0
            },
        )
        .await;
    }
    wait_for(
        &w,
        "an authorization refusal",
        Duration::from_secs(10),
        |m| nats_errors(m, "authorization") >= 1.0 && value(m, "pronto_cluster_connected") == 0.0,
    )
    .await;
    serve_one(&w).await;
    let before = received_events(&metrics(&b).await);
    serve_one(&a).await;
    wait_for(&b, "ta's request", Duration::from_secs(5), |m| {
        received_events(m) >= before + 3.0
    })
    .await;
    assert_eq!(
        value(&metrics(&a).await, "pronto_cluster_peers"),
        1.0,
        "the refused replica is never heard"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replicated_overlays_nats_admits_only_the_replicas_on_the_cluster_subjects() {
    let d = Dir::new("cluster-overlay");
    let cm: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s/replicated/nats-config.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    // As shipped, but on loopback ports of its own choosing (no monitoring port here).
    let conf: String = cm["data"]["nats-server.conf"]
        .as_str()
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("port:") && !l.contains("http_port"))
        .map(|l| format!("{l}\n"))
        .collect();
    let password = "a-password-from-the-secret";
    let Some(nats) = nats::Nats::start_with(
        d.file("nats.conf", &conf),
        &[("PRONTO_NATS_PASSWORD", password)],
    ) else {
        return;
    };
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let connect = |user: Option<&str>, errors: tokio::sync::mpsc::UnboundedSender<String>| {
        let options = match user {
            Some(p) => {
                async_nats::ConnectOptions::with_user_and_password("pronto".into(), p.into())
            }
            None => async_nats::ConnectOptions::new(),
        };
        options
            .event_callback(move |ev| {
                let errors = errors.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = ev {
                        let _ = errors.send(e.to_string());
                    }
                }
            })
            .connect(url.clone())
    };
    let (tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    for refused in [None, Some("not-the-password")] {
        let kind = connect(refused, tx.clone()).await.err().map(|e| e.kind());
        assert_eq!(
            kind,
            Some(async_nats::ConnectErrorKind::AuthorizationViolation),
            "{refused:?}"
        );
    }
    let replica = connect(Some(password), tx)
        .await
        .expect("the replicas' user");
    let mut sub = replica.subscribe("pronto.cluster.*").await.unwrap();
    replica.publish("elsewhere", "x".into()).await.unwrap();
    replica.flush().await.unwrap();
    let refusal = tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .expect("the server refuses a publish outside the cluster's subjects")
        .unwrap();
    assert!(
        refusal.to_lowercase().contains("permissions violation"),
        "{refusal}"
    );
    replica
        .publish("pronto.cluster.pod-0", "sync".into())
        .await
        .unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut sub))
        .await
        .expect("the cluster's subjects carry")
        .unwrap();
    assert_eq!(&msg.payload[..], b"sync");
}
