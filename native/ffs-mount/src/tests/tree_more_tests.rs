//! The tree's deltas against whole trees, orphans, readdir offsets, the inode map, and its
//! cost at a million names (tests/tree_tests.rs has the helpers and the first cases).
use super::tests::*;
use super::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

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
    for since in [json!(4), json!(6), Value::Null] {
        let msg = json!({"op": "delta", "version": 7, "since": since, "entries": [{"path": "g"}], "gone": ["f"]});
        assert!(t.apply_delta(&typed(&msg), &mut inos, &none()).is_err());
    }
    let msg = json!({"op": "delta", "version": 7, "since": "5", "entries": [], "gone": []});
    assert!(
        serde_json::from_value::<crate::wire::DeltaMsg>(msg).is_err(),
        "not a delta at all"
    );
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
    let (t2, inval) = Tree::from_msg(&t, &typed(&msg), &mut inos, &none());
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
        t = Tree::from_msg(&t, &typed(&msg), &mut inos, &none()).0;
        assert!(inos.len() <= base + 2, "{} at tree {i}", inos.len());
    }
}
