//! The refusal cache: a refused key costs no round trip until it reopens,
//! expires exactly at the reopening, is cleared by a reset through this
//! process, is seen stale from another replica only until the reopening,
//! never allows, and is bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use platformkit_limit::{Key, Limit, LimitConn, Limiter, ManualClock, Postgres, SCHEMA};
use platformkit_limit_testdb::{Server, TestDb};

/// A connection source over `db` that counts the connections it lends: one
/// per statement the limiter sends.
fn counting(db: &TestDb) -> (impl LimitConn + 'static, Arc<AtomicUsize>) {
    let lent = Arc::new(AtomicUsize::new(0));
    let config = db.config();
    let counter = lent.clone();
    let conns = move || {
        counter.fetch_add(1, Ordering::SeqCst);
        let config = config.clone();
        async move { LimitConn::conn(&config).await }
    };
    (conns, lent)
}

fn start() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 60 * 60 + 5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_costs_no_round_trip_until_it_reopens_exactly() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent) = counting(&db);
    let limiter = Limiter::new(Postgres::new(conns).with_clock(clock.clone()));
    assert!(limiter.has_refusal_cache(), "on by default");
    let limit = Limit::new("login", 2, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("victim");

    limiter.failed(&limit, &key).await.expect("a verdict");
    let refused = limiter.failed(&limit, &key).await.expect("a verdict");
    assert!(refused.is_refused());
    let reopens = refused.reopens_at().expect("a reopening");
    assert_eq!(lent.load(Ordering::SeqCst), 2);

    // Hammering the refused key: every answer refused, no statement sent.
    for _ in 0..50 {
        assert!(
            limiter
                .check(&limit, &key)
                .await
                .expect("a verdict")
                .is_refused()
        );
        assert!(
            limiter
                .hit(&limit, &key)
                .await
                .expect("a verdict")
                .is_refused()
        );
        assert!(
            limiter
                .failed(&limit, &key)
                .await
                .expect("a verdict")
                .is_refused()
        );
    }
    assert_eq!(
        lent.load(Ordering::SeqCst),
        2,
        "0 round trips for a refused key"
    );

    // One microsecond before the reopening: still cached, and the wait runs
    // down with the clock.
    clock.set(reopens - Duration::from_micros(1));
    let cached = limiter.check(&limit, &key).await.expect("a verdict");
    assert!(cached.is_refused());
    assert_eq!(cached.retry_after(), Some(Duration::from_micros(1)));
    assert_eq!(lent.load(Ordering::SeqCst), 2);

    // At the reopening: asked again, and allowed, with the cached refusals
    // not counted in the database.
    clock.set(reopens);
    let open = limiter.check(&limit, &key).await.expect("a verdict");
    assert!(open.is_allowed());
    assert_eq!(open.count(), Some(0));
    assert_eq!(lent.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_here_clears_the_cache_and_a_reset_elsewhere_is_seen_at_the_reopening() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let here = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let elsewhere = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let limit = Limit::new("login", 1, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("account");

    let refused = here.failed(&limit, &key).await.expect("a verdict");
    assert!(refused.is_refused());
    here.reset(&limit, &key).await.expect("a reset");
    assert!(
        here.check(&limit, &key)
            .await
            .expect("a verdict")
            .is_allowed(),
        "a reset through this process clears its cached refusal"
    );

    let refused = here.failed(&limit, &key).await.expect("a verdict");
    let reopens = refused.reopens_at().expect("a reopening");
    elsewhere.reset(&limit, &key).await.expect("a reset");
    assert!(
        elsewhere
            .check(&limit, &key)
            .await
            .expect("a verdict")
            .is_allowed(),
        "the database is reset"
    );
    assert!(
        here.check(&limit, &key)
            .await
            .expect("a verdict")
            .is_refused(),
        "this process still answers its cached refusal"
    );
    clock.set(reopens);
    assert!(
        here.check(&limit, &key)
            .await
            .expect("a verdict")
            .is_allowed(),
        "seen here at the latest at the reopening"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_never_allows_and_is_bounded() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = start();
    let (conns, lent) = counting(&db);
    let limiter = Limiter::new(Postgres::new(conns).with_clock(clock.clone()))
        .with_refusal_cache(10)
        .expect("a cache");
    let limit = Limit::new("redeem", 1, Duration::from_secs(60)).expect("a limit");
    let keys: Vec<Key> = (0..200)
        .map(|i| Key::opaque(&format!("code-{i}")))
        .collect();
    for key in &keys {
        assert!(
            limiter
                .failed(&limit, key)
                .await
                .expect("a verdict")
                .is_refused()
        );
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
    let (conns, lent) = counting(&db);
    let uncached = Limiter::new(Postgres::new(conns).with_clock(clock)).without_refusal_cache();
    for _ in 0..5 {
        uncached.check(&limit, &keys[0]).await.expect("a verdict");
    }
    assert_eq!(lent.load(Ordering::SeqCst), 5);
    assert!(
        Limiter::new(platformkit_limit::Memory::new())
            .with_refusal_cache(0)
            .is_err()
    );
}
