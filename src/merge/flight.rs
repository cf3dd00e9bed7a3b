//! A flight: the task that sends the queued keys' statements, one after
//! another, and answers their callers.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Answer, Caller, Queue, Shared, abandoned};
use crate::Limit;
use crate::decide::Counted;
use crate::operation::Counting;
use crate::store::{Asked, MAX_PAIRS, sealed::Sealed};

/// One key of a statement: its callers, in order of arrival.
struct Member {
    key: String,
    limit: Limit,
    callers: Vec<Caller>,
}

/// Starts a flight on the runtime; its place is already taken. Its first
/// statement sends the keys `first` (the call that started it queued them),
/// so that a write that finds a place free goes at once, alone; then it
/// sends whatever waits. The flight is made before the task, so that a task
/// dropped unrun (the runtime shutting down) still gives its place back.
pub(super) fn start<S: Sealed>(shared: Arc<Shared>, store: Arc<S>, first: Vec<String>) {
    let mut flight = Flight {
        shared,
        store: Some(store),
        members: Vec::new(),
        holding: true,
    };
    tokio::spawn(async move {
        flight.run(first).await;
    });
}

/// A flight, holding one place. Dropped before its work is done (the
/// runtime shut down, or a panic unwound it), it answers the callers it
/// took, gives its place back, and answers the callers of every key left
/// queued with no flight to send it, so that no caller waits for a
/// statement that will never be sent and no place is lost.
struct Flight<S: Sealed> {
    shared: Arc<Shared>,
    /// The store, until nothing is left to send: let go before the last
    /// answers are given, so that a caller that then drops its limiter
    /// gets back what its connection source owns.
    store: Option<Arc<S>>,
    members: Vec<Member>,
    /// Whether it still holds its place.
    holding: bool,
}

impl<S: Sealed> Flight<S> {
    /// Sends statements until nothing waits.
    async fn run(&mut self, first: Vec<String>) {
        let Some((mut op, mut deadline)) = self.take(Some(&first)) else {
            return;
        };
        loop {
            let answers = self.send(op, deadline).await;
            let told = self.answer(answers);
            let next = self.take(None);
            let Some(next) = next else {
                self.store = None;
                tell(told);
                return;
            };
            tell(told);
            (op, deadline) = next;
        }
    }

    /// Takes the keys waiting now (at most [`MAX_PAIRS`]; of
    /// `only`'s, if given, those still waiting) and their callers still
    /// waiting, for the next statement: its operation and its deadline, the
    /// latest of its callers' (the statement goes on while any of them
    /// waits). `None`, giving the place back, when nothing waits.
    fn take(&mut self, only: Option<&[String]>) -> Option<(Counting, Instant)> {
        let mut queue = self.shared.lock();
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
                    // Still waiting for a statement, unless another flight
                    // took it already.
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
            // A key is ready only while its entry holds its callers: its
            // entry leaves the map only once the key is off `ready`.
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
            // Its first keys were taken by another flight: it sends what
            // else waits, if anything, so that nothing waits with no flight.
            _ if only.is_some() => {
                drop(queue);
                self.take(None)
            }
            _ => {
                // The place is given back once: here, or by `drop` if the
                // flight never got here.
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

    /// Sends one statement for the members: alone for one key, one
    /// `add_many` for several, each key adding the sum of its callers'
    /// costs. Each key's count after every caller's cost.
    async fn send(&self, op: Counting, deadline: Instant) -> Vec<Answer> {
        let Some(store) = self.store.as_deref() else {
            let abandoned = abandoned();
            return vec![Err(abandoned); self.members.len()];
        };
        // `take` keeps a statement to `MAX_PAIRS` keys, each its
        // own: a key is ready at most once and never while in flight, so
        // one flight at a time sends it. `add_many` relies on it: a key
        // given twice would add both amounts and answer both the total.
        debug_assert!(self.members.len() <= MAX_PAIRS);
        debug_assert!(
            {
                let mut keys = std::collections::HashSet::new();
                self.members.iter().all(|member| keys.insert(&member.key))
            },
            "a key in two places of one statement"
        );
        let n = |member: &Member| member.callers.iter().map(|c| c.cost).sum::<u64>();
        if let [member] = &self.members[..] {
            let counted = store
                .count(op, &member.limit, &member.key, n(member), deadline)
                .await;
            return vec![counted.map_err(Arc::new)];
        }
        let asked: Vec<Asked<'_>> = self
            .members
            .iter()
            .map(|member| Asked {
                limit: &member.limit,
                key: &member.key,
                n: n(member),
            })
            .collect();
        match store.count_many(op, &asked, deadline).await {
            Ok(counted) if counted.len() == self.members.len() => {
                counted.into_iter().map(Ok).collect()
            }
            Ok(_) => {
                // The store answers one count per pair asked, or errs.
                let e = abandoned();
                vec![Err(e); self.members.len()]
            }
            Err(e) => vec![Err(Arc::new(e)); self.members.len()],
        }
    }

    /// Each member's callers with their answers, each its own position's
    /// count, to be told; the keys whose callers came while it was in
    /// flight are queued again.
    fn answer(&mut self, answers: Vec<Answer>) -> Vec<(Caller, Answer)> {
        // One answer per member (`send` answers so), or a member's callers
        // would be dropped untold.
        debug_assert_eq!(answers.len(), self.members.len(), "one answer per key");
        let mut told = Vec::new();
        let mut queue = self.shared.lock();
        for (member, answer) in self.members.drain(..).zip(answers) {
            // What the callers after each one added: the count it sees is
            // the statement's less that.
            let mut after: u64 = member.callers.iter().map(|c| c.cost).sum();
            for caller in member.callers {
                after -= caller.cost;
                let answer = answer.clone().map(|counted| at_position(counted, after));
                told.push((caller, answer));
            }
            let Queue { keys, ready, .. } = &mut *queue;
            // In flight, its entry stays (`take` and `drop` remove only the
            // ready keys' entries); it is not ready, so it is queued again
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
            // The operation names only an out-of-budget answer, and these
            // are not: any counting operation does.
            let told = self.answer(vec![Err(abandoned); self.members.len()]);
            tell(told);
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
            let _ = caller.tx.send(Err(abandoned.clone()));
        }
    }
}

/// Tells each caller its answer; a caller that went away hears nothing.
fn tell(told: Vec<(Caller, Answer)>) {
    for (caller, answer) in told {
        let _ = caller.tx.send(answer);
    }
}

/// The count seen by a caller of a statement that left the count at
/// `counted.count`, the callers after it having added `after` (the sum of
/// their costs).
fn at_position(mut counted: Counted, after: u64) -> Counted {
    counted.count = counted.count.saturating_sub(after);
    counted
}
