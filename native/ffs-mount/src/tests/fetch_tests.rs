use super::*;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};

use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64;

use crate::fetcher::EC_HEADER;

/// Answers one GET on `r` with `bodies[path]` (its range if asked);
/// its path, or None once the client closed.
/// One request answered from `bodies`; `asked` hears its path before the answer goes, so a
/// client holding the bytes finds the request counted.
fn answer(
    r: &mut BufReader<TcpStream>,
    bodies: &HashMap<String, Vec<u8>>,
    asked: &dyn Fn(&str),
) -> Option<String> {
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let path = line
        .split_whitespace()
        .nth(1)?
        .split('?')
        .next()?
        .to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        if h.trim().is_empty() {
            break;
        }
        if let Some(v) = h.trim().strip_prefix("Range: bytes=") {
            let (a, b) = v.split_once('-').unwrap();
            range = Some((a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap() + 1));
        }
    }
    let (status, body) = match (bodies.get(&path), range) {
        (Some(b), None) => ("200 OK", b.clone()),
        (Some(b), Some((x, y))) => ("206 Partial Content", b[x..y].to_vec()),
        (None, _) => ("404 Not Found", b"<Error/>".to_vec()),
    };
    // "/huge" claims a terabyte and sends nothing
    let claimed = if path == "/huge" { 1 << 40 } else { body.len() };
    let body = if path == "/huge" { vec![] } else { body };
    let head = format!("HTTP/1.1 {status}\r\nContent-Length: {claimed}\r\n\r\n");
    asked(&path);
    let s = r.get_mut();
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(&body).ok()?;
    Some(path)
}

/// A one-connection-at-a-time HTTP server of `bodies`; the thread ends
/// with the GETs served once "/last" is asked for.
fn serve(bodies: HashMap<String, Vec<u8>>) -> (String, std::thread::JoinHandle<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        let mut served = 0;
        while let Ok((s, _)) = l.accept() {
            let mut r = BufReader::new(s);
            while let Some(path) = answer(&mut r, &bodies, &|_| {}) {
                served += 1;
                if path == "/last" {
                    return served;
                }
            }
        }
        served
    });
    (host, h)
}

/// An HTTP server of `bodies` with a thread per connection, counting the
/// GETs of each path.
fn serve_concurrently(
    bodies: HashMap<String, Vec<u8>>,
) -> (String, Arc<Mutex<HashMap<String, usize>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = l.local_addr().unwrap().to_string();
    let (counts, bodies) = (Arc::new(Mutex::new(HashMap::new())), Arc::new(bodies));
    let c = counts.clone();
    std::thread::spawn(move || {
        while let Ok((s, _)) = l.accept() {
            let (c, bodies) = (c.clone(), bodies.clone());
            std::thread::spawn(move || {
                let mut r = BufReader::new(s);
                let count =
                    |path: &str| *c.lock().unwrap().entry(path.to_string()).or_insert(0) += 1;
                while answer(&mut r, &bodies, &count).is_some() {}
            });
        }
    });
    (host, counts)
}

/// The "fetch" object `v` (a JSON value) as a handle's `Remote` of a file of `size`.
fn from_msg(v: &Value, size: u64) -> Option<Remote> {
    Remote::from_msg(&serde_json::from_value(v.clone()).unwrap(), size)
}

fn remote(host: &str, parts: &[&[u8]], urls: &[&str]) -> Remote {
    let mut start = 0;
    let chunks: Vec<Value> = parts
        .iter()
        .zip(urls)
        .map(|(p, u)| {
            let c = json!({"start": start, "bytes": p.len(), "xxh3": xxh3_64(p),
                           "urls": [format!("http://{host}{u}?X-Amz-Signature=s")]});
            start += p.len() as u64;
            c
        })
        .collect();
    from_msg(&json!({ "chunks": chunks }), start).unwrap()
}

#[test]
fn reads_across_chunks_over_one_kept_connection_and_refuses_bad_bytes() {
    let (a, b) = (vec![1u8; 1000], vec![2u8; 700]);
    let bodies = HashMap::from([
        ("/bk/a".to_string(), a.clone()),
        ("/bk/b".to_string(), b.clone()),
        ("/bk/bad".to_string(), vec![9u8; 700]),
        ("/last".to_string(), vec![]),
    ]);
    let (host, server) = serve(bodies);
    let f = Arc::new(Fetcher::new(0, 0)); // no read-ahead: one connection, GETs counted
    let r = Arc::new(remote(&host, &[&a, &b], &["/bk/a", "/bk/b"]));
    let got = r.read(&f, 900, 200).unwrap().bytes().to_vec();
    assert_eq!(got, [&a[900..], &b[..100]].concat());
    assert_eq!(r.read(&f, 1600, 500).unwrap().bytes(), &b[600..]); // the end of the file
                                                                   // the same bytes' checksum, other bytes: never served
    let wrong = Arc::new(remote(&host, &[&a, &b], &["/bk/a", "/bk/bad"]));
    assert!(wrong.read(&f, 0, 1100).is_none()); // both chunks whole: the bad one refused
    assert_eq!(f.stats.bad_checksum.load(Relaxed), 1);
    assert!(wrong.read(&f, 0, 10).is_some()); // its good chunk still reads
                                              // a small read away from the last: its range alone
    let far = Arc::new(remote(&host, &[&a, &b], &["/bk/a", "/bk/b"]));
    assert_eq!(far.read(&f, 1500, 100).unwrap().bytes(), &b[500..600]);
    assert_eq!(f.stats.ranged.load(Relaxed), 1);
    let _ = f.get(
        &Url::parse(&format!("http://{host}/last")).unwrap(),
        None,
        0,
    );
    assert_eq!(
        server.join().unwrap(),
        6,
        "one connection carried every GET"
    );
}

#[test]
fn a_chunk_hashed_piece_by_piece_as_it_arrives_is_checked_whole() {
    // over several of the pieces it is hashed in, and not a whole number of them
    let good: Vec<u8> = (0..300 * 1024 + 7).map(|i| (i * 31 % 251) as u8).collect();
    let mut late = good.clone();
    *late.last_mut().unwrap() ^= 1; // a byte of its last piece flipped
    let bodies = HashMap::from([
        ("/bk/good".to_string(), good.clone()),
        ("/bk/late".to_string(), late),
    ]);
    let (host, _server) = serve(bodies);
    let f = Arc::new(Fetcher::new(0, 0));
    let r = Arc::new(remote(&host, &[&good], &["/bk/good"]));
    let n = good.len() as u32;
    assert_eq!(r.read(&f, 0, n).unwrap().bytes(), &good[..]);
    let wrong = Arc::new(remote(&host, &[&good], &["/bk/late"]));
    assert!(wrong.read(&f, 0, n).is_none());
    assert_eq!(f.stats.bad_checksum.load(Relaxed), 1);
}

/// Polls `done` for up to 5 s.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_random_readers_file_is_swept_whole_within_the_budget() {
    // chunks of 1 MiB: a read more than NEAR from the last one's end is not sequential
    const P: u64 = 1 << 20;
    let parts: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; P as usize]).collect();
    let paths: Vec<String> = (0..6).map(|i| format!("/bk/{i}")).collect();
    let (host, gets) =
        serve_concurrently(paths.iter().cloned().zip(parts.iter().cloned()).collect());
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let urls: Vec<&str> = paths.iter().map(String::as_str).collect();
    let budget = 10 * P;
    let f = Arc::new(Fetcher::new(0, budget));
    let r = Arc::new(remote(&host, &refs, &urls));
    let byte = |at: u64| parts[(at / P) as usize][0];
    // small reads at random in chunks 4, 1, 3: a ranged GET each
    for at in [4 * P + 100, P + 200, 3 * P + 900] {
        assert_eq!(r.read(&f, at, 10).unwrap().bytes(), &[byte(at); 10]);
    }
    assert_eq!(
        (f.stats.ranged.load(Relaxed), f.stats.sweeps.load(Relaxed)),
        (3, 0)
    );
    // the fourth chunk touched: the file is swept, this read's chunk fetched whole
    assert_eq!(r.read(&f, 5 * P + 500, 10).unwrap().bytes(), &[5; 10]);
    eventually("every chunk at hand", || {
        (0..6).all(|k| r.at_hand(k * P, P as u32))
    });
    assert_eq!(f.stats.sweeps.load(Relaxed), 1);
    assert_eq!(f.sweep_free.load(Relaxed), budget - 6 * P);
    for at in [2 * P + 345, 5, 5 * P - 1, 3 * P] {
        assert_eq!(r.read(&f, at, 1).unwrap().bytes(), &[byte(at)]);
    }
    // each chunk GET whole once, besides the three ranges: nothing read twice
    let got: Vec<usize> = paths.iter().map(|p| gets.lock().unwrap()[p]).collect();
    assert_eq!(got, [1, 2, 1, 2, 2, 1]);
    assert_eq!(f.stats.ranged.load(Relaxed), 3);
    // the handle gone, its memory is the budget's again
    drop(r);
    eventually("the budget given back", || {
        f.sweep_free.load(Relaxed) == budget
    });
    // chunks wholly in this host's cache at open are left to it: 2, not 5 (a few bytes of it)
    let count = || -> Vec<usize> { paths.iter().map(|p| gets.lock().unwrap()[p]).collect() };
    let before = count();
    let r =
        Arc::new(remote(&host, &refs, &urls).cached_here(&[(2 * P, 3 * P), (5 * P, 5 * P + 10)]));
    for at in [4 * P + 100, P + 200, 3 * P + 900, 10] {
        assert_eq!(r.read(&f, at, 10).unwrap().bytes(), &[byte(at); 10]);
    }
    eventually("the sweep done", || f.sweepers.load(Relaxed) == 0);
    assert!([0, 1, 3, 4, 5].iter().all(|&k| r.at_hand(k * P, P as u32)) && !r.at_hand(2 * P, 1));
    let fetched: Vec<usize> = count().iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(fetched, [1, 2, 0, 2, 2, 1]);
    drop(r);
    // a file larger than what is left is not swept: its reads stay ranged
    let small = Arc::new(Fetcher::new(0, 6 * P - 1));
    let r = Arc::new(remote(&host, &refs, &urls));
    for at in [4 * P + 100, P + 200, 3 * P + 900, 5 * P + 500, 2 * P] {
        assert_eq!(r.read(&small, at, 10).unwrap().bytes(), &[byte(at); 10]);
    }
    assert_eq!(small.stats.sweeps_refused.load(Relaxed), 1);
    assert_eq!(
        (
            small.stats.ranged.load(Relaxed),
            small.stats.gets.load(Relaxed)
        ),
        (5, 0)
    );
}

fn shard_of(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; EC_HEADER];
    out[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

#[test]
fn an_erasure_coded_chunk_is_joined_from_its_data_shards_and_checked() {
    let chunk: Vec<u8> = (0..999u32).map(|i| (i * 7) as u8).collect();
    let (s0, s1) = (
        shard_of(&chunk[..500]),
        shard_of(&[&chunk[500..], &[0u8][..]].concat()),
    ); // padded
       // each shard on a node of its own (fetched at once)
    let node = |path: &str, body: &Vec<u8>| {
        serve(HashMap::from([
            (path.to_string(), body.clone()),
            ("/last".to_string(), vec![]),
        ]))
    };
    let ((h0, n0), (h1, n1)) = (node("/bk/c.s0", &s0), node("/bk/c.s1", &s1));
    let shard = |host: &str, path: &str, body: &[u8], x: u64| json!({"bytes": body.len(), "xxh3": x, "urls": [format!("http://{host}{path}?X-Amz-Signature=s")]});
    let plan = |x1: u64| {
        json!({"chunks": [{"start": 0, "bytes": 999, "xxh3": xxh3_64(&chunk), "urls": [],
                          "shards": [shard(&h0, "/bk/c.s0", &s0, xxh3_64(&s0)),
                                     shard(&h1, "/bk/c.s1", &s1, x1)]}]})
    };
    let f = Arc::new(Fetcher::new(0, 0));
    let r = Arc::new(from_msg(&plan(xxh3_64(&s1)), 999).unwrap());
    assert_eq!(r.read(&f, 0, 999).unwrap().bytes(), &chunk[..]);
    assert_eq!(f.stats.gets.load(Relaxed), 2);
    // a shard whose bytes are not its checksum's: nothing served (the agent reads parity)
    let wrong = Arc::new(from_msg(&plan(1), 999).unwrap());
    assert!(wrong.read(&f, 0, 10).is_none());
    assert_eq!(f.stats.bad_checksum.load(Relaxed), 1);
    // copies and shards at once, or neither: not a plan
    let both = json!({"chunks": [{"start": 0, "bytes": 999, "xxh3": 1, "urls": ["http://h:1/b/k"],
                                  "shards": [shard(&h0, "/bk/c.s0", &s0, 1)]}]});
    assert!(from_msg(&both, 999).is_none());
    for (h, n) in [(h0, n0), (h1, n1)] {
        let _ = f.get(&Url::parse(&format!("http://{h}/last")).unwrap(), None, 0);
        assert_eq!(
            n.join().unwrap(),
            3,
            "each shard twice over one connection, then /last"
        );
    }
}

#[test]
fn a_plan_that_is_not_the_file_is_refused() {
    let c =
        |start: u64| json!({"start": start, "bytes": 10, "xxh3": 1, "urls": ["http://h:1/b/k"]});
    assert!(from_msg(&json!({"chunks": [c(0), c(10)]}), 20).is_some());
    assert!(from_msg(&json!({"chunks": [c(0), c(11)]}), 21).is_none());
    assert!(from_msg(&json!({"chunks": [c(0)]}), 20).is_none());
    let https =
        json!({"chunks": [{"start": 0, "bytes": 1, "xxh3": 1, "urls": ["https://h:1/b/k"]}]});
    assert!(from_msg(&https, 1).is_none());
}

#[test]
fn a_length_other_than_the_chunks_is_refused_unread() {
    let huge = vec![5u8; 10];
    let bodies = HashMap::from([
        ("/huge".to_string(), huge.clone()),
        ("/last".to_string(), vec![]),
    ]);
    let (host, server) = serve(bodies);
    let f = Arc::new(Fetcher::new(0, 0));
    let r = Arc::new(remote(&host, &[&huge], &["/huge"]));
    assert!(
        r.read(&f, 0, 10).is_none(),
        "a terabyte claimed for 10 bytes"
    );
    // its range first (a small read), then the whole chunk: each refused, its connection dropped
    assert_eq!(f.stats.failed_gets.load(Relaxed), 2);
    let _ = f.get(
        &Url::parse(&format!("http://{host}/last")).unwrap(),
        None,
        0,
    );
    assert_eq!(server.join().unwrap(), 3);
}
