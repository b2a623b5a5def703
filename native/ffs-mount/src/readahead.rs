//! Read-ahead: the chunks after a sequential reader's, fetched on threads of
//! their own before it asks for them.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::fetch::Remote;
use crate::fetcher::{spawn_anywhere, Fetcher};

/// Read-ahead fetches running at once in the whole daemon.
const MAX_AHEAD_FETCHES: usize = 4;

impl Remote {
    /// Start fetching chunk k on a thread of its own, unless it is here, on
    /// its way, or the daemon's read-ahead budget is spent.
    pub fn ahead(self: &Arc<Self>, f: &Arc<Fetcher>, k: usize) {
        {
            let mut w = self.window.lock().unwrap();
            if w.have.contains_key(&k) || w.fetching.contains(&k) {
                return;
            }
            if f.ahead_running.fetch_add(1, Relaxed) >= MAX_AHEAD_FETCHES {
                f.ahead_running.fetch_sub(1, Relaxed);
                return;
            }
            w.fetching.insert(k);
        }
        f.stats.ahead.fetch_add(1, Relaxed);
        let (r, f) = (self.clone(), f.clone());
        spawn_anywhere(move || {
            let got = f.chunk(&r.chunks[k]).map(Arc::new);
            f.ahead_running.fetch_sub(1, Relaxed);
            r.land(k, got);
        });
    }
}
