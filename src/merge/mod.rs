//! Merging: concurrent `failed`, `hit` and `reserve` calls through one
//! limiter share statements.
//!
//! Two layers, each answering every caller with its own count:
//! - [`key`]: calls for the same stored key add their number at once (a hot
//!   key's callers become one row lock and one commit per batch);
//! - [`batch`]: the writes for different keys that arrive while a statement
//!   is in flight go together in the next one (one commit, one WAL flush,
//!   for many calls).
//!
//! Who sends, who waits and which count each caller gets is written once, in
//! the [guide](crate::guide#merging). Here: the queues, the leader's batch,
//! and the hand-over of the lead, which is never lost, whether the leader's
//! call or a waiter's is dropped at its budget.

mod batch;
mod key;

use std::sync::Arc;

use snafu::ResultExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::{AbandonedSnafu, MergedSnafu};
use crate::operation::Operation;
use crate::store::{Counted, Op, sealed::Sealed};
use crate::{Error, Limit};

use batch::Batcher;
use key::Keyed;

/// Both layers of merging, for one limiter.
#[derive(Debug)]
pub(crate) struct Merging {
    keys: Keyed,
    batches: Batcher,
}

impl Merging {
    /// Merging with at most `places` statements of writes in flight
    /// ([`LimiterBuilder::writes_in_flight`](crate::LimiterBuilder::writes_in_flight)).
    pub(crate) fn new(places: usize) -> Self {
        Merging {
            keys: Keyed::default(),
            batches: Batcher::new(places),
        }
    }

    /// How many statements of writes may be in flight at once.
    pub(crate) fn places(&self) -> usize {
        self.batches.places
    }

    /// Adds one to the stored key's count under `limit`, merged with the
    /// other callers for the key, then batched with the calls for other keys.
    pub(crate) async fn add<S: Sealed>(
        &self,
        store: &S,
        op: Op,
        limit: &Limit,
        key: &str,
        deadline: Instant,
    ) -> Result<Counted, Error> {
        self.keys
            .add(key, |n| {
                self.batches.add(store, op, limit, key, n, deadline)
            })
            .await
            .context(MergedSnafu {
                operation: Operation::from(op),
            })
            .map_err(Error::from)
    }
}

/// What a queued caller is told.
enum Turn<T> {
    /// The batch it was in is done: its answer.
    Done(T),
    /// The statement before it is done: it sends the next one.
    Lead,
}

/// A caller's place in a queue. Dropped after the lead was handed to it but
/// before it read that (its call was dropped at its budget, or its client
/// went away), it passes the lead on with `pass_on`: a lead is never lost,
/// so a queue can never be left with no one to send its statement.
struct Queued<T, F: FnOnce()> {
    rx: oneshot::Receiver<Turn<T>>,
    pass_on: Option<F>,
}

impl<T, F: FnOnce()> Queued<T, F> {
    fn new(rx: oneshot::Receiver<Turn<T>>, pass_on: F) -> Self {
        Queued {
            rx,
            pass_on: Some(pass_on),
        }
    }

    /// This caller's turn; `None` if every sender went without answering,
    /// which the leaders' drop guards never let happen.
    async fn turn(mut self) -> Option<Turn<T>> {
        let turn = (&mut self.rx).await.ok();
        // Read: the lead, if it is one, is this caller's to use now.
        self.pass_on = None;
        turn
    }
}

impl<T, F: FnOnce()> Drop for Queued<T, F> {
    fn drop(&mut self) {
        let Some(pass_on) = self.pass_on.take() else {
            return;
        };
        // No lead can arrive after this; one that already did is passed on.
        self.rx.close();
        if let Ok(Turn::Lead) = self.rx.try_recv() {
            pass_on();
        }
    }
}

/// The error every caller of a failed batch gets, shared.
type Shared<T> = Result<T, Arc<Error>>;

/// What a caller is told when the call that carried its count gave up (at
/// its budget, or dropped) before the answer: the count may or may not
/// have been written, as after a timeout.
fn abandoned() -> Arc<Error> {
    Arc::new(Error::from(AbandonedSnafu.build()))
}
