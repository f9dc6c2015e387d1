//! The replica-sync families (`pronto_cluster_*`, the `cluster` module), registered with the
//! others. Without `cluster:` they stay at zero.

use prometheus::{CounterVec, Gauge, IntCounter, IntCounterVec, IntGauge, Opts};

use super::{counter, plain_gauge, Families};

/// Which way a sync message went (the `direction` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncDirection {
    /// Published by this replica.
    Sent,
    /// Received from another replica (its own echoes are not counted).
    Received,
}

impl SyncDirection {
    /// Every label value.
    pub const LABELS: [&'static str; 2] = ["sent", "received"];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            SyncDirection::Sent => "sent",
            SyncDirection::Received => "received",
        }
    }
}

/// Why a sync event was not sent or not applied (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncDrop {
    /// The proxy's queue to the publisher was full (the event was dropped, never waited on).
    QueueFull,
    /// NATS was down when the publisher had it (the next snapshot after reconnection resyncs).
    Disconnected,
    /// Publishing failed or took too long.
    PublishError,
    /// A received message could not be decoded.
    DecodeError,
    /// A received event named a backend this replica does not have.
    UnknownBackend,
    /// A received event named a booking this replica does not know.
    UnknownBooking,
}

impl SyncDrop {
    /// Every label value.
    pub const LABELS: [&'static str; 6] = [
        "queue_full",
        "disconnected",
        "publish_error",
        "decode_error",
        "unknown_backend",
        "unknown_booking",
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            SyncDrop::QueueFull => "queue_full",
            SyncDrop::Disconnected => "disconnected",
            SyncDrop::PublishError => "publish_error",
            SyncDrop::DecodeError => "decode_error",
            SyncDrop::UnknownBackend => "unknown_backend",
            SyncDrop::UnknownBooking => "unknown_booking",
        }
    }
}

/// Why NATS refused this replica, or failed it (the `reason` label of
/// `pronto_cluster_nats_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatsError {
    /// The server refused the credentials (`cluster.auth`), or asked for some not given.
    Authorization,
    /// The TLS handshake failed: the server's certificate is not trusted or not for the
    /// expected name, or the server refused this replica's (`cluster.tls`).
    Tls,
    /// The server refused a publish or subscribe on the cluster's subjects (its permissions).
    Permission,
    /// The server could not be reached or the connection failed otherwise.
    Connection,
    /// Another error the server reported.
    Server,
}

impl NatsError {
    /// Every label value.
    pub const LABELS: [&'static str; 5] =
        ["authorization", "tls", "permission", "connection", "server"];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            NatsError::Authorization => "authorization",
            NatsError::Tls => "tls",
            NatsError::Permission => "permission",
            NatsError::Connection => "connection",
            NatsError::Server => "server",
        }
    }
}

/// The `pronto_cluster_*` families.
#[derive(Debug, Clone)]
pub struct ClusterMetrics {
    /// `pronto_cluster_connected`: 1 while connected to NATS.
    pub connected: IntGauge,
    /// `pronto_cluster_peers`: other replicas heard from within `peer_timeout`.
    pub peers: IntGauge,
    /// `pronto_cluster_remote_bookings`: other replicas' bookings held in this one's ledgers.
    pub remote_bookings: IntGauge,
    /// `pronto_cluster_messages_total{direction}`: sync messages.
    pub messages_total: IntCounterVec,
    /// `pronto_cluster_bytes_total{direction}`: their payload bytes.
    pub bytes_total: IntCounterVec,
    /// `pronto_cluster_events_total{direction}`: events in them.
    pub events_total: IntCounterVec,
    /// `pronto_cluster_dropped_total{reason}`: events not sent or not applied.
    pub dropped_total: IntCounterVec,
    /// `pronto_cluster_work_seconds_total{direction}`: time the sync tasks spent encoding and
    /// publishing, or decoding and folding (their CPU cost, near enough: they never block).
    pub work_seconds_total: CounterVec,
    /// `pronto_cluster_peer_expiries_total`: replicas expired after `peer_timeout` of silence.
    pub peer_expiries_total: IntCounter,
    /// `pronto_cluster_disconnects_total`: NATS connections lost.
    pub disconnects_total: IntCounter,
    /// `pronto_cluster_sync_delay_seconds`: how long this replica's own messages take to come
    /// back through NATS (a moving average): the delay its peers hear of it with.
    pub sync_delay_seconds: Gauge,
    /// `pronto_cluster_unseen_dispatches`: other replicas' dispatches a decision has not heard
    /// of yet (their rate × the sync delay; `pronto_core::cluster::Unseen`).
    pub unseen_dispatches: Gauge,
    /// `pronto_cluster_collisions_total{outcome}`: requests waiting for their first token
    /// that were routed again because another replica's dispatch to their backend, sent
    /// before them, was heard late (`cluster.collision_repair`); `moved` or `stayed`.
    pub collisions_total: IntCounterVec,
    /// `pronto_cluster_nats_errors_total{reason}`: connection attempts NATS refused or that
    /// failed, and refusals it sent on an open connection ([`NatsError`]).
    pub nats_errors_total: IntCounterVec,
}

/// What collision repair did with a request (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollisionOutcome {
    /// It moved to another backend.
    Moved,
    /// It stayed.
    Stayed,
}

impl CollisionOutcome {
    /// Every label value.
    pub const LABELS: [&'static str; 2] = ["moved", "stayed"];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            CollisionOutcome::Moved => "moved",
            CollisionOutcome::Stayed => "stayed",
        }
    }
}

fn plain_float_gauge(r: &Families, name: &str, help: &str) -> Gauge {
    let g = Gauge::new(name, help).expect("valid gauge");
    r.registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn plain_counter(r: &Families, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid counter");
    r.registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

fn float_counter(r: &Families, name: &str, help: &str, labels: &[&str]) -> CounterVec {
    let c = CounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    r.register(&c, labels);
    c
}

impl ClusterMetrics {
    pub(super) fn new(r: &Families) -> ClusterMetrics {
        let m = ClusterMetrics {
            connected: plain_gauge(r, "pronto_cluster_connected", "1 while connected to NATS"),
            peers: plain_gauge(
                r,
                "pronto_cluster_peers",
                "Other replicas heard from within cluster.peer_timeout",
            ),
            remote_bookings: plain_gauge(
                r,
                "pronto_cluster_remote_bookings",
                "Other replicas' bookings held in this replica's ledgers",
            ),
            messages_total: counter(
                r,
                "pronto_cluster_messages_total",
                "Replica sync messages, by direction",
                &["direction"],
            ),
            bytes_total: counter(
                r,
                "pronto_cluster_bytes_total",
                "Replica sync payload bytes, by direction",
                &["direction"],
            ),
            events_total: counter(
                r,
                "pronto_cluster_events_total",
                "Replica sync events, by direction",
                &["direction"],
            ),
            dropped_total: counter(
                r,
                "pronto_cluster_dropped_total",
                "Replica sync events not sent or not applied, by reason",
                &["reason"],
            ),
            work_seconds_total: float_counter(
                r,
                "pronto_cluster_work_seconds_total",
                "Time the replica sync tasks spent encoding and publishing (sent) or decoding and folding (received)",
                &["direction"],
            ),
            peer_expiries_total: plain_counter(
                r,
                "pronto_cluster_peer_expiries_total",
                "Replicas expired after cluster.peer_timeout of silence",
            ),
            disconnects_total: plain_counter(
                r,
                "pronto_cluster_disconnects_total",
                "NATS connections lost",
            ),
            sync_delay_seconds: plain_float_gauge(
                r,
                "pronto_cluster_sync_delay_seconds",
                "Time this replica's own sync messages take to come back through NATS (moving average)",
            ),
            unseen_dispatches: plain_float_gauge(
                r,
                "pronto_cluster_unseen_dispatches",
                "Other replicas' dispatches a decision expects not to have heard of yet (their rate times the sync delay)",
            ),
            collisions_total: counter(
                r,
                "pronto_cluster_collisions_total",
                "Requests waiting for their first token routed again after another replica's earlier dispatch to their backend was heard (cluster.collision_repair), by outcome",
                &["outcome"],
            ),
            nats_errors_total: counter(
                r,
                "pronto_cluster_nats_errors_total",
                "NATS connection attempts refused or failed, and refusals on an open connection, by reason (authorization, tls, permission, connection, server)",
                &["reason"],
            ),
        };
        // Every series exists from the start, so dashboards and alerts see zeros.
        for d in SyncDirection::LABELS {
            m.messages_total.with_label_values(&[d]);
            m.bytes_total.with_label_values(&[d]);
            m.events_total.with_label_values(&[d]);
            m.work_seconds_total.with_label_values(&[d]);
        }
        for reason in SyncDrop::LABELS {
            m.dropped_total.with_label_values(&[reason]);
        }
        for o in CollisionOutcome::LABELS {
            m.collisions_total.with_label_values(&[o]);
        }
        for reason in NatsError::LABELS {
            m.nats_errors_total.with_label_values(&[reason]);
        }
        m
    }

    /// Count `n` events dropped for `why`.
    pub fn dropped(&self, why: SyncDrop, n: u64) {
        if n > 0 {
            self.dropped_total
                .with_label_values(&[why.label()])
                .inc_by(n);
        }
    }

    /// Count one message of `bytes` bytes and `events` events going `dir`, which took `work`.
    pub fn message(
        &self,
        dir: SyncDirection,
        bytes: usize,
        events: usize,
        work: std::time::Duration,
    ) {
        let d = [dir.label()];
        self.messages_total.with_label_values(&d).inc();
        self.bytes_total.with_label_values(&d).inc_by(bytes as u64);
        self.events_total
            .with_label_values(&d)
            .inc_by(events as u64);
        self.work_seconds_total
            .with_label_values(&d)
            .inc_by(work.as_secs_f64());
    }
}
