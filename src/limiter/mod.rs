//! [`Limiter`]: the front. Check before an attempt, record a failure after
//! it, or do both at once.

mod ask;
mod builder;
mod clear;
mod permit;
mod several;

pub use builder::LimiterBuilder;
pub use permit::{Permit, Permits, Reservation, Reservations};

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::RefusalCache;

use self::permit::CountedIn;
use crate::key::stored;
use crate::merge::Merging;
use crate::operation::Counting;
use crate::store::Store;
use crate::{Error, Key, Limit, Memory, Verdict};

/// The front of the crate: `check`, `failed`, `hit`, `reserve` and `reset`,
/// `hit_n` and `reserve_n` for an ask of a cost of its own, and
/// `check_all`, `failed_all`, `hit_all`, `hit_all_n`, `reserve_all` and
/// `reserve_all_n` over several limits at once, over a store,
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
    /// password". Refused asks are counted too.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub async fn hit(&self, limit: &Limit, key: &Key) -> Result<Verdict, Error> {
        self.hit_n(limit, key, NonZeroU32::MIN).await
    }

    /// [`hit`](Limiter::hit) for an ask that costs `cost` units of the
    /// limit (an upload of 10 MB, a batch of 50 items, a search that costs
    /// 5), in the same one statement: `hit` is a cost of 1.
    ///
    /// The cost is a [`NonZeroU32`]: an ask of nothing is not an ask, so
    /// a cost of 0 cannot be written, and `max` is a `u32` too. The ask
    /// may go ahead when the count after it is at most `max` (for a
    /// sliding limit: the estimate after it less one is below `max`, as
    /// for `cost` asks of one in a row); [`Verdict::count`] is the count
    /// after it.
    ///
    /// - **A refused ask is counted**, its whole cost, as every
    ///   [`hit`](Limiter::hit) is: asking spends the quota. So an ask that
    ///   would pass `max` from the current count is refused and leaves the
    ///   window full: the asks after it are refused too until it reopens.
    ///   [`Verdict::retry_after`] is when an ask of the same cost may go
    ///   ahead (a smaller one may sooner, with a sliding limit).
    /// - **A cost above `max`** is refused at once, with no round trip and
    ///   nothing counted (never an error): no window could ever allow it.
    ///   The verdict says so ([`Verdict::exceeds_max`]); it has no count
    ///   ([`Verdict::count`] is `None`) and no
    ///   [`retry_after`](Verdict::retry_after), as waiting would not help.
    /// - The refusal cache answers a refusal only to asks of at least the
    ///   cost refused, and merging adds each caller's own cost (the
    ///   [guide](crate::guide#the-refusal-cache)).
    /// - The metrics count calls, not cost units: one `hit` per call
    ///   ([`metric`](crate::metric)).
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, Memory};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let quota = Limit::new("api", 100, Duration::from_secs(60))?;
    /// let client = Key::opaque("client-9");
    /// let cost = |n| NonZeroU32::new(n).unwrap();
    ///
    /// let verdict = limiter.hit_n(&quota, &client, cost(60)).await?;
    /// assert!(verdict.is_allowed());
    /// assert_eq!(verdict.remaining(), Some(40));
    ///
    /// // 60 + 50 would pass 100: refused, and counted.
    /// let verdict = limiter.hit_n(&quota, &client, cost(50)).await?;
    /// assert!(verdict.is_refused());
    /// assert_eq!(verdict.count(), Some(110));
    /// assert!(limiter.hit(&quota, &client).await?.is_refused());
    ///
    /// // More than the limit ever allows: refused at once, nothing counted.
    /// let verdict = limiter.hit_n(&quota, &Key::opaque("client-10"), cost(101)).await?;
    /// assert!(verdict.is_refused() && verdict.exceeds_max());
    /// assert_eq!((verdict.count(), verdict.retry_after()), (None, None));
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub async fn hit_n(
        &self,
        limit: &Limit,
        key: &Key,
        cost: NonZeroU32,
    ) -> Result<Verdict, Error> {
        self.counted(Counting::HIT, limit, key, cost).await
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
    pub async fn reserve(&self, limit: &Limit, key: &Key) -> Result<Reservation<'_, S>, Error> {
        self.reserve_n(limit, key, NonZeroU32::MIN).await
    }

    /// [`reserve`](Limiter::reserve) for an attempt that costs `cost`
    /// units, decided as [`hit_n`](Limiter::hit_n) decides (a refused
    /// attempt counted, a cost above `max` refused at once with nothing
    /// counted); [`Permit::succeeded`] takes the whole cost back.
    /// `reserve` is a cost of 1.
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, Memory, Reservation};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let exports = Limit::new("exports", 100, Duration::from_secs(3600))?;
    /// let tenant = Key::opaque("tenant-3");
    /// let rows = NonZeroU32::new(30).unwrap();
    /// if let Reservation::Granted(permit) = limiter.reserve_n(&exports, &tenant, rows).await? {
    ///     assert_eq!(permit.verdict().count(), Some(30));
    ///     permit.succeeded().await?; // takes the 30 back
    /// }
    /// assert_eq!(limiter.check(&exports, &tenant).await?.count(), Some(0));
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Limiter::reserve`].
    pub async fn reserve_n(
        &self,
        limit: &Limit,
        key: &Key,
        cost: NonZeroU32,
    ) -> Result<Reservation<'_, S>, Error> {
        let stored = stored(limit.name(), key);
        let (verdict, counted_in) = self.run(Counting::RESERVE, limit, &stored, cost).await?;
        Ok(Permit::reservation(
            self,
            limit,
            stored,
            verdict,
            (counted_in, cost),
        ))
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
        let stored = stored(limit.name(), key);
        self.run(op, limit, &stored, cost)
            .await
            .map(|(verdict, _)| verdict)
    }

    /// Runs one counting operation of `cost` for a stored key:
    /// [`run_all`](Limiter::run_all) with one pair.
    pub(crate) async fn run(
        &self,
        op: Counting,
        limit: &Limit,
        key: &str,
        cost: NonZeroU32,
    ) -> Result<(Verdict, CountedIn), Error> {
        let mut ran = self.run_all(op, &[(limit, key.to_owned())], cost).await?;
        Ok(ran.pop().expect("one verdict per pair"))
    }
}
