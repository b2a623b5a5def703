//! The wire, typed: every message the daemon reads from the agent (its
//! notices, its "stats", the replies to the daemon's requests) and writes
//! to it, each a struct of exactly protocol.json's fields and types (what
//! they mean: protocol.rs). Named after protocol.json: the agent's message
//! of op "x" is `XMsg` (`Notice::of`), the daemon's request "x" is
//! `XRequest`, answered by `XReply` (`request!`), an object "x" is `X`.
//! tests/test_mount_protocol.py holds these definitions to protocol.json,
//! field by field and type by type; no other module names a field.
//!
//! A message is parsed whole into its type or not at all: a field missing
//! (but one with a default) or of the wrong type makes it invalid, logged
//! and skipped (a reply: its request fails with EIO). Unknown fields are
//! ignored. The entries of "tree", "delta" and "listing" are read one at a
//! time straight into `Entry`s (change.rs), never as a serde_json `Value`.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::change;

/// What is read of every line first. With "op" it is a request or notice
/// (`Notice`), without a reply, matched by "id" and followed by "len" bytes.
#[derive(Deserialize)]
pub struct Frame {
    pub op: Option<String>,
    pub id: Option<u64>,
    pub len: Option<u64>,
}

/// The agent's messages with "op", by op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Notice {
    Tree,
    Listing,
    Delta,
    Hot,
    Stats,
}

impl Notice {
    /// Lines starting so are changes, parsed by the applier thread alone.
    pub const PREFIXES: [(&'static [u8], Notice); 3] = [
        (br#"{"op":"tree","#, Notice::Tree),
        (br#"{"op":"delta","#, Notice::Delta),
        (br#"{"op":"listing","#, Notice::Listing),
    ];

    /// The message of op `op`; None if protocol.json has no such op.
    pub fn of(op: &str) -> Option<Notice> {
        Some(match op {
            "tree" => Notice::Tree,
            "listing" => Notice::Listing,
            "delta" => Notice::Delta,
            "hot" => Notice::Hot,
            "stats" => Notice::Stats,
            _ => return None,
        })
    }
}

/// `line` as a message of type `T` (`what`, for the log); None, logged,
/// if it is not one.
pub fn parse<T: DeserializeOwned>(line: &[u8], what: &str) -> Option<T> {
    serde_json::from_slice(line)
        .inspect_err(|e| eprintln!("ffs-mount: bad {what} from the agent: {e}"))
        .ok()
}

// ---- Agent -> daemon ----

/// {"op":"tree"}: the whole tree.
#[derive(Deserialize)]
pub struct TreeMsg {
    #[serde(default)]
    pub version: u64,
    #[serde(default)]
    pub lazy: bool,
    #[serde(default, deserialize_with = "change::entries")]
    pub entries: Vec<Entry>,
}

/// {"op":"listing"}: the names of one directory ("" the root).
#[derive(Deserialize)]
pub struct ListingMsg {
    pub path: String,
    #[serde(default)]
    pub partial: bool,
    #[serde(default, deserialize_with = "change::entries")]
    pub entries: Vec<Entry>,
}

/// {"op":"delta"}: tree `since` changed into tree `version`.
#[derive(Deserialize)]
pub struct DeltaMsg {
    #[serde(default)]
    pub version: u64,
    pub since: Option<u64>,
    #[serde(default, deserialize_with = "change::entries")]
    pub entries: Vec<Entry>,
    #[serde(default, deserialize_with = "change::paths")]
    pub gone: Vec<String>,
    #[serde(default, deserialize_with = "change::paths")]
    pub exact: Vec<String>,
}

/// {"op":"hot"}: `path` is the local file the rest declares.
#[derive(Deserialize)]
pub struct HotMsg {
    pub path: String,
    #[serde(flatten)]
    pub hot: Hot,
}

/// {"op":"stats"}: answered with a `StatsReply`.
#[derive(Deserialize)]
pub struct StatsMsg {
    pub id: u64,
}

// ---- Objects ----

/// One name of a tree, delta or listing; `path` cleaned by change.rs.
#[derive(Deserialize)]
pub struct Entry {
    pub path: String,
    #[serde(default)]
    pub dir: bool,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub mtime_ns: i64,
    #[serde(default)]
    pub gen: String,
}

/// A hot declaration (of a "hot" message or an open reply); the last four
/// fields are its marks (marks.rs).
#[derive(Deserialize)]
pub struct Hot {
    pub backing: String,
    #[serde(default)]
    pub inode: u64,
    #[serde(default)]
    pub version: u64,
    pub pin: Option<String>,
    #[serde(default)]
    pub keys: Vec<u64>,
    pub bucket: Option<u64>,
    pub fetched_ns: Option<u64>,
}

/// Byte ranges [start, end) of a file that are the same bytes of `backing`.
#[derive(Deserialize)]
pub struct Cached {
    pub backing: String,
    pub inode: u64,
    pub ranges: Vec<(u64, u64)>,
    pub pin: Option<String>,
    #[serde(default)]
    pub keys: Vec<u64>,
    pub bucket: Option<u64>,
    pub fetched_ns: Option<u64>,
}

/// Where a file's bytes are: its chunks in order.
#[derive(Deserialize)]
pub struct Fetch {
    pub chunks: Vec<Chunk>,
}

#[derive(Deserialize)]
pub struct Chunk {
    pub start: u64,
    pub bytes: u64,
    pub xxh3: u64,
    pub urls: Vec<String>,
    #[serde(default)]
    pub shards: Vec<Shard>,
}

#[derive(Deserialize)]
pub struct Shard {
    pub bytes: u64,
    pub xxh3: u64,
    pub urls: Vec<String>,
}

// ---- Daemon -> agent: requests, and their replies ----

/// A request of the daemon's, answered by a `Reply`.
pub trait Request: Serialize {
    const OP: &'static str;
    type Reply: Reply;
}

/// A reply to a request of the daemon's.
pub trait Reply: DeserializeOwned + Send + 'static {
    /// The agent's errno, if it failed the request.
    fn errno(&self) -> Option<i64>;
}

/// A request on the wire: {"op":OP, its fields..., "id":N}.
#[derive(Serialize)]
pub struct Sent<'a, Q> {
    pub op: &'static str,
    #[serde(flatten)]
    pub req: &'a Q,
    pub id: u64,
}

macro_rules! request {
    ($t:ty, $op:literal, $reply:ty) => {
        impl Request for $t {
            const OP: &'static str = $op;
            type Reply = $reply;
        }
    };
}

macro_rules! reply {
    ($($t:ty),*) => {
        $(impl Reply for $t {
            fn errno(&self) -> Option<i64> {
                self.errno
            }
        })*
    };
}

#[derive(Serialize)]
pub struct OpenRequest<'a> {
    pub path: &'a str,
    pub gen: &'a str,
}
request!(OpenRequest<'_>, "open", OpenReply);

#[derive(Serialize)]
pub struct ReadRequest {
    pub handle: u64,
    pub offset: u64,
    pub size: u32,
}
request!(ReadRequest, "read", ReadReply);

#[derive(Serialize)]
pub struct CachedRequest {
    pub handle: u64,
}
request!(CachedRequest, "cached", CachedReply);

#[derive(Serialize)]
pub struct LookupRequest<'a> {
    pub path: &'a str,
}
request!(LookupRequest<'_>, "lookup", LookupReply);

#[derive(Serialize)]
pub struct ListRequest<'a> {
    pub path: &'a str,
}
request!(ListRequest<'_>, "list", ListReply);

#[derive(Serialize)]
pub struct RefreshRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<&'static str>,
}
request!(RefreshRequest, "refresh", RefreshReply);

/// `handle` null: an open reply's that had none.
#[derive(Serialize)]
pub struct ReleaseRequest {
    pub handle: Option<u64>,
}
request!(ReleaseRequest, "release", ReleaseReply);

// A reply's "id" (and "len") are read off its `Frame`: here they are
// only held to their types.
#[derive(Deserialize)]
pub struct OpenReply {
    #[allow(dead_code)]
    pub id: u64,
    pub errno: Option<i64>,
    pub handle: Option<u64>,
    #[serde(default)]
    pub keep_cache: bool,
    pub hot: Option<Hot>,
    pub cached: Option<Cached>,
    pub fetch: Option<Fetch>,
}

#[derive(Deserialize)]
pub struct ReadReply {
    #[allow(dead_code)]
    pub id: u64,
    pub errno: Option<i64>,
    #[allow(dead_code)]
    pub len: Option<u64>,
    pub cached: Option<Cached>,
}

#[derive(Deserialize)]
pub struct CachedReply {
    #[allow(dead_code)]
    pub id: u64,
    pub errno: Option<i64>,
    pub cached: Option<Cached>,
}

/// A reply that only says the request was served (or its errno).
#[derive(Deserialize)]
pub struct Done {
    #[allow(dead_code)]
    pub id: u64,
    pub errno: Option<i64>,
}
pub type LookupReply = Done;
pub type ListReply = Done;
pub type RefreshReply = Done;
pub type ReleaseReply = Done;

reply!(OpenReply, ReadReply, CachedReply, Done);

// ---- The daemon's answer to "stats" ----

#[derive(Serialize)]
pub struct StatsReply {
    pub id: u64,
    pub stats: Counters,
}

/// What each counts: protocol.rs.
#[derive(Serialize)]
pub struct Counters {
    pub passthrough_opens: u64,
    pub agent_opens: u64,
    pub reads_forwarded: u64,
    pub bytes_forwarded: u64,
    pub reads_cached: u64,
    pub bytes_cached: u64,
    pub lookups: u64,
    pub getattrs: u64,
    pub readdirs: u64,
    pub stale_refused: u64,
    pub hot_from_open_reply: u64,
    pub lookup_refreshes: u64,
    pub listings: u64,
    pub name_lookups: u64,
    pub entries_received: u64,
    pub negative_hits: u64,
    pub evicted: u64,
    pub releases: u64,
    pub passthrough_enabled: bool,
    pub uring: bool,
    pub fetch: FetchCounters,
    pub agent_timeouts: u64,
    pub entries_held: u64,
    pub kernel_held: u64,
}

#[derive(Serialize)]
pub struct FetchCounters {
    pub reads: u64,
    pub bytes: u64,
    pub gets: u64,
    pub get_bytes: u64,
    pub ahead: u64,
    pub ranged: u64,
    pub bad_checksum: u64,
    pub failed_gets: u64,
    pub fallbacks: u64,
    pub sweeps: u64,
    pub sweeps_refused: u64,
}
