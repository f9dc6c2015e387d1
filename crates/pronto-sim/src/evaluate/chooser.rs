//! Who routes an evaluator run: a gateway policy, with its parameters and the exact prefix
//! index or not, or the oracle — from the policy name `pronto evaluate --policy` takes
//! (module docs of [`super`]: *Policy parameters*, `POLICY+exact`).

use std::sync::Arc;

use anyhow::Context;
use pronto_core::routing::{Policy, PolicyKind, PolicySpec};

use super::{EXACT_SUFFIX, ORACLE};

/// Router choice for one arrival: a gateway policy or the oracle.
pub(super) enum Chooser {
    /// A gateway policy; `true`: fed by the exact prefix index.
    Policy(Arc<dyn Policy>, bool),
    Oracle,
}

impl Chooser {
    /// The chooser `policy` names: `oracle`, or a gateway policy's name with its parameters
    /// (`NAME` or `NAME{key: value, ...}`) and optionally `+exact`.
    pub(super) fn of(policy: &str) -> anyhow::Result<Chooser> {
        if policy == ORACLE {
            return Ok(Chooser::Oracle);
        }
        let (name, exact) = match policy.strip_suffix(EXACT_SUFFIX) {
            Some(name) => (name, true),
            None => (policy, false),
        };
        let (name, params) = params(policy, name)?;
        PolicyKind::parse(name).with_context(|| {
            format!(
                "unknown policy {policy:?} (known: {}, {ORACLE}; any but {ORACLE} may take \
                 parameters as a map after its name and end with {EXACT_SUFFIX})",
                PolicyKind::ALL.join(", ")
            )
        })?;
        let spec = PolicySpec::from_parts(name, &params).map_err(|errors| {
            let msgs: Vec<String> = errors
                .iter()
                .map(|e| match &e.param {
                    Some(p) => format!("{p}: {}", e.message),
                    None => e.message.clone(),
                })
                .collect();
            anyhow::anyhow!("policy {policy:?}: {}", msgs.join("; "))
        })?;
        Ok(Chooser::Policy(spec.build(), exact))
    }
}

/// A gateway policy's name and its parameters: `NAME` or `NAME{key: value, ...}` (a YAML flow
/// map, the keys and values of a pool's `policy:` map, `predicted_ttft{decode_stall_weight:
/// 0.3}`); `policy` is the whole name, for errors.
fn params<'a>(
    policy: &str,
    name: &'a str,
) -> anyhow::Result<(&'a str, Vec<(String, serde_json::Value)>)> {
    let Some(open) = name.find('{') else {
        return Ok((name, Vec::new()));
    };
    let (name, map) = name.split_at(open);
    let value: serde_json::Value = serde_yaml_ng::from_str(map)
        .with_context(|| format!("policy {policy:?}: its parameters are not a YAML map"))?;
    let serde_json::Value::Object(map) = value else {
        anyhow::bail!("policy {policy:?}: its parameters are not a YAML map");
    };
    Ok((name, map.into_iter().collect()))
}
