//! A flight: the task that sends the queued keys' statements.

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

/// Starts a flight, whose place is already taken: first the keys `first`
/// (so a write that finds a place free goes at once), then whatever waits.
/// Made before the task, so a task dropped unrun still gives its place back.
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

/// A flight, holding one place. Dropped before its work is done, it
/// answers the callers it took and those left queued with no flight, and
/// gives its place back: no caller waits forever, no place is lost.
struct Flight<S: Sealed> {
    shared: Arc<Shared>,
    /// The store, let go before the last answers, so a caller that then
    /// drops its limiter gets back what its connection source owns.
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

    /// Takes the keys waiting (at most [`MAX_PAIRS`]; only `only`'s, if
    /// given) and their callers for the next statement: its operation and
    /// deadline, the latest of its callers'. `None`, giving the place back,
    /// when nothing waits.
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

    /// Sends one statement for the members, each key adding its callers'
    /// costs; each key's count after them all.
    async fn send(&self, op: Counting, deadline: Instant) -> Vec<Answer> {
        let Some(store) = self.store.as_deref() else {
            let abandoned = abandoned();
            return vec![Err(abandoned); self.members.len()];
        };
        // A key is ready at most once and never while in flight: `add_many`
        // given a key twice would answer both the total.
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

/// The count a caller sees, the callers after it having added `after`.
fn at_position(mut counted: Counted, after: u64) -> Counted {
    counted.count = counted.count.saturating_sub(after);
    counted
}
