//! Merging: concurrent `failed`, `hit` and `reserve` calls through one
//! limiter share statements.
//!
//! Two merges, each answering every caller with its own count:
//! - calls for the same stored key add their costs at once (a hot key's
//!   callers become one row lock and one commit per statement);
//! - the keys waiting while this limiter's statements are in flight go
//!   together in the next one (one commit, one WAL flush, for many calls).
//!
//! Who sends, who waits and which count each caller gets is written once, in
//! the [guide](crate::guide#merging). Here: the queue of keys, and the
//! flights that send it.
//!
//! A statement is sent by a *flight*, a task of its own, never by a caller:
//! a caller only waits for its answer, so a caller that is dropped (its
//! client went away, its budget ran out, a `select!` chose another branch)
//! changes nothing for the others. A flight sends what is queued, answers
//! each caller still waiting, and goes on with what queued meanwhile, until
//! the queue is empty.

mod flight;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use snafu::ResultExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::decide::Counted;
use crate::error::{AbandonedSnafu, MergedSnafu};
use crate::operation::Counting;
use crate::store::sealed::Sealed;
use crate::{Error, Limit};

/// Merging, for one limiter.
#[derive(Debug)]
pub(crate) struct Merging {
    shared: Arc<Shared>,
    /// The places of all-or-nothing statements, which are never merged:
    /// as many as the writes have, so that a burst of them waits here, in
    /// the limiter, and never holds more of the pool than the writes may.
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
    /// The keys whose callers wait for the next statement, in order of
    /// arrival; each at most once, and never while its statement is in
    /// flight.
    ready: VecDeque<String>,
}

/// The callers of one stored key.
struct Waiting {
    op: Counting,
    limit: Limit,
    /// The callers waiting for the next statement with the key (its
    /// earlier callers' may be in flight).
    callers: Vec<Caller>,
}

/// A caller waiting for its count.
struct Caller {
    deadline: Instant,
    tx: oneshot::Sender<Answer>,
    /// What its call adds: its cost (1 but for `hit_n` and `reserve_n`).
    cost: u64,
}

/// What a caller is told: its own count, or the error every caller of a
/// failed statement shares.
type Answer = Result<Counted, Arc<Error>>;

/// How one pair of a caller gets its count.
enum Wait {
    /// From a flight, with the key's other callers.
    Merged(oneshot::Receiver<Answer>),
    /// From a statement of its own: the key's callers queued or in flight
    /// count under a limit that does not count alike (another tier of a
    /// limit with a lockout, whose reading depends on the max; or another
    /// limit of the same name).
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

    /// Runs `statement`, one that is never merged (an all-or-nothing
    /// write), once one of its places is free: the wait, in order of
    /// arrival, counts against the caller's budget.
    pub(crate) async fn in_turn<T>(&self, statement: impl Future<Output = T>) -> T {
        let _place = self.alone.acquire().await;
        statement.await
    }

    /// How many statements of writes may be in flight at once.
    pub(crate) fn places(&self) -> usize {
        self.shared.places
    }

    /// Adds `cost` to each stored key's count under its limit, with the
    /// other callers for each key and the other keys waiting; each count
    /// after this caller's addition, in the order given. The pairs are
    /// queued together, so that they go in one statement unless a key's
    /// earlier callers are in flight. A pair whose key waits under a limit
    /// that does not count alike ([`Limit::counts_alike`]) is sent in a
    /// statement of its own, beside the flights. Dropping the future gives
    /// up this caller's wait and nothing else: its cost may or may not be
    /// counted.
    pub(crate) async fn add_all<S: Sealed>(
        &self,
        store: &Arc<S>,
        op: Counting,
        pairs: &[(&Limit, String)],
        cost: u64,
        deadline: Instant,
    ) -> Result<Vec<Counted>, Error> {
        // Only writes merge (the limiter sends a `check` alone): a flight
        // adds each caller's cost.
        debug_assert!(op.adds(), "only writes merge");
        let operation = op.operation();
        let waits = self.queue(store, op, pairs, cost, deadline);
        let mut counted = Vec::with_capacity(waits.len());
        for (wait, (limit, key)) in waits.into_iter().zip(pairs) {
            let rx = match wait {
                Wait::Merged(rx) => rx,
                Wait::Alone => {
                    counted.push(store.count(op, limit, key, cost, deadline).await?);
                    continue;
                }
            };
            let answer = match rx.await {
                Ok(answer) => answer,
                // A flight answers every caller it takes, even when it is
                // torn down; this is only reached if the runtime drops it
                // unrun.
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

    /// Queues one caller for each pair's key, and starts a flight if a
    /// place is free.
    fn queue<S: Sealed>(
        &self,
        store: &Arc<S>,
        op: Counting,
        pairs: &[(&Limit, String)],
        cost: u64,
        deadline: Instant,
    ) -> Vec<Wait> {
        let mut waits = Vec::with_capacity(pairs.len());
        let mut start = false;
        // The keys this call queued first: a flight it starts sends them
        // (and only them) at once.
        let mut first = Vec::new();
        {
            let mut queue = self.shared.lock();
            for (limit, key) in pairs {
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
                    // Queued already, or in flight: it is queued again when
                    // its statement returns.
                    waiting.callers.push(caller);
                    // A place free with keys waiting (a flight torn down
                    // left them): a flight is started for them.
                    if !start && queue.in_flight < self.shared.places && !queue.ready.is_empty() {
                        queue.in_flight += 1;
                        start = true;
                    }
                    continue;
                }
                queue.keys.insert(
                    key.clone(),
                    Waiting {
                        op,
                        limit: (*limit).clone(),
                        callers: vec![caller],
                    },
                );
                queue.ready.push_back(key.clone());
                first.push(key.clone());
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

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a caller is told when the statement that carried its count ended
/// without an answer for it (its flight torn down): the count may or may
/// not have been written, as after a timeout.
fn abandoned() -> Arc<Error> {
    Arc::new(Error::from(AbandonedSnafu.build()))
}
