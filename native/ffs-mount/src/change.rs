//! The lists of "tree", "delta" and "listing" messages (their types:
//! wire.rs), visited by hand one element at a time, each entry read
//! straight into an `Entry`: a million entries as a serde_json `Value` take
//! ~10x the memory of their JSON, as `Entry`s under 2x. An element of the
//! wrong type makes the message invalid (wire.rs); a path with an empty,
//! "." or ".." component is skipped, outer slashes are stripped.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, SeqAccess, Visitor};

use crate::wire::Entry;

/// P with outer slashes stripped, or None if it has an empty, "." or ".." component.
pub fn clean(p: &str) -> Option<&str> {
    let p = p.trim_matches('/');
    let bad = p.is_empty() || p.split('/').any(|c| c.is_empty() || c == "." || c == "..");
    (!bad).then_some(p)
}

/// A listing's directory: "" the root, None if not a valid path.
pub fn dir_path(p: &str) -> Option<&str> {
    match p.trim_matches('/') {
        "" => Some(""),
        _ => clean(p),
    }
}

/// `s` cleaned in place; false if it is no valid path.
fn clean_in_place(s: &mut String) -> bool {
    match clean(s) {
        None => false,
        Some(p) if p.len() != s.len() => {
            *s = p.to_string();
            true
        }
        Some(_) => true,
    }
}

/// A message's "entries": the valid ones, the last of each path, sorted by
/// path (parents before their children); a directory's size is 0.
pub fn entries<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Entry>, D::Error> {
    let mut v = d.deserialize_seq(Elements(
        |mut e: Entry| {
            e.size = if e.dir { 0 } else { e.size };
            clean_in_place(&mut e.path).then_some(e)
        },
        PhantomData,
    ))?;
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
    Ok(v)
}

/// A message's list of paths ("gone", "exact"): the valid ones.
pub fn paths<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    d.deserialize_seq(Elements(
        |mut p: String| clean_in_place(&mut p).then_some(p),
        PhantomData,
    ))
}

/// A JSON array read element by element as `T`, each kept if `F` keeps it.
struct Elements<T, F>(F, PhantomData<T>);

impl<'de, T: serde::Deserialize<'de>, F: Fn(T) -> Option<T>> Visitor<'de> for Elements<T, F> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::with_capacity(s.size_hint().unwrap_or(0));
        while let Some(v) = s.next_element::<T>()? {
            out.extend((self.0)(v));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{DeltaMsg, ListingMsg, TreeMsg};
    use serde::Deserialize;
    use serde_json::json;

    fn delta(line: &[u8]) -> serde_json::Result<DeltaMsg> {
        serde_json::from_slice(line)
    }

    #[test]
    fn parses_entries_and_paths_skipping_bad_paths() {
        let line = br#"{"op":"delta","version":3,"since":2,"x":[1,{"a":2}],"entries":[
            {"path":"/b/","size":2,"gen":"g"},{"path":"a/./c"},{"path":"","dir":true},{"path":"a","dir":true,"size":9,"mtime_ns":-5},
            {"path":"b","extra":{"y":[]}}],"gone":["x/","../y","",".."],"exact":["/e"]}"#;
        let c = delta(line).unwrap();
        assert_eq!((c.version, c.since), (3, Some(2)));
        let got: Vec<_> = c
            .entries
            .iter()
            .map(|e| (e.path.as_str(), e.dir, e.size, e.mtime_ns, e.gen.as_str()))
            .collect();
        assert_eq!(
            got,
            [("a", true, 0, -5, ""), ("b", false, 0, 0, "")],
            "the last entry of a path wins; unknown fields ignored; defaults"
        );
        assert_eq!(
            (c.gone, c.exact),
            (vec!["x".to_string()], vec!["e".to_string()])
        );
        let c = delta(br#"{"op":"delta","since":1}"#).unwrap();
        assert_eq!((c.version, c.entries.len(), c.gone.len()), (0, 0, 0));
        let v = json!({"version": 4, "entries": [{"path": "z"}, {"path": "y"}], "op": "tree"});
        let t = TreeMsg::deserialize(&v).unwrap();
        assert_eq!((t.version, t.lazy), (4, false));
        let paths: Vec<_> = t.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["y", "z"]);
        let l: ListingMsg = serde_json::from_slice(br#"{"op":"listing","path":"/"}"#).unwrap();
        assert_eq!((dir_path(&l.path), l.partial), (Some(""), false));
        assert_eq!((dir_path("a/b/"), dir_path("a/../b")), (Some("a/b"), None));
    }

    #[test]
    fn a_field_of_the_wrong_type_makes_the_message_invalid() {
        for bad in [
            &br#"{"op":"delta","version":"1","since":1}"#[..],
            br#"{"op":"delta","since":-1}"#,
            br#"{"op":"delta","entries":{"path":"a"}}"#,
            br#"{"op":"delta","entries":[{"path":"a","size":"big"}]}"#,
            br#"{"op":"delta","entries":[{"path":"a","dir":"no"}]}"#,
            br#"{"op":"delta","entries":[{"path":"a","gen":7}]}"#,
            br#"{"op":"delta","entries":[{"nopath":1}]}"#,
            br#"{"op":"delta","entries":[7]}"#,
            br#"{"op":"delta","gone":"a"}"#,
            br#"{"op":"delta","gone":[5]}"#,
            br#"{"op":"delta","#,
        ] {
            assert!(delta(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(serde_json::from_slice::<ListingMsg>(br#"{"op":"listing","entries":[]}"#).is_err());
    }
}
