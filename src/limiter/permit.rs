//! [`Permit`]: an attempt counted before the work it guards; [`Permits`],
//! the same under several limits at once.

use std::num::NonZeroU32;
use std::time::SystemTime;

use super::cost::Ask;
use crate::key::stored;
use crate::operation::Counting;
use crate::store::Store;
use crate::{Error, Key, Limit, Limiter, OnSuccess, Verdict, Verdicts};

/// Where a reserved attempt was counted, and in which window: what a
/// success takes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CountedIn {
    /// In the store, in the window starting at `window_start`.
    Store { window_start: SystemTime },
    /// In the limiter's local fallback, the store being unreachable.
    Fallback { window_start: SystemTime },
    /// Nowhere: the store was unreachable and the limit does not count
    /// locally.
    Nowhere,
}

/// The answer to [`Limiter::reserve`].
#[derive(Debug)]
#[must_use = "a granted permit guards work; a refused verdict must stop it"]
pub enum Reservation<'a, S> {
    /// The attempt is counted and may go ahead.
    Granted(Permit<'a, S>),
    /// The attempt is refused (and was counted, as every ask is, unless its
    /// cost is above the limit's max: [`Verdict::exceeds_max`]).
    Refused(Verdict),
}

impl<S: Store> Reservation<'_, S> {
    /// The verdict, granted or refused.
    pub fn verdict(&self) -> &Verdict {
        match self {
            Reservation::Granted(permit) => permit.verdict(),
            Reservation::Refused(verdict) => verdict,
        }
    }
}

/// An attempt counted up front. Report [`succeeded`](Permit::succeeded)
/// after a success; dropped without a report, it stays counted as a failure.
#[derive(Debug)]
#[must_use = "a permit dropped without a report stays counted as a failure"]
pub struct Permit<'a, S> {
    limiter: &'a Limiter<S>,
    limit: Limit,
    key: String,
    verdict: Verdict,
    /// Where the attempt was counted, and its cost: what a success takes
    /// back.
    counted_in: (CountedIn, NonZeroU32),
}

impl<'a, S: Store> Permit<'a, S> {
    /// The verdict that granted the permit.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The attempt succeeded: take it back (its whole
    /// [cost](crate::limiter::Ask::cost)) from the window it was counted
    /// in, or clear the key, as the limit's [`OnSuccess`] says. When the
    /// store was unreachable at the reservation and nothing counted it,
    /// there is nothing to take back.
    ///
    /// # Errors
    ///
    /// Any failure, unreachable included: the attempt then stays counted,
    /// which errs on the safe side.
    pub async fn succeeded(self) -> Result<(), Error> {
        match self.limit.on_success() {
            OnSuccess::Reset => self
                .limiter
                .reset_stored(&self.limit, &self.key)
                .await
                .map(drop),
            OnSuccess::TakeBack => {
                self.limiter
                    .take_back(&self.limit, &self.key, self.counted_in)
                    .await
            }
        }
    }

    /// The attempt failed: it stays counted. The same as dropping the
    /// permit, said out loud.
    pub fn failed(self) {}
}

/// The answer to [`Limiter::reserve_all`].
#[derive(Debug)]
#[must_use = "granted permits guard work; refused verdicts must stop it"]
pub enum Reservations<'a, S> {
    /// Every limit allows the attempt, and it is counted under each.
    Granted(Permits<'a, S>),
    /// A limit refuses the attempt. It was counted under every limit all the
    /// same, as every ask is, and nothing takes it back.
    Refused(Verdicts),
}

impl<'a, S: Store> Reservations<'a, S> {
    /// The answer for a reservation of one pair.
    pub(crate) fn one(self) -> Reservation<'a, S> {
        match self {
            Reservations::Granted(mut permits) => {
                Reservation::Granted(permits.permits.swap_remove(0))
            }
            Reservations::Refused(verdicts) => Reservation::Refused(
                verdicts
                    .into_iter()
                    .next()
                    .cloned()
                    .expect("one verdict per pair"),
            ),
        }
    }

    /// The verdicts, granted or refused, in the order of the pairs.
    pub fn verdicts(&self) -> &Verdicts {
        match self {
            Reservations::Granted(permits) => permits.verdicts(),
            Reservations::Refused(verdicts) => verdicts,
        }
    }
}

/// One attempt counted up front under several limits: a [`Permit`] per
/// (limit, key) pair. Report [`succeeded`](Permits::succeeded) after a
/// success; dropped without a report, the attempt stays counted under every
/// limit.
#[derive(Debug)]
#[must_use = "permits dropped without a report stay counted as a failure"]
pub struct Permits<'a, S> {
    permits: Vec<Permit<'a, S>>,
    verdicts: Verdicts,
}

impl<S: Store> Permits<'_, S> {
    /// The verdicts that granted the permits, in the order of the pairs.
    pub fn verdicts(&self) -> &Verdicts {
        &self.verdicts
    }

    /// The attempt succeeded: take it back under every limit, each as its
    /// [`OnSuccess`] says ([`Permit::succeeded`] for each pair, one
    /// statement per pair, sent concurrently).
    ///
    /// # Errors
    ///
    /// The first failure among the pairs, unreachable included: that pair's
    /// attempt stays counted (the others are still taken back).
    pub async fn succeeded(self) -> Result<(), Error> {
        let results =
            futures::future::join_all(self.permits.into_iter().map(Permit::succeeded)).await;
        results.into_iter().collect()
    }

    /// The attempt failed: it stays counted under every limit. The same as
    /// dropping the permits, said out loud.
    pub fn failed(self) {}
}

impl<S: Store> Limiter<S> {
    /// [`reserve`](Limiter::reserve) over several (limit, key) pairs: the
    /// attempt is counted under every limit in one statement and one round
    /// trip (the statement of [`hit_all`](Limiter::hit_all)), and may go
    /// ahead only if every limit allows it. On success,
    /// [`Permits::succeeded`] takes it back under each limit.
    ///
    /// A refused attempt stays counted under every limit, the ones that
    /// allowed it included, as a refused [`hit_all`](Limiter::hit_all) does.
    /// With one pair this is [`reserve`](Limiter::reserve), refusal cache and
    /// merging included; with more, the metrics count one `reserve` per
    /// pair. Each permit takes its attempt back from the window the store
    /// counted it in.
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, Memory, Reservations};
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let per_account = Limit::new("login-account", 5, Duration::from_secs(900))?;
    /// let per_address = Limit::new("login-address", 20, Duration::from_secs(900))?;
    /// let account = Key::email("alice@example.com");
    /// let address = Key::ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
    /// let both = [(&per_account, &account), (&per_address, &address)];
    ///
    /// match limiter.reserve_all(&both).await? {
    ///     Reservations::Granted(permits) => {
    ///         let password_was_right = true; // the guarded work
    ///         if password_was_right {
    ///             permits.succeeded().await?;
    ///         }
    ///     }
    ///     Reservations::Refused(verdicts) => {
    ///         let _retry_after = verdicts.retry_after();
    ///     }
    /// }
    /// let counts: Vec<_> = limiter.check_all(&both).await?.iter().map(|v| v.count()).collect();
    /// assert_eq!(counts, [Some(0), Some(0)]);
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`].
    pub fn reserve_all<'l, 'p>(
        &'l self,
        pairs: &'p [(&'p Limit, &'p Key)],
    ) -> Ask<'l, 'p, S, Reservations<'l, S>> {
        Ask::all(self, Counting::RESERVE, pairs)
    }

    /// Counts an attempt of `cost` under every pair, and hands back a permit
    /// for each if every limit allows it.
    pub(crate) async fn reserved(
        &self,
        pairs: &[(&Limit, &Key)],
        cost: NonZeroU32,
    ) -> Result<Reservations<'_, S>, Error> {
        let counted = self.counted_all_in(Counting::RESERVE, pairs, cost).await?;
        let verdicts = Verdicts::from_vec(counted.iter().map(|(v, _)| v.clone()).collect());
        if verdicts.is_refused() {
            return Ok(Reservations::Refused(verdicts));
        }
        let permits = pairs
            .iter()
            .zip(counted)
            .map(|((limit, key), (verdict, counted_in))| Permit {
                limiter: self,
                limit: (*limit).clone(),
                key: stored(limit.name(), key),
                verdict,
                counted_in: (counted_in, cost),
            })
            .collect();
        Ok(Reservations::Granted(Permits { permits, verdicts }))
    }
}
