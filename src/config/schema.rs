//! `pronto config schema`: a JSON Schema (draft 2020-12) of the config file, for editors
//! (YAML language servers take a JSON Schema for completion and inline errors).
//!
//! Derived by `schemars` from the file structs ([`super::file`] and the section files beside
//! it): their doc comments are the descriptions, `#[schemars(range(..))]` the bounds and
//! `extend("default" = ..)` the defaults, taken from the `DEFAULT_*` constants so they cannot
//! drift. Hand-written here are only the shapes serde's derive does not describe: durations,
//! sizes, secrets, the policy map (one branch per policy, generated from
//! [`PolicyKind::spec`]) and the pools map. The schema checks shape and types; the loader
//! still checks what a schema cannot express (listener collisions, unique backend names across
//! pools, URL details), so `pronto check-config` remains the authority.
//!
//! Kept in sync by `tests/config_files.rs`: every YAML file in `config/` validates against
//! the schema, a typo'd key or a wrongly typed value does not, and every property the schema
//! names appears in `config/pronto.yaml`.

use std::borrow::Cow;
use std::time::Duration;

use schemars::generate::SchemaSettings;
use schemars::transform::{transform_subschemas, Transform};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use super::duration::{format_duration, format_size};
use super::file::ConfigFile;
use pronto_core::routing::PolicyKind;

/// The JSON Schema of the gateway config file, pretty-printed.
pub fn config_schema() -> String {
    serde_json::to_string_pretty(&schema_value()).expect("a JSON value always serializes")
}

/// The schema as a JSON value.
pub(super) fn schema_value() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.transforms.push(Box::new(NoNull));
    let schema = settings
        .into_generator()
        .into_root_schema_for::<ConfigFile>();
    let mut v = schema.to_value();
    v["$id"] = json!("urn:pronto:config");
    v["title"] = json!("Pronto gateway config");
    v["description"] =
        json!("Check a file with `pronto check-config FILE`. Unknown keys are errors.");
    v["required"] = json!(["pools"]);
    v
}

/// A duration's default, as the schema writes it (`2s`).
pub(super) fn dur(d: Duration) -> String {
    format_duration(d)
}

/// A size's default, as the schema writes it (`32MiB`).
pub(super) fn size(bytes: u64) -> String {
    format_size(bytes)
}

/// Drops the `null` schemars adds to every `Option` field: a config key is left out, never
/// written as `null`, and the schema says so.
#[derive(Clone)]
struct NoNull;

impl Transform for NoNull {
    fn transform(&mut self, schema: &mut Schema) {
        transform_subschemas(self, schema);
        let Some(obj) = schema.as_object_mut() else {
            return;
        };
        if let Some(Value::Array(types)) = obj.get_mut("type") {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let only = types.remove(0);
                obj.insert("type".into(), only);
            }
        }
        if let Some(Value::Array(branches)) = obj.get_mut("anyOf") {
            branches.retain(|b| b.get("type") != Some(&json!("null")));
            if branches.len() == 1 {
                let only = branches.remove(0);
                obj.remove("anyOf");
                if let Value::Object(inner) = only {
                    for (k, v) in inner {
                        obj.entry(k).or_insert(v);
                    }
                }
            }
        }
    }
}

/// A duration with a unit, as written in the file (read by `super::duration::text_duration`).
pub struct DurationText;

impl JsonSchema for DurationText {
    fn schema_name() -> Cow<'static, str> {
        "duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A duration with a unit: 250ms, 2s, 1m30s, 1.5s (ns, us, ms, s, m, h, d)",
            "type": "string",
            "pattern": "^\\s*([0-9]+(\\.[0-9]*)?\\s*(ns|us|µs|ms|s|m|h|d)\\s*)+$",
        })
    }
}

/// A size in bytes, bare or with a unit, as written in the file (read by
/// `super::duration::text_size`).
pub struct SizeText;

impl JsonSchema for SizeText {
    fn schema_name() -> Cow<'static, str> {
        "size".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Bytes, or a number with a unit: 32MiB, 512KiB, 1GB",
            "oneOf": [
                { "type": "integer", "minimum": 0 },
                {
                    "type": "string",
                    "pattern": "^\\s*[0-9]+(\\.[0-9]*)?\\s*(B|KB|kB|MB|GB|TB|KiB|MiB|GiB|TiB)?\\s*$",
                },
            ],
        })
    }
}

/// `{env: NAME}` or `{file: PATH}`: where a value is read from; `what` names the value.
pub(super) fn source_branches(what: &str) -> Vec<Value> {
    vec![
        json!({
            "type": "object", "additionalProperties": false, "required": ["env"],
            "properties": { "env": { "description": format!("Environment variable holding the {what}"), "type": "string" } },
        }),
        json!({
            "type": "object", "additionalProperties": false, "required": ["file"],
            "properties": { "file": { "description": format!("File holding the {what} (trimmed; relative to this file)"), "type": "string" } },
        }),
    ]
}

/// A value inline (matching `inline`), `{env: NAME}` or `{file: PATH}`.
pub(super) fn inline_or_source(inline: Value, what: &str) -> Schema {
    let mut branches = vec![inline];
    branches.extend(source_branches(what));
    json_schema!({ "oneOf": branches })
}

/// Declares a unit type whose JSON Schema is `$schema` (a field takes it with
/// `#[schemars(with = "Option<..>")]`, staying optional).
macro_rules! field_schema {
    ($(#[$doc:meta])* $name:ident, $def:literal, $schema:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                $def.into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                $schema
            }
        }
    };
}

field_schema!(
    /// `admin.token`: at least 8 characters inline, or read from the environment or a file.
    AdminToken,
    "admin_token",
    inline_or_source(json!({ "type": "string", "minLength": 8 }), "token")
);

field_schema!(
    /// `cluster.replica`: a name inline, or read from the environment or a file.
    ReplicaName,
    "replica_name",
    inline_or_source(json!({ "type": "string", "minLength": 1 }), "name")
);

field_schema!(
    /// A NATS credential read from the environment or a file, never inline.
    NatsSource,
    "nats_source",
    json_schema!({ "oneOf": source_branches("credential") })
);

field_schema!(
    /// A NATS user name: inline, or read from the environment or a file.
    NatsUser,
    "nats_user",
    inline_or_source(json!({ "type": "string", "minLength": 1 }), "user name")
);

/// A policy name, or a map with `name` and that policy's parameters (one branch per policy).
pub(super) fn policy_schema() -> Value {
    let names: Vec<&str> = PolicyKind::ALL.to_vec();
    let branches: Vec<Value> = PolicyKind::ALL
        .iter()
        .filter_map(|n| PolicyKind::parse(n))
        .map(|kind| {
            let mut properties = Map::new();
            properties.insert("name".into(), json!({ "const": kind.as_str() }));
            let defaults = serde_json::to_value(kind.spec()).unwrap_or(Value::Null);
            for param in kind.params() {
                let default = defaults.get(*param).cloned().unwrap_or(Value::Null);
                let ty = match &default {
                    Value::Number(n) if n.is_u64() => json!({ "type": "integer", "minimum": 0 }),
                    Value::Number(_) => json!({ "type": "number" }),
                    Value::Bool(_) => json!({ "type": "boolean" }),
                    _ => json!({ "type": "string" }),
                };
                let mut p = ty;
                p["default"] = default;
                p["description"] = json!(kind.param_doc(param));
                properties.insert((*param).to_string(), p);
            }
            json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["name"],
                "properties": properties,
            })
        })
        .collect();
    json!({
        "description": "Routing policy: a name, or a map with `name` and the policy's parameters",
        "oneOf": [
            { "type": "string", "enum": names },
            { "oneOf": branches },
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_is_draft_2020_12_json_with_every_policy() {
        let v: Value = serde_json::from_str(&config_schema()).unwrap();
        assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema");
        let branches = v["$defs"]["policy"]["oneOf"][1]["oneOf"]
            .as_array()
            .unwrap();
        assert_eq!(branches.len(), PolicyKind::ALL.len());
        let cache_aware = branches
            .iter()
            .find(|b| b["properties"]["name"]["const"] == "cache_aware")
            .unwrap();
        assert_eq!(
            cache_aware["properties"]["balance_abs_threshold"]["type"],
            "integer"
        );
        assert_eq!(
            cache_aware["properties"]["cache_threshold"]["type"],
            "number"
        );
        let limits = v["properties"]["limits"]["$ref"].as_str().unwrap();
        let limits = &v["$defs"][limits.trim_start_matches("#/$defs/")];
        assert_eq!(limits["properties"]["connect_timeout"]["default"], "2s");
    }

    #[test]
    fn no_schema_admits_null() {
        let text = config_schema();
        assert!(!text.contains("\"null\""), "{text}");
    }
}
