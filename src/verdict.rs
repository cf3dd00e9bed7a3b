//! [`Verdict`]: the answer to one attempt; the arithmetic is [`decide`](crate::decide). And
//! its HTTP forms: `Retry-After`, and the `RateLimit-Policy` and `RateLimit` fields of
//! [draft-ietf-httpapi-ratelimit-headers-10](https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/10/),
//! as text: each limit one item named by the limit's name; the partition key (`pk`) never.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::{Error, Limit};

/// The answer to "may this attempt go ahead?".
///
/// Being refused is an outcome, not an error. A verdict may also be
/// [unreachable](Verdict::is_unreachable), [shed](Verdict::is_shed) or
/// [over max](Verdict::exceeds_max). What "allowed" means depends on the call:
///
/// | call      | the count is                | allowed when         |
/// |-----------|-----------------------------|----------------------|
/// | `check`   | the failures so far         | count < max          |
/// | `failed`  | the failures, this one too  | count < max: the next attempt may go ahead |
/// | `hit`     | the asks, this one too      | count ≤ max: this ask may go ahead |
/// | `reserve` | the attempts, this one too  | count ≤ max: this attempt may go ahead |
/// | `hit`, `reserve` of a [cost](crate::Ask::cost) | the units asked, this ask's cost too | count ≤ max |
#[derive(Clone, Debug)]
pub struct Verdict {
    limit: Arc<str>,
    allowed: bool,
    counts: Option<Counts>,
    unreachable: Option<Arc<Error>>,
    shed: Option<Arc<Error>>,
    /// Refused because the ask's cost is above the limit's max.
    over_max: bool,
}

#[derive(Clone, Debug)]
struct Counts {
    count: u64,
    max: u32,
    /// [`Verdict::reopens_at`].
    reopens_at: SystemTime,
    now: SystemTime,
}

impl Verdict {
    /// How long a shed call's client is asked to wait before it tries again.
    pub const SHED_RETRY_AFTER: Duration = Duration::from_secs(1);

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
    /// [`WhenUnreachable`](crate::WhenUnreachable) decided ([fail-open](crate::guide#fail-open)).
    pub fn is_unreachable(&self) -> bool {
        self.unreachable.is_some()
    }

    /// Why the store could not be reached, when it could not.
    pub fn unreachable(&self) -> Option<&Error> {
        self.unreachable.as_deref()
    }

    /// Whether the store was up but too busy, so the call was refused uncounted
    /// ([shed](crate::guide#down-or-overloaded)).
    pub fn is_shed(&self) -> bool {
        self.shed.is_some()
    }

    /// Whether the ask's [cost](crate::Ask::cost) is above the limit's max: refused at once,
    /// uncounted, with no `count` and no `retry_after` ([API quotas](crate::guide#api-quotas)).
    pub fn exceeds_max(&self) -> bool {
        self.over_max
    }

    /// Why the call was shed, when it was: an [`Overloaded`](crate::ErrorKind::Overloaded) error.
    pub fn shed(&self) -> Option<&Error> {
        self.shed.as_deref()
    }

    /// The key's count in the current window (the table above), or a sliding limit's estimate,
    /// rounded up; the local count's while the store is unreachable; `None` when nothing counted.
    pub fn count(&self) -> Option<u64> {
        self.counts.as_ref().map(|c| c.count)
    }

    /// How many more attempts the current window allows; `None` when nothing counted.
    pub fn remaining(&self) -> Option<u64> {
        self.counts
            .as_ref()
            .map(|c| u64::from(c.max).saturating_sub(c.count))
    }

    /// For an allowed verdict, when the current window closes; for a refusal, the first moment
    /// the next attempt may go ahead. `None` when nothing counted.
    pub fn reopens_at(&self) -> Option<SystemTime> {
        self.counts.as_ref().map(|c| c.reopens_at)
    }

    /// For a refusal by a count, how long until it reopens, on the store's clock (this process's,
    /// from the refusal cache); for a shed call, [`Verdict::SHED_RETRY_AFTER`]; else `None`.
    pub fn retry_after(&self) -> Option<Duration> {
        match (&self.counts, self.allowed) {
            (Some(c), false) => Some(c.reopens_at.duration_since(c.now).unwrap_or_default()),
            (None, false) if self.is_shed() => Some(Verdict::SHED_RETRY_AFTER),
            _ => None,
        }
    }

    /// How long until [`reopens_at`](Verdict::reopens_at), on `retry_after`'s clock.
    pub(crate) fn reopens_in(&self) -> Option<Duration> {
        self.counts
            .as_ref()
            .map(|c| c.reopens_at.duration_since(c.now).unwrap_or_default())
    }

    /// A verdict the store's counts decided ([`decide`](crate::decide::decide)), at its `now`.
    pub(crate) fn counted(
        limit: &Limit,
        allowed: bool,
        count: u64,
        reopens_at: SystemTime,
        now: SystemTime,
    ) -> Self {
        Verdict {
            limit: limit.name_arc().clone(),
            allowed,
            counts: Some(Counts {
                count,
                max: limit.max(),
                reopens_at,
                now,
            }),
            unreachable: None,
            shed: None,
            over_max: false,
        }
    }

    /// A refusal reopening at once, counts kept: an all-or-nothing call this pair allowed.
    pub(crate) fn refused_now(mut self) -> Self {
        self.allowed = false;
        if let Some(counts) = &mut self.counts {
            counts.reopens_at = counts.now;
        }
        self
    }

    /// A verdict nothing counted: the store was unreachable.
    pub(crate) fn uncounted(limit: &Limit, allowed: bool, cause: Arc<Error>) -> Self {
        Verdict {
            limit: limit.name_arc().clone(),
            allowed,
            counts: None,
            unreachable: Some(cause),
            shed: None,
            over_max: false,
        }
    }

    /// A pair not asked, another's refusal being cached: allowed by its own limit, uncounted.
    pub(crate) fn not_asked(limit: &Limit) -> Self {
        Verdict {
            limit: limit.name_arc().clone(),
            allowed: true,
            counts: None,
            unreachable: None,
            shed: None,
            over_max: false,
        }
    }

    /// A refusal nothing counted: the store was too busy to answer.
    pub(crate) fn shed_by(limit: &Limit, cause: Arc<Error>) -> Self {
        Verdict {
            limit: limit.name_arc().clone(),
            allowed: false,
            counts: None,
            unreachable: None,
            shed: Some(cause),
            over_max: false,
        }
    }

    /// The refusal of an ask whose cost is above `limit`'s max: nothing asked, nothing counted.
    pub(crate) fn over_max(limit: &Limit) -> Self {
        Verdict {
            limit: limit.name_arc().clone(),
            allowed: false,
            counts: None,
            unreachable: None,
            shed: None,
            over_max: true,
        }
    }

    /// This refusal as the refusal cache answers it at local time `now`.
    pub(crate) fn seen_at(&self, now: SystemTime, until: SystemTime) -> Self {
        let mut seen = self.clone();
        if let Some(counts) = &mut seen.counts {
            counts.now = now;
            counts.reopens_at = until;
        }
        seen
    }

    /// This verdict, marked as given while the store was unreachable.
    pub(crate) fn because_unreachable(mut self, cause: Arc<Error>) -> Self {
        self.unreachable = Some(cause);
        self
    }
}

/// The verdicts of a call over several (limit, key) pairs, in the order given.
#[derive(Clone, Debug)]
pub struct Verdicts(Vec<Verdict>);

impl Verdicts {
    /// Whether every limit allows the attempt.
    pub fn is_allowed(&self) -> bool {
        self.0.iter().all(Verdict::is_allowed)
    }

    /// Whether any limit refuses the attempt.
    pub fn is_refused(&self) -> bool {
        !self.is_allowed()
    }

    /// The first verdict, in the order given, that refuses.
    pub fn refused_by(&self) -> Option<&Verdict> {
        self.0.iter().find(|v| v.is_refused())
    }

    /// Whether the store could not be reached.
    pub fn is_unreachable(&self) -> bool {
        self.0.iter().any(Verdict::is_unreachable)
    }

    /// Whether the call was shed: the store was too busy to answer.
    pub fn is_shed(&self) -> bool {
        self.0.iter().any(Verdict::is_shed)
    }

    /// The longest [`Verdict::retry_after`]: when every refusing limit has reopened.
    pub fn retry_after(&self) -> Option<Duration> {
        self.0.iter().filter_map(Verdict::retry_after).max()
    }

    /// The verdicts, in the order given.
    pub fn iter(&self) -> std::slice::Iter<'_, Verdict> {
        self.0.iter()
    }

    /// The verdicts, in the order given, to index.
    pub fn as_slice(&self) -> &[Verdict] {
        &self.0
    }

    /// The verdicts, in the order given.
    pub fn into_vec(self) -> Vec<Verdict> {
        self.0
    }
}

/// Verdicts in the order given, such as two calls' joined ([`Verdicts::into_vec`]).
impl From<Vec<Verdict>> for Verdicts {
    fn from(verdicts: Vec<Verdict>) -> Self {
        Verdicts(verdicts)
    }
}

impl<'a> IntoIterator for &'a Verdicts {
    type Item = &'a Verdict;
    type IntoIter = std::slice::Iter<'a, Verdict>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Limit {
    /// This limit as an item of the `RateLimit-Policy` field: its name, its quota `q` (max) and
    /// its window `w` in seconds. Send it for an API quota, not for a per-account login limit,
    /// where it tells an attacker how many guesses remain.
    ///
    /// ```
    /// use platformkit_limit::Limit;
    /// use std::time::Duration;
    ///
    /// let login = Limit::new("login", 10, Duration::from_secs(15 * 60))?;
    /// assert_eq!(login.policy_field(), r#""login";q=10;w=900"#);
    /// # Ok::<(), platformkit_limit::Error>(())
    /// ```
    pub fn policy_field(&self) -> String {
        let mut item = sf_string(self.name());
        let _ = write!(item, ";q={};w={}", self.max(), self.window_secs());
        item
    }
}

impl Verdict {
    /// This verdict as an item of the `RateLimit` field (opt in per limit, as for
    /// [`Limit::policy_field`]): the limit's name, what is left `r` (0 on a refusal), and `t`, the
    /// whole seconds (rounded up; at least 1 on a refusal) until [`Verdict::reopens_at`]. `None`
    /// when nothing counted.
    pub fn rate_limit_field(&self) -> Option<String> {
        self.count()?;
        let (remaining, reset) = if self.is_refused() {
            (0, self.retry_after_secs()?)
        } else {
            (self.remaining()?, whole_secs_up(self.reopens_in()?))
        };
        let mut item = sf_string(self.limit());
        let _ = write!(item, ";r={remaining};t={reset}");
        Some(item)
    }

    /// The value of a `Retry-After` header for a refusal: [`retry_after`](Verdict::retry_after)
    /// rounded up to whole seconds, and at least 1. `None` when it is `None`.
    ///
    /// ```
    /// # fn header(verdict: &platformkit_limit::Verdict) -> Option<String> {
    /// verdict.retry_after_secs().map(|secs| secs.to_string())
    /// # }
    /// ```
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after().map(retry_after_secs)
    }
}

impl Verdicts {
    /// The value of a `Retry-After` header: [`Verdicts::retry_after`] in whole seconds, at least 1.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after().map(retry_after_secs)
    }
}

fn retry_after_secs(wait: Duration) -> u64 {
    whole_secs_up(wait).max(1)
}

fn whole_secs_up(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// `text` as a Structured Field String (RFC 9651, 3.3.3): quoted, `"` and `\` escaped.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::sf_string;

    #[test]
    fn a_name_is_quoted_with_its_quotes_and_backslashes_escaped() {
        assert_eq!(sf_string("login"), "\"login\"");
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string(""), "\"\"");
    }
}
