use super::*;
use crate::change::Change;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

fn none() -> HashSet<u64> {
    HashSet::new()
}

fn tree(v: u64, entries: Value, inos: &mut InoMap) -> Tree {
    let msg = json!({"op": "tree", "version": v, "entries": entries});
    Tree::from_msg(&Tree::empty(), &Change::from_value(&msg), inos, &none()).0
}

fn delta(
    t: &Tree,
    entries: Value,
    gone: Value,
    inos: &mut InoMap,
    open: &HashSet<u64>,
) -> (Tree, Vec<Inval>) {
    let msg = json!({"op": "delta", "version": t.version + 1, "since": t.version,
                     "entries": entries, "gone": gone});
    t.apply_delta(&Change::from_value(&msg), inos, open)
        .unwrap()
}

fn ino(t: &Tree, path: &str) -> Option<u64> {
    path.split('/').try_fold(ROOT_INO, |d, n| t.child(d, n))
}

/// path -> (dir, size, mtime, gen) of every node, checking the links.
fn contents(t: &Tree) -> BTreeMap<String, (bool, u64, i64, String)> {
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

fn listing(t: &Tree, path: &str, entries: Value, inos: &mut InoMap) -> (Tree, Vec<Inval>) {
    let msg = json!({"op": "listing", "path": path, "entries": entries});
    t.apply_listing(&Change::from_value(&msg), inos)
}

#[test]
fn a_lazy_tree_holds_what_was_listed_and_what_deltas_made() {
    let mut inos = InoMap::new();
    let msg = json!({"op": "tree", "version": 1, "lazy": true, "entries": [{"path": "z"}]});
    let t = Tree::from_msg(
        &Tree::empty(),
        &Change::from_value(&msg),
        &mut inos,
        &none(),
    )
    .0;
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
        t3.apply_listing(&Change::from_value(&msg), &mut inos)
    };
    assert!(t3.listed(c) && ino(&t3, "c/h").is_some() && ino(&t3, "c/p").is_some());
    let msg = json!({"op": "tree", "version": 1, "lazy": true});
    let lazy = Tree::from_msg(&t3, &Change::from_value(&msg), &mut inos, &none()).0;
    let msg = json!({"op": "listing", "path": "", "partial": true, "entries": [{"path": "q", "dir": true}]});
    let (lazy, _) = lazy.apply_listing(&Change::from_value(&msg), &mut inos);
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
    let (lazy, _) = lazy.apply_listing(&Change::from_value(&msg), &mut inos);
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
    let mut t = Tree::from_msg(
        &Tree::empty(),
        &Change::from_value(&lazy),
        &mut inos,
        &none(),
    )
    .0;
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
    let (t2, _) = t
        .apply_delta(&Change::from_value(&msg), &mut inos, &none())
        .unwrap();
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

#[test]
fn removal_keeps_open_files_as_orphans_and_forgets_closed_ones() {
    let mut inos = InoMap::new();
    let e = json!([{"path": "d/open", "size": 1, "gen": "g"}, {"path": "d/closed", "size": 2}, {"path": "e"}]);
    let t = tree(1, e, &mut inos);
    let (open_i, closed_i) = (ino(&t, "d/open").unwrap(), ino(&t, "d/closed").unwrap());
    let open = HashSet::from([open_i]);
    let before = inos.len();
    let (t2, inval) = delta(
        &t,
        json!([]),
        json!(["d/open", "d/closed"]),
        &mut inos,
        &open,
    );
    let d = ino(&t2, "d").unwrap();
    assert!(ino(&t2, "d/open").is_none() && ino(&t2, "d/closed").is_none());
    assert_eq!(inval.len(), 2);
    assert!(inval.contains(&(d, "closed".to_string(), closed_i)));
    // As with a whole tree: both kept through the change that removed them.
    assert!(t2.attr(open_i).is_some() && t2.attr(closed_i).is_some());
    // The next change drops the closed one and forgets its inode.
    let (t3, _) = delta(&t2, json!([]), json!([]), &mut inos, &open);
    assert_eq!(t3.attr(open_i).unwrap().size, 1, "open: an orphan still");
    assert!(t3.attr(closed_i).is_none(), "closed: gone");
    assert_eq!(inos.len(), before - 1);
    // Closed at last: dropped and forgotten too.
    let (t4, _) = delta(&t3, json!([]), json!([]), &mut inos, &none());
    assert!(t4.orphans.is_empty());
    assert_eq!(inos.len(), before - 2);
    // The paths come back as new inodes.
    let back = json!([{"path": "d/open", "size": 1, "gen": "g"}, {"path": "d/closed", "size": 2}]);
    let (t5, _) = delta(&t4, back, json!([]), &mut inos, &none());
    assert!(ino(&t5, "d/open").unwrap() > closed_i.max(open_i));
    assert!(ino(&t5, "d/closed").unwrap() > closed_i.max(open_i));
    // Removing a directory takes what is below it.
    let (t6, inval) = delta(&t5, json!([]), json!(["d"]), &mut inos, &none());
    assert_eq!(contents(&t6).keys().collect::<Vec<_>>(), ["e"]);
    assert_eq!(inval.len(), 3);
    assert_eq!(t6.orphans.len(), 2, "its files, kept for the change");
}

#[test]
fn a_path_back_while_still_an_orphan_keeps_its_inode() {
    let mut inos = InoMap::new();
    let t = tree(1, json!([{"path": "f", "size": 1}]), &mut inos);
    let f = ino(&t, "f").unwrap();
    let (t2, _) = delta(&t, json!([]), json!(["f"]), &mut inos, &none());
    let (t3, _) = delta(
        &t2,
        json!([{"path": "f", "size": 1}]),
        json!([]),
        &mut inos,
        &none(),
    );
    assert_eq!(ino(&t3, "f"), Some(f));
    assert!(t3.orphans.is_empty());
    // Gone and back in one delta: the same.
    let (t4, _) = delta(
        &t3,
        json!([{"path": "f", "size": 2}]),
        json!(["f"]),
        &mut inos,
        &none(),
    );
    assert_eq!(ino(&t4, "f"), Some(f));
    assert!(t4.orphans.is_empty());
}

#[test]
fn a_delta_with_the_wrong_since_is_refused() {
    let mut inos = InoMap::new();
    let t = tree(5, json!([{"path": "f"}]), &mut inos);
    let n = inos.len();
    for since in [json!(4), json!(6), json!("5"), Value::Null] {
        let msg = json!({"op": "delta", "version": 7, "since": since, "entries": [{"path": "g"}], "gone": ["f"]});
        assert!(t
            .apply_delta(&Change::from_value(&msg), &mut inos, &none())
            .is_err());
    }
    assert_eq!(inos.len(), n);
    assert!(ino(&t, "f").is_some() && ino(&t, "g").is_none());
}

#[test]
fn kind_changes_and_directory_gens() {
    let mut inos = InoMap::new();
    let t = tree(
        1,
        json!([{"path": "x/y/z", "size": 1}, {"path": "x/w"}]),
        &mut inos,
    );
    let x = ino(&t, "x").unwrap();
    // A directory becomes a file: what was below it goes, listed or not.
    let (t2, inval) = delta(
        &t,
        json!([{"path": "x", "size": 3}]),
        json!([]),
        &mut inos,
        &none(),
    );
    assert_eq!(ino(&t2, "x"), Some(x));
    assert_eq!(contents(&t2).len(), 1);
    assert_eq!(inval.len(), 4); // x changed; y, z, w gone
                                // And back into a directory.
    let (t3, _) = delta(
        &t2,
        json!([{"path": "x", "dir": true}, {"path": "x/q"}]),
        json!([]),
        &mut inos,
        &none(),
    );
    assert!(t3.nodes.get(&x).unwrap().dir && ino(&t3, "x/q").is_some());
    // A directory with a new gen keeps its entries under the new inode.
    let (t4, _) = delta(
        &t3,
        json!([{"path": "x", "dir": true, "gen": "n"}]),
        json!([]),
        &mut inos,
        &none(),
    );
    let x2 = ino(&t4, "x").unwrap();
    assert_ne!(x2, x);
    assert_eq!(t4.nodes.get(&ino(&t4, "x/q").unwrap()).unwrap().parent, x2);
    contents(&t4);
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn deltas_rebuild_what_a_whole_tree_gives() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut want: BTreeMap<String, (bool, u64, i64, String)> = BTreeMap::new();
    let mut inos = InoMap::new();
    let mut t = tree(1, json!([]), &mut inos);
    for _ in 0..300 {
        let mut entries = Vec::new();
        let mut gone = Vec::new();
        let mut touched: Vec<String> = Vec::new();
        for _ in 0..rng.below(20) {
            let p = format!("d{}/e{}/f{}", rng.below(3), rng.below(4), rng.below(6));
            let p = p
                .rsplitn(rng.below(3) as usize + 1, '/')
                .last()
                .unwrap()
                .to_string();
            // One change per path and its line in a delta: a delta holds no order.
            let related = |q: &String| {
                q == &p || q.starts_with(&format!("{p}/")) || p.starts_with(&format!("{q}/"))
            };
            if touched.iter().any(related) {
                continue;
            }
            touched.push(p.clone());
            if rng.below(3) == 0 {
                // Removed with whatever is below it, as the agent lists it.
                let below: Vec<String> = want
                    .keys()
                    .filter(|k| k.starts_with(&format!("{p}/")))
                    .cloned()
                    .collect();
                if want.remove(&p).is_some() {
                    gone.push(p);
                }
                for k in below {
                    want.remove(&k);
                    gone.push(k);
                }
            } else if !want.keys().any(|k| k.starts_with(&format!("{p}/"))) {
                let (size, gen) = (rng.below(3), format!("g{}", rng.below(2)));
                entries.push(json!({"path": p, "size": size, "mtime_ns": 5, "gen": gen}));
                // Its ancestors: directories, implicitly (a file there goes first).
                let mut anc = String::new();
                for c in p.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
                    anc = if anc.is_empty() {
                        c.to_string()
                    } else {
                        format!("{anc}/{c}")
                    };
                    if want.get(&anc).is_some_and(|a| !a.0) {
                        want.remove(&anc);
                        gone.push(anc.clone());
                    }
                    want.entry(anc.clone())
                        .or_insert((true, 0, 5, String::new()));
                }
                want.insert(p, (false, size, 5, gen));
            }
        }
        // A path may be both gone and re-added: gone goes first.
        let open: HashSet<u64> = t
            .orphans
            .keys()
            .filter(|_| rng.below(2) == 0)
            .copied()
            .collect();
        t = delta(&t, json!(entries), json!(gone), &mut inos, &open).0;
        assert_eq!(contents(&t), want);
        assert_eq!(
            inos.len(),
            t.nodes.size() + t.orphans.len(),
            "an inode per live node or orphan"
        );
    }
    // The same namespace sent whole keeps every inode.
    let whole: Vec<Value> = want
        .iter()
        .map(|(p, (dir, size, m, gen))| json!({"path": p, "dir": dir, "size": size, "mtime_ns": m, "gen": gen}))
        .collect();
    let msg = json!({"op": "tree", "version": 99, "entries": whole});
    let (t2, inval) = Tree::from_msg(&t, &Change::from_value(&msg), &mut inos, &none());
    assert_eq!(contents(&t2), want);
    assert!(inval.is_empty());
    for p in want.keys() {
        assert_eq!(ino(&t2, p), ino(&t, p));
    }
}

#[test]
fn readdir_offsets_give_the_listing_skipping_would() {
    let mut inos = InoMap::new();
    let mut rng = Rng(7);
    let entries: Vec<Value> = (0..500)
        .map(|i| json!({"path": format!("big/n{}", rng.next() % 100_000), "dir": i % 7 == 0}))
        .collect();
    let t = tree(1, json!(entries), &mut inos);
    let big = ino(&t, "big").unwrap();
    let before: Vec<String> = t
        .dir_entries(big, 0)
        .unwrap()
        .map(|e| e.2.to_string())
        .collect();
    // The directory changed: a new listing, from the names of the new tree.
    let gone = json!([format!("big/{}", before[5])]);
    let (t, _) = delta(&t, json!([{"path": "big/zz"}]), gone, &mut inos, &none());
    assert_eq!(t.dir_entries(big, 0).unwrap().count(), before.len());
    assert!(t.child(big, &before[5]).is_none() && t.child(big, "zz").is_some());
    // Skipping k entries of the whole listing, as readdir did.
    let dir = t.children.get(&big).unwrap();
    let dots = [(big, "."), (ROOT_INO, "..")];
    let mut all: Vec<_> = dots
        .iter()
        .map(|&(i, n)| (i, FileType::Directory, n.to_string()))
        .collect();
    for (name, &i) in dir.names.iter() {
        let kind = if t.nodes.get(&i).unwrap().dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        };
        all.push((i, kind, name.to_string()));
    }
    for k in 0..all.len() as u64 + 3 {
        let got: Vec<_> = t.dir_entries(big, k).unwrap().collect();
        let want: Vec<_> = all.iter().enumerate().skip(k as usize).collect();
        assert_eq!(got.len(), want.len());
        for ((i, kind, name, next), (j, w)) in got.into_iter().zip(want) {
            assert_eq!(
                (i, kind, name, next),
                (w.0, w.1, w.2.as_str(), j as u64 + 1)
            );
        }
    }
    assert!(t.dir_entries(big, u64::MAX).unwrap().next().is_none());
    assert!(
        t.dir_entries(ino(&t, "big/zz").unwrap(), 0).is_none(),
        "not a directory"
    );
}

#[test]
fn inode_map_follows_the_tree() {
    let mut inos = InoMap::new();
    let mut t = tree(1, json!([{"path": "keep/a"}]), &mut inos);
    let base = inos.len();
    let mut last = 0;
    for i in 0..2000 {
        let e = json!([{"path": format!("d{}/f", i % 10), "gen": format!("g{i}")}]);
        t = delta(&t, e, json!([]), &mut inos, &none()).0;
        let f = ino(&t, &format!("d{}/f", i % 10)).unwrap();
        assert!(f > last, "inode numbers only grow");
        last = f;
        t = delta(
            &t,
            json!([]),
            json!([format!("d{}", i % 10), format!("d{}/f", i % 10)]),
            &mut inos,
            &none(),
        )
        .0;
        assert!(inos.len() <= base + 3, "{} at cycle {i}", inos.len());
    }
    // A whole tree forgets what it no longer has, too.
    for i in 0..100 {
        let e = json!([{"path": format!("w{i}")}, {"path": "keep/a"}]);
        let msg = json!({"op": "tree", "version": 10_000 + i, "entries": e});
        t = Tree::from_msg(&t, &Change::from_value(&msg), &mut inos, &none()).0;
        assert!(inos.len() <= base + 2, "{} at tree {i}", inos.len());
    }
}

/// This thread's CPU time: the machine may be busy with other work.
fn cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Resident memory, after handing freed memory back to the kernel.
fn rss_mib() -> u64 {
    unsafe { libc::malloc_trim(0) };
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = s.lines().find_map(|l| {
        l.strip_prefix("VmRSS:")?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    });
    kb.unwrap_or(0) / 1024
}

/// cargo test --release -- --ignored --nocapture bench_1m
#[test]
#[ignore]
fn bench_1m_tree_then_1k_delta() {
    use std::fmt::Write;
    let (dirs, per) = (1000, 1000);
    let mut line = String::from(r#"{"op":"tree","version":1,"entries":["#);
    for d in 0..dirs {
        write!(
            line,
            r#"{{"path":"data/d{d:04}","dir":true,"size":0,"mtime_ns":1,"gen":""}},"#
        )
        .unwrap();
        for f in 0..per {
            write!(line, r#"{{"path":"data/d{d:04}/part-{f:05}.parquet","dir":false,"size":1048576,"mtime_ns":1,"gen":"{d}.{f}"}},"#).unwrap();
        }
    }
    line.pop();
    line.push_str("]}");
    let rss0 = rss_mib();
    let c0 = cpu();
    let msg = Change::parse(line.as_bytes()).unwrap();
    let parse = cpu() - c0;
    let c0 = cpu();
    let value: Value = serde_json::from_slice(line.as_bytes()).unwrap();
    let parse_value = cpu() - c0;
    let rss_value = rss_mib();
    drop(value);
    let rss_parsed = rss_mib();
    let mut inos = InoMap::new();
    let (t0, c0) = (Instant::now(), cpu());
    let (t, _) = Tree::from_msg(&Tree::empty(), &msg, &mut inos, &none());
    let (build, build_cpu) = (t0.elapsed(), cpu() - c0);
    drop(msg);
    let rss_tree = rss_mib();
    println!("tree: {} nodes from {:.1} MB of JSON: parse {parse:?} (+{} MiB; as a Value {parse_value:?}, +{} MiB), build {build:?} (CPU {build_cpu:?}, +{} MiB)",
             t.nodes.size(), line.len() as f64 / 1e6, rss_parsed - rss0, rss_value.saturating_sub(rss0), rss_tree.saturating_sub(rss0));
    drop(line);

    // 1,000 changes: 400 new files (half in a new directory), 300 replaced (new gen), 300 gone.
    let (mut e, mut gone) = (Vec::new(), Vec::new());
    for k in 0..400 {
        let d = if k < 200 {
            "data/new".to_string()
        } else {
            format!("data/d{:04}", k * 7 % dirs)
        };
        e.push(json!({"path": format!("{d}/added-{k}"), "size": 5, "mtime_ns": 2, "gen": format!("a{k}")}));
    }
    for k in 0..300 {
        let (d, f) = (k * 13 % dirs, k * 31 % per);
        e.push(json!({"path": format!("data/d{d:04}/part-{f:05}.parquet"), "size": 7, "mtime_ns": 2, "gen": format!("n{k}")}));
    }
    for k in 0..300 {
        let (d, f) = ((k * 17 + 1) % dirs, (k * 37 + 500) % per);
        gone.push(format!("data/d{d:04}/part-{f:05}.parquet"));
    }
    let dline = serde_json::to_vec(
        &json!({"op": "delta", "version": 2, "since": 1, "entries": e, "gone": gone}),
    )
    .unwrap();
    let c0 = cpu();
    let dmsg = Change::parse(&dline).unwrap();
    let dparse = cpu() - c0;
    let t = Arc::new(t);
    let (mut apply, mut apply_cpu, mut publish) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    let runs = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(7);
    for _ in 0..runs {
        let (t0, c0) = (Instant::now(), cpu());
        let (t2, inval) = t.apply_delta(&dmsg, &mut inos, &none()).unwrap();
        (apply, apply_cpu) = (
            [apply, vec![t0.elapsed()]].concat(),
            [apply_cpu, vec![cpu() - c0]].concat(),
        );
        let c0 = cpu();
        drop(last.replace((Arc::new(t2), inval.len()))); // as a publish drops the snapshot before
        publish.push(cpu() - c0);
    }
    let (t2, ninval) = last.unwrap();
    println!("delta of {} entries + {} gone ({} bytes): parse {dparse:?}; apply {apply:?} (CPU {apply_cpu:?}); dropping the previous result (CPU) {:?}; {ninval} invalidations; {} -> {} nodes",
             e.len(), gone.len(), dline.len(), &publish[1..], t.nodes.size(), t2.nodes.size());
    println!("both snapshots: +{} MiB", rss_mib().saturating_sub(rss0));
    let t0 = Instant::now();
    let t3 = Arc::new(t.as_ref().clone());
    println!("snapshot clone: {:?}", t0.elapsed());
    drop(t3);
    let msg3 = json!({"op": "delta", "version": 3, "since": 2, "entries": [], "gone": []});
    let c0 = cpu();
    let _ = t2
        .apply_delta(&Change::from_value(&msg3), &mut inos, &none())
        .unwrap();
    println!(
        "an empty delta after it (drops its {} orphans): CPU {:?}",
        t2.orphans.len(),
        cpu() - c0
    );

    // readdir of a 100,000-entry directory in batches of 100.
    let big: Vec<Value> = (0..100_000)
        .map(|i| json!({"path": format!("big/f{i:06}")}))
        .collect();
    let big = Change::from_value(&json!({"op": "tree", "version": 9, "entries": big}));
    let (tb, _) = Tree::from_msg(&t, &big, &mut inos, &none());
    let b = tb.child(ROOT_INO, "big").unwrap();
    let c0 = cpu();
    let (mut off, mut n) = (0, 0);
    loop {
        let batch: Vec<_> = tb.dir_entries(b, off).unwrap().take(100).collect();
        let Some(l) = batch.last() else { break };
        (off, n) = (l.3, n + batch.len());
    }
    println!(
        "readdir of a 100,000-entry directory in batches of 100: {n} entries, CPU {:?}",
        cpu() - c0
    );
}
