//! Where the limiter reads the time: the database's, or, in tests, a [`ManualClock`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A clock that stands still until it is moved: for deterministic tests. Clones share one time.
///
/// ```
/// use platformkit_limit::ManualClock;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_000));
/// let seen_by_limiter = clock.clone();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(seen_by_limiter.now(), UNIX_EPOCH + Duration::from_secs(1_005));
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<SystemTime>>,
}

impl ManualClock {
    /// A clock reading `now`, truncated to whole microseconds (PostgreSQL's precision).
    pub fn new(now: SystemTime) -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(truncate_to_micros(now))),
        }
    }

    /// The time the clock reads.
    pub fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the clock (to whole microseconds).
    pub fn set(&self, now: SystemTime) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = truncate_to_micros(now);
    }

    /// Moves the clock forward by `by` (to whole microseconds).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = truncate_to_micros(*now + by);
    }
}

/// Which clock a store reads.
#[derive(Clone, Debug, Default)]
pub(crate) enum Clock {
    /// The store's own (the system's for `Memory`).
    #[default]
    Store,
    /// A pinned clock.
    Manual(ManualClock),
}

impl Clock {
    /// The time as this process sees it.
    pub(crate) fn local_now(&self) -> SystemTime {
        self.pinned().unwrap_or_else(SystemTime::now)
    }

    /// The pinned time, if the clock is pinned.
    pub(crate) fn pinned(&self) -> Option<SystemTime> {
        match self {
            Clock::Store => None,
            Clock::Manual(clock) => Some(clock.now()),
        }
    }
}

/// Microseconds since the Unix epoch (negative before it).
pub(crate) fn micros_since_epoch(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => {
            let before = e.duration();
            // Round towards negative infinity, as PostgreSQL stores it.
            let micros = i64::try_from(before.as_micros()).unwrap_or(i64::MAX);
            if before.subsec_nanos() % 1_000 == 0 {
                -micros
            } else {
                -micros - 1
            }
        }
    }
}

/// The instant `micros` microseconds after the Unix epoch.
pub(crate) fn from_micros(micros: i64) -> SystemTime {
    if micros >= 0 {
        UNIX_EPOCH + Duration::from_micros(micros.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
    }
}

fn truncate_to_micros(t: SystemTime) -> SystemTime {
    from_micros(micros_since_epoch(t))
}
