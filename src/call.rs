//! [`Call`]: the envelope of every call to a store: its deadline, and its
//! outcome in the metrics and events.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::metric::{self, Outcome, Source};
use crate::operation::Operation;
use crate::store::sealed::Sealed;
use crate::trace::Decided;
use crate::{Error, Limit, WhenUnreachable};

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

    /// Runs `work`, a call to `store`, within the budget, unless the latest
    /// probe found the store down; a call that got no answer is unreachable
    /// only if a probe finds it down, else shed
    /// ([down or overloaded](crate::guide#down-or-overloaded)).
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
            limit,
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
