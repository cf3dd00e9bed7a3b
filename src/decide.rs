//! The arithmetic, in integer microseconds: which window holds a moment,
//! and how counts become a [`Verdict`], one function for both stores.

use std::time::SystemTime;

use crate::clock::{from_micros, micros_since_epoch};
use crate::metric::Operation;
use crate::{Limit, Strategy, Verdict};

/// What a store counted for one call.
#[derive(Clone, Debug)]
pub struct Counted {
    /// The count in the current window, after this call's own addition.
    pub count: u64,
    /// The count of the window before, for sliding windows (0 for fixed).
    pub previous: u64,
    /// When the lockout of the latest earlier window whose count reached
    /// max ends (a block is one, under any limit), if that is still to come.
    pub locked_until: Option<SystemTime>,
    /// When the current window closes.
    pub window_end: SystemTime,
    /// The store's time during the call.
    pub now: SystemTime,
}

impl Counted {
    pub(crate) fn window_start(&self, limit: &Limit) -> SystemTime {
        self.window_end - limit.window()
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

/// Turns what a store counted into a verdict ([windows](crate::guide#windows)).
///
/// Over a window of width `w` begun `e` ago (microseconds), the estimate
/// times `w` is `prev × (w − e) + cur × w`, `prev` 0 for fixed windows. An
/// attempt may go ahead while the estimate is below `max`: `check` and
/// `failed` read it as it stands, `hit` before its own ask. An ask of
/// `cost` is decided as `cost` asks of one in a row, by its last unit: `cur`
/// holds the whole cost, so the comparison and a lockout's start are those
/// of a cost of 1. A refusal reopens, and a `check` of `cost` (what
/// [`hit_all_or_nothing`](crate::Limiter::hit_all_or_nothing) did not
/// count) may go ahead, once the estimate is below `max − (cost − 1)`.
pub(crate) fn decide(op: Counting, limit: &Limit, cost: u32, counted: &Counted) -> Verdict {
    let d = decision(op, limit, cost, counted);
    Verdict::counted(limit, d.allowed, d.estimate, d.reopens_at, counted.now)
}

/// What [`decide`] decided, before it is a [`Verdict`]: also the lockout
/// running, for a key's [status](crate::KeyStatus).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decision {
    pub(crate) allowed: bool,
    /// The count, or a sliding window's estimate, rounded up.
    pub(crate) estimate: u64,
    /// For an allowed attempt, the window's end; for a refusal, the first
    /// moment the next attempt may go ahead.
    pub(crate) reopens_at: SystemTime,
    pub(crate) locked_until: Option<SystemTime>,
}

/// The decision of [`decide`], for an ask of `cost` units.
pub(crate) fn decision(op: Counting, limit: &Limit, cost: u32, counted: &Counted) -> Decision {
    let max = i128::from(limit.max());
    // What the estimate must fall below for an ask of `cost` to go ahead
    // (at least 1: a cost above max never reaches a store).
    let room = (max - (i128::from(cost) - 1)).max(1);
    let w = i128::from(limit.window_secs()) * 1_000_000;
    let start = i128::from(micros_since_epoch(counted.window_end)) - w;
    let now = i128::from(micros_since_epoch(counted.now));
    let elapsed = (now - start).clamp(0, w);
    let prev = match limit.strategy() {
        Strategy::Sliding => i128::from(counted.previous),
        Strategy::Fixed => 0,
    };
    let cur = i128::from(counted.count);
    let weighted = prev * (w - elapsed) + cur * w;
    // The ask's last unit (see `decide`): one, whatever the cost.
    let own = if op.asks() { w } else { 0 };
    // A read of `cost` (an ask not counted, as `hit_all_or_nothing` refuses
    // one) reads the estimate as an ask of `cost` would find it: with all
    // but the last unit of the cost on top (1 for every other read).
    let unasked = if op.asks() {
        0
    } else {
        (i128::from(cost) - 1) * w
    };
    // A lockout: an earlier window that reached max, or a block (the store
    // says), or the current one before this call's own ask.
    let locked_until = match limit.lockout() {
        Some(lockout) if cur - own / w >= max => {
            Some(counted.window_end + lockout).max(counted.locked_until)
        }
        _ => counted.locked_until,
    }
    .filter(|&until| until > counted.now);
    let allowed = weighted - own + unasked < max * w && locked_until.is_none();
    let estimate = u64::try_from((weighted + w - 1) / w).unwrap_or(u64::MAX);
    let reopens_at = if allowed {
        counted.window_end
    } else {
        // The first moment the next attempt of the same cost may go ahead:
        // when the count allows it and any lockout is over.
        let by_count = if weighted < room * w {
            counted.now
        } else {
            match limit.strategy() {
                Strategy::Sliding => reopening(prev, cur, room, w, start),
                // A fixed window starts again from zero.
                Strategy::Fixed => counted.window_end,
            }
        };
        locked_until.map_or(by_count, |until| until.max(by_count))
    };
    Decision {
        allowed,
        estimate,
        reopens_at,
        locked_until,
    }
}

/// For a sliding window whose estimate is at or above `max`, the first
/// instant it drops below if nothing more is counted.
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

/// An operation a store counts for and [`decide`]
/// turns into a verdict: it cannot hold another, so a store is never asked
/// to count a reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counting {
    operation: Operation,
    all_or_nothing: bool,
}

impl Counting {
    pub(crate) const CHECK: Counting = Counting::each(Operation::Check);
    /// Adds a failure, then tells whether the next attempt may go ahead.
    pub(crate) const FAILED: Counting = Counting::each(Operation::Failed);
    /// Adds this ask (its cost), and tells whether it may go ahead.
    pub(crate) const HIT: Counting = Counting::each(Operation::Hit);
    /// As `HIT`, for a permit.
    pub(crate) const RESERVE: Counting = Counting::each(Operation::Reserve);
    /// As `HIT` over several pairs, adding under none of them unless every
    /// one allows: `hit_all_or_nothing`.
    pub(crate) const HIT_ALL_OR_NOTHING: Counting = Counting {
        operation: Operation::Hit,
        all_or_nothing: true,
    };

    const fn each(operation: Operation) -> Counting {
        Counting {
            operation,
            all_or_nothing: false,
        }
    }

    pub(crate) const fn operation(self) -> Operation {
        self.operation
    }

    pub(crate) const fn adds(self) -> bool {
        self.operation.adds()
    }

    pub(crate) const fn asks(self) -> bool {
        self.operation.asks()
    }

    /// Whether it adds only if every pair of the call allows
    /// (`HIT_ALL_OR_NOTHING`): one statement of its own, never merged.
    pub(crate) const fn all_or_nothing(self) -> bool {
        self.all_or_nothing
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    /// A window start: a multiple of 60 seconds.
    const START: u64 = 1_800_000_000;

    /// What a store counts for an ask of `cost` at `at`, after the counts
    /// `prev` and `cur` of the window starting at `START` (and nothing
    /// since): in that window, or in the next one.
    fn ask_at(limit: &Limit, prev: u64, cur: u64, cost: u32, at: SystemTime) -> Verdict {
        let w = limit.window();
        let start = UNIX_EPOCH + Duration::from_secs(START);
        let counted = if at < start + w {
            Counted {
                count: cur + u64::from(cost),
                previous: prev,
                locked_until: None,
                window_end: start + w,
                now: at,
            }
        } else {
            Counted {
                count: u64::from(cost),
                previous: cur,
                locked_until: None,
                window_end: start + w + w,
                now: at,
            }
        };
        decide(Counting::HIT, limit, cost, &counted)
    }

    /// Allowed at the reopening, refused a microsecond before.
    #[test]
    fn a_refusal_reopens_when_an_ask_of_its_cost_may_go_ahead() {
        for strategy in [Strategy::Fixed, Strategy::Sliding] {
            let limit = Limit::builder("api", 10, Duration::from_secs(60))
                .strategy(strategy)
                .build()
                .unwrap();
            let asked = UNIX_EPOCH + Duration::from_secs(START + 20);
            for (prev, before) in [(0, 8), (6, 5), (10, 9), (3, 10), (10, 0)] {
                for cost in 1..=10 {
                    let refused = ask_at(&limit, prev, before, cost, asked);
                    if refused.is_allowed() {
                        continue;
                    }
                    // The refused ask is counted: the next one sees it.
                    let cur = before + u64::from(cost);
                    let reopens = refused.reopens_at().unwrap();
                    let at = ask_at(&limit, prev, cur, cost, reopens);
                    assert!(at.is_allowed(), "{strategy:?} {prev} {before} {cost}");
                    let just_before = reopens - Duration::from_micros(1);
                    if just_before > asked {
                        let early = ask_at(&limit, prev, cur, cost, just_before);
                        assert!(early.is_refused(), "{strategy:?} {prev} {before} {cost}");
                    }
                }
            }
        }
    }

    /// A check of a cost: the verdict of an ask of it, not counted.
    #[test]
    fn a_check_of_a_cost_allows_what_the_ask_would_and_reopens_for_it() {
        for strategy in [Strategy::Fixed, Strategy::Sliding] {
            let limit = Limit::builder("api", 10, Duration::from_secs(60))
                .strategy(strategy)
                .build()
                .unwrap();
            let w = limit.window();
            let start = UNIX_EPOCH + Duration::from_secs(START);
            let at = start + Duration::from_secs(20);
            let read = |prev: u64, count: u64, cost: u32, now: SystemTime| {
                let counted = Counted {
                    count,
                    previous: prev,
                    locked_until: None,
                    window_end: start + w,
                    now,
                };
                decide(Counting::CHECK, &limit, cost, &counted)
            };
            for (prev, before) in [(0, 8), (6, 5), (10, 9), (3, 10), (10, 0), (0, 0)] {
                for cost in 1..=10 {
                    let check = read(prev, before, cost, at);
                    let ask = ask_at(&limit, prev, before, cost, at);
                    assert_eq!(
                        check.is_allowed(),
                        ask.is_allowed(),
                        "{strategy:?} {prev} {before} {cost}"
                    );
                    if check.is_allowed() {
                        continue;
                    }
                    let reopens = check.reopens_at().unwrap();
                    if reopens < start + w {
                        assert!(read(prev, before, cost, reopens).is_allowed());
                        let early = reopens - Duration::from_micros(1);
                        if early > at {
                            assert!(read(prev, before, cost, early).is_refused());
                        }
                    } else {
                        // In the next window: the ask finds `before` as
                        // the previous window's count.
                        let ask = ask_at(&limit, prev, before, cost, reopens);
                        assert!(ask.is_allowed(), "{strategy:?} {prev} {before} {cost}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_cost_is_decided_as_asks_of_one_in_a_row() {
        let limit = Limit::new("api", 10, Duration::from_secs(60)).unwrap();
        let at = UNIX_EPOCH + Duration::from_secs(START + 20);
        for before in 0..=12 {
            for cost in 1..=10 {
                let one_by_one =
                    (0..u64::from(cost)).all(|i| ask_at(&limit, 0, before + i, 1, at).is_allowed());
                let at_once = ask_at(&limit, 0, before, cost, at);
                assert_eq!(at_once.is_allowed(), one_by_one, "{before} + {cost}");
                assert_eq!(at_once.count(), Some(before + u64::from(cost)));
            }
        }
    }

    /// Only counting operations add or ask, and an ask also adds: a store
    /// counts for exactly the operations a [`Counting`] can hold.
    #[test]
    fn only_counting_operations_add_or_ask() {
        let counting = [
            Counting::CHECK,
            Counting::FAILED,
            Counting::HIT,
            Counting::RESERVE,
        ];
        for operation in Operation::ALL {
            let held = counting.iter().any(|c| c.operation() == operation);
            assert!(
                held || !(operation.adds() || operation.asks()),
                "{operation}"
            );
        }
        let adds: Vec<_> = counting
            .iter()
            .filter(|c| c.adds())
            .map(|c| c.operation())
            .collect();
        assert_eq!(
            adds,
            [Operation::Failed, Operation::Hit, Operation::Reserve]
        );
        let asks: Vec<_> = counting
            .iter()
            .filter(|c| c.asks())
            .map(|c| c.operation())
            .collect();
        assert_eq!(asks, [Operation::Hit, Operation::Reserve]);
    }

    /// The header forms of decided verdicts (`Verdict::rate_limit_field`,
    /// `retry_after_secs`, `Limit::policy_field`).
    mod headers {
        use std::sync::Arc;
        use std::time::{Duration, SystemTime, UNIX_EPOCH};

        use super::super::{Counted, Counting, decide};
        use crate::{Error, Limit, Strategy, Verdict};

        /// A window start: a multiple of 900 and of 60 seconds.
        const START: u64 = 1_800_000_000;

        fn at(secs: u64, micros: u64) -> SystemTime {
            UNIX_EPOCH + Duration::from_secs(START + secs) + Duration::from_micros(micros)
        }

        fn verdict(
            op: Counting,
            limit: &Limit,
            count: u64,
            previous: u64,
            now: SystemTime,
        ) -> Verdict {
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
            let api =
                Limit::new("api.v2_read-all", 1_000, Duration::from_secs(3600)).expect("a limit");
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
            let verdicts = crate::Verdicts::from(vec![exact, at_the_end]);
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
    }
}
