//! "tree" and "delta" messages, parsed straight into entries: a million
//! entries as a serde_json `Value` take ~10x the memory of their JSON, as
//! `Entry`s under 2x. Tolerant as the rest of the protocol: a field of the
//! wrong type counts as absent, an entry without a valid path is skipped.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// One entry object of a "tree" or "delta" message.
pub struct Entry {
    pub path: String,
    pub dir: bool,
    pub size: u64,
    pub mtime_ns: i64,
    pub gen: String,
}

#[derive(Default)]
pub struct Change {
    pub op: String,
    pub version: u64,
    pub since: Option<u64>,
    /// Valid entries, the last of each path, sorted by path (parents before
    /// their children).
    pub entries: Vec<Entry>,
    /// Valid paths.
    pub gone: Vec<String>,
    /// A "listing"'s directory ("" the root); None if absent or not valid.
    pub path: Option<String>,
    /// A "tree" whose directories are listed only when asked ("list").
    pub lazy: bool,
    /// A "listing" of some names only.
    pub partial: bool,
    /// A delta's directories whose contents are exactly its entries below them.
    pub exact: Vec<String>,
}

impl Change {
    pub fn parse(line: &[u8]) -> serde_json::Result<Change> {
        serde_json::from_slice(line)
    }

    /// From a message parsed already (one whose "op" did not come first).
    pub fn from_value(v: &Value) -> Change {
        Change::deserialize(v).unwrap_or_default()
    }
}

/// P with outer slashes stripped, or None if it has an empty, "." or ".." component.
pub fn clean(p: &str) -> Option<&str> {
    let p = p.trim_matches('/');
    let bad = p.is_empty() || p.split('/').any(|c| c.is_empty() || c == "." || c == "..");
    (!bad).then_some(p)
}

/// An element of a list field, from its JSON; None skips it.
trait Item: Sized {
    fn from_value(v: &Value) -> Option<Self>;
}

impl Item for Entry {
    fn from_value(e: &Value) -> Option<Entry> {
        let path = clean(e.get("path")?.as_str()?)?.to_string();
        let dir = e.get("dir").and_then(Value::as_bool).unwrap_or(false);
        let size = match dir {
            true => 0,
            false => e.get("size").and_then(Value::as_u64).unwrap_or(0),
        };
        let mtime_ns = e.get("mtime_ns").and_then(Value::as_i64).unwrap_or(0);
        let gen = e
            .get("gen")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Some(Entry {
            path,
            dir,
            size,
            mtime_ns,
            gen,
        })
    }
}

impl Item for String {
    fn from_value(v: &Value) -> Option<String> {
        Some(clean(v.as_str()?)?.to_string())
    }
}

/// A JSON array read one element at a time (each a small `Value` while
/// it is converted); anything else is an empty list.
struct List<T>(Vec<T>);

impl<'de, T: Item> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListVisitor(PhantomData))
    }
}

struct ListVisitor<T>(PhantomData<T>);

impl<'de, T: Item> Visitor<'de> for ListVisitor<T> {
    type Value = List<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<List<T>, A::Error> {
        let mut out = Vec::with_capacity(s.size_hint().unwrap_or(0));
        while let Some(v) = s.next_element::<Value>()? {
            out.extend(T::from_value(&v));
        }
        Ok(List(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<List<T>, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(List(Vec::new()))
    }

    fn visit_bool<E>(self, _: bool) -> Result<List<T>, E> {
        Ok(List(Vec::new()))
    }

    fn visit_i64<E>(self, _: i64) -> Result<List<T>, E> {
        Ok(List(Vec::new()))
    }

    fn visit_u64<E>(self, _: u64) -> Result<List<T>, E> {
        Ok(List(Vec::new()))
    }

    fn visit_f64<E>(self, _: f64) -> Result<List<T>, E> {
        Ok(List(Vec::new()))
    }

    fn visit_str<E>(self, _: &str) -> Result<List<T>, E> {
        Ok(List(Vec::new()))
    }

    fn visit_unit<E>(self) -> Result<List<T>, E> {
        Ok(List(Vec::new()))
    }
}

impl<'de> Deserialize<'de> for Change {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ChangeVisitor)
    }
}

struct ChangeVisitor;

impl<'de> Visitor<'de> for ChangeVisitor {
    type Value = Change;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Change, A::Error> {
        let mut c = Change::default();
        while let Some(k) = m.next_key::<String>()? {
            match k.as_str() {
                "entries" => c.entries = m.next_value::<List<Entry>>()?.0,
                "gone" => c.gone = m.next_value::<List<String>>()?.0,
                "exact" => c.exact = m.next_value::<List<String>>()?.0,
                "path" => {
                    let v: Value = m.next_value()?;
                    c.path = match v.as_str() {
                        Some(p) if p.trim_matches('/').is_empty() => Some(String::new()),
                        Some(p) => clean(p).map(str::to_string),
                        None => None,
                    };
                }
                "lazy" => c.lazy = m.next_value::<Value>()?.as_bool().unwrap_or(false),
                "partial" => c.partial = m.next_value::<Value>()?.as_bool().unwrap_or(false),
                "op" | "version" | "since" => {
                    let v: Value = m.next_value()?;
                    match k.as_str() {
                        "op" => c.op = v.as_str().unwrap_or_default().to_string(),
                        "version" => c.version = v.as_u64().unwrap_or(0),
                        _ => c.since = v.as_u64(),
                    }
                }
                _ => _ = m.next_value::<IgnoredAny>()?,
            }
        }
        let v = &mut c.entries;
        if !v.is_sorted_by(|a, b| a.path < b.path) {
            v.sort_by(|a, b| a.path.cmp(&b.path)); // stable: a path's entries stay in order
            v.dedup_by(|later, kept| {
                let same = later.path == kept.path;
                if same {
                    std::mem::swap(later, kept);
                }
                same
            });
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_tolerantly() {
        let line = br#"{"op":"delta","version":3,"since":2,"x":[1,{"a":2}],"entries":[
            {"path":"/b/","size":2,"gen":"g"},{"path":"a/./c"},{"nopath":1},{"path":"a","dir":true,"size":9,"mtime_ns":-5},
            {"path":"b","size":"big","dir":"no","gen":7},7],"gone":["x/",5,"../y",""]}"#;
        let c = Change::parse(line).unwrap();
        assert_eq!((c.op.as_str(), c.version, c.since), ("delta", 3, Some(2)));
        let got: Vec<_> = c
            .entries
            .iter()
            .map(|e| (e.path.as_str(), e.dir, e.size, e.mtime_ns, e.gen.as_str()))
            .collect();
        assert_eq!(
            got,
            [("a", true, 0, -5, ""), ("b", false, 0, 0, "")],
            "the last entry of a path wins"
        );
        assert_eq!(c.gone, ["x"]);
        let c = Change::parse(
            br#"{"op":"tree","version":"1","since":-1,"entries":{"path":"a"},"gone":"a"}"#,
        )
        .unwrap();
        assert_eq!(
            (c.version, c.since, c.entries.len(), c.gone.len()),
            (0, None, 0, 0)
        );
        let v = json!({"version": 4, "entries": [{"path": "z"}, {"path": "y"}], "op": "tree"});
        let c = Change::from_value(&v);
        assert_eq!((c.op.as_str(), c.version), ("tree", 4));
        assert_eq!(
            c.entries
                .iter()
                .map(|e| e.path.as_str())
                .collect::<Vec<_>>(),
            ["y", "z"]
        );
        assert!(Change::parse(b"{\"op\":\"tree\",").is_err());
    }
}
