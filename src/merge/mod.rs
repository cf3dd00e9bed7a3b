//! Merging: concurrent writes through one limiter share statements
//! ([the guide](crate::guide#merging)). Here the queue of keys; the
//! flights that send it are in `flight.rs`.

mod flight;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use snafu::ResultExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::decide::Counted;
use crate::error::{AbandonedSnafu, MergedSnafu};
use crate::operation::Counting;
use crate::store::sealed::Sealed;
use crate::store::{Asked, count_pairs};
use crate::{Error, Limit};

/// Merging, for one limiter.
#[derive(Debug)]
pub(crate) struct Merging {
    shared: Arc<Shared>,
    /// The places of all-or-nothing statements, never merged: as many as
    /// the writes have, so a burst of them waits here, not on the pool.
    alone: tokio::sync::Semaphore,
}

/// What the callers and the flights of one limiter share.
pub(crate) struct Shared {
    /// How many flights may be in flight at once.
    places: usize,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("places", &self.places)
            .finish_non_exhaustive()
    }
}

/// The keys with callers waiting, and how many flights are out.
#[derive(Default)]
struct Queue {
    in_flight: usize,
    /// Every stored key that has callers waiting or a statement in flight.
    keys: HashMap<String, Waiting>,
    /// The keys whose callers wait for the next statement, in order; each
    /// at most once, and never while in flight.
    ready: VecDeque<String>,
}

/// The callers of one stored key.
struct Waiting {
    op: Counting,
    limit: Limit,
    /// The callers waiting for the key's next statement.
    callers: Vec<Caller>,
}

/// A caller waiting for its count.
struct Caller {
    deadline: Instant,
    tx: oneshot::Sender<Answer>,
    /// What its call adds: its cost.
    cost: u64,
}

/// What a caller is told: its own count, or its statement's error.
type Answer = Result<Counted, Arc<Error>>;

/// How one pair of a caller gets its count.
enum Wait {
    /// From a flight, with the key's other callers.
    Merged(oneshot::Receiver<Answer>),
    /// From a statement of its own: the key's other callers count under a
    /// limit that does not count alike ([`Limit::counts_alike`]).
    Alone,
}

impl Merging {
    /// Merging with at most `places` statements of writes in flight
    /// ([`LimiterBuilder::writes_in_flight`](crate::LimiterBuilder::writes_in_flight)).
    pub(crate) fn new(places: usize) -> Self {
        Merging {
            shared: Arc::new(Shared {
                places,
                queue: Mutex::default(),
            }),
            alone: tokio::sync::Semaphore::new(places),
        }
    }

    /// As [`count_pairs`]: writes merged with other callers' (the counts
    /// each caller's own), all-or-nothing writes alone once one of their
    /// places is free, reads as they come.
    pub(crate) async fn count<S: Sealed>(
        &self,
        store: &Arc<S>,
        op: Counting,
        pairs: &[Asked<'_>],
        deadline: Instant,
    ) -> Result<(Vec<Counted>, bool), Error> {
        if op.all_or_nothing() {
            let _place = self.alone.acquire().await;
            return count_pairs(&**store, op, pairs, deadline).await;
        }
        if !op.adds() {
            return count_pairs(&**store, op, pairs, deadline).await;
        }
        let counted = self.add_all(store, op, pairs, deadline).await?;
        Ok((after_the_call(pairs, counted), true))
    }

    /// How many statements of writes may be in flight at once.
    pub(crate) fn places(&self) -> usize {
        self.shared.places
    }

    /// Adds `cost` to each stored key's count under its limit, merged with
    /// the other callers; each count after this caller's addition, in the
    /// order given. Dropping the future gives up this caller's wait and
    /// nothing else: its cost may or may not be counted.
    async fn add_all<S: Sealed>(
        &self,
        store: &Arc<S>,
        op: Counting,
        pairs: &[Asked<'_>],
        deadline: Instant,
    ) -> Result<Vec<Counted>, Error> {
        let operation = op.operation();
        let waits = self.queue(store, op, pairs, deadline);
        let mut counted = Vec::with_capacity(waits.len());
        for (wait, pair) in waits.into_iter().zip(pairs) {
            let rx = match wait {
                Wait::Merged(rx) => rx,
                Wait::Alone => {
                    let Asked { limit, key, n } = *pair;
                    counted.push(store.count(op, limit, key, n, deadline).await?);
                    continue;
                }
            };
            let answer = match rx.await {
                Ok(answer) => answer,
                // Only if the runtime drops a flight unrun.
                Err(_) => Err(abandoned()),
            };
            counted.push(
                answer
                    .context(MergedSnafu { operation })
                    .map_err(Error::from)?,
            );
        }
        Ok(counted)
    }

    /// Queues a caller for each pair's key; starts a flight if one may.
    fn queue<S: Sealed>(
        &self,
        store: &Arc<S>,
        op: Counting,
        pairs: &[Asked<'_>],
        deadline: Instant,
    ) -> Vec<Wait> {
        let mut waits = Vec::with_capacity(pairs.len());
        let mut start = false;
        // The keys this call queued first: a flight it starts sends them.
        let mut first = Vec::new();
        {
            let mut queue = self.shared.lock();
            for &Asked {
                limit,
                key,
                n: cost,
            } in pairs
            {
                if queue
                    .keys
                    .get(key)
                    .is_some_and(|waiting| !waiting.limit.counts_alike(limit))
                {
                    waits.push(Wait::Alone);
                    continue;
                }
                let (tx, rx) = oneshot::channel();
                waits.push(Wait::Merged(rx));
                let caller = Caller { deadline, tx, cost };
                if let Some(waiting) = queue.keys.get_mut(key) {
                    // Queued, or in flight (queued again when it returns).
                    waiting.callers.push(caller);
                    // A place free and keys waiting (a flight torn down).
                    if !start && queue.in_flight < self.shared.places && !queue.ready.is_empty() {
                        queue.in_flight += 1;
                        start = true;
                    }
                    continue;
                }
                queue.keys.insert(
                    key.to_owned(),
                    Waiting {
                        op,
                        limit: limit.clone(),
                        callers: vec![caller],
                    },
                );
                queue.ready.push_back(key.to_owned());
                first.push(key.to_owned());
                if !start && queue.in_flight < self.shared.places {
                    queue.in_flight += 1;
                    start = true;
                }
            }
        }
        if start {
            flight::start(self.shared.clone(), store.clone(), first);
        }
        waits
    }
}

/// The counts of a merged write as one statement gives them: a pair given
/// twice in one call reads the count after all of the call's additions,
/// as `add_many` answers it, not its own position's.
fn after_the_call(pairs: &[Asked<'_>], mut counted: Vec<Counted>) -> Vec<Counted> {
    for i in 0..pairs.len() {
        let last = (i..pairs.len())
            .rev()
            .find(|&j| pairs[j].key == pairs[i].key)
            .unwrap_or(i);
        if last != i {
            counted[i] = counted[last].clone();
        }
    }
    counted
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a caller is told when its flight was torn down: the count may or
/// may not have been written.
fn abandoned() -> Arc<Error> {
    Arc::new(Error::from(AbandonedSnafu.build()))
}

#[cfg(test)]
mod tests;
