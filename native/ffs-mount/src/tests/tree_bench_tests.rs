//! The tree's cost at a million names and a thousand-name delta (CPU, memory): `cargo test
//! --release -- --ignored` (tests/tree_tests.rs has the helpers).
use super::tests::*;
use super::*;
use crate::wire::{DeltaMsg, TreeMsg};
use serde_json::{json, Value};
use std::time::Instant;

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
    let msg: TreeMsg = serde_json::from_slice(line.as_bytes()).unwrap();
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
    let dmsg: DeltaMsg = serde_json::from_slice(&dline).unwrap();
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
    let _ = t2.apply_delta(&typed(&msg3), &mut inos, &none()).unwrap();
    println!(
        "an empty delta after it (drops its {} orphans): CPU {:?}",
        t2.orphans.len(),
        cpu() - c0
    );

    // readdir of a 100,000-entry directory in batches of 100.
    let big: Vec<Value> = (0..100_000)
        .map(|i| json!({"path": format!("big/f{i:06}")}))
        .collect();
    let big = typed(&json!({"op": "tree", "version": 9, "entries": big}));
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
