//! Field path → line and column in the YAML text.
//!
//! Validation works on deserialized structs, which carry no positions. To point an error at
//! its line, the YAML is parsed a second time with a [`DeserializeSeed`] that walks the path
//! (`pools.m.backends[2].url`): at each map it skips entries until the key matches, at each
//! sequence it skips to the index, and at the target node it fails on purpose. `serde_yaml_ng`
//! stamps every error raised by a visitor with the position of the node being read, so that
//! deliberate failure carries the target's line and column. Because the real YAML parser does
//! the walking, flow style (`{url: ...}`), quoting, comments and aliases all locate correctly.
//!
//! A path that does not exist in the text (a missing field) is located at its nearest
//! existing ancestor; the document root has no useful position and yields `None`.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Location;

/// Marker message of the deliberate failure at the target node.
const HIT: &str = "\u{1}pronto-locate-hit";

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A map key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// Split a path as written by [`super::validate::key_path`]: dot-separated keys (plain or
/// JSON-quoted) each followed by any number of `[index]`. `None` if malformed.
pub fn parse_path(path: &str) -> Option<Vec<Segment>> {
    let mut segments = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(quoted) = rest.strip_prefix('"') {
            // A JSON string: find its closing quote, skipping escapes.
            let mut end = None;
            let mut escaped = false;
            for (i, c) in quoted.char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let end = end?;
            let key: String = serde_json::from_str(&rest[..end + 2]).ok()?;
            segments.push(Segment::Key(key));
            rest = &quoted[end + 1..];
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            if end > 0 {
                segments.push(Segment::Key(rest[..end].to_string()));
            }
            rest = &rest[end..];
        }
        while let Some(inner) = rest.strip_prefix('[') {
            let close = inner.find(']')?;
            segments.push(Segment::Index(inner[..close].parse().ok()?));
            rest = &inner[close + 1..];
        }
        if let Some(next) = rest.strip_prefix('.') {
            rest = next;
        } else if !rest.is_empty() {
            return None;
        }
    }
    Some(segments)
}

/// Line and column (1-based) of the node at `path` in `text`, or of its nearest ancestor that
/// exists. `None` for the root or a malformed path. Meant for text that parsed.
pub fn locate(text: &str, path: &str) -> Option<Location> {
    let mut segments = parse_path(path)?;
    while !segments.is_empty() {
        if let Some(loc) = locate_exact(text, &segments) {
            return Some(loc);
        }
        segments.pop();
    }
    None
}

fn locate_exact(text: &str, segments: &[Segment]) -> Option<Location> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    match (Seek { segments }).deserialize(de) {
        Ok(()) => None,
        Err(e) if e.to_string().contains(HIT) => e.location().map(|l| Location {
            line: l.line(),
            column: l.column(),
        }),
        Err(_) => None,
    }
}

/// Walks `segments`; returns `Ok(())` if the path is absent and the marker error if found.
struct Seek<'a> {
    segments: &'a [Segment],
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        match self.segments.split_first() {
            None => deserializer.deserialize_any(Hit),
            Some((first, rest)) => deserializer.deserialize_any(Walk { first, rest }),
        }
    }
}

/// Fails on whatever node it is given; the deserializer stamps the failure with a position.
struct Hit;

impl<'de> Visitor<'de> for Hit {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(HIT)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(HIT))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(HIT))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(HIT))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(HIT))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(HIT))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(HIT))
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(HIT))
    }
    fn visit_some<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(de::Error::custom(HIT))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(HIT))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(HIT))
    }
}

/// Descends one segment into a map or sequence; any other node means "path absent".
struct Walk<'a> {
    first: &'a Segment,
    rest: &'a [Segment],
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map or a sequence")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Segment::Key(want) = self.first else {
            return Ok(());
        };
        while let Some(key) = map.next_key::<serde_yaml_ng::Value>()? {
            let matches = match &key {
                serde_yaml_ng::Value::String(s) => s == want,
                serde_yaml_ng::Value::Number(n) => n.to_string() == *want,
                serde_yaml_ng::Value::Bool(b) => b.to_string() == *want,
                _ => false,
            };
            if matches {
                return map.next_value_seed(Seek {
                    segments: self.rest,
                });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Segment::Index(want) = *self.first else {
            return Ok(());
        };
        for _ in 0..want {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(Seek {
            segments: self.rest,
        })
        .map(|_| ())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str, path: &str) -> Option<(usize, usize)> {
        locate(text, path).map(|l| (l.line, l.column))
    }

    const DOC: &str = "\
# comment
listen: 127.0.0.1:8080
pools:
  llama-3-8b:
    backends:
      - name: a
        url: http://x:1
      - {name: b, url: 'ftp://y'}
  \"meta/Llama-3.1\":
    policy: {name: nope}
";

    #[test]
    fn parses_plain_quoted_and_indexed_paths() {
        use Segment::*;
        assert_eq!(
            parse_path("pools.m.backends[2].url"),
            Some(vec![
                Key("pools".into()),
                Key("m".into()),
                Key("backends".into()),
                Index(2),
                Key("url".into())
            ])
        );
        assert_eq!(
            parse_path(r#"pools."a.b\"c".policy"#),
            Some(vec![
                Key("pools".into()),
                Key("a.b\"c".into()),
                Key("policy".into())
            ])
        );
        assert_eq!(parse_path("a[x]"), None);
        assert_eq!(parse_path("a[1"), None);
    }

    #[test]
    fn locates_block_flow_and_quoted_nodes() {
        assert_eq!(at(DOC, "listen"), Some((2, 9)));
        assert_eq!(at(DOC, "pools.llama-3-8b.backends[0].url"), Some((7, 14)));
        assert_eq!(at(DOC, "pools.llama-3-8b.backends[1].url"), Some((8, 24)));
        assert_eq!(at(DOC, "pools.llama-3-8b.backends[1]"), Some((8, 9)));
        assert_eq!(at(DOC, r#"pools."meta/Llama-3.1".policy"#), Some((10, 13)));
    }

    #[test]
    fn missing_paths_fall_back_to_the_nearest_ancestor() {
        assert_eq!(
            at(DOC, "pools.llama-3-8b.backends[0].weight"),
            at(DOC, "pools.llama-3-8b.backends[0]")
        );
        assert_eq!(at(DOC, "pools.llama-3-8b.backends[9]"), Some((6, 7)));
        assert_eq!(at(DOC, "threads"), None);
        assert_eq!(at(DOC, ""), None);
        // Descending into a scalar finds nothing below it.
        assert_eq!(at(DOC, "listen.port"), Some((2, 9)));
    }
}
