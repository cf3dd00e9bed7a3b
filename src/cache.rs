//! The refusal cache: once a key is refused, this process answers "refused"
//! for it without a round trip until the verdict's reopening time.
//!
//! Under a credential-stuffing run most attempts are at keys already refused;
//! answering them here keeps the attacker's load off the shared database,
//! which is what keeps the limiter reachable (an unreachable limiter fails
//! open).
//!
//! - **It can never allow.** It holds only refusals the database gave, and
//!   answers only "refused", only until the moment the database said the key
//!   reopens (measured from before the call, so never later than the
//!   database would).
//! - **Staleness.** A `reset` (or a successful permit) through this process
//!   clears its entry. A reset made through another replica is seen here at
//!   the latest when the cached refusal reopens.
//! - **Bounded.** At most the configured number of keys
//!   ([`DEFAULT_REFUSAL_CACHE_KEYS`](crate::DEFAULT_REFUSAL_CACHE_KEYS) by
//!   default), evicted by [`quick_cache`]'s S3-FIFO policy; expired entries
//!   are dropped when read.
//! - Refused attempts answered here are not counted in the database (a `hit`
//!   or `failed` at a refused key changes no verdict of a fixed window; for
//!   a sliding window or a lockout it would only have prolonged the
//!   refusal). The metrics count them with `source="cache"`.
//!
//! [`quick_cache`] is used because it is a small, well-kept, sharded
//! concurrent cache with a hard size bound; the expiry, which is per entry
//! and on the store's clock, is ours.

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
