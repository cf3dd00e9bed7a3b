//! [`Limiter`]: the front. Check before an attempt, record a failure after
//! it, or do both at once.

mod ask;
mod builder;
mod clear;
mod cost;
mod permit;
mod several;

pub use builder::LimiterBuilder;
pub use cost::Ask;
pub use permit::{Permit, Permits, Reservation, Reservations};

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::RefusalCache;

use crate::key::stored;
use crate::merge::Merging;
use crate::operation::Counting;
use crate::store::Store;
use crate::{Error, Key, Limit, Memory, Verdict};

/// The front of the crate: `check`, `failed`, `hit`, `reserve` and `reset`,
/// and their `_all` forms over several limits at once (an [`Ask`] of `hit`
/// or `reserve` may [cost](Ask::cost) more than one unit), over a store,
/// [`Postgres`](crate::Postgres) in production or [`Memory`] in tests.
///
/// Every call, getting the connection included, ends within the budget
/// (2 seconds unless set with [`LimiterBuilder::budget`]). Only when a probe
/// finds the server down is the attempt **allowed** (unless the limit chose
/// otherwise with [`WhenUnreachable`](crate::WhenUnreachable)), the verdict
/// saying so ([`Verdict::is_unreachable`]): [fail-open](crate::guide#fail-open),
/// loudly. A call the server is up for but does not answer in time is shed
/// ([`Verdict::is_shed`]); any other failure is an [`Error`]. Never a
/// silent allow.
///
/// The usual shape of a login:
///
/// ```
/// use platformkit_limit::{Key, Limit, Limiter, Memory};
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(Memory::new());
/// let login = Limit::new("login", 3, Duration::from_secs(15 * 60))?;
/// let account = Key::opaque("account-42");
///
/// for _ in 0..3 {
///     let verdict = limiter.check(&login, &account).await?;
///     assert!(verdict.is_allowed());
///     // ... the password was wrong:
///     limiter.failed(&login, &account).await?;
/// }
/// let verdict = limiter.check(&login, &account).await?;
/// assert!(verdict.is_refused());
/// assert!(verdict.retry_after().unwrap() <= Duration::from_secs(15 * 60));
///
/// // A good login may clear the count.
/// limiter.reset(&login, &account).await?;
/// assert!(limiter.check(&login, &account).await?.is_allowed());
/// # Ok::<(), platformkit_limit::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Limiter<S> {
    store: Arc<S>,
    budget: Duration,
    /// The local count of limits that count locally while the store is
    /// unreachable ([`WhenUnreachable::CountLocally`](crate::WhenUnreachable::CountLocally)).
    fallback: Memory,
    /// Refusals this process answers without a round trip.
    refusals: RefusalCache,
    /// Merges concurrent writes into shared statements.
    merging: Option<Merging>,
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store` with every default (the table on
    /// [`LimiterBuilder`]): a budget of 2 seconds, the refusal cache and
    /// merging on.
    ///
    /// Describes the crate's metrics to the recorder installed now (see
    /// [`metric::describe`](crate::metric::describe)).
    pub fn new(store: S) -> Self {
        Limiter::builder(store).assemble()
    }

    /// A builder for a limiter over `store` with settings of your own; each
    /// is checked once, by [`LimiterBuilder::build`].
    ///
    /// ```
    /// use platformkit_limit::{Limiter, Memory};
    /// use std::time::Duration;
    ///
    /// let limiter = Limiter::builder(Memory::new())
    ///     .budget(Duration::from_millis(500))
    ///     .refusal_ttl(Duration::from_secs(2))
    ///     .build()?;
    /// assert_eq!(limiter.budget(), Duration::from_millis(500));
    /// assert!(Limiter::builder(Memory::new()).budget(Duration::ZERO).build().is_err());
    /// # Ok::<(), platformkit_limit::Error>(())
    /// ```
    pub fn builder(store: S) -> LimiterBuilder<S> {
        LimiterBuilder::new(store)
    }

    /// Whether concurrent writes share statements
    /// ([`LimiterBuilder::no_merging`] turns it off).
    pub fn merging(&self) -> bool {
        self.merging.is_some()
    }

    /// With merging on, how many statements of writes may be in flight at
    /// once ([`LimiterBuilder::writes_in_flight`]); `None` with merging off.
    pub fn writes_in_flight(&self) -> Option<usize> {
        self.merging.as_ref().map(Merging::places)
    }

    /// How many keys the refusal cache holds, or `None` when it is off
    /// ([`LimiterBuilder::refusal_cache`]).
    pub fn refusal_cache(&self) -> Option<usize> {
        self.refusals.capacity()
    }

    /// How long the refusal cache answers for a flooded key before asking
    /// the store again ([`LimiterBuilder::refusal_ttl`]).
    pub fn refusal_ttl(&self) -> Duration {
        self.refusals.ttl()
    }

    /// How many keys the local count of
    /// [`WhenUnreachable::CountLocally`](crate::WhenUnreachable::CountLocally) limits may hold
    /// ([`LimiterBuilder::local_keys`]).
    pub fn local_keys(&self) -> usize {
        self.fallback.capacity().unwrap_or(usize::MAX)
    }

    /// How many keys the local count holds now.
    pub fn local_keys_held(&self) -> usize {
        self.fallback.len()
    }

    /// The budget of every call ([`LimiterBuilder::budget`]).
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Reads the verdict for an attempt before it is made; writes nothing.
    ///
    /// Allowed while the key's failures in the current window are fewer than
    /// the limit's `max`.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub async fn check(&self, limit: &Limit, key: &Key) -> Result<Verdict, Error> {
        self.counted(Counting::CHECK, limit, key, NonZeroU32::MIN)
            .await
    }

    /// Records a failed attempt (a wrong password, a wrong code). The verdict
    /// says whether the next attempt may go ahead.
    ///
    /// When the store is unreachable the verdict does not count this
    /// failure, and says so. If the budget ran out while the call was
    /// already in flight, the server may still record it: the request was
    /// sent, and the server finishes it alone.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub async fn failed(&self, limit: &Limit, key: &Key) -> Result<Verdict, Error> {
        self.counted(Counting::FAILED, limit, key, NonZeroU32::MIN)
            .await
    }

    /// Counts this attempt and says whether it may go ahead, in one
    /// statement: for routes where every ask counts, such as "forgot my
    /// password". Refused asks are counted too. Awaited as it is, it asks
    /// one unit; [`Ask::cost`] asks more.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub fn hit<'l, 'p>(&'l self, limit: &'p Limit, key: &'p Key) -> Ask<'l, 'p, S, Verdict> {
        Ask::one(self, Counting::HIT, limit, key)
    }

    /// Counts this attempt **before** the work it guards and, when the limit
    /// allows it, hands back a [`Permit`]: at most `max` attempts per window
    /// can hold one, however many arrive at once.
    ///
    /// `check` then `failed` races: a thousand concurrent requests all pass
    /// the check before the first failure is written. `reserve` closes that
    /// hole: the attempt is counted in the same statement that decides.
    /// Report [`Permit::succeeded`] after a success to take the attempt
    /// back (or clear the key, as the limit's [`OnSuccess`](crate::OnSuccess)
    /// says); a permit dropped without a report stays counted as a failure,
    /// the safe default.
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, Memory, Reservation};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let code = Limit::new("redeem", 3, Duration::from_secs(60))?;
    /// let order = Key::opaque("order-7");
    /// match limiter.reserve(&code, &order).await? {
    ///     Reservation::Granted(permit) => {
    ///         let code_was_right = true; // the guarded work
    ///         if code_was_right {
    ///             permit.succeeded().await?;
    ///         }
    ///     }
    ///     Reservation::Refused(verdict) => {
    ///         let _retry_after = verdict.retry_after();
    ///     }
    /// }
    /// assert_eq!(limiter.check(&code, &order).await?.count(), Some(0));
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is decided by
    /// the limit's [`WhenUnreachable`](crate::WhenUnreachable).
    pub fn reserve<'l, 'p>(
        &'l self,
        limit: &'p Limit,
        key: &'p Key,
    ) -> Ask<'l, 'p, S, Reservation<'l, S>> {
        Ask::one(self, Counting::RESERVE, limit, key)
    }

    /// Clears the key under `limit`: its current window and any older ones.
    /// The caller's choice, for example after a good login. Returns how
    /// many windows the store held for the key: 0 when it held none (a key
    /// never counted, or one of another spelling: an operator's tool says
    /// so).
    ///
    /// # Errors
    ///
    /// Any failure, unreachable included (see [`Error::is_unreachable`]):
    /// nothing is allowed or refused by a reset, so there is nothing to fail
    /// open to.
    pub async fn reset(&self, limit: &Limit, key: &Key) -> Result<u64, Error> {
        self.reset_stored(limit, &stored(limit.name(), key)).await
    }

    async fn counted(
        &self,
        op: Counting,
        limit: &Limit,
        key: &Key,
        cost: NonZeroU32,
    ) -> Result<Verdict, Error> {
        let mut counted = self.counted_all_in(op, &[(limit, key)], cost).await?;
        Ok(counted.swap_remove(0).0)
    }
}
