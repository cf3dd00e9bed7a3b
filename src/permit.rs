//! [`Permit`]: an attempt counted before the work it guards.

use std::time::SystemTime;

use crate::store::Store;
use crate::{Error, Limit, Limiter, OnSuccess, Verdict};

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
pub enum Reservation<'a, S: Store> {
    /// The attempt is counted and may go ahead.
    Granted(Permit<'a, S>),
    /// The attempt is refused (and was counted, as every ask is).
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
pub struct Permit<'a, S: Store> {
    limiter: &'a Limiter<S>,
    limit: Limit,
    key: String,
    verdict: Verdict,
    counted_in: CountedIn,
}

impl<'a, S: Store> Permit<'a, S> {
    pub(crate) fn reservation(
        limiter: &'a Limiter<S>,
        limit: &Limit,
        key: String,
        verdict: Verdict,
        counted_in: CountedIn,
    ) -> Reservation<'a, S> {
        if verdict.is_refused() {
            return Reservation::Refused(verdict);
        }
        Reservation::Granted(Permit {
            limiter,
            limit: limit.clone(),
            key,
            verdict,
            counted_in,
        })
    }

    /// The verdict that granted the permit.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The attempt succeeded: take it back from the window it was counted
    /// in, or clear the key, as the limit's [`OnSuccess`] says. When the
    /// store was unreachable at the reservation and nothing counted it,
    /// there is nothing to take back.
    ///
    /// # Errors
    ///
    /// Any failure, unreachable included: the attempt then stays counted,
    /// which errs on the safe side.
    pub async fn succeeded(self) -> Result<(), Error> {
        match self.limit.success_policy() {
            OnSuccess::Reset => self.limiter.reset_stored(&self.limit, &self.key).await,
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
