//! A random reader's file swept whole into its handle's memory, in the
//! background, within the daemon's --sweep-mb (see fetch.rs).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use crate::fetch::Remote;
use crate::fetcher::{spawn_anywhere, Fetcher};

/// Distinct chunks a handle's small reads elsewhere than where the last read
/// ended must touch before its file is swept whole (a reader of a footer and
/// a few columns is not; one reading at random all over the file is).
const SWEEP_AFTER: usize = 4;
/// Threads sweeping one file (more measured no faster on 2 cores: MinIO and
/// the checks take the CPUs), and sweeping daemon-wide at most.
const SWEEPERS: usize = 2;
const MAX_SWEEPERS: usize = 8;

impl Remote {
    /// Whether this file is swept, once a random reader's small read of chunk
    /// k (not at hand) is counted: the SWEEP_AFTER-th such chunk starts the
    /// sweep, if the daemon's budget holds the file and its sweepers are not
    /// all busy. A read of a swept file fetches its chunk whole (the sweep
    /// will not GET it again: a ranged GET now would make it hot by itself).
    pub fn swept(self: &Arc<Self>, f: &Arc<Fetcher>, k: usize) -> bool {
        {
            let mut w = self.window.lock().unwrap();
            if w.sweeping {
                return true;
            }
            w.touched.insert(k);
            if w.touched.len() < SWEEP_AFTER {
                return false;
            }
        }
        let fits = f
            .sweep_free
            .fetch_update(Relaxed, Relaxed, |free| free.checked_sub(self.size))
            .is_ok();
        let threads = fits
            && f.sweepers
                .fetch_update(Relaxed, Relaxed, |n| {
                    (n + SWEEPERS <= MAX_SWEEPERS).then_some(n + SWEEPERS)
                })
                .is_ok();
        if !threads {
            if fits {
                f.sweep_free.fetch_add(self.size, Relaxed);
            }
            f.stats.sweeps_refused.fetch_add(1, Relaxed);
            self.window.lock().unwrap().touched.clear(); // asked again after as many
            return false;
        }
        {
            let mut w = self.window.lock().unwrap();
            if w.sweeping {
                // another read started it meanwhile: this one's share goes back
                f.sweep_free.fetch_add(self.size, Relaxed);
                f.sweepers.fetch_sub(SWEEPERS, Relaxed);
                return true;
            }
            w.sweeping = true;
        }
        *self.swept.lock().unwrap() = Some(f.sweep_free.clone());
        f.stats.sweeps.fetch_add(1, Relaxed);
        let next = Arc::new(AtomicUsize::new(0));
        for _ in 0..SWEEPERS {
            let (r, f, next) = (Arc::downgrade(self), f.clone(), next.clone());
            spawn_anywhere(move || {
                // the handle's release ends the sweep: a sweeper holds it only while fetching
                while let Some(r) = r.upgrade() {
                    let k = next.fetch_add(1, Relaxed);
                    if k >= r.chunks.len() {
                        break;
                    }
                    {
                        let mut w = r.window.lock().unwrap();
                        let here = r.here.get(k).copied().unwrap_or(false);
                        if here || w.have.contains_key(&k) || !w.fetching.insert(k) {
                            continue;
                        }
                    }
                    let got = f.chunk(&r.chunks[k]).map(Arc::new);
                    r.land(k, got);
                }
                f.sweepers.fetch_sub(1, Relaxed);
            });
        }
        true
    }
}
