//! `Retry-After`, and the `RateLimit-Policy` and `RateLimit` fields of
//! [draft-ietf-httpapi-ratelimit-headers-10](https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/10/),
//! as text: each limit one item named by the limit's name; the partition key (`pk`) never.

use std::fmt::Write as _;
use std::time::Duration;

use crate::{Limit, Verdict, Verdicts};

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
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::sf_string;
    use crate::decide::{Counted, decide};
    use crate::operation::Counting;
    use crate::{Error, Limit, Strategy, Verdict};

    /// A window start: a multiple of 900 and of 60 seconds.
    const START: u64 = 1_800_000_000;

    fn at(secs: u64, micros: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(START + secs) + Duration::from_micros(micros)
    }

    fn verdict(op: Counting, limit: &Limit, count: u64, previous: u64, now: SystemTime) -> Verdict {
        let counted = Counted {
            count,
            previous,
            locked_until: None,
            window_end: at(limit.window_secs(), 0),
            now,
        };
        decide(op, limit, 1, &counted)
    }

    fn login() -> Limit {
        Limit::new("login", 10, Duration::from_secs(900)).expect("a limit")
    }

    #[test]
    fn the_policy_field_is_the_name_the_quota_and_the_window() {
        assert_eq!(login().policy_field(), "\"login\";q=10;w=900");
        let api = Limit::new("api.v2_read-all", 1_000, Duration::from_secs(3600)).expect("a limit");
        assert_eq!(api.policy_field(), "\"api.v2_read-all\";q=1000;w=3600");
    }

    #[test]
    fn a_refusal_renders_nothing_left_and_the_wait_rounded_up() {
        // 411.2 seconds before the window's end.
        let refused = verdict(Counting::FAILED, &login(), 10, 0, at(488, 800_000));
        assert!(refused.is_refused());
        assert_eq!(
            refused.rate_limit_field().as_deref(),
            Some("\"login\";r=0;t=412")
        );
        assert_eq!(refused.retry_after_secs(), Some(412));
    }

    #[test]
    fn an_allowed_verdict_renders_what_is_left_and_the_window_reset() {
        let allowed = verdict(Counting::HIT, &login(), 3, 0, at(488, 800_000));
        assert!(allowed.is_allowed());
        assert_eq!(
            allowed.rate_limit_field().as_deref(),
            Some("\"login\";r=7;t=412")
        );
        assert_eq!(allowed.retry_after_secs(), None);
    }

    #[test]
    fn a_sliding_refusal_renders_its_own_reopening_not_the_window_end() {
        let api = Limit::builder("api", 10, Duration::from_secs(60))
            .strategy(Strategy::Sliding)
            .build()
            .expect("a limit");
        // Half-way, 10 in the previous window and 8 in this one: the estimate 10 × 30/60 + 8 = 13
        // falls below 10 just after 48 s, 18 s (and a µs) from now; the window ends in 30 s.
        let refused = verdict(Counting::CHECK, &api, 8, 10, at(30, 0));
        assert!(refused.is_refused());
        assert_eq!(
            refused.rate_limit_field().as_deref(),
            Some("\"api\";r=0;t=19")
        );
        assert_eq!(refused.retry_after_secs(), Some(19));
    }

    #[test]
    fn a_lockout_refusal_renders_nothing_left_whatever_the_count() {
        let login = Limit::builder("login", 10, Duration::from_secs(900))
            .lockout(Duration::from_secs(3600))
            .build()
            .expect("a lockout");
        let now = at(100, 0);
        let counted = Counted {
            count: 0,
            previous: 0,
            locked_until: Some(now + Duration::from_secs(1_000)),
            window_end: at(900, 0),
            now,
        };
        let refused = decide(Counting::CHECK, &login, 1, &counted);
        assert!(refused.is_refused());
        assert_eq!(
            refused.rate_limit_field().as_deref(),
            Some("\"login\";r=0;t=1000")
        );
    }

    #[test]
    fn retry_after_is_whole_seconds_and_at_least_one() {
        let exact = verdict(Counting::FAILED, &login(), 10, 0, at(488, 0));
        assert_eq!(exact.retry_after_secs(), Some(412));
        // Refused at the very end of its window: "retry now" would be refused again, so 1.
        let at_the_end = verdict(Counting::CHECK, &login(), 10, 0, at(900, 0));
        assert_eq!(at_the_end.retry_after(), Some(Duration::ZERO));
        assert_eq!(at_the_end.retry_after_secs(), Some(1));
        let verdicts = crate::Verdicts::from_vec(vec![exact, at_the_end]);
        assert_eq!(verdicts.retry_after_secs(), Some(412));
    }

    #[test]
    fn nothing_is_rendered_when_nothing_counted() {
        let cause = Arc::new(Error::from(
            crate::error::InvalidOptionSnafu {
                option: "test",
                reason: "unreachable",
            }
            .build(),
        ));
        let uncounted = Verdict::uncounted(&login(), false, cause);
        assert_eq!(uncounted.rate_limit_field(), None);
        assert_eq!(uncounted.retry_after_secs(), None);
    }

    #[test]
    fn a_name_is_quoted_with_its_quotes_and_backslashes_escaped() {
        assert_eq!(sf_string("login"), "\"login\"");
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string(""), "\"\"");
    }
}
