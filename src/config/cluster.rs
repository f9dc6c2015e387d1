//! `cluster:` — several Pronto replicas that route as one, synced over NATS
//! (`cluster`): the file struct, its validation with field paths, the typed model.
//!
//! ```yaml
//! cluster:
//!   nats: nats://nats:4222        # core NATS (no JetStream); several: comma-separated
//!   subject: pronto.cluster       # subject prefix; a replica publishes on `<subject>.<replica>`
//!   replica: {env: POD_NAME}      # this replica's name: a string, {env: NAME} or {file: PATH}
//!   heartbeat: 1s                 # snapshot of this replica's bookings (the heartbeat)
//!   peer_timeout: 3s              # a replica silent this long has its bookings released
//!   collision_repair: 0.2         # the margin a move must promise (`off`: never move)
//!   auth: {user: pronto, password: {env: NATS_PASSWORD}}   # or token, nkey, creds
//!   tls: {ca: tls/nats-ca.pem}    # present: TLS required; also cert, key, server_name
//! ```
//!
//! `auth` and `tls` ([`super::nats`]): the credentials NATS asks of this replica (each secret
//! from `{env: NAME}` or `{file: PATH}`) and how NATS's certificate is checked. A replica NATS
//! refuses keeps routing on its own state, says why in its log and counts it
//! (`pronto_cluster_nats_errors_total{reason}`).
//!
//! `collision_repair` ([`pronto_core::cluster::repair`]): a request still waiting for its
//! first token on a backend that, as this replica now hears, another replica sent a request
//! to just before it, is routed again; it moves when staying predicts a first token more
//! than the margin (a fraction) later than the new decision. Routes that race
//! (`first_token_deadline`, `hedge`) keep their own remedy and are not repaired.
//!
//! Absent: one replica, routing on its own state, exactly as before. Bound at start: a reload
//! that changes it keeps the running settings and warns.

use std::time::Duration;

use pronto_core::cluster::repair::DEFAULT_MARGIN;
use serde::Deserialize;

use super::duration::text_duration;
use super::edge::{EnvLookup, SecretFile};
use super::nats::{NatsAuth, NatsAuthFile, NatsTls, NatsTlsFile};
use super::validate::Checker;

/// The default subject prefix.
pub const DEFAULT_SUBJECT: &str = "pronto.cluster";
/// The default heartbeat.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Heartbeats a replica may miss before it is expired (the default `peer_timeout`).
pub const DEFAULT_MISSED_HEARTBEATS: u32 = 3;
/// Longest replica name (it is a NATS subject token and appears in logs).
const MAX_REPLICA_NAME: usize = 128;

/// Replica sync over NATS: several Pronto replicas that route as one
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// NATS server URL(s), nats://host:port or tls://host:port, comma-separated
    #[serde(default, deserialize_with = "super::value::nats_urls")]
    pub nats: Option<String>,
    /// Subject prefix; a replica publishes on <subject>.<replica>
    #[schemars(extend("default" = DEFAULT_SUBJECT))]
    pub subject: Option<String>,
    /// This replica's name (letters, digits, _ and -): a string, {env: NAME} (e.g. the pod
    /// name) or {file: PATH}
    #[schemars(with = "Option<super::schema::ReplicaName>")]
    pub replica: Option<SecretFile>,
    /// How often this replica publishes the snapshot of its bookings
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<super::schema::DurationText>")]
    #[schemars(extend("default" = super::schema::dur(DEFAULT_HEARTBEAT)))]
    pub heartbeat: Option<Duration>,
    /// A replica silent this long has its bookings released (default 3 heartbeats)
    #[serde(
        default,
        with = "text_duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<super::schema::DurationText>")]
    #[schemars(extend("default" = super::schema::dur(DEFAULT_HEARTBEAT * DEFAULT_MISSED_HEARTBEATS)))]
    pub peer_timeout: Option<Duration>,
    /// Collision repair: a request waiting for its first token on a backend that another
    /// replica (heard late) sent a request to just before it is routed again, and moves when
    /// staying predicts more than this margin (a fraction) over the new decision; `off` or
    /// false: never
    #[schemars(extend("default" = 0.2))]
    pub collision_repair: Option<RepairFile>,
    /// Credentials NATS asks of this replica: one kind (token, user + password, nkey or creds)
    pub auth: Option<NatsAuthFile>,
    /// TLS to NATS (present: required, as with tls:// URLs)
    pub tls: Option<NatsTlsFile>,
}

impl schemars::JsonSchema for RepairFile {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "collision_repair".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "oneOf": [
                { "type": "number", "minimum": 0, "maximum": 10 },
                { "type": "boolean" },
                { "const": "off" },
            ],
        })
    }
}

/// `cluster.collision_repair` as written: a margin (`0.2`), or `off` / `false`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum RepairFile {
    /// The margin, 0 to 10.
    Margin(f64),
    /// `false` (`true`: the default margin).
    Switch(bool),
    /// `off`.
    Word(String),
}

impl<'de> Deserialize<'de> for RepairFile {
    /// Any of the three forms, the margin in range and the word `off`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RepairFile, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Margin(f64),
            Switch(bool),
            Word(String),
        }
        let shown = match Written::deserialize(d)? {
            Written::Margin(m) if (0.0..=10.0).contains(&m) => return Ok(RepairFile::Margin(m)),
            Written::Switch(b) => return Ok(RepairFile::Switch(b)),
            Written::Word(w) if w == "off" => return Ok(RepairFile::Word(w)),
            Written::Margin(m) => m.to_string(),
            Written::Word(w) => format!("`{w}`"),
        };
        Err(serde::de::Error::custom(format!(
            "{shown} is not a margin: a fraction from 0 to 10 (0.2: a move must promise a \
             first token 20 % sooner), or `off`"
        )))
    }
}

/// The validated `cluster:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// NATS server URLs as given (validated).
    pub nats: String,
    /// Subject prefix (dot-separated tokens).
    pub subject: String,
    /// This replica's name (a subject token).
    pub replica: String,
    /// Snapshot period.
    pub heartbeat: Duration,
    /// Silence after which a replica's bookings are released.
    pub peer_timeout: Duration,
    /// Collision repair's margin (`None`: off).
    pub collision_repair: Option<f64>,
    /// Credentials (`None`: NATS asks for none).
    pub auth: Option<NatsAuth>,
    /// TLS settings (`None`: TLS only when a URL is `tls://` or the server requires it).
    pub tls: Option<NatsTls>,
}

impl Cluster {
    /// The subject this replica publishes on.
    pub fn own_subject(&self) -> String {
        format!("{}.{}", self.subject, self.replica)
    }

    /// The subject every replica's messages match.
    pub fn all_subjects(&self) -> String {
        format!("{}.*", self.subject)
    }

    /// Whether the connection must be TLS: `cluster.tls` is set or a URL is `tls://`.
    pub fn requires_tls(&self) -> bool {
        self.tls.is_some() || self.nats.split(',').any(|u| u.trim().starts_with("tls://"))
    }
}

/// A NATS subject token Pronto accepts: `[A-Za-z0-9_-]+`.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Checker {
    /// `cluster:`; `None` when absent or invalid (errors recorded).
    pub(super) fn cluster(&mut self, f: Option<&ClusterFile>, env: EnvLookup) -> Option<Cluster> {
        let f = f?;
        let errors = self.error_count();
        let nats = match f.nats.as_deref() {
            None => {
                self.error(
                    "cluster.nats",
                    "missing; the NATS server, e.g. `nats://nats:4222`",
                );
                String::new()
            }
            Some(s) => s.to_string(),
        };
        let subject = f.subject.clone().unwrap_or_else(|| DEFAULT_SUBJECT.into());
        if !subject.split('.').all(is_token) {
            self.error(
                "cluster.subject",
                format!(
                    "`{subject}` is not a subject prefix: dot-separated tokens of letters, \
                     digits, `_` and `-` (no wildcards)"
                ),
            );
        }
        let replica = match &f.replica {
            None => {
                self.error(
                    "cluster.replica",
                    "missing; this replica's name, e.g. `{env: POD_NAME}`",
                );
                None
            }
            Some(r) => self.secret("cluster.replica", r, env),
        };
        let replica = replica.and_then(|(at, name)| {
            let name = name.trim().to_string();
            if is_token(&name) && name.len() <= MAX_REPLICA_NAME {
                Some(name)
            } else {
                self.error(
                    at,
                    format!(
                        "`{name}` is not a replica name: 1 to {MAX_REPLICA_NAME} letters, \
                         digits, `_` and `-` (it is a NATS subject token)"
                    ),
                );
                None
            }
        });
        let heartbeat = f.heartbeat.unwrap_or(DEFAULT_HEARTBEAT);
        let peer_timeout = f
            .peer_timeout
            .unwrap_or(heartbeat * DEFAULT_MISSED_HEARTBEATS);
        if peer_timeout <= heartbeat {
            self.error(
                "cluster.peer_timeout",
                format!(
                    "must be longer than `heartbeat` ({heartbeat:?}), or every replica expires \
                     between two heartbeats"
                ),
            );
        }
        let collision_repair = match &f.collision_repair {
            None | Some(RepairFile::Switch(true)) => Some(DEFAULT_MARGIN),
            Some(RepairFile::Switch(false) | RepairFile::Word(_)) => None,
            Some(RepairFile::Margin(m)) => Some(*m),
        };
        let auth = self.nats_auth(f.auth.as_ref(), env);
        let tls = self.nats_tls(f.tls.as_ref());
        (self.error_count() == errors).then(|| Cluster {
            nats,
            subject,
            replica: replica.unwrap_or_default(),
            heartbeat,
            peer_timeout,
            collision_repair,
            auth,
            tls,
        })
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
