//! TEMPORARY typed config (replaced by the config branch at merge).
#![allow(missing_docs)]
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::routing::PolicyKind;

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub threads: usize,
    pub grace_period: Duration,
    pub limits: Limits,
    pub retry: Retry,
    pub health: Health,
    pub explain_headers: bool,
    pub pools: Vec<PoolConfig>,
}
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: u64,
    pub connect_timeout: Duration,
    pub first_token_timeout: Duration,
    pub idle_timeout: Duration,
}
#[derive(Debug, Clone)]
pub struct Retry {
    pub max_retries: u32,
}
#[derive(Debug, Clone)]
pub struct Health {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub eject_after_failures: u32,
    pub readmit_after: Duration,
}
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub model: Arc<str>,
    pub policy: PolicyKind,
    pub backends: Vec<BackendConfig>,
}
#[derive(Debug, Clone)]
pub struct BackendConfig {
    pub name: Arc<str>,
    pub url: String,
    pub host: String,
    pub port: u16,
    pub tls: bool,
    pub weight: u32,
    pub max_inflight: Option<u32>,
    pub labels: BTreeMap<String, String>,
}
impl Config {
    pub fn load(_p: &std::path::Path) -> Result<Config, String> {
        Err("config files not supported yet".into())
    }
    pub fn from_backend_urls(
        urls: &[String],
        model: &str,
        policy: PolicyKind,
    ) -> Result<Config, String> {
        let backends = urls
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let url = url::Url::parse(u).unwrap();
                BackendConfig {
                    name: Arc::from(format!("backend-{i}")),
                    url: u.clone(),
                    host: url.host_str().unwrap().to_string(),
                    port: url.port_or_known_default().unwrap(),
                    tls: url.scheme() == "https",
                    weight: 1,
                    max_inflight: None,
                    labels: BTreeMap::new(),
                }
            })
            .collect();
        Ok(Config {
            listen: "127.0.0.1:8080".parse().unwrap(),
            admin_listen: "127.0.0.1:9400".parse().unwrap(),
            threads: 2,
            grace_period: Duration::from_secs(30),
            limits: Limits {
                max_body_bytes: 32 << 20,
                connect_timeout: Duration::from_secs(2),
                first_token_timeout: Duration::from_secs(60),
                idle_timeout: Duration::from_secs(120),
            },
            retry: Retry { max_retries: 2 },
            health: Health {
                path: "/health".into(),
                interval: Duration::from_secs(5),
                timeout: Duration::from_secs(1),
                eject_after_failures: 3,
                readmit_after: Duration::from_secs(10),
            },
            explain_headers: false,
            pools: vec![PoolConfig {
                model: Arc::from(model),
                policy,
                backends,
            }],
        })
    }
}
