//! The refusal cache's own tests: the threshold, the TTL, the claim.
use std::time::UNIX_EPOCH;

use super::*;
use crate::decide::{Counted, Counting, decide};
use crate::{Error, Limit};

const BUDGET: Duration = Duration::from_secs(2);

fn t(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000) + Duration::from_millis(millis)
}

/// A refusal by a limit of 1 per hour, given at `now`.
fn refused(now: SystemTime) -> Verdict {
    let limit = Limit::new("login", 1, Duration::from_secs(3600)).unwrap();
    let verdict = decide(
        Counting::CHECK,
        &limit,
        1,
        &Counted {
            count: 1,
            previous: 0,
            locked_until: None,
            window_end: t(3_600_000),
            now,
        },
    );
    assert!(verdict.is_refused());
    verdict
}

fn allowed(now: SystemTime) -> Verdict {
    let limit = Limit::new("login", 1, Duration::from_secs(3600)).unwrap();
    decide(
        Counting::CHECK,
        &limit,
        1,
        &Counted {
            count: 0,
            previous: 0,
            locked_until: None,
            window_end: t(3_600_000),
            now,
        },
    )
}

fn cache() -> RefusalCache {
    RefusalCache::new(100, DEFAULT_REFUSAL_TTL)
}

/// Asks as `Limiter::run` does; `Some` is the claim (or none) of a call
/// sent to the store, `None` an answer from the cache.
fn ask(cache: &RefusalCache, now: SystemTime) -> Option<Option<Refresh>> {
    match cache.get("k", (1, 1), now, BUDGET) {
        Lookup::Refused(v) => {
            assert!(v.is_refused(), "the cache answers only refused");
            None
        }
        Lookup::Ask(claim) => Some(claim),
    }
}

/// A call at `now` the store refuses; whether it reached the store.
fn refused_call(cache: &RefusalCache, now: SystemTime) -> bool {
    match ask(cache, now) {
        None => false,
        Some(claim) => {
            cache.answered("k", &refused(now), (1, 1), now, claim);
            true
        }
    }
}

#[test]
fn engages_at_the_third_refusal_within_the_span() {
    let c = cache();
    assert!(refused_call(&c, t(0)));
    assert!(refused_call(&c, t(600)));
    // The first two fell more than a span apart from the third.
    assert!(refused_call(&c, t(1_000)));
    assert!(refused_call(&c, t(1_100)), "refusals at 0.6, 1.0, 1.1 s");
    assert!(!refused_call(&c, t(1_200)), "cached");
}

#[test]
fn one_refresh_per_ttl_while_flooded() {
    let c = cache();
    for ms in [0, 1, 2] {
        assert!(refused_call(&c, t(ms)));
    }
    let mut sent = 0;
    // Every millisecond for 10 s.
    for ms in 3..10_003 {
        sent += u32::from(refused_call(&c, t(ms)));
    }
    assert_eq!(sent, 10, "one refresh per second of flood");
}

#[test]
fn the_claim_holds_others_off_and_ends_when_dropped_or_stale() {
    let c = cache();
    for ms in [0, 1, 2] {
        assert!(refused_call(&c, t(ms)));
    }
    let claim = ask(&c, t(1_002)).expect("past the TTL: asks");
    assert!(claim.is_some(), "and claims the refresh");
    assert!(ask(&c, t(1_003)).is_none(), "the others are answered");
    drop(claim);
    let claim = ask(&c, t(1_004)).expect("a dropped claim frees the refresh");
    assert!(claim.is_some());
    // A claim whose call is never polled again goes stale after a
    // budget.
    std::mem::forget(claim);
    assert!(ask(&c, t(1_004) + BUDGET - Duration::from_millis(1)).is_none());
    assert!(ask(&c, t(1_004) + BUDGET).is_some_and(|claim| claim.is_some()));
}

#[test]
fn an_unanswered_refresh_keeps_its_claim_until_stale() {
    let c = cache();
    for ms in [0, 1, 2] {
        assert!(refused_call(&c, t(ms)));
    }
    let claim = ask(&c, t(1_002)).expect("asks");
    c.unanswered(claim);
    assert!(ask(&c, t(1_003)).is_none());
    assert!(ask(&c, t(1_002) + BUDGET).is_some());
}

#[test]
fn an_allow_or_a_forget_clears_the_entry() {
    let c = cache();
    for ms in [0, 1, 2] {
        assert!(refused_call(&c, t(ms)));
    }
    let claim = ask(&c, t(1_002)).expect("asks");
    c.answered("k", &allowed(t(1_002)), (1, 1), t(1_002), claim);
    assert!(ask(&c, t(1_003)).is_some(), "allowed: nothing held");
    // And the count starts again.
    assert!(refused_call(&c, t(1_004)));
    assert!(refused_call(&c, t(1_005)));
    assert!(refused_call(&c, t(1_006)));
    assert!(!refused_call(&c, t(1_007)));
    c.forget("k");
    assert!(refused_call(&c, t(1_008)));
}

#[test]
fn a_refresh_after_the_flood_ended_is_not_held() {
    let c = cache();
    for ms in [0, 1, 2] {
        assert!(refused_call(&c, t(ms)));
    }
    // The next attempt comes a minute later: refreshed, and not held.
    assert!(refused_call(&c, t(60_000)));
    assert!(refused_call(&c, t(60_001)));
}

#[test]
fn never_past_the_reopening() {
    let c = RefusalCache::new(100, super::MAX_TTL);
    let reopens = t(3_600_000);
    let at = reopens - Duration::from_millis(10);
    for _ in 0..3 {
        assert!(refused_call(&c, at));
    }
    assert!(!refused_call(&c, reopens - Duration::from_micros(1)));
    assert!(refused_call(&c, reopens));
}

#[test]
fn an_unreachable_verdict_is_not_a_refusal_to_hold() {
    let c = cache();
    let limit = Limit::new("login", 1, Duration::from_secs(3600)).unwrap();
    let cause = Arc::new(Error::from(
        crate::error::TimeoutSnafu {
            operation: crate::metric::Operation::Check,
            budget: BUDGET,
        }
        .build(),
    ));
    let refused = Verdict::uncounted(&limit, false, cause);
    for _ in 0..5 {
        c.answered("k", &refused, (1, 1), t(0), None);
    }
    assert!(ask(&c, t(1)).is_some());
}

/// A call of `cost` at `now` the store refuses; whether it reached the
/// store.
fn refused_call_of(cache: &RefusalCache, cost: u32, now: SystemTime) -> bool {
    refused_call_under(cache, (cost, 1), now)
}

/// A call of `cost` under a limit of `max` at `now` the store refuses;
/// whether it reached the store.
fn refused_call_under(cache: &RefusalCache, (cost, max): (u32, u32), now: SystemTime) -> bool {
    match cache.get("k", (cost, max), now, BUDGET) {
        Lookup::Refused(v) => {
            assert!(v.is_refused(), "the cache answers only refused");
            false
        }
        Lookup::Ask(claim) => {
            cache.answered("k", &refused(now), (cost, max), now, claim);
            true
        }
    }
}

/// A key held refused for a cost of 50 answers asks of 50 or more from
/// the cache, and asks the store for a smaller one, which may go ahead
/// sooner: nothing about a cost of 1 was refused.
#[test]
fn a_refusal_answers_only_asks_of_at_least_its_cost() {
    let c = cache();
    for ms in [0, 1, 2] {
        assert!(refused_call_of(&c, 50, t(ms)));
    }
    assert!(!refused_call_of(&c, 50, t(3)), "the same cost: cached");
    assert!(!refused_call_of(&c, 80, t(4)), "a larger cost: cached");
    assert!(
        matches!(c.get("k", (1, 1), t(5), BUDGET), Lookup::Ask(None)),
        "a smaller cost asks the store, and claims nothing"
    );
    assert!(!refused_call_of(&c, 50, t(6)), "still held for 50");
}

/// Once a smaller cost is refused, it is held, and a later refusal of a
/// larger cost leaves it in place while it is fresh: a flood of mixed
/// costs stays answered from the cache.
#[test]
fn the_smallest_cost_refused_stays_held_while_fresh() {
    let c = cache();
    for ms in [0, 1, 2] {
        assert!(refused_call_of(&c, 50, t(ms)));
    }
    assert!(refused_call_of(&c, 1, t(3)), "asked: held for 1 now");
    assert!(!refused_call_of(&c, 1, t(4)), "a cost of 1: cached");
    // A call of 50 that was on its way before is answered later by the
    // store: the refusal of 1 stays.
    c.answered("k", &refused(t(5)), (50, 1), t(5), None);
    assert!(!refused_call_of(&c, 1, t(6)), "still held for 1");
    // Past the TTL, the refresh of a larger cost replaces it.
    assert!(refused_call_of(&c, 50, t(1_004)), "the refresh");
    assert!(matches!(
        c.get("k", (1, 1), t(1_005), BUDGET),
        Lookup::Ask(None)
    ));
}

/// Tiers: a key held refused under one max is asked of the store under
/// another (a larger tier may allow it; a smaller one's quota is its own),
/// claiming nothing, and a newer refusal under the other max is held in
/// place of the first.
#[test]
fn a_refusal_answers_only_asks_under_its_max() {
    let c = cache();
    for ms in [0, 1, 2] {
        assert!(refused_call_under(&c, (1, 100), t(ms)));
    }
    assert!(
        !refused_call_under(&c, (1, 100), t(3)),
        "the same max: cached"
    );
    for max in [1_000, 10] {
        assert!(
            matches!(c.get("k", (1, max), t(4), BUDGET), Lookup::Ask(None)),
            "another max ({max}) asks the store, and claims nothing"
        );
    }
    assert!(
        !refused_call_under(&c, (1, 100), t(5)),
        "still held for 100"
    );
    assert!(
        refused_call_under(&c, (1, 1_000), t(6)),
        "asked: held for 1000 now"
    );
    assert!(!refused_call_under(&c, (1, 1_000), t(7)), "1000: cached");
    assert!(refused_call_under(&c, (1, 100), t(8)), "100: asked again");
}
