//! What clears a count: a reset, and a reserved attempt's take-back.

use std::num::NonZeroU32;

use super::permit::CountedIn;
use crate::limiter::run::Call;
use crate::metric::Operation;
use crate::store::Store;
use crate::store::sealed::Sealed as _;
use crate::{Error, Limit, Limiter};

impl<S: Store> Limiter<S> {
    /// Clears a stored key, with the budget and the metrics; how many of
    /// its windows the store held.
    pub(crate) async fn reset_stored(&self, limit: &Limit, key: &str) -> Result<u64, Error> {
        let call = Call::start(Operation::Reset, self.budget);
        self.refusals.forget(key);
        // The local count (if the limit ever fell back to it) is cleared too.
        let _ = self.fallback.reset(key, call.deadline()).await;
        let result = call
            .within_store(
                &*self.store,
                Box::pin(self.store.reset(key, call.deadline())),
            )
            .await;
        // Again: a refusal cached by a call that raced the reset is stale.
        self.refusals.forget(key);
        call.record_cleared(limit, &result);
        result
    }

    /// Takes a reserved attempt's `cost` back from where `counted_in` says
    /// it was counted: its window, in the store or the local fallback.
    pub(crate) async fn take_back(
        &self,
        limit: &Limit,
        key: &str,
        (counted_in, cost): (CountedIn, NonZeroU32),
    ) -> Result<(), Error> {
        let n = u64::from(cost.get());
        let call = Call::start(Operation::TakeBack, self.budget);
        self.refusals.forget(key);
        let result = match counted_in {
            CountedIn::Store { window_start } => call
                .within_store(
                    &*self.store,
                    Box::pin(self.store.take_back(key, window_start, n, call.deadline())),
                )
                .await
                .map(drop),
            CountedIn::Fallback { window_start } => self
                .fallback
                .take_back(key, window_start, n, call.deadline())
                .await
                .map(drop),
            CountedIn::Nowhere => Ok(()),
        };
        call.record_cleared(limit, &result);
        result
    }
}
