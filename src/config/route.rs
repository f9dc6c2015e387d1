//! Routes: an ordered list of request matchers, each sending what it matches to a pool, with
//! the route's TTFT objective and what to do when it cannot be met.
//!
//! ```yaml
//! priority_classes: [interactive, batch]     # most urgent first
//! admission: {queue_size: 1024}
//! routes:
//!   - name: chat
//!     match: {model: "llama-*", headers: {x-tier: gold}, api_keys: [sk-live-1]}
//!     pool: llama-fleet
//!     ttft_slo: 800ms
//!     tpot_slo: 50ms
//!     objective: ttfa                        # ttft (default) | ttfa
//!     priority: interactive
//!     on_slo_miss: fallback                  # queue | fallback | shed
//!     fallback_pool: llama-spare
//! ```
//!
//! **Matching.** Routes are tried in file order and the first whose every given condition
//! holds wins: `model` and `path` are globs (`*` any run of characters, `?` one character,
//! `[a-z]` / `[!0-9]` a class, `\` escapes), `headers` are exact values (all must match),
//! `api_keys` any one of the listed bearer tokens (`Authorization: Bearer …`): only their
//! SHA-256 digests are kept, and the presented token's digest is compared with each in
//! constant time, so neither memory nor response timing reveals a key. A route with
//! no `match:` matches everything. Without `routes:` a request goes to the pool named by its
//! model, as before routes existed; with `routes:`, a request no route matches is a 404.
//!
//! **Before the first byte**: `first_token_deadline` (failover) and `hedge` are described,
//! validated and resolved in [`super::race`]. `race_on: ttfa` moves the race to the first
//! *answer* token: each copy's reasoning is held in the gateway until its first answer token
//! (so the client gets the reasoning in one burst when the answer starts, at most 1 MiB held),
//! the first copy to answer wins, and a relative deadline or quantile hedge scales the predicted
//! TTFA (`max_predicted_ttft` then bounds it too). For routes whose clients do not display the
//! reasoning as it streams; a warning says when neither a deadline nor a hedge is set.
//!
//! **Objectives.** `tpot_slo` (time per output token after the first) is not admission: it
//! travels with each request ([`pronto_core::request::RequestFeatures::slo`], with
//! `ttft_slo`) and `predicted_ttft` avoids a backend predicted to break it while another is
//! predicted to meet both objectives. Goodput — the share of requests meeting both — is
//! counted against the pair ([`pronto_core::slo`]).
//!
//! **What to minimise.** `objective: ttft` (the default) has `predicted_ttft` send each request
//! where its first token comes soonest; `objective: ttfa`, where its first *answer* token does
//! — for a reasoning model, the TTFT plus the reasoning tokens the pool's model is expected to
//! spend (learned per pool and `reasoning_effort`, [`pronto_core::predict::ReasoningLengths`]) at
//! each backend's predicted time per output token. Other policies ignore it (a warning says
//! so when the route's own policy is not `predicted_ttft`).
//!
//! **Admission settings** are validated here and enforced by `admission`. A route
//! without `ttft_slo` is not admission-controlled. `on_slo_miss` defaults to `queue`;
//! `priority` defaults to the first class.
//!
//! **Validation** reports, with field paths: unknown target or fallback pools, a fallback to
//! the route's own pool (a cycle), `fallback` without a `fallback_pool`, malformed globs,
//! invalid header names, unknown priority classes, duplicate route or class names, admission
//! keys without a `ttft_slo`; and warns about routes shadowed by an earlier catch-all and
//! pools no route reaches.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::file::{ConfigFile, MatchFile, RouteFile};
use super::model::Pool;
use super::validate::{key_path, valid_name, Checker};
use pronto_core::routing::PolicySpec;

/// Priority classes when the file names none, most urgent first.
pub const DEFAULT_PRIORITY_CLASSES: [&str; 2] = ["interactive", "batch"];
/// Default capacity of the admission queue (all routes together).
pub const DEFAULT_QUEUE_SIZE: usize = 1024;
/// Largest accepted `admission.queue_size`.
pub const MAX_QUEUE_SIZE: u64 = 1 << 20;

/// The SLO admission queue (routes with on_slo_miss: queue)
///
/// Both the file's `admission:` section and the model: serde fills the default and checks the
/// range; nothing is left to the checker.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionSettings {
    /// Requests the queue holds at most, over all routes; beyond it, 429
    #[serde(deserialize_with = "super::value::int_in::<_, _, 1, MAX_QUEUE_SIZE>")]
    #[schemars(range(min = 1, max = MAX_QUEUE_SIZE))]
    pub queue_size: usize,
}

impl Default for AdmissionSettings {
    fn default() -> AdmissionSettings {
        AdmissionSettings {
            queue_size: DEFAULT_QUEUE_SIZE,
        }
    }
}

/// A route's `on_slo_miss:` as written; `fallback` names its pool in `fallback_pool:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnSloMiss {
    /// [`SloAction::Queue`].
    Queue,
    /// [`SloAction::Fallback`] to `fallback_pool`.
    Fallback,
    /// [`SloAction::Shed`].
    Shed,
}

/// What a route does with a request whose predicted TTFT misses its SLO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SloAction {
    /// Wait in the gateway queue (by priority, then deadline).
    Queue,
    /// Send it to this other pool instead (once).
    Fallback(Arc<str>),
    /// Answer 429 with `Retry-After`.
    Shed,
}

/// A route's TTFT objective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slo {
    /// Objective for the time to first token (> 0); also the queue deadline.
    pub ttft: Duration,
    /// What to do when the best predicted TTFT exceeds it.
    pub on_miss: SloAction,
}

/// One validated route.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Unique name; the `route` metric label.
    pub name: Arc<str>,
    /// What the request must look like.
    pub matcher: RouteMatch,
    /// Target pool (exists in the config).
    pub pool: Arc<str>,
    /// TTFT objective; `None`: no admission control.
    pub slo: Option<Slo>,
    /// Time-per-output-token objective (> 0), when set.
    pub tpot_slo: Option<Duration>,
    /// What `predicted_ttft` minimises for this route's requests.
    pub objective: RouteObjective,
    /// What the route's races are run on (see the module docs).
    pub race_on: RaceOn,
    /// Priority class name.
    pub priority: Arc<str>,
    /// The class's position in `priority_classes`: 0 is the most urgent.
    pub rank: u32,
    /// Whether the file named the class (else an API key's class may replace it).
    pub priority_explicit: bool,
    /// Overrides `retry.max_retries`.
    pub max_retries: Option<u32>,
    /// Overrides `limits.first_token_timeout`.
    pub first_token_timeout: Option<Duration>,
    /// Overrides `limits.idle_timeout`.
    pub idle_timeout: Option<Duration>,
    /// Failover when a backend's first token is this late ([`super::race`]).
    pub first_token_deadline: Option<pronto_core::race::FirstTokenDeadline>,
    /// Bounded hedging ([`super::race`]).
    pub hedge: Option<pronto_core::race::Hedge>,
    /// Routing policy for this route's requests (the pool's when absent).
    pub policy: Option<PolicySpec>,
    /// Overrides the top-level `migration:` ([`super::migration`]).
    pub migration: Option<super::migration::Migration>,
    /// SSE comment keep-alives this often while a stream waits for its first token
    /// ([`super::progress`]); `None`: none.
    pub keepalive: Option<Duration>,
}

/// A route's `objective:` (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteObjective {
    /// The time to the first token.
    #[default]
    Ttft,
    /// The time to the first answer token (after any reasoning).
    Ttfa,
}

/// A route's `race_on:` (see the module docs).
use pronto_core::race::RaceOn;

pub use super::value::Glob;

/// A route's conditions; every one given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// Model name glob.
    pub model: Option<Glob>,
    /// Request path glob.
    pub path: Option<Glob>,
    /// Lowercase header name → exact value.
    pub headers: Vec<(String, String)>,
    /// SHA-256 digests of the accepted bearer tokens (only digests are held, as for
    /// `auth:` keys); empty: no key required.
    pub api_keys: Vec<super::edge::Digest>,
}

impl RouteMatch {
    /// Whether a request for `model` on `path` with `headers` satisfies every condition.
    pub fn matches(&self, model: &str, path: &str, headers: &http::HeaderMap) -> bool {
        self.model.as_ref().is_none_or(|g| g.matches(model))
            && self.path.as_ref().is_none_or(|g| g.matches(path))
            && self.headers.iter().all(|(name, value)| {
                headers
                    .get(name.as_str())
                    .is_some_and(|v| v.as_bytes() == value.as_bytes())
            })
            && (self.api_keys.is_empty() || self.key_matches(headers))
    }

    /// Whether the bearer token is one of the keys. Every key is compared, each in constant
    /// time, so timing reveals neither which key matched nor a matching prefix.
    fn key_matches(&self, headers: &http::HeaderMap) -> bool {
        let Some(token) = bearer_token(headers) else {
            return false;
        };
        let digest = super::edge::sha256(token);
        self.api_keys
            .iter()
            .fold(false, |found, key| found | constant_time_eq(key, &digest))
    }

    /// Whether matching reads the client's `Authorization` header (`api_keys`, or a
    /// `headers` condition on it): the gateway then uses that credential, and it is never
    /// forwarded to a backend.
    pub fn uses_authorization(&self) -> bool {
        !self.api_keys.is_empty()
            || self
                .headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("authorization"))
    }

    /// Whether this matcher accepts every request.
    pub fn is_catch_all(&self) -> bool {
        self.model.as_ref().is_none_or(Glob::is_match_all)
            && self.path.as_ref().is_none_or(Glob::is_match_all)
            && self.headers.is_empty()
            && self.api_keys.is_empty()
    }
}

/// The bearer token of `headers`, trimmed; `None` without an `Authorization: Bearer` header
/// or with an empty token. The one parser of the header: API keys (`auth`), the
/// admin token and route `match.api_keys` all read it here.
pub fn bearer_token(headers: &http::HeaderMap) -> Option<&[u8]> {
    let v = headers.get(http::header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = v.split_at(v.len().min(7));
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// Byte equality whose time depends only on the lengths (`subtle`'s constant-time compare).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

// === validation ===

impl Checker {
    pub(super) fn priority_classes(&mut self, f: &ConfigFile) -> Vec<Arc<str>> {
        let Some(names) = &f.priority_classes else {
            return DEFAULT_PRIORITY_CLASSES.map(Arc::from).to_vec();
        };
        if names.is_empty() {
            self.error(
                "priority_classes",
                "must name at least one class (most urgent first)",
            );
            return DEFAULT_PRIORITY_CLASSES.map(Arc::from).to_vec();
        }
        let mut seen = HashSet::new();
        for (i, n) in names.iter().enumerate() {
            let path = format!("priority_classes[{i}]");
            if !valid_name(n) {
                self.error(
                    path,
                    format!(
                        "`{n}` is not a valid class name: use letters, digits, `_`, `.` and `-`"
                    ),
                );
            } else if !seen.insert(n.as_str()) {
                self.error(path, format!("class `{n}` is listed twice"));
            }
        }
        names.iter().map(|n| Arc::from(n.as_str())).collect()
    }

    pub(super) fn routes(
        &mut self,
        f: &ConfigFile,
        pools: &[Pool],
        classes: &[Arc<str>],
    ) -> Vec<Route> {
        let Some(entries) = &f.routes else {
            return Vec::new();
        };
        if entries.is_empty() {
            self.error(
                "routes",
                "is empty, so no request could be served; remove it to route by model name",
            );
        }
        let pool_names: Vec<&str> = pools.iter().map(|p| &*p.model).collect();
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut routes = Vec::with_capacity(entries.len());
        let mut catch_all: Option<usize> = None;
        for (i, r) in entries.iter().enumerate() {
            let path = format!("routes[{i}]");
            if let Some(n) = r.name.as_ref().map(super::value::Name::as_str) {
                if let Some(first) = names.insert(n, i) {
                    self.error(
                        format!("{path}.name"),
                        format!("duplicate route name `{n}` (first used at routes[{first}])"),
                    );
                }
            }
            if let Some(first) = catch_all {
                self.warn(
                    &path,
                    format!("never matches: routes[{first}] before it matches every request"),
                );
            }
            if let Some(route) = self.route(&path, r, pools, &pool_names, classes) {
                if catch_all.is_none() && route.matcher.is_catch_all() {
                    catch_all = Some(i);
                }
                routes.push(route);
            }
        }
        for p in &pool_names {
            let reached = entries
                .iter()
                .any(|r| r.pool.as_deref() == Some(*p) || r.fallback_pool.as_deref() == Some(*p));
            if !reached && !entries.is_empty() {
                self.warn(
                    key_path("pools", p),
                    format!("no route sends requests to pool `{p}`"),
                );
            }
        }
        routes
    }

    /// One route; `None` when a required part is missing or invalid (errors recorded).
    fn route(
        &mut self,
        path: &str,
        r: &RouteFile,
        typed_pools: &[Pool],
        pools: &[&str],
        classes: &[Arc<str>],
    ) -> Option<Route> {
        let name = self
            .label_name(path, "route", r.name.as_ref())
            .map(Arc::<str>::from);
        let pool = self.pool_ref(&format!("{path}.pool"), r.pool.as_deref(), pools, true);
        let matcher = self.matcher(&format!("{path}.match"), r.matches.as_ref());
        let (priority, rank) = match &r.priority {
            None => (classes[0].clone(), 0),
            Some(p) => match classes.iter().position(|c| **c == **p) {
                Some(rank) => (classes[rank].clone(), rank as u32),
                None => {
                    let known: Vec<&str> = classes.iter().map(|c| &**c).collect();
                    self.error(
                        format!("{path}.priority"),
                        format!(
                            "unknown priority class `{p}`; priority_classes has: {}",
                            known.join(", ")
                        ),
                    );
                    (classes[0].clone(), 0)
                }
            },
        };
        let slo = self.slo(path, r, pools, pool.as_deref());
        let tpot_slo = r.tpot_slo;
        let policy = r
            .policy
            .as_ref()
            .map(|file| self.policy_spec(&format!("{path}.policy"), file));
        let objective = r.objective.unwrap_or_default();
        // The route's own policy, else its pool's: what routes its requests.
        let effective = policy.as_ref().map(|p| p.kind()).or_else(|| {
            let own = pool.as_deref()?;
            let p = typed_pools.iter().find(|p| &*p.model == own)?;
            Some(p.policy.kind())
        });
        if objective == RouteObjective::Ttfa
            && effective.is_some_and(|k| k != pronto_core::routing::PolicyKind::PredictedTtft)
        {
            self.warn(
                format!("{path}.objective"),
                "only predicted_ttft minimises TTFA; the policy routing this route ignores it",
            );
        }
        let max_retries = r.max_retries;
        let first_token_timeout = r.first_token_timeout;
        let idle_timeout = r.idle_timeout;
        let first_token_deadline = self.first_token_deadline(path, r.first_token_deadline.as_ref());
        let hedge = self.hedge(path, r.hedge.as_ref());
        let migration = r.migration.as_ref().copied();
        let keepalive = r.keepalive;
        let race_on = r.race_on.unwrap_or_default();
        if race_on == RaceOn::Ttfa && r.first_token_deadline.is_none() && r.hedge.is_none() {
            self.warn(
                format!("{path}.race_on"),
                "no effect without first_token_deadline or hedge",
            );
        }
        Some(Route {
            name: name?,
            matcher: matcher?,
            pool: pool?,
            slo: slo?,
            tpot_slo,
            objective,
            race_on,
            priority,
            rank,
            priority_explicit: r.priority.is_some(),
            max_retries,
            first_token_timeout,
            idle_timeout,
            first_token_deadline,
            hedge,
            policy,
            migration,
            keepalive,
        })
    }

    /// A reference to a pool by name; `None` (error recorded) when missing or unknown.
    fn pool_ref(
        &mut self,
        path: &str,
        name: Option<&str>,
        pools: &[&str],
        required: bool,
    ) -> Option<Arc<str>> {
        match name {
            None => {
                if required {
                    self.error(path, "missing; name the pool this route sends requests to");
                }
                None
            }
            Some(n) if pools.contains(&n) => Some(Arc::from(n)),
            Some(n) => {
                self.error(
                    path,
                    format!("unknown pool `{n}`; pools has: {}", pools.join(", ")),
                );
                None
            }
        }
    }

    /// `Some(slo)` when valid (`Some(None)`: no SLO), `None` on error.
    fn slo(
        &mut self,
        path: &str,
        r: &RouteFile,
        pools: &[&str],
        own_pool: Option<&str>,
    ) -> Option<Option<Slo>> {
        let before = self.error_count();
        let fallback = match r.fallback_pool.as_deref() {
            None => None,
            Some(f) if Some(f) == own_pool => {
                self.error(
                    format!("{path}.fallback_pool"),
                    format!("`{f}` is the route's own pool: a fallback cycle"),
                );
                None
            }
            Some(f) => self.pool_ref(&format!("{path}.fallback_pool"), Some(f), pools, false),
        };
        let action = match r.on_slo_miss {
            None | Some(OnSloMiss::Queue) => Some(SloAction::Queue),
            Some(OnSloMiss::Shed) => Some(SloAction::Shed),
            Some(OnSloMiss::Fallback) => match (&fallback, &r.fallback_pool) {
                (Some(f), _) => Some(SloAction::Fallback(f.clone())),
                (None, None) => {
                    self.error(
                        format!("{path}.on_slo_miss"),
                        "`fallback` needs fallback_pool: the pool to send missed requests to",
                    );
                    None
                }
                // Already reported at fallback_pool.
                (None, Some(_)) => None,
            },
        };
        if r.fallback_pool.is_some() && r.on_slo_miss != Some(OnSloMiss::Fallback) {
            self.warn(
                format!("{path}.fallback_pool"),
                "unused: on_slo_miss is not `fallback`",
            );
        }
        let Some(ttft) = r.ttft_slo else {
            if r.on_slo_miss.is_some() {
                self.error(
                    format!("{path}.on_slo_miss"),
                    "has no effect without ttft_slo; set the route's ttft_slo",
                );
            }
            return (self.error_count() == before).then_some(None);
        };
        let on_miss = action?;
        (self.error_count() == before).then_some(Some(Slo { ttft, on_miss }))
    }

    fn matcher(&mut self, path: &str, m: Option<&MatchFile>) -> Option<RouteMatch> {
        let Some(m) = m else {
            return Some(RouteMatch::default());
        };
        let before = self.error_count();
        let mut headers = Vec::new();
        for (name, value) in m.headers.iter().flatten() {
            let hpath = key_path(&format!("{path}.headers"), name);
            match http::HeaderName::from_bytes(name.as_bytes()) {
                Ok(h) => headers.push((h.as_str().to_string(), value.clone())),
                Err(_) => self.error(hpath, format!("`{name}` is not a valid header name")),
            }
        }
        let mut api_keys = Vec::new();
        for (i, k) in m.api_keys.iter().flatten().enumerate() {
            if k.trim().is_empty() || k.trim() != k {
                self.error(
                    format!("{path}.api_keys[{i}]"),
                    "must be non-empty, without surrounding spaces",
                );
            } else {
                let digest = super::edge::sha256(k.as_bytes());
                self.not_an_example_secret(format!("{path}.api_keys[{i}]"), &digest);
                api_keys.push(digest);
            }
        }
        if m.api_keys.as_ref().is_some_and(Vec::is_empty) {
            self.error(
                format!("{path}.api_keys"),
                "is empty, so no request could match; remove it to accept any key",
            );
        }
        (self.error_count() == before).then_some(RouteMatch {
            model: m.model.clone(),
            path: m.path.clone(),
            headers,
            api_keys,
        })
    }
}

#[cfg(test)]
#[path = "route_tests.rs"]
mod tests;
