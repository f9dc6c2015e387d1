use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::*;
use crate::state::GatewayState;

/// A resolver answering whatever the test last set, counting calls.
#[derive(Default)]
struct FakeResolver {
    answer: Mutex<Option<Result<Vec<SocketAddr>, String>>>,
    calls: AtomicUsize,
    targets: Mutex<Vec<String>>,
}

impl FakeResolver {
    fn set(&self, answer: Result<&[&str], &str>) {
        *self.answer.lock().unwrap() = Some(
            answer
                .map(|a| a.iter().map(|s| s.parse().unwrap()).collect())
                .map_err(str::to_string),
        );
    }
}

impl Resolver for FakeResolver {
    fn resolve<'a>(&'a self, target: &'a str) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.targets.lock().unwrap().push(target.to_string());
        let answer = self.answer.lock().unwrap().clone().expect("answer set");
        Box::pin(async move { answer.map_err(io::Error::other) })
    }
}

fn config(discover: &str) -> Arc<Config> {
    let yaml = format!(
        "pools:\n  m:\n    profile: {{base_ms: 40}}\n    backends: [{{name: s, url: 'http://10.9.9.9:1'}}]\n    discover: {discover}\n"
    );
    Arc::new(Config::from_yaml_str(&yaml, "t").unwrap())
}

fn setup(discover: &str) -> (Arc<FakeResolver>, Discovery, Metrics) {
    let metrics = Metrics::new();
    let state = StateHandle::new(GatewayState::new(
        config(discover),
        Default::default(),
        &metrics,
    ));
    let resolver = Arc::new(FakeResolver::default());
    let d = Discovery::new(state, metrics.clone(), resolver.clone());
    (resolver, d, metrics)
}

fn names(d: &Discovery) -> Vec<String> {
    let state = d.state.load();
    state
        .pool("m")
        .unwrap()
        .backends
        .iter()
        .map(|b| b.name().to_string())
        .collect()
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn usable_addresses_filter_sort_and_dedup() {
    let mixed = addrs(&["10.0.0.2:80", "[::1]:80", "10.0.0.1:80", "10.0.0.2:80"]);
    assert_eq!(
        usable_addresses(mixed.clone(), AddressFamily::Ipv4).unwrap(),
        addrs(&["10.0.0.1:80", "10.0.0.2:80"])
    );
    assert_eq!(
        usable_addresses(mixed.clone(), AddressFamily::Ipv6).unwrap(),
        addrs(&["[::1]:80"])
    );
    assert_eq!(
        usable_addresses(mixed, AddressFamily::Any).unwrap().len(),
        3
    );
    let err = usable_addresses(addrs(&["[::1]:80"]), AddressFamily::Ipv4).unwrap_err();
    assert!(err.contains("none of family ipv4"), "{err}");
    assert!(usable_addresses(Vec::new(), AddressFamily::Any).is_err());
}

#[tokio::test]
async fn a_changed_set_rebuilds_the_pool_and_keeps_unchanged_backends() {
    let (resolver, d, metrics) = setup("{dns: 'vllm.internal:8000'}");
    assert_eq!(names(&d), ["s"]);

    resolver.set(Ok(&["10.0.0.2:8000", "10.0.0.1:8000"]));
    let out = d.refresh("m").await;
    assert!(
        matches!(out, Outcome::Changed { ref removed, .. } if removed.is_empty()),
        "{out:?}"
    );
    assert_eq!(names(&d), ["s", "m-10.0.0.1:8000", "m-10.0.0.2:8000"]);
    assert_eq!(resolver.targets.lock().unwrap()[0], "vllm.internal:8000");
    // Discovered backends take the pool's profile hint.
    let first = Arc::clone(&d.state.load().pool("m").unwrap().backends[1]);
    assert_eq!(first.config.profile.unwrap().base_ms, Some(40.0));
    assert!(metrics
        .render()
        .contains("pronto_discovery_backends{pool=\"m\"} 2"));

    // Same answer in another order: nothing to do.
    resolver.set(Ok(&["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.1:8000"]));
    assert_eq!(d.refresh("m").await, Outcome::Unchanged);

    // One leaves, one arrives: the one that stayed keeps its Arc (and what it learned).
    resolver.set(Ok(&["10.0.0.1:8000", "10.0.0.3:8000"]));
    let out = d.refresh("m").await;
    assert_eq!(
        out,
        Outcome::Changed {
            addrs: addrs(&["10.0.0.1:8000", "10.0.0.3:8000"]),
            removed: vec![Arc::from("m-10.0.0.2:8000")],
        }
    );
    assert_eq!(names(&d), ["s", "m-10.0.0.1:8000", "m-10.0.0.3:8000"]);
    assert!(Arc::ptr_eq(
        &first,
        &d.state.load().pool("m").unwrap().backends[1]
    ));
}

#[tokio::test]
async fn a_failed_resolution_keeps_the_last_known_set() {
    let (resolver, d, metrics) = setup("{dns: 'vllm.internal:8000', family: ipv4}");
    resolver.set(Err("no such host"));
    assert!(matches!(d.refresh("m").await, Outcome::Failed(_)));
    assert_eq!(names(&d), ["s"], "never resolved: static backends only");

    resolver.set(Ok(&["10.0.0.1:8000"]));
    d.refresh("m").await;
    resolver.set(Err("timeout"));
    assert_eq!(d.refresh("m").await, Outcome::Failed("timeout".into()));
    resolver.set(Ok(&["[::1]:8000"]));
    assert!(
        matches!(d.refresh("m").await, Outcome::Failed(_)),
        "wrong family only"
    );
    assert_eq!(names(&d), ["s", "m-10.0.0.1:8000"]);
    let text = metrics.render();
    assert!(
        text.contains("pronto_discovery_errors_total{pool=\"m\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("pronto_discovery_backends{pool=\"m\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_reload_keeps_discovered_backends_unless_the_name_changed() {
    let (resolver, d, metrics) = setup("{dns: 'a.internal:8000', interval: 5s}");
    resolver.set(Ok(&["10.0.0.1:8000"]));
    d.refresh("m").await;
    let kept = Arc::clone(&d.state.load().pool("m").unwrap().backends[1]);

    // Same name, another interval: the discovered backend survives the reload unchanged.
    let (next, carried) = d.state.load().rebuild(
        config("{dns: 'a.internal:8000', interval: 9s}"),
        Default::default(),
        &metrics,
    );
    assert_eq!((carried.backends_kept, carried.backends_new), (2, 0));
    assert!(Arc::ptr_eq(&kept, &next.pool("m").unwrap().backends[1]));

    // Another name: its addresses are unknown until resolved.
    let (next, carried) = next.rebuild(
        config("{dns: 'b.internal:8000'}"),
        Default::default(),
        &metrics,
    );
    assert_eq!(next.pool("m").unwrap().backends.len(), 1);
    assert_eq!(
        carried.backends_removed,
        [Arc::<str>::from("m-10.0.0.1:8000")]
    );
    assert_eq!(next.discovered("m"), None);
}

#[tokio::test]
async fn rounds_resolve_when_due_and_at_once_after_a_reload() {
    let (resolver, d, metrics) = setup("{dns: 'a.internal:8000', interval: 10s}");
    resolver.set(Ok(&["10.0.0.1:8000"]));
    let t0 = Instant::now();
    let (mut last, mut due) = (None, HashMap::new());
    d.round(t0, &mut last, &mut due).await;
    assert_eq!(resolver.calls.load(Ordering::Relaxed), 1);
    // Discovery's own swaps keep the config: not a reload.
    d.round(t0 + Duration::from_secs(1), &mut last, &mut due)
        .await;
    d.round(t0 + Duration::from_secs(9), &mut last, &mut due)
        .await;
    assert_eq!(resolver.calls.load(Ordering::Relaxed), 1);
    d.round(t0 + Duration::from_secs(10), &mut last, &mut due)
        .await;
    assert_eq!(resolver.calls.load(Ordering::Relaxed), 2);

    // A reload (a new config) is resolved at the next round, interval or not.
    let (next, _) = d.state.load().rebuild(
        config("{dns: 'a.internal:8000', interval: 10s}"),
        Default::default(),
        &metrics,
    );
    d.state.store(Arc::new(next));
    d.round(t0 + Duration::from_secs(11), &mut last, &mut due)
        .await;
    assert_eq!(resolver.calls.load(Ordering::Relaxed), 3);
    assert_eq!(names(&d), ["s", "m-10.0.0.1:8000"]);
}

#[tokio::test]
async fn the_system_resolver_resolves_localhost() {
    let found = SystemResolver.resolve("localhost:8123").await.unwrap();
    assert!(!found.is_empty());
    assert!(
        found
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 8123),
        "{found:?}"
    );
}
