//! [`Memory`]: the in-process fake, for callers' unit tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use tokio::time::Instant;

use crate::clock::{Clock, from_micros, micros_since_epoch};
use crate::decide::window_of;
use crate::store::{Asked, Counted, Op, Phase, Progress, Store, sealed};
use crate::{Error, Limit, ManualClock, Strategy};

/// The in-process fake: the same behaviour as [`Postgres`](crate::Postgres),
/// kept in a map, for callers' unit tests.
///
/// **Not a production limiter.** Its counts live in one process: three
/// replicas give three limits, and every deploy or restart resets them. That
/// is exactly the failure a limit in the database exists to prevent. It also
/// keeps every window it has seen (nothing purges it). The tests hold it to
/// agree with `Postgres`, verdict for verdict.
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
    windows: Mutex<HashMap<String, BTreeMap<i64, u64>>>,
    clock: Clock,
    /// Drop what `purge` would drop (windows closed a day and a window ago)
    /// as it goes: for the limiter's local fallback, which nothing purges.
    bounded: bool,
}

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

    /// A fake that drops what `purge` would drop as it writes: the
    /// limiter's local count while the database is unreachable.
    pub(crate) fn bounded() -> Self {
        Memory {
            bounded: true,
            ..Self::default()
        }
    }

    /// One counting operation at `now`.
    pub(crate) fn count_at(
        &self,
        op: Op,
        limit: &Limit,
        key: &str,
        n: u64,
        now: SystemTime,
    ) -> Counted {
        let now_micros = micros_since_epoch(now);
        let (start, end) = window_of(now_micros, limit.window_secs());
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let width = end - start;
        let previous = match limit.strategy() {
            Strategy::Sliding => windows
                .get(key)
                .and_then(|w| w.get(&(start - width)))
                .copied()
                .unwrap_or(0),
            Strategy::Fixed => 0,
        };
        let lockout = i64::try_from(limit.lockout_secs()).unwrap_or(i64::MAX) * 1_000_000;
        let locked_until = if lockout > 0 {
            windows.get(key).and_then(|w| {
                w.iter()
                    .filter(|&(&s, &count)| s < start && count >= u64::from(limit.max()))
                    .map(|(&s, _)| s + width + lockout)
                    .filter(|&until| until > now_micros)
                    .max()
                    .map(from_micros)
            })
        } else {
            None
        };
        let count = match op {
            Op::Check => windows
                .get(key)
                .and_then(|w| w.get(&start))
                .copied()
                .unwrap_or(0),
            Op::Failed | Op::Hit | Op::Reserve => {
                let key_windows = windows.entry(key.to_owned()).or_default();
                if self.bounded {
                    // What purge keeps: windows closed less than a day ago,
                    // or less than a window ago (lockouts and sliding
                    // windows read them).
                    let day = 24 * 60 * 60 * 1_000_000;
                    key_windows.retain(|&s, _| {
                        let end = s + width;
                        end >= now_micros - day || end >= now_micros - width
                    });
                }
                let count = key_windows.entry(start).or_insert(0);
                *count = count.saturating_add(n).min(MAX_COUNT);
                *count
            }
        };
        Counted {
            count,
            previous,
            locked_until,
            window_end: from_micros(end),
            now: from_micros(now_micros),
        }
    }
}

/// The largest count, as in PostgreSQL's `bigint`.
const MAX_COUNT: u64 = i64::MAX as u64;

impl Store for Memory {}

impl sealed::Sealed for Memory {
    fn local_now(&self) -> SystemTime {
        self.clock.local_now()
    }

    /// A wait in front of `Memory` is this process's own load: never down.
    fn down_since(&self, _since: Instant, _phase: Phase) -> bool {
        false
    }

    async fn count(
        &self,
        op: Op,
        limit: &Limit,
        key: &str,
        n: u64,
        _deadline: Instant,
        _progress: &Progress,
    ) -> Result<Counted, Error> {
        Ok(self.count_at(op, limit, key, n, self.clock.local_now()))
    }

    async fn count_many(
        &self,
        op: Op,
        asked: &[Asked<'_>],
        _deadline: Instant,
        _progress: &Progress,
    ) -> Result<Vec<Counted>, Error> {
        let now = self.clock.local_now();
        Ok(asked
            .iter()
            .map(|pair| self.count_at(op, pair.limit, pair.key, pair.n, now))
            .collect())
    }

    async fn take_back(
        &self,
        key: &str,
        window_start: SystemTime,
        n: u64,
        _deadline: Instant,
    ) -> Result<u64, Error> {
        let start = micros_since_epoch(window_start);
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let count = windows
            .get_mut(key)
            .and_then(|w| w.get_mut(&start))
            .map_or(0, |count| {
                *count = count.saturating_sub(n);
                *count
            });
        Ok(count)
    }

    async fn reset(&self, key: &str, _deadline: Instant) -> Result<u64, Error> {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(windows.remove(key).map_or(0, |w| w.len() as u64))
    }
}
