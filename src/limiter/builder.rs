//! [`LimiterBuilder`], and the bounds and defaults of every limiter.
//!
//! The crate's naming: a builder sets `x` with `x(value)` (`no_x()` turns it
//! off), the built value reads it with `x()`, and a setting that cannot fail
//! (a store's clock) is `with_x(value)`.

use std::sync::Arc;
use std::time::Duration;

use snafu::ensure;

use crate::cache::{self, RefusalCache};
use crate::error::InvalidOptionSnafu;
use crate::merge::Merging;
use crate::store::Store;
use crate::{Error, Limiter, Memory, metric};

/// The bounds and defaults of every limiter, whatever its store. On
/// `Limiter<Memory>` so that `Limiter::MAX_BUDGET` resolves, in generic code
/// too (Rust infers no type parameter from a path to a constant).
impl Limiter<Memory> {
    /// The default budget of one call.
    pub const DEFAULT_BUDGET: Duration = Duration::from_secs(2);

    /// The longest budget a limiter accepts.
    pub const MAX_BUDGET: Duration = Duration::from_secs(60);

    /// The most (limit, key) pairs one `_all` call takes.
    pub const MAX_PAIRS: usize = crate::store::MAX_PAIRS;

    /// The most keys one [`Limiter::refused_keys`] call lists (the
    /// procedure holds the same bound).
    pub const MAX_REFUSED_KEYS: usize = 1_000;

    /// How many keys the refusal cache holds by default.
    pub const DEFAULT_REFUSAL_CACHE_KEYS: usize = 100_000;

    /// The most keys a refusal cache may hold.
    pub const MAX_REFUSAL_CACHE_KEYS: usize = 10_000_000;

    /// How many keys the local count holds by default.
    pub const DEFAULT_LOCAL_KEYS: usize = 100_000;

    /// The most keys a local count may hold.
    pub const MAX_LOCAL_KEYS: usize = 10_000_000;

    /// How long the refusal cache answers for a flooded key, by default.
    pub const DEFAULT_REFUSAL_TTL: Duration = cache::DEFAULT_REFUSAL_TTL;

    /// The longest TTL the refusal cache accepts.
    pub const MAX_REFUSAL_TTL: Duration = crate::cache::MAX_TTL;

    /// The longest [`block`](Limiter::block): 30 days.
    pub const MAX_BLOCK: Duration = Duration::from_secs(30 * 24 * 60 * 60);

    /// The most bytes of who did an operator's call, and of why, as the
    /// audit keeps them ([`block`](Limiter::block)).
    pub const MAX_AUDIT_BYTES: (usize, usize) = (200, 1000);

    /// How many refusals of one key within [`Limiter::FLOOD_SPAN`] make it
    /// flooded, answered by the refusal cache.
    pub const FLOOD_REFUSALS: usize = cache::FLOOD_REFUSALS;

    /// The span within which [`Limiter::FLOOD_REFUSALS`] refusals of one key
    /// make it flooded.
    pub const FLOOD_SPAN: Duration = cache::FLOOD_SPAN;

    /// The most statements of writes the default has in flight: one, and
    /// more while writes wait on the commits ([merging](crate::guide#merging)).
    pub const DEFAULT_WRITES_IN_FLIGHT: usize = 16;

    /// The most statements of writes [`LimiterBuilder::writes_in_flight`]
    /// accepts: each holds a connection of the pool.
    pub const MAX_WRITES_IN_FLIGHT: usize = 1_024;
}

/// A [`Limiter`]'s settings, from [`Limiter::builder`]; each is checked by
/// [`build`](LimiterBuilder::build).
///
/// | setting | default | bounds |
/// |---|---|---|
/// | [`budget`](LimiterBuilder::budget) | [`Limiter::DEFAULT_BUDGET`] (2 s) | 1 ms to [`Limiter::MAX_BUDGET`] (60 s) |
/// | [`refusal_cache`](LimiterBuilder::refusal_cache) | on, [`Limiter::DEFAULT_REFUSAL_CACHE_KEYS`] keys | 1 to [`Limiter::MAX_REFUSAL_CACHE_KEYS`], or [`no_refusal_cache`](LimiterBuilder::no_refusal_cache) |
/// | [`refusal_ttl`](LimiterBuilder::refusal_ttl) | [`Limiter::DEFAULT_REFUSAL_TTL`] (1 s) | 1 ms to [`Limiter::MAX_REFUSAL_TTL`] (60 s) |
/// | merging | on | [`no_merging`](LimiterBuilder::no_merging) |
/// | [`writes_in_flight`](LimiterBuilder::writes_in_flight) | 1, up to [`Limiter::DEFAULT_WRITES_IN_FLIGHT`] (16) as the commits say | 1 to [`Limiter::MAX_WRITES_IN_FLIGHT`] (1,024) |
/// | [`local_keys`](LimiterBuilder::local_keys) | [`Limiter::DEFAULT_LOCAL_KEYS`] (100 000) | 1 to [`Limiter::MAX_LOCAL_KEYS`] (ten million) |
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct LimiterBuilder<S> {
    store: S,
    budget: Duration,
    refusal_cache: Option<usize>,
    refusal_ttl: Duration,
    merging: bool,
    /// `None`: as the commits say, up to the default.
    writes_in_flight: Option<usize>,
    local_keys: usize,
}

impl<S: Store> LimiterBuilder<S> {
    pub(super) fn new(store: S) -> Self {
        LimiterBuilder {
            store,
            budget: Limiter::DEFAULT_BUDGET,
            refusal_cache: Some(Limiter::DEFAULT_REFUSAL_CACHE_KEYS),
            refusal_ttl: Limiter::DEFAULT_REFUSAL_TTL,
            merging: true,
            writes_in_flight: None,
            local_keys: Limiter::DEFAULT_LOCAL_KEYS,
        }
    }

    /// The longest a call may take, getting the connection included; then
    /// it is shed or unreachable
    /// ([down or overloaded](crate::guide#down-or-overloaded)).
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// How many keys the [refusal cache](crate::guide#the-refusal-cache)
    /// holds.
    pub fn refusal_cache(mut self, keys: usize) -> Self {
        self.refusal_cache = Some(keys);
        self
    }

    /// Turns the refusal cache off: every call asks the store.
    pub fn no_refusal_cache(mut self) -> Self {
        self.refusal_cache = None;
        self
    }

    /// How long the refusal cache answers for a flooded key before one call
    /// asks the store again ([refusal cache](crate::guide#the-refusal-cache)).
    pub fn refusal_ttl(mut self, ttl: Duration) -> Self {
        self.refusal_ttl = ttl;
        self
    }

    /// How many keys the local count of
    /// [`CountLocally`](crate::WhenUnreachable::CountLocally) limits may hold
    /// while the store is unreachable ([fail-open](crate::guide#fail-open)).
    pub fn local_keys(mut self, keys: usize) -> Self {
        self.local_keys = keys;
        self
    }

    /// Turns off [merging](crate::guide#merging): every call sends its own
    /// statement.
    pub fn no_merging(mut self) -> Self {
        self.merging = false;
        self
    }

    /// Fixes how many statements of this limiter's writes are in flight at
    /// once, with merging on, in place of the default's one and more as the
    /// commits say ([merging](crate::guide#merging) says when to choose).
    pub fn writes_in_flight(mut self, places: usize) -> Self {
        self.writes_in_flight = Some(places);
        self
    }

    /// Checks every setting and makes the limiter, as [`Limiter::new`] does.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption), naming
    /// a setting outside its bounds.
    pub fn build(self) -> Result<Limiter<S>, Error> {
        ensure!(
            self.budget >= Duration::from_millis(1),
            InvalidOptionSnafu {
                option: "budget",
                reason: "the budget must be at least one millisecond",
            }
        );
        ensure!(
            self.budget <= Limiter::MAX_BUDGET,
            InvalidOptionSnafu {
                option: "budget",
                reason: format!(
                    "the budget must be at most {} s",
                    Limiter::MAX_BUDGET.as_secs()
                ),
            }
        );
        if let Some(keys) = self.refusal_cache {
            ensure!(
                keys >= 1,
                InvalidOptionSnafu {
                    option: "refusal cache",
                    reason: "give it at least one key, or turn it off with no_refusal_cache",
                }
            );
            ensure!(
                keys <= Limiter::MAX_REFUSAL_CACHE_KEYS,
                InvalidOptionSnafu {
                    option: "refusal cache",
                    reason: format!("at most {} keys", Limiter::MAX_REFUSAL_CACHE_KEYS),
                }
            );
        }
        ensure!(
            (1..=Limiter::MAX_LOCAL_KEYS).contains(&self.local_keys),
            InvalidOptionSnafu {
                option: "local keys",
                reason: format!("between 1 and {} keys", Limiter::MAX_LOCAL_KEYS),
            }
        );
        ensure!(
            self.writes_in_flight
                .is_none_or(|places| (1..=Limiter::MAX_WRITES_IN_FLIGHT).contains(&places)),
            InvalidOptionSnafu {
                option: "writes in flight",
                reason: format!("between 1 and {} statements", Limiter::MAX_WRITES_IN_FLIGHT),
            }
        );
        ensure!(
            self.refusal_ttl >= Duration::from_millis(1),
            InvalidOptionSnafu {
                option: "refusal TTL",
                reason: "the TTL must be at least one millisecond, or turn the cache off with \
                         no_refusal_cache",
            }
        );
        ensure!(
            self.refusal_ttl <= Limiter::MAX_REFUSAL_TTL,
            InvalidOptionSnafu {
                option: "refusal TTL",
                reason: format!(
                    "the TTL must be at most {} s",
                    Limiter::MAX_REFUSAL_TTL.as_secs()
                ),
            }
        );
        Ok(self.assemble())
    }

    /// The limiter, unchecked: for [`Limiter::new`]'s defaults.
    pub(super) fn assemble(self) -> Limiter<S> {
        metric::describe();
        Limiter {
            store: Arc::new(self.store),
            budget: self.budget,
            fallback: Memory::bounded(self.local_keys),
            refusals: match self.refusal_cache {
                Some(keys) => RefusalCache::new(keys, self.refusal_ttl),
                None => RefusalCache::off(self.refusal_ttl),
            },
            merging: self.merging.then(|| match self.writes_in_flight {
                Some(places) => Merging::new(places, false),
                None => Merging::new(Limiter::DEFAULT_WRITES_IN_FLIGHT, true),
            }),
        }
    }
}
