//! [`Limiter`]: the front. Check before an attempt, record a failure after
//! it, or do both at once.

use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::key::stored;
use crate::metric::{self, Outcome};
use crate::store::{Op, Store};
use crate::verdict::decide;
use crate::{Error, Key, Limit, Verdict};

/// The default budget of one call: 2 seconds.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(2);

/// The longest budget a limiter accepts: a minute. A login that waits longer
/// on its limiter has a bigger problem.
pub const MAX_BUDGET: Duration = Duration::from_secs(60);

/// The front of the crate: `check`, `failed`, `hit` and `reset` over a store,
/// [`Postgres`](crate::Postgres) in production or [`Memory`](crate::Memory)
/// in tests.
///
/// Every call, getting the connection included, ends within the budget
/// (2 seconds unless set with [`Limiter::with_budget`]). When the store
/// cannot be reached within it, the attempt is **allowed**, the verdict says
/// so ([`Verdict::is_unreachable`]) and the `unreachable` outcome is counted:
/// fail-open, loudly. Any other failure (a missing table, a missing privilege,
/// a connection handed over inside a transaction) is an [`Error`], never a
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
    store: S,
    budget: Duration,
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store`, with the default budget of 2 seconds.
    ///
    /// Describes the crate's metrics to the recorder installed now (see
    /// [`metric::describe`]).
    pub fn new(store: S) -> Self {
        metric::describe();
        Limiter {
            store,
            budget: DEFAULT_BUDGET,
        }
    }

    /// Sets the budget of every call: the longest a call may take, getting
    /// the connection included, before the store counts as unreachable.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) when the
    /// budget is shorter than a millisecond or longer than [`MAX_BUDGET`].
    pub fn with_budget(mut self, budget: Duration) -> Result<Self, Error> {
        if budget < Duration::from_millis(1) {
            return Err(Error::invalid_option(
                "budget",
                "the budget must be at least one millisecond",
            ));
        }
        if budget > MAX_BUDGET {
            return Err(Error::invalid_option(
                "budget",
                "the budget must be at most 60 seconds",
            ));
        }
        self.budget = budget;
        Ok(self)
    }

    /// The budget of every call.
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
        self.counted(Op::Check, limit, key).await
    }

    /// Records a failed attempt (a wrong password, a wrong code). The verdict
    /// says whether the next attempt may go ahead.
    ///
    /// When the store is unreachable the failure is not recorded, and the
    /// verdict says so.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub async fn failed(&self, limit: &Limit, key: &Key) -> Result<Verdict, Error> {
        self.counted(Op::Failed, limit, key).await
    }

    /// Counts this attempt and says whether it may go ahead, in one
    /// statement: for routes where every ask counts, such as "forgot my
    /// password". Refused asks are counted too.
    ///
    /// # Errors
    ///
    /// A hard failure (see [`Limiter`]); an unreachable store is a verdict.
    pub async fn hit(&self, limit: &Limit, key: &Key) -> Result<Verdict, Error> {
        self.counted(Op::Hit, limit, key).await
    }

    /// Clears the key under `limit`: its current window and any older ones.
    /// The caller's choice, for example after a good login.
    ///
    /// # Errors
    ///
    /// Any failure, unreachable included (see [`Error::is_unreachable`]):
    /// nothing is allowed or refused by a reset, so there is nothing to fail
    /// open to.
    pub async fn reset(&self, limit: &Limit, key: &Key) -> Result<(), Error> {
        let started = Instant::now();
        let deadline = started + self.budget;
        let key = stored(limit.name(), key);
        let result = match timeout_at(deadline, self.store.reset(&key, deadline)).await {
            Ok(result) => result.map(drop),
            Err(_) => Err(Error::timeout("reset", self.budget)),
        };
        let outcome = match &result {
            Ok(()) => Outcome::Cleared,
            Err(e) if e.is_unreachable() => {
                crate::trace::unreachable(limit.name(), "reset", e);
                Outcome::Unreachable
            }
            Err(_) => Outcome::Error,
        };
        metric::record(limit, "reset", outcome, started.elapsed());
        result
    }

    async fn counted(&self, op: Op, limit: &Limit, key: &Key) -> Result<Verdict, Error> {
        let started = Instant::now();
        let deadline = started + self.budget;
        let key = stored(limit.name(), key);
        let result = match timeout_at(deadline, self.store.count(op, limit, &key, deadline)).await {
            Ok(result) => result,
            Err(_) => Err(Error::timeout(op.name(), self.budget)),
        };
        let (result, outcome) = match result {
            Ok(counted) => {
                let verdict = decide(op, limit, &counted);
                let outcome = if verdict.is_allowed() {
                    Outcome::Allowed
                } else {
                    Outcome::Refused
                };
                (Ok(verdict), outcome)
            }
            Err(e) if e.is_unreachable() => {
                crate::trace::unreachable(limit.name(), op.name(), &e);
                (Ok(Verdict::unreachable_because(e)), Outcome::Unreachable)
            }
            Err(e) => (Err(e), Outcome::Error),
        };
        metric::record(limit, op.name(), outcome, started.elapsed());
        result
    }
}
