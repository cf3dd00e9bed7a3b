//! [`Verdict`], and the one pure function that turns a count into a verdict.
//!
//! Both stores only load and store counts; [`decide`] is shared by
//! [`Postgres`](crate::Postgres) and [`Memory`](crate::Memory), so the two
//! cannot drift apart.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::clock::{from_micros, micros_since_epoch};
use crate::store::{Counted, Op};
use crate::{Error, Limit, Strategy};

/// The answer to "may this attempt go ahead?".
///
/// Being refused is an outcome, not an error. A verdict is one of:
///
/// - **allowed**: the store answered and the key is within its limit;
/// - **refused**: the store answered and the key has used up its window;
///   [`retry_after`](Verdict::retry_after) says how long until it reopens;
/// - **unreachable**: the store could not be reached within the budget, and
///   the limit's [`WhenUnreachable`](crate::WhenUnreachable) decided: allowed
///   without a count (the default, fail-open), refused, or decided by a local
///   in-process count. [`unreachable`](Verdict::unreachable) gives the cause.
///
/// What "allowed" means depends on the call:
///
/// | call      | the count is                | allowed when         |
/// |-----------|-----------------------------|----------------------|
/// | `check`   | the failures so far         | count < max          |
/// | `failed`  | the failures, this one too  | count < max: the next attempt may go ahead |
/// | `hit`     | the asks, this one too      | count ≤ max: this ask may go ahead |
/// | `reserve` | the attempts, this one too  | count ≤ max: this attempt may go ahead |
#[derive(Clone, Debug)]
pub struct Verdict {
    limit: Arc<str>,
    allowed: bool,
    counts: Option<Counts>,
    unreachable: Option<Arc<Error>>,
}

#[derive(Clone, Debug)]
struct Counts {
    count: u64,
    max: u32,
    window_end: SystemTime,
    now: SystemTime,
}

impl Verdict {
    /// Whether the attempt may go ahead.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the attempt must not go ahead.
    pub fn is_refused(&self) -> bool {
        !self.allowed
    }

    /// The name of the limit this verdict is for.
    pub fn limit(&self) -> &str {
        &self.limit
    }

    /// Whether the store could not be reached, so the limit's
    /// [`WhenUnreachable`](crate::WhenUnreachable) decided.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable.is_some()
    }

    /// Why the store could not be reached, when it could not.
    pub fn unreachable(&self) -> Option<&Error> {
        self.unreachable.as_deref()
    }

    /// The key's count in the current window (see the table above), or for a
    /// sliding limit the weighted estimate, rounded up: the store's, or the
    /// local fallback's when the store was unreachable and the limit falls
    /// back to a local count; `None` when nothing counted.
    pub fn count(&self) -> Option<u64> {
        self.counts.as_ref().map(|c| c.count)
    }

    /// How many more attempts the current window allows; `None` when
    /// nothing counted.
    pub fn remaining(&self) -> Option<u64> {
        self.counts
            .as_ref()
            .map(|c| u64::from(c.max).saturating_sub(c.count))
    }

    /// For an allowed verdict, when the current window closes; for a
    /// refusal, the first moment the next attempt may go ahead (the window's
    /// end, the moment a sliding estimate falls below max, or the end of a
    /// lockout). `None` when nothing counted.
    pub fn reopens_at(&self) -> Option<SystemTime> {
        self.counts.as_ref().map(|c| c.window_end)
    }

    /// For a refusal, how long until the window reopens, measured on the
    /// store's clock (for a refusal answered from the refusal cache, on this
    /// process's); [`retry_after_secs`](Verdict::retry_after_secs) gives it
    /// as a `Retry-After` header wants it. `None` unless refused by a count
    /// (a refusal because the store is unreachable has no reopening time).
    pub fn retry_after(&self) -> Option<Duration> {
        match (&self.counts, self.allowed) {
            (Some(c), false) => Some(c.window_end.duration_since(c.now).unwrap_or_default()),
            _ => None,
        }
    }

    /// How long until [`reopens_at`](Verdict::reopens_at), on the same
    /// clock as [`retry_after`](Verdict::retry_after), whether allowed or
    /// refused; `None` when nothing counted.
    pub(crate) fn reopens_in(&self) -> Option<Duration> {
        self.counts
            .as_ref()
            .map(|c| c.window_end.duration_since(c.now).unwrap_or_default())
    }

    /// A verdict nothing counted: the store was unreachable and the limit
    /// allows (or refuses) without a count.
    pub(crate) fn uncounted(limit: &Limit, allowed: bool, cause: Arc<Error>) -> Self {
        Verdict {
            limit: limit.name_arc().clone(),
            allowed,
            counts: None,
            unreachable: Some(cause),
        }
    }

    /// This refusal as answered later from the refusal cache, at local time
    /// `now`, reopening at local time `until`.
    pub(crate) fn seen_at(&self, now: SystemTime, until: SystemTime) -> Self {
        let mut seen = self.clone();
        if let Some(counts) = &mut seen.counts {
            counts.now = now;
            counts.window_end = until;
        }
        seen
    }

    /// This verdict, marked as given while the store was unreachable.
    pub(crate) fn because_unreachable(mut self, cause: Arc<Error>) -> Self {
        self.unreachable = Some(cause);
        self
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
///
/// In microseconds over a window of width `w` that began `e` ago, with
/// `prev` the previous window's count (0 for fixed windows) and `cur` the
/// current one's, the estimate times `w` is `prev × (w − e) + cur × w`. An
/// attempt may go ahead while the estimate is below `max`: `check` and
/// `failed` compare the estimate as it stands, `hit` the estimate before its
/// own ask. Integer arithmetic only, so both stores decide the same.
pub(crate) fn decide(op: Op, limit: &Limit, counted: &Counted) -> Verdict {
    let max = i128::from(limit.max());
    let w = i128::from(limit.window_secs()) * 1_000_000;
    let start = i128::from(micros_since_epoch(counted.window_end)) - w;
    let now = i128::from(micros_since_epoch(counted.now));
    let elapsed = (now - start).clamp(0, w);
    let prev = match limit.strategy() {
        Strategy::Sliding => i128::from(counted.previous),
        _ => 0,
    };
    let cur = i128::from(counted.count);
    let weighted = prev * (w - elapsed) + cur * w;
    let own = match op {
        Op::Hit => w,
        Op::Check | Op::Failed => 0,
    };
    // A lockout: an earlier window that reached max (the store says), or
    // the current one before this call's own ask.
    let locked_until = match limit.lockout_period() {
        Some(lockout) if cur - own / w >= max => {
            Some(counted.window_end + lockout).max(counted.locked_until)
        }
        Some(_) => counted.locked_until,
        None => None,
    }
    .filter(|&until| until > counted.now);
    let allowed = weighted - own < max * w && locked_until.is_none();
    let estimate = u64::try_from((weighted + w - 1) / w).unwrap_or(u64::MAX);
    let reopens_at = if allowed {
        counted.window_end
    } else {
        // The first moment the next attempt may go ahead: when the count
        // allows it and any lockout is over.
        let by_count = if weighted < max * w {
            counted.now
        } else {
            match limit.strategy() {
                Strategy::Sliding => reopening(prev, cur, max, w, start),
                // A fixed window starts again from zero.
                _ => counted.window_end,
            }
        };
        locked_until.map_or(by_count, |until| until.max(by_count))
    };
    Verdict {
        limit: limit.name_arc().clone(),
        allowed,
        counts: Some(Counts {
            count: estimate,
            max: limit.max(),
            window_end: reopens_at,
            now: counted.now,
        }),
        unreachable: None,
    }
}

/// For a sliding window whose estimate is at or above `max`, the first
/// instant at which it drops below, if nothing more is counted: within the current window while the previous window's
/// weight fades, or in the next one while the current window's does.
fn reopening(prev: i128, cur: i128, max: i128, w: i128, start: i128) -> SystemTime {
    let at = if cur < max {
        // prev × (w − e) < (max − cur) × w  ⇔  e > w − (max − cur) × w / prev
        // (prev > 0, or the estimate would already be below max).
        start + (w * prev - (max - cur) * w).div_euclid(prev.max(1)) + 1
    } else {
        // Next window: cur × (w − e') < max × w  ⇔  e' > w × (cur − max) / cur
        start + w + (w * (cur - max)).div_euclid(cur) + 1
    };
    from_micros(i64::try_from(at).unwrap_or(i64::MAX))
}
