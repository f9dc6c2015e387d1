//! TLS end to end, against the real `pronto` binary: HTTPS on the client listener (h2 by ALPN
//! and HTTP/1.1) for a streaming chat, a bad certificate file as a located config error, a
//! certificate rotated by a reload reaching new connections, and `https` backends verified
//! against their `ca_file` (and refused without it). Certificates are made fresh with rcgen.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::gateway::TempDir;
use common::{chat_body, config_yaml, pool, post_reload, Behavior, Gateway, TestBackend};
use pingora_core::tls::{ServerConfig, TlsAcceptor};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A self-signed certificate for `localhost` and 127.0.0.1.
struct Cert {
    pem: String,
    key_pem: String,
    der: Vec<u8>,
    key_der: Vec<u8>,
}

fn self_signed() -> Cert {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Cert {
        pem: cert.pem(),
        key_pem: key.serialize_pem(),
        der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    }
}

/// Write `cert` as `<dir>/gw.crt` + `<dir>/gw.key`, each atomically (sibling, then rename).
fn write_cert(dir: &Path, cert: &Cert) -> (PathBuf, PathBuf) {
    let (c, k) = (dir.join("gw.crt"), dir.join("gw.key"));
    for (path, text) in [(&c, &cert.pem), (&k, &cert.key_pem)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    (c, k)
}

/// A client trusting only `cert`; `h1` forces HTTP/1.1, else h2 is offered by ALPN.
fn client_trusting(cert: &Cert, h1: bool) -> reqwest::Client {
    let b = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert.pem.as_bytes()).unwrap());
    let b = if h1 { b.http1_only() } else { b };
    b.build().unwrap()
}

fn https_url(gw: &Gateway, path: &str) -> String {
    format!("https://{}{path}", gw.listen)
}

async fn chat(client: &reqwest::Client, url: &str) -> reqwest::Result<(http::Version, String)> {
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .body(chat_body(2000, true))
        .send()
        .await?
        .error_for_status()?;
    let version = resp.version();
    Ok((version, resp.text().await?))
}

fn tls_section(cert: &Path, key: &Path) -> String {
    format!(
        "tls:\n  cert: {}\n  key: {}\n",
        cert.display(),
        key.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_listener_streams_over_h2_and_http1() {
    let backend = TestBackend::start("b0", Behavior::default()).await;
    let dir = TempDir::new("tls-serve");
    let cert = self_signed();
    let (c, k) = write_cert(&dir.0, &cert);
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        &tls_section(&c, &k),
    ));
    let url = https_url(&gw, "/v1/chat/completions");
    let (version, body) = chat(&client_trusting(&cert, false), &url).await.unwrap();
    assert_eq!(version, http::Version::HTTP_2, "h2 negotiated by ALPN");
    assert!(
        body.contains("data: ") && body.ends_with("data: [DONE]\n\n"),
        "{body}"
    );
    let (version, body) = chat(&client_trusting(&cert, true), &url).await.unwrap();
    assert_eq!(version, http::Version::HTTP_11, "HTTP/1.1 fallback");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert_eq!(backend.requests(), 2);

    // The certificate is really checked: a client trusting another one is refused, and plain
    // HTTP on the TLS port gets no answer.
    let stranger = client_trusting(&self_signed(), true);
    assert!(chat(&stranger, &url).await.is_err());
    let plain = common::client(false)
        .post(gw.url("/v1/chat/completions"))
        .body(chat_body(100, false))
        .send()
        .await;
    assert!(!plain.is_ok_and(|r| r.status().is_success()));
    assert_eq!(backend.requests(), 2);
}

#[test]
fn a_missing_or_mismatched_cert_file_stops_the_start_with_a_located_error() {
    let dir = TempDir::new("tls-bad");
    let cert = self_signed();
    let (c, _) = write_cert(&dir.0, &cert);
    std::fs::write(dir.0.join("other.key"), self_signed().key_pem).unwrap();
    let cases = [
        (
            "tls:\n  cert: missing.crt\n  key: gw.key\n",
            ":4:9: tls.cert: cannot read",
        ),
        (
            "tls:\n  cert: gw.crt\n  key: other.key\n",
            ":5:8: tls.key: does not fit the certificate",
        ),
    ];
    assert!(c.exists());
    for (section, want) in cases {
        let path = dir.0.join("pronto.yaml");
        let text = format!(
            "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n{section}pools:\n  m:\n    \
             backends:\n      - name: b0\n        url: http://127.0.0.1:1\n"
        );
        std::fs::write(&path, text).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_pronto"))
            .args(["serve", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let status = status.expect("a gateway with a bad certificate must not start");
        assert!(!status.success());
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(
            stderr.contains(&format!("{}{want}", path.display())),
            "{section}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_reaches_new_connections_after_reload() {
    let backend = TestBackend::start("b0", Behavior::default()).await;
    let dir = TempDir::new("tls-rotate");
    let old = self_signed();
    let (c, k) = write_cert(&dir.0, &old);
    let gw = Gateway::start(&config_yaml(
        &pool("m", "round_robin", &[backend.url()]),
        &format!("reload:\n  watch: false\n{}", tls_section(&c, &k)),
    ));
    let url = https_url(&gw, "/v1/chat/completions");
    let old_client = client_trusting(&old, true);
    chat(&old_client, &url).await.unwrap();

    // Same config text, new files: the reload must still load them.
    let new = self_signed();
    write_cert(&dir.0, &new);
    let (_, report) = post_reload(&gw).await;
    assert_eq!(report["result"], "ok", "{report}");

    chat(&client_trusting(&new, true), &url).await.unwrap();
    assert!(chat(&client_trusting(&old, true), &url).await.is_err());
    // A reload with nothing new is reported as unchanged.
    let (_, again) = post_reload(&gw).await;
    assert_eq!(again["result"], "unchanged", "{again}");
    assert_eq!(backend.requests(), 2);
}

/// A TLS terminator on 127.0.0.1:0 in front of `target`, serving `cert`.
async fn tls_front(target: SocketAddr, cert: &Cert) -> SocketAddr {
    pingora_core::tls::install_default_crypto_provider();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_der.clone()));
    let config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![CertificateDer::from(cert.der.clone())], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if let Ok(mut up) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backends_are_verified_against_their_ca_file() {
    let backend = TestBackend::start("b0", Behavior::default()).await;
    let cert = self_signed();
    let front = tls_front(backend.addr, &cert).await;
    let dir = TempDir::new("tls-backend");
    let ca = dir.0.join("backend-ca.pem");
    std::fs::write(&ca, &cert.pem).unwrap();
    let url = format!("https://{front}");
    let pools = format!(
        "  m:\n    backends:\n      - name: trusted\n        url: {url}\n        ca_file: {}\n\
         \x20 u:\n    backends:\n      - name: untrusted\n        url: {url}\n",
        ca.display()
    );
    let gw = Gateway::start(&config_yaml(&pools, ""));
    // Health checks reach the backend through TLS too (trusting the same CA).
    let start = Instant::now();
    while backend
        .state
        .seen
        .health_checks
        .load(std::sync::atomic::Ordering::SeqCst)
        < 2
    {
        assert!(start.elapsed() < Duration::from_secs(10), "no health check");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = common::client(false);
    let (_, body) = chat(&client, &gw.url("/v1/chat/completions"))
        .await
        .unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert_eq!(backend.requests(), 1);

    // Without ca_file the self-signed backend fails verification against the system roots.
    let mut body: serde_json::Value = serde_json::from_slice(&chat_body(100, false)).unwrap();
    body["model"] = "u".into();
    let resp = client
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_server_error(), "{}", resp.status());
    assert_eq!(backend.requests(), 1, "nothing reached the backend");
}
