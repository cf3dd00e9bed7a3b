//! Merged counts for one hot key: concurrent calls for the same stored key
//! share one statement that adds their number at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use super::{Queued, Shared, Turn, abandoned};
use crate::store::Counted;

/// A queued caller's end of the channel its turn comes on.
type Waiting = oneshot::Sender<Turn<Shared<Counted>>>;

/// The queues of callers waiting on a key's statement in flight. A key is
/// present while a statement for it is in flight.
#[derive(Default)]
pub(super) struct Keyed {
    queues: Mutex<HashMap<String, VecDeque<Waiting>>>,
}

impl std::fmt::Debug for Keyed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed").finish_non_exhaustive()
    }
}

impl Keyed {
    /// Adds one to `key`'s count, merged with the other callers for `key`.
    /// `send(n)` sends the statement that adds `n` and returns the count
    /// after it.
    pub(super) async fn add<F, Fut>(&self, key: &str, send: F) -> Shared<Counted>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Shared<Counted>>,
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
            let queued = Queued::new(rx, || drop(self.leading(key, Vec::new())));
            match queued.turn().await {
                Some(Turn::Done(result)) => return result,
                Some(Turn::Lead) => {}
                // Every queued sender is answered, even by a leader that was
                // dropped mid-call; this is only reached if that breaks.
                None => return Err(abandoned()),
            }
        }

        // Leading: take everyone queued so far (who still waits) as the batch.
        let batch = {
            let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
            queues
                .get_mut(key)
                .map(|queue| queue.drain(..).filter(|tx| !tx.is_closed()).collect())
                .unwrap_or_default()
        };
        let mut lead = self.leading(key, batch);
        let n = 1 + lead.batch.len() as u64;
        let result = send(n).await;
        for (i, tx) in lead.batch.drain(..).enumerate() {
            let position = i as u64 + 1;
            let _ = tx.send(Turn::Done(
                result.clone().map(|c| at_position(c, n, position)),
            ));
        }
        drop(lead);
        result.map(|c| at_position(c, n, 0))
    }

    fn leading<'a>(&'a self, key: &'a str, batch: Vec<Waiting>) -> Leading<'a> {
        Leading {
            keyed: self,
            key,
            batch,
        }
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
    keyed: &'a Keyed,
    key: &'a str,
    batch: Vec<Waiting>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        for tx in self.batch.drain(..) {
            let _ = tx.send(Turn::Done(Err(abandoned())));
        }
        let mut queues = self
            .keyed
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

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::time::{Duration, SystemTime};

    use futures::FutureExt as _;
    use futures::future::poll_fn;
    use std::task::Poll;

    use super::*;

    fn counted(count: u64) -> Counted {
        let now = SystemTime::now();
        Counted {
            count,
            previous: 0,
            locked_until: None,
            window_end: now + Duration::from_secs(60),
            now,
        }
    }

    /// Polls `fut` once; whether it is still pending.
    async fn pending<F: Future>(fut: std::pin::Pin<&mut F>) -> bool {
        let mut fut = fut;
        poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await
    }

    /// A waiter handed the lead and dropped before it read it (its client
    /// went away) passes the lead on: the next caller for the key is not
    /// left queued behind a leader that will never send.
    #[tokio::test]
    async fn a_lead_handed_to_a_dropped_waiter_is_passed_on() {
        let keyed = Keyed::default();
        let (gate_tx, gate_rx) = oneshot::channel::<()>();
        let mut leader = Box::pin(keyed.add("k", |_| async move {
            let _ = gate_rx.await;
            Ok(counted(1))
        }));
        assert!(pending(leader.as_mut()).await, "the leader is in flight");
        let mut waiter = Box::pin(keyed.add("k", |_| async { Ok(counted(2)) }));
        assert!(pending(waiter.as_mut()).await, "the waiter queues");
        // The leader's call is dropped at its budget: the lead goes to the
        // waiter, which is dropped before it is polled again.
        drop(leader);
        drop(gate_tx);
        drop(waiter);
        let next = keyed.add("k", |n| async move { Ok(counted(n)) });
        let answer = pin!(next).now_or_never();
        assert_eq!(
            answer
                .expect("sent at once, not queued")
                .expect("counted")
                .count,
            1
        );
    }
}
