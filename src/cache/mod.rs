//! The [refusal cache](crate::guide#the-refusal-cache): each key the store
//! refused has a `State` behind a mutex in a [`quick_cache`], which bounds
//! the keys (the expiry is ours). Times are the store's
//! [`local_now`](crate::store::sealed::Sealed::local_now); a clock moved
//! back before a held refusal or a claim drops it rather than stretch it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use crate::Verdict;

/// How many refusals of one key within [`FLOOD_SPAN`] make it flooded.
pub(crate) const FLOOD_REFUSALS: usize = 3;

/// The span within which [`FLOOD_REFUSALS`] refusals make a key flooded.
pub(crate) const FLOOD_SPAN: Duration = Duration::from_secs(1);

/// The default TTL ([`LimiterBuilder::refusal_ttl`](crate::LimiterBuilder::refusal_ttl)).
pub(crate) const DEFAULT_REFUSAL_TTL: Duration = Duration::from_secs(1);

/// The longest TTL ([`Limiter::MAX_REFUSAL_TTL`](crate::Limiter::MAX_REFUSAL_TTL)).
pub(crate) const MAX_TTL: Duration = Duration::from_secs(60);

/// A refusal the store gave, answered again while fresh.
struct Held {
    verdict: Verdict,
    /// The cost of the ask refused: the smallest it answers.
    cost: u32,
    /// The max it was refused under: the only one it answers.
    max: u32,
    /// When the call that got it asked.
    asked_at: SystemTime,
    /// When the store said the key reopens: never answered past it.
    reopens: SystemTime,
    /// The end of its TTL (or the reopening, if sooner).
    fresh_until: SystemTime,
}

/// The claim of one call to refresh a held refusal.
#[derive(Clone, Copy)]
struct Claim {
    token: u64,
    at: SystemTime,
}

#[derive(Default)]
struct State {
    /// The latest refusals answered for the key, oldest first.
    refusals: [Option<SystemTime>; FLOOD_REFUSALS],
    held: Option<Held>,
    claim: Option<Claim>,
}

impl State {
    /// Counts a refusal answered at `at` (kept if among the latest).
    fn record(&mut self, at: SystemTime) {
        if let Some(free) = self.refusals.iter_mut().find(|t| t.is_none()) {
            *free = Some(at);
        } else if let Some(oldest) = self.refusals.iter_mut().min() {
            if *oldest < Some(at) {
                *oldest = Some(at);
            }
        }
    }

    fn flooded(&self, now: SystemTime) -> bool {
        let mut oldest = None;
        for t in &self.refusals {
            let Some(t) = *t else {
                return false;
            };
            oldest = Some(oldest.map_or(t, |o: SystemTime| o.min(t)));
        }
        oldest.is_some_and(|oldest| match now.duration_since(oldest) {
            Ok(ago) => ago < FLOOD_SPAN,
            Err(_) => true,
        })
    }

    /// Whether the entry says nothing any more.
    fn idle(&self, now: SystemTime) -> bool {
        self.held.is_none()
            && self.claim.is_none()
            && self
                .refusals
                .iter()
                .flatten()
                .all(|&t| t > now || now.duration_since(t).is_ok_and(|ago| ago >= FLOOD_SPAN))
    }
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the cache says of a call.
pub(crate) enum Lookup {
    Refused(Verdict),
    /// Ask the store; with the claim to refresh, if this call holds it.
    Ask(Option<Refresh>),
}

/// The claim to refresh a held refusal from the store. Dropped, it lets the
/// next call claim at once; kept by [`RefusalCache::unanswered`], it stands
/// until it goes stale.
pub(crate) struct Refresh {
    state: Shared,
    token: u64,
    release: bool,
}

impl Drop for Refresh {
    fn drop(&mut self) {
        if self.release {
            let mut state = lock(&self.state);
            if state.claim.is_some_and(|c| c.token == self.token) {
                state.claim = None;
            }
        }
    }
}

pub(crate) struct RefusalCache {
    entries: Option<quick_cache::sync::Cache<String, Shared>>,
    capacity: usize,
    ttl: Duration,
    tokens: AtomicU64,
}

impl std::fmt::Debug for RefusalCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefusalCache")
            .field("enabled", &self.entries.is_some())
            .field("capacity", &self.capacity)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl RefusalCache {
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Self {
        RefusalCache {
            entries: Some(quick_cache::sync::Cache::new(capacity)),
            capacity,
            ttl,
            tokens: AtomicU64::new(0),
        }
    }

    pub(crate) fn off(ttl: Duration) -> Self {
        RefusalCache {
            entries: None,
            capacity: 0,
            ttl,
            tokens: AtomicU64::new(0),
        }
    }

    pub(crate) fn capacity(&self) -> Option<usize> {
        self.entries.as_ref().map(|_| self.capacity)
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// What to do with a call for `key` of `cost` under `max` at `now`:
    /// answer the held refusal, or ask the store, claiming the refresh if it
    /// is past its TTL and no claim stands.
    pub(crate) fn get(
        &self,
        key: &str,
        (cost, max): (u32, u32),
        now: SystemTime,
        budget: Duration,
    ) -> Lookup {
        let Some(entries) = &self.entries else {
            return Lookup::Ask(None);
        };
        let Some(shared) = entries.get(key) else {
            return Lookup::Ask(None);
        };
        let mut state = lock(&shared);
        let Some(held) = &state.held else {
            let idle = state.idle(now);
            drop(state);
            if idle {
                entries.remove_if(key, |e| Arc::ptr_eq(e, &shared) && lock(e).idle(now));
            }
            return Lookup::Ask(None);
        };
        if now >= held.reopens || now < held.asked_at {
            state.held = None;
            state.claim = None;
            return Lookup::Ask(None);
        }
        if cost < held.cost || max != held.max {
            // A smaller ask, or another tier: it may go ahead sooner.
            return Lookup::Ask(None);
        }
        let verdict = held.verdict.seen_at(now, held.reopens);
        let fresh = now < held.fresh_until;
        let claimed = state.claim.is_some_and(|c| {
            c.at <= now && c.at.checked_add(budget).is_some_and(|stale| now < stale)
        });
        if fresh || claimed {
            state.record(now);
            return Lookup::Refused(verdict);
        }
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        state.claim = Some(Claim { token, at: now });
        drop(state);
        Lookup::Ask(Some(Refresh {
            state: shared,
            token,
            release: true,
        }))
    }

    /// Takes in the store's answer to a call that asked at `asked_at`: a
    /// refusal is counted, and held if the key is flooded; an allow clears
    /// the entry. The call's claim, if any, ends.
    pub(crate) fn answered(
        &self,
        key: &str,
        verdict: &Verdict,
        (cost, max): (u32, u32),
        asked_at: SystemTime,
        refresh: Option<Refresh>,
    ) {
        let Some(entries) = &self.entries else {
            return;
        };
        if verdict.is_unreachable() {
            // Not the store's answer: nothing learnt.
            self.unanswered(refresh);
            return;
        }
        if verdict.is_allowed() {
            // Read first: most allowed keys have none, and a read shares.
            if entries.contains_key(key) {
                entries.remove(key);
            }
            return;
        }
        let Some(wait) = verdict.retry_after() else {
            return;
        };
        let shared = entries
            .get_or_insert_with(key, || Ok::<_, Infallible>(Shared::default()))
            .unwrap_or_else(|never| match never {});
        let mut state = lock(&shared);
        state.record(asked_at);
        // A fresh refusal of a larger cost under the same max stays: it
        // still holds for its own cost.
        let newer = state.held.as_ref().is_none_or(|h| {
            h.asked_at <= asked_at && (h.max != max || h.cost >= cost || asked_at >= h.fresh_until)
        });
        if newer {
            state.held = state.flooded(asked_at).then(|| {
                let reopens = asked_at + wait;
                Held {
                    verdict: verdict.clone(),
                    cost,
                    max,
                    asked_at,
                    reopens,
                    fresh_until: asked_at
                        .checked_add(self.ttl)
                        .map_or(reopens, |end| end.min(reopens)),
                }
            });
        }
        // The claim ends after the update, so no call claims in between.
        drop(state);
        drop(refresh);
    }

    /// A call that ended without the store's answer: its claim stands
    /// until it goes stale, so a store that is down gets one call per budget.
    pub(crate) fn unanswered(&self, refresh: Option<Refresh>) {
        if let Some(mut refresh) = refresh {
            refresh.release = false;
        }
    }

    /// Forgets `key`: after a reset or a success through this process.
    pub(crate) fn forget(&self, key: &str) {
        if let Some(entries) = &self.entries {
            entries.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
