//! Every operation, on a held connection and through the driver's pool.

use std::time::{Duration, UNIX_EPOCH};

use platformkit_limit::{
    Key, Limit, LimitConn, Limiter, ManualClock, Postgres, Reservation, Strategy, Verdict, purge,
};

use super::driver::{Driver, Lend, assert_idle_and_switch_off, hold, lend};
use super::{assert_counted, wait_for_state};
use crate::common::db::fresh_db;
use crate::common::limit;

/// Every operation (each counting and reading statement, with a pinned time and
/// without) gives the same counts and verdicts on either driver, and the
/// connection goes back idle after each.
pub async fn every_operation_counts_alike_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let held = hold::<D>(&db.config()).await;
    // A pinned time a second before a window's edge: the timestamps travel
    // both ways, and the window rolls over when the clock moves on.
    let window = Duration::from_secs(60);
    let start = UNIX_EPOCH + window * 30_000_000 - Duration::from_secs(1);
    let clock = ManualClock::new(start);
    let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)).with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let login = Limit::new("login", 2, window).unwrap();
    let sliding = Limit::builder("sliding", 2, window)
        .strategy(Strategy::Sliding)
        .build()
        .unwrap();
    let locked = Limit::builder("locked", 1, window)
        .lockout(Duration::from_secs(300))
        .build()
        .unwrap();
    let alice = Key::email("alice@example.com");
    let bob = Key::opaque("bob");

    assert_counted(&limiter.check(&login, &alice).await.unwrap(), 0, "check");
    assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 1, "failed");
    let refused = limiter.failed(&login, &alice).await.unwrap();
    assert!(refused.is_refused());
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(refused.reopens_at(), Some(start + Duration::from_secs(1)));

    // hit and a sliding window across the edge.
    for n in 1..=2 {
        assert_counted(&limiter.hit(&sliding, &bob).await.unwrap(), n, "hit");
    }
    // A second past the edge the previous window still weighs 59/60: the
    // estimate is 3, one more ask fits, the next does not.
    clock.advance(Duration::from_secs(2));
    let after_edge = limiter.hit(&sliding, &bob).await.unwrap();
    assert_counted(&after_edge, 3, "hit after the edge");
    assert!(after_edge.is_allowed());
    let next = limiter.hit(&sliding, &bob).await.unwrap();
    assert_counted(&next, 4, "the next hit");
    assert!(next.is_refused());
    assert_counted(
        &limiter.check(&login, &alice).await.unwrap(),
        0,
        "a new window",
    );

    // A lockout read from an earlier window's row.
    assert!(limiter.failed(&locked, &alice).await.unwrap().is_refused());
    clock.advance(window);
    let still = limiter.check(&locked, &alice).await.unwrap();
    assert!(still.is_refused(), "the lockout outlasts its window");
    assert!(still.reopens_at().is_some());

    // reserve, then take the attempt back.
    match limiter.reserve(&login, &bob).await.unwrap() {
        Reservation::Granted(permit) => {
            assert_eq!(permit.verdict().count(), Some(1));
            permit.succeeded().await.unwrap();
        }
        Reservation::Refused(verdict) => panic!("refused: {verdict:?}"),
    }
    assert_counted(&limiter.check(&login, &bob).await.unwrap(), 0, "taken back");

    // Several limits in one statement: arrays of keys, windows, maxes. The
    // sliding pair's estimate weighs the 2 of the window before at 59/60.
    let pairs = [(&login, &alice), (&sliding, &bob), (&locked, &bob)];
    let verdicts = limiter.hit_all(&pairs).await.unwrap();
    let seen: Vec<_> = verdicts.iter().map(Verdict::count).collect();
    assert_eq!(seen, [Some(1), Some(3), Some(1)]);
    let verdicts = limiter.check_all(&pairs).await.unwrap();
    let seen: Vec<_> = verdicts.iter().map(Verdict::count).collect();
    assert_eq!(seen, [Some(1), Some(3), Some(1)]);
    assert!(verdicts.is_refused(), "locked reached its max of 1");

    // reset, then purge.
    limiter.reset(&login, &alice).await.unwrap();
    assert_counted(&limiter.check(&login, &alice).await.unwrap(), 0, "reset");
    assert_eq!(purge(&lend::<D>(&held)).await.unwrap(), 0);

    assert_idle_and_switch_off::<D>(&held, "after every operation").await;
}

/// Two limiters over one pool of one connection share one limit, and the
/// connection is idle between calls.
pub async fn a_pool_is_a_source_and_gets_its_connection_back_idle<D: Driver>() {
    let db = fresh_db().await;
    let admin = db.connect_admin().await;
    let pool = D::pool(&db.config(), 1).await;
    let one = Limiter::new(Postgres::new(pool.clone()));
    let two = Limiter::new(Postgres::new(pool.clone()));
    let login = limit("login", 2);
    let alice = Key::opaque("alice");

    assert_counted(&one.failed(&login, &alice).await.unwrap(), 1, "first");
    let backends = admin
        .query(
            "SELECT pid, state FROM pg_catalog.pg_stat_activity \
             WHERE datname = $1 AND usename = 'limit_owner'",
            &[&db.name()],
        )
        .await
        .expect("the pool's backends");
    let pids: Vec<(i32, Option<String>)> = backends.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(pids.len(), 1, "the pool's one backend: {pids:?}");
    let pid = pids[0].0;
    wait_for_state(&admin, pid, Some("idle"), Duration::from_secs(5)).await;
    let second = two.failed(&login, &alice).await.unwrap();
    assert_counted(&second, 2, "second, through the other limiter");
    assert!(second.is_refused());
    wait_for_state(&admin, pid, Some("idle"), Duration::from_secs(5)).await;
    assert_counted(&one.check(&login, &alice).await.unwrap(), 2, "check");
}
