use super::*;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use crate::agent_link::AgentLink;
use crate::lookup::Misses;
use crate::tree::ROOT_INO;

/// The daemon's reader and applier threads (no mount) on one end of a
/// socketpair; the test is the agent on the other, answering a "refresh"
/// after sending what `on_refresh` holds.
struct Daemon {
    s: Arc<Shared>,
    w: Mutex<UnixStream>,
    refreshes: Arc<AtomicU64>,
    on_refresh: Arc<Mutex<Vec<Value>>>,
    replies: Mutex<mpsc::Receiver<Value>>,
}

impl Daemon {
    fn start() -> Daemon {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let s = Arc::new(Shared::new(
            AgentLink::new(ours.try_clone().unwrap(), Duration::from_secs(10)),
            Duration::from_secs(1),
        ));
        let (ev, _) = mpsc::channel();
        let (inval, _) = mpsc::channel();
        let (apply_tx, apply_rx) = mpsc::channel();
        let (s1, s2, ev2) = (s.clone(), s.clone(), ev.clone());
        std::thread::spawn(move || applier(apply_rx, s1, ev, inval));
        std::thread::spawn(move || reader(ours, s2, ev2, apply_tx));
        let (refreshes, on_refresh) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let (tx, replies) = mpsc::channel();
        let (r, o, mut w) = (
            refreshes.clone(),
            on_refresh.clone(),
            theirs.try_clone().unwrap(),
        );
        let rd = theirs.try_clone().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(rd).lines() {
                let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
                match v.get("op").and_then(Value::as_str) {
                    Some("refresh") => {
                        r.fetch_add(1, Relaxed);
                        for m in o.lock().unwrap().drain(..) {
                            writeln!(w, "{m}").unwrap();
                        }
                        writeln!(w, "{}", json!({"id": v["id"]})).unwrap();
                    }
                    Some("lookup") => {
                        // every name but "x*" exists, as a file
                        let p = v["path"].as_str().unwrap();
                        let (dir, name) = p.rsplit_once('/').unwrap_or(("", p));
                        if !name.starts_with('x') {
                            let l = json!({"op": "listing", "path": dir, "partial": true,
                                           "entries": [{"path": p, "size": 2}]});
                            writeln!(w, "{l}").unwrap();
                        }
                        writeln!(w, "{}", json!({"id": v["id"]})).unwrap();
                    }
                    Some("list") => {
                        // every directory holds "f" and "d/" (for the test below)
                        let p = v["path"].as_str().unwrap();
                        let at = |n: &str| {
                            if p.is_empty() {
                                n.to_string()
                            } else {
                                format!("{p}/{n}")
                            }
                        };
                        let l = json!({"op": "listing", "path": p,
                                       "entries": [{"path": at("f"), "size": 1}, {"path": at("d"), "dir": true}]});
                        writeln!(w, "{l}").unwrap();
                        writeln!(w, "{}", json!({"id": v["id"]})).unwrap();
                    }
                    None => tx.send(v).unwrap(),
                    Some(op) => panic!("unexpected request {op}"),
                }
            }
        });
        Daemon {
            s,
            w: Mutex::new(theirs),
            refreshes,
            on_refresh,
            replies: Mutex::new(replies),
        }
    }

    fn send_line(&self, l: &str) {
        writeln!(self.w.lock().unwrap(), "{l}").unwrap();
    }

    fn send(&self, m: Value) {
        writeln!(self.w.lock().unwrap(), "{m}").unwrap();
    }

    /// Once the daemon has applied all sent before (its "stats" reply comes after them).
    fn stats(&self) -> Value {
        self.send(json!({"op": "stats", "id": 7}));
        let r = self
            .replies
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        r["stats"].clone()
    }

    fn refreshes(&self) -> u64 {
        self.refreshes.load(Relaxed)
    }
}

#[test]
fn lookup_misses_are_asked_once_until_the_tree_changes() {
    let d = Daemon::start();
    d.send(json!({"op": "tree", "version": 1, "entries": [{"path": "a"}]}));
    d.stats();
    assert!(d.s.find(ROOT_INO, "a").is_ok());
    assert!(d.s.find(ROOT_INO, "b").is_err());
    assert_eq!(d.refreshes(), 1);
    assert!(d.s.find(ROOT_INO, "b").is_err());
    assert_eq!(d.refreshes(), 1, "a known miss is not asked again");
    assert!(d.s.find(ROOT_INO, "c").is_err());
    assert_eq!(d.refreshes(), 2, "another name is");
    let st = d.stats();
    assert_eq!(
        (
            st["negative_hits"].as_u64(),
            st["lookup_refreshes"].as_u64()
        ),
        (Some(1), Some(2))
    );

    // Any change to the namespace forgets the misses.
    d.send(
        json!({"op": "delta", "version": 2, "since": 1, "entries": [{"path": "x"}], "gone": []}),
    );
    d.stats();
    assert!(d.s.find(ROOT_INO, "b").is_err());
    assert_eq!(d.refreshes(), 3);

    // A delta sent before the refresh reply is seen by the retry.
    // (Big, so that the reply would otherwise overtake it.)
    let mut e: Vec<Value> = (0..20_000)
        .map(|i| json!({"path": format!("n/f{i}")}))
        .collect();
    e.push(json!({"path": "n/m", "size": 4}));
    let delta = json!({"op": "delta", "version": 3, "since": 2, "entries": e, "gone": ["x"]});
    d.on_refresh.lock().unwrap().push(delta);
    let n = d.s.find(ROOT_INO, "n").expect("applied before the retry");
    assert_eq!(n.kind, fuser::FileType::Directory);
    assert_eq!(d.s.tree().version, 3);
    assert!(d.s.find(ROOT_INO, "x").is_err());
    assert_eq!(d.refreshes(), 5);

    // A delta that does not follow the tree is ignored (and changes nothing).
    d.send(
        json!({"op": "delta", "version": 9, "since": 2, "entries": [{"path": "b"}], "gone": ["a"]}),
    );
    d.stats();
    let t = d.s.tree();
    assert_eq!(t.version, 3);
    assert!(t.child(ROOT_INO, "a").is_some() && t.child(ROOT_INO, "b").is_none());
    assert!(d.s.find(ROOT_INO, "x").is_err());
    assert_eq!(d.refreshes(), 5, "the misses stay: nothing changed");

    // A whole tree forgets them too.
    d.send(json!({"op": "tree", "version": 10, "entries": [{"path": "a"}]}));
    d.stats();
    assert!(d.s.find(ROOT_INO, "x").is_err());
    assert_eq!(d.refreshes(), 6);
}

#[test]
fn a_lazy_tree_asks_for_a_name_at_a_lookup_and_for_a_directory_at_a_readdir() {
    let d = Daemon::start();
    d.send(json!({"op": "tree", "version": 1, "lazy": true, "entries": []}));
    d.stats();
    assert_eq!(d.s.find(ROOT_INO, "x").err(), Some(libc::ENOENT));
    assert_eq!(d.s.find(ROOT_INO, "x").err(), Some(libc::ENOENT));
    let g = d.s.find(ROOT_INO, "g").expect("asked, then found");
    assert_eq!((g.kind, g.size), (fuser::FileType::RegularFile, 2));
    assert!(!d.s.tree().listed(ROOT_INO));
    let st = d.stats();
    assert_eq!(
        (
            st["name_lookups"].as_u64(),
            st["negative_hits"].as_u64(),
            st["listings"].as_u64()
        ),
        (Some(2), Some(1), Some(0)),
        "each name asked alone; a known miss not again"
    );
    // A readdir's listing: the root's names are the agent's, "g" gone.
    let t = d.s.listed_tree(ROOT_INO).unwrap();
    assert!(t.listed(ROOT_INO) && t.child(ROOT_INO, "g").is_none());
    let dir = d.s.find(ROOT_INO, "d").unwrap();
    assert_eq!(dir.kind, fuser::FileType::Directory);
    assert_eq!(d.s.find(ROOT_INO, "y").err(), Some(libc::ENOENT));
    assert_eq!(
        d.refreshes(),
        1,
        "in a listed directory a missing name may be newer: refreshed"
    );
    assert!(
        d.s.find(dir.ino.0, "f2").is_ok(),
        "a subdirectory is asked name by name"
    );
    assert_eq!(d.stats()["listings"].as_u64(), Some(1));
}

#[test]
fn a_delta_before_the_first_tree_is_ignored() {
    let d = Daemon::start();
    d.send(
        json!({"op": "delta", "version": 1, "since": 0, "entries": [{"path": "a"}], "gone": []}),
    );
    d.stats();
    assert!(d.s.tree().child(ROOT_INO, "a").is_none());
}

#[test]
fn misses_are_bounded_and_kept_per_tree() {
    let mut m = Misses::default();
    m.add(1, 1, "x");
    assert!(m.has(1, 1, "x") && !m.has(1, 2, "x") && !m.has(2, 1, "x"));
    m.add(0, 1, "y"); // found missing in an older tree: not remembered
    assert!(!m.has(0, 1, "y") && !m.has(1, 1, "y"));
    for i in 0..70_000 {
        m.add(1, 1, &format!("n{i}"));
        assert!(m.len() <= 65_536);
    }
    m.reset(2);
    assert_eq!(m.len(), 0);
}

#[test]
fn a_message_that_breaks_its_types_is_skipped() {
    let d = Daemon::start();
    for l in [
        r#"{"op":"tree","version":1,"entries":[{"path":"a"},{"path":"b","dir":true}]}"#,
        r#"{"op":"tree","version":"2","entries":[{"path":"c"}]}"#, // a wrong type: skipped
        r#"{"op":"delta","version":2,"since":1,"entries":[{"path":"c","size":-1}]}"#,
        r#"{"op":"listing","partial":true,"entries":[{"path":"b/c"}]}"#, // no path
        r#"{"op":"hot","path":"a","inode":1}"#,                          // no backing
        r#"{"op":"hot","path":"/a/","backing":"/x","inode":3,"keys":[1],"x":{}}"#,
        r#"{"op":5}"#,
        r#"{"op":"chmod","path":"a"}"#,
        "not json",
        // not "op" first: its frame read by the reader, parsed by the applier
        r#"{"since": 1, "op": "delta", "version": 3, "entries": [{"path": "d", "gen": "g"}]}"#,
    ] {
        d.send_line(l);
    }
    let st = d.stats();
    let t = d.s.tree();
    assert_eq!(t.version, 3);
    assert!(t.child(ROOT_INO, "c").is_none() && t.child(ROOT_INO, "d").is_some());
    let hot = d.s.hot.lock().unwrap();
    let a = hot.get("a").expect("the valid hot message");
    assert_eq!((hot.len(), a.inode, a.version), (1, 3, 0));
    assert!(a.marks.is_none(), "no pin: nothing to check");
    assert_eq!(st["entries_received"].as_u64(), Some(3));
    assert_eq!(st["fetch"]["reads"].as_u64(), Some(0));
}
