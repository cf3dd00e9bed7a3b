//! The refusal cache: once a key is refused, this process answers "refused"
//! for it without a round trip until the verdict's reopening time.
//!
//! What it promises (it never allows, how stale it can be, its bound, what
//! it does not count) is written once, in the
//! [guide](crate::guide#the-refusal-cache). Here: the entries live in a
//! [`quick_cache`] (a small, well-kept, sharded concurrent cache with a hard
//! size bound and S3-FIFO eviction); the expiry, per entry and on the
//! store's clock, is ours, and an expired entry is dropped when read.

use std::time::SystemTime;

use crate::Verdict;

/// A cached refusal.
#[derive(Clone)]
struct Entry {
    verdict: Verdict,
    /// The moment, on the limiter's local timeline, at which the refusal
    /// ends.
    until: SystemTime,
}

pub(crate) struct RefusalCache {
    entries: Option<quick_cache::sync::Cache<String, Entry>>,
    capacity: usize,
}

impl std::fmt::Debug for RefusalCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefusalCache")
            .field("enabled", &self.entries.is_some())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl RefusalCache {
    pub(crate) fn new(capacity: usize) -> Self {
        RefusalCache {
            entries: Some(quick_cache::sync::Cache::new(capacity)),
            capacity,
        }
    }

    pub(crate) fn off() -> Self {
        RefusalCache {
            entries: None,
            capacity: 0,
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        self.entries.is_some()
    }

    /// The cached refusal of `key` at `now`, with its wait shortened to
    /// `now`; expired entries are dropped.
    pub(crate) fn get(&self, key: &str, now: SystemTime) -> Option<Verdict> {
        let entries = self.entries.as_ref()?;
        let entry = entries.get(key)?;
        if now < entry.until {
            Some(entry.verdict.seen_at(now, entry.until))
        } else {
            entries.remove_if(key, |e| e.until <= now);
            None
        }
    }

    /// Remembers a refusal the store gave, for as long as the store said it
    /// lasts, counted from `asked_at` (the local time before the call).
    pub(crate) fn put(&self, key: &str, verdict: &Verdict, asked_at: SystemTime) {
        let Some(entries) = &self.entries else {
            return;
        };
        if verdict.is_allowed() || verdict.is_unreachable() {
            return;
        }
        let Some(wait) = verdict.retry_after() else {
            return;
        };
        entries.insert(
            key.to_owned(),
            Entry {
                verdict: verdict.clone(),
                until: asked_at + wait,
            },
        );
    }

    /// Forgets `key`: after a reset or a success through this process.
    pub(crate) fn forget(&self, key: &str) {
        if let Some(entries) = &self.entries {
            entries.remove(key);
        }
    }
}
