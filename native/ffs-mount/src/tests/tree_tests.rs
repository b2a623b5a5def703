use super::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Message `v` (a JSON value) as its type.
pub(super) fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    T::deserialize(v).expect("a valid message")
}

pub(super) fn none() -> HashSet<u64> {
    HashSet::new()
}

pub(super) fn tree(v: u64, entries: Value, inos: &mut InoMap) -> Tree {
    let msg = json!({"op": "tree", "version": v, "entries": entries});
    Tree::from_msg(&Tree::empty(), &typed(&msg), inos, &none()).0
}

pub(super) fn delta(
    t: &Tree,
    entries: Value,
    gone: Value,
    inos: &mut InoMap,
    open: &HashSet<u64>,
) -> (Tree, Vec<Inval>) {
    let msg = json!({"op": "delta", "version": t.version + 1, "since": t.version,
                     "entries": entries, "gone": gone});
    t.apply_delta(&typed(&msg), inos, open).unwrap()
}

pub(super) fn ino(t: &Tree, path: &str) -> Option<u64> {
    path.split('/').try_fold(ROOT_INO, |d, n| t.child(d, n))
}

/// path -> (dir, size, mtime, gen) of every node, checking the links.
pub(super) fn contents(t: &Tree) -> BTreeMap<String, (bool, u64, i64, String)> {
    let mut out = BTreeMap::new();
    for (&i, n) in t.nodes.iter() {
        assert!(
            !t.orphans.contains_key(&i),
            "{} both live and orphan",
            n.path
        );
        assert_eq!(
            t.children.contains_key(&i),
            n.dir,
            "{}: entries iff a directory",
            n.path
        );
        if i != ROOT_INO {
            assert_eq!(ino(t, &n.path), Some(i), "{} reachable by its path", n.path);
            assert_eq!(t.child(n.parent, n.name()), Some(i));
            out.insert(n.path.clone(), (n.dir, n.size, n.mtime_ns, n.gen.clone()));
        }
    }
    for (&d, dir) in t.children.iter() {
        for (name, &c) in dir.names.iter() {
            let n = t.nodes.get(&c).expect("an entry names a live node");
            assert_eq!((n.parent, n.name()), (d, name.as_ref()));
        }
    }
    out
}

pub(super) fn listing(
    t: &Tree,
    path: &str,
    entries: Value,
    inos: &mut InoMap,
) -> (Tree, Vec<Inval>) {
    let msg = json!({"op": "listing", "path": path, "entries": entries});
    t.apply_listing(&typed(&msg), inos)
}

#[test]
fn a_lazy_tree_holds_what_was_listed_and_what_deltas_made() {
    let mut inos = InoMap::new();
    let msg = json!({"op": "tree", "version": 1, "lazy": true, "entries": [{"path": "z"}]});
    let t = Tree::from_msg(&Tree::empty(), &typed(&msg), &mut inos, &none()).0;
    assert!(
        !t.listed(ROOT_INO) && contents(&t).is_empty(),
        "the root alone, not listed"
    );
    // Below a directory not listed, a delta's entries wait for its listing.
    let (t, _) = delta(
        &t,
        json!([{"path": "a/f", "size": 1}]),
        json!([]),
        &mut inos,
        &none(),
    );
    assert!(contents(&t).is_empty());

    let (t, _) = listing(
        &t,
        "",
        json!([{"path": "a", "dir": true, "mtime_ns": 5}, {"path": "b", "size": 2}, {"path": "a/deep"}]),
        &mut inos,
    );
    assert!(t.listed(ROOT_INO));
    let a = ino(&t, "a").unwrap();
    assert!(!t.listed(a), "a subdirectory waits for its own listing");
    assert_eq!(
        contents(&t).keys().collect::<Vec<_>>(),
        ["a", "b"],
        "a listing's children only"
    );
    // A delta: skipped below `a` (not listed); a directory it makes is listed.
    let (t, _) = delta(
        &t,
        json!([{"path": "a/g"}, {"path": "c/h", "size": 3}]),
        json!([]),
        &mut inos,
        &none(),
    );
    let c = ino(&t, "c").unwrap();
    assert!(t.listed(c) && ino(&t, "c/h").is_some() && ino(&t, "a/g").is_none());

    let (t, _) = listing(
        &t,
        "a",
        json!([{"path": "a/f", "size": 1}, {"path": "a/g"}]),
        &mut inos,
    );
    assert!(
        t.listed(a) && ino(&t, "a") == Some(a),
        "listed in place, its inode kept"
    );
    assert_eq!(
        contents(&t).keys().collect::<Vec<_>>(),
        ["a", "a/f", "a/g", "b", "c", "c/h"]
    );
    // Listed again without b and with c changed: b leaves (an orphan), c keeps its names.
    let b = ino(&t, "b").unwrap();
    let (t2, inval) = listing(
        &t,
        "",
        json!([{"path": "a", "dir": true, "mtime_ns": 5}, {"path": "c", "dir": true, "mtime_ns": 9}]),
        &mut inos,
    );
    assert!(ino(&t2, "b").is_none() && t2.orphans.contains_key(&b));
    assert!(inval.iter().any(|(_, n, i)| n == "b" && *i == b));
    assert!(inval.iter().any(|(_, n, _)| n == "c"), "c's time changed");
    assert!(ino(&t2, "c/h").is_some() && t2.listed(c));
    assert_eq!(t2.version, t.version, "a listing is no new version");
    // A partial listing adds to a directory, listed or not, and leaves it so.
    let (t3, _) = listing(&t2, "a", json!([{"path": "a/n"}]), &mut inos);
    let (t3, _) = {
        let msg =
            json!({"op": "listing", "path": "c", "partial": true, "entries": [{"path": "c/p"}]});
        t3.apply_listing(&typed(&msg), &mut inos)
    };
    assert!(t3.listed(c) && ino(&t3, "c/h").is_some() && ino(&t3, "c/p").is_some());
    let msg = json!({"op": "tree", "version": 1, "lazy": true});
    let lazy = Tree::from_msg(&t3, &typed(&msg), &mut inos, &none()).0;
    let msg = json!({"op": "listing", "path": "", "partial": true, "entries": [{"path": "q", "dir": true}]});
    let (lazy, _) = lazy.apply_listing(&typed(&msg), &mut inos);
    assert!(
        !lazy.listed(ROOT_INO)
            && ino(&lazy, "q").is_some()
            && !lazy.listed(ino(&lazy, "q").unwrap())
    );
    assert_eq!(contents(&lazy).len(), 1);
    // A name a directory not listed holds is changed by a delta like any.
    let (t4, _) = listing(&t3, "q", json!([]), &mut inos); // "q" is no directory in t3: nothing
    assert!(contents(&t4) == contents(&t3));
    let q = ino(&lazy, "q").unwrap();
    let msg = json!({"op": "listing", "path": "q", "partial": true, "entries": [{"path": "q/k", "gen": "g1"}]});
    let (lazy, _) = lazy.apply_listing(&typed(&msg), &mut inos);
    let k1 = ino(&lazy, "q/k").unwrap();
    let (lazy, inval) = delta(
        &lazy,
        json!([{"path": "q/k", "gen": "g2", "size": 7}, {"path": "q/new"}]),
        json!([]),
        &mut inos,
        &none(),
    );
    let k2 = ino(&lazy, "q/k").unwrap();
    assert!(k2 != k1 && inval.iter().any(|&(p, _, i)| p == q && i == k1));
    assert!(ino(&lazy, "q/new").is_none() && !lazy.listed(q));
    // A listing of what is no directory here changes nothing.
    for p in ["nope", "a/f"] {
        let (t3, inval) = listing(&t2, p, json!([{"path": format!("{p}/x")}]), &mut inos);
        assert!(inval.is_empty() && contents(&t3) == contents(&t2));
    }
}

#[test]
fn eviction_drops_the_least_recently_used_directories_names_but_the_held() {
    let mut inos = InoMap::new();
    let lazy = json!({"op": "tree", "version": 1, "lazy": true, "entries": []});
    let mut t = Tree::from_msg(&Tree::empty(), &typed(&lazy), &mut inos, &none()).0;
    let dirs = json!(["a", "b", "c"].map(|d| json!({"path": d, "dir": true})));
    t = listing(&t, "", dirs, &mut inos).0;
    for d in ["a", "b", "c"] {
        let files: Vec<Value> = (0..10)
            .map(|i| json!({"path": format!("{d}/f{i}"), "size": i}))
            .collect();
        t = listing(&t, d, json!(files), &mut inos).0;
    }
    assert_eq!(t.len(), 34);
    assert!(
        t.evict(34, |_| false, &mut inos).is_none(),
        "within the bound"
    );
    for d in ["b", "a", "c", ""] {
        t.touch(if d.is_empty() {
            ROOT_INO
        } else {
            ino(&t, d).unwrap()
        });
    }
    let held = ino(&t, "a/f3").unwrap();
    let before = contents(&t);
    let (small, inval) = t.evict(20, |i| i == held, &mut inos).unwrap();
    let after = contents(&small);
    assert_eq!(
        small.len(),
        34 - 19,
        "b's 10 then 9 of a's, down to 18 or fewer"
    );
    assert!(!small.listed(ino(&small, "b").unwrap()) && !small.listed(ino(&small, "a").unwrap()));
    assert!(small.listed(ino(&small, "c").unwrap()) && small.listed(ROOT_INO));
    assert_eq!(
        ino(&small, "a/f3"),
        Some(held),
        "held by the kernel: kept, same inode"
    );
    assert_eq!(
        inval,
        vec![(ino(&small, "a").unwrap(), "f3".to_string(), 0)]
    );
    for (path, v) in &after {
        assert_eq!(before.get(path), Some(v), "{path}: kept as it was");
    }
    assert!(after.keys().all(|p| !p.starts_with("b/")));
    assert_eq!(inos.len(), small.len(), "what went is forgotten");
    // listed again: all there, listed, new inodes for what went
    let old_b0 = ino(&t, "b/f0").unwrap();
    let files: Vec<Value> = (0..10)
        .map(|i| json!({"path": format!("b/f{i}"), "size": i}))
        .collect();
    let back = listing(&small, "b", json!(files), &mut inos).0;
    assert!(back.listed(ino(&back, "b").unwrap()));
    assert_eq!(back.len(), 25);
    assert_ne!(ino(&back, "b/f0"), Some(old_b0));
}

#[test]
fn an_exact_directory_keeps_only_the_deltas_entries_and_its_inode() {
    let mut inos = InoMap::new();
    let t = tree(
        1,
        json!([{"path": "ds/chunks/c0", "gen": "1"}, {"path": "ds/chunks/c1", "gen": "1"},
               {"path": "ds/all", "gen": "1"}, {"path": "other"}]),
        &mut inos,
    );
    let (ds, chunks) = (ino(&t, "ds").unwrap(), ino(&t, "ds/chunks").unwrap());
    let msg = json!({"op": "delta", "version": 2, "since": 1, "exact": ["ds"], "gone": [],
                     "entries": [{"path": "ds", "dir": true}, {"path": "ds/chunks", "dir": true},
                                 {"path": "ds/chunks/c0", "gen": "2"}, {"path": "ds/all", "gen": "2"}]});
    let (t2, _) = t.apply_delta(&typed(&msg), &mut inos, &none()).unwrap();
    assert_eq!(
        contents(&t2).keys().collect::<Vec<_>>(),
        ["ds", "ds/all", "ds/chunks", "ds/chunks/c0", "other"]
    );
    assert_eq!(
        (ino(&t2, "ds"), ino(&t2, "ds/chunks")),
        (Some(ds), Some(chunks))
    );
    assert_ne!(
        ino(&t2, "ds/chunks/c0"),
        ino(&t, "ds/chunks/c0"),
        "a new gen"
    );
}

#[test]
fn delta_adds_a_file_under_new_directories() {
    let mut inos = InoMap::new();
    let t = tree(1, json!([{"path": "a/x", "size": 1}]), &mut inos);
    let ax = ino(&t, "a/x").unwrap();
    let e = json!([{"path": "/b/c/f/", "size": 5, "mtime_ns": 7, "gen": "g"}]);
    let (t2, inval) = delta(&t, e, json!([]), &mut inos, &none());
    assert_eq!(t2.version, 2);
    assert!(
        inval.is_empty(),
        "new names: nothing for the kernel to forget"
    );
    let (b, c, f) = (
        ino(&t2, "b").unwrap(),
        ino(&t2, "b/c").unwrap(),
        ino(&t2, "b/c/f").unwrap(),
    );
    assert!(t2.nodes.get(&b).unwrap().dir && t2.nodes.get(&c).unwrap().dir);
    assert_eq!(
        t2.nodes.get(&c).unwrap().mtime_ns,
        7,
        "implicit parents take the entry's time"
    );
    let a = t2.attr(f).unwrap();
    assert_eq!((a.size, a.kind), (5, FileType::RegularFile));
    assert_eq!(ino(&t2, "a/x"), Some(ax), "the rest kept");
    assert!(ino(&t, "b").is_none(), "the old snapshot is untouched");
    let names: Vec<&str> = t2.dir_entries(ROOT_INO, 0).unwrap().map(|e| e.2).collect();
    assert_eq!(names, [".", "..", "a", "b"]);
    // Below a file: dropped, as in a whole tree.
    let (t3, _) = delta(
        &t2,
        json!([{"path": "b/c/f/g"}]),
        json!([]),
        &mut inos,
        &none(),
    );
    assert!(ino(&t3, "b/c/f/g").is_none());
    contents(&t3);
}

#[test]
fn a_new_gen_is_a_new_inode() {
    let mut inos = InoMap::new();
    let t = tree(
        1,
        json!([{"path": "d/f", "size": 1, "gen": "g1"}]),
        &mut inos,
    );
    let (d, old) = (ino(&t, "d").unwrap(), ino(&t, "d/f").unwrap());
    let (t2, inval) = delta(
        &t,
        json!([{"path": "d/f", "size": 1, "gen": "g2"}]),
        json!([]),
        &mut inos,
        &none(),
    );
    let new = ino(&t2, "d/f").unwrap();
    assert!(new > old);
    assert_eq!(inval, [(d, "f".to_string(), old)]);
    assert!(
        t2.orphans.contains_key(&old),
        "the replaced file stays an orphan for a change"
    );
    // Same gen, new size: same inode, invalidated.
    let (t3, inval) = delta(
        &t2,
        json!([{"path": "d/f", "size": 9, "gen": "g2"}]),
        json!([]),
        &mut inos,
        &none(),
    );
    assert_eq!(ino(&t3, "d/f"), Some(new));
    assert_eq!(t3.attr(new).unwrap().size, 9);
    assert_eq!(inval, [(d, "f".to_string(), new)]);
    // Same attributes: nothing to invalidate.
    let (t4, inval) = delta(
        &t3,
        json!([{"path": "d/f", "size": 9, "gen": "g2"}]),
        json!([]),
        &mut inos,
        &none(),
    );
    assert!(inval.is_empty());
    assert!(t4.attr(old).is_none(), "the old inode is gone (closed)");
    contents(&t4);
}
