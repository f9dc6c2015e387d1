use super::*;
use crate::config::Config;

fn glob(p: &str) -> Glob {
    Glob::parse(p).unwrap()
}

#[test]
fn globs_match_whole_strings() {
    assert!(glob("llama-*").matches("llama-3-8b"));
    assert!(glob("llama-*").matches("llama-"));
    assert!(!glob("llama-*").matches("xllama-3"));
    assert!(glob("*-8b").matches("llama-3-8b"));
    assert!(glob("a*b*c").matches("aXbYbc"));
    assert!(!glob("a*b*c").matches("aXbYb"));
    assert!(glob("m?").matches("m1") && !glob("m?").matches("m"));
    assert!(glob("v[0-9]").matches("v7") && !glob("v[0-9]").matches("vx"));
    assert!(glob("v[!0-9]").matches("vx") && !glob("v[!0-9]").matches("v7"));
    assert!(glob("a\\*").matches("a*") && !glob("a\\*").matches("ab"));
    assert!(glob("*").matches("") && glob("**").matches("anything"));
    assert!(glob("é*").matches("été"));
    assert_eq!(glob("exact").literal().as_deref(), Some("exact"));
    assert_eq!(glob("a\\*").literal().as_deref(), Some("a*"));
    assert_eq!(glob("a*").literal(), None);
}

#[test]
fn a_pathological_glob_is_not_exponential() {
    let g = glob("*a*a*a*a*a*a*a*a*a*a*b");
    assert!(!g.matches(&"a".repeat(2000)));
}

#[test]
fn bad_globs_say_why() {
    let err = |p: &str| Glob::parse(p).unwrap_err();
    assert!(err("").contains("empty pattern"));
    assert!(err("llama-[0-9").contains("unclosed character class"));
    assert!(err("x[z-a]").contains("invalid range"));
    assert!(err("x\\").contains("dangling"));
    assert!(err("x{a").contains("unclosed alternate"));
}

fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

#[test]
fn matchers_need_every_condition() {
    let m = RouteMatch {
        model: Some(glob("llama-*")),
        path: Some(glob("/v1/chat/*")),
        headers: vec![("x-tier".into(), "gold".into())],
        api_keys: vec![
            crate::config::edge::sha256(b"sk-1"),
            crate::config::edge::sha256(b"sk-2"),
        ],
    };
    let ok = headers(&[("x-tier", "gold"), ("authorization", "Bearer sk-2")]);
    assert!(m.matches("llama-3", "/v1/chat/completions", &ok));
    assert!(!m.matches("mistral", "/v1/chat/completions", &ok));
    assert!(!m.matches("llama-3", "/v1/completions", &ok));
    let silver = headers(&[("x-tier", "silver"), ("authorization", "Bearer sk-2")]);
    assert!(!m.matches("llama-3", "/v1/chat/completions", &silver));
    let wrong_key = headers(&[("x-tier", "gold"), ("authorization", "Bearer sk-3")]);
    assert!(!m.matches("llama-3", "/v1/chat/completions", &wrong_key));
    let no_key = headers(&[("x-tier", "gold")]);
    assert!(!m.matches("llama-3", "/v1/chat/completions", &no_key));
    let lower = headers(&[("x-tier", "gold"), ("authorization", "bearer  sk-1 ")]);
    assert!(m.matches("llama-3", "/v1/chat/completions", &lower));
    assert!(RouteMatch::default().is_catch_all());
    assert!(!m.is_catch_all());
}

#[test]
fn constant_time_eq_is_equality() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"ab"));
    assert!(constant_time_eq(b"", b""));
}

const POOLS: &str = "pools:\n  fast: {backends: [{name: a, url: 'http://h:1'}]}\n  spare: {backends: [{name: b, url: 'http://h:2'}]}\n";

fn load(routes: &str) -> Result<Config, String> {
    Config::from_yaml_str(
        &format!("retry: {{max_retries: 0}}\n{routes}{POOLS}"),
        "f.yaml",
    )
    .map_err(|e| e.to_string())
}

/// A config's warnings as `path: message`.
fn warnings(c: &Config) -> Vec<String> {
    c.warnings
        .iter()
        .map(|d| format!("{}: {}", d.path, d.message))
        .collect()
}

#[test]
fn a_full_route_loads() {
    let c = load(
        "priority_classes: [gold, interactive, batch]\nadmission: {queue_size: 8}\nroutes:\n  - name: chat\n    match: {model: 'llama-*', headers: {X-Tier: gold}, api_keys: [k1]}\n    pool: fast\n    ttft_slo: 800ms\n    tpot_slo: 40ms\n    priority: batch\n    on_slo_miss: fallback\n    fallback_pool: spare\n    max_retries: 1\n    first_token_timeout: 5s\n    idle_timeout: 9s\n  - {name: rest, pool: spare}\n",
    )
    .unwrap();
    assert_eq!(c.admission.queue_size, 8);
    assert_eq!(c.priority_classes.len(), 3);
    let r = &c.routes[0];
    assert_eq!(
        (&*r.name, &*r.pool, &*r.priority, r.rank),
        ("chat", "fast", "batch", 2)
    );
    assert_eq!(
        r.matcher.headers,
        [("x-tier".to_string(), "gold".to_string())]
    );
    assert_eq!(
        r.slo,
        Some(Slo {
            ttft: Duration::from_millis(800),
            on_miss: SloAction::Fallback(Arc::from("spare"))
        })
    );
    assert_eq!(r.tpot_slo, Some(Duration::from_millis(40)));
    assert_eq!(r.max_retries, Some(1));
    assert_eq!(r.first_token_timeout, Some(Duration::from_secs(5)));
    let rest = &c.routes[1];
    assert_eq!(rest.tpot_slo, None);
    assert_eq!(
        (rest.slo.clone(), &*rest.priority, rest.rank),
        (None, "gold", 0)
    );
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn each_invalid_route_class_has_its_message() {
    let cases: &[(&str, &str)] = &[
        (
            "routes:\n  - {name: r, pool: nope}\n",
            "f.yaml:3:21: routes[0].pool: unknown pool `nope`; pools has: fast, spare",
        ),
        (
            "routes:\n  - {name: r, pool: fast, ttft_slo: 1s, on_slo_miss: fallback, fallback_pool: gone}\n",
            "routes[0].fallback_pool: unknown pool `gone`; pools has: fast, spare",
        ),
        (
            "routes:\n  - {name: r, pool: fast, ttft_slo: 1s, on_slo_miss: fallback}\n",
            "routes[0].on_slo_miss: `fallback` needs fallback_pool",
        ),
        (
            "routes:\n  - {name: r, pool: fast, ttft_slo: 1s, on_slo_miss: fallback, fallback_pool: fast}\n",
            "routes[0].fallback_pool: `fast` is the route's own pool: a fallback cycle",
        ),
        (
            "routes:\n  - {name: r, pool: fast, match: {model: 'llama-[0-9'}}\n",
            "routes[0].match.model: `llama-[0-9` is not a valid glob: unclosed character class; missing ']'",
        ),
        (
            "routes:\n  - {name: r, pool: fast, match: {path: 'v1/*'}}\n",
            "routes[0].match.path: `v1/*` is not an absolute path pattern",
        ),
        (
            "routes:\n  - {name: r, pool: fast, match: {headers: {'bad header': x}}}\n",
            "routes[0].match.headers.\"bad header\": `bad header` is not a valid header name",
        ),
        (
            "routes:\n  - {name: r, pool: fast, priority: urgent}\n",
            "routes[0].priority: unknown priority class `urgent`; priority_classes has: interactive, batch",
        ),
        (
            "routes:\n  - {name: r, pool: fast, on_slo_miss: shed}\n",
            "routes[0].on_slo_miss: has no effect without ttft_slo",
        ),
        (
            "routes:\n  - {name: r, pool: fast, ttft_slo: 1s, on_slo_miss: drop}\n",
            "routes[0].on_slo_miss: unknown variant `drop`, expected one of `queue`, `fallback`, `shed`",
        ),
        (
            "routes:\n  - {name: r, pool: fast, ttft_slo: 0s}\n",
            "routes[0].ttft_slo: must be greater than zero",
        ),
        (
            "routes:\n  - {name: r, pool: fast, tpot_slo: 0ms}\n",
            "routes[0].tpot_slo: must be greater than zero",
        ),
        (
            "routes:\n  - {name: r, pool: fast, tpot_slo: 50}\n",
            "routes[0].tpot_slo: `50` has no unit; write `50ms` or `50s`",
        ),
        (
            "routes:\n  - {name: r, pool: fast, ttft_slo: 800}\n",
            "routes[0].ttft_slo: `800` has no unit; write `800ms` or `800s`",
        ),
        (
            "routes:\n  - {name: r, pool: fast, race_on: answer}\n",
            "routes[0].race_on: unknown variant `answer`, expected `ttft` or `ttfa`",
        ),
        (
            "routes:\n  - {name: r, pool: fast, objective: tta}\n",
            "routes[0].objective: unknown variant `tta`, expected `ttft` or `ttfa`",
        ),
        (
            "routes:\n  - {name: r, pool: fast}\n  - {name: r, pool: spare}\n",
            "routes[1].name: duplicate route name `r` (first used at routes[0])",
        ),
        ("routes:\n  - {pool: fast}\n", "routes[0].name: missing"),
        ("routes: []\n", "routes: is empty"),
        (
            "priority_classes: [a, a]\nroutes:\n  - {name: r, pool: fast}\n",
            "priority_classes[1]: class `a` is listed twice",
        ),
        (
            "admission: {queue_size: 0}\n",
            "admission.queue_size: must be between 1 and 1048576, got 0",
        ),
        (
            "routes:\n  - {name: r, pool: fast, match: {api_keys: []}}\n",
            "routes[0].match.api_keys: is empty",
        ),
    ];
    for (yaml, expected) in cases {
        let err = load(yaml).expect_err(yaml);
        assert!(
            err.contains(expected),
            "{yaml}\n  got: {err}\n  want: {expected}"
        );
    }
}

#[test]
fn shadowed_routes_and_unreached_pools_warn() {
    let c = load(
        "routes:\n  - {name: all, pool: fast}\n  - {name: late, pool: fast, match: {model: x}}\n",
    )
    .unwrap();
    let w = warnings(&c);
    assert!(
        w.iter()
            .any(|m| m.starts_with("routes[1]: never matches: routes[0]")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|m| m == "pools.spare: no route sends requests to pool `spare`"),
        "{w:?}"
    );
}

#[test]
fn the_objective_defaults_to_ttft_and_ttfa_warns_under_another_policy() {
    use crate::config::route::RouteObjective;
    let c = load(
        "routes:\n  - {name: think, pool: fast, objective: ttfa, match: {model: r1}}\n  - {name: r, pool: spare, objective: ttft}\n",
    )
    .unwrap();
    assert_eq!(c.routes[0].objective, RouteObjective::Ttfa);
    assert_eq!(c.routes[1].objective, RouteObjective::Ttft);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let c = load("routes:\n  - {name: r, pool: fast}\n  - {name: s, pool: spare}\n").unwrap();
    assert_eq!(c.routes[0].objective, RouteObjective::Ttft);
    let c = load(
        "routes:\n  - {name: r, pool: fast, objective: ttfa, policy: round_robin, match: {model: x}}\n  - {name: s, pool: spare}\n",
    )
    .unwrap();
    let w = warnings(&c);
    assert_eq!(
        w,
        ["routes[0].objective: only predicted_ttft minimises TTFA; the policy routing this route ignores it"]
    );
    // Without a policy of its own, the route is routed by its pool's.
    let pools = |policy: &str| {
        format!(
            "pools:\n  fast: {{policy: {policy}, backends: [{{name: a, url: 'http://h:1'}}]}}\n"
        )
    };
    let on = |route: &str, policy: &str| {
        let yaml = format!(
            "routes:\n  - {{name: r, pool: fast, {route}}}\n{}",
            pools(policy)
        );
        let w = warnings(&Config::from_yaml_str(&yaml, "f.yaml").unwrap());
        w.into_iter()
            .filter(|m| m.starts_with("routes"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        on("objective: ttfa", "round_robin"),
        ["routes[0].objective: only predicted_ttft minimises TTFA; the policy routing this route ignores it"]
    );
    assert!(on("objective: ttfa", "predicted_ttft").is_empty());
    assert!(on("objective: ttfa, policy: predicted_ttft", "round_robin").is_empty());
    let c = load("routes:\n  - {name: r, pool: fast, race_on: ttfa, match: {model: x}}\n  - {name: s, pool: spare}\n").unwrap();
    assert_eq!(c.routes[0].race_on, pronto_core::race::RaceOn::Ttfa);
    let w = warnings(&c);
    assert_eq!(
        w,
        ["routes[0].race_on: no effect without first_token_deadline or hedge"]
    );
}

#[test]
fn a_route_policy_is_validated_like_a_pools() {
    let c = load(
        "routes:\n  - {name: r, pool: fast, policy: {name: cache_aware, cache_threshold: 0.5}}\n",
    )
    .unwrap();
    assert_eq!(
        c.routes[0].policy.as_ref().map(|p| p.name()),
        Some("cache_aware")
    );
    let e = load(
        "routes:\n  - {name: r, pool: fast, policy: {name: cache_aware, cache_threshold: 2}}\n",
    )
    .unwrap_err();
    assert!(
        e.contains("routes[0].policy.cache_threshold: must be in 0..=1"),
        "{e}"
    );
    let e = load("routes:\n  - {name: r, pool: fast, policy: fastest}\n").unwrap_err();
    assert!(e.contains("routes[0].policy"), "{e}");
}

#[test]
fn deadlines_and_hedges_load_and_their_errors_name_the_field() {
    use pronto_core::race::{FirstTokenDeadline, Hedge, HedgeDelay};
    let c = load(
        "routes:\n  - {name: a, pool: fast, first_token_deadline: {factor: 3, floor: 100ms}, hedge: {quantile: 0.9, budget: 0.1, max_predicted_ttft: 2s}}\n  - {name: b, pool: spare, first_token_deadline: {after: 2s}, hedge: {after: 300ms}}\n",
    )
    .unwrap();
    assert_eq!(
        c.routes[0].first_token_deadline,
        Some(FirstTokenDeadline::Predicted {
            factor: 3.0,
            floor: Duration::from_millis(100)
        })
    );
    assert_eq!(
        c.routes[0].hedge,
        Some(Hedge {
            delay: HedgeDelay::Quantile(0.9),
            budget: 0.1,
            max_predicted_ttft: Some(Duration::from_secs(2)),
        })
    );
    assert_eq!(
        c.routes[1].first_token_deadline,
        Some(FirstTokenDeadline::After(Duration::from_secs(2)))
    );
    let h = c.routes[1].hedge.unwrap();
    assert_eq!(
        (h.delay, h.budget, h.max_predicted_ttft),
        (HedgeDelay::After(Duration::from_millis(300)), 0.05, None)
    );
    let default_floor =
        load("routes:\n  - {name: a, pool: fast, first_token_deadline: {factor: 2}}\n").unwrap();
    assert_eq!(
        default_floor.routes[0].first_token_deadline,
        Some(FirstTokenDeadline::Predicted {
            factor: 2.0,
            floor: Duration::from_millis(250)
        })
    );
    for (bad, expected) in [
        (
            "first_token_deadline: {}",
            "routes[0].first_token_deadline: needs `after`",
        ),
        (
            "first_token_deadline: {after: 1s, factor: 2}",
            "routes[0].first_token_deadline: set either",
        ),
        (
            "first_token_deadline: {factor: 0.5}",
            "routes[0].first_token_deadline.factor: must be a number >= 1",
        ),
        (
            "first_token_deadline: {after: 1s, floor: 1s}",
            "routes[0].first_token_deadline.floor: only applies",
        ),
        (
            "first_token_deadline: {after: 0s}",
            "routes[0].first_token_deadline.after: must be greater than zero",
        ),
        (
            "first_token_deadline: {factor: 2, flor: 1s}",
            "unknown field `flor`",
        ),
        ("hedge: {}", "routes[0].hedge: needs `after`"),
        (
            "hedge: {quantile: 1.5}",
            "routes[0].hedge.quantile: must be between 0 and 1",
        ),
        (
            "hedge: {after: 1s, budget: 0}",
            "routes[0].hedge.budget: must be a fraction",
        ),
        (
            "hedge: {after: 1s, quantile: 0.9}",
            "routes[0].hedge: set either",
        ),
    ] {
        let err = load(&format!("routes:\n  - {{name: a, pool: fast, {bad}}}\n")).unwrap_err();
        assert!(err.contains(expected), "{bad}: {err}");
    }
}
