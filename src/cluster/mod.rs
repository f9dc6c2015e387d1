//! Replica sync over NATS: several Pronto replicas behind one load balancer that route as one.
//!
//! Each replica sees only its own traffic; two replicas that each think a backend idle would
//! both send it their next burst, and a prefix routed by one would be invisible to the other.
//! With `cluster:` ([`crate::config::cluster`]) every replica tells the others what only it
//! knows — its dispatches (backend, booked prefill and KV tokens, prompt block hashes), their
//! first tokens (with the TTFT observed, within [`pronto_core::cluster::ObserveLimit::DEFAULT`]) and
//! their releases — and folds theirs into its own ledger, prefix index and TTFT models. The
//! folding is the routing core's ([`pronto_core::cluster`]): plain data operations, the same
//! code the evaluator drives with a simulated channel.
//!
//! ## The path of an event
//! 1. The proxy dispatches (`Pool::dispatch` in the state hub): [`Link::dispatch`] does a
//!    non-blocking `try_send` of one small event onto a bounded queue ([`QUEUE_EVENTS`]);
//!    when the queue is full the event is dropped and counted
//!    (`pronto_cluster_dropped_total{reason="queue_full"}`). The booking's guard carries a
//!    [`Tracked`] that sends the first token and, when dropped, the release. Nothing on the
//!    request path awaits, locks across an await, or touches the network.
//! 2. The publisher task drains the queue into one message (up to 64 KiB), notes each event
//!    in its [`pronto_core::cluster::Outbox`] (its live bookings, the observation rate limit)
//!    and publishes it on `<subject>.<replica>`. Every `heartbeat` it publishes a snapshot of
//!    its live bookings — the heartbeat, and the repair of anything lost.
//! 3. The folding task subscribes to `<subject>.*`, skips its own echo, decodes
//!    ([`pronto_core::cluster::wire`]) and folds ([`pronto_core::cluster::Remote`]) into the
//!    current gateway state's backends, found by the name every replica gives them (pool
//!    model + backend name, [`pronto_core::cluster::BackendRef`]).
//!
//! ## Degrade, never fail
//! NATS down or slow: the client reconnects in the background (backoff up to 2 s) and
//! the publisher drops what it cannot hand over
//! (`pronto_cluster_dropped_total{reason="disconnected"}`), while still keeping its live set.
//! No message arrives from the others either, so after `peer_timeout` their bookings are
//! released (`pronto_cluster_peer_expiries_total`) and each replica routes on its own state
//! plus engine metrics and KV events, as a single replica does. `pronto_cluster_connected`
//! drops to 0 and a warning is logged (at most once per 30 s while it flaps). On reconnection
//! the publisher sends its snapshot at once and the peers' snapshots rebuild the remote
//! bookings; prefix records resume with the next dispatches (what was routed meanwhile is
//! learnt again from the traffic, or from KV events).
//!
//! ## Who may talk
//! Every replica believes what arrives on `<subject>.*`, so NATS must admit only the
//! replicas: `cluster.auth` (token, user and password, NKey or `.creds`) and `cluster.tls`
//! (CA, client certificate, server name) are applied by the `connect` module, and the
//! server's permissions should allow the replicas only those subjects (docs/operating.md,
//! "Securing the replica channel"). A replica NATS refuses says why in its log, counts it
//! (`pronto_cluster_nats_errors_total{reason}`), retries, and routes alone meanwhile.
//!
//! ## Collision repair
//! A replica hears of the others' dispatches a sync delay late. When it folds one to backend
//! X, it dates it one sync delay back and wakes its own requests waiting on X for their first
//! token (`Targets::heard_dispatches` in `services::cluster`); those sent after that date were routed without
//! knowing of it, and the proxy takes their decision again (`cluster.collision_repair`, the
//! proxy's `repair` module, [`pronto_core::cluster::repair`]).
//!
//! ## Cost
//! `pronto_cluster_bytes_total` and `pronto_cluster_messages_total` count the traffic;
//! `pronto_cluster_work_seconds_total` the time the two tasks spent encoding and publishing,
//! decoding and folding. Per request: a dispatch of 14 bytes plus 8 per 16-token prompt
//! block, a first token of 3 (27 with an observation), a release of 3, sharing a 9-byte
//! message header; plus 20 bytes per live booking per heartbeat. `docs/benchmarks/replicas/`
//! has the measured numbers.

mod link;

pub use link::{Link, Tracked, MAX_SYNC_BLOCKS, QUEUE_EVENTS};
