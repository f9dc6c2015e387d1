//! Live config reload: validate the file fully, then swap the gateway state atomically.
//!
//! ## Triggers
//! A gateway started with `--config FILE` reloads that file
//! - when it changes: [`Reloader::run`] polls it every `reload.watch_interval` (1 s by default;
//!   `reload.watch: false` turns polling off). A poll stats the file; only when its
//!   modification time or size moved does it read and hash the text, and only when that hash
//!   differs from both the active config's and the last rejected file's does it reload, so
//!   a bad file is reported once, not every second;
//! - on `SIGHUP` (the handler is installed before the listeners open, so a signal can never
//!   kill the process with the default action);
//! - on `POST /admin/reload` (the admin listener).
//!
//! A gateway started from `--backend` flags has no file: reload answers
//! [`NoConfigFile`] (409 on the admin listener) and `SIGHUP` is logged and ignored.
//!
//! ## One attempt ([`Reloader::reload`])
//! Attempts are serialised. The file is read and hashed; a text identical to the active
//! config is [`ReloadResult::Unchanged`]. Otherwise it goes through the same loader as at
//! start ([`Config::from_file_text`]: syntax, types, every field validated, each problem
//! located `file:line:col: field.path: message`). An invalid file changes nothing: the
//! problems are logged at `warn`, kept as `last_error` for `GET /admin/config`, counted in
//! `pronto_config_reloads_total{result="error"}`, and `pronto_config_last_reload_successful`
//! drops to 0. A valid file becomes a new [`GatewayState`](crate::state::GatewayState) built by
//! [`GatewayState::rebuild`](crate::state::GatewayState::rebuild) (unchanged backends, prefix indexes and policies are carried
//! over; see [`crate::state`]) and is stored in the `ArcSwap` in one step: a request sees
//! either the old state or the new one, never a mix, and requests in flight finish on the
//! state they started with.
//!
//! The listener certificate (`tls:`) reloads like everything else: the files are read and
//! checked by the loader, and an unchanged config text whose certificate or key file was
//! rewritten still reloads (the watcher stats those files too), so a rotation is picked up by
//! new connections ([`crate::services::tls`]).
//!
//! Some settings are bound at start: `listen`, `admin_listen`, `threads`, `grace_period`,
//! `cluster` (the NATS connection and the replica's name) and whether the listener speaks TLS
//! at all
//! (the listeners, the worker pool and pingora's shutdown timer exist once). A reload that
//! changes them applies everything else, keeps their running values in the effective
//! config, and returns a warning naming each (they take effect at the next restart). They
//! are compared with the previous *file*, not with the running values, so a `--listen`
//! override on the command line does not draw a warning on every reload.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{json, Value};
use tokio::signal::unix::Signal;

use crate::config::{self, Config};
use crate::state::Carried;
use crate::state::StateHandle;
use crate::telemetry::{Metrics, ReloadResult};

/// What started a reload attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The file watcher saw the file change.
    Watch,
    /// `SIGHUP`.
    Signal,
    /// `POST /admin/reload`.
    Admin,
}

/// The gateway was started without a config file, so there is nothing to reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoConfigFile;

impl std::fmt::Display for NoConfigFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the gateway was started from --backend flags, not --config FILE: there is no \
             file to reload; restart it with --config to use live reload",
        )
    }
}

impl std::error::Error for NoConfigFile {}

/// The outcome of one reload attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// `ok`, `unchanged` or `error`.
    pub result: ReloadResult,
    /// What started it.
    pub trigger: Trigger,
    /// The active config version after the attempt.
    pub version: u64,
    /// The active config's source hash after the attempt.
    pub hash: String,
    /// Why the file was rejected: one located problem per line.
    pub error: Option<String>,
    /// Settings that need a restart, then the new config's own warnings (`ok` only).
    pub warnings: Vec<String>,
    /// Backends that kept their learned state (`ok` only).
    pub backends_kept: usize,
    /// Backends built fresh (`ok` only).
    pub backends_new: usize,
    /// Backends no longer in any pool; they drain (`ok` only).
    pub backends_removed: Vec<String>,
}

/// The most recent rejected file.
#[derive(Debug, Clone)]
struct LastError {
    message: String,
    at: SystemTime,
    hash: String,
}

/// What `GET /admin/config` shows besides the config itself.
#[derive(Debug)]
struct Status {
    version: u64,
    loaded_at: SystemTime,
    /// Kept until an attempt succeeds (`ok` or `unchanged`).
    last_error: Option<LastError>,
    last_attempt: Option<(Trigger, ReloadResult, SystemTime)>,
    warnings: Vec<String>,
}

/// Owns the reload procedure and its status (see the module docs).
#[derive(Debug)]
pub struct Reloader {
    state: StateHandle,
    metrics: Metrics,
    path: Option<PathBuf>,
    /// Held for a whole attempt (never across an `.await`); the last *file* config loaded,
    /// before start-bound settings were pinned to their running values.
    attempt: Mutex<Config>,
    status: Mutex<Status>,
}

/// Settings bound at start, as `(field path, differs)`.
fn start_bound(old: &Config, new: &Config) -> [(&'static str, bool); 6] {
    [
        // The NATS connection and this replica's name.
        ("cluster", old.cluster != new.cluster),
        // Whether the listener speaks TLS; its certificate itself reloads.
        ("tls", old.tls.is_some() != new.tls.is_some()),
        ("listen", old.listen != new.listen),
        ("admin_listen", old.admin_listen != new.admin_listen),
        ("threads", old.threads != new.threads),
        ("grace_period", old.grace_period != new.grace_period),
    ]
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep serving it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// === impl Reloader ===

impl Reloader {
    /// A reloader for the gateway whose live state is `state`, reloading
    /// `state.config.source_path` when there is one. Reads that file once (blocking) to learn
    /// its own start-bound settings, which command-line overrides may have changed in the
    /// running config; call it before the runtime starts.
    pub fn new(state: StateHandle, metrics: Metrics) -> Reloader {
        let running = Arc::clone(&state.load().config);
        let path = running.source_path.clone();
        let file_config = path
            .as_deref()
            .and_then(|p| Config::load(p).ok())
            .filter(|c| c.hash() == running.hash())
            .unwrap_or_else(|| (*running).clone());
        metrics.set_active_config(1, &running.hash());
        metrics.publish_config(&running);
        metrics.config_last_reload_successful.set(1);
        Reloader {
            state,
            metrics,
            path,
            attempt: Mutex::new(file_config),
            status: Mutex::new(Status {
                version: 1,
                loaded_at: SystemTime::now(),
                last_error: None,
                last_attempt: None,
                warnings: running
                    .warnings
                    .iter()
                    .map(|w| w.display(&running.origin).to_string())
                    .collect(),
            }),
        }
    }

    /// The file this gateway reloads, if it was started from one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reload the config file now. Blocking (file I/O, building the state): call it from a
    /// blocking thread (`tokio::task::spawn_blocking`), not from an async task.
    pub fn reload(&self, trigger: Trigger) -> Result<ReloadReport, NoConfigFile> {
        let path = self.path.as_deref().ok_or(NoConfigFile)?;
        let mut file_config = lock(&self.attempt);
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                let message = format!("{}: cannot read: {e}", path.display());
                return Ok(self.reject(trigger, message, String::new()));
            }
        };
        let hash = config::text_hash(&text);
        if hash == self.state.load().config.hash() && !self.tls_files_changed() {
            return Ok(self.unchanged(trigger));
        }
        Ok(match config::Loaded::from_file_text(path, &text) {
            Ok(new) => {
                // The admin listener stays where it was bound: it may not lose its token.
                let bound = self.state.load().config.admin_listen;
                match config::edge::admin_exposure_error(bound, &new.config.admin) {
                    Some(msg) => {
                        let message = format!("{}: admin_listen: {msg}", new.config.origin);
                        self.reject(trigger, message, hash)
                    }
                    None => self.apply(trigger, new, &mut file_config),
                }
            }
            Err(e) => self.reject(trigger, e.to_string(), hash),
        })
    }

    /// Whether the active config's listener certificate or key file was rewritten since it
    /// was loaded (blocking file I/O).
    fn tls_files_changed(&self) -> bool {
        let state = self.state.load();
        state.config.tls.as_ref().is_some_and(|t| t.files_changed())
    }

    fn unchanged(&self, trigger: Trigger) -> ReloadReport {
        let mut status = lock(&self.status);
        status.last_error = None;
        status.last_attempt = Some((trigger, ReloadResult::Unchanged, SystemTime::now()));
        self.count(ReloadResult::Unchanged);
        tracing::info!(
            ?trigger,
            version = status.version,
            "config reload: file unchanged"
        );
        self.report(&status, trigger, ReloadResult::Unchanged)
    }

    /// The file (whose text hashes to `hash`) was rejected: log, count, remember.
    fn reject(&self, trigger: Trigger, message: String, hash: String) -> ReloadReport {
        for line in message.lines() {
            tracing::warn!(?trigger, "config reload rejected, old config kept: {line}");
        }
        let now = SystemTime::now();
        let mut status = lock(&self.status);
        status.last_attempt = Some((trigger, ReloadResult::Error, now));
        self.count(ReloadResult::Error);
        let mut report = self.report(&status, trigger, ReloadResult::Error);
        report.error = Some(message.clone());
        status.last_error = Some(LastError {
            message,
            at: now,
            hash,
        });
        report
    }

    /// Swap in `new` (valid, different from the active config).
    fn apply(
        &self,
        trigger: Trigger,
        loaded: config::Loaded,
        file_config: &mut Config,
    ) -> ReloadReport {
        let config::Loaded {
            config: new,
            resources,
        } = loaded;
        let resources = Arc::new(resources);
        let current = self.state.load();
        // Listeners, threads and the grace period are bound at start: they never change.
        let running = &current.config;
        let mut warnings: Vec<String> = start_bound(file_config, &new)
            .into_iter()
            .filter(|(_, differs)| *differs)
            .map(|(field, _)| {
                format!(
                    "{}: {field} changed, but it is bound at start: the running value is kept \
                     until the gateway restarts",
                    new.origin
                )
            })
            .collect();
        warnings.extend(
            new.warnings
                .iter()
                .map(|w| w.display(&new.origin).to_string()),
        );
        let mut effective = new.clone();
        effective.listen = running.listen;
        effective.admin_listen = running.admin_listen;
        effective.threads = running.threads;
        effective.grace_period = running.grace_period;
        effective.cluster = running.cluster.clone();
        let hash = effective.hash();
        let effective = Arc::new(effective);
        let (_, carried) = self
            .state
            .update(|current| {
                Some(current.rebuild(
                    Arc::clone(&effective),
                    Arc::clone(&resources),
                    &self.metrics,
                ))
            })
            .expect("a rebuild is always swapped in");
        *file_config = new;
        self.retire(&carried);

        let mut status = lock(&self.status);
        status.version += 1;
        status.loaded_at = SystemTime::now();
        status.last_error = None;
        status.last_attempt = Some((trigger, ReloadResult::Ok, status.loaded_at));
        status.warnings = warnings.clone();
        self.metrics.set_active_config(status.version, &hash);
        self.metrics.publish_config(&self.state.load().config);
        self.count(ReloadResult::Ok);
        tracing::info!(
            ?trigger,
            version = status.version,
            %hash,
            kept = carried.backends_kept,
            new = carried.backends_new,
            removed = carried.backends_removed.len(),
            "config reloaded"
        );
        for w in &warnings {
            tracing::warn!("config reload: {w}");
        }
        let mut report = self.report(&status, trigger, ReloadResult::Ok);
        report.warnings = warnings;
        report.backends_kept = carried.backends_kept;
        report.backends_new = carried.backends_new;
        report.backends_removed = carried
            .backends_removed
            .iter()
            .map(|n| n.to_string())
            .collect();
        report
    }

    /// Withdraw the gauges of backends whose name left the config.
    fn retire(&self, carried: &Carried) {
        let state = self.state.load();
        for name in &carried.backends_removed {
            if !state.backends.iter().any(|b| b.config.name == *name) {
                self.metrics.forget_backend(name);
            }
        }
    }

    fn count(&self, result: ReloadResult) {
        self.metrics
            .config_reloads_total
            .with_label_values(&[result.as_str()])
            .inc();
        self.metrics
            .config_last_reload_successful
            .set(i64::from(result != ReloadResult::Error));
    }

    fn report(&self, status: &Status, trigger: Trigger, result: ReloadResult) -> ReloadReport {
        ReloadReport {
            result,
            trigger,
            version: status.version,
            hash: self.state.load().config.hash(),
            error: None,
            warnings: Vec::new(),
            backends_kept: 0,
            backends_new: 0,
            backends_removed: Vec::new(),
        }
    }

    /// `GET /admin/config`: `{version, hash, loaded_at, path, last_error: {message, at} | null,
    /// last_reload: {trigger, result, at} | null, warnings, config}`. Times are RFC 3339 UTC.
    pub fn status_json(&self) -> Value {
        let state = self.state.load();
        let status = lock(&self.status);
        json!({
            "version": status.version,
            "hash": state.config.hash(),
            "loaded_at": rfc3339(status.loaded_at),
            "path": self.path.as_ref().map(|p| p.display().to_string()),
            "last_error": status.last_error.as_ref().map(|e| json!({
                "message": e.message,
                "at": rfc3339(e.at),
            })),
            "last_reload": status.last_attempt.map(|(trigger, result, at)| json!({
                "trigger": trigger,
                "result": result,
                "at": rfc3339(at),
            })),
            "warnings": status.warnings,
            "config": state.config.to_json(),
        })
    }

    /// Whether the watcher should reload a file whose text hashes to `hash`.
    fn is_news(&self, hash: &str) -> bool {
        if hash == self.state.load().config.hash() {
            return false;
        }
        let status = lock(&self.status);
        status.last_error.as_ref().is_none_or(|e| e.hash != hash)
    }

    /// Watch the file and listen for `hup` until `stop` turns true (the gateway stops; see the
    /// module docs).
    /// Run it on a runtime of its own: the reloads themselves go to the blocking pool.
    pub async fn run(
        self: Arc<Self>,
        mut hup: Signal,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut last_meta: Option<Vec<(SystemTime, u64)>> = None;
        loop {
            if *stop.borrow() {
                return;
            }
            let settings = self.state.load().config.reload;
            let tick = tokio::time::sleep(settings.watch_interval);
            tokio::select! {
                r = stop.changed() => if r.is_err() { return },
                _ = tick => {
                    if settings.watch {
                        self.poll(&mut last_meta).await;
                    }
                }
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    if self.path.is_none() {
                        tracing::info!("SIGHUP ignored: {NoConfigFile}");
                        continue;
                    }
                    tracing::info!("SIGHUP: reloading the config file");
                    self.reload_in_background(Trigger::Signal).await;
                }
            }
        }
    }

    /// One poll of the file (and of the listener's certificate and key files); reloads when
    /// the config's content is news or a certificate file moved.
    async fn poll(self: &Arc<Self>, last_meta: &mut Option<Vec<(SystemTime, u64)>>) {
        let Some(path) = self.path.as_deref() else {
            return;
        };
        let mut meta = match tokio::fs::metadata(path).await {
            Ok(m) => vec![(m.modified().unwrap_or(UNIX_EPOCH), m.len())],
            // A file being replaced may be missing for a moment; look again next tick.
            Err(_) => return,
        };
        let tls = self.state.load().config.tls.clone();
        for file in tls.iter().flat_map(|t| [&t.cert, &t.key]) {
            // A missing certificate file reads as a change; the reload then reports it.
            meta.push(match tokio::fs::metadata(file).await {
                Ok(m) => (m.modified().unwrap_or(UNIX_EPOCH), m.len()),
                Err(_) => (UNIX_EPOCH, 0),
            });
        }
        if last_meta.as_ref() == Some(&meta) {
            return;
        }
        let Ok(text) = tokio::fs::read_to_string(path).await else {
            return;
        };
        let certs_moved = last_meta
            .as_ref()
            .is_some_and(|old| old.get(1..) != meta.get(1..));
        *last_meta = Some(meta);
        if certs_moved {
            tracing::info!(path = %path.display(), "TLS certificate files changed: reloading");
            self.reload_in_background(Trigger::Watch).await;
        } else if self.is_news(&config::text_hash(&text)) {
            tracing::info!(path = %path.display(), "config file changed: reloading");
            self.reload_in_background(Trigger::Watch).await;
        }
    }

    async fn reload_in_background(self: &Arc<Self>, trigger: Trigger) {
        let this = Arc::clone(self);
        if let Err(e) = tokio::task::spawn_blocking(move || this.reload(trigger)).await {
            tracing::error!(error = %e, "config reload task failed");
        }
    }
}

/// Install the `SIGHUP` handler now (before any listener opens) and hand back the stream to
/// pass to [`Reloader::run`] on `runtime`.
pub fn hangup_signal(runtime: &tokio::runtime::Runtime) -> std::io::Result<Signal> {
    let _entered = runtime.enter();
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
}

/// `2026-05-01T12:34:56.789Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let rem = d.as_secs() % 86_400;
    let (year, month, day) = pronto_core::time::civil_date(t);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
#[path = "reload_tests.rs"]
mod tests;
