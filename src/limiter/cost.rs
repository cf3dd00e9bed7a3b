//! [`Ask`]: an ask of `hit`, `reserve` or their `_all` forms.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::pin::Pin;

use crate::operation::Counting;
use crate::store::Store;
use crate::{Error, Key, Limit, Limiter, Reservation, Reservations, Verdict, Verdicts};

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
