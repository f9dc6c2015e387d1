//! Stream migration (`src/proxy/migrate.rs`): the file struct, the typed model and their
//! validation with field paths.
//!
//! ```yaml
//! migration: {max_attempts: 1}     # the default for every stream; 0 turns migration off
//! routes:
//!   - name: agents
//!     pool: llama
//!     migration: {max_attempts: 2} # this route's streams may be continued twice
//! pools:
//!   legacy:
//!     continue_streams: false      # its engines cannot continue a partial answer
//! ```
//!
//! `max_attempts` bounds the continuations one stream may be sent (each on another backend):
//! when the backend relaying a stream fails after its first token, the gateway sends the
//! request with the text so far to the next-best backend and splices that backend's stream
//! into the client's. It is on by default (one attempt): a client whose stream would end in
//! an error event gets the rest of its answer instead. Requests that cannot be continued
//! honestly (`n` > 1, logprobs, a tool call or reasoning in progress) are never migrated, and
//! a pool with `continue_streams: false` (an engine without vLLM's and SGLang's
//! `continue_final_message`) neither sends nor receives continuations.

/// Continuations one stream may be sent when no `migration:` section says otherwise.
pub const DEFAULT_MIGRATION_ATTEMPTS: u32 = 1;

/// The most continuations one stream may be sent.
pub const MAX_MIGRATION_ATTEMPTS: u64 = 8;

/// Stream migration: a stream whose backend fails after its first token is continued on the
/// next-best backend with the text so far, spliced into the same client stream
///
/// Both the file's `migration:` section (top level or on a route) and the model: serde fills
/// the default and checks the bound; nothing is left to the checker.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct Migration {
    /// Continuations one stream may be sent, each on another backend (0: off)
    #[serde(deserialize_with = "super::value::int_in::<_, _, 0, MAX_MIGRATION_ATTEMPTS>")]
    #[schemars(range(min = 0, max = MAX_MIGRATION_ATTEMPTS))]
    pub max_attempts: u32,
}

impl Default for Migration {
    fn default() -> Migration {
        Migration {
            max_attempts: DEFAULT_MIGRATION_ATTEMPTS,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(yaml: &str) -> Result<Config, String> {
        Config::from_yaml_str(yaml, "m.yaml").map_err(|e| e.to_string())
    }

    const POOLS: &str = "pools:\n  m:\n    backends:\n      - {name: a, url: 'http://127.0.0.1:1'}\n      - {name: b, url: 'http://127.0.0.1:2'}\n";

    #[test]
    fn defaults_overrides_and_bad_values() {
        let c = parse(POOLS).unwrap();
        assert_eq!(c.migration.max_attempts, 1);
        assert!(c.pools[0].continue_streams);
        let yaml = format!(
            "migration: {{max_attempts: 0}}\nroutes:\n  - {{name: r, pool: m, migration: {{max_attempts: 3}}}}\n{POOLS}    continue_streams: false\n"
        );
        let c = parse(&yaml).unwrap();
        assert_eq!(c.migration.max_attempts, 0);
        assert_eq!(c.routes[0].migration.map(|m| m.max_attempts), Some(3));
        assert!(!c.pools[0].continue_streams);
        let e = parse(&format!("migration: {{max_attempts: 9}}\n{POOLS}")).unwrap_err();
        assert!(
            e.contains("migration.max_attempts: must be at most 8, got 9"),
            "{e}"
        );
        let e = parse(&format!(
            "routes:\n  - {{name: r, pool: m, migration: {{max_attempts: -1}}}}\n{POOLS}"
        ))
        .unwrap_err();
        assert!(e.contains("migration"), "{e}");
        let e = parse(&format!("migration: {{attempts: 1}}\n{POOLS}")).unwrap_err();
        assert!(e.contains("attempts"), "{e}");
    }
}
