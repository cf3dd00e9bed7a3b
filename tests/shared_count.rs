//! One count for every replica: two limiters over the same table share one
//! limit, a key is counted apart per limit and stored as the limit's name and
//! the encoded key, `check` writes nothing, relaxed durability counts the
//! same and stays inside the limiter's transaction, and windows are whole
//! multiples of their length since the Unix epoch, on either side of it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common;
use common::LONG_WINDOW;
use common::db::{assert_idle, fresh_db, hold, lend, stored, stored_rows};
use common::limit;
use platformkit_limit::{Key, Limit, Limiter, ManualClock, Postgres, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit() {
    let db = fresh_db().await;
    let replica_a = Limiter::new(Postgres::new(db.config()));
    let replica_b = Limiter::new(Postgres::new(lend(hold(&db.config()).await)));
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    assert_eq!(
        replica_a.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );
    assert_eq!(
        replica_b.failed(&login, &alice).await.unwrap().count(),
        Some(2)
    );
    let third = replica_a.check(&login, &alice).await.unwrap();
    assert!(third.is_allowed());
    assert_eq!(third.count(), Some(2));
    assert_eq!(third.remaining(), Some(1));

    let failed = replica_a.failed(&login, &alice).await.unwrap();
    assert_eq!(failed.count(), Some(3));
    assert!(failed.is_refused(), "the third failure closes the limit");

    assert_fourth_refused("a", &replica_a, &login, &alice).await;
    assert_fourth_refused("b", &replica_b, &login, &alice).await;
    assert_eq!(
        stored_rows(&db).await,
        [(stored(&login, &alice), 3)],
        "one row holds the shared count"
    );
}

async fn assert_fourth_refused<S: Store>(
    name: &str,
    replica: &Limiter<S>,
    login: &Limit,
    key: &Key,
) {
    let fourth = replica.check(login, key).await.unwrap();
    assert!(fourth.is_refused(), "replica {name} let the 4th attempt in");
    assert!(!fourth.is_unreachable());
    assert_eq!(fourth.count(), Some(3));
    assert_eq!(fourth.remaining(), Some(0));
    assert!(fourth.retry_after().unwrap() <= LONG_WINDOW);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_counted_apart_per_limit() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 3);
    let reset_password = limit("reset-password", 3);
    let alice = Key::email("alice@example.com");

    limiter.failed(&login, &alice).await.unwrap();
    limiter.failed(&login, &alice).await.unwrap();
    limiter.failed(&reset_password, &alice).await.unwrap();

    let both = [(&login, &alice), (&reset_password, &alice)];
    assert_eq!(
        common::verdicts::counts_of(&limiter, &both).await,
        [Some(2), Some(1)]
    );
    assert_eq!(
        stored_rows(&db).await,
        [
            (stored(&login, &alice), 2),
            (stored(&reset_password, &alice), 1)
        ]
    );

    limiter.reset(&login, &alice).await.unwrap();
    assert_eq!(
        common::verdicts::counts_of(&limiter, &both).await,
        [Some(0), Some(1)],
        "a reset under one limit leaves the other alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_key_is_the_limit_name_and_the_encoded_key() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 3);
    // A quote, a separator, a NUL and non-ASCII text: all travel as a bind
    // parameter and come back as they went.
    let key = Key::new(["it's", "a|b", "nul\0here", "Ωμέγα ✓"]).unwrap();

    limiter.failed(&login, &key).await.unwrap();
    assert_eq!(stored_rows(&db).await, [(stored(&login, &key), 1)]);
    assert_eq!(limiter.check(&login, &key).await.unwrap().count(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_writes_nothing() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    for _ in 0..5 {
        let verdict = limiter.check(&login, &alice).await.unwrap();
        assert!(verdict.is_allowed());
        assert_eq!(verdict.count(), Some(0));
    }
    assert_eq!(stored_rows(&db).await, [], "a check left a row behind");

    limiter.failed(&login, &alice).await.unwrap();
    for _ in 0..5 {
        assert_eq!(
            limiter.check(&login, &alice).await.unwrap().count(),
            Some(1)
        );
    }
    assert_eq!(stored_rows(&db).await, [(stored(&login, &alice), 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_durability_counts_and_stays_inside_the_limiter_transaction() {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    held.lock()
        .await
        .batch_execute("SET synchronous_commit = on")
        .await
        .unwrap();
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))).with_relaxed_durability());
    let login = limit("login", 2);
    let alice = Key::email("alice@example.com");

    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );
    let hit = limiter.hit(&login, &alice).await.unwrap();
    assert_eq!(hit.count(), Some(2));
    assert!(hit.is_allowed());
    assert!(limiter.check(&login, &alice).await.unwrap().is_refused());
    limiter.reset(&login, &alice).await.unwrap();
    assert_eq!(stored_rows(&db).await, []);

    let client = held.lock().await;
    let setting: String = client
        .query_one("SELECT current_setting('synchronous_commit')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "on", "the session's own commits stay durable");
    assert_idle(&client).await;
}

// ---------------------------------------------------------------------------
// Windows
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_time_crosses_windows() {
    let db = fresh_db().await;
    let t = UNIX_EPOCH + Duration::from_micros(1_700_000_123_456_789);
    let clock = ManualClock::new(t);
    let limiter = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let login = Limit::new("login", 3, Duration::from_secs(60)).unwrap();
    let alice = Key::email("alice@example.com");

    for n in 1..=3 {
        let verdict = limiter.failed(&login, &alice).await.unwrap();
        assert_eq!(verdict.count(), Some(n));
        assert_eq!(verdict.is_refused(), n == 3);
    }
    let fourth = limiter.check(&login, &alice).await.unwrap();
    assert!(fourth.is_refused());
    let reopens_at = fourth.reopens_at().unwrap();
    let since_epoch = reopens_at.duration_since(UNIX_EPOCH).unwrap();
    assert_eq!(since_epoch, Duration::from_secs(1_700_000_160));
    assert_eq!(since_epoch.as_secs() % 60, 0);
    assert_eq!(since_epoch.subsec_nanos(), 0);
    assert_eq!(
        fourth.retry_after(),
        Some(reopens_at.duration_since(t).unwrap()),
        "measured on the pinned clock"
    );

    clock.set(reopens_at - Duration::from_micros(1));
    assert!(
        limiter.check(&login, &alice).await.unwrap().is_refused(),
        "the window is still open a microsecond before its end"
    );

    clock.set(reopens_at);
    let next = limiter.check(&login, &alice).await.unwrap();
    assert!(next.is_allowed());
    assert_eq!(next.count(), Some(0));
    assert_eq!(
        next.reopens_at(),
        Some(reopens_at + Duration::from_secs(60))
    );
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );
    assert_eq!(
        stored_rows(&db).await,
        [(stored(&login, &alice), 3), (stored(&login, &alice), 1)],
        "one row per window"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_before_the_epoch_are_whole_multiples_too() {
    let db = fresh_db().await;
    let clock = ManualClock::new(UNIX_EPOCH - Duration::from_secs(90));
    let limiter = Limiter::new(Postgres::new(db.config()).with_clock(clock));
    let login = Limit::new("login", 3, Duration::from_secs(60)).unwrap();
    let verdict = limiter
        .failed(&login, &Key::opaque("account-1"))
        .await
        .unwrap();
    let expected: SystemTime = UNIX_EPOCH - Duration::from_secs(60);
    assert_eq!(verdict.reopens_at(), Some(expected));
}
