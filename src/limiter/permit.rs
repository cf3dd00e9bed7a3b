//! [`Permit`] and [`Permits`]: attempts counted before the work they guard.

use std::num::NonZeroU32;
use std::time::SystemTime;

use super::run::Ask;
use crate::decide::Counting;
use crate::key::stored;
use crate::store::Store;
use crate::{Error, Key, Limit, Limiter, OnSuccess, Verdict, Verdicts};

/// Where a reserved attempt was counted: what a success takes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CountedIn {
    /// In the store, in the window starting at `window_start`.
    Store {
        window_start: SystemTime,
    },
    /// In the limiter's local fallback, the store being unreachable.
    Fallback {
        window_start: SystemTime,
    },
    Nowhere,
}

/// The answer to [`Limiter::reserve`].
#[derive(Debug)]
#[must_use = "a granted permit guards work; a refused verdict must stop it"]
pub enum Reservation<'a, S> {
    /// The attempt is counted and may go ahead.
    Granted(Permit<'a, S>),
    /// The attempt is refused (counted, unless [`Verdict::exceeds_max`]).
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
    /// What a success takes back.
    counted_in: (CountedIn, NonZeroU32),
}

impl<'a, S: Store> Permit<'a, S> {
    /// The verdict that granted the permit.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The attempt succeeded: take its whole cost back from the window it
    /// was counted in, or clear the key, as the limit's [`OnSuccess`] says.
    ///
    /// # Errors
    ///
    /// Any failure, unreachable included: the attempt then stays counted.
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

    /// The attempt failed: it stays counted, as when the permit is dropped.
    pub fn failed(self) {}
}

/// The answer to [`Limiter::reserve_all`].
#[derive(Debug)]
#[must_use = "granted permits guard work; refused verdicts must stop it"]
pub enum Reservations<'a, S> {
    /// Every limit allows the attempt, and it is counted under each.
    Granted(Permits<'a, S>),
    /// A limit refuses the attempt, counted under every limit all the same.
    Refused(Verdicts),
}

impl<'a, S: Store> Reservations<'a, S> {
    /// The answer for a reservation of one pair.
    pub(crate) fn one(self) -> Reservation<'a, S> {
        match self {
            Reservations::Granted(mut permits) => {
                Reservation::Granted(permits.permits.swap_remove(0))
            }
            Reservations::Refused(verdicts) => {
                Reservation::Refused(verdicts.into_vec().swap_remove(0))
            }
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

/// A [`Permit`] per (limit, key) pair of one attempt: report
/// [`succeeded`](Permits::succeeded) after a success; dropped, the attempt
/// stays counted under every limit.
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

    /// The attempt succeeded: [`Permit::succeeded`] for each pair, at once.
    ///
    /// # Errors
    ///
    /// The first failure among the pairs; the others are still taken back.
    pub async fn succeeded(self) -> Result<(), Error> {
        let results =
            futures::future::join_all(self.permits.into_iter().map(Permit::succeeded)).await;
        results.into_iter().collect()
    }

    /// The attempt failed: it stays counted, as when the permits are dropped.
    pub fn failed(self) {}
}

impl<S: Store> Limiter<S> {
    /// As [`reserve`](Limiter::reserve), over several pairs in one
    /// statement: the attempt may go ahead only if every limit allows it,
    /// and a refused one stays counted under every limit, as with
    /// [`hit_all`](Limiter::hit_all).
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

    pub(crate) async fn reserved(
        &self,
        pairs: &[(&Limit, &Key)],
        cost: NonZeroU32,
    ) -> Result<Reservations<'_, S>, Error> {
        let counted = self.counted_all_in(Counting::RESERVE, pairs, cost).await?;
        let verdicts = Verdicts::from(counted.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>());
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
