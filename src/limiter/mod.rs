//! [`Limiter`]: the front.

mod builder;
mod clear;
mod permit;
pub(crate) mod run;
mod status;

pub use builder::LimiterBuilder;
pub use permit::{Permit, Permits, Reservation, Reservations};
pub use run::Ask;
pub use status::KeyStatus;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::RefusalCache;

use crate::decide::Counting;
use crate::key::stored;
use crate::merge::Merging;
use crate::store::Store;
use crate::{Error, Key, Limit, Memory, Verdict, Verdicts};

/// The front of the crate, over [`Postgres`](crate::Postgres) or
/// [`Memory`]; the [crate docs](crate) show a login.
///
/// Every call ends within the budget ([`LimiterBuilder::budget`]) and is
/// never a silent allow: a store found down leaves the verdict to the
/// limit's [`WhenUnreachable`](crate::WhenUnreachable), one up but slow
/// sheds the call ([`Verdict::is_shed`]), any other failure is an [`Error`]
/// ([one call's path](crate::guide#one-calls-path)).
#[derive(Debug)]
pub struct Limiter<S> {
    store: Arc<S>,
    budget: Duration,
    /// The count of `CountLocally` limits while the store is unreachable.
    fallback: Memory,
    refusals: RefusalCache,
    merging: Option<Merging>,
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store` with every default (the table on
    /// [`LimiterBuilder`]). Describes the crate's metrics to the recorder
    /// installed now ([`metric::describe`](crate::metric::describe)).
    pub fn new(store: S) -> Self {
        Limiter::builder(store).assemble()
    }

    /// A builder for a limiter over `store` with settings of your own.
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

    /// Whether merging is on ([`LimiterBuilder::no_merging`]).
    pub fn merging(&self) -> bool {
        self.merging.is_some()
    }

    /// The most statements of writes in flight at once
    /// ([`LimiterBuilder::writes_in_flight`]); `None` with merging off.
    pub fn writes_in_flight(&self) -> Option<usize> {
        self.merging.as_ref().map(Merging::most)
    }

    /// How many keys the refusal cache may hold
    /// ([`LimiterBuilder::refusal_cache`]); `None` when it is off.
    pub fn refusal_cache(&self) -> Option<usize> {
        self.refusals.capacity()
    }

    /// The refusal cache's TTL ([`LimiterBuilder::refusal_ttl`]).
    pub fn refusal_ttl(&self) -> Duration {
        self.refusals.ttl()
    }

    /// How many keys the local count may hold ([`LimiterBuilder::local_keys`]).
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
    /// Allowed while the key's failures are fewer than the limit's `max`.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub async fn check(&self, limit: &Limit, key: &Key) -> Result<Verdict, Error> {
        self.counted(Counting::CHECK, limit, key, NonZeroU32::MIN)
            .await
    }

    /// Records a failed attempt (a wrong password, a wrong code); the verdict
    /// says whether the next may go ahead. A call whose budget ran out in
    /// flight may still be counted by the server.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub async fn failed(&self, limit: &Limit, key: &Key) -> Result<Verdict, Error> {
        self.counted(Counting::FAILED, limit, key, NonZeroU32::MIN)
            .await
    }

    /// Counts this ask and says whether it may go ahead, in one statement:
    /// for routes where every ask counts, refused ones too ("forgot my
    /// password", an API). [`Ask::cost`] asks more than one unit.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub fn hit<'l, 'p>(&'l self, limit: &'p Limit, key: &'p Key) -> Ask<'l, 'p, S, Verdict> {
        Ask::one(self, Counting::HIT, limit, key)
    }

    /// Counts this attempt **before** the work it guards and, when the limit
    /// allows it, hands back a [`Permit`]: at most `max` attempts per window
    /// hold one, however many arrive at once.
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
    /// As [`Limiter::check`].
    pub fn reserve<'l, 'p>(
        &'l self,
        limit: &'p Limit,
        key: &'p Key,
    ) -> Ask<'l, 'p, S, Reservation<'l, S>> {
        Ask::one(self, Counting::RESERVE, limit, key)
    }

    /// Clears the key under `limit`, every window of it (after a good login,
    /// say), but an operator's [block](Limiter::block), which it keeps; how
    /// many windows the store held (0: never counted, or another spelling).
    ///
    /// # Errors
    ///
    /// Any failure, unreachable included ([`Error::is_unreachable`]): a
    /// reset decides nothing, so there is nothing to fail open to.
    pub async fn reset(&self, limit: &Limit, key: &Key) -> Result<u64, Error> {
        self.reset_stored(limit, &stored(limit.name(), key)).await
    }

    /// As [`check`](Limiter::check), over several (limit, key) pairs in one
    /// statement: a login's per-account and per-address limits at once.
    /// The verdicts come in the order given; [`Verdicts::refused_by`] says
    /// which limit refused.
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, Memory};
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let per_account = Limit::new("login-account", 5, Duration::from_secs(900))?;
    /// let per_address = Limit::new("login-address", 1, Duration::from_secs(900))?;
    /// let account = Key::email("alice@example.com");
    /// let address = Key::ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
    /// let both = [(&per_account, &account), (&per_address, &address)];
    ///
    /// limiter.failed_all(&both).await?;
    /// let verdicts = limiter.check_all(&both).await?;
    /// assert!(verdicts.is_refused());
    /// assert_eq!(verdicts.refused_by().map(|v| v.limit()), Some("login-address"));
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) for no
    /// pairs or more than [`Limiter::MAX_PAIRS`]; otherwise as [`Limiter::check`].
    pub async fn check_all(&self, pairs: &[(&Limit, &Key)]) -> Result<Verdicts, Error> {
        self.counted_all(Counting::CHECK, pairs, NonZeroU32::MIN)
            .await
    }

    /// As [`failed`](Limiter::failed), over several pairs in one statement.
    /// Concurrent calls cannot deadlock, whatever their order.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`].
    pub async fn failed_all(&self, pairs: &[(&Limit, &Key)]) -> Result<Verdicts, Error> {
        self.counted_all(Counting::FAILED, pairs, NonZeroU32::MIN)
            .await
    }

    /// As [`hit`](Limiter::hit), over several pairs in one statement: the
    /// ask is counted under every limit, and goes ahead only if all allow it.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`].
    pub fn hit_all<'l, 'p>(
        &'l self,
        pairs: &'p [(&'p Limit, &'p Key)],
    ) -> Ask<'l, 'p, S, Verdicts> {
        Ask::all(self, Counting::HIT, pairs)
    }

    /// As [`hit_all`](Limiter::hit_all), all or nothing: the cost is counted
    /// under every limit if all allow it, under none if one refuses
    /// ([all or nothing](crate::guide#api-quotas)).
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, ManualClock, Memory};
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    /// let limiter = Limiter::new(Memory::new().with_clock(clock.clone()));
    /// let per_second = Limit::new("api-second", 2, Duration::from_secs(1))?;
    /// let per_day = Limit::new("api-day", 5, Duration::from_secs(86_400))?;
    /// let client = Key::opaque("client-9");
    /// let both = [(&per_second, &client), (&per_day, &client)];
    ///
    /// limiter.hit_all_or_nothing(&both).await?;
    /// limiter.hit_all_or_nothing(&both).await?;
    /// let third = limiter.hit_all_or_nothing(&both).await?;
    /// assert_eq!(third.refused_by().map(|v| v.limit()), Some("api-second"));
    /// // The refusal spent none of the day's quota.
    /// assert_eq!(limiter.check(&per_day, &client).await?.count(), Some(2));
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.hit_all_or_nothing(&both).await?.is_allowed());
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`], and
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) for a
    /// (limit, key) pair given twice.
    pub fn hit_all_or_nothing<'l, 'p>(
        &'l self,
        pairs: &'p [(&'p Limit, &'p Key)],
    ) -> Ask<'l, 'p, S, Verdicts> {
        Ask::all(self, Counting::HIT_ALL_OR_NOTHING, pairs)
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
