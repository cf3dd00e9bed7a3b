//! Shared statements for writes to different keys: the calls that arrive
//! while this limiter's statements are in flight go together in the next
//! one, one row each, one commit for all.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Queued, Shared, Turn, abandoned};
use crate::store::{Asked, Counted, Op, sealed::Sealed};
use crate::{Limit, Limiter};

/// The writes waiting for a statement, and how many are in flight.
pub(super) struct Batcher {
    /// How many statements may be in flight at once.
    pub(super) places: usize,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    in_flight: usize,
    waiting: VecDeque<Waiter>,
}

/// A write waiting for a statement.
struct Waiter {
    limit: Limit,
    key: String,
    n: u64,
    tx: oneshot::Sender<Turn<Shared<Counted>>>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl Batcher {
    pub(super) fn new(places: usize) -> Self {
        Batcher {
            places,
            queue: Mutex::default(),
        }
    }

    /// Adds `n` to the stored key's count under `limit`: at once, alone, if
    /// fewer than `places` statements are in flight; otherwise in the next
    /// statement, with every other write waiting then.
    pub(super) async fn add<S: Sealed>(
        &self,
        store: &S,
        op: Op,
        limit: &Limit,
        key: &str,
        n: u64,
        deadline: Instant,
    ) -> Shared<Counted> {
        let waiting = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if queue.in_flight < self.places {
                queue.in_flight += 1;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                queue.waiting.push_back(Waiter {
                    limit: limit.clone(),
                    key: key.to_owned(),
                    n,
                    tx,
                });
                Some(rx)
            }
        };
        let batch = match waiting {
            None => Vec::new(),
            Some(rx) => {
                let queued = Queued::new(rx, || drop(self.leading(Vec::new())));
                match queued.turn().await {
                    Some(Turn::Done(result)) => return result,
                    Some(Turn::Lead) => self.take(),
                    None => return Err(abandoned()),
                }
            }
        };
        let mut lead = self.leading(batch);
        if lead.batch.is_empty() {
            let result = store.count(op, limit, key, n, deadline).await;
            drop(lead);
            return result.map_err(Arc::new);
        }
        let asked: Vec<Asked<'_>> = std::iter::once(Asked { limit, key, n })
            .chain(lead.batch.iter().map(|w| Asked {
                limit: &w.limit,
                key: &w.key,
                n: w.n,
            }))
            .collect();
        let result = store.count_many(op, &asked, deadline).await;
        drop(asked);
        match result {
            Ok(counted) => {
                let mut counted = counted.into_iter();
                let own = counted.next();
                for (waiter, counted) in lead.batch.drain(..).zip(counted) {
                    let _ = waiter.tx.send(Turn::Done(Ok(counted)));
                }
                drop(lead);
                // The store answers one count per pair asked, or errs.
                own.ok_or_else(abandoned)
            }
            Err(e) => {
                let e = Arc::new(e);
                for waiter in lead.batch.drain(..) {
                    let _ = waiter.tx.send(Turn::Done(Err(e.clone())));
                }
                drop(lead);
                Err(e)
            }
        }
    }

    /// The writes waiting now, for the lead's statement: those still
    /// waiting, at most [`Limiter::MAX_PAIRS`] with the leader's; the rest
    /// wait for the next statement. Their keys are distinct, and distinct
    /// from the leader's: the key merge above lets one write per key at a
    /// time reach this queue.
    fn take(&self) -> Vec<Waiter> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        queue.waiting.retain(|waiter| !waiter.tx.is_closed());
        let n = queue.waiting.len().min(Limiter::MAX_PAIRS - 1);
        queue.waiting.drain(..n).collect()
    }

    fn leading(&self, batch: Vec<Waiter>) -> Leading<'_> {
        Leading {
            batcher: self,
            batch,
        }
    }
}

/// A statement in flight, with the waiters it carries. Dropped, it answers
/// anyone still waiting on it (the leader's call was abandoned at its
/// budget) and hands its place to the first caller still waiting, or frees
/// it.
struct Leading<'a> {
    batcher: &'a Batcher,
    batch: Vec<Waiter>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        for waiter in self.batch.drain(..) {
            let _ = waiter.tx.send(Turn::Done(Err(abandoned())));
        }
        let mut queue = self
            .batcher
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while let Some(waiter) = queue.waiting.pop_front() {
            if waiter.tx.send(Turn::Lead).is_ok() {
                return;
            }
        }
        queue.in_flight -= 1;
    }
}
