//! The daemon's counters, answered to the agent's "stats".

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::wire::{Counters, FetchCounters};

#[derive(Default)]
pub struct Stats {
    pub passthrough_opens: AtomicU64,
    pub agent_opens: AtomicU64,
    pub reads_forwarded: AtomicU64,
    pub bytes_forwarded: AtomicU64,
    /// Reads of agent-opened files served from their "cached" ranges here.
    pub reads_cached: AtomicU64,
    pub bytes_cached: AtomicU64,
    pub lookups: AtomicU64,
    pub getattrs: AtomicU64,
    pub readdirs: AtomicU64,
    pub stale_refused: AtomicU64,
    pub hot_from_open_reply: AtomicU64,
    pub lookup_refreshes: AtomicU64,
    /// Directories of a lazy tree listed (asked of the agent).
    pub listings: AtomicU64,
    /// Names asked of the agent alone, in directories not listed.
    pub name_lookups: AtomicU64,
    /// Entries of trees, deltas and listings applied: what the agent sent of the namespace.
    pub entries_received: AtomicU64,
    /// Lookups answered ENOENT from the remembered misses, without the agent.
    pub negative_hits: AtomicU64,
    /// Entries dropped from the tree to keep it within --max-entries.
    pub evicted: AtomicU64,
    /// RELEASEs handled: equal to passthrough_opens + agent_opens once every file is closed.
    pub releases: AtomicU64,
    /// Whether the kernel took FUSE_PASSTHROUGH at INIT (else every open goes to the agent).
    pub passthrough_enabled: AtomicBool,
    /// Requests come through io_uring queues (one per CPU), not /dev/fuse.
    pub uring: AtomicBool,
}

impl Stats {
    /// The counters the agent's "stats" is answered with: these, and the
    /// others given.
    pub fn counters(
        &self,
        fetch: FetchCounters,
        agent_timeouts: u64,
        entries_held: u64,
        kernel_held: u64,
    ) -> Counters {
        Counters {
            passthrough_opens: self.passthrough_opens.load(Relaxed),
            agent_opens: self.agent_opens.load(Relaxed),
            reads_forwarded: self.reads_forwarded.load(Relaxed),
            bytes_forwarded: self.bytes_forwarded.load(Relaxed),
            reads_cached: self.reads_cached.load(Relaxed),
            bytes_cached: self.bytes_cached.load(Relaxed),
            lookups: self.lookups.load(Relaxed),
            getattrs: self.getattrs.load(Relaxed),
            readdirs: self.readdirs.load(Relaxed),
            stale_refused: self.stale_refused.load(Relaxed),
            hot_from_open_reply: self.hot_from_open_reply.load(Relaxed),
            lookup_refreshes: self.lookup_refreshes.load(Relaxed),
            listings: self.listings.load(Relaxed),
            name_lookups: self.name_lookups.load(Relaxed),
            entries_received: self.entries_received.load(Relaxed),
            negative_hits: self.negative_hits.load(Relaxed),
            evicted: self.evicted.load(Relaxed),
            releases: self.releases.load(Relaxed),
            passthrough_enabled: self.passthrough_enabled.load(Relaxed),
            uring: self.uring.load(Relaxed),
            fetch,
            agent_timeouts,
            entries_held,
            kernel_held,
        }
    }
}
