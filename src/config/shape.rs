//! Every shape error of a file in one pass: unknown keys and values of the wrong type.
//!
//! serde stops at the first error, so a file with a typo in one section and a wrong type in
//! another would show one problem per `check-config` run. When the file does not deserialize,
//! it is read again as a YAML tree and deserialized from the tree with
//! [`serde_path_to_error`], which names the field path of each failure. The failing node (an
//! unknown key, or a value of the wrong type) is recorded and removed from the tree, and the
//! tree is deserialized again, until it deserializes. The file that remains is validated as
//! usual, so the semantic errors of everything else are reported with the shape errors. Paths
//! are those of the original text, so [`super::locate`] places every error at its line.

use serde_path_to_error::Segment;
use serde_yaml_ng::Value;

use super::file::{self, ConfigFile};
use super::validate::key_path;

/// Most shape errors collected before giving up on the rest.
const MAX_SHAPE_ERRORS: usize = 100;

/// One shape error: the field path (`pools.m.backends[0].wieght`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    /// Field path of the removed node.
    pub path: String,
    /// serde's message.
    pub message: String,
}

/// `text` as a [`ConfigFile`] with every node that has a shape error removed, and those
/// errors. `Err` (the first error, with its position) when the text is not YAML, or when a
/// failure cannot be pinned to a node.
pub fn parse_all(text: &str) -> Result<(ConfigFile, Vec<ShapeError>), serde_yaml_ng::Error> {
    let first = match file::parse(text) {
        Ok(f) => return Ok((f, Vec::new())),
        Err(e) => e,
    };
    let Ok(mut tree) = serde_yaml_ng::from_str::<Value>(text) else {
        return Err(first);
    };
    let mut errors = Vec::new();
    // Sequence elements removed so far: the sequence's path and the element's index, both as
    // in the file (a removal shifts the later elements of the tree down by one).
    let mut removed: Vec<(Vec<Step>, usize)> = Vec::new();
    while errors.len() < MAX_SHAPE_ERRORS {
        let e = match serde_path_to_error::deserialize::<_, ConfigFile>(tree.clone()) {
            Ok(f) => return Ok((f, errors)),
            Err(e) => e,
        };
        let message = e.inner().to_string();
        let Some(mut segments) = segments(e.path()) else {
            return Err(first);
        };
        // An unknown key's path may end at its map (the name is in the message) or at the key.
        if let Some(key) = unknown_field(&message) {
            if !matches!(segments.last(), Some(Step::Key(k)) if k == key) {
                segments.push(Step::Key(key.to_string()));
            }
        }
        let in_file = in_file(&segments, &removed);
        if segments.is_empty() || !remove(&mut tree, &segments) {
            return Err(first);
        }
        if let Some((Step::Index(i), sequence)) = in_file.split_last() {
            removed.push((sequence.to_vec(), *i));
        }
        errors.push(ShapeError {
            path: render(&in_file),
            message,
        });
    }
    Err(first)
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// `steps`, a path in the tree as it is now, as a path in the file: each index counts the
/// elements removed before it from its sequence.
fn in_file(steps: &[Step], removed: &[(Vec<Step>, usize)]) -> Vec<Step> {
    let mut out = Vec::with_capacity(steps.len());
    for step in steps {
        let step = match step {
            Step::Key(k) => Step::Key(k.clone()),
            Step::Index(i) => {
                let mut gone: Vec<usize> = (removed.iter())
                    .filter(|(sequence, _)| *sequence == out)
                    .map(|(_, j)| *j)
                    .collect();
                gone.sort_unstable();
                Step::Index(gone.into_iter().fold(*i, |at, g| at + usize::from(g <= at)))
            }
        };
        out.push(step);
    }
    out
}

fn segments(path: &serde_path_to_error::Path) -> Option<Vec<Step>> {
    path.iter()
        .map(|s| match s {
            Segment::Map { key } => Some(Step::Key(key.clone())),
            Segment::Seq { index } => Some(Step::Index(*index)),
            Segment::Enum { .. } | Segment::Unknown => None,
        })
        .collect()
}

fn render(steps: &[Step]) -> String {
    let mut out = String::new();
    for s in steps {
        match s {
            Step::Key(k) => out = key_path(&out, k),
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The name in serde's "unknown field `NAME`, expected …".
fn unknown_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(&rest[..rest.find('`')?])
}

fn key_matches(k: &Value, key: &str) -> bool {
    match k {
        Value::String(s) => s == key,
        Value::Number(n) => n.to_string() == key,
        Value::Bool(b) => b.to_string() == key,
        _ => false,
    }
}

/// Remove the node at `steps` from `tree`; whether it was there.
fn remove(tree: &mut Value, steps: &[Step]) -> bool {
    let Some((last, parents)) = steps.split_last() else {
        return false;
    };
    let mut node = tree;
    for step in parents {
        let next = match (step, node) {
            (Step::Key(key), Value::Mapping(m)) => m
                .iter_mut()
                .find(|(k, _)| key_matches(k, key))
                .map(|(_, v)| v),
            (Step::Index(i), Value::Sequence(s)) => s.get_mut(*i),
            _ => None,
        };
        let Some(next) = next else {
            return false;
        };
        node = next;
    }
    match (last, node) {
        (Step::Key(key), Value::Mapping(m)) => {
            let found = m.keys().find(|k| key_matches(k, key)).cloned();
            found.is_some_and(|k| m.remove(&k).is_some())
        }
        (Step::Index(i), Value::Sequence(s)) if *i < s.len() => {
            // The later elements move down; `in_file` gives their paths as in the file.
            s.remove(*i);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(text: &str) -> Vec<String> {
        let (_, errors) = parse_all(text).expect("a YAML tree");
        errors.into_iter().map(|e| e.path).collect()
    }

    #[test]
    fn every_unknown_key_and_wrong_type_is_reported() {
        let text = "\
lisen: 127.0.0.1:8080
threads: many
limits: {max_body_byts: 1MiB}
pools:
  m:
    backends:
      - {name: a, url: 'http://h:1', wieght: 2}
      - {name: b, url: 'http://h:2'}
";
        let mut got = paths(text);
        got.sort();
        assert_eq!(
            got,
            [
                "limits.max_body_byts",
                "lisen",
                "pools.m.backends[0].wieght",
                "threads",
            ]
        );
    }

    #[test]
    fn a_valid_file_has_no_shape_errors_and_broken_yaml_is_one_error() {
        assert!(paths("pools:\n  m: {backends: [{name: a, url: 'http://h:1'}]}\n").is_empty());
        assert!(parse_all("pools: [\n").is_err());
    }

    #[test]
    fn bad_elements_of_a_list_keep_their_own_paths() {
        let text = "auth: {keys: [{name: a, key: k-12345678, models: ['a[', ok, 'b[', 'c[']}]}\n\
                    admin: {allowed_hosts: [x]}\n";
        assert_eq!(
            paths(text),
            [
                "auth.keys[0].models[0]",
                "auth.keys[0].models[2]",
                "auth.keys[0].models[3]",
            ]
        );
    }

    #[test]
    fn the_messages_are_serdes() {
        let (_, errors) = parse_all("pools: {m: {backends: [], policyy: x}}\n").unwrap();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].message.starts_with("unknown field `policyy`"),
            "{errors:?}"
        );
    }
}
