//! [Merging](crate::guide#merging): the queue of keys, and the flights
//! that send it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::join_all;
use snafu::ResultExt;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::decide::{Counted, Counting};
use crate::error::{AbandonedSnafu, MergedSnafu};
use crate::store::sealed::Sealed;
use crate::store::{Asked, MAX_PAIRS, count_pairs};
use crate::{Error, Limit};

#[derive(Debug)]
pub(crate) struct Merging {
    shared: Arc<Shared>,
    /// The places of all-or-nothing statements, never merged.
    alone: tokio::sync::Semaphore,
}

/// What the callers and the flights of one limiter share.
pub(crate) struct Shared {
    most: usize,
    /// Whether the places follow the commits ([`places_after`]).
    adaptive: bool,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("most", &self.most)
            .field("adaptive", &self.adaptive)
            .finish_non_exhaustive()
    }
}

/// The keys with callers waiting, and how many flights are out.
#[derive(Default)]
struct Queue {
    /// How many flights may be in flight now.
    places: usize,
    commits: Commits,
    in_flight: usize,
    /// The calls queued so far, which numbers them.
    calls: u64,
    /// Every stored key that has callers waiting or a statement in flight.
    keys: HashMap<String, Waiting>,
    /// The keys whose callers wait for the next statement, in order; each
    /// at most once, and never while in flight.
    ready: VecDeque<String>,
}

struct Waiting {
    op: Counting,
    limit: Limit,
    /// The callers waiting for the key's next statement.
    callers: Vec<Caller>,
}

struct Caller {
    /// The call it is part of, one of its pairs.
    call: u64,
    deadline: Instant,
    tx: oneshot::Sender<(Answer, Option<Back>)>,
    cost: u64,
}

/// What a caller is told: its own count, or its statement's error.
type Answer = Result<Counted, Arc<Error>>;

/// A told caller's part in its flight's wait for the callers on their way
/// back ([`gather`]): dropped once the caller has its answer, or
/// with the answer unread.
struct Back(Arc<Gathering>);

struct Gathering {
    left: AtomicUsize,
    all: Notify,
}

impl Drop for Back {
    fn drop(&mut self) {
        if self.0.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.all.notify_one();
        }
    }
}

/// How one pair of a caller gets its count.
enum Wait {
    /// From a flight, with the key's other callers.
    Merged(oneshot::Receiver<(Answer, Option<Back>)>),
    /// From a statement of its own: the key's other callers count under a
    /// limit that does not count alike ([`Limit::counts_alike`]).
    Alone,
}

impl Merging {
    /// At most `most` statements of writes in flight: always `most`, or,
    /// `adaptive`, from one up to `most` ([`places_after`]).
    pub(crate) fn new(most: usize, adaptive: bool) -> Self {
        let queue = Queue {
            places: if adaptive { 1 } else { most },
            ..Queue::default()
        };
        Merging {
            shared: Arc::new(Shared {
                most,
                adaptive,
                queue: Mutex::new(queue),
            }),
            alone: tokio::sync::Semaphore::new(if adaptive { 1 } else { most }),
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

    /// The most statements of writes in flight at once.
    pub(crate) fn most(&self) -> usize {
        self.shared.most
    }

    /// Adds `cost` to each stored key's count under its limit, merged with
    /// the other callers; each count after this caller's addition, in the
    /// order given.
    async fn add_all<S: Sealed>(
        &self,
        store: &Arc<S>,
        op: Counting,
        pairs: &[Asked<'_>],
        deadline: Instant,
    ) -> Result<Vec<Counted>, Error> {
        let operation = op.operation();
        let mut waits = self.queue(store, op, pairs, deadline);
        // Each merged answer taken as it comes, so that no flight waits on
        // this call's other pairs ([`gather`]); then the pairs alone.
        let merged = join_all(waits.iter_mut().map(|wait| async move {
            let Wait::Merged(rx) = wait else {
                return None;
            };
            Some(match rx.await {
                Ok((answer, _)) => answer,
                // Only if the runtime drops a flight unrun.
                Err(_) => Err(abandoned()),
            })
        }))
        .await;
        let mut counted = Vec::with_capacity(pairs.len());
        for (answer, &Asked { limit, key, n }) in merged.into_iter().zip(pairs) {
            counted.push(match answer {
                Some(answer) => answer.context(MergedSnafu { operation })?,
                None => {
                    let held = &mut S::Held::default();
                    store.count(op, limit, key, n, deadline, held).await?
                }
            });
        }
        Ok(counted)
    }

    /// Queues a caller for each pair's key; starts a flight if a place is free.
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
            queue.calls = queue.calls.wrapping_add(1);
            let call = queue.calls;
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
                let caller = Caller {
                    call,
                    deadline,
                    tx,
                    cost,
                };
                if let Some(waiting) = queue.keys.get_mut(key) {
                    // Queued, or in flight (queued again when it returns).
                    waiting.callers.push(caller);
                    // A place free and keys waiting (a flight torn down).
                    if !start && queue.in_flight < queue.places && !queue.ready.is_empty() {
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
                if !start && queue.in_flight < queue.places {
                    queue.in_flight += 1;
                    start = true;
                }
            }
        }
        if start {
            start_flight(self.shared.clone(), store.clone(), first);
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

/// A flight torn down: the count may or may not have been written.
fn abandoned() -> Arc<Error> {
    Arc::new(Error::from(AbandonedSnafu.build()))
}

/// How many statements a flight sends on one connection before it gives it
/// back ([merging](crate::guide#merging); why 64: docs/PERFORMANCE.md, levers).
const HOLD_STATEMENTS: usize = 64;

/// The longest a flight waits for the callers it told ([`gather`]).
const GATHER_AT_MOST: Duration = Duration::from_millis(1);

/// One key of a statement, its callers in order of arrival.
struct Member {
    key: String,
    limit: Limit,
    callers: Vec<Caller>,
}

/// Starts a flight, whose place is already taken: first the keys `first`
/// (so a write that finds a place free goes at once), then whatever waits.
/// Made before the task, so a task dropped unrun still gives its place back.
fn start_flight<S: Sealed>(shared: Arc<Shared>, store: Arc<S>, first: Vec<String>) {
    let mut flight = Flight {
        shared,
        store: Some(store),
        held: S::Held::default(),
        sent_on_held: 0,
        members: Vec::new(),
        holding: true,
    };
    tokio::spawn(async move {
        flight.run(first).await;
    });
}

/// A flight, holding one place. Dropped before its work is done, it
/// answers the callers it took and those left queued with no flight, and
/// gives its place back: no caller waits forever, no place is lost.
struct Flight<S: Sealed> {
    shared: Arc<Shared>,
    /// The store, let go before a lone call hears, so that it can drop its
    /// limiter and get back what its connection source owns.
    store: Option<Arc<S>>,
    /// The connection its last statement answered on, kept for the next.
    held: S::Held,
    sent_on_held: usize,
    members: Vec<Member>,
    holding: bool,
}

impl<S: Sealed> Flight<S> {
    async fn run(&mut self, first: Vec<String>) {
        let Some((mut op, mut deadline)) = self.take(Some(&first)) else {
            return;
        };
        loop {
            let sent = Instant::now();
            let answers = self.send(op, deadline).await;
            if self.shared.adaptive {
                // A statement that failed or ran out of budget counts as one
                // that waited on no flush: it takes a place away.
                let waited = S::commit_wait(&self.held).unwrap_or_default();
                let most = self.shared.most;
                self.shared.lock().note(waited, sent.elapsed(), most);
            }
            self.sent_on_held += 1;
            if self.sent_on_held == HOLD_STATEMENTS {
                self.let_go();
            }
            let told = self.answer(answers);
            let lone = told.windows(2).all(|two| two[0].0.call == two[1].0.call);
            let waiting = self.shared.lock().ready.len();
            let store = if lone && waiting == 0 {
                // Back to its source idle before a lone call hears: it may
                // have lent the connection, and want it back.
                self.let_go();
                self.store.take().as_ref().map(Arc::downgrade)
            } else {
                None
            };
            if waiting < MAX_PAIRS {
                // The callers told may come back with more: the place is
                // kept until each has its answer, so that they go in the
                // next statement with the callers waiting, not the one after.
                gather(told).await;
            } else {
                tell(told, None);
            }
            let next = self.take(None);
            if let (Some(_), Some(store)) = (&next, store) {
                // Callers wait, and hold the limiter, and so the store.
                self.store = store.upgrade();
            }
            let Some(next) = next else {
                return;
            };
            (op, deadline) = next;
        }
    }

    /// Gives back the connection held; the next statement takes one anew.
    fn let_go(&mut self) {
        self.held = S::Held::default();
        self.sent_on_held = 0;
    }

    /// Takes the keys waiting (at most [`MAX_PAIRS`]; only `only`'s, if
    /// given) and their callers for the next statement, with its operation
    /// and deadline; `None`, giving the place back, when nothing waits.
    fn take(&mut self, only: Option<&[String]>) -> Option<(Counting, Instant)> {
        let mut queue = self.shared.lock();
        if only.is_none() && queue.in_flight > queue.places {
            // The places fell: this flight gives its own up, and the others
            // send what waits.
            debug_assert!(self.holding, "a flight in flight holds a place");
            queue.in_flight -= 1;
            self.holding = false;
            return None;
        }
        let mut op = None;
        let mut deadline: Option<Instant> = None;
        let mut only = only.map(|keys| keys.iter());
        while self.members.len() < MAX_PAIRS {
            let next = match &mut only {
                None => queue.ready.pop_front(),
                Some(keys) => {
                    let Some(key) = keys.next() else {
                        break;
                    };
                    // Unless another flight took it.
                    match queue.ready.iter().position(|k| k == key) {
                        Some(at) => queue.ready.remove(at),
                        None => continue,
                    }
                }
            };
            let Some(key) = next else {
                break;
            };
            let Queue { keys, .. } = &mut *queue;
            // A ready key's entry leaves the map only once off `ready`.
            let waiting = keys.get_mut(&key);
            debug_assert!(waiting.is_some(), "a ready key has its entry");
            let Some(waiting) = waiting else {
                continue;
            };
            waiting.callers.retain(|caller| !caller.tx.is_closed());
            if waiting.callers.is_empty() {
                // Every caller of the key went away before it was sent.
                keys.remove(&key);
                continue;
            }
            let callers = std::mem::take(&mut waiting.callers);
            let latest = callers.iter().map(|c| c.deadline).max();
            deadline = deadline.max(latest);
            op.get_or_insert(waiting.op);
            self.members.push(Member {
                key,
                limit: waiting.limit.clone(),
                callers,
            });
        }
        match (op, deadline) {
            (Some(op), Some(deadline)) => Some((op, deadline)),
            // Its first keys went with another flight: it sends the rest.
            _ if only.is_some() => {
                drop(queue);
                self.take(None)
            }
            _ => {
                // Given back once: here, or by `drop`.
                debug_assert!(
                    self.holding && queue.in_flight > 0,
                    "a place given back twice"
                );
                queue.in_flight -= 1;
                self.holding = false;
                None
            }
        }
    }

    /// One statement for the members; each key's count after all its callers.
    async fn send(&mut self, op: Counting, deadline: Instant) -> Vec<Answer> {
        let Flight {
            store,
            held,
            members,
            ..
        } = self;
        let Some(store) = store.as_deref() else {
            let abandoned = abandoned();
            return vec![Err(abandoned); members.len()];
        };
        // A key is ready at most once and never while in flight: `add_many`
        // given a key twice would answer both the total.
        debug_assert!(members.len() <= MAX_PAIRS);
        debug_assert!(
            {
                let mut keys = std::collections::HashSet::new();
                members.iter().all(|member| keys.insert(&member.key))
            },
            "a key in two places of one statement"
        );
        let n = |member: &Member| member.callers.iter().map(|c| c.cost).sum::<u64>();
        if let [member] = &members[..] {
            let counted = store
                .count(op, &member.limit, &member.key, n(member), deadline, held)
                .await;
            return vec![counted.map_err(Arc::new)];
        }
        let asked: Vec<Asked<'_>> = members
            .iter()
            .map(|member| Asked {
                limit: &member.limit,
                key: &member.key,
                n: n(member),
            })
            .collect();
        match store.count_many(op, &asked, deadline, held).await {
            Ok(counted) if counted.len() == members.len() => counted.into_iter().map(Ok).collect(),
            Ok(_) => {
                // The store answers one count per pair asked, or errs.
                let e = abandoned();
                vec![Err(e); members.len()]
            }
            Err(e) => vec![Err(Arc::new(e)); members.len()],
        }
    }

    /// Each member's callers with their answers, each its own position's
    /// count; keys with callers that came meanwhile are queued again.
    fn answer(&mut self, answers: Vec<Answer>) -> Vec<(Caller, Answer)> {
        debug_assert_eq!(answers.len(), self.members.len(), "one answer per key");
        let mut told = Vec::new();
        let mut queue = self.shared.lock();
        for (member, answer) in self.members.drain(..).zip(answers) {
            // What the callers after each one added.
            let mut after: u64 = member.callers.iter().map(|c| c.cost).sum();
            for caller in member.callers {
                after -= caller.cost;
                let answer = answer.clone().map(|counted| at_position(counted, after));
                told.push((caller, answer));
            }
            let Queue { keys, ready, .. } = &mut *queue;
            // In flight, its entry stays and it is not ready: queued again
            // at most once.
            let waiting = keys.get_mut(&member.key);
            debug_assert!(waiting.is_some(), "a key in flight has its entry");
            if let Some(waiting) = waiting {
                if waiting.callers.is_empty() {
                    keys.remove(&member.key);
                } else {
                    ready.push_back(member.key);
                }
            }
        }
        told
    }
}

impl<S: Sealed> Drop for Flight<S> {
    fn drop(&mut self) {
        if !self.members.is_empty() {
            let abandoned = abandoned();
            let told = self.answer(vec![Err(abandoned); self.members.len()]);
            tell(told, None);
        }
        if !self.holding {
            return;
        }
        let stranded = {
            let mut queue = self.shared.lock();
            queue.in_flight = queue.in_flight.saturating_sub(1);
            if queue.in_flight > 0 {
                // Another flight sends what is queued.
                Vec::new()
            } else {
                let Queue { keys, ready, .. } = &mut *queue;
                ready
                    .drain(..)
                    .filter_map(|key| keys.remove(&key))
                    .flat_map(|waiting| waiting.callers)
                    .collect::<Vec<_>>()
            }
        };
        let abandoned = abandoned();
        for caller in stranded {
            let _ = caller.tx.send((Err(abandoned.clone()), None));
        }
    }
}

/// A commit wait from which a statement is flush-bound: a commit of a
/// hosted database's, not a local disk's fraction of a millisecond.
const FLUSH_BOUND: Duration = Duration::from_millis(1);

/// What the statements' commits waited and what the statements took, each
/// an average over the last few (a commit another's flush already covered
/// waits nothing).
#[derive(Default)]
struct Commits {
    waited: Duration,
    took: Duration,
}

impl Queue {
    /// Notes a statement that took `took`, its commit having waited
    /// `waited`, and sets the places by [`places_after`].
    fn note(&mut self, waited: Duration, took: Duration, most: usize) {
        // The first statement stands for itself.
        let first = self.commits.took.is_zero();
        let average = |mean: Duration, x: Duration| if first { x } else { (mean * 7 + x) / 8 };
        self.commits.waited = average(self.commits.waited, waited);
        self.commits.took = average(self.commits.took, took);
        let queued = !self.ready.is_empty();
        self.places = places_after(self.places, most, &self.commits, queued);
    }
}

/// How many flights may be in flight, `queued` writes waiting for a place
/// or not, from one up to `most` ([how many places](crate::guide#merging)).
fn places_after(places: usize, most: usize, commits: &Commits, queued: bool) -> usize {
    let Commits { waited, took } = *commits;
    if waited < FLUSH_BOUND || waited * 4 < took {
        places.saturating_sub(1).max(1)
    } else if queued && waited * 2 >= took {
        (places + 1).min(most)
    } else {
        places
    }
}

/// Tells each caller its answer; with `gathering`, each answer carries the
/// caller's [`Back`].
fn tell(told: Vec<(Caller, Answer)>, gathering: Option<&Arc<Gathering>>) {
    for (caller, answer) in told {
        let back = gathering.map(|gathering| Back(gathering.clone()));
        let _ = caller.tx.send((answer, back));
    }
}

/// Tells `told`, then waits until each has its answer, at most
/// [`GATHER_AT_MOST`]: a caller that keeps its call unpolled holds no one
/// up for longer.
async fn gather(told: Vec<(Caller, Answer)>) {
    let gathering = Arc::new(Gathering {
        left: AtomicUsize::new(told.len()),
        all: Notify::new(),
    });
    tell(told, Some(&gathering));
    let _ = tokio::time::timeout(GATHER_AT_MOST, gathering.all.notified()).await;
}

/// The count a caller sees, the callers after it having added `after`.
fn at_position(mut counted: Counted, after: u64) -> Counted {
    counted.count = counted.count.saturating_sub(after);
    counted
}

#[cfg(test)]
mod tests;
