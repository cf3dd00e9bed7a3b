//! [`Verdict`], and the one pure function that turns a count into a verdict.
//!
//! Both stores only load and store counts; [`decide`] is shared by
//! [`Postgres`](crate::Postgres) and [`Memory`](crate::Memory), so the two
//! cannot drift apart.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::store::{Counted, Op};
use crate::{Error, Limit};

/// The answer to "may this attempt go ahead?".
///
/// Being refused is an outcome, not an error. A verdict is one of three
/// things:
///
/// - **allowed**: the store answered and the key is within its limit;
/// - **refused**: the store answered and the key has used up its window;
///   [`retry_after`](Verdict::retry_after) says how long until it reopens;
/// - **allowed because unreachable**: the store could not be reached within
///   the budget, so the attempt is allowed (fail-open) and
///   [`unreachable`](Verdict::unreachable) gives the cause.
///
/// What "allowed" means depends on the call:
///
/// | call     | the count is                | allowed when         |
/// |----------|-----------------------------|----------------------|
/// | `check`  | the failures so far         | count < max          |
/// | `failed` | the failures, this one too  | count < max: the next attempt may go ahead |
/// | `hit`    | the asks, this one too      | count ≤ max: this ask may go ahead |
#[derive(Clone, Debug)]
pub struct Verdict {
    state: State,
}

#[derive(Clone, Debug)]
enum State {
    Counted {
        allowed: bool,
        count: u64,
        max: u32,
        reopens_at: SystemTime,
        now: SystemTime,
    },
    Unreachable(Arc<Error>),
}

impl Verdict {
    /// Whether the attempt may go ahead: the key is within its limit, or the
    /// store could not be reached (see [`Verdict::is_unreachable`]).
    pub fn is_allowed(&self) -> bool {
        match &self.state {
            State::Counted { allowed, .. } => *allowed,
            State::Unreachable(_) => true,
        }
    }

    /// Whether the attempt must not go ahead.
    pub fn is_refused(&self) -> bool {
        !self.is_allowed()
    }

    /// Whether the store could not be reached, so the attempt was allowed
    /// without a count.
    pub fn is_unreachable(&self) -> bool {
        matches!(self.state, State::Unreachable(_))
    }

    /// Why the store could not be reached, when it could not.
    pub fn unreachable(&self) -> Option<&Error> {
        match &self.state {
            State::Counted { .. } => None,
            State::Unreachable(cause) => Some(cause),
        }
    }

    /// The key's count in the current window (see the table above); `None`
    /// when the store could not be reached.
    pub fn count(&self) -> Option<u64> {
        match &self.state {
            State::Counted { count, .. } => Some(*count),
            State::Unreachable(_) => None,
        }
    }

    /// How many more attempts the current window allows; `None` when the
    /// store could not be reached.
    pub fn remaining(&self) -> Option<u64> {
        match &self.state {
            State::Counted { count, max, .. } => Some(u64::from(*max).saturating_sub(*count)),
            State::Unreachable(_) => None,
        }
    }

    /// When the current window closes and the count starts again; `None`
    /// when the store could not be reached.
    pub fn reopens_at(&self) -> Option<SystemTime> {
        match &self.state {
            State::Counted { reopens_at, .. } => Some(*reopens_at),
            State::Unreachable(_) => None,
        }
    }

    /// For a refusal, how long until the window reopens, measured on the
    /// store's clock: the value for a `Retry-After` header (round it up to
    /// whole seconds). `None` unless refused.
    ///
    /// ```
    /// # fn header(verdict: &platformkit_limit::Verdict) -> Option<String> {
    /// verdict
    ///     .retry_after()
    ///     .map(|wait| wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
    ///     .map(|secs| secs.to_string())
    /// # }
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match &self.state {
            State::Counted {
                allowed: false,
                reopens_at,
                now,
                ..
            } => Some(reopens_at.duration_since(*now).unwrap_or_default()),
            _ => None,
        }
    }

    pub(crate) fn unreachable_because(cause: Error) -> Self {
        Verdict {
            state: State::Unreachable(Arc::new(cause)),
        }
    }
}

/// The window holding `now` for windows of `window_secs`: its start and end,
/// in microseconds since the Unix epoch. The same arithmetic as the SQL's
/// `date_bin(window, now, epoch)`.
pub(crate) fn window_of(now_micros: i64, window_secs: u64) -> (i64, i64) {
    let width = i64::try_from(window_secs).unwrap_or(i64::MAX / 1_000_000) * 1_000_000;
    let start = now_micros.div_euclid(width) * width;
    (start, start + width)
}

/// Turns what a store counted into a verdict: the one decision both stores
/// share.
pub(crate) fn decide(op: Op, limit: &Limit, counted: &Counted) -> Verdict {
    let max = u64::from(limit.max());
    let allowed = match op {
        Op::Check | Op::Failed => counted.count < max,
        Op::Hit => counted.count <= max,
    };
    Verdict {
        state: State::Counted {
            allowed,
            count: counted.count,
            max: limit.max(),
            reopens_at: counted.window_end,
            now: counted.now,
        },
    }
}
