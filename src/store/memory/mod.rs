//! [`Memory`]: the in-process fake, for callers' unit tests.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::clock::{Clock, from_micros, micros_since_epoch};
use crate::decide::{Counted, Counting, decision, window_of};
use crate::store::{Asked, Store, sealed};
use crate::{AuditAction, AuditEntry, Error, Limit, ManualClock, Strategy};

/// The in-process fake: the same behaviour as [`Postgres`](crate::Postgres),
/// kept in a map, for callers' unit tests.
///
/// **Not a production limiter.** Its counts live in one process: three
/// replicas give three limits, and a restart resets them. It keeps every
/// window it has seen. The tests hold it to agree with `Postgres`, verdict
/// for verdict.
///
/// ```
/// use platformkit_limit::{Key, Limit, Limiter, Memory};
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(Memory::new());
/// let login = Limit::new("login", 2, Duration::from_secs(60))?;
/// let alice = Key::opaque("alice");
/// limiter.failed(&login, &alice).await?;
/// let verdict = limiter.failed(&login, &alice).await?;
/// assert!(verdict.is_refused());
/// assert!(limiter.check(&login, &alice).await?.is_refused());
/// # Ok::<(), platformkit_limit::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Default)]
pub struct Memory {
    state: Mutex<State>,
    clock: Clock,
    /// The most keys it holds, for the limiter's local count; `None` for
    /// the fake.
    capacity: Option<usize>,
}

/// The keys and their windows.
#[derive(Debug, Default)]
struct State {
    keys: HashMap<String, Windows>,
    limits: BTreeMap<String, Limit>,
    /// Each blocked stored key, and its block's end in microseconds.
    blocks: HashMap<String, i64>,
    /// The audit, oldest first.
    audit: Vec<AuditEntry>,
    /// Bounded: when a full map may next be swept, in microseconds.
    next_sweep: i64,
}

/// One key's windows: each window's start and its count.
#[derive(Debug, Default)]
struct Windows {
    counts: BTreeMap<i64, u64>,
    /// The windows a write left at its limit's max, as the table's `at_max`:
    /// the only ones the listing reads.
    at_max: BTreeSet<i64>,
    /// Bounded: until when a verdict may still read one of these windows;
    /// past it the key can go.
    read_until: i64,
}

/// How often, at most, a full local count sweeps out keys nothing reads:
/// a flood of new keys costs one pass a second, not one a call.
const SWEEP_EVERY_MICROS: i64 = 1_000_000;

impl Memory {
    /// An empty fake on the system clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the time from `clock`: for tests that pin the time.
    pub fn with_clock(mut self, clock: ManualClock) -> Self {
        self.clock = Clock::Manual(clock);
        self
    }

    /// The limiter's local count: at most `keys` keys, dropping windows no
    /// verdict reads as it writes.
    pub(crate) fn bounded(keys: usize) -> Self {
        Memory {
            capacity: Some(keys),
            ..Self::default()
        }
    }

    pub(crate) fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().keys.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One counting operation at `now`; `None` when the key is not held and
    /// a bounded map has no room for it (nothing is counted).
    pub(crate) fn count_at(
        &self,
        op: Counting,
        limit: &Limit,
        key: &str,
        n: u64,
        now: SystemTime,
    ) -> Option<Counted> {
        let now_micros = micros_since_epoch(now);
        let mut state = self.lock();
        if !state.keys.contains_key(key) && !self.room_for_one(&mut state, now_micros) {
            return None;
        }
        Some(self.count_in(&mut state, op, limit, key, n, now_micros))
    }

    /// One counting operation at `now_micros`, with room for the key.
    fn count_in(
        &self,
        state: &mut State,
        op: Counting,
        limit: &Limit,
        key: &str,
        n: u64,
        now_micros: i64,
    ) -> Counted {
        let (start, end) = window_of(now_micros, limit.window_secs());
        let blocked = state
            .blocks
            .get(key)
            .copied()
            .filter(|&until| until > now_micros);
        let windows = &mut state.keys;
        let width = end - start;
        let previous = match limit.strategy() {
            Strategy::Sliding => windows
                .get(key)
                .and_then(|w| w.counts.get(&(start - width)))
                .copied()
                .unwrap_or(0),
            Strategy::Fixed => 0,
        };
        let lockout = i64::try_from(limit.lockout_secs()).unwrap_or(i64::MAX) * 1_000_000;
        let locked_until = if lockout > 0 {
            windows.get(key).and_then(|w| {
                w.counts
                    .iter()
                    .filter(|&(&s, &count)| s < start && count >= u64::from(limit.max()))
                    .map(|(&s, _)| s + width + lockout)
                    .filter(|&until| until > now_micros)
                    .max()
                    .map(from_micros)
            })
        } else {
            None
        };
        let locked_until = locked_until.max(blocked.map(from_micros));
        let count = if op.adds() {
            let key_windows = windows.entry(key.to_owned()).or_default();
            let count = key_windows.counts.entry(start).or_insert(0);
            *count = count.saturating_add(n).min(MAX_COUNT);
            let count = *count;
            let left = Counted {
                count,
                previous,
                locked_until: None,
                window_end: from_micros(end),
                now: from_micros(now_micros),
            };
            if !decision(Counting::CHECK, limit, 1, &left).allowed {
                key_windows.at_max.insert(start);
            }
            if self.capacity.is_some() {
                key_windows.keep_what_is_read(limit, start, width, lockout, now_micros);
            }
            count
        } else {
            windows
                .get(key)
                .and_then(|w| w.counts.get(&start))
                .copied()
                .unwrap_or(0)
        };
        Counted {
            count,
            previous,
            locked_until,
            window_end: from_micros(end),
            now: from_micros(now_micros),
        }
    }

    /// Whether a bounded map has room for one more key, after a sweep at
    /// most once per [`SWEEP_EVERY_MICROS`].
    fn room_for_one(&self, state: &mut State, now: i64) -> bool {
        let Some(capacity) = self.capacity else {
            return true;
        };
        if state.keys.len() < capacity {
            return true;
        }
        // A clock moved back is no reason to wait for the next sweep.
        if now >= state.next_sweep || now < state.next_sweep - SWEEP_EVERY_MICROS {
            state.keys.retain(|_, w| w.read_until > now);
            state.next_sweep = now.saturating_add(SWEEP_EVERY_MICROS);
        }
        state.keys.len() < capacity
    }
}

impl Windows {
    /// Keeps only the windows a verdict can still read: the current one
    /// and later (a clock moved back), the one before, and the latest full
    /// one whose lockout runs. Sets until when any of them is read.
    fn keep_what_is_read(&mut self, limit: &Limit, start: i64, width: i64, lockout: i64, now: i64) {
        let max = u64::from(limit.max());
        let previous = start - width;
        let locking = self
            .counts
            .range(..previous)
            .rev()
            .find(|&(_, &count)| count >= max)
            .map(|(&s, _)| s)
            .filter(|&s| lockout > 0 && s.saturating_add(width).saturating_add(lockout) > now);
        self.counts
            .retain(|&s, _| s >= previous || Some(s) == locking);
        let counts = &self.counts;
        self.at_max.retain(|s| counts.contains_key(s));
        self.read_until = self
            .counts
            .iter()
            .map(|(&s, &count)| {
                // Read by the next window (sliding), or until its lockout ends.
                let next_ends = s.saturating_add(width.saturating_mul(2));
                if lockout > 0 && count >= max {
                    next_ends.max(s.saturating_add(width).saturating_add(lockout))
                } else {
                    next_ends
                }
            })
            .max()
            .unwrap_or(i64::MIN);
    }
}

/// The largest count, as in PostgreSQL's `bigint`.
const MAX_COUNT: u64 = i64::MAX as u64;

impl Store for Memory {}

impl sealed::Sealed for Memory {
    type Held = ();

    fn local_now(&self) -> SystemTime {
        self.clock.local_now()
    }

    /// A wait in front of `Memory` is this process's own load: never down.
    async fn down_before(&self) -> bool {
        false
    }

    async fn down_after(&self, _error: &Error) -> bool {
        false
    }

    async fn count(
        &self,
        op: Counting,
        limit: &Limit,
        key: &str,
        n: u64,
        _deadline: Instant,
        _held: &mut (),
    ) -> Result<Counted, Error> {
        // Unbounded: always room.
        let now = micros_since_epoch(self.clock.local_now());
        Ok(self.count_in(&mut self.lock(), op, limit, key, n, now))
    }

    async fn count_many(
        &self,
        op: Counting,
        asked: &[Asked<'_>],
        _deadline: Instant,
        _held: &mut (),
    ) -> Result<Vec<Counted>, Error> {
        let now = micros_since_epoch(self.clock.local_now());
        let mut state = self.lock();
        Ok(asked
            .iter()
            .map(|pair| self.count_in(&mut state, op, pair.limit, pair.key, pair.n, now))
            .collect())
    }

    async fn count_all_or_none(
        &self,
        asked: &[Asked<'_>],
        _deadline: Instant,
    ) -> Result<(Vec<Counted>, bool), Error> {
        let now = micros_since_epoch(self.clock.local_now());
        let mut state = self.lock();
        let before: Vec<Counted> = asked
            .iter()
            .map(|pair| self.count_in(&mut state, Counting::CHECK, pair.limit, pair.key, 0, now))
            .collect();
        let every_one_allows = asked.iter().zip(&before).all(|(pair, before)| {
            let after = Counted {
                count: before.count.saturating_add(pair.n).min(MAX_COUNT),
                ..before.clone()
            };
            let cost = u32::try_from(pair.n).unwrap_or(u32::MAX);
            decision(Counting::HIT, pair.limit, cost, &after).allowed
        });
        if !every_one_allows {
            return Ok((before, false));
        }
        let counted = asked
            .iter()
            .map(|pair| self.count_in(&mut state, Counting::HIT, pair.limit, pair.key, pair.n, now))
            .collect();
        Ok((counted, true))
    }

    async fn take_back(
        &self,
        key: &str,
        window_start: SystemTime,
        n: u64,
        _deadline: Instant,
    ) -> Result<u64, Error> {
        let start = micros_since_epoch(window_start);
        let mut state = self.lock();
        let count = state
            .keys
            .get_mut(key)
            .and_then(|w| w.counts.get_mut(&start))
            .map_or(0, |count| {
                *count = count.saturating_sub(n);
                *count
            });
        Ok(count)
    }

    async fn refused(
        &self,
        limit: &Limit,
        prefix: &str,
        at_most: usize,
        _deadline: Instant,
    ) -> Result<Vec<(String, Counted)>, Error> {
        let now = micros_since_epoch(self.clock.local_now());
        let mut state = self.lock();
        let width = i64::try_from(limit.window_secs()).unwrap_or(i64::MAX) * 1_000_000;
        let lockout = i64::try_from(limit.lockout_secs()).unwrap_or(i64::MAX) * 1_000_000;
        // As the SQL: only keys a write left at its max, in a window that
        // can still refuse, and blocked keys.
        let mut keys: Vec<(String, i64)> = state
            .keys
            .iter()
            .filter(|(key, w)| {
                key.starts_with(prefix)
                    && w.at_max.iter().any(|&s| {
                        s.saturating_add(width) > now.saturating_sub(width).saturating_sub(lockout)
                    })
            })
            .map(|(key, w)| {
                let latest = w.counts.keys().next_back().copied().unwrap_or(i64::MIN);
                (key.clone(), latest)
            })
            .collect();
        for (key, &until) in &state.blocks {
            if key.starts_with(prefix) && until > now && !keys.iter().any(|(k, _)| k == key) {
                keys.push((key.clone(), i64::MIN));
            }
        }
        let mut refused: Vec<(i64, String, Counted)> = keys
            .into_iter()
            .filter_map(|(key, latest)| {
                let counted = self.count_in(&mut state, Counting::CHECK, limit, &key, 0, now);
                let refused = !decision(Counting::CHECK, limit, 1, &counted).allowed;
                refused.then_some((latest, key, counted))
            })
            .collect();
        // Newest first, as the SQL orders them.
        refused.sort_by(|a, b| {
            (b.0.cmp(&a.0))
                .then(b.2.count.cmp(&a.2.count))
                .then(a.1.cmp(&b.1))
        });
        refused.truncate(at_most);
        Ok(refused
            .into_iter()
            .map(|(_, key, counted)| (key, counted))
            .collect())
    }

    async fn define(&self, limit: &Limit, _deadline: Instant) -> Result<(), Error> {
        let defined = limit.defined();
        self.lock()
            .limits
            .insert(defined.name().to_owned(), defined);
        Ok(())
    }

    async fn limits(&self, _deadline: Instant) -> Result<Vec<Limit>, Error> {
        Ok(self.lock().limits.values().cloned().collect())
    }

    async fn operate(
        &self,
        action: AuditAction,
        key: &str,
        block_for: Duration,
        (by, reason): (&str, &str),
        _deadline: Instant,
    ) -> Result<(u64, Option<SystemTime>), Error> {
        let now = self.clock.local_now();
        let mut state = self.lock();
        let mut deleted = u64::from(state.blocks.remove(key).is_some());
        let until = match action {
            AuditAction::Block => {
                let until = now + block_for;
                state
                    .blocks
                    .insert(key.to_owned(), micros_since_epoch(until));
                Some(until)
            }
            AuditAction::Unblock => None,
            AuditAction::Unlock => {
                deleted += state.keys.remove(key).map_or(0, |w| w.counts.len() as u64);
                None
            }
        };
        state.audit.push(AuditEntry {
            at: now,
            by: by.to_owned(),
            action,
            stored: key.to_owned(),
            until,
            windows: (action != AuditAction::Block).then_some(deleted),
            reason: reason.to_owned(),
        });
        Ok((deleted, until))
    }

    async fn audit(
        &self,
        prefix: &str,
        at_most: usize,
        _deadline: Instant,
    ) -> Result<Vec<AuditEntry>, Error> {
        let state = self.lock();
        Ok(state
            .audit
            .iter()
            .rev()
            .filter(|entry| entry.stored.starts_with(prefix))
            .take(at_most)
            .cloned()
            .collect())
    }

    async fn reset(&self, key: &str, _deadline: Instant) -> Result<u64, Error> {
        Ok(self
            .lock()
            .keys
            .remove(key)
            .map_or(0, |w| w.counts.len() as u64))
    }
}

#[cfg(test)]
mod tests;
