//! # Protocol (the agent must follow it exactly)
//!
//! Every message and field below is listed in protocol.json with its type,
//! and the daemon reads and writes each as that type (wire.rs);
//! tests/test_mount_protocol.py holds wire.rs and the agent's sources to it.
//!
//! Framing: each message is one compact JSON object on one line ending in
//! "\n". A reply with "len": L is followed by exactly L raw bytes. Each side
//! must write a message (line plus raw bytes) contiguously. Integers are
//! JSON numbers: u64 unless said otherwise. A message is read whole as its
//! type or not at all: a line that is not JSON, or a message with a field
//! of the wrong type, or missing (but one whose default is said below), is
//! logged and skipped; such a reply fails its request with EIO. Unknown
//! fields are ignored. A message with "op" is a request or notice, one
//! without is a reply, matched by "id". The two directions have separate
//! id spaces.
//!
//! ## Agent -> daemon
//!
//! {"op":"tree","version":V,"entries":[{"path":P,"dir":bool,"size":S,
//!   "mtime_ns":i64,"gen":G}, ...]}
//!   Replaces the whole tree; the first one triggers the mount. P is
//!   relative to the mount root, "/"-separated, outer slashes stripped;
//!   entries with empty, "." or ".." components are skipped, missing parents
//!   become directories, entries below a file are dropped. A path keeps its
//!   inode number across trees and deltas while its G (a string) stays the
//!   same; a new G is a new inode, and the old one's entry is invalidated in
//!   the kernel. A file inode that leaves the tree keeps its attributes
//!   while open (and until the next tree or delta); opening it fails with
//!   ESTALE (the kernel looks the path up again and retries). Once out of
//!   the tree and not kept so, an inode number is forgotten: a path coming
//!   back later gets a new one (numbers are never reused).
//!   Best sent starting exactly {"op":"tree", (a delta {"op":"delta",):
//!   then even its parsing is off the thread that delivers replies.
//!   Defaults: version 0, lazy false, entries [], dir false, size 0,
//!   mtime_ns 0, G "" (an entry needs "path"; a directory's size is 0).
//!   Owner and modes: --uid, --gid, --file-mode, --dir-mode (0440, 0550, root).
//!   With "lazy":true the tree holds the root alone, not listed (entries
//!   are ignored): a directory not listed asks the agent for a name it
//!   lacks alone ("lookup"), and for all its names at its first readdir
//!   ("list").
//!
//! {"op":"listing","path":P,"entries":[...as in "tree"...]}
//!   ("partial" false and entries as in "tree" by default.)
//!   Directory P ("" the root) now has these entries (its children: others
//!   are skipped) and no others, and is listed; a subdirectory new to the
//!   daemon is not listed. Ignored if P is not a directory in the tree (the
//!   delta removing it came first). Must follow every delta of a version
//!   older than the listing's, and precede every delta of a newer one
//!   (a delta re-applying changes the listing has is harmless). In a delta,
//!   a new name below a directory not listed is skipped (its listing will
//!   have it; a name it holds is changed as anywhere), and a directory a
//!   delta makes is listed: every name in it comes in deltas. With
//!   "partial":true the entries are added to P, its other names kept, and P
//!   stays as listed as it was (the reply to a "lookup"). Sent asked for
//!   ("list", "lookup") or not (the agent listing the tree ahead).
//!
//! {"op":"delta","version":V,"since":S,"entries":[...as in "tree"...],
//!  "gone":[P, ...]}
//!   Changes tree S into tree V, in O(size of the delta), not of the tree
//!   (defaults as in "tree", "gone" []; S has none).
//!   Ignored (and logged) before the first tree and unless the daemon's
//!   tree is version S: after any doubt, send a whole "tree". First each
//!   path of "gone" leaves the tree (list every path removed, descendants
//!   too; those left unlisted go with their directory), then each entry is
//!   applied as in "tree": a new path is added (missing parents become
//!   directories, an entry below a file is dropped), an existing one takes
//!   its attributes (a directory that becomes a file loses its entries), or
//!   is a new inode if its G changed. What left or changed is invalidated
//!   in the kernel, and files that left are kept as with a new "tree".
//!   Optional "exact":[P, ...]: directories whose contents are now exactly
//!   the delta's entries below them (a dataset replaced): whatever else is
//!   below them leaves, as if in "gone"; they keep their inodes.
//!
//! {"op":"hot","path":P,"backing":B,"inode":I,"version":V,
//!  "pin":S,"keys":[K...],"bucket":K2,"fetched_ns":F}
//!   P of tree V is byte-identical to the local file B (st_ino I); replaces
//!   any entry for P (needs "path" and "backing"; inode and version default
//!   to 0). An open of P becomes a kernel passthrough open of B only if all
//!   hold: the tree version is V; B, opened O_RDONLY, is a regular file with
//!   st_ino I and P's tree size; the marks do not say stale; no agent handle
//!   of P's inode is open or being opened. Otherwise the open goes to the
//!   agent. Stored entries of other versions stay but do not apply. A
//!   passthrough open sets B's mtime to now if it is a second old or more
//!   (the cache's LRU order: such reads never reach the agent).
//!   Marks (the last four fields) are checked only if "pin", "fetched_ns"
//!   and at least one of "keys"/"bucket" are present (a file of several
//!   chunks lists each chunk's key in "keys"). "pin" is a BPF map
//!   pinned on a bpffs: BPF_MAP_TYPE_HASH or LRU_HASH, 8-byte key and value,
//!   native-endian u64s. The entry is stale if map[k] > F for any K of
//!   "keys" or K2 (equal is fresh); no entry means 0. Marks and F are
//!   compared as plain numbers: they must come from the same clock. Nothing
//!   pinned at S (the node restarting), a map that cannot be read or one of
//!   another shape counts as stale (logged): nothing vouches for the file. The map fd is kept per pin path and the pin re-stat'ed at
//!   most once a second: a map re-pinned or removed is seen within ~1 s.
//!   While passthrough handles of P's inode are open, every new open must
//!   reuse their backing (even after a "hot" naming another file): the kernel fails an agent open then. Such an open checks the
//!   marks of the current entry if it names the same B and I, else those the
//!   backing was opened with; if stale it fails with ESTALE (116) (the
//!   kernel retries it once, so two ESTALEs and two stale_refused). When
//!   no passthrough handle is open, a stale open goes to the agent.
//!
//! {"op":"stats","id":N}
//!   Answered with {"id":N,"stats":{...}}: u64 counters since start:
//!   passthrough_opens, agent_opens (agent handles kept), reads_forwarded,
//!   bytes_forwarded, lookups, getattrs, readdirs, stale_refused (opens
//!   whose marks said stale, whatever then happened), hot_from_open_reply
//!   (opens made passthrough by their open reply's "hot"; also counted in
//!   passthrough_opens, not in agent_opens), reads_cached, bytes_cached
//!   (reads of agent handles served from their "cached" ranges), releases
//!   (RELEASEs handled: passthrough_opens + agent_opens once all are closed),
//!   lookup_refreshes (lookup misses asked of the agent), listings
//!   (directories of a lazy tree asked of the agent), name_lookups (names
//!   asked alone, in directories not listed), entries_received (entries of
//!   trees, deltas and listings applied), negative_hits
//!   (lookup misses answered ENOENT at once, as asked before: see "refresh"),
//!   and "fetch": {reads, bytes (served from chunks fetched here), gets,
//!   get_bytes (good chunks fetched), ahead (read-ahead fetches started),
//!   ranged (ranged GETs),
//!   bad_checksum, failed_gets, fallbacks (reads then sent to the agent),
//!   sweeps (files swept whole for random readers), sweeps_refused (sweeps
//!   --sweep-mb or the sweepers' bound did not allow)}.
//!   agent_timeouts: requests to the agent unanswered within 60 s (each
//!   failed with EIO, said in the daemon's log). Not counters: entries_held
//!   (entries in the tree now, the root included), kernel_held (inodes the
//!   kernel holds lookups of); and evicted (entries dropped by
//!   --max-entries, below).
//!
//! With --max-entries N (> 0), once a change leaves more than N entries in
//! the tree, the directories looked in longest ago are evicted until about
//! nine tenths of N remain: each is no longer listed (its next readdir asks
//! "list" again, a name it lacks "lookup") and loses every entry the kernel
//! holds no lookup of (LOOKUP and READDIRPLUS replies count, FORGET
//! uncounts), except subdirectories that still have entries; the kernel is
//! told to drop the entries it holds, which go at a later eviction. An
//! entry that goes is a new inode if it comes back. The agent should send
//! no more than N entries unasked.
//!
//! Messages are applied in stream order, and an open reply's "hot" at its
//! place in that order. Trees and deltas are applied by their own thread,
//! so replies keep coming while a big tree is applied; a "stats" is
//! answered after the trees and deltas before it, and a "refresh" reply or
//! any error reply takes effect once those sent before it are applied.
//! Unknown ops are logged and ignored; replies with unknown ids are dropped.
//!
//! ## Daemon -> agent
//!
//! Every request must be answered: the FUSE thread that sent it waits for
//! the reply (for a release, after answering the kernel), so up to
//! --threads requests (and one per CPU's ring with --uring) are outstanding
//! at once; after 60 s it gives up (EIO) and drops the reply when it comes.
//! Reply in any order.
//! {"id":N,"errno":E} fails any request with errno E (E > 0, else EIO).
//!
//! {"op":"open","path":P,"gen":G,"id":N} (read-only opens only)
//!   G is P's "gen" in the daemon's tree: an agent whose P is another file
//!   now fails the open with ESTALE, after sending the newer tree.
//!   -> {"id":N,"handle":H} with optionally
//!      "keep_cache":true  the kernel keeps the pages it has cached for P
//!                         (else it drops them at this open);
//!      "hot":{"backing":B,"inode":I,"version":V,"pin":S,"keys":[K...],
//!             "bucket":K2,"fetched_ns":F}
//!                         recorded exactly like a "hot" message for P,
//!                         then, if this open can now be passthrough, it is
//!                         (no keep_cache) and H is released right away,
//!                         having served no read; else H is used as usual.
//!      "cached":{"backing":B,"inode":I,"ranges":[[S,E],...],"pin":S,
//!                "keys":[K...],"bucket":K2,"fetched_ns":F}
//!                         bytes [S,E) of P are the same bytes at the same
//!                         offsets of the local file B (st_ino I); the
//!                         daemon reads those itself for this handle (only
//!                         a read inside one range). Taken only if B opens
//!                         with inode I and the marks (as for "hot") do
//!                         not say stale; ranges past B's size are dropped.
//!      "fetch":{"chunks":[{"start":S,"bytes":B,"xxh3":X,"urls":[U,...]},...]}
//!                         the file's bytes are these chunks in order (S
//!                         from 0, each B long, together the file's size):
//!                         a read the "cached" ranges do not cover GETs
//!                         the chunk here, from the first URL (http://,
//!                         presigned; never logged whole) whose body has
//!                         B bytes and xxh3_64 X, and goes to the agent
//!                         only if none has; but a read of <= 32 KiB away
//!                         from the last one, of a chunk not at hand, GETs
//!                         only its range (unchecked: a range has no xxh3).
//!                         An erasure-coded chunk has "urls":[] and
//!                         "shards":[{"bytes":SB,"xxh3":SX,"urls":[U]},...]:
//!                         its data shards in order, each GET whole and
//!                         checked (SB bytes, xxh3_64 SX), their payloads
//!                         (after pyeclib's 80-byte header) joined, cut to
//!                         B and checked against X; any failure sends the
//!                         read to the agent (parity is its).
//!                         Ignored unless it is so.
//!   H is an int, sent back as it is. A reply without H (nor errno) fails
//!   the open with EIO, unless its "hot" makes the open passthrough (then
//!   "release" gets H null).
//!
//! {"op":"read","handle":H,"offset":O,"size":S,"id":N}
//!   -> {"id":N,"len":L} + L raw bytes. L < S means end of file; bytes
//!   beyond S are read off the socket and dropped. Never put "len" in any
//!   other reply without the bytes. A "cached" object (as in the open
//!   reply) replaces the handle's.
//!
//! {"op":"cached","handle":H,"id":N} -> {"id":N} with optionally "cached"
//!   (as in the open reply) if more of the file is cached here than the
//!   daemon was told: asked at most every 25 ms by the reads of a handle
//!   with "fetch" that are not at hand, since those never reach the agent.
//!
//! {"op":"lookup","path":P,"id":N} -> {"id":N}
//!   A lookup in a directory not listed found no such name: the agent sends
//!   a "partial" "listing" of P's directory holding P, if P exists, before
//!   its reply. A name still missing is remembered as after a "refresh".
//!
//! {"op":"list","path":P,"id":N} -> {"id":N}
//!   The agent sends directory P's "listing" (P as in the tree, "" the
//!   root) before its reply, or fails with ENOENT if it is no directory
//!   now (after sending the delta that removes it).
//!
//! {"op":"refresh","id":N} or {"op":"refresh","why":"stale","id":N} -> {"id":N}
//!   A lookup found no such name, or (why "stale") an open found a hot
//!   file's marks stale: the agent sends its newest tree (or delta) first,
//!   if newer (for a lookup it may skip that if it looked a moment ago). A
//!   name still missing then is remembered (at most 65536 of them): its
//!   lookups fail with ENOENT without asking until the next tree or delta
//!   is applied, so the agent must push its changes unasked. A stale
//!   open whose inode is then gone from the tree (its file replaced or
//!   removed) fails with ESTALE; the kernel looks the path up again and
//!   retries the open, on the new file's inode.
//!
//! {"op":"release","handle":H,"id":N} -> {"id":N}
//!   H gets no further request.
//!
//! {"id":N,"stats":{...}}: the reply to the agent's "stats".
//!
//! Closing the socket makes the daemon unmount and exit; its pending and
//! later FUSE requests to the agent fail with EIO.
