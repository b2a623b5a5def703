//! `Shared`: what every FUSE thread (and the reader and applier threads)
//! shares: the tree, the kernel's lookups, the open handles, the link to
//! the agent, the counters.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::agent_link::AgentLink;
use crate::backing::{Hot, Opens};
use crate::fetch::AHEAD;
use crate::fetcher::{spawn_anywhere, Fetcher};
use crate::lookup::Misses;
use crate::marks::Pins;
use crate::stats::Stats;
use crate::tree::Tree;

pub struct Shared {
    pub tree: RwLock<Arc<Tree>>,
    /// Inode -> how many lookups of it the kernel holds (it FORGETs them):
    /// an inode it holds stays in the tree. Taken before `tree` by whoever
    /// takes both, so an eviction never drops an inode being handed out.
    pub refs: Mutex<HashMap<u64, u64>>,
    /// Entries the tree may hold before the least recently used directories
    /// are evicted (0: no bound).
    pub max_entries: usize,
    pub misses: Mutex<Misses>,
    pub hot: Mutex<HashMap<String, Hot>>,
    pub stats: Stats,
    pub agent: AgentLink,
    pub ttl: Duration,
    pub fetcher: Arc<Fetcher>,
    pub pins: Pins,
    pub passthrough_ok: AtomicBool,
    pub opens: Mutex<Opens>,
    /// Ask for FUSE over io_uring in init (the kernel may not offer it).
    pub uring: bool,
}

impl Shared {
    pub fn new(agent: AgentLink, ttl: Duration) -> Shared {
        Shared {
            tree: RwLock::new(Arc::new(Tree::empty())),
            refs: Mutex::new(HashMap::new()),
            max_entries: 0,
            misses: Mutex::new(Misses::default()),
            hot: Mutex::new(HashMap::new()),
            stats: Stats::default(),
            agent,
            ttl,
            fetcher: Arc::new(Fetcher::new(AHEAD, 0)),
            pins: Pins::default(),
            passthrough_ok: AtomicBool::new(false),
            opens: Mutex::new(Opens::default()),
            uring: false,
        }
    }

    pub fn tree(&self) -> Arc<Tree> {
        self.tree.read().unwrap().clone()
    }

    /// Inodes with handles open (or opens under way).
    pub fn open_inodes(&self) -> HashSet<u64> {
        let st = self.opens.lock().unwrap();
        st.inodes
            .iter()
            .filter(|(_, io)| io.pt_count + io.agent_count > 0)
            .map(|(&i, _)| i)
            .collect()
    }

    /// Run `f` on a thread of its own when requests come through io_uring: each CPU's queue has
    /// one thread, and a call to the agent there would hold up every request of that CPU (through
    /// /dev/fuse, the other threads go on). Inline when MAX_WORKERS run already.
    pub fn off_queue(self: Arc<Self>, f: impl FnOnce() + Send + 'static) {
        match self
            .stats
            .uring
            .load(Relaxed)
            .then(|| self.fetcher.worker())
            .flatten()
        {
            Some(w) => {
                spawn_anywhere(move || {
                    let _w = w;
                    f()
                });
            }
            None => f(),
        }
    }
}
