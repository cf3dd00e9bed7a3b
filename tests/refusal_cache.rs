//! The refusal cache (its promises are in the guide's "The refusal cache"):
//! only a flooded key is answered from it; an answer is at most a TTL old and
//! never past the reopening; a reset through another replica is seen by the
//! next call of a key that is not flooded, and within a TTL for one that is;
//! under a flood one call per TTL reaches the store; a refreshing call that
//! is dropped or never polled again does not pin it; it never allows, is
//! cleared by a reset here, and is bounded. It answers a refusal only to an
//! ask of at least the cost refused and under the max it was refused under
//! (a tier's, `Limit::with_max`), and a cost above max never reaches it,
//! nor the store.
//!
//! Time is a `ManualClock`; statements are counted by the connections lent.

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common;
use common::verdicts::assert_refused;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use platformkit_limit::metric::{
    CALLS_TOTAL, LABEL_OPERATION, LABEL_OUTCOME, LABEL_SOURCE, STATEMENTS_TOTAL,
};
use platformkit_limit::{Key, Limit, LimitConn, Limiter, ManualClock, Postgres, SCHEMA};
use platformkit_limit_testdb::{Server, TestDb};
use tokio::sync::RwLock;

/// A connection source over `db` that counts the connections it lends: one
/// per statement the limiter sends.
async fn counting(db: &TestDb) -> (impl LimitConn + 'static, Arc<AtomicUsize>) {
    let (conns, lent, _gate) = gated(db).await;
    (conns, lent)
}

/// As [`counting`], and each connection waits for a read of the gate: hold
/// its write lock to keep a call waiting for its connection (counted, never
/// sent). The calls share one connection, lent to one call at a time.
async fn gated(db: &TestDb) -> (impl LimitConn + 'static, Arc<AtomicUsize>, Arc<RwLock<()>>) {
    let lent = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(RwLock::new(()));
    let client = Arc::new(tokio::sync::Mutex::new(
        platformkit_limit_testdb::connect(&db.config()).await,
    ));
    let counter = lent.clone();
    let door = gate.clone();
    let conns = move || {
        counter.fetch_add(1, Ordering::SeqCst);
        let client = client.clone();
        let door = door.clone();
        async move {
            drop(door.read().await);
            Ok::<_, std::convert::Infallible>(client.lock_owned().await)
        }
    };
    (conns, lent, gate)
}

fn start() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 60 * 60 + 5))
}

/// Refuses `key` under `limit` (a limit of 1) through `limiter` the
/// [`Limiter::FLOOD_REFUSALS`] times that engage the cache, at the clock's time.
async fn flood<S: platformkit_limit::Store>(limiter: &Limiter<S>, limit: &Limit, key: &Key) {
    for _ in 0..Limiter::FLOOD_REFUSALS {
        let verdict = limiter.failed(limit, key).await.expect("a verdict");
        assert!(verdict.is_refused() && !verdict.is_unreachable() && !verdict.is_shed());
    }
}

/// Polls `call` once: far enough to take the refresh claim and wait for its
/// connection behind the closed gate.
async fn poll_once<F: Future>(call: &mut std::pin::Pin<Box<F>>) {
    std::future::poll_fn(|cx| {
        assert!(
            call.as_mut().poll(cx).is_pending(),
            "the call waits for its connection"
        );
        Poll::Ready(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_key_costs_no_round_trip_within_the_ttl_and_never_past_the_reopening() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent) = counting(&db).await;
    let limiter = Limiter::builder(Postgres::new(conns).with_clock(clock.clone()))
        .refusal_ttl(Limiter::MAX_REFUSAL_TTL)
        .build()
        .expect("a TTL");
    assert!(limiter.refusal_cache().is_some(), "on by default");
    assert_eq!(
        Limiter::new(Postgres::new(db.config())).refusal_ttl(),
        Limiter::DEFAULT_REFUSAL_TTL
    );
    let limit = Limit::new("login", 2, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("victim");

    assert!(
        limiter
            .failed(&limit, &key)
            .await
            .expect("a verdict")
            .is_allowed()
    );
    // Refused, refused again: each asked of the store, not yet a flood.
    let refused = limiter.failed(&limit, &key).await.expect("a verdict");
    assert!(refused.is_refused());
    let reopens = refused.reopens_at().expect("a reopening");
    assert_refused(&limiter, &limit, &key).await;
    assert_eq!(lent.load(Ordering::SeqCst), 3, "two refusals: both asked");
    // The third refusal within the span engages the cache.
    assert_refused(&limiter, &limit, &key).await;
    assert_eq!(lent.load(Ordering::SeqCst), 4);

    // Hammering the flooded key: every answer refused, no statement sent.
    for _ in 0..50 {
        for verdict in [
            limiter.check(&limit, &key).await,
            limiter.hit(&limit, &key).await,
            limiter.failed(&limit, &key).await,
        ] {
            assert!(verdict.expect("a verdict").is_refused());
        }
    }
    assert_eq!(
        lent.load(Ordering::SeqCst),
        4,
        "0 round trips within the TTL"
    );
    // And none of those attempts was counted in the database.
    let uncached = Limiter::builder(Postgres::new(db.config()).with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let stored = uncached.check(&limit, &key).await.expect("a verdict");
    assert_eq!(stored.count(), Some(2));

    // The reopening (55 s away) comes before the TTL (60 s) runs out: one
    // microsecond before it, still answered here, the wait run down with the
    // clock...
    clock.set(reopens - Duration::from_micros(1));
    let cached = limiter.check(&limit, &key).await.expect("a verdict");
    assert!(cached.is_refused());
    assert_eq!(cached.retry_after(), Some(Duration::from_micros(1)));
    assert_eq!(lent.load(Ordering::SeqCst), 4);

    // ... and at the reopening, asked again, and allowed.
    clock.set(reopens);
    let open = limiter.check(&limit, &key).await.expect("a verdict");
    assert!(open.is_allowed());
    assert_eq!(open.count(), Some(0));
    assert_eq!(lent.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_through_another_replica_is_seen_by_the_next_call_here() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent) = counting(&db).await;
    let here = Limiter::new(Postgres::new(conns).with_clock(clock.clone()));
    let elsewhere = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let limit = Limit::new("login", 1, Duration::from_secs(24 * 60 * 60)).expect("a limit");
    let key = Key::opaque("locked-out-user");

    // The user is refused here, and tries once more: refused again. Both
    // answers are the store's.
    assert!(
        here.failed(&limit, &key)
            .await
            .expect("a verdict")
            .is_refused()
    );
    assert_refused(&here, &limit, &key).await;
    assert_eq!(lent.load(Ordering::SeqCst), 2);

    // Support unlocks them through another replica, at the same instant.
    elsewhere.reset(&limit, &key).await.expect("a reset");

    let next = here.check(&limit, &key).await.expect("a verdict");
    assert_eq!(
        lent.load(Ordering::SeqCst),
        3,
        "the next call here reaches the store"
    );
    assert!(next.is_allowed(), "and sees the reset");
    assert_eq!(next.count(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_here_clears_a_flooded_key_at_once() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent) = counting(&db).await;
    let limiter = Limiter::new(Postgres::new(conns).with_clock(clock.clone()));
    let limit = Limit::new("login", 1, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("account");

    flood(&limiter, &limit, &key).await;
    assert_refused(&limiter, &limit, &key).await;
    let before = lent.load(Ordering::SeqCst);
    assert_eq!(
        before,
        Limiter::FLOOD_REFUSALS,
        "the flood is answered here"
    );

    limiter.reset(&limit, &key).await.expect("a reset");
    let after = limiter.check(&limit, &key).await.expect("a verdict");
    assert!(after.is_allowed(), "a reset here clears the cached refusal");
    assert_eq!(
        lent.load(Ordering::SeqCst),
        before + 2,
        "the reset, the check"
    );
}

/// How many concurrent calls each step of the flood makes.
const BATCH: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_costs_one_statement_per_ttl_and_a_reset_elsewhere_is_seen_within_one() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent, gate) = gated(&db).await;
    let here = Limiter::new(Postgres::new(conns).with_clock(clock.clone()));
    let elsewhere = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let ttl = here.refusal_ttl();
    assert_eq!(ttl, Duration::from_secs(1));
    let limit = Limit::new("login", 1, Duration::from_secs(60 * 60)).expect("a limit");
    let key = Key::opaque("stuffed");

    let began = clock.now();
    assert!(
        here.failed(&limit, &key)
            .await
            .expect("a verdict")
            .is_refused()
    );
    assert_eq!(lent.load(Ordering::SeqCst), 1);

    // One step of the flood: the clock moves 10 ms and BATCH calls arrive
    // at once: each looks its key up before any reaches the store (a round
    // trip can end within its first poll). Each step's answers, and the
    // statements sent by TTL since the flood began.
    let step = Duration::from_millis(10);
    let mut per_ttl: Vec<usize> = Vec::new();
    // The first refusal is counted in the first TTL.
    let mut sent = 0;
    let run_step = async |per_ttl: &mut Vec<usize>, sent: &mut usize| -> (SystemTime, Vec<bool>) {
        clock.advance(step);
        let now = clock.now();
        let closed = gate.write().await;
        let mut calls = Box::pin(futures::future::join_all(
            (0..BATCH).map(|_| here.check(&limit, &key)),
        ));
        let first = futures::poll!(calls.as_mut());
        drop(closed);
        let answers = match first {
            Poll::Ready(answers) => answers,
            Poll::Pending => calls.await,
        };
        let answers: Vec<bool> = answers
            .into_iter()
            .map(|v| v.expect("a verdict").is_refused())
            .collect();
        let interval = usize::try_from(
            now.duration_since(began).expect("forward").as_nanos() / ttl.as_nanos(),
        )
        .expect("a few");
        if per_ttl.len() <= interval {
            per_ttl.resize(interval + 1, 0);
        }
        let total = lent.load(Ordering::SeqCst);
        per_ttl[interval] += total - *sent;
        *sent = total;
        (now, answers)
    };

    // Five seconds of flood: every answer refused.
    while clock.now() < began + 5 * ttl {
        let (now, answers) = run_step(&mut per_ttl, &mut sent).await;
        assert!(answers.iter().all(|&refused| refused), "at {now:?}");
    }
    // The first TTL: the first refusal, then the first batch, all on its
    // way to the store before any answer engaged the cache. Every TTL
    // after: exactly one refresh.
    assert!(
        per_ttl[0] <= 1 + BATCH,
        "engaging costs the refusals before it: {per_ttl:?}"
    );
    assert_eq!(
        &per_ttl[1..5],
        &[1, 1, 1, 1],
        "one statement per TTL while flooded: {per_ttl:?}"
    );

    // Support unlocks the account through another replica.
    let reset_at = clock.now();
    elsewhere.reset(&limit, &key).await.expect("a reset");
    let mut seen = None;
    while clock.now() < reset_at + 3 * ttl {
        let (now, answers) = run_step(&mut per_ttl, &mut sent).await;
        let allowed = answers.iter().filter(|&&refused| !refused).count();
        match seen {
            None if allowed == 0 => {}
            None => {
                // The one call that refreshed sees the reset; the others
                // of its batch still had the cached refusal.
                assert_eq!(allowed, 1, "exactly one call refreshes");
                seen = Some(now);
            }
            Some(_) => assert_eq!(allowed, BATCH, "every call after it is allowed"),
        }
    }
    let seen = seen.expect("the reset is seen");
    assert!(
        seen <= reset_at + ttl,
        "seen within one TTL: {:?} after the reset",
        seen.duration_since(reset_at)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_refresh_does_not_pin_the_cache() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent, gate) = gated(&db).await;
    let limiter = Limiter::new(Postgres::new(conns).with_clock(clock.clone()));
    let limit = Limit::new("login", 1, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("victim");
    flood(&limiter, &limit, &key).await;
    assert_eq!(lent.load(Ordering::SeqCst), Limiter::FLOOD_REFUSALS);

    // Past the TTL, a call claims the refresh and waits for its connection.
    clock.advance(limiter.refusal_ttl());
    let closed = gate.write().await;
    let mut refreshing = Box::pin(limiter.check(&limit, &key));
    poll_once(&mut refreshing).await;
    assert_eq!(lent.load(Ordering::SeqCst), Limiter::FLOOD_REFUSALS + 1);
    // Meanwhile the others are answered here.
    for _ in 0..10 {
        assert_refused(&limiter, &limit, &key).await;
    }
    assert_eq!(lent.load(Ordering::SeqCst), Limiter::FLOOD_REFUSALS + 1);

    // Dropped (a client went away): the next call refreshes, at the same
    // instant.
    drop(refreshing);
    drop(closed);
    assert_refused(&limiter, &limit, &key).await;
    assert_eq!(
        lent.load(Ordering::SeqCst),
        Limiter::FLOOD_REFUSALS + 2,
        "the dropped call's claim is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_never_polled_again_frees_the_cache_after_the_budget() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent, gate) = gated(&db).await;
    let limiter = Limiter::new(Postgres::new(conns).with_clock(clock.clone()));
    assert_eq!(limiter.budget(), Limiter::DEFAULT_BUDGET);
    let limit = Limit::new("login", 1, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("victim");
    flood(&limiter, &limit, &key).await;

    clock.advance(limiter.refusal_ttl());
    let closed = gate.write().await;
    let mut stalled = Box::pin(limiter.check(&limit, &key));
    poll_once(&mut stalled).await;
    assert_eq!(lent.load(Ordering::SeqCst), Limiter::FLOOD_REFUSALS + 1);
    drop(closed);

    // Held, never polled again: its claim stands for a budget...
    clock.advance(Limiter::DEFAULT_BUDGET - Duration::from_micros(1));
    assert_refused(&limiter, &limit, &key).await;
    assert_eq!(lent.load(Ordering::SeqCst), Limiter::FLOOD_REFUSALS + 1);
    // ... and no longer.
    clock.advance(Duration::from_micros(1));
    assert_refused(&limiter, &limit, &key).await;
    assert_eq!(
        lent.load(Ordering::SeqCst),
        Limiter::FLOOD_REFUSALS + 2,
        "a stale claim lets the next call refresh"
    );
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_never_allows_and_is_bounded() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent) = counting(&db).await;
    let limiter = Limiter::builder(Postgres::new(conns).with_clock(clock.clone()))
        .refusal_cache(10)
        .build()
        .expect("a cache");
    let limit = Limit::new("redeem", 1, Duration::from_secs(60)).expect("a limit");
    let keys: Vec<Key> = (0..200)
        .map(|i| Key::opaque(&format!("code-{i}")))
        .collect();
    for key in &keys {
        flood(&limiter, &limit, key).await;
    }
    let before = lent.load(Ordering::SeqCst);
    for key in &keys {
        // Cached or asked again, always refused: the cache holds refusals
        // only.
        assert!(
            limiter
                .hit(&limit, key)
                .await
                .expect("a verdict")
                .is_refused()
        );
    }
    let asked = lent.load(Ordering::SeqCst) - before;
    assert!(
        asked >= 200 - 2 * 10,
        "at most about its capacity answered from the cache; {asked} of 200 asked the store"
    );

    // With the cache off, every call asks.
    let (conns, lent) = counting(&db).await;
    let uncached = Limiter::builder(Postgres::new(conns).with_clock(clock))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    for _ in 0..5 {
        uncached.check(&limit, &keys[0]).await.expect("a verdict");
    }
    assert_eq!(lent.load(Ordering::SeqCst), 5);
    assert!(
        Limiter::builder(platformkit_limit::Memory::new())
            .refusal_cache(0)
            .build()
            .is_err()
    );
}

#[tokio::test]
async fn answers_from_the_cache_are_counted_with_source_cache() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let limiter = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let limit = Limit::new("login", 1, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("victim");
    flood(&limiter, &limit, &key).await;
    for _ in 0..2 {
        assert_refused(&limiter, &limit, &key).await;
    }

    let (calls, statements) = calls_and_statements(&snapshotter);
    let expected: BTreeMap<(String, String, String), u64> = [
        (("failed", "refused", "store"), 3),
        (("check", "refused", "cache"), 2),
    ]
    .into_iter()
    .map(|((op, outcome, source), n)| ((op.into(), outcome.into(), source.into()), n))
    .collect();
    assert_eq!(calls, expected);
    assert_eq!(statements, 3, "the cache's answers sent nothing");
}

/// The calls counted, by (operation, outcome, source), and the statements
/// sent, as `snapshotter` saw them.
fn calls_and_statements(
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> (BTreeMap<(String, String, String), u64>, u64) {
    let mut calls = BTreeMap::new();
    let mut statements = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        match (key.name(), value) {
            (CALLS_TOTAL, DebugValue::Counter(n)) => {
                calls.insert(
                    (
                        label(LABEL_OPERATION),
                        label(LABEL_OUTCOME),
                        label(LABEL_SOURCE),
                    ),
                    n,
                );
            }
            (STATEMENTS_TOTAL, DebugValue::Counter(n)) => statements += n,
            _ => {}
        }
    }
    (calls, statements)
}

fn cost(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("a cost of at least 1")
}

/// Asks of each of `costs` in turn, each refused.
async fn refused_at<S: platformkit_limit::Store>(
    limiter: &Limiter<S>,
    limit: &Limit,
    key: &Key,
    costs: &[u32],
) {
    for &n in costs {
        let verdict = limiter.hit(limit, key).cost(cost(n)).await.unwrap();
        assert!(verdict.is_refused(), "an ask of {n}: {verdict:?}");
    }
}

/// A key flooded with refusals of a cost of 3 is answered from the cache
/// for asks of 3 or more; an ask of 1 is asked of the store (with a sliding
/// limit it may go ahead sooner), and once refused there, it too is
/// answered from the cache, and so are the asks of 3 after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_answered_from_the_cache_only_to_asks_of_at_least_its_cost() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent) = counting(&db).await;
    let limiter = Limiter::builder(Postgres::new(conns).with_clock(clock.clone()))
        .refusal_ttl(Limiter::MAX_REFUSAL_TTL)
        .build()
        .expect("a TTL");
    let limit = Limit::new("api", 4, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("client");
    assert!(
        limiter
            .hit(&limit, &key)
            .cost(cost(3))
            .await
            .unwrap()
            .is_allowed()
    );
    for _ in 0..Limiter::FLOOD_REFUSALS {
        let refused = limiter.hit(&limit, &key).cost(cost(3)).await.unwrap();
        assert!(refused.is_refused() && !refused.is_unreachable());
    }
    assert_eq!(lent.load(Ordering::SeqCst), 4, "each asked of the store");
    refused_at(&limiter, &limit, &key, &[3, 4]).await;
    assert_eq!(lent.load(Ordering::SeqCst), 4, "3 and 4: from the cache");

    let one = limiter.hit(&limit, &key).await.unwrap();
    assert!(one.is_refused());
    assert_eq!(one.count(), Some(13), "asked of the store, and counted");
    assert_eq!(lent.load(Ordering::SeqCst), 5);
    refused_at(&limiter, &limit, &key, &[1, 3]).await;
    assert_eq!(lent.load(Ordering::SeqCst), 5, "held for 1 now: every cost");
}

/// A cost above max is refused with no statement and no look at the
/// cache, counted as a call with `source="cost"`, and nothing is stored.
#[tokio::test]
async fn a_cost_above_max_sends_nothing_and_is_counted_with_source_cost() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = Server::shared().database(SCHEMA).await;
    let limiter = Limiter::new(Postgres::new(db.config()).with_clock(start()));
    let limit = Limit::new("api", 4, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("client");
    let over = limiter.hit(&limit, &key).cost(cost(5)).await.unwrap();
    assert!(over.is_refused() && over.exceeds_max());
    let reserved = limiter.reserve(&limit, &key).cost(cost(5)).await.unwrap();
    assert!(reserved.verdict().exceeds_max());
    let fits = limiter.hit(&limit, &key).cost(cost(4)).await.unwrap();
    assert!(fits.is_allowed());
    assert_eq!(fits.count(), Some(4), "nothing counted before");

    let (calls, statements) = calls_and_statements(&snapshotter);
    let expected: BTreeMap<(String, String, String), u64> = [
        (("hit", "refused", "cost"), 1),
        (("reserve", "refused", "cost"), 1),
        (("hit", "allowed", "store"), 1),
    ]
    .into_iter()
    .map(|((op, outcome, source), n)| ((op.into(), outcome.into(), source.into()), n))
    .collect();
    assert_eq!(calls, expected);
    assert_eq!(statements, 1, "only the ask that fits was sent");
}

/// Tiers: a key flooded with refusals under the free tier's max is
/// answered from the cache under that max only. Asked under the paid
/// tier's larger max (the same limit's name: the same stored key and
/// count), it is asked of the store and allowed, with the paid tier's
/// remaining; after that allow the free tier is asked of the store again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_under_one_tier_is_not_answered_to_a_larger_tier() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent) = counting(&db).await;
    let limiter = Limiter::builder(Postgres::new(conns).with_clock(clock.clone()))
        .refusal_ttl(Limiter::MAX_REFUSAL_TTL)
        .build()
        .expect("a TTL");
    let free = Limit::new("api", 4, Duration::from_secs(60)).expect("a limit");
    let paid = free.with_max(100).expect("a tier");
    let key = Key::opaque("client");
    for _ in 0..4 {
        assert!(limiter.hit(&free, &key).await.unwrap().is_allowed());
    }
    for _ in 0..Limiter::FLOOD_REFUSALS {
        let refused = limiter.hit(&free, &key).await.unwrap();
        assert!(refused.is_refused() && !refused.is_unreachable());
    }
    assert_eq!(lent.load(Ordering::SeqCst), 7, "each asked of the store");
    assert!(limiter.hit(&free, &key).await.unwrap().is_refused());
    assert_eq!(lent.load(Ordering::SeqCst), 7, "free: from the cache");

    let upgraded = limiter.hit(&paid, &key).await.unwrap();
    assert!(upgraded.is_allowed(), "{upgraded:?}");
    assert_eq!(
        (upgraded.count(), upgraded.remaining()),
        (Some(8), Some(92)),
        "one count, the paid tier's max"
    );
    assert_eq!(lent.load(Ordering::SeqCst), 8, "paid: asked of the store");

    let downgraded = limiter.hit(&free, &key).await.unwrap();
    assert!(downgraded.is_refused());
    assert_eq!(downgraded.count(), Some(9));
    assert_eq!(
        lent.load(Ordering::SeqCst),
        9,
        "the allow cleared the entry"
    );
}
