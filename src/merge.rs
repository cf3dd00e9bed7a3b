//! Merged counts for one hot key: concurrent `failed`, `hit` and `reserve`
//! calls for the same key in this process share one statement that adds
//! their number at once.
//!
//! Who sends, who waits and which count each caller gets is written once, in
//! the [guide](crate::guide#merging). Here: a queue per key while a
//! statement for it is in flight, the leader's batch, and [`Leading`], which
//! answers the batch and hands the lead on when the leader's call is dropped
//! at its budget.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::Error;
use crate::error::AbandonedSnafu;
use crate::store::Counted;

/// What a queued caller is told.
enum Turn {
    /// The batch it was in is done: its count, or why not.
    Done(Result<Counted, Arc<Error>>),
    /// The batch before it is done: it sends the next one.
    Lead,
}

/// The queues of callers waiting on a key's statement in flight. A key is
/// present while a statement for it is in flight.
#[derive(Default)]
pub(crate) struct Merger {
    queues: Mutex<HashMap<String, VecDeque<oneshot::Sender<Turn>>>>,
}

impl std::fmt::Debug for Merger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merger").finish_non_exhaustive()
    }
}

impl Merger {
    /// Adds one to `key`'s count, merged with the other callers for `key`.
    /// `send(n)` sends the statement that adds `n` and returns the count
    /// after it.
    pub(crate) async fn add<F, Fut>(&self, key: &str, send: F) -> Result<Counted, Arc<Error>>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<Counted, Error>>,
    {
        let waiting = {
            let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
            match queues.get_mut(key) {
                Some(queue) => {
                    let (tx, rx) = oneshot::channel();
                    queue.push_back(tx);
                    Some(rx)
                }
                None => {
                    queues.insert(key.to_owned(), VecDeque::new());
                    None
                }
            }
        };
        if let Some(rx) = waiting {
            match rx.await {
                Ok(Turn::Done(result)) => return result,
                Ok(Turn::Lead) => {}
                // Every queued sender is answered, even by a leader that was
                // dropped mid-call; this is only reached if that breaks.
                Err(_) => return Err(Arc::new(Error::from(AbandonedSnafu.build()))),
            }
        }

        // Leading: take everyone queued so far (who still waits) as the batch.
        let mut lead = Leading {
            merger: self,
            key,
            batch: {
                let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
                queues
                    .get_mut(key)
                    .map(|queue| queue.drain(..).filter(|tx| !tx.is_closed()).collect())
                    .unwrap_or_default()
            },
        };
        let n = 1 + lead.batch.len() as u64;
        let result = send(n).await.map_err(Arc::new);
        for (i, tx) in lead.batch.drain(..).enumerate() {
            let position = i as u64 + 1;
            let _ = tx.send(Turn::Done(
                result.clone().map(|c| at_position(c, n, position)),
            ));
        }
        drop(lead);
        result.map(|c| at_position(c, n, 0))
    }
}

/// The count seen by the caller at `position` (0-based) of a batch of `n`
/// whose statement left the count at `counted.count`.
fn at_position(mut counted: Counted, n: u64, position: u64) -> Counted {
    counted.count = counted.count.saturating_sub(n - 1 - position);
    counted
}

/// The leader of a key's batch. Dropped, it answers anyone still waiting on
/// its batch (the leader's call was abandoned at its budget) and hands the
/// lead to the next caller in the queue, or frees the key.
struct Leading<'a> {
    merger: &'a Merger,
    key: &'a str,
    batch: Vec<oneshot::Sender<Turn>>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        for tx in self.batch.drain(..) {
            let _ = tx.send(Turn::Done(Err(Arc::new(Error::from(
                AbandonedSnafu.build(),
            )))));
        }
        let mut queues = self
            .merger
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(queue) = queues.get_mut(self.key) else {
            return;
        };
        while let Some(tx) = queue.pop_front() {
            if tx.send(Turn::Lead).is_ok() {
                return;
            }
        }
        queues.remove(self.key);
    }
}
