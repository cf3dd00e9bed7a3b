//! How a counting call runs, whatever its pairs and cost: [`Ask`], [`Call`],
//! `run_all` and `ask` ([one call's path](crate::guide#one-calls-path)).

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use snafu::ensure;
use tokio::time::{Instant, timeout_at};

use super::permit::CountedIn;
use crate::cache::{Lookup, Refresh};
use crate::decide::{Counting, decide};
use crate::error::InvalidOptionSnafu;
use crate::key::stored;
use crate::metric::{self, Operation, Outcome, Source};
use crate::store::sealed::Sealed;
use crate::store::{Asked, Store, count_pairs};
use crate::trace::Decided;
use crate::{
    Error, Key, Limit, Limiter, Reservation, Reservations, Verdict, Verdicts, WhenUnreachable,
};

/// An ask not yet sent: await it to ask one unit, or set its
/// [`cost`](Ask::cost) first. An ask of `n` units is decided as `n` asks of
/// one in a row would be ([API quotas](crate::guide#api-quotas)). An
/// `Ask` is an [`IntoFuture`], boxed once when awaited; where a [`Future`]
/// itself is wanted (`join_all`, `Box::pin`), call `into_future()`.
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
/// let verdict = limiter.hit(&quota, &client).cost(cost(60)).await?;
/// assert_eq!(verdict.remaining(), Some(40));
///
/// // 60 + 50 would pass 100: refused, and counted.
/// let verdict = limiter.hit(&quota, &client).cost(cost(50)).await?;
/// assert!(verdict.is_refused());
/// assert_eq!(verdict.count(), Some(110));
///
/// // More than the limit ever allows: refused at once, nothing counted.
/// let verdict = limiter.hit(&quota, &Key::opaque("client-10")).cost(cost(101)).await?;
/// assert!(verdict.is_refused() && verdict.exceeds_max());
/// assert_eq!((verdict.count(), verdict.retry_after()), (None, None));
/// # Ok::<(), platformkit_limit::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "an ask does nothing until it is awaited"]
pub struct Ask<'l, 'p, S, T> {
    limiter: &'l Limiter<S>,
    pairs: Pairs<'p>,
    op: Counting,
    cost: NonZeroU32,
    answer: PhantomData<fn() -> T>,
}

/// What an ask is of: one (limit, key) pair, or several in one statement.
#[derive(Clone, Copy)]
enum Pairs<'p> {
    One([(&'p Limit, &'p Key); 1]),
    All(&'p [(&'p Limit, &'p Key)]),
}

impl<'p> Pairs<'p> {
    fn as_slice(&self) -> &[(&'p Limit, &'p Key)] {
        match self {
            Pairs::One(one) => one,
            Pairs::All(all) => all,
        }
    }
}

impl<'l, 'p, S, T> Ask<'l, 'p, S, T> {
    pub(crate) fn one(
        limiter: &'l Limiter<S>,
        op: Counting,
        limit: &'p Limit,
        key: &'p Key,
    ) -> Self {
        Ask::new(limiter, op, Pairs::One([(limit, key)]))
    }

    pub(crate) fn all(
        limiter: &'l Limiter<S>,
        op: Counting,
        pairs: &'p [(&'p Limit, &'p Key)],
    ) -> Self {
        Ask::new(limiter, op, Pairs::All(pairs))
    }

    fn new(limiter: &'l Limiter<S>, op: Counting, pairs: Pairs<'p>) -> Self {
        Ask {
            limiter,
            pairs,
            op,
            cost: NonZeroU32::MIN,
            answer: PhantomData,
        }
    }

    /// Asks `cost` units of every limit asked instead of one: a batch of 50
    /// items, say. A cost above a limit's `max` is refused at once, nothing
    /// counted ([`Verdict::exceeds_max`]).
    pub fn cost(mut self, cost: NonZeroU32) -> Self {
        self.cost = cost;
        self
    }
}

impl<S, T> std::fmt::Debug for Ask<'_, '_, S, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ask")
            .field("op", &self.op)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

/// The future an [`Ask`] becomes when awaited.
type Asking<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

impl<'l: 'p, 'p, S: Store> IntoFuture for Ask<'l, 'p, S, Verdict> {
    type Output = Result<Verdict, Error>;
    type IntoFuture = Asking<'p, Verdict>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let pairs = self.pairs.as_slice();
            let mut counted = self
                .limiter
                .counted_all_in(self.op, pairs, self.cost)
                .await?;
            Ok(counted.swap_remove(0).0)
        })
    }
}

impl<'l: 'p, 'p, S: Store> IntoFuture for Ask<'l, 'p, S, Verdicts> {
    type Output = Result<Verdicts, Error>;
    type IntoFuture = Asking<'p, Verdicts>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let pairs = self.pairs.as_slice();
            self.limiter.counted_all(self.op, pairs, self.cost).await
        })
    }
}

impl<'l: 'p, 'p, S: Store> IntoFuture for Ask<'l, 'p, S, Reservation<'l, S>> {
    type Output = Result<Reservation<'l, S>, Error>;
    type IntoFuture = Asking<'p, Reservation<'l, S>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let reserved = self
                .limiter
                .reserved(self.pairs.as_slice(), self.cost)
                .await?;
            Ok(reserved.one())
        })
    }
}

impl<'l: 'p, 'p, S: Store> IntoFuture for Ask<'l, 'p, S, Reservations<'l, S>> {
    type Output = Result<Reservations<'l, S>, Error>;
    type IntoFuture = Asking<'p, Reservations<'l, S>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            self.limiter
                .reserved(self.pairs.as_slice(), self.cost)
                .await
        })
    }
}

impl<S: Store> Limiter<S> {
    pub(super) async fn counted_all(
        &self,
        op: Counting,
        pairs: &[(&Limit, &Key)],
        cost: NonZeroU32,
    ) -> Result<Verdicts, Error> {
        let counted = self.counted_all_in(op, pairs, cost).await?;
        let verdicts: Vec<Verdict> = counted.into_iter().map(|(verdict, _)| verdict).collect();
        Ok(verdicts.into())
    }

    /// Each pair's verdict, and where it was counted.
    pub(crate) async fn counted_all_in(
        &self,
        op: Counting,
        pairs: &[(&Limit, &Key)],
        cost: NonZeroU32,
    ) -> Result<Vec<(Verdict, CountedIn)>, Error> {
        ensure!(
            !pairs.is_empty(),
            InvalidOptionSnafu {
                option: "pairs",
                reason: "give at least one (limit, key) pair: no pairs would allow everything",
            }
        );
        ensure!(
            pairs.len() <= Limiter::MAX_PAIRS,
            InvalidOptionSnafu {
                option: "pairs",
                reason: format!(
                    "at most {} (limit, key) pairs in one call",
                    Limiter::MAX_PAIRS
                ),
            }
        );
        let stored: Vec<(&Limit, String)> = pairs
            .iter()
            .map(|(limit, key)| (*limit, stored(limit.name(), key)))
            .collect();
        ensure!(
            !op.all_or_nothing()
                || stored
                    .iter()
                    .enumerate()
                    .all(|(i, (_, key))| stored[..i].iter().all(|(_, k)| k != key)),
            InvalidOptionSnafu {
                option: "pairs",
                reason: "an all-or-nothing call decides each (limit, key) pair by its own count: give each pair once",
            }
        );
        self.run_all(op, &stored, cost).await
    }

    /// The one path of every counting call, whatever its pairs and cost
    /// ([one call's path](crate::guide#one-calls-path)).
    pub(crate) async fn run_all(
        &self,
        op: Counting,
        stored: &[(&Limit, String)],
        cost: NonZeroU32,
    ) -> Result<Vec<(Verdict, CountedIn)>, Error> {
        // `counted_all_in` checked the number.
        debug_assert!(
            (1..=Limiter::MAX_PAIRS).contains(&stored.len()),
            "between one and Limiter::MAX_PAIRS pairs"
        );
        let call = Call::start(op.operation(), self.budget);
        let asked_at = self.store.local_now();
        let mut refreshes: Vec<Option<Refresh>> = Vec::with_capacity(stored.len());
        let mut cached: Vec<Option<Verdict>> = Vec::with_capacity(stored.len());
        for (i, (limit, key)) in stored.iter().enumerate() {
            if cost.get() > limit.max() {
                cached.push(Some(Verdict::over_max(limit)));
                refreshes.push(None);
                continue;
            }
            // A key given twice is looked up once: the second lookup would
            // find the first's claim to refresh, and refuse.
            if let Some(first) = stored[..i].iter().position(|(_, k)| k == key) {
                cached.push(cached[first].clone());
                refreshes.push(None);
                continue;
            }
            match self
                .refusals
                .get(key, (cost.get(), limit.max()), asked_at, self.budget)
            {
                Lookup::Refused(verdict) => {
                    cached.push(Some(verdict));
                    refreshes.push(None);
                }
                Lookup::Ask(refresh) => {
                    cached.push(None);
                    refreshes.push(refresh);
                }
            }
        }
        if cached.iter().all(Option::is_none) {
            return self.ask(op, &call, asked_at, stored, cost, refreshes).await;
        }
        // Refused without a round trip. A failure happened all the same: a
        // `failed` is counted under the other pairs. Other claims end here.
        let rest: Vec<(&Limit, String)> = stored
            .iter()
            .zip(&cached)
            .filter(|(_, cached)| cached.is_none())
            .map(|((limit, key), _)| (*limit, key.clone()))
            .collect();
        let mut asked = if op == Counting::FAILED && !rest.is_empty() {
            let refreshes = refreshes
                .into_iter()
                .zip(&cached)
                .filter(|(_, cached)| cached.is_none())
                .map(|(refresh, _)| refresh)
                .collect();
            Some(
                self.ask(op, &call, asked_at, &rest, cost, refreshes)
                    .await?
                    .into_iter(),
            )
        } else {
            drop(refreshes);
            None
        };
        Ok(stored
            .iter()
            .zip(cached)
            .map(|((limit, _), cached)| match cached {
                Some(verdict) => {
                    let source = if verdict.exceeds_max() {
                        Source::Cost
                    } else {
                        Source::Cache
                    };
                    call.record_from(limit, Outcome::Refused, source);
                    (verdict, CountedIn::Nowhere)
                }
                None => asked
                    .as_mut()
                    .and_then(Iterator::next)
                    .unwrap_or_else(|| (Verdict::not_asked(limit), CountedIn::Nowhere)),
            })
            .collect())
    }

    /// Asks the store for the pairs in one statement, each with its claim to
    /// refresh a cached refusal, if it holds one.
    pub(super) async fn ask(
        &self,
        op: Counting,
        call: &Call,
        asked_at: std::time::SystemTime,
        stored: &[(&Limit, String)],
        cost: NonZeroU32,
        refreshes: Vec<Option<Refresh>>,
    ) -> Result<Vec<(Verdict, CountedIn)>, Error> {
        debug_assert!(!stored.is_empty(), "a statement for no pairs");
        debug_assert_eq!(stored.len(), refreshes.len(), "one claim per pair");
        let deadline = call.deadline();
        let n = u64::from(cost.get());
        // The counts, and whether the cost was added (not by an
        // all-or-nothing call a pair refused). Boxed: a store's future is
        // large, and a caller's should not carry it.
        let counting = Box::pin(async {
            let asked: Vec<Asked<'_>> = stored
                .iter()
                .map(|(limit, key)| Asked { limit, key, n })
                .collect();
            match &self.merging {
                Some(merging) => merging.count(&self.store, op, &asked, deadline).await,
                None => count_pairs(&*self.store, op, &asked, deadline).await,
            }
        });
        match call.within_store(&*self.store, counting).await {
            Ok((counted, added)) => {
                // One count per pair, in order (`Postgres` errs otherwise).
                debug_assert_eq!(counted.len(), stored.len(), "one count per pair");
                let verdicts = stored
                    .iter()
                    .zip(&counted)
                    .map(|((limit, _), counted)| {
                        if added {
                            decide(op, limit, cost.get(), counted)
                        } else {
                            // Not counted: what an ask of the cost finds.
                            decide(Counting::CHECK, limit, cost.get(), counted)
                        }
                    })
                    .collect();
                let verdicts = refused_unless_added(added, verdicts);
                Ok(stored
                    .iter()
                    .zip(counted)
                    .zip(verdicts)
                    .zip(refreshes)
                    .map(|((((limit, key), counted), verdict), refresh)| {
                        self.refusals.answered(
                            key,
                            &verdict,
                            (cost.get(), limit.max()),
                            asked_at,
                            refresh,
                        );
                        let outcome = if verdict.is_allowed() {
                            Outcome::Allowed
                        } else {
                            Outcome::Refused
                        };
                        call.record(limit, outcome);
                        let counted_in = if added {
                            let window_start = counted.window_start(limit);
                            CountedIn::Store { window_start }
                        } else {
                            CountedIn::Nowhere
                        };
                        (verdict, counted_in)
                    })
                    .collect())
            }
            Err(e) if e.is_unreachable() => {
                let cause = Arc::new(e);
                Ok(stored
                    .iter()
                    .zip(refreshes)
                    .map(|((limit, key), refresh)| {
                        self.refusals.unanswered(refresh);
                        call.record_unreachable(limit, &cause);
                        self.when_unreachable(op, limit, key, cost, cause.clone())
                    })
                    .collect())
            }
            Err(e) if e.is_overloaded() => {
                let cause = Arc::new(e);
                Ok(stored
                    .iter()
                    .zip(refreshes)
                    .map(|((limit, _), refresh)| {
                        self.refusals.unanswered(refresh);
                        call.record_shed(limit, &cause);
                        (Verdict::shed_by(limit, cause.clone()), CountedIn::Nowhere)
                    })
                    .collect())
            }
            Err(e) => {
                for (limit, _) in stored {
                    call.record(limit, Outcome::Error);
                }
                Err(e)
            }
        }
    }

    /// The verdict when the store could not be reached: the limit decides.
    pub(super) fn when_unreachable(
        &self,
        op: Counting,
        limit: &Limit,
        key: &str,
        cost: NonZeroU32,
        cause: Arc<Error>,
    ) -> (Verdict, CountedIn) {
        match limit.when_unreachable() {
            WhenUnreachable::Refuse => {
                (Verdict::uncounted(limit, false, cause), CountedIn::Nowhere)
            }
            WhenUnreachable::CountLocally => {
                // On the store's clock, so the local count agrees with it.
                let counted = self.fallback.count_at(
                    op,
                    limit,
                    key,
                    cost.get().into(),
                    self.store.local_now(),
                );
                match counted {
                    Some(counted) => {
                        let window_start = counted.window_start(limit);
                        (
                            decide(op, limit, cost.get(), &counted).because_unreachable(cause),
                            CountedIn::Fallback { window_start },
                        )
                    }
                    // No room to count the key: refused, as `Refuse` would.
                    None => (Verdict::uncounted(limit, false, cause), CountedIn::Nowhere),
                }
            }
            WhenUnreachable::Allow => (Verdict::uncounted(limit, true, cause), CountedIn::Nowhere),
        }
    }
}

/// A call whose cost was not `added` is refused: should every verdict
/// allow it (the store and the crate disagreeing), each becomes a refusal
/// that reopens at once, so that nothing goes ahead uncounted.
fn refused_unless_added(added: bool, verdicts: Vec<Verdict>) -> Vec<Verdict> {
    if added || verdicts.iter().any(Verdict::is_refused) {
        return verdicts;
    }
    verdicts.into_iter().map(Verdict::refused_now).collect()
}

/// One call: an operation within a budget.
#[derive(Debug)]
pub(crate) struct Call {
    operation: Operation,
    budget: Duration,
    started: Instant,
}

impl Call {
    pub(crate) fn start(operation: Operation, budget: Duration) -> Call {
        Call {
            operation,
            budget,
            started: Instant::now(),
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.started + self.budget
    }

    /// Runs `work` within the budget: running out of it is a
    /// [`Timeout`](crate::ErrorKind::Timeout) error, and `work` is dropped.
    pub(crate) async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        timeout_at(self.deadline(), work)
            .await
            .unwrap_or_else(|_| Err(Error::out_of_budget(self.operation, self.budget)))
    }

    /// Runs `work`, a call to `store`, within the budget, a probe telling
    /// down from shed ([down or overloaded](crate::guide#down-or-overloaded)).
    pub(crate) async fn within_store<T, S: Sealed>(
        &self,
        store: &S,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        if store.down_before().await {
            return Err(Error::down(self.operation));
        }
        match self.within(work).await {
            Err(e) if e.is_unreachable() => {
                let down = store.down_after(&e).await;
                Err(e.probed(self.operation, down))
            }
            answered => answered,
        }
    }

    pub(crate) fn record(&self, limit: &Limit, outcome: Outcome) {
        self.record_from(limit, outcome, Source::Store);
    }

    pub(crate) fn record_from(&self, limit: &Limit, outcome: Outcome, source: Source) {
        metric::record_from(
            limit.name_arc(),
            self.operation,
            outcome,
            source,
            self.started.elapsed(),
        );
    }

    pub(crate) fn record_unreachable(&self, limit: &Limit, cause: &Error) {
        let decided = match limit.when_unreachable() {
            WhenUnreachable::Allow => Decided::Allowed,
            WhenUnreachable::Refuse => Decided::Refused,
            WhenUnreachable::CountLocally => Decided::Locally,
        };
        self.record_unreachable_as(limit, cause, decided);
    }

    fn record_unreachable_as(&self, limit: &Limit, cause: &Error, decided: Decided) {
        crate::trace::unreachable(limit.name(), self.operation, cause, decided);
        self.record(limit, Outcome::Unreachable);
    }

    pub(crate) fn record_shed(&self, limit: &Limit, cause: &Error) {
        crate::trace::shed(limit.name(), self.operation, cause);
        self.record(limit, Outcome::Shed);
    }

    pub(crate) fn record_cleared<T>(&self, limit: &Limit, result: &Result<T, Error>) {
        match result {
            Ok(_) => self.record(limit, Outcome::Cleared),
            Err(e) if e.is_unreachable() => self.record_unreachable_as(limit, e, Decided::Nothing),
            Err(e) if e.is_overloaded() => self.record_shed(limit, e),
            Err(_) => self.record(limit, Outcome::Error),
        }
    }
}
