//! The `config_loader` cargo-fuzz target's body (`pronto::fuzzing`, run by `fuzz/` under
//! libFuzzer on nightly) on stable: a few thousand seeded random inputs and mutations of
//! every config file in the repository, so the property is exercised in CI.

use std::path::Path;

use pronto_core::fuzzing;

/// Every YAML file under `config/` except the simulator's (another schema), as bytes.
fn config_files() -> Vec<Vec<u8>> {
    fn walk(dir: &Path, out: &mut Vec<Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "sim") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config"),
        &mut out,
    );
    out
}

#[test]
fn the_config_loader_never_panics_and_locates_its_errors() {
    let mut seeds = config_files();
    assert!(seeds.len() >= 3, "the repository's configs are the seeds");
    // Small documents too, where each mutation matters more.
    for s in [
        "pools:\n  m:\n    backends:\n      - {name: a, url: 'http://127.0.0.1:8001'}\n",
        "pools: {m: {backends: [{name: a, url: 'http://h:1', weight: 0}]}, n: {discover: {dns: 'x:1'}}}\n",
        "health: {interval: 1s}\nroutes:\n  - {name: r, pool: m, ttft_slo: 500ms}\npools:\n  m:\n    scrape: {interval: 250ms}\n    backends: [{name: a, url: 'http://h:1'}]\n",
    ] {
        seeds.push(s.as_bytes().to_vec());
    }
    fuzzing::smoke(4, &seeds, 3000, pronto::fuzzing::config_loader);
}
