//! [`Call`]: the one envelope of every call to a store. It holds the
//! operation and the budget, runs the work within the deadline, and records
//! each limit's outcome in the metrics (and a warning event when the store
//! was unreachable).

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::error::TimeoutSnafu;
use crate::metric::{self, Outcome, Source};
use crate::operation::Operation;
use crate::{Error, Limit};

/// One call: an operation within a budget.
#[derive(Debug)]
pub(crate) struct Call {
    operation: Operation,
    budget: Duration,
    started: Instant,
}

impl Call {
    /// Starts the clock of `operation` with `budget`.
    pub(crate) fn start(operation: Operation, budget: Duration) -> Call {
        Call {
            operation,
            budget,
            started: Instant::now(),
        }
    }

    /// When the budget runs out.
    pub(crate) fn deadline(&self) -> Instant {
        self.started + self.budget
    }

    /// Runs `work` within the budget: running out of it is a
    /// [`Timeout`](crate::ErrorKind::Timeout) error, and `work` is dropped.
    pub(crate) async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        timeout_at(self.deadline(), work).await.unwrap_or_else(|_| {
            TimeoutSnafu {
                operation: self.operation,
                budget: self.budget,
            }
            .fail()
            .map_err(Error::from)
        })
    }

    /// Records `limit`'s outcome of this call, answered by the store.
    pub(crate) fn record(&self, limit: &Limit, outcome: Outcome) {
        self.record_from(limit, outcome, Source::Store);
    }

    /// Records `limit`'s outcome of this call, answered by `source`.
    pub(crate) fn record_from(&self, limit: &Limit, outcome: Outcome, source: Source) {
        metric::record_from(
            limit,
            self.operation,
            outcome,
            source,
            self.started.elapsed(),
        );
    }

    /// Records that the store could not be reached for `limit`: the
    /// `unreachable` outcome and a warning event naming the cause.
    pub(crate) fn record_unreachable(&self, limit: &Limit, cause: &Error) {
        crate::trace::unreachable(limit.name(), self.operation, cause);
        self.record(limit, Outcome::Unreachable);
    }

    /// Records the outcome of a call that clears (a reset, a take-back):
    /// `cleared`, `unreachable` or `error`.
    pub(crate) fn record_cleared(&self, limit: &Limit, result: &Result<(), Error>) {
        match result {
            Ok(()) => self.record(limit, Outcome::Cleared),
            Err(e) if e.is_unreachable() => self.record_unreachable(limit, e),
            Err(_) => self.record(limit, Outcome::Error),
        }
    }
}
